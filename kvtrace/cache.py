"""Content-addressed cache of scan results, at the scan boundary.

A scan is a pure function of (kvtrace's code, the rules pack, the fetched files' paths and
bytes), so its Report is stored under the sha256 of exactly those: an unchanged tree is never
analysed twice, on this host or — in a fleet run — across hosts that serve identical trees.

Entries live in the user cache directory (platformdirs; `KVTRACE_CACHE_DIR` overrides it, which
the test suite uses so it never touches the real one). Each entry is one file written to a temp
name beside it and `os.replace`d into place, so concurrent runs only ever see whole entries. An
entry starts with a magic line and the sha256 of its payload: anything that does not verify or
does not load is ignored (and rewritten by the scan that follows), never a crash. The directory
is bounded (`KVTRACE_CACHE_MAX_BYTES`, default 64 MiB): after a write the least recently used
entries are removed until it fits.

Only kvtrace.model types are unpickled here, so a warm run imports none of the analysis
(libcst, the flow engine): that is most of what makes it cheap.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import importlib.util
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvtrace import __version__
from kvtrace.model import FetchResult, Report, SourceFile

MAGIC = b"kvtrace-cache 1\n"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
SUFFIX = ".report"


def cache_dir() -> Path:
    override = os.environ.get("KVTRACE_CACHE_DIR")
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("kvtrace", appauthor=False))


def max_bytes() -> int:
    """The bound from KVTRACE_CACHE_MAX_BYTES; a value that is not a whole number of bytes is
    an input error (a typo silently meaning 64 MiB is a setting that does nothing)."""
    text = os.environ.get("KVTRACE_CACHE_MAX_BYTES")
    if text is None or text.strip() == "":
        return DEFAULT_MAX_BYTES
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        from kvtrace.errors import InputError

        raise InputError(f"KVTRACE_CACHE_MAX_BYTES={text!r}: not a number of bytes (e.g. 67108864; 0 keeps nothing)")
    return value


_CODE_DIGEST: str | None = None


def code_digest() -> str:
    """kvtrace's version plus the bytes of its own code: an edited checkout never reuses results
    computed by other code, even when the version string did not move."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        digest = hashlib.sha256(__version__.encode())
        package = Path(__file__).resolve().parent
        # Rules live in the top-level rules/ folder (package kvtrace.rules): found without importing.
        spec = importlib.util.find_spec("kvtrace.rules")
        rules = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
        for folder in [package, *rules]:
            for path in sorted(folder.rglob("*.py")) + sorted(folder.rglob("*.toml")):
                digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
        _CODE_DIGEST = digest.hexdigest()
    return _CODE_DIGEST


def pack_digest(pack: object) -> str:
    """The pack's content (every field but where it was loaded from)."""
    fields = {f.name: getattr(pack, f.name) for f in dataclasses.fields(pack) if f.name != "source"}  # type: ignore[arg-type]
    return hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()


