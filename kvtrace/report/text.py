"""The terminal report: rich tables and code excerpts; plain columns without colour or box
lines when the output is not a terminal (piped into a file, grep or a CI log)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvtrace.baseline import mark, tally
from kvtrace.model import Finding, Report, SourceFile

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}
OUTCOME_STYLE = {"kept": "yellow", "leaves": "green", "raises": "magenta", "dropped": "red"}


def excerpt(files: dict[str, SourceFile], path: str, line: int, context: int = 2) -> list[tuple[int, str]]:
    source = files.get(path)
    text = source.text if source is not None else None
    if not text:
        return []
    lines = text.splitlines()
    start, end = max(1, line - context), min(len(lines), line + context)
    return [(n, lines[n - 1]) for n in range(start, end + 1)]


def render(report: Report, console: Console, show_map: bool = True) -> None:
    plain = not console.is_terminal
    table_box = None if plain else box.SIMPLE_HEAD
    files = {f.path: f for f in report.files}
    ok = sum(1 for f in report.files if f.status == "ok")
    console.print(Text.assemble(("kvtrace ", "bold"), report.target, f"  ({report.root or '.'})"))
    enum = f"{report.enum.note} at {report.enum.path}:{report.enum.line}" if report.enum else "no enum"
    console.print(f"{ok}/{len(report.files)} files analysed; {enum}")
    for f in report.files:
        if f.status != "ok":
            console.print(Text(f"  {f.status}: {f.path}: {f.error}", style="yellow"))
    for problem in report.problems:
        console.print(Text(f"  note: {problem}", style="yellow"))

    for queue in report.queues:
        if show_map:
            console.print()
            drain = f" — drain loop {queue.drain.note} at {queue.drain.path}:{queue.drain.line}" if queue.drain else ""
            table = Table(title=f"Release map: {queue.name}{drain}", box=table_box, title_justify="left",
                          show_edge=False, pad_edge=False)
            for column in ("kind", "path:line", "function", "states"):
                table.add_column(column, overflow="fold")
            for site in queue.sites:
                states = ", ".join(site.states)
                if site.note and site.kind in ("release", "abort", "requeue", "done", "keep", "helper", "gauge"):
                    states = f"{states}  [{site.note}]" if states else f"[{site.note}]"
                table.add_row(site.kind, f"{site.path}:{site.line}", site.function, states)
            console.print(table)

        console.print()
        fates = Table(title="Poll states", box=table_box, title_justify="left", show_edge=False, pad_edge=False)
        fates.add_column("state")
        fates.add_column("fate")
        fates.add_column("where it goes", overflow="fold")
        for state, fate in queue.states.items():
            outcome = Text(", ".join(fate.fate) or "-")
            for o in fate.fate:
                outcome.highlight_words([o], OUTCOME_STYLE[o])
            where = "; ".join(f"{e.note} {e.path.rsplit('/', 1)[-1]}:{e.line}" for e in fate.evidence
                              if not e.note.startswith("check") and not e.note.startswith("helper"))
            fates.add_row(state, outcome, where)
        console.print(fates)

    console.print()
    backends = Table(title="Backends", box=table_box, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("backend", "sender", "poll()", "returns", "reads abort state", "timeouts"):
        backends.add_column(column, overflow="fold")
    for b in report.backends:
        poll = f"{b.poll.path}:{b.poll.line}" if b.poll else "-"
        if b.poll and b.poll.inherited_from:
            poll += f" (from {b.poll.inherited_from})"
        abort = (f"yes ({b.abort_state})" if b.reads_abort_state else
                 f"no (abort() writes {b.abort_state})" if b.abort_state else "no (no abort state)")
        timeouts = "; ".join(f"line {t.line}: {', '.join(t.covers) or 'no state'}" for t in b.timeouts) or "none"
        backends.add_row(b.name, b.sender, poll, ", ".join(b.returns), abort, timeouts)
    console.print(backends)

    console.print()
    if not report.findings:
        console.print(Text("No findings.", style="bold green"))
    for finding in report.findings:
        render_finding(finding, files, console)
    errors = sum(1 for f in report.findings if f.severity == "error")
    silenced = tally(report.findings)
    console.print(Text(f"{len(report.findings)} finding(s), {errors} error(s)" + (f" ({silenced})" if silenced else ""),
                       style="bold red" if errors else "bold"))


def render_finding(finding: Finding, files: dict[str, SourceFile], console: Console) -> None:
    head = Text.assemble((f"{finding.path}:{finding.line}", "bold"), " ",
                         (f"{finding.severity}[{finding.rule}]", SEVERITY_STYLE.get(finding.severity, "")),
                         f" ({mark(finding)})" if mark(finding) else "")
    console.print(head)
    console.print(f"  {finding.message}")
    for number, line in excerpt(files, finding.path, finding.line):
        marker = ">" if number == finding.line else " "
        console.print(Text(f"  {marker}{number:6d} | {line}", style="bold" if marker == ">" else "dim"))
    for e in finding.evidence:
        console.print(Text(f"    {e.path}:{e.line}  {e.note}", style="dim"))
    console.print()
