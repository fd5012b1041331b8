"""Content-addressed cache of scan results, at the scan boundary.

A scan is a pure function of (kvtrace's code, the rules pack, the fetched files' paths and
bytes), so its Report is stored under the sha256 of exactly those: an unchanged tree is never
analysed twice, on this host or — in a fleet run — across hosts that serve identical trees.

Entries live in the user cache directory (platformdirs; `KVTRACE_CACHE_DIR` overrides it, which
the test suite uses so it never touches the real one). Each entry is one file written to a temp
name beside it and `os.replace`d into place, so concurrent runs only ever see whole entries. The
directory is bounded (`KVTRACE_CACHE_MAX_BYTES`, default 64 MiB): after a write the least
recently used entries are removed until it fits.

An entry is data, never code: a magic line, the sha256 of the payload (catches a torn or damaged
write; it is not a signature) and the payload, JSON decoded by kvtrace.cachecodec into the
kvtrace.model types their annotations name, every value checked. Anything that does not verify or
decode is a miss (and, being one of ours, removed), never a crash and never trusted. The directory
is refused (a warning, then the scan runs uncached; `kvtrace cache` commands exit 2) unless it is
owned by the user and writable by no one else; kvtrace creates it 0700. Every entry is opened
relative to that checked directory, without following a link or blocking (a FIFO), and must be a
regular file of the user's under the size bound before a byte is read. Only files named like an
entry (`<sha256>.kvtrace-cache`) that start with the magic line are ever removed.

Who can write the user's own 0700 directory can already run code as the user; such a person could
still write a well-formed entry claiming a clean report. That is the user's trust boundary, as for
any file in their home, and is documented in README.md.

Only kvtrace.model types are decoded here, so a warm run imports none of the analysis (libcst,
the flow engine): that is most of what makes it cheap.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import importlib.util
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast, get_args

from kvtrace import __version__, log
from kvtrace.errors import InputError
from kvtrace.model import FetchResult, FileStatus, Report, SourceFile

if TYPE_CHECKING:  # the analysis is imported only when a scan runs: a cached rescan never needs it
    from kvtrace.config import Settings
    from kvtrace.packs import Pack

MAGIC = b"kvtrace-cache 2 json\n"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
SUFFIX = ".kvtrace-cache"
ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.kvtrace-cache")
TEMP_NAME = re.compile(r"\.kvtrace-tmp-[0-9a-f]{32}")
# Entries of kvtrace before the data-only format (pickles): removed by `cache clear`, never read.
LEGACY_NAME, LEGACY_MAGIC = re.compile(r"[0-9a-f]{64}\.report"), b"kvtrace-cache 1\n"
_OPEN_ENTRY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


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
        raise InputError(f"KVTRACE_CACHE_MAX_BYTES={text!r}: not a number of bytes (e.g. 67108864; 0 keeps nothing)")
    return value


_CODE_DIGEST: str | None = None


def code_digest() -> str:
    """kvtrace's version plus the stamp of each of its code files (`code_stamp`): an edited
    checkout never reuses results computed by other code, even when the version string did not
    move."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        digest = hashlib.sha256(__version__.encode())
        package = Path(__file__).resolve().parent
        # Rules live in the top-level rules/ folder (package kvtrace.rules): found without importing.
        spec = importlib.util.find_spec("kvtrace.rules")
        rules = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
        for folder in [package, *rules]:
            digest.update(code_stamp(str(folder)))
        _CODE_DIGEST = digest.hexdigest()
    return _CODE_DIGEST


def code_stamp(folder: str) -> bytes:
    """Each .py and .toml file below `folder`: its name, size and modification time (to the
    nanosecond). Python runs a file's cached bytecode while its size and modification time (to
    the second) match, so this tells kvtrace's code apart as well as the interpreter does,
    without reading its ~1 MB on every run."""
    found = _code_files(folder, (".py", ".toml"))
    parts = []
    for suffix in (".py", ".toml"):
        for relative in found[suffix]:
            info = os.stat(os.path.join(folder, relative))
            parts.append(f"{relative}\0{info.st_size}\0{info.st_mtime_ns}\n")
    return "".join(parts).encode("utf-8", "surrogateescape")