def tree_digest(files: list[SourceFile]) -> str:
    """sha256 over the sorted (path, sha256, status, why) of each file: the identity of a fetched
    tree. A file not read has no bytes to hash: its reason (a size, where a link leads) is what
    the report shows, so it is part of the key."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.sha256}\0{f.status}\0{f.error or ''}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def scan_key(fetched: FetchResult, pack: object, settings: object = None, root: str | None = None) -> str:
    # Of the settings only what the analysis reads (rule and backend selection) changes a report;
    # fail_on and the baseline are applied to it afterwards.
    chosen = [getattr(settings, name, ()) for name in ("select", "ignore", "ignore_backends")]
    parts = [code_digest(), pack_digest(pack), tree_digest(fetched.files), repr(sorted(fetched.notes)), repr(chosen),
             repr(root)]
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


@dataclass
class CacheInfo:
    path: Path
    entries: int
    total_bytes: int
    max_bytes: int


class Cache:
    def __init__(self, directory: Path | None = None, limit: int | None = None):
        self.dir = directory or cache_dir()
        self.limit = max_bytes() if limit is None else limit

    def _entry(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    def get(self, key: str) -> bytes | None:
        path = self._entry(key)
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 65:
            return None
        digest, payload = blob[len(MAGIC):len(MAGIC) + 64], blob[len(MAGIC) + 65:]
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            return None  # torn or tampered: treat as a miss; the scan rewrites it
        try:
            os.utime(path)  # least-recently-used order for eviction
        except OSError:
            pass
        return payload

    def put(self, key: str, payload: bytes) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            blob = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
            fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=self.dir)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(blob)
                os.replace(temp, self._entry(key))
            except BaseException:
                _unlink(Path(temp))
                raise
            self._evict()
        except OSError:
            pass  # a read-only or full cache dir costs speed, never the scan

    def _entries(self) -> list[tuple[float, int, Path]]:
        found = []
        try:
            children = list(self.dir.iterdir())
        except OSError:
            return []
        for path in children:
            if not path.name.endswith(SUFFIX):
                continue
            try:
                st = path.stat()
            except OSError:
                continue  # removed by a concurrent run
            found.append((st.st_mtime, st.st_size, path))
        return found

    def _evict(self) -> None:
        entries = sorted(self._entries(), key=lambda e: e[0])
        total = sum(size for _, size, _ in entries)
        while entries and total > self.limit:
            _, size, path = entries.pop(0)
            _unlink(path)
            total -= size

    def info(self) -> CacheInfo:
        entries = self._entries()
        return CacheInfo(self.dir, len(entries), sum(size for _, size, _ in entries), self.limit)

    def clear(self) -> int:
        removed = 0
        for _, _, path in self._entries():
            removed += _unlink(path)
        try:
            for stale in self.dir.glob(".tmp-*"):
                _unlink(stale)
        except OSError:
            pass
        return removed


def _unlink(path: Path) -> int:
    try:
        path.unlink()
        return 1
    except OSError:
        return 0


@contextmanager
def gc_paused() -> Iterator[None]:
    """The scan builds many long-lived AST nodes, which makes CPython's cyclic collector run
    over and over for nothing (it doubled the parse time); reference counting frees them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _freeze(report: Report) -> bytes:
    """Pickle a report without the file bytes (the fetched files are re-attached on load)."""
    files = [(f.path, f.sha256, f.status, f.error) for f in report.files]
    slim = dataclasses.replace(report, files=[])
    return pickle.dumps((files, slim), protocol=pickle.HIGHEST_PROTOCOL)


def _thaw(payload: bytes, fetched: FetchResult) -> Report | None:
    try:
        files, report = pickle.loads(payload)
        if not isinstance(report, Report):
            return None
        by_path = {f.path: f for f in fetched.files}
        attached: list[SourceFile] = []
        for path, sha, status, error in files:
            source = by_path[path]
            if source.sha256 != sha:
                return None
            source.status, source.error = status, error
            attached.append(source)
    except Exception:  # any damage at all is a miss, never a crash
        return None
    report.files = attached
    report.target = fetched.target
    return report


ScanFn = Callable[[FetchResult, object], Report]


def scan_cached(fetched: FetchResult, pack: object, cache: Cache | None,
                memo: dict[str, bytes] | None = None, scan: ScanFn | None = None,
                settings: object = None, root: str | None = None) -> tuple[Report, bool]:
    """The report for `fetched`, from `memo` (this run) or `cache` (earlier runs) when the same
    code, pack, settings and files were scanned before, else by scanning. Returns (report, was_hit)."""
    key = scan_key(fetched, pack, settings, root)
    payload = memo.get(key) if memo is not None else None
    if payload is None and cache is not None:
        payload = cache.get(key)
    if payload is not None:
        report = _thaw(payload, fetched)
        if report is not None:
            if memo is not None:
                memo[key] = payload
            return report, True
    with gc_paused():
        if scan is not None:
            report = scan(fetched, pack)
        else:
            from kvtrace.scan import scan_fetched

            report = scan_fetched(fetched, pack, settings, root=root) if settings is not None else \
                scan_fetched(fetched, pack, root=root)  # type: ignore[arg-type]
    if memo is not None or cache is not None:
        frozen = _freeze(report)
        if memo is not None:
            memo[key] = frozen
        if cache is not None:
            cache.put(key, frozen)
    return report, False
