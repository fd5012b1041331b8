"""What fails a run: the findings at or above `--fail-on` that are neither suppressed in the code
nor in the baseline, and the one line that says so.

The default is `error`, as in linters that separate severities: a gate that fails on
informational notes gets switched off. `--fail-on warning|note` is for stricter teams, `never`
reports and exits 0."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kvtrace.model import SEVERITIES_WORST_FIRST, Finding, Severity

DEFAULT_FAIL_ON = "error"
NEVER = "never"  # `--fail-on never`: a level above every severity


def fails_on(severity: str, fail_on: str) -> bool:
    """Whether a finding of `severity` is at or above `fail_on` (a level read from another
    report that kvtrace does not know counts as a note, the least)."""
    if fail_on == NEVER:
        return False
    try:
        level = Severity(severity)
    except ValueError:
        level = Severity.NOTE
    return level >= Severity(fail_on)


def failing(findings: Iterable[Finding], fail_on: str) -> list[Finding]:
    """The findings that fail the run under `fail_on`."""
    from kvtrace.baseline import counts_against

    return [f for f in findings if counts_against(f) and fails_on(f.severity, fail_on)]


def counted(findings: Iterable[Finding]) -> str:
    """`2 errors, 1 warning` (severities in order, only those present)."""
    tally = Counter(f.severity for f in findings)
    return ", ".join(f"{tally[s]} {s}{'s' if tally[s] != 1 else ''}" for s in SEVERITIES_WORST_FIRST if tally[s])


def fail_on_source(fail_on: str | None, from_command_line: bool, config: str | None) -> tuple[str, str]:
    """(the level in force, where it came from as a person would write it)."""
    if from_command_line and fail_on:
        return fail_on, f"--fail-on {fail_on}"
    if fail_on and config:
        return fail_on, f'fail-on = "{fail_on}" in {config}'
    level = fail_on or DEFAULT_FAIL_ON
    return level, f"--fail-on {level}" + (", the default" if not fail_on else "")


def verdict_line(findings: list[Finding], fail_on: str, source: str, incomplete: bool = False) -> str:
    """`failed: 2 errors (--fail-on error)`, or `passed (...)` naming what was reported but did
    not fail, or INCOMPLETE (which fails whatever the findings)."""
    if incomplete:
        return "INCOMPLETE: something could not be analysed (exit 3), so findings may be missing"
    failed = failing(findings, fail_on)
    if failed:
        return f"failed: {counted(failed)} ({source})"
    rest = counted(f for f in findings if not f.suppressed and f.baseline != "unchanged")
    if fail_on == "never":
        return f"passed ({source}){': ' + rest + ' reported' if rest else ''}"
    worse = {"error": "error", "warning": "warning or error", "note": "finding"}[fail_on]
    return f"passed: no {worse} to fail on ({source})" + (f"; {rest} reported" if rest else "")