def _code_files(folder: str, suffixes: tuple[str, ...]) -> dict[str, list[str]]:
    """suffix -> the files named *suffix below `folder` (links to folders not entered), relative
    to it, in path order: what sorted(Path(folder).rglob("*" + suffix)) lists, at a fraction of
    pathlib's cost (it was a third of a cached rescan's own work). One walk for every suffix;
    __pycache__ (bytecode Python writes, never a source) is not entered."""
    found: dict[str, list[tuple[str, ...]]] = {suffix: [] for suffix in suffixes}
    pending: list[tuple[str, ...]] = [()]
    while pending:
        parts = pending.pop()
        with os.scandir(os.path.join(folder, *parts)) as listing:
            for entry in listing:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        pending.append((*parts, entry.name))
                    continue
                for suffix in suffixes:
                    if entry.name.endswith(suffix):
                        found[suffix].append((*parts, entry.name))
    return {suffix: ["/".join(parts) for parts in sorted(names)] for suffix, names in found.items()}


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


class CacheInfo(NamedTuple):
    """What `kvtrace cache info` shows. A NamedTuple: a dataclass's generated methods would be
    built on every start, a cached rescan's too."""

    path: Path
    entries: int
    total_bytes: int
    max_bytes: int


class UnsafeCacheDir(InputError):
    """The cache directory could be written by someone else: nothing in it can be trusted."""


_WARNED: set[str] = set()


