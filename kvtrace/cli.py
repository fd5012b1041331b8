"""The typer front: `kvtrace scan`, `rules`, `explain`, `schema`. All analysis lives below.

Layout, so that new options and commands merge cleanly: option types and validators first, then
one function per command, then `main()` (which turns usage errors into one line and internal
errors into exit 4)."""

# No `from __future__ import annotations` here: typer reads every command's signature on each run,
# and string annotations cost it an eval() apiece (~0.1 s of every run, the cached rescan's too).

import functools
import json
import os
import re
import sys
import traceback
from enum import Enum
from pathlib import Path
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, NamedTuple, Optional, TextIO

import typer

from kvtrace import __version__, log
from kvtrace.errors import (
    EXIT_CLEAN,
    EXIT_FINDINGS,
    EXIT_INCOMPLETE,
    EXIT_INPUT,
    EXIT_INTERNAL,
    InputError,
    KvtraceError,
)
from kvtrace.safe_text import plain
from kvtrace.model import FetchLimits, Report


EXIT_CODES_HELP = (
    "Exit codes: 0 nothing to fail on (notes and warnings do not fail by default), 1 findings that fail "
    "(see --fail-on), 2 usage or input error (nothing "
    "analysed), 3 the scan is INCOMPLETE (a file or backend could not be analysed), "
    "4 internal error (-v shows the traceback)."
)

app = typer.Typer(
    add_completion=True,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Find KV-transfer poll states that pin requests in SGLang's disaggregation queues (prefill by "
         "default; --role decode, --role all).\n\n" + EXIT_CODES_HELP,
)


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    note = "note"
    never = "never"


class Role(str, Enum):
    """What a host serves: each role's bundled pack names every queue a request waits in there."""
    prefill = "prefill"
    decode = "decode"
    all = "all"  # both: a host that serves either, every queue of each (one report per role)


class Detail(str, Enum):
    summary = "summary"
    full = "full"


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"
    github = "github"
    html = "html"
    concise = "concise"  # one line per finding and a summary (hooks, CI logs)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvtrace {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[Optional[bool], typer.Option("--version", "-V", callback=_version, is_eager=True,
                                                    help="Show the version and exit.")] = None,
) -> None:
    pass


class _Verdict:
    """The exit code a command has decided before it writes its report: a reader that goes
    away (`kvtrace scan ... | head`) must not turn an INCOMPLETE (3) or findings (1) into 0."""

    code: int | None = None


verdict = _Verdict()


def closed_pipe(stream) -> None:
    """The reader of `stream` went away: what is left for it goes to /dev/null, so nothing
    buffered fails again (click would make that exit 1, the interpreter 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


def _fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    typer.echo(f"kvtrace: error: {plain(message)}", err=True)
    return typer.Exit(code)


# ---------------------------------------------------------------------------------------------
# Validation done before anything is fetched: a bad option must not cost a full scan.

def check_output_path(path: Path, option: str = "--output") -> None:
    """The report file can be written (without creating or truncating it yet)."""
    from kvtrace.userfiles import check_name_length

    if str(path) == "-":
        raise InputError(f"{option} -: write to stdout by leaving out {option}")
    check_name_length(path, option)
    try:
        if path.is_dir():
            raise InputError(f"{option} {path}: is a directory")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise InputError(f"{option} {path}: folder {parent} does not exist")
        if path.exists():
            if not os.access(path, os.W_OK):
                raise InputError(f"{option} {path}: permission denied")
            if not path.is_file():
                # A device or pipe: open it as the report will and write nothing (/dev/full refuses even that).
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
                    try:
                        os.write(fd, b"")
                    finally:
                        os.close(fd)
                except OSError as exc:
                    raise InputError(f"{option} {path}: cannot be written: {exc.strerror}") from None
        elif not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(f"{option} {path}: cannot create a file in {parent}: permission denied")
        else:
            # Some folders refuse new files whatever their mode says (/proc, /sys, a read-only mount):
            # create it and take it away again, so that the scan does not run for nothing.
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                os.unlink(path)
            except FileExistsError:
                pass
            except OSError as exc:
                raise InputError(f"{option} {path}: cannot create it: {exc.strerror}") from None
    except OSError as exc:  # a name the system refuses outright
        raise InputError(f"{option} {path}: {exc.strerror or exc}") from None


# An extension that says what a file holds -> the formats that may be written to it.
_EXTENSION_FORMATS: dict[str, tuple[OutputFormat, ...]] = {
    ".sarif.json": (OutputFormat.sarif,),
    ".sarif": (OutputFormat.sarif,),
    ".json": (OutputFormat.json,),  # a SARIF log is named .sarif or .sarif.json
    ".md": (OutputFormat.markdown,),
    ".markdown": (OutputFormat.markdown,),
    ".html": (OutputFormat.html,),
    ".htm": (OutputFormat.html,),
}


def report_format(given: OutputFormat | None, output: Path | None) -> OutputFormat:
    """--format, else what the --output file's extension says (else text); a --format the
    extension contradicts is refused rather than writing, say, text into kvtrace.sarif."""
    name = output.name.lower() if output is not None else ""
    extension = next((e for e in _EXTENSION_FORMATS if name.endswith(e) and len(name) > len(e)), None)
    if extension is None:
        return given or OutputFormat.text
    allowed = _EXTENSION_FORMATS[extension]
    if given is None:
        return allowed[0]
    if given not in allowed:
        raise InputError(f"--format {given.value} contradicts --output {output} (a {extension} file is "
                         f"{' or '.join(f.value for f in allowed)}); change one of them")
    return given


def check_targets(targets: list[str]) -> None:
    """Every TARGET parses (malformed remote forms, `-`, a local symlink loop) before the first
    one is fetched."""
    from kvtrace.fetch.local import refuse_symlink_loop
    from kvtrace.target import LocalTarget, parse_target
    from kvtrace.userfiles import check_name_length

    for text in targets:
        if isinstance(parse_target(text), LocalTarget):
            check_name_length(Path(text), "TARGET")
            refuse_symlink_loop(Path(text))


# ---------------------------------------------------------------------------------------------
# kvtrace scan

SCAN_EPILOG = """\b
Examples:
  kvtrace scan ~/src/sglang/python/sglang
  kvtrace scan prefill-07:/opt/venv/lib/python3.11/site-packages/sglang
  kvtrace scan python/sglang --format sarif -o kvtrace.sarif --fail-on never
  kvtrace scan versions/ --all --format json | jq '.reports[].findings[]'
