"""Fetch stage for a local path: read every `.py` file below it, bounded, without following
symlinks out of the root (or around a loop)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from kvtrace.errors import InputError, LimitExceeded
from kvtrace.model import FetchLimits, FetchResult, SourceFile


def make_source_file(path: str, data: bytes) -> SourceFile:
    return SourceFile(path=path, data=data, sha256=hashlib.sha256(data).hexdigest())


def oversized_file(path: str, size: int, limits: FetchLimits) -> SourceFile:
    """A file kept in the report (so nothing is lost silently) but not read."""
    return SourceFile(
        path=path,
        data=b"",
        sha256="",
        status="too-large",
        error=f"{size} bytes is over the per-file limit of {limits.max_file_bytes}",
    )


class Budget:
    """Counts files and bytes against FetchLimits; shared by the local and SSH fetchers."""

    def __init__(self, limits: FetchLimits, where: str) -> None:
        self.limits = limits
        self.where = where
        self.files = 0
        self.bytes = 0

    def take(self, size: int) -> None:
        self.files += 1
        self.bytes += size
        if self.files > self.limits.max_files:
            raise LimitExceeded(
                f"{self.where}: more than {self.limits.max_files} .py files; "
                "point kvtrace at the disaggregation folder or raise --max-files"
            )
        if self.bytes > self.limits.max_total_bytes:
            raise LimitExceeded(
                f"{self.where}: more than {self.limits.max_total_bytes} bytes of .py files; "
                "point kvtrace at the disaggregation folder or raise --max-total-bytes"
            )


def fetch_local(root: Path, limits: FetchLimits = FetchLimits()) -> FetchResult:
    if not root.exists():
        raise InputError(f"{root}: no such file or directory")
    label = str(root)
    if root.is_file():
        if root.suffix != ".py":
            raise InputError(f"{root}: not a directory or a .py file")
        return FetchResult(target=label, files=[_read(root, root.name, limits, Budget(limits, label))])
    budget = Budget(limits, label)
    files: list[SourceFile] = []
    notes: list[str] = []
    real_root = root.resolve()
    # Iterative, in os.walk's top-down order (a folder's files, then each subfolder in sorted
    # order): os.walk recurses in Python 3.11 and a tree 1,000 folders deep overflowed it.
    # Directory links are never entered, so a link loop cannot recurse either.
    pending: list[Path] = [root]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            notes.append(f"skipped unreadable directory {_shown(folder)}: {exc.strerror or exc}")
            continue
        subfolders: list[Path] = []
        for entry in entries:
            full = Path(entry.path)
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                if not _pruned(entry.name):
                    subfolders.append(full)
                continue
            if not entry.name.endswith(".py"):
                continue
            rel = full.relative_to(root).as_posix()
            if not _printable_name(rel):
                notes.append(f"skipped a file whose name is not UTF-8: {rel.encode('utf-8', 'surrogateescape')!r}")
                continue
            try:
                is_link = entry.is_symlink()
            except OSError:
                is_link = False
            if is_link and not _link_stays_inside(full, real_root):
                continue
            try:
                regular = stat.S_ISREG(full.stat().st_mode)
            except OSError:
                regular = True  # let _read report it as unreadable
            if not regular:
                continue  # a FIFO or device named *.py would block or mislead
            files.append(_read(full, rel, limits, budget))
        pending.extend(reversed(subfolders))
    return FetchResult(target=label, files=files, notes=notes)


def _shown(path: Path) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def _pruned(directory: str) -> bool:
    return directory.startswith(".") or directory == "__pycache__"


def _printable_name(rel: str) -> bool:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _link_stays_inside(link: Path, real_root: Path) -> bool:
    """A symlinked file is read only if it ends at a regular .py file inside the scanned tree
    (not in a skipped folder): the same set the SSH fetch can see."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop
        return False
    if real_root not in target.parents or not target.is_file() or target.suffix != ".py":
        return False
    return not any(_pruned(part) for part in target.relative_to(real_root).parts[:-1])


def _read(full: Path, rel: str, limits: FetchLimits, budget: Budget) -> SourceFile:
    try:
        size = full.stat().st_size
    except OSError as exc:
        return SourceFile(rel, b"", "", status="unreadable", error=exc.strerror or str(exc))
    if size > limits.max_file_bytes:
        budget.take(0)
        return oversized_file(rel, size, limits)
    try:
        data = full.read_bytes()
    except OSError as exc:
        return SourceFile(rel, b"", "", status="unreadable", error=exc.strerror or str(exc))
    budget.take(len(data))
    return make_source_file(rel, data)
