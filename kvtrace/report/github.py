"""GitHub Actions workflow commands: one `::error file=...,line=...::message` line per finding,
which GitHub shows as an annotation on the pull request's diff.

Paths open from the working directory (the repository root in a workflow), since the runner
resolves `file=` from there: relative under it, else absolute, as in every other output; a path
named in a message is shown the same way (kvtrace.report.places). Findings silenced in the
code are left out; findings in the baseline become `notice` annotations, so they are visible
but not alarming.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvtrace.model import Finding, Report
from kvtrace.report.places import Places
from kvtrace.safe_text import plain

LEVEL = {"error": "error", "warning": "warning", "note": "notice"}


def _data(text: str) -> str:
    # GitHub's own escapes for line ends; any other control character is shown, never sent.
    return plain(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(report: Report, finding: Finding, places: Places | None = None) -> str:
    """`places`: how paths open from the working directory (the message's paths are shown so)."""
    places = places or Places(report)
    level = "notice" if finding.baseline == "unchanged" else LEVEL.get(finding.severity, "warning")
    where = " / ".join(part for part in (finding.backend, finding.state) if part)
    title = f"kvtrace {finding.rule}" + (f" ({where})" if where else "")
    if finding.queue:  # a host has several queues: the title says which one's drain it is about
        title += f" in {finding.queue}"
    if finding.baseline == "unchanged":
        title += " [in baseline]"
    props = f"file={_property(places.path(finding.path))},line={finding.line},title={_property(title)}"
    return f"::{level} {props}::{_data(places.text(finding.message))}"


def render(reports: list[Report], fail_on: Mapping[str, tuple[str, str]] | None = None) -> str:
    """`fail_on`: target -> (level, where it was set), for the summary line's verdict."""
    from kvtrace.gate import DEFAULT_FAIL_ON, verdict_line

    lines: list[str] = []
    for report in reports:
        level, source = (fail_on or {}).get(report.target, (DEFAULT_FAIL_ON, f"--fail-on {DEFAULT_FAIL_ON}"))
        shown = [f for f in report.findings if not f.suppressed]
        places = Places(report)
        lines += [annotation(report, f, places) for f in shown]
        for problem in report.problems:
            lines.append(f"::warning title=kvtrace incomplete scan::{_data(f'{report.target}: {places.text(problem.text)}')}")
        for gap in report.gaps:
            if gap.kind == "file":
                at = "" if gap.line is None else f",line={gap.line}"
                lines.append(f"::warning file={_property(places.path(gap.subject))}{at},title=kvtrace could not analyse"
                             f"::{_data(gap.why)}")
        silenced = len(report.findings) - len(shown)
        baselined = sum(f.baseline == "unchanged" for f in shown)
        lines.append(f"kvtrace {plain(report.target)}: {len(shown)} finding(s)"
                     f" ({baselined} in baseline), {silenced} suppressed in the code; "
                     f"{verdict_line(report.findings, level, source, incomplete=report.incomplete)}")
    return "\n".join(lines) + "\n"
