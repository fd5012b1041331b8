"""The typer front: `kvtrace scan`, `rules`, `explain`, `schema`. All analysis lives below."""

from __future__ import annotations

import json
import logging
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from kvtrace import __version__
from kvtrace.rules import ALL_RULES, rule_by_id
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


SEVERITY_RANK = {"note": 0, "warning": 1, "error": 2, "never": 3}


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"


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
    typer.echo(f"kvtrace: error: {message}", err=True)
    return typer.Exit(code)


@app.command()
def scan(
    targets: Annotated[list[str], typer.Argument(
        help="Local paths (an SGLang checkout, an installed sglang package, or its disaggregation "
             "folder) or remote ones: [user@]host[:port]:path or ssh://[user@]host[:port]/path.")],
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
    max_file_bytes: Annotated[int, typer.Option("--max-file-bytes", help="Skip (and report) larger files.")] = FetchLimits.max_file_bytes,
    max_files: Annotated[int, typer.Option("--max-files", help="Refuse trees with more .py files.")] = FetchLimits.max_files,
    max_total_bytes: Annotated[int, typer.Option("--max-total-bytes", help="Refuse trees with more bytes of .py.")] = FetchLimits.max_total_bytes,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show fetch steps and timings on stderr.")] = False,
    fail_on: Annotated[FailOn, typer.Option("--fail-on",
        help="Exit 1 only for findings of this severity or worse (never: report, exit 0).")] = FailOn.note,
    no_cache: Annotated[bool, typer.Option("--no-cache",
        help="Analyse even when this code, pack and tree were scanned before (see `kvtrace cache`).")] = False,
) -> None:
    """Scan one or more targets and report pinned and dropped poll states, per backend."""
    from kvtrace.fetch import fetch_target
    from kvtrace.packs import load_pack
    from kvtrace.cache import Cache, scan_cached

    err = Console(stderr=True, highlight=False)

    def log(message: str) -> None:
        if verbose:
            err.print(f"[dim]kvtrace: {message}[/dim]")

    limits = FetchLimits(max_file_bytes=max_file_bytes, max_files=max_files, max_total_bytes=max_total_bytes)
    try:
        pack = load_pack(rules)
    except KvtraceError as exc:
        raise _fail(str(exc))
    ssh = dict(identity_files=list(identity or []), ssh_config=ssh_config, known_hosts=known_hosts,
               accept_new_host_key=accept_new_host_key, connect_timeout=connect_timeout, read_timeout=read_timeout)
    reports: list[Report] = []
    cache = None if no_cache else Cache()
    memo: dict[str, bytes] = {}  # identical trees in one run are analysed once
    failed = False
    for target in targets:
        started = time.perf_counter()
        try:
            fetched = fetch_target(target, limits, ssh, log)
            log(f"{target}: fetched {len(fetched.files)} files in {time.perf_counter() - started:.2f}s")
            analysed = time.perf_counter()
            report, hit = scan_cached(fetched, pack, cache, memo)
            reports.append(report)
            log(f"{target}: {'cached result' if hit else 'analysed'} in {time.perf_counter() - analysed:.2f}s")
        except KvtraceError as exc:
            typer.echo(f"kvtrace: error: {exc}", err=True)
            failed = True
        except Exception as exc:  # a bug in kvtrace: one line, never a traceback
            typer.echo(f"kvtrace: internal error on {target}: {type(exc).__name__}: {exc}", err=True)
            failed = True
    if reports:
        _write(reports, output_format, output, no_map)
    if failed:
        raise typer.Exit(EXIT_INPUT)
    if any(f.status != "ok" for r in reports for f in r.files) or any(r.problems for r in reports):
        raise typer.Exit(EXIT_INCOMPLETE)
    threshold = SEVERITY_RANK[fail_on.value]
    failing = any(SEVERITY_RANK.get(f.severity, 0) >= threshold for r in reports for f in r.findings)
    raise typer.Exit(EXIT_FINDINGS if failing else EXIT_CLEAN)


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


@app.command("rules")
def list_rules() -> None:
    """List the rules and the bundled rules packs."""
    from kvtrace.packs import available_packs

    for rule in ALL_RULES:
        typer.echo(f"{rule.id:16} {rule.severity:8} {rule.summary()}")
    typer.echo(f"\nrules packs: {', '.join(available_packs())}")


@app.command()
def explain(rule: Annotated[str, typer.Argument(help="A rule id, e.g. pinned-state.")]) -> None:
    """Show what a rule does, why it matters, an example and the fix."""
    found = rule_by_id(rule)
    if found is None:
        raise _fail(f"unknown rule {rule!r}; known: {', '.join(r.id for r in ALL_RULES)}")
    typer.echo(f"{found.id} ({found.severity}): {found.name}\n")
    typer.echo(found.docs())


@app.command()
def schema() -> None:
    """Print the JSON Schema of the kvtrace/1 report (`scan --format json`)."""
    from kvtrace.report.schema import JSON_SCHEMA

    typer.echo(json.dumps(JSON_SCHEMA, indent=2))


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


def main() -> None:
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("kvtrace: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
