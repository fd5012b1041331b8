"""Suite-wide settings.

The result cache goes to a temp dir for the whole run (subprocesses inherit the variable), so tests
never read or fill the developer's real user cache.

End-to-end tests are marked by a rule, not by hand: a test is `e2e` when it reaches, through its own
body, its decorators, the fixtures it asks for and the module-level functions, classes and values it
uses (in its module or imported from another test module), a name imported from one of
`E2E_MODULES` (processes, sshd, the browser, the real SGLang releases). `-m "not e2e"` is then the
inner loop. A rule read from the source can be fooled (a process started through a library), so the
inner loop also fails any test the rule left unmarked that starts a process other than git (which
kvtrace itself runs to read a repository's history).
"""

from __future__ import annotations

import ast
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_CACHE_DIR = tempfile.mkdtemp(prefix="kvtrace-test-cache-")
os.environ["KVTRACE_CACHE_DIR"] = _CACHE_DIR

TESTS = Path(__file__).resolve().parent

# Reading any name from these modules (or these names) makes a test end-to-end: it starts processes
# (kvtrace, pip, python, sshd), serves SSH or connects over it (kvtrace runs `ssh -G` to read the
# user's ssh config), drives Chromium, reads a real SGLang release, or runs the property oracle's
# example budget (hundreds of generated programs, minutes together).
E2E_MODULES = frozenset({
    "subprocess", "multiprocessing", "selenium", "tests.sshd_server", "tests.hostile_ssh_server",
    "tests.byte_relay", "tests.peak", "tests.sglang_wheels", "tests.property.gen.budget",
    "kvtrace.fetch.ssh.fetch_ssh", "kvtrace.fetch.ssh.fetch_tree", "kvtrace.fetch.ssh.open_connection",
})
# Programs a test the rule left unmarked may still start: kvtrace reads git history with git.
INNER_LOOP_PROGRAMS = frozenset({"git"})


