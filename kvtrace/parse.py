"""Parse stage.

Two parsers, each where it is strong:
- `ast` reads every in-scope file: it is fast (~0.4 s for SGLang 0.5.23's whole tree) and gives
  true line numbers for the structure the index needs (classes, bases, defs, call sites).
- libcst reads the bodies of the functions the analysis actually walks (the drain loop, its
  helpers, each backend's poll()). Its full parse and PositionProvider over the whole tree cost
  ~3 s and ~12 s, so positions are computed per function, on demand, and mapped back to the file.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

from typing import TYPE_CHECKING

from kvtrace.model import FileMark, SourceFile, source_lines

if TYPE_CHECKING:  # libcst is imported where a body is parsed: a fleet run that only hits the cache never needs it
    import libcst as cst


@dataclass
class ParsedModule:
    source: SourceFile
    tree: ast.Module
    lines: list[str] = field(repr=False)


# Trees shared by file content (sha256) while `shared_parses()` is active: a fleet run parses a
# file that several hosts serve once. Only the parse is shared; each host's scan indexes and
# analyses its own tree (the analysis is of the whole tree: MRO, managers, helpers across files).
# Trees are never changed after parsing, and what is cached on their nodes (walks, parent maps)
# depends on their content alone.
_SHARED: dict[str, tuple[ast.Module, list[str], int]] = {}
_SHARING = 0
MAX_SHARED_NODES = 300_000  # what the shared trees may hold (SGLang's tree is ~220,000); then it starts over


@contextmanager
def shared_parses() -> Iterator[None]:
    """Within this block, files with the same content are parsed once (see _SHARED)."""
    global _SHARING
    _SHARING += 1
    try:
        yield
    finally:
        _SHARING -= 1
        if not _SHARING:
            _SHARED.clear()


def parse_source(source: SourceFile) -> ParsedModule | FileMark:
    """Parse one file with `ast`: its module, or why it could not be parsed (the file itself is
    left as read)."""
    shared = _SHARED.get(source.sha256) if _SHARING and source.sha256 else None
    if shared is not None:
        return ParsedModule(source=source, tree=shared[0], lines=shared[1])
    text = source.text
    if text is None:  # the bytes do not decode: recorded here, as a syntax error is
        return FileMark(source.path, "not-utf8", source.undecodable or "")
    try:
        with warnings.catch_warnings():
            # CPython warns about odd escapes etc. in code it still accepts: not ours to print.
            warnings.simplefilter("ignore")
            tree = ast.parse(text, filename=source.path)
    except SyntaxError as exc:
        return FileMark(source.path, "syntax-error", f"line {exc.lineno}: {exc.msg}")
    except (RecursionError, MemoryError):
        return FileMark(source.path, "syntax-error", "nested too deeply to parse")
    except ValueError as exc:  # e.g. NUL bytes
        return FileMark(source.path, "syntax-error", str(exc))
    module = ParsedModule(source=source, tree=tree, lines=source_lines(text))
    if _SHARING and source.sha256:
        nodes = count_nodes(tree)
        if sum(n for _, _, n in _SHARED.values()) + nodes > MAX_SHARED_NODES:
            _SHARED.clear()
        _SHARED[source.sha256] = (tree, module.lines, nodes)
    return module


def parse_module(source: SourceFile) -> ParsedModule | None:
    """The module of a file read as "ok" that parses, else None (parse_source says why)."""
    if source.status != "ok":
        return None
    parsed = parse_source(source)
    return parsed if isinstance(parsed, ParsedModule) else None


# `ast` trees are kept for the whole analysis; with parsing and indexing a scan costs ~0.8 KB a
# node (measured on dense generated code) over a ~100 MB base. 500,000 nodes keep a
# scan under ~500 MB; SGLang 0.5.23 in-scope files are 218,000. Files are taken smallest
# first, so what a budget leaves out is the few huge (usually generated) files, and each one
# left out is reported, never silently dropped.
MAX_AST_NODES = 500_000

# Parsing itself holds ~600 bytes a node until it returns (1 MiB of `a` lines: 1.5 million nodes,
# 0.9 GB, 20 s), so a file is parsed only when an upper bound on its nodes, counted from its
# bytes, fits the budget on its own; its real count then decides whether it is kept. At any time
# at most the budget is held plus one parse of at most the budget.
_WORD_BYTES = b"_" + bytes(range(ord("0"), ord("9") + 1)) + bytes(range(ord("A"), ord("Z") + 1)) \
    + bytes(range(ord("a"), ord("z") + 1)) + bytes(range(0x80, 0x100))  # non-ASCII: identifier text
_WORD_OR_SPACE = _WORD_BYTES + b" \t\n\r\f\v"
_RUNS = bytes(b"a"[0] if i in _WORD_BYTES else b" "[0] for i in range(256))


def node_bound(data: bytes) -> int:
    """An upper bound on the `ast` nodes of `data` (as count_nodes counts them), in C-speed
    bytes passes. A node needs a token of its own but for three kinds, each paid for here: a
    name or number (a run of word bytes) is at most a Name and its context; a punctuation byte
    at most an operation and its operator or context (`a+b`, `-x`, `x[...]`, `*a`, `a,`); a
    line at most the Expr statement around an expression; plus the Module."""
    runs = data.translate(_RUNS)
    words = runs.count(b" a") + (runs[:1] == b"a")
    punctuation = len(data.translate(None, _WORD_OR_SPACE))
    lines = data.count(b"\n") + data.count(b"\r") + 1
    return 1 + 2 * words + 2 * punctuation + lines


@dataclass(frozen=True)
class Parsing:
    """What the parse stage made of the files: the modules (in the files' order) and, for each
    file read but not parsed, why (applied to copies of the files with `with_marks`)."""

    modules: list[ParsedModule]
    marks: list[FileMark]


def parse_modules(sources: list[SourceFile], max_nodes: int = MAX_AST_NODES) -> Parsing:
    """parse_source for each file read as "ok", within a budget of `ast` nodes held; modules in
    the input order. Every file is checked, the first one too."""
    parsed: dict[int, ParsedModule] = {}
    marks: dict[int, FileMark] = {}
    held = 0
    for index in sorted(range(len(sources)), key=lambda i: (len(sources[i].data), i)):
        source = sources[index]
        if source.status != "ok":
            continue
        # 2 nodes a byte bound node_bound too: only a file of over max_nodes / 2 bytes needs it.
        if 2 * len(source.data) + 2 > max_nodes and not (_SHARING and source.sha256 in _SHARED):
            bound = node_bound(source.data)
            if bound > max_nodes:  # could not be parsed without holding more than the budget
                marks[index] = FileMark(source.path, "too-large",
                                        f"{len(source.data):,} bytes may hold up to {bound:,} syntax nodes, over the "
                                        f"{max_nodes:,}-node parse budget (which bounds memory)")
                continue
        module = parse_source(source)
        if isinstance(module, FileMark):
            marks[index] = module
            continue
        nodes = count_nodes(module.tree)
        if held + nodes > max_nodes:
            marks[index] = FileMark(source.path, "too-large",
                                    f"{nodes:,} syntax nodes would exceed the {max_nodes:,}-node parse budget "
                                    "(which bounds memory) left after smaller files")
            continue
        held += nodes
        parsed[index] = module
    return Parsing([parsed[i] for i in sorted(parsed)], [marks[i] for i in sorted(marks)])


def count_nodes(tree: ast.AST) -> int:
    """What `sum(1 for _ in ast.walk(tree))` counts; the walk it takes is kept for the index and
    the rules, which walk every in-scope file again."""
    return len(walk(tree))


_WALKED = "_kvtrace_walk"  # attribute of a node: its descendants in ast.walk order

# Per node class, the fields that can hold nodes, in `_fields` order, and whether each is a list,
# read from the class's ASDL signature (`Name(identifier id, expr_context ctx)`); None for a class
# whose signature does not match its `_fields` (walked field by field, as ast.walk does). Fields
# of ASDL's builtin types (names, strings, numbers, constants) never hold a node.
_CHILD_FIELDS: dict[type, tuple[tuple[str, bool], ...] | None] = {}
_ASDL_BUILTINS = frozenset({"identifier", "string", "int", "constant", "object"})


def _child_fields(cls: type) -> tuple[tuple[str, bool], ...] | None:
    fields: tuple[str, ...] = getattr(cls, "_fields", ())
    doc = cls.__doc__ or ""
    found: tuple[tuple[str, bool], ...] | None = ()
    if fields:
        inner = doc[doc.find("(") + 1 : -1] if doc.endswith(")") and "(" in doc else ""
        parts = [part.split() for part in inner.split(", ")]
        if [p[1] if len(p) == 2 else None for p in parts] != list(fields):
            found = None
        else:
            found = tuple((name, kind.endswith("*")) for kind, name in parts
                          if kind.rstrip("*?") not in _ASDL_BUILTINS)
    _CHILD_FIELDS[cls] = found
    return found


def walk(node: ast.AST) -> list[ast.AST]:
    """`list(ast.walk(node))`, same order (breadth first), computed once per node and kept on
    it: the index, the backends and the rules walk the same trees and functions many times, and
    `ast.walk`'s generators cost ~3x this loop. The trees are never changed after parsing."""
    below = node.__dict__.get(_WALKED)
    if below is None:
        todo = [node]
        append, extend = todo.append, todo.extend
        child_fields = _CHILD_FIELDS
        node_type = ast.AST
        for current in todo:  # a list grown while iterated: breadth first
            cls = type(current)
            spec = child_fields[cls] if cls in child_fields else _child_fields(cls)
            if spec is None:
                for name in current._fields:
                    value = getattr(current, name, None)
                    if isinstance(value, list):
                        extend([item for item in value if isinstance(item, node_type)])
                    elif isinstance(value, node_type):
                        append(value)
                continue
            for name, many in spec:
                value = getattr(current, name, None)
                if many:
                    if value:  # a node list holds nodes, or None where ASDL allows it (`{**d}`'s key)
                        extend(value if None not in value else [item for item in value if item is not None])
                elif value is not None:
                    append(value)
        below = todo[1:]  # without the node itself: a list holding its owner would be a cycle
        setattr(node, _WALKED, below)
    return [node, *below]


_PARENTS = "_kvtrace_parents"


def parents(node: ast.AST) -> dict[int, ast.AST]:
    """id(child) -> parent for every node below `node`, computed once per node."""
    found = node.__dict__.get(_PARENTS)
    if found is None:
        found = {}
        node_type = ast.AST
        for parent in walk(node):
            for name in parent._fields:  # ast.iter_child_nodes, without its generators
                value = getattr(parent, name, None)
                if isinstance(value, list):
                    for item in value:
                        if isinstance(item, node_type):
                            found[id(item)] = parent
                elif isinstance(value, node_type):
                    found[id(value)] = parent
        setattr(node, _PARENTS, found)
    return found


class CstFunction:
    """A function body parsed by libcst, with node -> file line mapping computed lazily."""

    def __init__(self, node: cst.FunctionDef, wrapper_module: cst.Module, first_line: int):
        self.node = node
        self._module = wrapper_module
        self._first_line = first_line  # file line of the snippet's line 1

    @cached_property
    def _positions(self) -> dict:
        return start_lines(self._module)

    def line(self, node: cst.CSTNode) -> int:
        start = self._positions.get(node)
        if start is None:
            return self._first_line
        return start + self._first_line - 1


def start_lines(module: cst.Module) -> dict:
    """node -> the line libcst's PositionProvider gives as its start (`.start.line`), for every
    node of the module: the same codegen pass, but counting lines only (no columns, no
    CodePosition/CodeRange objects, no generator context managers), ~2x cheaper."""
    state = _line_state_type()(default_indent=module.default_indent, default_newline=module.default_newline)
    module._codegen(state)
    return state.lines


_LINE_STATE: type | None = None


def _line_state_type() -> type:
    """libcst's CodegenState, with PositionProvider's line bookkeeping (built on first use:
    libcst is imported only where a body is parsed)."""
    global _LINE_STATE
    if _LINE_STATE is not None:
        return _LINE_STATE
    import re

    from libcst._nodes.internal import CodegenState

    newline = re.compile(r"\r\n?|\n")  # what PositionProvider counts as a line break

    class Syntactic:
        """PositionProvider's record_syntactic_position: the start where the node's own syntax
        begins (after whitespace it owns), or its start_node's."""

        __slots__ = ("state", "node", "start_node", "start")

        def __init__(self, state: "LineState", node: object, start_node: object) -> None:
            self.state, self.node, self.start_node = state, node, start_node

        def __enter__(self) -> None:
            self.start = self.state.line

        def __exit__(self, *exc: object) -> None:
            lines = self.state.lines
            lines[self.node] = lines[self.start_node] if self.start_node is not None else self.start

    class LineState(CodegenState):
        def __init__(self, default_indent: str, default_newline: str) -> None:
            super().__init__(default_indent=default_indent, default_newline=default_newline)
            self.line = 1
            self.lines: dict = {}
            self.starts: list[int] = []

        def _count(self, value: str) -> None:
            if "\r" in value:
                self.line += len(newline.findall(value))
            else:
                self.line += value.count("\n")

        def add_indent_tokens(self) -> None:
            self.tokens.extend(self.indent_tokens)
            for token in self.indent_tokens:
                self._count(token)

        def add_token(self, value: str) -> None:
            self.tokens.append(value)
            if "\n" in value or "\r" in value:
                self._count(value)

        def before_codegen(self, node: object) -> None:
            self.starts.append(self.line)

        def after_codegen(self, node: object) -> None:
            start = self.starts.pop()
            if node not in self.lines:  # a syntactic start recorded inside wins
                self.lines[node] = start

        # A plain context manager where libcst's is a @contextmanager generator: the same enter/exit, cheaper.
        def record_syntactic_position(self, node: object, *, start_node: object = None,  # type: ignore[override]
                                      end_node: object = None) -> Syntactic:
            return Syntactic(self, node, start_node)

    _LINE_STATE = LineState
    return LineState


# libcst's native parser recurses once per nesting level and crashes the process (SIGSEGV) at
# ~10,000 (an `a and b and ...` chain is a binary tree there, flat in `ast`); its visitors, and
# ours, hit Python's recursion limit at ~1,000. Real drain loops nest < 30 levels.
MAX_CST_DEPTH = 200


def cst_depth(func: ast.AST) -> int:
    """How deep libcst's tree of `func` would be, measured on the `ast` (iteratively)."""
    deepest = 0
    stack: list[tuple[ast.AST, int]] = [(func, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, ast.BoolOp):
            depth += len(node.values) - 2  # a chain of n operands nests n-1 binary nodes
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def too_deep_for_cst(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """Why `func` is not handed to libcst (nested beyond MAX_CST_DEPTH), or None."""
    depth = cst_depth(func)
    if depth > MAX_CST_DEPTH:
        return f"{func.name}() at line {func.lineno} nests {depth} levels deep (over {MAX_CST_DEPTH}); not analysed"
    return None


def parse_function_cst(module: ParsedModule, func: ast.FunctionDef | ast.AsyncFunctionDef) -> CstFunction | None:
    """Cut the function's lines out of its file, dedent them and parse them with libcst. A
    function nested beyond MAX_CST_DEPTH is not handed to libcst: None (Index.cst records the
    file as not analysed, so the scan says INCOMPLETE)."""
    if too_deep_for_cst(func) is not None:
        return None
    start = min([d.lineno for d in func.decorator_list] + [func.lineno])
    end = func.end_lineno or func.lineno
    indent = func.col_offset
    snippet_lines = []
    for raw in module.lines[start - 1 : end]:
        head = raw[:indent]
        # Lines with less indentation can only be inside strings or brackets: strip what is there.
        snippet_lines.append(raw[indent:] if head.strip() == "" else raw.lstrip())
    snippet = "\n".join(snippet_lines) + "\n"
    import libcst as cst

    try:
        wrapper_module = cst.parse_module(snippet)
    except (cst.ParserSyntaxError, RecursionError, MemoryError):
        return None
    node = next((s for s in wrapper_module.body if isinstance(s, cst.FunctionDef)), None)
    if node is None:
        return None
    return CstFunction(node, wrapper_module, start)
