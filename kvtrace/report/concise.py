"""One line per finding and a summary, for hooks and CI logs (ruff's concise format):

    python/sglang/srt/disaggregation/nixl/conn.py:212:1: KVT001 [error] WaitingForInput can pin ...
    kvtrace python/sglang: 14 findings (2 errors, 6 warnings, 6 notes); failed: 2 errors (--fail-on error)

Paths are relative to the working directory (the repository root in a hook), so an editor or a
problem matcher opens them. kvtrace reports lines, not columns: the column is always 1, there so
that tools that want path:line:col read the line. Findings silenced in the code are counted in
the summary, not listed; findings in the baseline are listed, marked, and do not fail.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvtrace.baseline import tally
from kvtrace.gate import DEFAULT_FAIL_ON, counted, verdict_line
from kvtrace.model import Finding, Report
from kvtrace.report.places import Places
from kvtrace.safe_text import plain


def finding_line(report: Report, finding: Finding, places: Places | None = None) -> str:
    """`places`: paths relative to the working directory when under it, else absolute (never a
    `../../` climb); a remote file as host:path."""
    places = places or Places(report)
    mark = " [in baseline]" if finding.baseline == "unchanged" else ""
    message = " ".join(places.text(finding.message).split())
    return plain(f"{places.path(finding.path)}:{finding.line}:1: {finding.code} [{finding.severity}]{mark} {message}")


def render(reports: list[Report], fail_on: Mapping[str, tuple[str, str]] | None = None) -> str:
    """`fail_on`: target -> (level, where it was set) for the summary; the default otherwise."""
    lines: list[str] = []
    for report in reports:
        level, source = (fail_on or {}).get(report.target, (DEFAULT_FAIL_ON, f"--fail-on {DEFAULT_FAIL_ON}"))
        shown = [f for f in report.findings if not f.suppressed]
        places = Places(report)
        lines += [finding_line(report, f, places) for f in shown]
        lines += [plain(f"{report.target}: INCOMPLETE: {places.text(gap.place)}: {places.text(gap.why)}")
                  for gap in report.gaps]
        total = f"{len(shown)} finding{'s' if len(shown) != 1 else ''}" + (f" ({counted(shown)})" if shown else "")
        extra = tally(report.findings)
        verdict = verdict_line(report.findings, level, source, incomplete=report.incomplete)
        lines.append(plain(f"kvtrace {report.target}: {total}{'; ' + extra if extra else ''}; {verdict}"))
    return "\n".join(lines) + "\n"
