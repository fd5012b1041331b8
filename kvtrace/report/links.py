"""Where a path:line can be opened: a GitHub permalink when the scanned tree is a git checkout
with a GitHub remote (pinned to the commit, so the line stays right), else nothing.

Files with uncommitted changes get no permalink: the committed line would not be the one
reported. Only local targets are looked at; git is run read-only (rev-parse, remote, status).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kvtrace.model import Report

GITHUB_REMOTE = re.compile(r"^(?:https://|ssh://git@|git@)github\.com[:/](?P<repo>[\w.-]+/[\w.-]+?)(?:\.git)?/?$")


@dataclass
class Permalinks:
    base: str  # https://github.com/owner/repo/blob/<sha>/<target folder relative to the repo root>
    dirty: set[str] = field(default_factory=set)  # report paths with uncommitted changes

    def url(self, path: str, line: int) -> str | None:
        if path in self.dirty:
            return None
        return f"{self.base}{path}#L{line}" if line > 0 else f"{self.base}{path}"


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def github_repo(folder: Path) -> str | None:
    """owner/name of the GitHub remote (origin first, then upstream, then any)."""
    names = (_git(folder, "remote") or "").split()
    for name in sorted(names, key=lambda n: (n != "origin", n != "upstream", n)):
        url = (_git(folder, "remote", "get-url", name) or "").strip()
        match = GITHUB_REMOTE.match(url)
        if match:
            return match.group("repo")
    return None


def permalinks(report: Report) -> Permalinks | None:
    target = Path(report.target)
    if not target.exists():
        return None
    folder = (target if target.is_dir() else target.parent).resolve()
    top = _git(folder, "rev-parse", "--show-toplevel")
    commit = _git(folder, "rev-parse", "HEAD")
    repo = github_repo(folder) if top and commit else None
    if not repo:
        return None
    prefix = folder.relative_to(Path(top.strip()).resolve()).as_posix()
    prefix = "" if prefix == "." else prefix + "/"
    status = _git(folder, "status", "--porcelain", "--untracked-files=all", "--", ".") or ""
    dirty = set()
    for line in status.splitlines():
        changed = line[3:].split(" -> ")[-1].strip('"')
        if changed.startswith(prefix):
            dirty.add(changed[len(prefix):])
    return Permalinks(f"https://github.com/{repo}/blob/{commit.strip()}/{prefix}", dirty)
