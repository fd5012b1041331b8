"""The typer front: `kvtrace scan`, `rules`, `explain`, `schema`. All analysis lives below."""

from __future__ import annotations

import json
import logging
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from kvtrace import __version__
from kvtrace.safe_text import markup, plain
from kvtrace.rules import ALL_RULES, find_rule
from kvtrace.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INCOMPLETE, EXIT_INPUT, KvtraceError
from kvtrace.model import FetchLimits, Report

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help=(
        "Find KV-transfer poll states that pin SGLang's disaggregated prefill queue.\n\n"
        "Exit codes: 0 no findings, 1 findings, 2 usage or input error (nothing analysed), "
        "3 scan finished but some files could not be analysed."
    ),
)


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    note = "note"
    never = "never"


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"
    github = "github"
    html = "html"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvtrace {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Show the version and exit.")] = None,
) -> None:
    pass


def _fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    typer.echo(f"kvtrace: error: {plain(message)}", err=True)
    return typer.Exit(code)


@app.command()
def scan(
    targets: Annotated[Optional[list[str]], typer.Argument(
        help="Local paths (an SGLang checkout, an installed sglang package, or its disaggregation "
             "folder) or remote ones: [user@]host[:port]:path or ssh://[user@]host[:port]/path.")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="Report format.")] = OutputFormat.text,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file.")] = None,
    rules: Annotated[Optional[str], typer.Option("--rules", help="Rules pack: a bundled name or a TOML file.")] = None,
    no_map: Annotated[bool, typer.Option("--no-map", help="Text format: leave out the release map.")] = False,
    identity: Annotated[Optional[list[str]], typer.Option("--identity", "-i", help="SSH private key (repeatable).")] = None,
    ssh_config: Annotated[Optional[str], typer.Option("--ssh-config", help="SSH config file (default ~/.ssh/config).")] = None,
    known_hosts: Annotated[Optional[str], typer.Option("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts).")] = None,
    accept_new_host_key: Annotated[bool, typer.Option("--accept-new-host-key",
        help="Trust and record the key of a host not yet in known_hosts (OpenSSH accept-new). A changed key is always refused.")] = False,
    connect_timeout: Annotated[float, typer.Option("--connect-timeout", help="Seconds to wait for the SSH connection.")] = 10.0,
    read_timeout: Annotated[float, typer.Option("--read-timeout", help="Seconds to wait for remote data.")] = 60.0,
    timeout: Annotated[float, typer.Option("--timeout",
        help="Seconds for a whole remote fetch (connect, authenticate, transfer), however the server paces it.")] = 300.0,
    max_file_bytes: Annotated[int, typer.Option("--max-file-bytes", help="Skip (and report) larger files.")] = FetchLimits.max_file_bytes,
    max_files: Annotated[int, typer.Option("--max-files", help="Refuse trees with more .py files.")] = FetchLimits.max_files,
    max_total_bytes: Annotated[int, typer.Option("--max-total-bytes", help="Refuse trees with more bytes of .py.")] = FetchLimits.max_total_bytes,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show fetch steps and timings on stderr.")] = False,
    fail_on: Annotated[Optional[FailOn], typer.Option("--fail-on",
        help="Exit 1 only for findings of this severity or worse (never: report, exit 0). Default: note.")] = None,
    select: Annotated[Optional[list[str]], typer.Option("--select", metavar="RULE",
        help="Only these rules (ids or codes; repeatable or comma-separated). Wins over [tool.kvtrace].")] = None,
    ignore: Annotated[Optional[list[str]], typer.Option("--ignore", metavar="RULE",
        help="Leave out these rules (repeatable or comma-separated). Wins over [tool.kvtrace].")] = None,
    ignore_backend: Annotated[Optional[list[str]], typer.Option("--ignore-backend", metavar="BACKEND",
        help="Leave out these backends, e.g. fake (repeatable or comma-separated).")] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", metavar="FILE",
        help="An earlier kvtrace JSON report or SARIF log: its findings are shown as such and do not fail.")] = None,
    write_baseline: Annotated[Optional[Path], typer.Option("--write-baseline", metavar="FILE",
        help="Also write this scan's findings as a JSON baseline.")] = None,
    graph: Annotated[Optional[Path], typer.Option("--graph", metavar="FILE",
        help="Also export the analysis graph: FILE.graphml, FILE.dot or FILE.json.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache",
        help="Analyse even when this code, pack and tree were scanned before (see `kvtrace cache`).")] = False,
    hosts: Annotated[Optional[Path], typer.Option("--hosts",
        help="File of targets, one per line (# comments allowed), scanned with the ones given.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Hosts fetched at the same time.")] = 8,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display and no fleet summary.")] = False,
    metrics: Annotated[Optional[str], typer.Option("--metrics",
        help="Prometheus page as seen from each host (e.g. http://127.0.0.1:30000/metrics), read through "
             "the SSH connection; its queue gauges are shown beside the verdict.")] = None,
    metrics_seconds: Annotated[float, typer.Option("--metrics-seconds", min=0,
        help="Sample the page once a second for this long.")] = 3.0,
) -> None:
    """Scan one or more targets (a fleet: --hosts, --jobs) and report pinned and dropped poll
    states, per backend."""
    _scan_fleet(**locals())