class _Module:
    """One test module's top-level names: what each one reads, and where imported names come from."""

    def __init__(self, dotted: str, source: str | None = None) -> None:
        path = TESTS.parent / (dotted.replace(".", "/") + ".py")
        if not path.is_file():
            path = TESTS.parent / dotted.replace(".", "/") / "__init__.py"
        if source is None:
            source = path.read_text(encoding="utf-8") if path.is_file() else ""
        self.tree = ast.parse(source)
        self.package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
        self.imported: dict[str, str] = {}  # local name -> "module" or "module:name"
        self.reads: dict[str, set[str]] = {}
        for node in self.tree.body:
            self._read_top(node)

    def _read_top(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.partition(".")[0]
                self.imported[local] = _canonical(alias.name if alias.asname else alias.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = self._absolute(node)
            for alias in node.names:
                self.imported[alias.asname or alias.name] = f"{base}:{alias.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.reads[node.name] = _names_read(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        self.reads.setdefault(name.id, set()).update(_names_read(node))
        elif isinstance(node, (ast.If, ast.Try)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self._read_top(child)

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return _canonical(node.module or "")
        parts = self.package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        return f"{base}.{node.module}" if node.module else base

    def test_reads(self, function: str, cls: str | None) -> set[str]:
        """What one test reads: its body, decorators and parameters (fixtures), and its class's decorators."""
        scope: list[ast.stmt] = self.tree.body
        reads: set[str] = set()
        if cls is not None:
            for node in self.tree.body:
                if isinstance(node, ast.ClassDef) and node.name == cls:
                    scope = node.body
                    reads |= {name for decorator in node.decorator_list for name in _names_read(decorator)}
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
                reads |= _names_read(node)
        return reads


IMPORTED = "import "  # marks a name read by an import inside a function body


def _names_read(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.arg):  # a parameter names a fixture
            names.add(child.arg)
        elif isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name):
            names.add(f"{child.value.id}.{child.attr}")
        elif isinstance(child, ast.Import):  # an import inside a function
            names.update(f"{IMPORTED}{alias.name}" for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
            names.update(f"{IMPORTED}{child.module}.{alias.name}" for alias in child.names)
    return names


_MODULES: dict[str, _Module] = {}


def _module(dotted: str) -> _Module:
    if dotted not in _MODULES:
        _MODULES[dotted] = _Module(dotted)
    return _MODULES[dotted]


def e2e_by_rule(dotted: str, function: str, cls: str | None = None, source: str | None = None) -> bool:
    """The rule's answer for one test function (of module `dotted`, or of `source` given under
    that name): what tests/test_inner_loop.py checks the rule with."""
    if source is not None:
        _MODULES[dotted] = _Module(dotted, source)
    return _reaches_e2e(dotted, _module(dotted).test_reads(function, cls))


def _canonical(dotted: str) -> str:
    """`sshd_server` as `tests.sshd_server`: some tests import helpers through the tests folder on sys.path."""
    first = dotted.partition(".")[0]
    if first != "tests" and ((TESTS / f"{first}.py").is_file() or (TESTS / first / "__init__.py").is_file()):
        return f"tests.{dotted}"
    return dotted


def _is_e2e_module(dotted: str) -> bool:
    return any(dotted == root or dotted.startswith(root + ".") for root in E2E_MODULES)


def _reaches_e2e(dotted: str, names: set[str]) -> bool:
    """Whether reading `names` in module `dotted` reaches an end-to-end construct (a closure over the
    module's top-level names and the test modules they are imported from)."""
    seen: set[tuple[str, str]] = set()
    todo = [(dotted, name) for name in names]
    while todo:
        where, name = todo.pop()
        if (where, name) in seen:
            continue
        seen.add((where, name))
        if name.startswith(IMPORTED):
            full = _canonical(name.removeprefix(IMPORTED))
            if _is_e2e_module(full):
                return True
            source, _, imported_name = full.rpartition(".")
            if source.startswith("tests."):
                todo.append((source, imported_name))
            continue
        module = _module(where)
        head, _, attribute = name.partition(".")
        if head in module.imported:
            source, _, imported_name = module.imported[head].partition(":")
            full = f"{source}.{imported_name}" if imported_name else source
            if _is_e2e_module(source) or _is_e2e_module(full) or (attribute and _is_e2e_module(f"{full}.{attribute}")):
                return True
            if full.startswith("tests.") and (TESTS.parent / (full.replace(".", "/") + ".py")).is_file():
                # An imported test module: follow the attribute read on it, or all of it.
                inner = _module(full)
                todo += [(full, attribute)] if attribute else [(full, top) for top in inner.reads]
            elif source.startswith("tests"):
                todo.append((source, imported_name))
            continue
        todo += [(where, read) for read in module.reads.get(head, ()) if read != head]
    return False


def _dotted(path: Path) -> str:
    return ".".join(path.resolve().relative_to(TESTS.parent).with_suffix("").parts)


@functools.cache
def _test_is_e2e(module: str, function: str, cls: str | None) -> bool:
    return _reaches_e2e(module, _module(module).test_reads(function, cls))


def is_e2e(item: pytest.Item) -> bool:
    """The marking rule for one collected test (a parametrized test's cases share one answer)."""
    if item.get_closest_marker("e2e") is not None:
        return True
    function = getattr(item, "originalname", None) or item.name
    owner = getattr(item, "cls", None)
    cls = owner.__name__ if owner is not None else None
    return _test_is_e2e(_dotted(Path(str(item.fspath))), function, cls)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") is None and is_e2e(item):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _inner_loop_starts_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test the rule left in the inner loop must not start a process (other than git): if it does,
    the rule missed how it does, and the test fails here rather than slowing the inner loop."""
    if request.node.get_closest_marker("e2e") is not None:
        yield
        return
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **options: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.path.basename(os.fsdecode(argv[0])).split()[0] if argv else ""
        if program not in INNER_LOOP_PROGRAMS:
            pytest.fail(f"{request.node.nodeid} starts {program!r} but is not marked e2e: "
                        f"tests/conftest.py's rule missed it (add the module it goes through to E2E_MODULES)")
        original(self, args, *rest, **options)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield


def pytest_unconfigure(config: object) -> None:
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)
