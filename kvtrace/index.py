"""Index stage: classes, bases and MRO across files, methods, module functions, imports.

Built from the `ast` trees of the in-scope files; libcst bodies are produced on demand through
`Index.cst(func)` and cached.
"""

from __future__ import annotations

import ast
import bisect
import unicodedata
from dataclasses import dataclass, field

from kvtrace.model import FileMark
from kvtrace.syntax import dotted
from kvtrace.parse import CstFunction, ParsedModule, parse_function_cst, too_deep_for_cst, walk


@dataclass(eq=False)
class FuncRef:
    name: str
    path: str
    line: int
    node: ast.FunctionDef | ast.AsyncFunctionDef = field(repr=False)
    module: ParsedModule = field(repr=False)
    owner: "ClassInfo | None" = None

    @property
    def qualname(self) -> str:
        return f"{self.owner.name}.{self.name}" if self.owner else self.name


@dataclass(eq=False)
class ClassInfo:
    name: str
    path: str
    line: int
    base_names: list[str]
    methods: dict[str, FuncRef]
    node: ast.ClassDef = field(repr=False)
    module: ParsedModule = field(repr=False)


class Index:
    def __init__(self, modules: list[ParsedModule], root: str = ""):
        # Files in the located package win over same-named definitions elsewhere in scope.
        self.root = root
        modules = sorted(modules, key=lambda m: (not self.in_root(m.source.path), m.source.path))
        self.modules = {m.source.path: m for m in modules}
        self.classes: dict[str, list[ClassInfo]] = {}
        self.functions: dict[str, list[FuncRef]] = {}  # module-level functions by name
        self.module_functions: dict[str, dict[str, FuncRef]] = {}
        self.imports: dict[str, dict[str, str]] = {}  # path -> local name -> imported name
        self.constants: dict[str, dict[str, ast.expr]] = {}  # path -> module-level NAME = <expr>
        self._cst: dict[int, CstFunction | None] = {}
        self.marks: list[FileMark] = []  # files found not analysable while analysing, in the order found
        self._mro: dict[int, list[ClassInfo]] = {}
        # kvtrace.flow's helper-call results for this scan (it lives as long as the trees its keys name).
        self.call_memo: dict = {}
        # What the analysis derives from the trees (keyed by node ids and what else it depends
        # on): per Index, as the trees whose ids the keys hold live as long as it.
        self.derived: dict = {}
        self._all_functions: list[FuncRef] | None = None
        self._nodes: dict[tuple[int, tuple[type, ...]], list] = {}
        self._locals: dict[int, set[str]] = {}
        self._by_type: dict[int, dict[type, list[tuple[int, ast.AST]]]] = {}
        self._assignments: dict[str, list[ast.Assign | ast.AnnAssign]] = {}
        self._callers: dict[str, list[tuple[FuncRef, ast.Call]]] = {}
        self._name_lines: dict[tuple[str, str], list[int]] = {}
        self._searched: dict[str, str] = {}  # path -> the text may_name searches (NFKC outside ASCII)
        for module in modules:
            self._add(module)

    def _add(self, module: ParsedModule) -> None:
        path = module.source.path
        own: dict[str, FuncRef] = {}
        imports: dict[str, str] = {}
        constants: dict[str, ast.expr] = {}
        for stmt in module.tree.body:
            if isinstance(stmt, ast.ClassDef):
                self._add_class(stmt, module)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                ref = FuncRef(stmt.name, path, stmt.lineno, stmt, module)
                own[stmt.name] = ref
                self.functions.setdefault(stmt.name, []).append(ref)
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    imports[alias.asname or alias.name] = alias.name
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        constants[t.id] = stmt.value
        # Classes nested in `if TYPE_CHECKING:` / try blocks are rare in this code; top level is enough.
        self.module_functions[path] = own
        self.imports[path] = imports
        # A name assigned more than once at module level is not a constant.
        counts: dict[str, int] = {}
        for stmt in module.tree.body:
            for t in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                if isinstance(t, ast.Name):
                    counts[t.id] = counts.get(t.id, 0) + 1
        self.constants[path] = {k: v for k, v in constants.items() if counts.get(k) == 1}

    def _add_class(self, stmt: ast.ClassDef, module: ParsedModule) -> None:
        info = ClassInfo(
            name=stmt.name,
            path=module.source.path,
            line=stmt.lineno,
            base_names=[dotted(b, calls=True).rsplit(".", 1)[-1] for b in stmt.bases if dotted(b, calls=True)],
            methods={},
            node=stmt,
            module=module,
        )
        for item in stmt.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info.methods[item.name] = FuncRef(item.name, module.source.path, item.lineno, item, module, info)
        self.classes.setdefault(stmt.name, []).append(info)

    # --- lookups -------------------------------------------------------------------------

    def in_root(self, path: str) -> bool:
        return not self.root or path.startswith(self.root + "/")


    def resolve_class(self, name: str, near: str | None = None) -> ClassInfo | None:
        """A class by name, preferring one defined in the same file, then a unique one."""
        candidates = self.classes.get(name, [])
        if not candidates:
            return None
        if near is not None:
            for c in candidates:
                if c.path == near:
                    return c
        return candidates[0]

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        """Python's C3 order over the classes in the tree (bases outside it are skipped)."""
        if id(cls) not in self._mro:
            self._mro[id(cls)] = self._compute_mro(cls)
        return self._mro[id(cls)]

    def _compute_mro(self, cls: ClassInfo) -> list[ClassInfo]:
        order: list[ClassInfo] = []
        seen: set[int] = set()

        def visit(c: ClassInfo, depth: int) -> None:
            if id(c) in seen or depth > 50:
                return
            seen.add(id(c))
            order.append(c)
            for base in c.base_names:
                resolved = self.resolve_class(base, near=c.path)
                if resolved is not None:
                    visit(resolved, depth + 1)

        visit(cls, 0)
        return _c3_or(order, self, cls)

    def find_method(self, cls: ClassInfo, name: str) -> FuncRef | None:
        for c in self.mro(cls):
            if name in c.methods:
                return c.methods[name]
        return None

    def subclasses_of(self, base: str) -> list[ClassInfo]:
        """Every class that has `base` somewhere in its ancestry (not `base` itself)."""
        result = []
        for infos in self.classes.values():
            for info in infos:
                if info.name != base and any(c.name == base for c in self.mro(info)[1:]):
                    result.append(info)
        return sorted(result, key=lambda c: (c.path, c.line))

    def origin(self, func: FuncRef, name: str) -> str | None:
        """Where the class or function `name` used in `func` comes from, as `module.name`: an
        import in the function's body or at its module's top (`from ..x import C`, relative
        imports read from the module's place in the tree), or a class its module defines. Two
        uses name the same object when one origin ends the other (an absolute import names the
        package above the scanned folder): see same_origin. None: not found."""
        if "." in name:
            return None
        module_parts = func.path.removesuffix(".py").split("/")
        package = module_parts[:-1]
        for stmt in [*func.node.body, *func.module.tree.body]:
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) != name:
                        continue
                    if stmt.level:
                        base = package[:len(package) - (stmt.level - 1)] if stmt.level - 1 <= len(package) else None
                        if base is None:
                            return None
                        return ".".join([*base, *(stmt.module.split(".") if stmt.module else []), alias.name])
                    return f"{stmt.module}.{alias.name}" if stmt.module else None
            elif isinstance(stmt, ast.ClassDef) and stmt.name == name and stmt in func.module.tree.body:
                return ".".join([*module_parts, name])
        return None

    def resolve_function(self, name: str, near: str) -> FuncRef | None:
        """A module-level function called by bare name from file `near`."""
        own = self.module_functions.get(near, {})
        if name in own:
            return own[name]
        imported = self.imports.get(near, {}).get(name)
        if imported is not None:
            candidates = self.functions.get(imported, [])
            if len(candidates) >= 1:
                return candidates[0]
        return None

    def module_constant(self, name: str, near: str) -> ast.expr | None:
        """The value of a module-level constant used by bare name in file `near` (or imported)."""
        own = self.constants.get(near, {})
        if name in own:
            return own[name]
        imported = self.imports.get(near, {}).get(name)
        if imported is not None:
            found = [c[imported] for c in self.constants.values() if imported in c]
            if len(found) == 1:
                return found[0]
        return None

    def all_functions(self) -> list[FuncRef]:
        """Every method and module-level function, the located package's first, then by path and line."""
        if self._all_functions is None:
            funcs: list[FuncRef] = []
            for infos in self.classes.values():
                for info in infos:
                    funcs.extend(info.methods.values())
            for refs in self.functions.values():
                funcs.extend(refs)
            self._all_functions = sorted(funcs, key=lambda f: (not self.in_root(f.path), f.path, f.line))
        return self._all_functions

    def nodes_in(self, func: FuncRef, types: tuple[type, ...]) -> list:
        """The nodes of these types in a function (nested functions included), in `ast.walk`
        order; kept, as the model asks the same functions the same questions for every sender."""
        key = (id(func.node), types)
        found = self._nodes.get(key)
        if found is None:
            buckets = self._by_type.get(id(func.node))
            if buckets is None:  # one pass per function: its nodes by exact type, with their walk positions
                buckets = self._by_type[id(func.node)] = {}
                for at, node in enumerate(walk(func.node)):
                    buckets.setdefault(type(node), []).append((at, node))
            picked = [bucket for kind, bucket in buckets.items() if issubclass(kind, types)]  # isinstance's answer
            if len(picked) == 1:
                found = [node for _, node in picked[0]]
            else:
                found = [node for _, node in sorted((pair for bucket in picked for pair in bucket), key=_position)]
            self._nodes[key] = found
        return found

    def assignments(self, module: ParsedModule) -> list[ast.Assign | ast.AnnAssign]:
        """The assignments (plain and annotated) anywhere in a module, in `ast.walk` order; kept,
        as more than one question about where a queue is bound scans every file for them."""
        found = self._assignments.get(module.source.path)
        if found is None:
            found = self._assignments[module.source.path] = [
                node for node in walk(module.tree) if type(node) is ast.Assign or type(node) is ast.AnnAssign]
        return found

    def calls_in(self, func: FuncRef) -> list[ast.Call]:
        """The calls in a function (nested functions included), in `ast.walk` order."""
        return self.nodes_in(func, (ast.Call,))

    def local_names(self, func: FuncRef) -> set[str]:
        """Names the function binds itself (parameters and assignments): never module constants."""
        found = self._locals.get(id(func.node))
        if found is None:
            node = func.node
            found = {a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs}
            found |= {n.id for n in self.nodes_in(func, (ast.Name,)) if isinstance(n.ctx, ast.Store)}
            self._locals[id(func.node)] = found
        return found

    def callers(self, name: str) -> list[tuple[FuncRef, ast.Call]]:
        """(function, call) for every call of `name(...)` or `<anything>.name(...)` in the tree,
        in all_functions order, then calls_in order. Only functions whose lines hold the name
        as text are walked (a call of it names it there)."""
        found = self._callers.get(name)
        if found is None:
            found = []
            for func in self.all_functions():
                if not self._mentions(func, name):
                    continue
                for call in self.calls_in(func):
                    callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
                    if callee == name:
                        found.append((func, call))
            self._callers[name] = found
        return found

    def may_name(self, module: ParsedModule, name: str) -> bool:
        """Whether the module's text may spell the identifier `name`. The parser normalizes
        identifiers (NFKC): a file outside ASCII is searched in its normalized form (an
        identifier lies within a line and ends at a character that composes with nothing)."""
        path = module.source.path
        searched = self._searched.get(path)
        if searched is None:
            text = module.source.text or ""
            searched = self._searched[path] = text if text.isascii() else unicodedata.normalize("NFKC", text)
        return holds_text(module.lines, searched, name)

    def _mentions(self, func: FuncRef, name: str) -> bool:
        """Whether the function's lines (its decorators' included, as ast.walk visits them) hold `name`."""
        key = (func.path, name)
        lines = self._name_lines.get(key)
        if lines is None:
            # The parser normalizes identifiers (NFKC): a line outside ASCII may spell it otherwise.
            lines = self._name_lines[key] = [at for at, line in enumerate(func.module.lines, 1)
                                             if name in line or (not line.isascii()
                                                                 and name in unicodedata.normalize("NFKC", line))] \
                if self.may_name(func.module, name) else []
        node = func.node
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        at = bisect.bisect_left(lines, start)
        return at < len(lines) and lines[at] <= (node.end_lineno or node.lineno)

    def cst(self, func: FuncRef) -> CstFunction | None:
        key = id(func.node)
        if key not in self._cst:
            parsed = parse_function_cst(func.module, func.node)
            why = too_deep_for_cst(func.node) if parsed is None else None
            if why is not None:  # the file is not analysed: a mark the pipeline collects (self.marks)
                self.marks.append(FileMark(func.module.source.path, "skipped", why))
            self._cst[key] = parsed
        return self._cst[key]