def _scan_fleet(targets: list[str] | None, output_format: OutputFormat, output: Path | None, rules: str | None,
                no_map: bool, identity: list[str] | None, ssh_config: str | None, known_hosts: str | None,
                accept_new_host_key: bool, connect_timeout: float, read_timeout: float, timeout: float, max_file_bytes: int,
                max_files: int, max_total_bytes: int, verbose: bool, fail_on: FailOn | None,
                select: list[str] | None, ignore: list[str] | None, ignore_backend: list[str] | None,
                baseline: Path | None, write_baseline: Path | None, graph: Path | None, no_cache: bool,
                hosts: Path | None, jobs: int, quiet: bool, metrics: str | None, metrics_seconds: float) -> None:
    from kvtrace.cache import Cache
    from kvtrace.fleet import FleetOptions, Progress, read_hosts_file, render_summary, run_fleet, summarise, worst_exit
    from kvtrace.packs import load_pack

    err = Console(stderr=True, highlight=False, soft_wrap=True)  # -v lines stay whole when piped

    def log(message: str) -> None:
        if verbose:
            err.print(f"[dim]kvtrace: {markup(message)}[/dim]")

    from kvtrace import baseline as baselines
    from kvtrace.config import Overrides

    limits = FetchLimits(max_file_bytes=max_file_bytes, max_files=max_files, max_total_bytes=max_total_bytes)
    overrides = Overrides(select=_names(select), ignore=_names(ignore), ignore_backends=_names(ignore_backend),
                          pack=rules, fail_on=fail_on.value if fail_on else None,
                          baseline=str(baseline) if baseline else None)
    try:
        if graph is not None:
            from kvtrace.report.graph_export import check_path

            check_path(graph)  # before the scan, not after it
        wanted = list(targets or []) + (read_hosts_file(hosts) if hosts is not None else [])
        settings = {target: _settings(target, overrides) for target in wanted}
        packs = {target: load_pack(s.pack) for target, s in settings.items()}
        baseline_prints = {t: baselines.load(Path(s.baseline)) for t, s in settings.items() if s.baseline}
        if metrics is not None:
            from kvtrace.metrics import parse_metrics_url

            parse_metrics_url(metrics)
    except KvtraceError as exc:
        raise _fail(str(exc))
    if not wanted:
        raise _fail("no targets: give paths or hosts, or --hosts FILE")
    ssh = dict(identity_files=list(identity or []), ssh_config=ssh_config, known_hosts=known_hosts,
               accept_new_host_key=accept_new_host_key, connect_timeout=connect_timeout, read_timeout=read_timeout,
               timeout=timeout)

    def after_scan(target: str, report: Report) -> None:
        if target in baseline_prints:
            compared = baselines.apply(report.findings, baseline_prints[target])
            log(f"{target}: baseline: {compared.unchanged} unchanged, {compared.new} new, "
                f"{len(compared.gone)} no longer found")

    options = FleetOptions(packs, settings, limits, ssh, jobs, None if no_cache else Cache(), metrics,
                           metrics_seconds, after_scan=after_scan)
    fleet = len(wanted) > 1
    with Progress(fleet and not quiet and not verbose and err.is_terminal) as progress:
        results = run_fleet(wanted, options, log, progress)
    for r in results:
        if r.error is not None:
            prefix = "kvtrace: " if r.error.startswith("internal error") else "kvtrace: error: "
            typer.echo(prefix + plain(r.error), err=True)
            continue
        log(f"{r.target}: fetched {len(r.report.files)} files in {r.timings['fetch']:.2f}s; "
            f"{'cached result' if r.cached else 'analysed'} in {r.timings['analyse']:.2f}s")
    reports = [r.report for r in results if r.report is not None]
    if reports:
        _write(reports, output_format, output, no_map)
    if graph is not None and reports:
        from kvtrace.report import graph_export

        try:
            graph_export.write(reports, graph)
        except KvtraceError as exc:
            raise _fail(str(exc))
    if write_baseline is not None and reports:
        from kvtrace.report.json import render as render_json

        write_baseline.write_text(render_json(reports), encoding="utf-8")
    if not quiet and (fleet or metrics is not None):
        summary = render_summary([summarise(r) for r in results])
        if output_format is OutputFormat.text and output is None:
            typer.echo("\n" + summary, nl=False)
        else:
            typer.echo(summary, err=True, nl=False)
    raise typer.Exit(worst_exit(r.exit_code for r in results))


