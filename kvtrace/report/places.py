"""Paths as a person opens them. A report names every file relative to the scanned target (the
JSON and SARIF contract, and what fingerprints are built from); the formats people read (text,
markdown, github messages, concise) show each path as it opens from where they stand, as ruff
does:

- a local scan: relative to the working directory when the file is under it, else absolute
  (never a `../../` climb);
- a remote scan: `host:path`, the remote file as scp and ssh name it;
- anything else (a label that is not a target): as the report has it.

Messages, notes and gap reasons embed `path:line` as text. They are rewritten against the exact
set of paths the scan read (its files, its version file), never by guessing what looks like a
path: a token is replaced only when it is one of those paths, whole (not part of a longer one).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import TypeVar

from kvtrace.model import Report
from kvtrace.safe_text import rewrite_strings

T = TypeVar("T")

# Characters a path token is made of; a known path counts only when not glued to more of them.
_PATH_CHARS = r"\w./~+-"
_SKIPPED_FIELDS = frozenset({"data", "graphs", "target", "root", "host_facts"})


class Places:
    """Maps a report's target-relative paths to what a person opens from the working directory."""

    def __init__(self, report: Report, cwd: Path | None = None, extra: Iterable[str] = (),
                 folder: Path | None = None) -> None:
        """`extra`: more target-relative paths the report's parts name (a module read beside the
        scanned files, such as the settings registry a timeout's default is declared in).
        `folder`: where the report's paths are, when its target does not say (a git revision
        `kvtrace diff` read into a temporary folder is shown at its place in the checkout)."""
        here = cwd or Path.cwd()
        self.prefix = _folder_prefix(folder, here) if folder is not None else _prefix(report, here)
        known = {f.path for f in report.files} | {p for p in extra if not p.startswith("/")}
        if report.version is not None:
            known.add(report.version.path)
        self.known = frozenset(p for p in known if p)
        # A cheap test before the regex: the text must hold what every path of the scan ends with.
        self._needle = ".py" if all(p.endswith(".py") for p in self.known) else ""
        # Longest first: at one place the longer of two paths wins.
        self._longest_first = sorted(self.known, key=len, reverse=True) if self.prefix else []

    @property
    def moves(self) -> bool:
        """Whether any path is shown differently from the report's own."""
        return bool(self._longest_first)

    def path(self, path: str) -> str:
        """One report path as it opens from here (unchanged when it is not one of the scan's)."""
        if not self.prefix or path not in self.known:
            return path
        return _join(self.prefix, path)

    def text(self, text: str) -> str:
        """A message or note with every path of the scan in it shown as it opens from here."""
        if not self._longest_first or self._needle not in text:
            return text
        # Only the paths the text holds can match: one pattern of all of them took longer to
        # compile than a cached rescan's whole lookup.
        present = [p for p in self._longest_first if p in text]
        if not present:
            return text
        return _pattern(tuple(present)).sub(lambda m: _join(self.prefix, m.group()), text)

    def shown(self) -> dict[str, str]:
        """Each path as shown -> the report's path (to link a shown path to its upstream line)."""
        return {self.path(p): p for p in self.known} if self.prefix else {}

    def localized(self, value: T) -> T:
        """A copy of a report (or any of its parts) with every path and every text in it shown as
        it opens from here. The target, the package root and raw data keep the report's form."""
        if not self._longest_first:
            return value
        return rewrite_strings(value, self.text, _SKIPPED_FIELDS)


@functools.lru_cache(maxsize=256)
def _pattern(paths: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(p) for p in paths)
    return re.compile(rf"(?<![{_PATH_CHARS}])(?:{alternatives})(?![\w/])")


def _join(prefix: str, path: str) -> str:
    if prefix.endswith(":"):  # host: (a remote target's folder is in the prefix)
        return prefix + path
    return prefix + path if prefix.endswith("/") else f"{prefix}/{path}"


def _prefix(report: Report, cwd: Path) -> str:
    """What goes before a report path: "" when the working directory is the target's folder."""
    from kvtrace.target import LocalTarget, SshTarget, parse_target

    try:
        target = parse_target(report.target)
    except Exception:  # noqa: BLE001 -- a label that is not a target (a fleet's alias): paths as they are
        return ""
    if isinstance(target, SshTarget):
        folder = target.path
        if folder.endswith(".py"):
            folder = str(PurePosixPath(folder).parent)
        return f"{target.display}:" + ("" if folder in ("", ".") else folder.rstrip("/") + "/")
    if not isinstance(target, LocalTarget) or not target.path.exists():
        return ""
    return _folder_prefix(target.path.parent if target.path.is_file() else target.path, cwd)


def _folder_prefix(folder: Path, cwd: Path) -> str:
    """What goes before a path in `folder`: relative to `cwd` when under it, else absolute."""
    base = folder.resolve()
    here = cwd.resolve()
    if base == here:
        return ""
    if base.is_relative_to(here):
        return base.relative_to(here).as_posix() + "/"
    return base.as_posix() + "/" if base.as_posix() != "/" else "/"


def openable(report: Report, path: str, cwd: Path | None = None) -> str:
    """One report path as it opens from the working directory."""
    return Places(report, cwd).path(path)
