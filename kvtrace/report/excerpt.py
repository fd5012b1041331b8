"""The code lines a report shows around a path:line, without the test annotations of kvtrace's
own examples: a trailing comment made only of Semgrep-style annotations (`# expect:
rule[backend:state], ...`, with `site:`, `fates:` or `mode NAME:` parts joined by ` ; `) says
what the test suite expects, not what the code does. Any other comment is the code's and stays."""

from __future__ import annotations

import re

from kvtrace.model import Report

_PART = r"(?:expect\s*:\s*[\w-]+\[[\w-]*:\w*\](?:\s*,\s*[\w-]+\[[\w-]*:\w*\])*|site\s*:[\w ,-]*|fates\s*:[\w =+-]*|mode [\w-]+\s*:[\w =+-]*)"
# The comment must hold an `expect:` part; every part must be an annotation.
ANNOTATION = re.compile(rf"\s*#\s*(?=(?:{_PART}\s*;\s*)*expect\s*:){_PART}(?:\s*;\s*{_PART})*\s*$")


def without_annotation(text: str) -> str:
    return ANNOTATION.sub("", text)


def excerpt(report: Report, path: str, line: int, context: int = 2) -> list[tuple[int, str]]:
    """(line number, text) around path:line, annotations left out."""
    source = next((f for f in report.files if f.path == path), None)
    lines = source.lines if source is not None else []
    if not 0 < line <= len(lines):
        return []
    return [(n, without_annotation(lines[n - 1])) for n in range(max(1, line - context), min(len(lines), line + context) + 1)]
