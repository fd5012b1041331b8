"""What both remote routes (exec + tar, SFTP) gather, then links resolved, budget applied and
sorted into fetch_local's order."""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from kvtrace.errors import LimitExceeded
from kvtrace.fetch.local import Budget, oversized_file
from kvtrace.model import FetchLimits, FetchResult, SourceFile
from kvtrace.fetch.ssh.options import Log

if TYPE_CHECKING:
    from kvtrace.fetch.ssh.connect import SshConnection


class Route:
    """What both remote routes (exec + tar, SFTP) are given: a connection, the path and limits."""

    def __init__(self, conn: SshConnection, label: str, path: str, shown: str, limits: FetchLimits) -> None:
        self.conn = conn
        self.label = label
        self.path = path
        self.shown = shown  # the path as printed: one line
        self.limits = limits
        self.where = conn.where


class Collected:
    def __init__(self, label: str, limits: FetchLimits, root_real: str, log: Log) -> None:
        self.label = label
        self.limits = limits
        self.root_real = root_real
        self.log = log
        self.notes: list[str] = []
        self.files: dict[str, SourceFile] = {}
        self.symlinks: dict[str, str] = {}
        self.hardlinks: dict[str, str] = {}
        self.budget = Budget(limits, label)

    def add(self, rel: str, sf: SourceFile) -> None:
        if rel in self.files:  # sent twice (a hostile stream): counted once, last one wins
            return
        if sf.status == "ok":
            self.budget.take(len(sf.data))
        else:
            self.budget.take(0)  # counted as a file, not read: as fetch_local does
        self.files[rel] = sf

    def link(self, table: dict[str, str], rel: str, target: str) -> None:
        table[rel] = target
        if len(self.symlinks) + len(self.hardlinks) > self.limits.max_files:  # bounded, like files
            raise LimitExceeded(
                f"{self.label}: more than {self.limits.max_files} .py links; "
                "point kvtrace at the disaggregation folder or raise --max-files"
            )

    def finish(self) -> FetchResult:
        for rel, target in self.hardlinks.items():
            if target in self.files:
                self.add(rel, renamed(self.files[target], rel))
        for rel in list(self.symlinks):
            resolved = self._follow(rel)
            if resolved in self.files:
                self.add(rel, renamed(self.files[resolved], rel))
            else:
                why = "a loop" if resolved == "" else "outside the root or not a fetched .py file"
                self.log(f"ssh: symlink {rel} -> {self.symlinks[rel]!r} not followed ({why})")
        files = sorted(self.files.values(), key=lambda f: walk_order(f.path))
        for note in self.notes:
            self.log(f"ssh: note: {note}")
        return FetchResult(target=self.label, files=files, notes=self.notes)

    def _follow(self, rel: str) -> str | None:
        """Resolve a .py symlink lexically among the fetched names: the relative path it ends
        at, None when it leaves the root, "" on a loop. Never touches the remote."""
        current = rel
        for _ in range(40):  # the kernel's own limit on link chains
            link = self.symlinks.get(current)
            if link is None:
                return current
            if link.startswith("/"):
                root = self.root_real.rstrip("/")
                if not self.root_real or not link.startswith(root + "/"):
                    return None
                link_rel = link[len(root) + 1 :]
            else:
                link_rel = posixpath.join(posixpath.dirname(current), link)
            current = posixpath.normpath(link_rel)
            if current == ".." or current.startswith("../") or current.startswith("/"):
                return None
        return ""


def walk_order(path: str) -> tuple[tuple[int, str], ...]:
    """Sort key reproducing fetch_local's order: os.walk top-down with sorted names, i.e. a
    directory's files first, then each subdirectory in turn."""
    *dirs, name = path.split("/")
    return tuple((1, d) for d in dirs) + ((0, name),)


def relative(name: str) -> str | None:
    """A name from the remote as a root-relative posix path, or None if it would leave the
    root (`..`, absolute) or names nothing."""
    name = posixpath.normpath(name)
    if name in (".", "..", "") or name.startswith(("/", "../")):
        return None
    return name


def renamed(sf: SourceFile, path: str) -> SourceFile:
    return SourceFile(path, sf.data, sf.sha256, status=sf.status, error=sf.error)


def too_large(name: str, size: int | None, limits: FetchLimits) -> SourceFile:
    if size is None:
        return SourceFile(name, b"", "", status="too-large", error=f"over the per-file limit of {limits.max_file_bytes}")
    return oversized_file(name, size, limits)


def utf8_name(name: str, notes: list[str], where: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raw = name.encode("utf-8", "surrogateescape")
        notes.append(f"{where}: skipped {raw!r}: file name is not UTF-8")
        return False
    return True