def _names(values: list[str] | None) -> tuple[str, ...]:
    """Repeatable options that also take comma-separated lists, as ruff's do."""
    return tuple(part.strip() for value in values or [] for part in value.split(",") if part.strip())


def _settings(target: str, overrides):
    """[tool.kvtrace] for this target (its tree, else the working directory) under the command line."""
    from kvtrace.config import resolve
    from kvtrace.target import LocalTarget, parse_target

    try:
        local = parse_target(target)
    except KvtraceError:
        local = None  # the fetch reports a malformed target in its own words
    start = Path(target) if isinstance(local, LocalTarget) else None
    known = {r.name for r in ALL_RULES} | {r.code for r in ALL_RULES}
    return resolve(start, Path.cwd(), overrides, known)


def _write(reports: list[Report], fmt: OutputFormat, output: Path | None, no_map: bool) -> None:
    if fmt is OutputFormat.text:
        if output is not None:
            with output.open("w", encoding="utf-8") as handle:
                console = Console(file=handle, width=1000, soft_wrap=True, no_color=True, force_terminal=False)
                for report in reports:
                    _text(report, console, no_map)
        else:
            # Piped: no colour, no folding, so each row stays one greppable line.
            console = Console(highlight=False) if sys.stdout.isatty() else \
                Console(highlight=False, no_color=True, width=1000, soft_wrap=True)
            for report in reports:
                _text(report, console, no_map)
        return
    if fmt is OutputFormat.json:
        from kvtrace.report.json import render
    elif fmt is OutputFormat.sarif:
        from kvtrace.report.sarif import render
    elif fmt is OutputFormat.github:
        from kvtrace.report.github import render
    elif fmt is OutputFormat.html:
        from kvtrace.report.html import render
    else:
        from kvtrace.report.markdown import render
    text = render(reports)
    if output is not None:
        output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


def _text(report: Report, console: Console, no_map: bool) -> None:
    from kvtrace.report.text import render

    render(report, console, show_map=not no_map)


class DiffFormat(str, Enum):
    text = "text"
    json = "json"


@app.command()
def diff(
    base: Annotated[str, typer.Argument(metavar="BASE", help="A folder, or a git revision of the checkout.")],
    head: Annotated[str, typer.Argument(metavar="HEAD", help="A folder, or a git revision of the checkout.")],
    path: Annotated[Optional[str], typer.Option("--path", metavar="SUBDIR",
        help="Scan this folder inside each tree or revision (e.g. python/sglang).")] = None,
    repo: Annotated[Path, typer.Option("--repo", metavar="PATH", help="The git checkout revisions are read from.")] = Path("."),
    output_format: Annotated[DiffFormat, typer.Option("--format", "-f", help="Output format.")] = DiffFormat.text,
    rules: Annotated[Optional[str], typer.Option("--rules", help="Rules pack: a bundled name or a TOML file.")] = None,
    select: Annotated[Optional[list[str]], typer.Option("--select", metavar="RULE", help="Only these rules.")] = None,
    ignore: Annotated[Optional[list[str]], typer.Option("--ignore", metavar="RULE", help="Leave out these rules.")] = None,
    ignore_backend: Annotated[Optional[list[str]], typer.Option("--ignore-backend", metavar="BACKEND",
        help="Leave out these backends.")] = None,
) -> None:
    """Compare two trees or two git revisions: added, fixed and unchanged findings, and the
    release-map rows whose states moved. Exit 1 only when findings were added.

    Examples: `kvtrace diff origin/main HEAD --path python/sglang`, `kvtrace diff old/ new/`.
    """
    from kvtrace import diff as diffs
    from kvtrace.config import Overrides
    from kvtrace.fetch.local import fetch_local
    from kvtrace.packs import load_pack
    from kvtrace.scan import scan_fetched

    overrides = Overrides(select=_names(select), ignore=_names(ignore), ignore_backends=_names(ignore_backend),
                          pack=rules)
    try:
        with diffs.Checkout(repo, path) as checkout:
            trees = {"base": checkout.tree(base), "head": checkout.tree(head)}
            settings = _settings(str(trees["head"]) if Path(head).is_dir() else ".", overrides)
            pack = load_pack(settings.pack)
            reports = {}
            for side, tree in trees.items():
                fetched = fetch_local(tree)
                fetched.target = {"base": base, "head": head}[side] + (f":{path}" if path and not Path(
                    {"base": base, "head": head}[side]).is_dir() else "")
                reports[side] = scan_fetched(fetched, pack, settings)
    except KvtraceError as exc:
        raise _fail(str(exc))
    result = diffs.compare(reports["base"], reports["head"])
    render = diffs.render_text if output_format is DiffFormat.text else diffs.to_json
    sys.stdout.write(render(result, base, head))
    incomplete = any(f.status != "ok" for r in reports.values() for f in r.files) or \
        any(r.problems for r in reports.values())
    if incomplete:
        typer.echo("kvtrace: the scan of BASE or HEAD is incomplete (see the report)", err=True)
    raise typer.Exit(EXIT_FINDINGS if result.added else EXIT_INCOMPLETE if incomplete else EXIT_CLEAN)


