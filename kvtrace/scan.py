"""Scans one target: locates its package and runs the stages of kvtrace.pipeline in order
(target -> fetch -> parse -> index -> graph -> checks -> report); the only module that calls them.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvtrace.beside import Beside
from kvtrace.config import Settings
from kvtrace.errors import AmbiguousTarget, InputError
from kvtrace.fetch.local import fetch_local
from kvtrace.fetch.select import Wanted, defining_files, inside as _inside, named_folders, outermost
from kvtrace.model import (
    OUTCOME_ORDER,
    DetectedVersion,
    FetchLimits,
    FetchResult,
    Report,
    SourceFile,
)
from kvtrace.packs import Pack, load_pack

# Trees smaller than this are analysed in one process: a fork and its JSON result cost ~10 ms, the
# senders of a small tree less. SGLang's disaggregation/ is 0.8-1.5 MB.
PARALLEL_MIN_BYTES = 200_000


def scan_path(path: Path, pack: Pack | None = None, limits: FetchLimits = FetchLimits(),
              settings: Settings = Settings()) -> Report:
    return scan_fetched(fetch_local(path, limits), pack, settings)


def locate_packages(files: list[SourceFile], pack: Pack, target: str) -> list[str]:
    """Every package folder under the target (relative to it, '' for the target itself), sorted.

    A candidate is a folder named like the pack's package_dir (or the target itself when it is
    so named) that defines the poll enum; one inside another candidate is part of it. With no
    such folder, the target itself counts when it defines the enum (a fork that renamed the
    folder). The result depends only on the file paths and contents, never on hash order.
    """
    named = named_folders([f.path for f in files], pack.package_dir, target)
    defining = defining_files(files, Wanted.from_pack(pack))
    found = outermost(named, defining)
    if found:
        return found
    if defining:
        return [""]
    raise InputError(_no_package_message(files, pack, target, sorted(named)))


def _no_package_message(files: list[SourceFile], pack: Pack, target: str, named: list[str]) -> str:
    """Why no package was found, from what was actually read (never a guess about a file)."""
    where = [d for d in named if d] or ([""] if named else [])
    scope = [f for f in files if any(_inside(f.path, d) for d in where)] if where else files
    unread = [f for f in scope if f.as_read[0] != "ok"]
    if where:
        head = f"{target}: found {', '.join(d + '/' for d in where) if where != [''] else 'the package'}"
    else:
        head = f"{target}: no {pack.package_dir}/ package found"
    if unread:
        counts: dict[str, int] = {}
        for f in unread:
            counts[f.as_read[0]] = counts.get(f.as_read[0], 0) + 1
        tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        first = unread[0]
        return (f"{head} but could not read `class {pack.enum}`: {len(unread)} of {len(scope)} files "
                f"not read ({tally}; e.g. {first.path}: {first.as_read[1] or first.as_read[0]})")
    if not scope:
        return f"{head}; it holds no .py files"
    listed = ", ".join(f.path for f in scope[:4]) + (f" and {len(scope) - 4} more" if len(scope) > 4 else "")
    return f"{head}; none of its {len(scope)} .py files ({listed}) defines `class {pack.enum}`"


def _status_reason(f: SourceFile) -> str:
    """`path:line: syntax error: ...` (the line a person opens), else `path: <why>`."""
    from kvtrace.gaps import error_line, file_reason

    line = error_line(f)
    reason = file_reason(f)
    return f"{f.path}: {reason}" if line is None else f"{f.path}:{line}: {reason.replace(f'line {line}: ', '', 1)}"


def locate_package(files: list[SourceFile], pack: Pack, target: str) -> str:
    """The one package folder under the target; several are an error that lists them."""
    found = locate_packages(files, pack, target)
    if len(found) > 1:
        raise AmbiguousTarget(target, found)
    return found[0]


def package_scope(root: str, candidates: list[str]) -> str:
    """The widest folder around `root` that holds no other candidate package: files outside the
    package that mention the queue are taken from there, so two side-by-side trees never mix."""
    parts = root.split("/") if root else []
    scope = root
    for i in range(len(parts) - 1, -1, -1):
        ancestor = "/".join(parts[:i])
        if any(c != root and _inside(c, ancestor) for c in candidates):
            break
        scope = ancestor
    return scope


# `__version__ = "0.5.2"`, `__version__: str = ...`, and setuptools-scm's generated
# `__version__ = version = '0.5.14'` (whose version.py only imports it from _version.py).
_VERSION = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*(?:\w+\s*=\s*)*["']([^"'\n]+)["']""", re.MULTILINE)


def detect_version(files: list[SourceFile], root: str, target: str = "") -> DetectedVersion | None:
    """The `__version__` of the nearest version.py (or setuptools-scm's _version.py) in a
    folder above the package (as in a wheel or a checkout: sglang/version.py above
    sglang/srt/disaggregation)."""
    by_path = {f.path: f for f in files}
    parts = root.split("/") if root else []
    for i in range(len(parts) - 1, -1, -1):
        folder = "/".join(parts[:i])
        for name in ("version.py", "_version.py"):
            path = f"{folder}/{name}" if folder else name
            source = by_path.get(path)
            match = _VERSION.search(source.text or "") if source is not None else None
            if match:
                break
        if source is not None and match:
            line = (source.text or "").count("\n", 0, match.start()) + 1
            # The folder holding it names the package; at the top, the target's own name.
            top = target.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1] or "package"
            package = parts[i - 1] if i > 0 else top
            return DetectedVersion(package, match.group(1), path, line)
    return None


def _in_scope(files: list[SourceFile], pack: Pack, root: str, scope: str) -> list[SourceFile]:
    """The package's files, plus files around it that mention the queue. A file whose content
    could not be read is kept when it may mention the queue, so the report says it was missed."""
    queues = [q.encode() for q in pack.queues or (pack.queue,)]

    def wanted(f: SourceFile) -> bool:
        if _inside(f.path, root):
            return True
        if not _inside(f.path, scope):
            return False
        if f.status in ("too-large", "unreadable", "skipped"):
            return True
        return any(q in f.data for q in queues)

    return [f for f in files if wanted(f)]


def scan_fetched(fetched: FetchResult, pack: Pack | None = None, settings: Settings = Settings(),
                 root: str | None = None) -> Report:
    """Analyse one package of the fetched tree: `root` (from locate_packages), or the only one;
    the stages of kvtrace.pipeline, in order."""
    # The analysis stages (the rules, the index, libcst under them) are imported here, not with the
    # module: a rescan served from the cache only locates the package (locate_packages).
    from kvtrace import pipeline

    pack = pack or load_pack()
    parsed = pipeline.parse(fetched, pack, root)
    indexed = pipeline.index(parsed, pack, fetched.target)
    analysed = pipeline.graph(parsed, indexed, pack, Beside, PARALLEL_MIN_BYTES)
    checked = pipeline.checks(parsed, indexed, analysed, pack, settings)
    return pipeline.report(fetched, parsed, indexed, analysed, checked, settings)


def _enum_unreadable_message(target: str, pack: Pack, files: list[SourceFile]) -> str:
    enum_def = re.compile(rf"^\s*class\s+{re.escape(pack.enum)}\b", re.MULTILINE)
    where = [f for f in files if enum_def.search(f.text or "")]
    detail = "; ".join(_status_reason(f) for f in where if f.status != "ok")
    return f"{target}: `class {pack.enum}` could not be read" + (f" ({detail})" if detail else " (it has no members)")


__all__ = ["scan_path", "scan_fetched", "locate_package", "locate_packages", "OUTCOME_ORDER"]