"""


@app.command(epilog=SCAN_EPILOG)
def scan(
    targets: Annotated[Optional[list[str]], typer.Argument(
        metavar="TARGET...",
        help="Local paths (an SGLang checkout, an installed sglang package, or its disaggregation "
             "folder) or remote ones: [user@]host[:port]:path or ssh://[user@]host[:port]/path.")] = None,
    given_format: Annotated[Optional[OutputFormat], typer.Option("--format", "-f", "--output-format",
        help="Report format (concise: one line per finding, for hooks). Default: from the --output file's "
             "extension (.sarif, .json, .md, .html), else text.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE",
        help="Write the report to FILE (checked before scanning).")] = None,
    rules: Annotated[Optional[str], typer.Option("--rules", metavar="PACK|FILE",
        help="Rules pack: a bundled name or a TOML file.")] = None,
    role: Annotated[Optional[Role], typer.Option("--role",
        help="The host's role: every queue of a prefill server (bootstrap, inflight; the default) or of a "
             "decode server (prealloc, transfer), one grid per queue; all: both, one report per role.")] = None,
    queue: Annotated[Optional[list[str]], typer.Option("--queue", metavar="NAME",
        help="Only these queues, e.g. disagg_prefill_bootstrap_queue (repeatable or comma-separated); "
             "a decode queue alone picks the decode pack.")] = None,
    scan_all: Annotated[bool, typer.Option("--all",
        help="When a TARGET holds several packages (versions side by side), scan each as its own report.")] = False,
    no_map: Annotated[bool, typer.Option("--no-map",
        help="Text format: leave out the release map, the poll states' fates and the backends' details.")] = False,
    detail: Annotated[Detail, typer.Option("--detail",
        help="Markdown: summary (the answer, what fails with its code and diagram, the rest folded, under "
             "60,000 characters) or full (every diagram and table, no size bound).")] = Detail.summary,
    sarif_root: Annotated[Optional[Path], typer.Option("--sarif-root", metavar="DIR",
        help="SARIF: make file locations relative to DIR (default: the current directory); a target "
             "outside DIR keeps them relative to the target folder.")] = None,
    identity: Annotated[Optional[list[str]], typer.Option("--identity", "-i", metavar="KEY",
        help="SSH private key (repeatable).")] = None,
    ssh_config: Annotated[Optional[str], typer.Option("--ssh-config", metavar="FILE",
        help="SSH config file (default ~/.ssh/config).")] = None,
    known_hosts: Annotated[Optional[str], typer.Option("--known-hosts", metavar="FILE",
        help="known_hosts file (default ~/.ssh/known_hosts).")] = None,
    accept_new_host_key: Annotated[bool, typer.Option("--accept-new-host-key",
        help="Trust and record the key of a host not yet in known_hosts (OpenSSH accept-new). A changed key is always refused.")] = False,
    connect_timeout: Annotated[float, typer.Option("--connect-timeout", metavar="SECONDS", min=0.1, max=3600,
        help="Seconds to wait for the SSH connection.")] = 10.0,
    read_timeout: Annotated[float, typer.Option("--read-timeout", metavar="SECONDS", min=0.1, max=86400,
        help="Seconds to wait for remote data.")] = 60.0,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", min=0.1, max=86400,
        help="Seconds for a whole remote fetch (connect, authenticate, transfer), however the server paces it.")] = 300.0,
    max_file_bytes: Annotated[int, typer.Option("--max-file-bytes", metavar="BYTES", min=1,
        help="Skip (and report) larger files.")] = FetchLimits.max_file_bytes,
    max_files: Annotated[int, typer.Option("--max-files", metavar="N", min=1,
        help="Refuse trees with more .py files.")] = FetchLimits.max_files,
    max_total_bytes: Annotated[int, typer.Option("--max-total-bytes", metavar="BYTES", min=1,
        help="Refuse trees with more bytes of .py.")] = FetchLimits.max_total_bytes,
    verbose: Annotated[bool, typer.Option("--verbose", "-v",
        help="Show fetch steps and timings on stderr (and a traceback on an internal error).")] = False,
    fail_on: Annotated[Optional[FailOn], typer.Option("--fail-on",
        help="Exit 1 only for findings of this severity or worse (never: report, exit 0). Default: error.")] = None,
    select: Annotated[Optional[list[str]], typer.Option("--select", metavar="RULE",
        help="Only these rules (ids or codes; repeatable or comma-separated). Wins over [tool.kvtrace].")] = None,
    ignore: Annotated[Optional[list[str]], typer.Option("--ignore", metavar="RULE",
        help="Leave out these rules (repeatable or comma-separated). Wins over [tool.kvtrace].")] = None,
    ignore_backend: Annotated[Optional[list[str]], typer.Option("--ignore-backend", metavar="BACKEND",
        help="Leave out these backends, e.g. fake (repeatable or comma-separated).")] = None,
    only_backend: Annotated[Optional[list[str]], typer.Option("--backend", metavar="BACKEND",
        help="Keep only these backends' rows, e.g. the one the host runs (repeatable or comma-separated).")] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", metavar="FILE",
        help="An earlier kvtrace JSON report or SARIF log: its findings are shown as such and do not fail.")] = None,
    write_baseline: Annotated[Optional[Path], typer.Option("--write-baseline", metavar="FILE",
        help="Also write this scan's findings as a JSON baseline, accepting them: exit 0 (3 if the scan is incomplete).")] = None,
    graph: Annotated[Optional[Path], typer.Option("--graph", metavar="FILE",
        help="Also export the analysis graph: FILE.graphml, FILE.dot or FILE.json.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache",
        help="Analyse even when this code, pack and tree were scanned before (see `kvtrace cache`).")] = False,
    hosts: Annotated[Optional[Path], typer.Option("--hosts", metavar="FILE",
        help="File of targets, one per line (# comments allowed), scanned with the ones given.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", metavar="N", min=1, help="Hosts fetched at the same time.")] = 8,
    quiet: Annotated[bool, typer.Option("--quiet", "-q",
        help="No progress display and no fleet summary; on stderr only errors and one INCOMPLETE line.")] = False,
    metrics: Annotated[Optional[str], typer.Option("--metrics", metavar="URL",
        help="Prometheus page as seen from each host (e.g. http://127.0.0.1:30000/metrics), read through "
             "the SSH connection; its queue gauges are shown beside the verdict.")] = None,
    metrics_seconds: Annotated[float, typer.Option("--metrics-seconds", metavar="SECONDS", min=0,
        help="Sample the page once a second for this long.")] = 3.0,
) -> None:
    """Scan one or more targets (a fleet: --hosts, --jobs) and report pinned and dropped poll
    states, per backend."""
    if verbose and quiet:
        raise _fail("--verbose and --quiet cannot be used together")
    setup_logging(verbose=verbose, quiet=quiet)
    request = ScanRequest(
        targets=tuple(targets or ()), given_format=given_format, output=output, rules=rules, role=role,
        queues=_names(queue), scan_all=scan_all, no_map=no_map, detail=detail.value, sarif_root=sarif_root,
        limits=FetchLimits(max_file_bytes=max_file_bytes, max_files=max_files, max_total_bytes=max_total_bytes),
        ssh=dict(identity_files=list(identity or []), ssh_config=ssh_config, known_hosts=known_hosts,
                 accept_new_host_key=accept_new_host_key, connect_timeout=connect_timeout, read_timeout=read_timeout,
                 timeout=timeout),
        verbose=verbose, quiet=quiet, fail_on=fail_on.value if fail_on else None, select=_names(select),
        ignore=_names(ignore), ignore_backends=_names(ignore_backend), only_backends=_names(only_backend),
        baseline=baseline, write_baseline=write_baseline, graph=graph, use_cache=not no_cache, hosts=hosts,
        jobs=jobs, metrics=metrics, metrics_seconds=metrics_seconds)
    raise typer.Exit(run_scan(request))


class ScanRequest(NamedTuple):
    """What `kvtrace scan`'s command line asks for, as given (checked by `_prepare`). Immutable: a
    NamedTuple rather than a frozen dataclass, whose generated methods every run would pay to build."""

    targets: tuple[str, ...]
    given_format: Optional[OutputFormat]
    output: Optional[Path]
    rules: Optional[str]
    role: Optional[Role]
    queues: tuple[str, ...]
    scan_all: bool
    no_map: bool
    detail: str
    sarif_root: Optional[Path]
    limits: FetchLimits
    ssh: dict
    verbose: bool
    quiet: bool
    fail_on: Optional[str]
    select: tuple[str, ...]
    ignore: tuple[str, ...]
    ignore_backends: tuple[str, ...]
    only_backends: tuple[str, ...]
    baseline: Optional[Path]
    write_baseline: Optional[Path]
    graph: Optional[Path]
    use_cache: bool
    hosts: Optional[Path]
    jobs: int
    metrics: Optional[str]
    metrics_seconds: float

    @property
    def overrides(self):
        from kvtrace.config import Overrides

        return Overrides(select=self.select, ignore=self.ignore, ignore_backends=self.ignore_backends,
                         pack=self.rules, fail_on=self.fail_on, baseline=str(self.baseline) if self.baseline else None)


class _Prepared(NamedTuple):
    """A request checked before anything is fetched: the targets, the format, and per target its
    settings, packs and baseline."""

    targets: list
    output_format: OutputFormat
    settings: dict
    packs: dict
    baseline_prints: dict
    cache: object


def run_scan(request: ScanRequest) -> int:
    """The scan a request asks for, in stages: check it, scan every target (kvtrace.fleet, each
    through kvtrace.pipeline), narrow to --backend, write the reports, tell stderr. The exit code."""
    from kvtrace.fleet import worst_exit

    overrides = request.overrides
    prepared = _prepare(request, overrides)
    results = _scan_targets(request, prepared)
    if request.only_backends:
        _keep_backends(results, request, prepared, overrides)
    verdict.code = worst_exit(r.exit_code for r in results)  # what the run exits with, whatever stdout does
    if request.write_baseline is not None and verdict.code == EXIT_FINDINGS:
        verdict.code = EXIT_CLEAN  # writing a baseline accepts today's findings; an incomplete scan still exits 3
    # Per report (a target scanned with --all gives several): the --fail-on level and where it was set.
    gate_levels = {report.target: _fail_on_source(prepared.settings.get(r.target), overrides)
                   if request.write_baseline is None
                   else ("never", f"--write-baseline {request.write_baseline} accepts them")
                   for r in results for report in r.reports}
    reports = [report for r in results for report in r.reports]
    if reports:
        _write_reports(reports, request, prepared.output_format, gate_levels, prepared.cache)
    try:
        _tell_stderr(results, reports, request, prepared, overrides, gate_levels)
    except BrokenPipeError:  # `2>&1 | head`
        closed_pipe(sys.stdout)
        closed_pipe(sys.stderr)
    return verdict.code


def _prepare(request: ScanRequest, overrides) -> _Prepared:
    """Every option and target checked, and each target's settings and packs read, before the
    first fetch: a bad one is one line and exit 2, never a half-done run."""
    from kvtrace.cache import Cache
    from kvtrace.fleet import read_hosts_file
    from kvtrace.packs import load_pack, pack_for, select_queues

    rules, role, queues = request.rules, request.role, list(request.queues)
    try:
        if request.graph is not None:
            from kvtrace.report.graph_export import check_path

            check_path(request.graph)  # before the scan, not after it
            check_output_path(request.graph, "--graph")
        wanted = list(request.targets) + (read_hosts_file(request.hosts) if request.hosts is not None else [])
        if not wanted:
            raise InputError("no TARGET: give paths or hosts, or --hosts FILE")
        check_targets(wanted)
        output_format = report_format(request.given_format, request.output)
        for option, path in (("--output", request.output), ("--write-baseline", request.write_baseline)):
            if path is not None:
                check_output_path(path, option)
        settings = {target: _settings(target, overrides) for target in wanted}
        # --role wins over [tool.kvtrace] pack, and conflicts only with --rules.
        packs = {target: _role_packs(rules, queues) if role is Role.all
                 else select_queues(load_pack(pack_for(rules if role else s.pack, role.value if role else None,
                                                       queues)), queues)
                 for target, s in settings.items()}
        baseline_prints = {}
        if any(s.baseline for s in settings.values()):
            from kvtrace import baseline as baselines  # only with a baseline: most scans (a cached rescan) have none

            baseline_prints = {t: baselines.load(Path(s.baseline)) for t, s in settings.items() if s.baseline}
        if request.metrics is not None:
            from kvtrace.metrics import parse_metrics_url

            parse_metrics_url(request.metrics)
        cache = Cache() if request.use_cache else None
    except KvtraceError as exc:
        raise _fail(str(exc))
    return _Prepared(wanted, output_format, settings, packs, baseline_prints, cache)


def _compare_with_baseline(baseline_prints: dict, target: str, report: Report) -> None:
    if target in baseline_prints:
        from kvtrace import baseline as baselines  # only with a baseline: most scans have none

        compared = baselines.apply(report.findings, baseline_prints[target])
        log.debug("%s: baseline: %d unchanged, %d new, %d no longer found", target, compared.unchanged,
                  compared.new, len(compared.gone))


def _scan_targets(request: ScanRequest, prepared: _Prepared) -> list:
    """Each target fetched and scanned (kvtrace.fleet); a result per target, its error said on stderr."""
    from kvtrace.fleet import FleetOptions, Progress, run_fleet

    options = FleetOptions(prepared.packs, prepared.settings, request.limits, request.ssh, request.jobs, prepared.cache,
                           request.metrics, request.metrics_seconds,
                           after_scan=functools.partial(_compare_with_baseline, prepared.baseline_prints),
                           scan_all=request.scan_all)
    fleet = len(prepared.targets) > 1
    if _process_ends_with_command and not fleet and not request.scan_all:
        # One scan, then the process ends (run()): its garbage goes with the process, so the cyclic
        # collector has nothing worth finding. Left on, it spends ~0.12 s (10% of a scan of SGLang's
        # 39 files) freeing the finished analysis just before the report is printed. A fleet or
        # --all, which scan many trees in this one process, keep it: memory stays one scan's worth.
        import gc

        gc.disable()
    results = run_fleet(prepared.targets, options, log.debug,
                        Progress(fleet and not request.quiet and not request.verbose and sys.stderr.isatty()))
    for r in results:
        if r.exception is not None:  # a bug in kvtrace: exit 4, the traceback with -v
            if request.verbose:
                traceback.print_exception(type(r.exception), r.exception, r.exception.__traceback__, file=sys.stderr)
            typer.echo(f"kvtrace: {plain(r.error)} (a bug in kvtrace; rerun with -v for the traceback)", err=True)
        elif r.error is not None:
            typer.echo(f"kvtrace: error: {plain(r.error)}", err=True)
        elif r.report is not None:
            log.debug("%s: fetched %d files in %.2fs; %s in %.2fs", r.target, len(r.report.files), r.timings["fetch"],
                      "cached result" if r.cached else "analysed", r.timings["analyse"])
    return results


def _keep_backends(results: list, request: ScanRequest, prepared: _Prepared, overrides) -> None:
    """--backend: only those backends' rows, and each report's exit code again from what is left."""
    from kvtrace.fleet import exit_code_for, worst_exit
    from kvtrace.narrow import keep_backends

    for r in results:
        try:
            for report in r.reports:
                keep_backends(report, request.only_backends)
            fail = _fail_on_source(prepared.settings.get(r.target), overrides)[0]
            if r.reports and r.error is None:
                r.exit_code = worst_exit(exit_code_for(report, fail) for report in r.reports)
        except KvtraceError as exc:
            typer.echo(f"kvtrace: error: {plain(str(exc))}", err=True)
            r.exit_code, r.report, r.extra_reports = EXIT_INPUT, None, []


def _write_reports(reports: list[Report], request: ScanRequest, output_format: OutputFormat,
                   gate_levels: dict[str, tuple[str, str]], cache=None) -> None:
    """The report (stdout or --output), then --graph and --write-baseline."""
    write_baseline = request.write_baseline
    try:
        try:
            _write(reports, output_format, request.output, request.no_map, request.sarif_root, gate_levels,
                   request.detail, cache)
        except BrokenPipeError:  # `| head`: the files below are still written, the code kept
            closed_pipe(sys.stdout)
        if request.graph is not None:
            from kvtrace.report import graph_export

            graph_export.write(reports, request.graph)
        if write_baseline is not None:
            from kvtrace.report.json import render as render_json

            write_baseline.write_text(render_json(reports), encoding="utf-8")
            accepted = sum(1 for r in reports for f in r.findings if not f.suppressed)
            incomplete = " from an INCOMPLETE scan (exit 3): what was not analysed is not in it" \
                if any(r.incomplete for r in reports) else ""
            typer.echo(plain(f"kvtrace: wrote baseline {write_baseline}: {accepted} finding(s) accepted{incomplete}"),
                       err=True)
    except OSError as exc:
        raise _fail(f"cannot write the report: {exc.strerror or exc}: {exc.filename or request.output}")


def _tell_stderr(results: list, reports: list[Report], request: ScanRequest, prepared: _Prepared, overrides,
                 gate_levels: dict[str, tuple[str, str]]) -> None:
    """What stderr says after the report: unknown backends, gaps, metrics that failed, the
    verdict of each failing report, and a fleet's summary."""
    from kvtrace.fleet import render_summary, summaries

    quiet, metrics, output_format = request.quiet, request.metrics, prepared.output_format
    warn_unknown_backends(reports, prepared.settings, overrides)
    report_gaps(reports, quiet)
    if quiet and metrics is not None:  # -q hides the fleet summary, not the gauge that was asked for
        for r in results:
            if r.metrics is not None and (r.metrics.error or not r.metrics.gauges):
                typer.echo(plain(f"kvtrace: {r.target}: {r.metrics.summary()[0]}"), err=True)
    # Every format: with stdout in a file, stderr is where the verdict shows. Concise output on
    # stdout ends with that verdict already (a hook's log holds both streams: say it once).
    if not quiet and not (output_format is OutputFormat.concise and request.output is None):
        report_failures(results, gate_levels)
    if not quiet and (len(prepared.targets) > 1 or metrics is not None):
        hosts = [s for r in results  # one per report: --all names each package
                 for s in summaries(r, _fail_on_source(prepared.settings.get(r.target), overrides)[0])]

        def summary(width: int) -> str:
            return render_summary(hosts, width)
        if output_format is OutputFormat.text and request.output is None:
            typer.echo("\n" + summary(_summary_width(sys.stdout)), nl=False)
        else:
            typer.echo(summary(_summary_width(sys.stderr)), err=True, nl=False)


