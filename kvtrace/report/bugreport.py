"""What makes `--format markdown` a bug report someone else can act on: the versions, the exact
command, the target as seen from the working directory, and each finding's code in a folded
`<details>` block, with GitHub links to the release tag or a pushed commit (kvtrace.report.links)."""

from __future__ import annotations

import os
import platform
import shlex
import sys
from pathlib import Path

from kvtrace import __version__
from kvtrace.model import Report
from kvtrace.report.links import Permalinks


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


def sglang_version(report: Report) -> str | None:
    detected = getattr(report, "version", None)  # read from the tree's version.py
    if detected is not None:
        return f"{detected.package} {detected.version} (`{detected.path}:{detected.line}`)"
    facts = getattr(report, "host_facts", None) or {}
    return f"sglang {facts['sglang_version']}" if facts.get("sglang_version") else None


def environment_lines(report: Report) -> list[str]:
    """The `Environment` block: versions, command, target."""
    lines = [f"- kvtrace {__version__}, Python {platform.python_version()}"]
    detected = sglang_version(report)
    lines.append(f"- {detected}" if detected else "- SGLang version: not found in the scanned tree")
    command = invocation()
    if command:
        lines.append(f"- command: `{command}`")
    lines.append(f"- target: `{target_from_cwd(report)}`" + (f" (package `{report.root}`)" if report.root else ""))
    return lines


def code_link(path: str, line: int, links: Permalinks | None) -> str:
    """`path:line`, linked to the commit's line on GitHub when there is one."""
    url = links.url(path, line) if links else None
    return f"[`{path}:{line}`]({url})" if url else f"`{path}:{line}`"


def excerpt_details(report: Report, path: str, line: int, links: Permalinks | None, context: int = 3) -> list[str]:
    """A folded block with the code around path:line (the line itself marked)."""
    source = next((f for f in report.files if f.path == path), None)
    lines = source.lines if source is not None else []
    if not 0 < line <= len(lines):
        return []
    start, end = max(1, line - context), min(len(lines), line + context)
    width = len(str(end))
    body = [f"{'>' if n == line else ' '} {n:{width}d} | {lines[n - 1]}" for n in range(start, end + 1)]
    fence = "````" if any("```" in row for row in body) else "```"
    return ["<details><summary>" + f"{path}:{line}" + "</summary>", "", f"{fence}python", *body, fence, "",
            "</details>"]
