"""What makes `--format markdown` a bug report someone else can act on: the versions, the exact
command, the target as seen from the working directory, and each finding's code in a folded
`<details>` block, with GitHub links to the release tag or a pushed commit (kvtrace.report.links)."""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
from pathlib import Path

from kvtrace import __version__
from kvtrace.model import Report
from kvtrace.report.excerpt import excerpt
from kvtrace.report.links import Permalinks
from kvtrace.report.mdtext import code, html, link, prose


def invocation(argv: list[str] | None = None) -> str | None:
    """The command line as typed (`kvtrace scan ...`), or None when kvtrace is not the program
    (a library call): a wrong command in a bug report is worse than none."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return None
    program = Path(argv[0])
    if program.name == "kvtrace":
        return shlex.join(["kvtrace", *argv[1:]])
    if program.name == "__main__.py" and program.parent.name == "kvtrace":
        return shlex.join(["python", "-m", "kvtrace", *argv[1:]])
    return None


def target_from_cwd(report: Report) -> str:
    """A local target relative to the working directory (as the reader would type it); a remote
    one as given."""
    target = Path(report.target)
    if not target.exists():
        return report.target
    relative = os.path.relpath(target.resolve(), Path.cwd())
    return relative if not relative.startswith("../../..") else str(target.resolve())


def sglang_version(report: Report, links: Permalinks | None = None) -> str | None:
    """Markdown naming the SGLang version and where it was read."""
    detected = getattr(report, "version", None)  # read from the tree's version.py
    if detected is not None:
        return f"{prose(detected.package)} {prose(detected.version)} ({code_link(detected.path, detected.line, links)})"
    facts = getattr(report, "host_facts", None) or {}
    return f"sglang {prose(str(facts['sglang_version']))}" if facts.get("sglang_version") else None


def environment_lines(report: Report, links: Permalinks | None = None) -> list[str]:
    """The `Environment` block: versions, command, target."""
    lines = [f"- kvtrace {__version__}, Python {platform.python_version()}"]
    detected = sglang_version(report, links)
    lines.append(f"- {detected}" if detected else "- SGLang version: not found in the scanned tree")
    command = invocation()
    if command:
        lines.append(f"- command: {code(command)}")
    lines.append(f"- target: {code(target_from_cwd(report))}" + (f" (package {code(report.root)})" if report.root else ""))
    return lines


def code_link(path: str, line: int, links: Permalinks | None) -> str:
    """`path:line`, linked to the line on GitHub when there is one."""
    return link(code(f"{path}:{line}"), links.url(path, line) if links else None)


def linked_prose(text: str, links: Permalinks | None) -> str:
    """`prose(text)` with each `path:line` of the scan in it linked to its line (as code_link
    writes it), so a sentence's lines open upstream as a table's do; unchanged without links."""
    found = links.mentions(text) if links is not None else []
    if not found:
        return prose(text)
    out, at = [], 0
    for start, end, path, line in found:
        out += [prose(text[at:start]), code_link(path, line, links)]
        at = end
    return "".join([*out, prose(text[at:])])


def excerpt_details(report: Report, path: str, line: int, links: Permalinks | None, context: int = 3) -> list[str]:
    """A folded block with the code around path:line (the line itself marked)."""
    rows = excerpt(report, path, line, context)
    if not rows:
        return []
    width = len(str(rows[-1][0]))
    body = [f"{'>' if n == line else ' '} {n:{width}d} | {text}" for n, text in rows]
    longest = max((len(run) for row in body for run in re.findall(r"`{3,}|~{3,}", row)), default=2)
    fence = "`" * max(3, longest + 1)
    url = links.url(path, line) if links is not None else None
    summary = f'<a href="{html(url)}"><code>{html(f"{path}:{line}")}</code></a>' if url else html(f"{path}:{line}")
    return ["<details><summary>" + summary + "</summary>", "", f"{fence}python", *body, fence, "",
            "</details>"]
