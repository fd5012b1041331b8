"""Fetch stage for a local path: read every `.py` file below it, bounded, without following
symlinks out of the root (or around a loop).

Symbolic links (the same rules over SSH, see fetch/ssh/collect.py):
- a `.py` link that ends at a `.py` file kvtrace reads inside the target is read under the link's
  name too, as Python would import it (a file with two names is two modules, like a hard link);
- a link to a folder inside the target is not entered: that folder is read once, under its
  own name (so a link back up the tree is no loop);
- anything else a link leads to is not read and is a gap in the report (status "skipped",
  naming the link and why: outside the target, a loop, or nothing kvtrace reads). A folder
  is named with a trailing '/', so the backend it would have been is named too.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from kvtrace import log
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
        error=f"{size} bytes, over the per-file limit (--max-file-bytes {limits.max_file_bytes})",
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


def refuse_symlink_loop(root: Path) -> None:
    """A target that is a symlink loop is an input error (exit 2), found before anything runs."""
    try:
        root.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{_shown(root)}: a symlink loop (too many levels of symbolic links)") from None


def check_local_root(root: Path) -> None:
    """The target exists and is not a symlink loop: one clear line otherwise (exit 2)."""
    refuse_symlink_loop(root)
    try:
        root.stat()
    except OSError as exc:
        if os.path.lexists(root) and exc.errno != errno.ENOENT:
            raise InputError(f"{_shown(root)}: {exc.strerror or exc}") from None
        if os.path.islink(root):
            raise InputError(f"{_shown(root)}: a symlink to {os.readlink(root)!r}, which does not exist") from None
        raise InputError(f"{_shown(root)}: no such file or directory") from None


Keep = Callable[[str, bytes], bool]


def fetch_local(root: Path, limits: FetchLimits = FetchLimits(), keep: Keep | None = None) -> FetchResult:
    """Every `.py` file below `root`. With `keep(path, data)`, a readable file it refuses is
    read and counted against the limits, then dropped (not hashed, not held): a whole installed
    package is 4,700 files of which a scan reads ~50."""
    check_local_root(root)
    label = str(root)
    if root.is_file():
        if root.suffix != ".py":
            raise InputError(f"{root}: not a directory or a .py file")
        single = _read(root, root.name, limits, Budget(limits, label))
        assert single is not None  # only `keep` drops a file
        return FetchResult(target=label, files=[single])
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
                is_link = not is_dir and entry.is_symlink()
            except OSError:
                is_dir = is_link = False
            if is_dir:
                if not pruned_name(entry.name):
                    subfolders.append(full)
                continue
            if not entry.name.endswith(".py") and (not is_link or pruned_name(entry.name)):
                continue  # a link named like a skipped folder is skipped like one
            rel = full.relative_to(root).as_posix()
            if not _printable_name(rel):
                if is_link and not entry.name.endswith(".py") and not full.is_dir():
                    continue
                notes.append(f"skipped a file whose name is not UTF-8: {rel.encode('utf-8', 'surrogateescape')!r}")
                continue
            if is_link:
                linked = _follow_link(full, rel, real_root, limits, budget, keep)
                if linked is not None:
                    files.append(linked)
                continue
            try:
                regular = stat.S_ISREG(full.stat().st_mode)
            except OSError:
                regular = True  # let _read report it as unreadable
            if not regular:
                continue  # a FIFO or device named *.py would block or mislead
            read = _read(full, rel, limits, budget, keep)
            if read is not None:
                files.append(read)
        pending.extend(reversed(subfolders))
    files.sort(key=lambda f: walk_order(f.path))  # a folder link's gap sorts where the folder would
    return FetchResult(target=label, files=files, notes=notes)


def walk_order(path: str) -> tuple[tuple[int, str], ...]:
    """Sort key of the walk: os.walk top-down with sorted names, i.e. a directory's files
    first, then each subdirectory in turn (a folder's gap, `name/`, first in its folder)."""
    *dirs, name = path.split("/")
    return tuple((1, d) for d in dirs) + ((0, name),)


# Why a link was not followed: the same words for the local and the remote fetch.
def link_outside(text: str) -> str:
    return f"symlink to {text!r} leads outside the target; not followed"


def link_loop(text: str) -> str:
    return f"symlink to {text!r} is a loop; not followed"


def link_unread(text: str) -> str:
    return f"symlink to {text!r} does not end at a .py file kvtrace reads; not followed"


def folder_outside(real: str) -> str:
    return f"symlink to a folder outside the target ({real}); not followed"


def folder_pruned(real: str) -> str:
    return f"symlink to a folder kvtrace skips ({real}: hidden or __pycache__); not followed"


def skipped_link(path: str, reason: str) -> SourceFile:
    return SourceFile(path, b"", "", status="skipped", error=reason)


def _follow_link(full: Path, rel: str, real_root: Path, limits: FetchLimits, budget: Budget,
                 keep: Keep | None = None) -> SourceFile | None:
    """A symlink met by the walk: the file read under the link's name, a skipped entry (a gap)
    saying why it was not followed, or None (a folder inside the target, read under its own
    name; a link that is neither a .py name nor a folder)."""
    try:
        text = os.readlink(full)
    except OSError:
        text = "?"
    try:
        real = full.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: Python 3.11's "Symlink loop"
        if not rel.endswith(".py"):
            return None  # dangling or a loop, under a name that is not .py: no folder to miss
        loop = isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP
        return _skipped(rel, link_loop(text) if loop else link_unread(text), budget)
    inside = real == real_root or real_root in real.parents
    if real.is_dir():
        if not inside:
            return _skipped(rel + "/", folder_outside(str(real)), budget)
        below = real.relative_to(real_root)
        if any(pruned_name(part) for part in below.parts):
            return _skipped(rel + "/", folder_pruned(below.as_posix()), budget)
        log.debug("%s: symlink to %s/, read under its own name", rel, below.as_posix() or ".")
        return None
    if not rel.endswith(".py"):
        return None
    if not inside:
        return _skipped(rel, link_outside(text), budget)
    if not _reads(real, real_root):
        return _skipped(rel, link_unread(text), budget)
    return _read(full, rel, limits, budget, keep)


def _skipped(path: str, reason: str, budget: Budget) -> SourceFile:
    budget.take(0)  # counted as a file, not read: as a too-large one
    return skipped_link(path, reason)


def _shown(path: Path) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def pruned_name(directory: str) -> bool:
    """A folder the walk skips: hidden, or __pycache__."""
    return directory.startswith(".") or directory == "__pycache__"


def _printable_name(rel: str) -> bool:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reads(real: Path, real_root: Path) -> bool:
    """A regular .py file the walk itself reads (inside the tree, not in a skipped folder)."""
    if not real.is_file() or real.suffix != ".py":
        return False
    return not any(pruned_name(part) for part in real.relative_to(real_root).parts[:-1])


def _read(full: Path, rel: str, limits: FetchLimits, budget: Budget, keep: Keep | None = None) -> SourceFile | None:
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
    if keep is not None and not keep(rel, data):
        return None
    return make_source_file(rel, data)