def _fail_on_source(settings, overrides) -> tuple[str, str]:
    """(the --fail-on level for a target, where it was set) for the summary line."""
    from kvtrace.gate import fail_on_source

    return fail_on_source(getattr(settings, "fail_on", None), overrides.fail_on is not None,
                          getattr(settings, "source", None))


def report_failures(results, gate_levels: dict[str, tuple[str, str]]) -> None:
    """One stderr line per report that fails the run: what failed it, what else was reported,
    and the exit code. The text report's tally counts everything; a JSON or SARIF report on
    stdout goes to a file or a pipe, and this line is then all the person running it sees. An
    incomplete report (exit 3) that would fail on its findings says so too: its `incomplete:`
    lines name what was not analysed, not what was found."""
    failed_results = [r for r in results if r.exit_code in (EXIT_FINDINGS, EXIT_INCOMPLETE)]
    if not failed_results:
        return  # nothing to say: nor the baseline module to import (a clean or incomplete rescan)
    from kvtrace.baseline import counts_against
    from kvtrace.fleet import report_label
    from kvtrace.gate import counted, failing, verdict_line

    for r in failed_results:
        for report in r.reports:
            line = verdict_line(report.findings, *gate_levels[report.target])
            if line.startswith("failed"):
                failed = {id(f) for f in failing(report.findings, gate_levels[report.target][0])}
                rest = counted(f for f in report.findings if counts_against(f) and id(f) not in failed)
                also = f"; also {rest}" if rest else ""
                code = f"{EXIT_INCOMPLETE} (INCOMPLETE)" if r.exit_code == EXIT_INCOMPLETE else f"{EXIT_FINDINGS}"
                typer.echo(plain(f"kvtrace: {report_label(report, r.reports)}: {line}{also}; exit {code}"),
                           err=True)
            elif len(r.reports) > 1 and r.exit_code == EXIT_FINDINGS:  # --role all, --all: each report's totals
                typer.echo(plain(f"kvtrace: {report_label(report, r.reports)}: {line}"), err=True)


