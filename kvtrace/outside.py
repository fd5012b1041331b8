"""Files a report reads from outside the scanned tree: a module of the scanned package that
kvtrace did not read (sglang.srt.environ, where a timeout's default is declared), found beside a
local target. Apart from kvtrace.freeing, which asks for them, so that a rendering kept in the
cache (kvtrace.cache.rendered) reads them again without importing what wrote the report."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_MODULE = 4 << 20
SMALL = 1 << 20  # HEAD, refs, config, gitdir/commondir files (read_bounded's default)

# (target, package root, module) -> what module_beside found there in this run: a rendering kept in the cache
# is reused only while each of these still reads the same.
OUTSIDE_READS: dict[tuple[str, str, str], tuple[str, list[str]] | None] = {}


def read_bounded(path: Path, limit: int = SMALL) -> bytes | None:
    """A regular file's bytes (None: a link, not a regular file, larger than `limit`, unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def module_beside(target_text: str, root: str, module: str) -> tuple[str, list[str]] | None:
    """(its path as the report shows it, its lines) of `module` beside the package found at `root`
    (relative to the target), or None: the report path is relative to the target, as the others.
    `module` is dotted (`sglang.srt.environ`), or a file's path relative to the target (`x/y.py`,
    where a relative import leads) that is read only inside the target."""
    found = _module_beside(target_text, root, module)
    OUTSIDE_READS[(target_text, root, module)] = found
    return found


def _module_beside(target_text: str, root: str, module: str) -> tuple[str, list[str]] | None:
    from kvtrace.target import LocalTarget, parse_target

    try:
        target = parse_target(target_text)
    except Exception:  # noqa: BLE001 -- not a target any more: nothing to read
        return None
    if not isinstance(target, LocalTarget):
        return None
    base = target.path.resolve()
    if module.endswith(".py"):
        candidate = (base / module).resolve()
        return _read(candidate, base) if candidate.is_relative_to(base) else None
    package = (base / root).resolve() if root else base
    parts = module.split(".")
    if not all(parts):  # not a dotted name
        return None
    # The package's top folder is at or above the package kvtrace found: the folder named like the
    # module's package, or the one holding the module's next folder on the way down to the scanned
    # package (a copy of `sglang` under another name, as versions/sglang-0.5.23/ is: its files
    # import `sglang.srt...`, and srt/ sits in it).
    # Once the scanned package's own top is found, the module is there or nowhere: another
    # package's copy (versions/sglang/ beside versions/sglang-0.5.23/) is not its module.
    for top in [package, *package.parents][:10]:
        inside = len(parts) > 1 and package.is_relative_to(top / parts[1])
        if top.name != parts[0] and not inside:
            continue
        found = _read(top.joinpath(*parts[1:]).with_suffix(".py"), base)
        if found is not None or inside:
            return found
    if (base / parts[0]).is_dir():
        return _read((base / parts[0]).joinpath(*parts[1:]).with_suffix(".py"), base)
    return None


def _read(path: Path, base: Path) -> tuple[str, list[str]] | None:
    """The file's path as the report shows it (relative to the target when inside it) and its
    lines, or None when it cannot be read."""
    data = read_bounded(path, MAX_MODULE)
    if data is None:
        return None
    try:
        shown = path.relative_to(base).as_posix()
    except ValueError:
        shown = str(path)
    return shown, data.decode("utf-8", "replace").splitlines()