@app.command("rules")
def list_rules() -> None:
    """List the rules (code, name, default severity, summary) and the bundled rules packs."""
    from kvtrace.packs import available_packs

    for rule in ALL_RULES:
        typer.echo(f"{rule.code}  {rule.name:20} {rule.severity:8} {rule.summary()}")
    typer.echo(f"\nrules packs: {', '.join(available_packs())}  (kvtrace explain CODE|NAME for one rule)")


@app.command()
def explain(rule: Annotated[str, typer.Argument(help="A rule code or name, e.g. KVT001 or pinned-state.")]) -> None:
    """Show what a rule finds, why it matters, an example and the fix."""
    found = find_rule(rule)
    if found is None:
        known = ", ".join(f"{r.code} {r.name}" for r in ALL_RULES)
        raise _fail(f"unknown rule {rule!r}; known: {known}")
    typer.echo(f"{found.code} {found.name} ({found.severity}): {found.title}\n")
    typer.echo(found.docs())


@app.command()
def schema() -> None:
    """Print the JSON Schema of the kvtrace/1 report (`scan --format json`)."""
    from kvtrace.report.schema import JSON_SCHEMA

    typer.echo(json.dumps(JSON_SCHEMA, indent=2))


@app.command()
def merge(
    reports: Annotated[list[Path], typer.Argument(help="JSON reports (`kvtrace scan --format json`), one or more per host.")],
    output_format: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    fail_on: Annotated[FailOn, typer.Option("--fail-on", help="As for scan: the severity that makes a host exit 1.")] = FailOn.note,
) -> None:
    """Combine JSON reports made on each host (by Ansible, a job scheduler...) into the fleet
    summary; exits with the worst host's code."""
    from kvtrace.fleet import merge_files, render_summary, summary_json, worst_exit

    if output_format not in ("text", "json"):
        raise _fail(f"--format {output_format}: merge writes text or json")
    try:
        hosts = merge_files(reports, fail_on.value)
    except KvtraceError as exc:
        raise _fail(str(exc))
    if output_format == "json":
        typer.echo(json.dumps(summary_json(hosts), indent=2))
    else:
        typer.echo(render_summary(hosts), nl=False)
    raise typer.Exit(worst_exit(h.exit_code for h in hosts))


cache_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="The result cache (user cache dir; KVTRACE_CACHE_DIR overrides it).")
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is, how many entries and bytes it holds, and its bound."""
    from kvtrace.cache import Cache

    info = Cache().info()
    typer.echo(f"path     {info.path}\nentries  {info.entries}\nsize     {info.total_bytes} bytes "
               f"(bound {info.max_bytes}; KVTRACE_CACHE_MAX_BYTES)")


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove every cached result."""
    from kvtrace.cache import Cache

    cache = Cache()
    typer.echo(f"removed {cache.clear()} entries from {cache.dir}")


class _Interrupted(BaseException):
    """Ctrl-C as our own exception: click turns KeyboardInterrupt into "Aborted!" and exit 1
    (or swallows it), and `except Exception` around a scan must not catch it either."""


def _on_sigint(signum: int, frame: object) -> None:
    raise _Interrupted()


def main() -> None:
    import signal

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        app()
    except (_Interrupted, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the message
        typer.echo("kvtrace: interrupted", err=True)
        sys.stderr.flush()
        # Not sys.exit: it would join fleet worker threads still blocked on remote hosts.
        os._exit(130)


if __name__ == "__main__":
    main()