def _role_packs(rules: str | None, queues: list[str]) -> tuple:
    """`--role all`: each role's bundled pack, in ROLE_PACKS order (prefill, then decode), each
    narrowed to the named queues it holds; a role none of whose queues is named is left out."""
    from kvtrace.packs import ROLE_PACKS, load_pack, select_queues

    if rules is not None:
        raise InputError(f"--role all scans the bundled packs {', '.join(ROLE_PACKS.values())}, but the pack "
                         f"{rules} is also given: give one of them")
    packs = [load_pack(name) for name in ROLE_PACKS.values()]
    held = {name for pack in packs for name in pack.queues}
    unknown = [name for name in dict.fromkeys(queues) if name not in held]
    if unknown:
        raise InputError(f"--queue {', '.join(unknown)}: not a queue of any role (the queues: {', '.join(sorted(held))})")
    return tuple(select_queues(pack, [q for q in queues if q in pack.queues]) for pack in packs
                 if not queues or any(q in pack.queues for q in queues))


def _names(values: list[str] | None) -> tuple[str, ...]:
    """Repeatable options that also take comma-separated lists, as ruff's do."""
    return tuple(part.strip() for value in values or [] for part in value.split(",") if part.strip())


def _settings(target: str, overrides):
    """[tool.kvtrace] for this target (its tree, else the working directory) under the command line."""
    from kvtrace.config import resolve
    from kvtrace.target import LocalTarget, parse_target

    local = parse_target(target)  # already checked by check_targets
    start = Path(target) if isinstance(local, LocalTarget) else None
    return resolve(start, Path.cwd(), overrides, _KnownRules())