class Cache:
    def __init__(self, directory: Path | None = None, limit: int | None = None):
        self._fd: int | None = None  # first: __del__ runs even when a bad bound stops __init__
        self.dir = directory or cache_dir()
        self.limit = max_bytes() if limit is None else limit

    def __del__(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass

    def _entry(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    # --- the directory ---------------------------------------------------------------------

    def _open_dir(self, create: bool) -> int | None:
        """A descriptor of the checked cache directory (every entry is opened relative to it, so
        the folder checked is the folder used), or None when it does not exist and `create` is
        false. UnsafeCacheDir when another user owns it or may write to it."""
        if self._fd is not None:
            return self._fd
        if create:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
        try:
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            if create:
                raise
            return None
        except OSError as exc:  # not a folder, no permission
            raise InputError(f"cache directory {self.dir}: {exc.strerror or exc}") from None
        info = os.fstat(fd)
        problem = None
        if info.st_uid != os.geteuid():
            problem = f"is owned by user id {info.st_uid}, not by you ({os.geteuid()})"
        elif info.st_mode & 0o022:
            problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):03o})"
        if problem is not None:
            os.close(fd)
            raise UnsafeCacheDir(f"cache directory {self.dir} {problem}: an entry in it could be anyone's; "
                                 f"use a folder of your own (chmod 700 it, or set KVTRACE_CACHE_DIR)")
        self._fd = fd
        return fd

    def _usable_dir(self, create: bool) -> int | None:
        """For a scan: the directory, or None (a warning once) when it cannot or must not be used:
        a cache costs speed, never the scan."""
        try:
            return self._open_dir(create)
        except UnsafeCacheDir as exc:
            if str(self.dir) not in _WARNED:
                _WARNED.add(str(self.dir))
                # Shown under -q too: a refused folder is a setup problem the user must hear of.
                log.warning("warning: %s; results are neither cached nor reused", exc, extra={"loud": True})
            return None
        except (InputError, OSError):
            return None  # not a folder, read-only or full

    # --- entries ---------------------------------------------------------------------------

    def _read_entry(self, fd: int, name: str, whole: bool) -> bytes | None:
        """The bytes of one of our entries (only its magic line unless `whole`), or None when the
        name is not a regular file of ours under the size bound. Never blocks, never follows."""
        try:
            entry = os.open(name, _OPEN_ENTRY, dir_fd=fd)
        except OSError:
            return None
        try:
            info = os.fstat(entry)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > self.limit:
                return None
            wanted = info.st_size + 1 if whole else len(MAGIC)
            chunks, left = [], wanted
            while left > 0:
                chunk = os.read(entry, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            blob = b"".join(chunks)
            if whole and len(blob) > info.st_size:
                return None  # grew while read: not a whole entry
            if whole:
                try:
                    os.utime(entry)  # least-recently-used order for eviction
                except OSError:
                    pass
            return blob
        except OSError:
            return None
        finally:
            os.close(entry)

    def get(self, key: str) -> bytes | None:
        fd = self._usable_dir(create=False)
        if fd is None or not ENTRY_NAME.fullmatch(f"{key}{SUFFIX}"):
            return None
        blob = self._read_entry(fd, f"{key}{SUFFIX}", whole=True)
        if blob is None or not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 65:
            return None
        digest, payload = blob[len(MAGIC):len(MAGIC) + 64], blob[len(MAGIC) + 65:]
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            _unlink(fd, f"{key}{SUFFIX}")  # torn or damaged, and ours (name and magic): the scan rewrites it
            return None
        return payload

    def discard(self, key: str) -> None:
        """Remove the entry for `key` (one of ours whose payload did not decode)."""
        fd = self._usable_dir(create=False)
        if fd is not None and self._read_entry(fd, f"{key}{SUFFIX}", whole=False) == MAGIC:
            _unlink(fd, f"{key}{SUFFIX}")

    def put(self, key: str, payload: bytes) -> None:
        if not ENTRY_NAME.fullmatch(f"{key}{SUFFIX}"):
            return
        fd = self._usable_dir(create=True)
        if fd is None:
            return
        temp = f".kvtrace-tmp-{os.urandom(16).hex()}"
        try:
            blob = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
            handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                             0o600, dir_fd=fd)
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(blob)
                os.replace(temp, f"{key}{SUFFIX}", src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                _unlink(fd, temp)
                raise
            self._evict(fd)
        except OSError:
            pass  # a read-only or full cache dir costs speed, never the scan

    def _entries(self, fd: int, legacy: bool = False) -> list[tuple[float, int, str]]:
        """(mtime, size, name) of each entry kvtrace wrote: named like one, a regular file of the
        user's, starting with the magic line. Nothing else in the folder is ever touched."""
        found = []
        try:
            names = os.listdir(fd)
        except OSError:
            return []
        for name in names:
            if ENTRY_NAME.fullmatch(name):
                magic = MAGIC
            elif legacy and LEGACY_NAME.fullmatch(name):
                magic = LEGACY_MAGIC
            else:
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # removed by a concurrent run
            if not stat.S_ISREG(st.st_mode):
                continue
            head = self._read_entry(fd, name, whole=False) if magic is MAGIC else _head(fd, name, len(magic))
            if head is not None and head[:len(magic)] == magic:
                found.append((st.st_mtime, st.st_size, name))
        return found

    def _evict(self, fd: int) -> None:
        entries = sorted(self._entries(fd), key=lambda e: e[0])
        total = sum(size for _, size, _ in entries)
        while entries and total > self.limit:
            _, size, name = entries.pop(0)
            _unlink(fd, name)
            total -= size

    def info(self) -> CacheInfo:
        fd = self._open_dir(create=False)
        entries = self._entries(fd) if fd is not None else []
        return CacheInfo(self.dir, len(entries), sum(size for _, size, _ in entries), self.limit)

    def clear(self) -> int:
        fd = self._open_dir(create=False)
        if fd is None:
            return 0
        removed = sum(_unlink(fd, name) for _, _, name in self._entries(fd, legacy=True))
        try:
            for name in os.listdir(fd):
                if TEMP_NAME.fullmatch(name):
                    _unlink(fd, name)
        except OSError:
            pass
        return removed


def _head(fd: int, name: str, size: int) -> bytes | None:
    try:
        entry = os.open(name, _OPEN_ENTRY, dir_fd=fd)
    except OSError:
        return None
    try:
        return os.read(entry, size) if stat.S_ISREG(os.fstat(entry).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(entry)


def _unlink(fd: int, name: str) -> int:
    try:
        os.unlink(name, dir_fd=fd)
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


def _freeze(report: Report, key: str) -> bytes:
    """The report as JSON data, without the file bytes (the fetched files are re-attached on load)."""
    from kvtrace.cachecodec import encode_report

    files = [[f.path, f.sha256, f.status, f.error] for f in report.files]
    return encode_report({"key": key, "files": files}, report)


def _thaw(payload: bytes, fetched: FetchResult, key: str) -> Report | None:
    """The report an entry holds, checked field by field against kvtrace.model, or None."""
    from kvtrace.cachecodec import decode_report

    try:
        extra, report = decode_report(payload)
        if extra.get("key") != key:
            return None  # an entry copied under another key's name
        by_path = {f.path: f for f in fetched.files}
        files: list[SourceFile] = []
        for item in extra["files"]:
            path, sha, status, error = item
            source = by_path[path]
            if source.sha256 != sha or status not in _STATUSES or not isinstance(error, (str, type(None))):
                return None
            # The file as the scan left it (a parse failure marked on a copy); the fetched file stays as read.
            files.append(source if (source.status, source.error) == (status, error)
                         else dataclasses.replace(source, status=cast(FileStatus, status), error=error))  # one of _STATUSES: checked above
    except Exception:  # any damage at all is a miss, never a crash
        return None
    report.files = files
    report.target = fetched.target
    # The only part of a report read from the target's name, not its files: a package found at
    # the top is named by the target's folder, and another target with the same files shares
    # the entry (versions/sglang-0.5.23 and a copy of it elsewhere).
    from kvtrace.scan import detect_version

    report.version = detect_version(fetched.files, report.root, fetched.target)
    return report


_STATUSES: tuple[str, ...] = get_args(FileStatus)


ScanFn = Callable[[FetchResult, object], Report]


def scan_cached(fetched: FetchResult, pack: Pack | None, cache: Cache | None,
                memo: dict[str, bytes] | None = None, scan: ScanFn | None = None,
                settings: Settings | None = None, root: str | None = None,
                elsewhere: Callable[[FetchResult, str], bytes | None] | None = None) -> tuple[Report, bool]:
    """The report for `fetched`, from `memo` (this run) or `cache` (earlier runs) when the same
    code, pack, settings and files were scanned before, else by scanning: `elsewhere(fetched,
    key)` (another process: the report as _freeze gives it, or None) first, when given, then
    here. Returns (report, was_hit)."""
    key = scan_key(fetched, pack, settings, root)
    payload = memo.get(key) if memo is not None else None
    if payload is None and cache is not None:
        payload = cache.get(key)
    if payload is not None:
        report = _thaw(payload, fetched, key)
        if report is not None:
            if memo is not None:
                memo[key] = payload
            return report, True
        if cache is not None:
            cache.discard(key)
    payload = elsewhere(fetched, key) if elsewhere is not None else None
    report = _thaw(payload, fetched, key) if payload is not None else None
    if report is None:
        report = _scan_here(fetched, pack, scan, settings, root)
        if memo is None and cache is None:
            return report, False
        try:
            payload = _freeze(report, key)
        except (TypeError, ValueError) as exc:  # a value the codec does not know: the scan stands, uncached
            log.debug("result not cached: %s", exc)
            return report, False
    assert payload is not None  # the report was thawed from it, or it was frozen from the report
    if memo is not None:
        memo[key] = payload
    if cache is not None:
        cache.put(key, payload)
    return report, False


def _scan_here(fetched: FetchResult, pack: Pack | None, scan: ScanFn | None, settings: Settings | None,
               root: str | None) -> Report:
    with gc_paused():
        if scan is not None:
            return scan(fetched, pack)
        from kvtrace.scan import scan_fetched

        return scan_fetched(fetched, pack, settings, root=root) if settings is not None else \
            scan_fetched(fetched, pack, root=root)


def frozen_scan(fetched: FetchResult, pack: Pack | None, settings: Settings | None, root: str | None,
                key: str) -> bytes:
    """The report of a scan done here, as scan_cached keeps it under `key` (what a process that
    scans for another, kvtrace.fleet's analysis server, answers with)."""
    return _freeze(_scan_here(fetched, pack, None, settings, root), key)


# --- renderings ------------------------------------------------------------------------------
# A cached rescan still spent most of its time making the report (rich's layout, the excerpts'
# highlighting, what frees each request): the finished text is kept beside the scan's entry, under
# the sha256 of everything it is made from, so a rescan is a lookup, then writing the same bytes.

RENDERING = "kvtrace-rendering 1"


def rendered(cache: Cache, reports: list[Report], options: tuple[object, ...], render: Callable[[], str]) -> str:
    """What `render()` makes of `reports` with `options` (the format and every setting it reads),
    from the cache when the same reports were rendered so before, here, by this code."""
    try:
        key = rendering_key(reports, options)
    except (OSError, TypeError, ValueError):  # a value the codec does not know, a working folder gone
        return render()
    payload = cache.get(key)
    if payload is not None:
        text = _rendering_from(payload, key)
        if text is not None:
            return text
        cache.discard(key)
    from kvtrace.outside import OUTSIDE_READS

    OUTSIDE_READS.clear()
    text = render()
    outside = [[target, root, module, _outside_digest(found)] for (target, root, module), found in OUTSIDE_READS.items()]
    cache.put(key, json.dumps({"key": key, "outside": outside, "text": text}).encode())
    return text


def rendering_key(reports: list[Report], options: tuple[object, ...]) -> str:
    """sha256 of what a rendering is made from: this code and the libraries that lay text out,
    the options, where it is run from (paths are shown as they open from there), and each report
    whole: its analysis (the cache's own encoding), its files' hashes, and where its target is."""
    from kvtrace.cachecodec import key_bytes

    digest = hashlib.sha256(f"{RENDERING}\n{code_digest()}\n{sys.version}\n{_library_stamp()}\n".encode())
    digest.update(repr(options).encode("utf-8", "surrogateescape"))
    digest.update(f"\n{os.path.realpath(os.getcwd())}\n".encode("utf-8", "surrogateescape"))
    for report in reports:
        files = [[f.path, f.sha256, f.status, f.error] for f in report.files]
        digest.update(key_bytes({"files": files, "place": _place(report.target)}, report))
    return digest.hexdigest()


def _place(target_text: str) -> list[object] | None:
    """Where a local target is on disk (Places and SARIF show paths against it): whether it is
    there, a file, and the folder it resolves to through links."""
    from kvtrace.target import LocalTarget, parse_target

    try:
        target = parse_target(target_text)
    except Exception:  # noqa: BLE001 -- a label, not a target: shown as it is
        return None
    if not isinstance(target, LocalTarget):
        return None
    path = str(target.path)
    return [os.path.exists(path), os.path.isfile(path), os.path.realpath(path)]


_LIBRARY_STAMP: str | None = None


def _library_stamp() -> str:
    """The installed rich and pygments (their files' names, sizes and times): another version lays
    the same report out otherwise. Found without importing them."""
    global _LIBRARY_STAMP
    if _LIBRARY_STAMP is None:
        parts = []
        for name in ("rich", "pygments"):
            spec = importlib.util.find_spec(name)
            folder = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
            listing: list[tuple[str, int, int]] = []
            if folder:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        if entry.is_file(follow_symlinks=False):
                            info = entry.stat(follow_symlinks=False)
                            listing.append((entry.name, info.st_size, info.st_mtime_ns))
            parts.append(f"{name} {folder} {sorted(listing)}")
        _LIBRARY_STAMP = hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()
    return _LIBRARY_STAMP


def _outside_digest(found: object) -> str:
    return hashlib.sha256(json.dumps(found).encode("utf-8", "surrogateescape")).hexdigest()


def _rendering_from(payload: bytes, key: str) -> str | None:
    """The text an entry holds, or None when it is not a rendering for `key` or a module it read
    from outside the scanned files (kvtrace.outside.module_beside) no longer reads the same."""
    try:
        entry = json.loads(payload)
        if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("text"), str):
            return None
        outside = entry["outside"]
        if not isinstance(outside, list):
            return None
        if outside:
            from kvtrace.outside import module_beside

            for target, root, module, digest in outside:
                if not (isinstance(target, str) and isinstance(root, str) and isinstance(module, str)):
                    return None
                if _outside_digest(module_beside(target, root, module)) != digest:
                    return None
        return entry["text"]
    except Exception:  # any damage at all is a miss, never a crash
        return None
