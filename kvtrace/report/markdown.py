"""A bug-report document: findings with evidence, the release map, and the backends, as
Markdown that pastes into an issue tracker."""

from __future__ import annotations

from kvtrace.model import Report
from kvtrace.report.bugreport import code_link, environment_lines, excerpt_details, target_from_cwd
from kvtrace.report.diagram import mermaid_section
from kvtrace.report.links import permalinks


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(reports: list[Report]) -> str:
    out: list[str] = []
    for report in reports:
        links = permalinks(report)
        out.append(f"## kvtrace: `{target_from_cwd(report)}`\n")
        out += environment_lines(report) + [""]
        out.append(f"Package `{report.root or '.'}`; {sum(f.status == 'ok' for f in report.files)}"
                   f"/{len(report.files)} files analysed.\n")
        bad = [f for f in report.files if f.status != "ok"]
        for f in bad:
            out.append(f"- {f.status}: `{f.path}`: {f.error}")
        if bad:
            out.append("")
        out.append(f"### Findings ({len(report.findings)})\n")
        for f in report.findings:
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
    return "\n".join(out) + "\n"