class _KnownRules:
    """The rule names and codes, looked up only when a name is checked: the rules import the
    analysis (~0.1 s), which a rescan served from the cache never runs."""

    def _names(self) -> set[str]:
        from kvtrace.rulemeta import RULES as ALL_RULES

        return {r.name for r in ALL_RULES} | {r.code for r in ALL_RULES}

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


def warn_unknown_backends(reports: list[Report], settings: dict, overrides) -> None:
    """A backend name to leave out that the tree does not have is a warning, not an error: a
    typo can only leave more in (the gate gets stricter, never blind), and one list serves
    trees of several SGLang versions whose backends differ. Silence would hide a stale filter."""
    for report in reports:
        unknown = report.filters.unknown_backends
        if not unknown:
            continue
        source = "--ignore-backend" if overrides.ignore_backends else \
            f"ignore-backends in {getattr(settings.get(report.target), 'source', None) or report.filters.config}"
        found = sorted({b.name for b in report.backends} | set(report.filters.ignored_backends))
        typer.echo(plain(f"kvtrace: warning: {report.target}: {source}: no backend {', '.join(unknown)} in this "
                         f"tree (its backends: {', '.join(found) or 'none'}); nothing left out for "
                         f"{'it' if len(unknown) == 1 else 'them'}"), err=True)


def report_gaps(reports: list[Report], quiet: bool) -> None:
    """Incomplete is loud: one stderr line per thing not analysed (one line in all with -q)."""
    from kvtrace.fleet import report_label
    from kvtrace.report.places import Places

    for report in reports:
        if not report.gaps:
            continue
        label = report_label(report, reports)  # --all: which package
        if quiet:
            count = len(report.gaps)
            typer.echo(plain(f"kvtrace: INCOMPLETE: {label}: {count} thing{'s' if count != 1 else ''} not analysed "
                             "(see the report)"), err=True)
            continue
        places = Places(report)  # paths that open from here, as in the text report
        for gap in report.gaps:
            typer.echo(plain(f"kvtrace: incomplete: {label}: {gap_line(gap, places)}"), err=True)


def gap_line(gap, places=None) -> str:
    """One thing not analysed; with `places` (kvtrace.report.places) its paths open from here."""
    shown = places.path if places is not None else str
    if gap.kind == "file":
        why = places.text(gap.why) if places is not None else gap.why
        return f"{shown(gap.subject)}{'' if gap.line is None else f':{gap.line}'} not analysed ({why})"
    reason = places.text(gap.reason) if places is not None else gap.reason
    if gap.kind == "backend":
        return f"backend {gap.subject} {reason}"
    return reason