def holds_text(lines: list[str], text: str, part: str) -> bool:
    """Whether one of `lines` (the lines of `text`) holds `part`: one C-speed search of the text
    when no line break can split `part`, else line by line."""
    if "\n" in part or "\r" in part:
        return any(part in line for line in lines)
    return part in text


def _position(pair: tuple[int, ast.AST]) -> int:
    return pair[0]


def _c3_or(fallback: list[ClassInfo], index: Index, cls: ClassInfo) -> list[ClassInfo]:
    """Python's C3 MRO when it exists for the classes we can see, else the DFS order."""

    def linearize(c: ClassInfo, depth: int) -> list[ClassInfo] | None:
        if depth > 50:
            return None
        bases = [b for b in (index.resolve_class(n, near=c.path) for n in c.base_names) if b is not None]
        seqs = []
        for b in bases:
            lin = linearize(b, depth + 1)
            if lin is None:
                return None
            seqs.append(list(lin))
        seqs.append(list(bases))
        result = [c]
        while True:
            seqs = [s for s in seqs if s]
            if not seqs:
                return result
            for seq in seqs:
                head = seq[0]
                if not any(head in s[1:] for s in seqs):
                    break
            else:
                return None
            result.append(head)
            for s in seqs:
                if s and s[0] is head:
                    s.pop(0)

    lin = linearize(cls, 0)
    return lin if lin is not None else fallback


def functions_given_self(index: Index, classes: list[ClassInfo]) -> list[tuple[FuncRef, str]]:
    """(module function, its parameter that receives the object) for calls `f(..., self, ...)`
    in the classes' methods."""
    found: list[tuple[FuncRef, str]] = []
    for cls in classes:
        for method in cls.methods.values():
            for node in index.calls_in(method):
                if not isinstance(node.func, ast.Name):
                    continue
                at = next((i for i, a in enumerate(node.args) if isinstance(a, ast.Name) and a.id == "self"), None)
                func = index.resolve_function(node.func.id, method.path) if at is not None else None
                params = [a.arg for a in func.node.args.posonlyargs + func.node.args.args] if func is not None else []
                if func is not None and at is not None and at < len(params):
                    found.append((func, params[at]))
    return found


def same_origin(a: str | None, b: str | None) -> bool:
    """Whether two origins (Index.origin) name one object: equal, or one ends the other at a
    dot, with a module and a name at least (`managers.schedule_batch.C` is
    `sglang.srt.managers.schedule_batch.C` imported absolutely)."""
    if a is None or b is None or a.count(".") < 1 or b.count(".") < 1:
        return False
    short, long = sorted((a, b), key=len)
    return long == short or long.endswith("." + short)
