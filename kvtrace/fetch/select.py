"""Which fetched files the analysis can read: the one choice every route makes (local, exec + tar,
SFTP), so that a remote scan moves only those and still reports what a local scan reports.

The scan (kvtrace.scan) reads, of a tree: the files that hold the poll enum's name (to find the
package), every file inside the package folders found that way, the files around them that name
a queue, the version.py / _version.py above a package, and every file it could not read (a gap
in the report). All of these are decided by file paths, a file's status and whether its bytes
hold one of a few fixed names. `narrow` keeps exactly those files; a tree with no named package
folder (a fork that renamed it, or no package at all) is kept whole, as the scan then reads all
of it. `choose` makes the same choice before any content is moved, from a listing and the names
each file holds (what the remote's `grep -F` reports), as a superset that `narrow` then cuts to
the same files.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from kvtrace.model import FetchResult, SourceFile

VERSION_FILES = ("version.py", "_version.py")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Wanted(NamedTuple):
    """What a rules pack makes the scan look for: the enum, the queue names, the folder name.
    A NamedTuple rather than a frozen dataclass, whose generated methods every run would pay to build."""

    enum: str
    queues: tuple[str, ...]
    package_dir: str

    @classmethod
    def from_pack(cls, pack: Any) -> Wanted:
        return cls(pack.enum, tuple(pack.queues or (pack.queue,)), pack.package_dir)

    @property
    def searchable(self) -> bool:
        """Plain ASCII identifiers: the same bytes in every source encoding, no newline, nothing a
        fixed-string search could read as anything else. Otherwise nothing is left out."""
        return all(_IDENTIFIER.fullmatch(name) for name in (self.enum, *self.queues))

    @property
    def enum_bytes(self) -> bytes:
        return self.enum.encode() if self.enum.isascii() else b""

    @property
    def queue_bytes(self) -> tuple[bytes, ...]:
        return tuple(q.encode() for q in self.queues)

    def may_read(self, path: str, data: bytes) -> bool:
        """Whether the scan may read this file, known from the file alone: it names the enum or a
        queue, or lies in a folder named like the package, or is a version file. A superset of
        what `narrow` keeps whenever a named package folder is found (see kvtrace.fetch.fetch_target)."""
        name = path.rsplit("/", 1)[-1]
        if name in VERSION_FILES or f"/{self.package_dir}/" in f"/{path}":
            return True
        return self.enum_bytes in data or any(q in data for q in self.queue_bytes)

    def enum_definition(self) -> re.Pattern[str]:
        return re.compile(rf"^\s*class\s+{re.escape(self.enum)}\b", re.MULTILINE)


def inside(path: str, folder: str) -> bool:
    return folder == "" or path.startswith(folder + "/")


def named_folders(paths: list[str], package_dir: str, target: str) -> set[str]:
    """Folders named like the package (the target itself when it is so named)."""
    named: set[str] = set()
    if PurePosixPath(target.rstrip("/")).name == package_dir:
        named.add("")
    for path in paths:
        parts = path.split("/")[:-1]
        for i, part in enumerate(parts):
            if part == package_dir:
                named.add("/".join(parts[: i + 1]))
    return named


def outermost(named: set[str], defining: list[str]) -> list[str]:
    """The named folders that hold a defining file, without those inside another one; in
    version order (`sglang-0.5.9/` before `sglang-0.5.23/`), as a person lists releases."""
    candidates = sorted((d for d in named if any(inside(p, d) for p in defining)), key=_in_version_order)
    return [d for d in candidates if not any(o != d and inside(d, o) for o in candidates)]


def _in_version_order(path: str) -> list[str | int]:
    """Runs of digits compared as numbers: the parts alternate text and number, so any two keys
    compare part by part as the same type."""
    return [int(part) if index % 2 else part for index, part in enumerate(re.split(r"(\d+)", path))]


def defining_files(files: list[SourceFile], wanted: Wanted) -> list[str]:
    """Files that define the enum. Its name in the raw bytes first: an ASCII name has the same
    bytes in every encoding Python source may declare, and decoding and searching every file of
    a whole site-packages tree (4,700 files) is the cost of a cached rescan."""
    name = wanted.enum_bytes
    statement = re.compile(rf"class\s+{re.escape(wanted.enum)}\b")
    return [f.path for f in files if name in (f.data or b"") and defines(f.text or "", statement)]


def defines(text: str, statement: re.Pattern[str]) -> bool:
    """`re.search(r"^\\s*class\\s+NAME\\b", text, re.MULTILINE)`, without trying `^\\s*` at
    every line start (a tenth of a cached rescan): a `class NAME` whose text back to the last
    non-space character before it holds a line start (the text's start, or after a newline)."""
    for match in statement.finditer(text):
        at = match.start() - 1
        while at >= 0 and text[at].isspace():  # str.isspace and \\s agree on what is whitespace
            if text[at] == "\n":
                return True
            at -= 1
        if at < 0:
            return True
    return False


def version_files(paths: list[str], roots: list[str]) -> set[str]:
    """version.py / _version.py in a folder above a package root (kvtrace.scan.detect_version)."""
    wanted: set[str] = set()
    for root in roots:
        parts = root.split("/") if root else []
        for i in range(len(parts)):
            folder = "/".join(parts[:i])
            wanted.update(f"{folder}/{name}" if folder else name for name in VERSION_FILES)
    return wanted & set(paths)


def package_roots(files: list[SourceFile], wanted: Wanted, target: str) -> list[str]:
    """The named package folders (kvtrace.scan.locate_packages without its fallbacks)."""
    return outermost(named_folders([f.path for f in files], wanted.package_dir, target), defining_files(files, wanted))


def narrow(fetched: FetchResult, wanted: Wanted) -> FetchResult:
    """`fetched` with only the files the scan can read (see the module docstring), in order."""
    if not wanted.searchable:
        return fetched
    files = fetched.files
    roots = package_roots(files, wanted, fetched.target)
    if not roots or "" in roots:
        return fetched  # the whole target is the package (or no package: its error lists all files)
    enum, queues = wanted.enum_bytes, wanted.queue_bytes
    versions = version_files([f.path for f in files], roots)

    def kept(f: SourceFile) -> bool:
        if f.status != "ok" or f.path in versions or any(inside(f.path, r) for r in roots):
            return True
        data = f.data or b""
        return enum in data or any(q in data for q in queues)

    kept_files = [f for f in files if kept(f)]
    if len(kept_files) == len(files):
        return fetched
    return FetchResult(target=fetched.target, files=kept_files, notes=fetched.notes)


def choose(paths: list[str], enum_hits: set[str], queue_hits: set[str], wanted: Wanted, target: str) -> set[str] | None:
    """Before any content is moved: the listed files to fetch, a superset of what `narrow` keeps
    (enum_hits holds every file whose bytes hold the enum's name, so every defining file). None:
    fetch them all (no named package folder holds a file naming the enum)."""
    if not wanted.searchable:
        return None
    roots = outermost(named_folders(paths, wanted.package_dir, target), sorted(enum_hits))
    if not roots or "" in roots:
        return None
    # A true package root (a named folder holding a *defining* file) lies inside one of these.
    return (enum_hits | queue_hits | version_files(paths, roots)
            | {p for p in paths if any(inside(p, r) for r in roots)})