def _write(reports: list[Report], fmt: OutputFormat, output: Path | None, no_map: bool,
           sarif_root: Path | None, gate_levels: dict[str, tuple[str, str]] | None = None,
           detail: str = "summary", cache=None) -> None:
    from kvtrace.report import render_text_stream

    if fmt is OutputFormat.text:
        if cache is not None and not (output is None and sys.stdout.isatty()):  # plain text: kept whole
            from kvtrace.cache import rendered
            from kvtrace.report import plain_width, render_plain

            width = plain_width(piped=output is None)
            text = rendered(cache, reports, ("text", width, no_map),
                            lambda: render_plain(reports, width=width, show_map=not no_map))
            if output is not None:
                output.write_text(text, encoding="utf-8")
            else:
                sys.stdout.write(text)
        elif output is not None:
            with output.open("w", encoding="utf-8") as handle:
                render_text_stream(reports, handle, terminal=False, show_map=not no_map)
        else:
            render_text_stream(reports, sys.stdout, terminal=sys.stdout.isatty(), show_map=not no_map)
        return
    if fmt is OutputFormat.json:
        def render_json() -> str:  # imported only when not kept
            from kvtrace.report.json import render

            return render(reports)

        text = render_json() if cache is None else _rendered(cache, reports, ("json",), render_json)
    elif fmt is OutputFormat.sarif:
        root = sarif_root or Path.cwd()

        def render_sarif() -> str:  # imported only when not kept: it imports the rules' table
            from kvtrace.report.sarif import render

            return render(reports, root=root)

        text = render_sarif() if cache is None else _rendered(
            cache, reports, ("sarif", str(root), os.path.realpath(root)), render_sarif)
    elif fmt is OutputFormat.github:
        from kvtrace.report.github import render as render_github

        text = render_github(reports, gate_levels)
    elif fmt is OutputFormat.concise:
        from kvtrace.report.concise import render as render_concise

        text = render_concise(reports, gate_levels)
    elif fmt is OutputFormat.html:
        from kvtrace.report.html import render as render_html

        text = render_html(reports)
    else:
        from kvtrace.report.markdown import render as render_markdown

        text = render_markdown(reports, detail=detail)
    if output is not None:
        output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


def _rendered(cache, reports: list[Report], options: tuple, render) -> str:
    from kvtrace.cache import rendered

    return rendered(cache, reports, options, render)


def setup_logging(verbose: bool, quiet: bool) -> None:
    """-v: steps and timings; -q: errors only. Rich on a terminal; plain unwrapped lines when
    stderr is redirected (a CI log), so no line is folded. The handler is made (and `logging`
    imported) when the first line is shown (kvtrace.LazyLog)."""
    log.level = log.DEBUG if verbose else log.WARNING
    log.pending = functools.partial(_start_logging, log.level, quiet)


def _start_logging(level: int, quiet: bool) -> None:
    """Lines go to the stderr of the moment they are said, never to one bound earlier: a
    process that runs several commands (a test session, an embedding tool) may have closed
    the stderr that was current when logging was set up."""
    import logging

    class CurrentStderr(logging.StreamHandler):
        @property
        def stream(self) -> TextIO:
            return sys.stderr

        @stream.setter
        def stream(self, _: TextIO) -> None:
            pass

    logger = logging.getLogger("kvtrace")
    logger.handlers.clear()
    logger.propagate = False
    if _is_terminal(sys.stderr):
        from rich.console import Console
        from rich.logging import RichHandler

        # Console(stderr=True) looks sys.stderr up at each write
        handler: logging.Handler = RichHandler(console=Console(stderr=True), show_time=False, show_path=False,
                                               markup=False, highlighter=None)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = CurrentStderr()
        handler.setFormatter(logging.Formatter("kvtrace: %(message)s"))
    if quiet:  # errors, and the warnings that stay loud (`extra={"loud": True}`: a refused cache folder)
        handler.addFilter(lambda record: record.levelno >= logging.ERROR or getattr(record, "loud", False))
    handler.addFilter(_safe_record)
    logger.addHandler(handler)
    logger.setLevel(level)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:  # closed
        return False


def _safe_record(record: Any) -> bool:  # a logging.LogRecord
    """Log lines carry outside text (remote stderr, file names): print it inert, on one line."""
    record.msg, record.args = plain(record.getMessage()), ()
    return True


# ---------------------------------------------------------------------------------------------
# kvtrace diff

class DiffFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"  # a pull-request comment (under GitHub's 65,536 characters)
    github = "github"  # workflow annotations on HEAD's files for the added findings


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
    fail_on: Annotated[Optional[FailOn], typer.Option("--fail-on",
        help="Exit 1 only when an added finding has this severity or worse. Default: error.")] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", metavar="FILE",
        help="A kvtrace JSON report or SARIF log: added findings it holds are shown as such and do not fail.")] = None,
) -> None:
    """Compare two trees or two git revisions: added (with their evidence), fixed, moved (same
    finding, code now in another file or function) and unchanged findings, and the release-map
    rows whose states moved. Exit 1 only when an added finding reaches --fail-on.

    Examples: `kvtrace diff origin/main HEAD --path python/sglang`, `kvtrace diff old/ new/`.
    """
    from kvtrace import baseline as baselines
    from kvtrace import diff as diffs
    from kvtrace.config import Overrides
    from kvtrace.packs import load_pack
    from kvtrace.scan import scan_fetched

    overrides = Overrides(select=_names(select), ignore=_names(ignore), ignore_backends=_names(ignore_backend),
                          pack=rules, fail_on=fail_on.value if fail_on else None,
                          baseline=str(baseline) if baseline else None)
    try:
        prints = baselines.load(baseline) if baseline is not None else None  # before the scans it would cost
        with diffs.Checkout(repo, path) as checkout:
            trees = {"base": checkout.tree(base), "head": checkout.tree(head)}
            settings = _settings(str(trees["head"]) if Path(head).is_dir() else ".", overrides)
            pack = load_pack(settings.pack)
            reports = {}
            for side, tree in trees.items():
                fetched = checkout.fetch(tree)
                fetched.target = {"base": base, "head": head}[side] + (f":{path}" if path and not Path(
                    {"base": base, "head": head}[side]).is_dir() else "")
                reports[side] = scan_fetched(fetched, pack, settings)
        if prints is None and settings.baseline:  # [tool.kvtrace] baseline, found with HEAD's config
            prints = baselines.load(Path(settings.baseline))
    except KvtraceError as exc:
        raise _fail(str(exc))
    result = diffs.compare(reports["base"], reports["head"], prints)
    level, source = _fail_on_source(settings, overrides)
    outcome = diffs.verdict(result, level, source)
    if output_format is not DiffFormat.json:  # people's formats: paths that open from here
        from kvtrace.report.places import Places

        # A folder's files are where they are; a revision's are shown at their place in the checkout.
        folders = {side: trees[side] if Path(spec).is_dir() else repo / (path or "")
                   for side, spec in (("base", base), ("head", head))}
        shown = diffs.localized(result, Places(reports["base"], folder=folders["base"]),
                                Places(reports["head"], folder=folders["head"]))
    if output_format is DiffFormat.text:
        from kvtrace.report import plain_width

        # Folded like scan's text: to the terminal's width, or the one a pipe is read in.
        width = os.get_terminal_size(1).columns if sys.stdout.isatty() and "COLUMNS" not in os.environ \
            else plain_width(piped=True)
        text = diffs.render_text(shown, base, head, outcome, width=width)
    elif output_format is DiffFormat.json:
        text = diffs.to_json(result, base, head, level, outcome)
    elif output_format is DiffFormat.markdown:
        text = diffs.render_markdown(shown, base, head, outcome)
    else:
        text = diffs.render_github(shown, outcome)
    sys.stdout.write(text)
    if result.incomplete:
        typer.echo("kvtrace: the scan of BASE or HEAD is incomplete (see the report)", err=True)
    raise typer.Exit(EXIT_FINDINGS if diffs.failed_findings(result, level) else
                     EXIT_INCOMPLETE if result.incomplete else EXIT_CLEAN)


