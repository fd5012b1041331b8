"""What both remote routes (exec + tar, SFTP) gather, then links resolved, budget applied and
sorted into fetch_local's order."""

from __future__ import annotations

import posixpath
from collections import deque
from typing import TYPE_CHECKING

from kvtrace.errors import LimitExceeded
from kvtrace.fetch.local import (
    Budget,
    folder_outside,
    folder_pruned,
    link_loop,
    link_outside,
    link_unread,
    oversized_file,
    pruned_name as _pruned,
    skipped_link,
    walk_order,
)
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
        self.symlinks: dict[str, str] = {}  # a .py link -> its text
        self.folder_links: dict[str, str] = {}  # a link to a folder -> the folder's real path ("" if unknown)
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
        # Bounded like the records (links carry no data; files are bounded on their own).
        bound = 4 * (self.limits.max_files + 1)
        if len(self.symlinks) + len(self.hardlinks) + len(self.folder_links) > bound:
            raise LimitExceeded(
                f"{self.label}: more than {bound} links (4 x --max-files); "
                "point kvtrace at the disaggregation folder or raise --max-files"
            )

    def finish(self) -> FetchResult:
        """Links resolved as fetch_local resolves them (see its docstring): a .py link that ends
        at a fetched file is that file under the link's name; a folder link inside the root is
        not entered; every other link is a skipped entry, a gap naming it and why."""
        for rel, target in self.hardlinks.items():
            if target in self.files:
                self.add(rel, renamed(self.files[target], rel))
        for rel, real in self.folder_links.items():
            self.symlinks.pop(rel, None)  # a .py name on a folder is a folder link
            name = rel.rsplit("/", 1)[-1]
            if _pruned(name) and not name.endswith(".py"):
                continue  # named like a folder the walk skips: skipped like one
            root = self.root_real.rstrip("/")
            if real and (real == self.root_real or real.startswith(root + "/")):
                below = real[len(root) + 1 :]
                if any(_pruned(part) for part in below.split("/") if part):
                    self.add(rel + "/", skipped_link(rel + "/", folder_pruned(below)))
            else:
                self.add(rel + "/", skipped_link(rel + "/", folder_outside(real or "?")))
        for rel, text in list(self.symlinks.items()):
            resolved = self._resolve(rel)
            if resolved and resolved in self.files and self.files[resolved].status != "skipped":
                self.add(rel, renamed(self.files[resolved], rel))
            else:
                why = link_outside(text) if resolved is None else link_loop(text) if resolved == "" else link_unread(text)
                self.log(f"ssh: {rel}: {why}")
                self.add(rel, skipped_link(rel, why))
        files = sorted(self.files.values(), key=lambda f: walk_order(f.path))
        for note in self.notes:
            self.log(f"ssh: note: {note}")
        return FetchResult(target=self.label, files=files, notes=self.notes)

    def _resolve(self, rel: str) -> str | None:
        """Resolve a link among the fetched names, component by component as the kernel does
        (a link's text read from the folder it ends in): the root-relative path it ends at,
        None when it leaves the root, "" on a loop. Never touches the remote; folders outside
        the root are taken as plain folders."""
        root = [c for c in self.root_real.split("/") if c] if self.root_real else ["\0root"]
        current = list(root)
        pending = deque(rel.split("/"))
        hops = 0
        while pending:
            part = pending.popleft()
            if part in ("", "."):
                continue
            if part == "..":
                if current:
                    current.pop()
                continue
            current.append(part)
            if current[: len(root)] != root or len(current) == len(root):
                continue
            key = "/".join(current[len(root) :])
            if key in self.folder_links:
                real = self.folder_links[key]
                current = [c for c in real.split("/") if c] if real else ["\0unknown"]
            elif key in self.symlinks:
                hops += 1
                if hops > 40:  # the kernel's own limit on link chains
                    return ""
                text = self.symlinks[key]
                current.pop()
                if text.startswith("/"):
                    if not self.root_real:
                        return None
                    current = []
                pending.extendleft(reversed(text.split("/")))
        if current[: len(root)] != root or len(current) == len(root):
            return None
        return "/".join(current[len(root) :])


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
        return SourceFile(name, b"", "", status="too-large", error=f"over the per-file limit (--max-file-bytes {limits.max_file_bytes})")
    return oversized_file(name, size, limits)


def utf8_name(name: str, notes: list[str], where: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raw = name.encode("utf-8", "surrogateescape")
        notes.append(f"{where}: skipped {raw!r}: file name is not UTF-8")
        return False
    return True
