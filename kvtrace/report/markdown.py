"""A bug-report document, answer first: what was not analysed, the verdict grid, the findings
grouped by backend with their evidence, the summary; then the release map, the poll states'
fates and the backends. Markdown that pastes into an issue tracker."""

from __future__ import annotations

from kvtrace.model import Report
from kvtrace.report import modes_line, state_fate_lines
from kvtrace.report.verdicts import by_severity, gap_text, summary_line, unknown_returns, verdict_grids, way_out_text
from kvtrace.report.bugreport import code_link, environment_lines, excerpt_details, target_from_cwd
from kvtrace.report.diagram import mermaid_section
from kvtrace.report.links import permalinks


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(reports: list[Report]) -> str:
    out: list[str] = []
    for report in reports:
        links = permalinks(report)
        out.append(f"## kvtrace: `{target_from_cwd(report)}`\n")
        out += environment_lines(report) + [""]
        out.append(f"Package `{report.root or '.'}`; {sum(f.status == 'ok' for f in report.files)}"
                   f"/{len(report.files)} files analysed.\n")
        if report.filters.active:  # a narrowed scan says so, as the text report's header does
            out.append(f"Filters: {_cell(report.filters.describe())}.\n")
        _answer_first(report, out)
        out.append(f"### Findings ({len(report.findings)})\n")
        for f in by_severity(report.findings):
            out.append(f"- **{f.rule}** ({f.severity}) {code_link(f.path, f.line, links)}: {f.message}")
            for e in f.evidence:
                out.append(f"  - {code_link(e.path, e.line, links)} {e.note}")
            out += ["", *("  " + row if row else "" for row in excerpt_details(report, f.path, f.line, links)), ""]
        if not report.findings:
            out.append("None.")
        out += mermaid_section(report)
        for queue in report.queues:
            out.append(f"\n### Release map: `{queue.name}`\n")
            out.append("| kind | path:line | function | states |")
            out.append("|---|---|---|---|")
            for s in queue.sites:
                note = f" ({_cell(s.note)})" if s.note else ""
                out.append(f"| {s.kind} | `{s.path}:{s.line}` | `{s.function}` | {', '.join(s.states)}{note} |")
            modes = modes_line(queue)
            if modes:
                out.append(f"\n{_cell(modes)}")
            out.append("\n| state | fate |")
            out.append("|---|---|")
            for state, fate in queue.states.items():
                described = "<br>".join(_cell(f"{mode}: {text}" if mode else text) for mode, text in state_fate_lines(queue, fate))
                out.append(f"| {state} | {described} |")
        out.append("\n### Backends\n")
        out.append("| backend | sender | poll() | returns | reads abort state | timeouts | way out |")
        out.append("|---|---|---|---|---|---|---|")
        for b in report.backends:
            poll = f"`{b.poll.path}:{b.poll.line}`" if b.poll else "-"
            timeouts = "; ".join(f"`{t.path}:{t.line}` {', '.join(t.covers)}" for t in b.timeouts) or "none"
            returns = "<br>".join([", ".join(b.returns) or "-"] + [_cell(u) for u in unknown_returns(b)])
            ways = "<br>".join(_cell(f"{state}: {way_out_text(v)}") for state, v in b.verdicts.items()) or "-"
            out.append(f"| {b.name} | `{b.sender}` | {poll} | {returns} | "
                       f"{'yes' if b.reads_abort_state else 'no'} | {timeouts} | {ways} |")
        out.append("")
    return "\n".join(out) + "\n"


def _answer_first(report: Report, out: list[str]) -> None:
    """What was not analysed (loud), then the backend x state verdict grid."""
    if report.gaps:
        out.append(f"> **INCOMPLETE**: {gap_text(report.gaps)}\n")
        for gap in report.gaps:
            subject = f"`{gap.subject}`" if gap.kind == "file" else f"backend `{gap.subject}`" \
                if gap.kind == "backend" else "scan"
            out.append(f"- {subject}: {_cell(gap.reason)}")
        out.append("")
    for grid in verdict_grids(report):
        if not grid.backends:
            continue
        out.append(f"Verdicts for `{grid.queue}`:\n")
        out.append("| backend | " + " | ".join(grid.states) + " |")
        out.append("|---" * (len(grid.states) + 1) + "|")
        for backend in grid.backends:
            cells = [f"**{text}**" if severity == "error" else text
                     for text, severity in (grid.cells[backend, s] for s in grid.states)]
            out.append(f"| {backend} | " + " | ".join(cells) + " |")
        out.append(f"\n{_cell(grid.legend)}\n")
    out.append(f"**{summary_line(report)}**\n")

