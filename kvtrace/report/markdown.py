"""A bug-report document, answer first: what was not analysed, the verdict grid, the findings
grouped by backend with their evidence, the summary; then the release map, the poll states'
fates and the backends. Markdown that pastes into an issue tracker."""

from __future__ import annotations

from kvtrace import __version__
from kvtrace.model import Report
from kvtrace.report.verdicts import backend_label, finding_groups, gap_text, summary_line, verdict_grid


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(reports: list[Report]) -> str:
    out: list[str] = []
    for report in reports:
        _report(report, out)
    return "\n".join(out) + "\n"


def _report(report: Report, out: list[str]) -> None:
    version = f" ({report.version.package} {report.version.version})" if report.version else ""
    out.append(f"## kvtrace {__version__}: `{report.target}`{version}\n")
    analysed = sum(f.status == "ok" for f in report.files)
    out.append(f"Package `{report.root or '.'}`; {analysed}/{len(report.files)} files analysed.\n")
    if report.gaps:
        out.append(f"> **INCOMPLETE**: {gap_text(report.gaps)}\n")
        for gap in report.gaps:
            subject = f"`{gap.subject}`" if gap.kind == "file" else f"backend `{gap.subject}`" \
                if gap.kind == "backend" else "scan"
            out.append(f"- {subject}: {_cell(gap.reason)}")
        out.append("")

    grid = verdict_grid(report)
    if grid.backends:
        out.append("| backend | " + " | ".join(grid.states) + " |")
        out.append("|---" * (len(grid.states) + 1) + "|")
        for backend in grid.backends:
            cells = [f"**{text}**" if severity == "error" else text
                     for text, severity in (grid.cells[backend, s] for s in grid.states)]
            out.append(f"| {backend} | " + " | ".join(cells) + " |")
        out.append(f"\n{grid.legend}\n")

    out.append(f"### Findings ({len(report.findings)})\n")
    for backend, groups in finding_groups(report).items():
        info = next((b for b in report.backends if b.name == backend), None)
        out.append(f"#### {_cell(backend_label(backend, info))}\n")
        for g in groups:
            states = f" — {', '.join(g.states)}" if g.states else ""
            out.append(f"- **{g.rule}** ({g.severity}) `{g.path}:{g.line}`{states}: {_cell(g.message)}")
            for e in g.evidence:
                out.append(f"  - `{e.path}:{e.line}` {_cell(e.note)}")
        out.append("")
    if not report.findings:
        out.append("None.\n")
    out.append(f"**{summary_line(report)}**")

    for queue in report.queues:
        out.append(f"\n### Release map: `{queue.name}`\n")
        out.append("| kind | path:line | function | states |")
        out.append("|---|---|---|---|")
        for s in queue.sites:
            note = f" ({_cell(s.note)})" if s.note else ""
            out.append(f"| {s.kind} | `{s.path}:{s.line}` | `{s.function}` | {', '.join(s.states)}{note} |")
        out.append("\n| state | fate |")
        out.append("|---|---|")
        for state, fate in queue.states.items():
            out.append(f"| {state} | {', '.join(fate.fate)} |")
    out.append("\n### Backends\n")
    out.append("| backend | sender | poll() | returns | reads abort state | timeouts |")
    out.append("|---|---|---|---|---|---|")
    for b in report.backends:
        poll = f"`{b.poll.path}:{b.poll.line}`" if b.poll else "-"
        timeouts = "; ".join(f"`{t.path}:{t.line}` {', '.join(t.covers)}" for t in b.timeouts) or "none"
        out.append(f"| {b.name} | `{b.sender}` | {poll} | {', '.join(b.returns)} | "
                   f"{'yes' if b.reads_abort_state else 'no'} | {timeouts} |")
    out.append("")
