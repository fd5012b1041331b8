"""Compiled code of the methods `dataclasses` writes, kept between runs beside Python's bytecode.

Every `@dataclass` compiles the source of its `__init__`, `__repr__`, `__eq__` (and for a frozen
one `__hash__`, `__setattr__`, `__delattr__`) when its module is imported: the .pyc of the module
does not hold them. kvtrace.model's classes cost a cached rescan ~15 ms that way, and libcst's
~250 node classes a cold scan far more. `dataclasses` compiles each with `exec(source, globals,
locals)`, a name it looks up in its own module first: `install()` puts there an `exec` that
compiles a source only the first time it is seen and otherwise runs the code object compiled
from exactly that text before (the same compile: flags of a module without __future__ imports,
file name "<string>"). Anything but a str goes to the builtin unchanged.

The code objects are kept per top-level package (kvtrace, libcst, rich, ...) in kvtrace's own
`__pycache__` folder, as marshal data tagged with this interpreter's bytecode magic number: the
place and the trust of the .pyc files Python itself runs from there. A file that is missing,
damaged, from another Python, or not writable costs the compile, never the run. `save()` (called
by cli.run before the process ends) writes a package's file only when this run compiled
something new for it, and, as Python's bytecode, not under PYTHONDONTWRITEBYTECODE.
KVTRACE_NO_CODE_CACHE=1 turns it off.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib.util
import marshal
import os
import sys
from typing import Any

_MAGIC = importlib.util.MAGIC_NUMBER
_MAX_ENTRIES = 20_000  # a package's file: the methods of every class it has (libcst: ~1,300)
_FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")

_known: dict[str, dict[str, Any]] = {}  # package -> source -> code
_added: set[str] = set()  # packages with code compiled in this run
_real_exec = builtins.exec


def _file(package: str) -> str:
    return os.path.join(_FOLDER, f"dataclass-code.{package}.{sys.implementation.cache_tag}.marshal")


def _load(package: str) -> dict[str, Any]:
    try:
        with open(_file(package), "rb") as handle:
            blob = handle.read()
        if blob[:len(_MAGIC)] == _MAGIC:
            found = marshal.loads(blob[len(_MAGIC):])
            if isinstance(found, dict):
                return found
    except Exception:  # noqa: BLE001 -- missing, damaged or another build's: compiled again
        pass
    return {}


def _exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:
    if type(source) is not str or not isinstance(globals, dict):
        _real_exec(source, globals, locals)
        return
    package = str(globals.get("__name__") or "").partition(".")[0]
    if not package.isidentifier():  # it names a file: nothing but a plain module name
        package = "_"
    known = _known.get(package)
    if known is None:
        known = _known[package] = _load(package)
    code = known.get(source)
    if code is None:
        # dont_inherit: compiled as dataclasses' own exec would, without this module's __future__ flags.
        code = known[source] = compile(source, "<string>", "exec", dont_inherit=True)
        _added.add(package)
    _real_exec(code, globals, locals)


def install() -> None:
    """From now on, dataclasses' generated methods are compiled once per source text (see above)."""
    if os.environ.get("KVTRACE_NO_CODE_CACHE") or getattr(dataclasses, "exec", None) is _exec:
        return
    dataclasses.exec = _exec  # type: ignore[attr-defined]  # found before the builtin by _create_fn


def save() -> None:
    """Write each package's file that gained code in this run (atomically; never fails the run).
    Not under PYTHONDONTWRITEBYTECODE (python -B), which keeps Python's own bytecode unwritten."""
    if sys.dont_write_bytecode:
        return
    for package in sorted(_added):
        known = _known[package]
        if len(known) > _MAX_ENTRIES:
            continue
        temp = f"{_file(package)}.{os.getpid()}.tmp"
        try:
            os.makedirs(_FOLDER, exist_ok=True)
            with open(temp, "wb") as handle:
                handle.write(_MAGIC + marshal.dumps(known))
            os.replace(temp, _file(package))
        except Exception:  # noqa: BLE001 -- a read-only install: the next run compiles again
            try:
                os.unlink(temp)
            except OSError:
                pass
    _added.clear()