# ---------------------------------------------------------------------------------------------
# kvtrace merge / cache (fleets)

@app.command()
def merge(
    reports: Annotated[list[Path], typer.Argument(help="JSON reports (`kvtrace scan --format json`), one or more per host.")],
    output_format: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    fail_on: Annotated[FailOn, typer.Option("--fail-on", help="As for scan: the severity that makes a host exit 1.")] = FailOn.error,
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
    verdict.code = worst_exit(h.exit_code for h in hosts)
    if output_format == "json":
        typer.echo(json.dumps(summary_json(hosts), indent=2))
    else:
        typer.echo(render_summary(hosts, _summary_width(sys.stdout)), nl=False)
    raise typer.Exit(verdict.code)


def _summary_width(stream: TextIO) -> int:
    """A fleet summary's width, as the text report's: a terminal's (stdout piped to `less`: the
    terminal the user looks at), else unfolded, one greppable line per verdict."""
    from kvtrace.report import plain_width

    try:
        terminal = stream.isatty()
    except (ValueError, AttributeError):  # a closed or replaced stream
        terminal = False
    return plain_width(piped=terminal or stream is sys.stdout)


cache_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="The result cache (user cache dir; KVTRACE_CACHE_DIR overrides it).")
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is, how many entries and bytes it holds, and its bound."""
    from kvtrace.cache import Cache

    try:
        info = Cache().info()
    except KvtraceError as exc:
        raise _fail(str(exc))
    typer.echo(f"path     {info.path}\nentries  {info.entries}\nsize     {info.total_bytes} bytes "
               f"(bound {info.max_bytes}; KVTRACE_CACHE_MAX_BYTES)")


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove every cached result."""
    from kvtrace.cache import Cache

    try:
        cache = Cache()
        removed = cache.clear()  # refuses a folder others can write: nothing in it is known to be ours
    except KvtraceError as exc:
        raise _fail(str(exc))
    typer.echo(f"removed {removed} entries from {cache.dir}")


# ---------------------------------------------------------------------------------------------
# kvtrace rules / explain / schema

@app.command("rules")
def list_rules() -> None:
    """List the rules (code, name, default severity, summary) and the bundled rules packs."""
    from kvtrace.packs import available_packs
    from kvtrace.rules import ALL_RULES

    width = _text_width()
    for rule in ALL_RULES:
        head = f"{rule.code}  {rule.name:20} {rule.severity:8} "
        typer.echo(_hanging(head, rule.summary(), width))
    typer.echo("\n" + _hanging("", f"rule packs: {', '.join(available_packs())}  "
                                    "(kvtrace explain CODE|NAME for one rule)", width))


@app.command(epilog="\b\nExample:\n  kvtrace explain pinned-state")
def explain(rule: Annotated[str, typer.Argument(metavar="RULE",
        help="A rule code or name, e.g. KVT001 or pinned-state.")]) -> None:
    """Show what a rule finds, why it matters, an example and the fix."""
    from kvtrace.rules import ALL_RULES, find_rule

    found = find_rule(rule)
    if found is None:
        from kvtrace.config import unknown_rule

        raise _fail(unknown_rule(rule, {r.name for r in ALL_RULES} | {r.code for r in ALL_RULES}))
    width = _text_width()
    typer.echo(_hanging("", f"{found.code} {found.name} ({found.severity}): {found.title}", width) + "\n")
    typer.echo(_reflow(found.docs(), width))


def _text_width() -> int:
    """The terminal's width (or $COLUMNS), capped so prose stays readable; 88 when piped."""
    import shutil

    return max(40, min(shutil.get_terminal_size((88, 24)).columns, 100))


def _hanging(head: str, text: str, width: int) -> str:
    """`head` then `text` wrapped at word boundaries, continuation lines under the text."""
    import textwrap

    return textwrap.fill(text, width, initial_indent=head, subsequent_indent=" " * len(head),
                         break_long_words=False, break_on_hyphens=False)


def _reflow(doc: str, width: int) -> str:
    """Re-wrap a rule's docstring to `width`: the docs are pre-wrapped at 100 columns, and a
    terminal narrower than that would break lines mid-word. Runs of lines with the same
    indentation are one paragraph; a section heading (`Fix:`) stays on its own line."""
    out: list[str] = []
    run: list[str] = []
    indent = ""

    def flush() -> None:
        if run:
            out.append(_hanging(indent, " ".join(run), width))
            run.clear()

    for line in doc.splitlines():
        stripped = line.strip()
        this_indent = line[: len(line) - len(line.lstrip())]
        heading = not this_indent and stripped.endswith(":")
        if not stripped or heading or this_indent != indent:
            flush()
            indent = this_indent
        if not stripped or heading:
            out.append(stripped)
        else:
            run.append(stripped)
    flush()
    return "\n".join(out)


@app.command(epilog="\b\nExample:\n  kvtrace scan . --format json | python -m jsonschema <(kvtrace schema)")
def schema() -> None:
    """Print the JSON Schema of `scan --format json` (kvtrace/2: {"schema", "reports": [...]})."""
    from kvtrace.report.schema import JSON_SCHEMA

    typer.echo(json.dumps(JSON_SCHEMA, indent=2))


# ---------------------------------------------------------------------------------------------
# Entry point

def _click_exceptions():
    try:  # typer >= 0.2x vendors click
        from typer._click import exceptions
    except ImportError:  # older typer runs on click itself
        from click import exceptions  # type: ignore[no-redef]
    return exceptions


class _Interrupted(BaseException):
    """Ctrl-C as our own exception: click turns KeyboardInterrupt into "Aborted!" and exit 1
    (or swallows it), and `except Exception` around a scan must not catch it either."""


def _on_sigint(signum: int, frame: object) -> None:
    raise _Interrupted()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: usage errors are one line (exit 2), internal errors exit 4, Ctrl-C 130."""
    import signal

    signal.signal(signal.SIGINT, _on_sigint)
    args = sys.argv[1:] if argv is None else argv
    exceptions = _click_exceptions()
    command = typer.main.get_command(app)
    verdict.code = None
    try:
        code = command.main(args=args, prog_name="kvtrace", standalone_mode=False)
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe would mean exit 120
        sys.stderr.flush()
    except exceptions.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        code = EXIT_INPUT
    except exceptions.UsageError as exc:
        if isinstance(exc, exceptions.NoSuchOption):
            exc.possibilities = _close_options(exc.option_name, exc.possibilities or [])
        hint = f" (see 'kvtrace {exc.ctx.info_name} --help')" if exc.ctx and exc.ctx.parent else " (see 'kvtrace --help')"
        message = _usage_message(exc) or " ".join(exc.format_message().split())
        typer.echo(f"kvtrace: error: {message}{hint}", err=True)
        code = EXIT_INPUT
    except (_Interrupted, KeyboardInterrupt, typer.Abort):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the message
        typer.echo("kvtrace: interrupted", err=True)
        sys.stderr.flush()
        # Not sys.exit: it would join fleet worker threads still blocked on remote hosts.
        os._exit(130)
    except SystemExit as exc:
        if exc.code != 1 or type(sys.stdout).__name__ != "PacifyFlushWrapper":
            raise
        # click met the closed pipe itself (`kvtrace rules | head`): it wraps the streams and exits
        # 1. A listing whose reader stopped early is not a failure; a scan keeps its verdict.
        closed_pipe(sys.stdout)
        code = verdict.code if verdict.code is not None else EXIT_CLEAN
    except BrokenPipeError:
        # The reader went away (`kvtrace scan ... | head`, maybe with 2>&1): not an error worth
        # a line, and the exit code stays the scan's verdict. Both streams go to /dev/null so
        # nothing buffered fails again at interpreter exit.
        closed_pipe(sys.stdout)
        closed_pipe(sys.stderr)
        code = verdict.code if verdict.code is not None else EXIT_CLEAN
    except Exception as exc:  # a bug in kvtrace
        _internal(plain(f"internal error: {type(exc).__name__}: {exc}"), exc, args)
        code = EXIT_INTERNAL
    sys.exit(code if isinstance(code, int) else EXIT_CLEAN)


# Set by run(): this process ends when the command does, so nothing it built needs freeing.
_process_ends_with_command = False


def run() -> None:
    """The `kvtrace` command (console script and `python -m kvtrace`): main(), then the process
    ends as soon as the streams are flushed. Tearing down a scan's ~300,000 objects (the syntax
    trees, the index, the paths explored) at interpreter exit costs ~0.1-0.2 s and achieves
    nothing, so it is skipped with os._exit, as mypy does; every file kvtrace writes is closed by
    then. In-process callers (tests, `kvtrace.cli.main([...])`) keep a normal SystemExit."""
    import gc

    global _process_ends_with_command
    _process_ends_with_command = True
    gc.freeze()  # what the imports built lives as long as the process: never scanned again
    gc.enable()  # (python -m kvtrace imports with it off)
    try:
        main()
        code: object = EXIT_CLEAN
    except SystemExit as exc:
        code = exc.code
    if code is None:
        code = EXIT_CLEAN
    elif not isinstance(code, int):  # what the interpreter does with sys.exit("message")
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError, ValueError):  # a closed pipe: the code is still the verdict
            pass
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code)


# click (and typer's copy of it) words option errors its own way; say the same in ours. Patterns as
# text, compiled by re.fullmatch when a usage error is worded: every run would pay for 8 compiles.
_USAGE_WORDING = [
    (r"'(?P<value>.*)' is not one of (?P<choices>.*?)\.?$", None),
    (r"'.*' is not a valid (?:integer|int range)\.?", "not a whole number"),
    (r"'.*' is not a valid (?:float|float range)\.?", "not a number"),
    (r".* is not in the range x>=(?P<n>\S+?)\.?", "must be at least {n}"),
    (r".* is not in the range x<=(?P<n>\S+?)\.?", "must be at most {n}"),
    (r".* is not in the range x>(?P<n>\S+?)\.?", "must be more than {n}"),
    (r".* is not in the range x<(?P<n>\S+?)\.?", "must be less than {n}"),
    (r".* is not in the range (?P<low>\S+?)<=x<=(?P<high>\S+?)\.?", "must be from {low} to {high}"),
]


def _close_options(typed: str, offered: Sequence[str]) -> list[str]:
    """The options worth suggesting for a mistyped one: click offers any of difflib's matches
    above 0.6, and `--foo` then gets `--format` (0.62); a typo, a missing letter or a near
    name stays above 0.75 (`--formt`, `--rule` for `--rules` and `--role`)."""
    import difflib

    return [name for name in offered if difflib.SequenceMatcher(None, typed, name).ratio() >= 0.75]


def _usage_message(exc: Exception) -> str | None:
    """`--format pdf: not one of text, json, ...` instead of the validation library's words."""
    param = getattr(exc, "param", None)
    opts = getattr(param, "opts", None)
    text = str(getattr(exc, "message", ""))
    if not opts:
        return None
    for pattern, wording in _USAGE_WORDING:
        match = re.fullmatch(pattern, text.strip())
        if match is None:
            continue
        if wording is None:
            choices = re.findall(r"'([^']*)'", match.group("choices"))
            return f"{opts[0]} {match.group('value')}: not one of {', '.join(choices)}"
        return f"{opts[0]}: {wording.format(**match.groupdict())}"
    return None


def _internal(message: str, exc: BaseException | None, args: list[str]) -> None:
    if exc is not None and ("-v" in args or "--verbose" in args):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    typer.echo(f"kvtrace: {message} (a bug in kvtrace; rerun with -v for the traceback)", err=True)


if __name__ == "__main__":
    main()
