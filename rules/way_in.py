"""What ran on a request's sender on its way into the queue.

A request reaches the queue through an append (`q.append(req)`), or in a list a producer built and
handed over (`q.extend(self.other.pop_ready())`, where `pop_ready` appends each request it lets
through to a local list and returns it). A call on the request's sender that runs on every path to
such an append (it dominates it: an earlier statement of the same block, or of a block around it,
since the request was bound) has run before the request is ever polled in the queue. If one of
the calls that end a state's pin (`Backend.left_by`: `kv_receiver.init()` starting the waiting
clock or setting the flag poll() tests) dominates every way in, no request in the queue can be
pinned in that state.

The ways in are followed through the code, never by name: the queue's own wrapper methods
(`add(self, r): self.queue.append(r)`) to their callers, a list handed over to the method that
returns it (through a tuple, `good, failed = ...`), and that list to its appends. A way in that
cannot be followed (a list built by a comprehension, a value of unknown origin) makes no claim.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtrace.model import Evidence
from kvtrace.rules.base import ScanContext
from kvtrace.rules.premise import _blocks, _function_at

if TYPE_CHECKING:
    from kvtrace.index import ClassInfo, FuncRef

_ADDS = ("append", "extend", "insert", "appendleft")


@dataclass(frozen=True)
class WayIn:
    """An append of one request (`name`) into the queue, or into a list that reaches it."""

    func: FuncRef
    call: ast.Call
    name: str


def ran_before_entry(ctx: ScanContext, methods: set[str], attrs: set[str]) -> list[Evidence] | None:
    """The call of one of `methods` on `<request>.<attr>` (attr in `attrs`, the sender's
    attributes the drain polls) that dominates each way into the queue, with its line; None when
    some way in has none, or cannot be followed, or there is no way in."""
    ways = ways_in(ctx)
    if not ways or not methods or not attrs:
        return None
    found: list[Evidence] = []
    for way in ways:
        call = _dominating_call(way, methods, attrs)
        if call is None:
            return None
        if call not in found:
            found.append(call)
    return found


def ways_in(ctx: ScanContext) -> list[WayIn] | None:
    """Every append that puts one request into the queue, followed back from the queue's entry
    sites; None when one of them cannot be followed."""
    todo: list[tuple[FuncRef, ast.Call, ast.expr, str]] = []
    for site in ctx.entries:
        func = _function_at(ctx, site.path, site.line)
        call = _add_call_at(func, site.line) if func is not None else None
        if func is None or call is None or not call.args:
            return None
        assert isinstance(call.func, ast.Attribute)  # _add_call_at found `<...>.append(...)`
        todo.append((func, call, call.args[-1], call.func.attr))
    seen: set[tuple[str, int, str]] = set()
    ways: list[WayIn] = []
    while todo:
        func, call, element, kind = todo.pop()
        if (func.path, call.lineno, kind) in seen:
            continue
        seen.add((func.path, call.lineno, kind))
        if isinstance(element, ast.Name) and func.owner is not None and element.id in _parameters(func)[1:]:
            # A method adding what its caller passes: each call of it is a way in.
            callers = _callers_passing(ctx, func, element.id)
            if callers is None or not callers and _adds_to_queue(ctx, call):
                return None  # a helper of the scheduler's with no caller in view: not followed
            todo.extend((f, c, arg, kind) for f, c, arg in callers)
            continue
        if kind == "extend":
            handed = _handed_over(ctx, func, element, call.lineno)
            if handed is None:
                return None
            ways.extend(handed)
        elif isinstance(element, ast.Name):
            ways.append(WayIn(func, call, element.id))
        else:
            return None
    return ways


def _add_call_at(func: FuncRef, line: int) -> ast.Call | None:
    for node in ast.walk(func.node):
        if isinstance(node, ast.Call) and node.lineno == line and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _ADDS:
            return node
    return None


def _parameters(func: FuncRef) -> list[str]:
    args = func.node.args
    return [a.arg for a in args.posonlyargs + args.args]


def _adds_to_queue(ctx: ScanContext, call: ast.Call) -> bool:
    """`<...>.<queue>.append(...)`: the queue attribute itself (a scheduler's helper), not the
    list the queue object holds (`self.queue` in the queue's own class)."""
    recv = call.func.value if isinstance(call.func, ast.Attribute) else None
    return isinstance(recv, ast.Attribute) and recv.attr == ctx.pack.queue


def _callers_passing(ctx: ScanContext, method: FuncRef, param: str) -> list[tuple[FuncRef, ast.Call, ast.expr]] | None:
    """Each call of `method` in view (`self.<method>(...)` in its class's code, or
    `<...>.<queue>.<method>(...)`) with the argument it passes for `param`; None when one
    passes it in a way not followed (`*args`, `**kwargs`)."""
    position = _parameters(method).index(param) - 1
    holder = {c.name for c in ctx.index.mro(method.owner)} if method.owner is not None else set()
    found: list[tuple[FuncRef, ast.Call, ast.expr]] = []
    for func in ctx.index.all_functions():
        for node in ctx.index.calls_in(func):
            if not isinstance(node.func, ast.Attribute) or node.func.attr != method.name:
                continue
            recv = node.func.value
            on_queue = isinstance(recv, ast.Attribute) and recv.attr == ctx.pack.queue
            on_self = isinstance(recv, ast.Name) and recv.id == "self" and func.owner is not None \
                and bool(holder & {c.name for c in ctx.index.mro(func.owner)})
            if not (on_queue or on_self):
                continue
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                return None
            passed = node.args[position] if position < len(node.args) else \
                next((k.value for k in node.keywords if k.arg == param), None)
            if passed is None:
                return None
            found.append((func, node, passed))
    return found


def _handed_over(ctx: ScanContext, func: FuncRef, element: ast.expr, line: int) -> list[WayIn] | None:
    """The appends that fill the list `element` names at `line` in `func`: the method call that
    bound it (its only binding in `func`), followed into each method of that name in view."""
    if not isinstance(element, ast.Name):
        return None
    bound = _only_binding(func, element.id)
    if bound is None or bound[0].lineno >= line:
        return None
    value, position = bound
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return None
    name = value.func.attr
    recv = value.func.value
    classes: list[ClassInfo] | None
    if isinstance(recv, ast.Name) and recv.id == "self" and func.owner is not None:
        classes = [func.owner]
    elif isinstance(recv, ast.Attribute):
        classes = _bound_classes(ctx, recv.attr)
    else:
        return None
    if classes is None:  # bound nowhere in view (a folder scan): each method of that name in view
        producers = [f for f in ctx.index.all_functions() if f.owner is not None and f.name == name]
    else:
        methods = [ctx.index.find_method(c, name) for c in classes]
        producers = [f for f in methods if f is not None]
        if len(producers) < len(methods):
            return None
    if not producers:
        return None
    ways: list[WayIn] = []
    for producer in producers:
        appends = _returned_list_appends(producer, position)
        if appends is None:
            return None
        ways.extend(appends)
    return ways


def _bound_classes(ctx: ScanContext, attr: str) -> list[ClassInfo] | None:
    """The classes whose instances `<...>.<attr> = Class(...)` binds anywhere in view; None when
    nothing in view binds the attribute, [] when something binds it to a value of no known class."""
    bound: list[ClassInfo] = []
    seen = False
    for module in ctx.index.modules.values():
        if attr not in (module.source.text or ""):
            continue
        for node in ctx.index.assignments(module):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not any(isinstance(t, ast.Attribute) and t.attr == attr for t in targets) or node.value is None:
                continue
            seen = True
            value = node.value
            cls = ctx.index.resolve_class(value.func.id, module.source.path) \
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else None
            if cls is None:
                return []
            if cls not in bound:
                bound.append(cls)
    return bound if seen else None


def _only_binding(func: FuncRef, name: str) -> tuple[ast.expr, int | None] | None:
    """The value bound to `name` by the function's only assignment to it (with the name's place
    in a tuple target), None if it is bound otherwise or more than once."""
    found: list[tuple[ast.expr, int | None]] = []
    for node in ast.walk(func.node):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == name:
                found.append((node.value, None))
            elif isinstance(target, (ast.Tuple, ast.List)):
                for i, elt in enumerate(target.elts):
                    if isinstance(elt, ast.Name) and elt.id == name:
                        parts = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else None
                        # `a, b = [], []` binds each name to its own part; `a, b = f()` to a place in a result
                        found.append((parts[i], None) if parts is not None and len(parts) == len(target.elts)
                                     else (node.value, i))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.With, ast.NamedExpr)) and any(
                isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(node)
                if n is not getattr(node, "value", None)):
            return None
    if len(found) != 1:
        return None
    value, position = found[0]
    return (value, position) if hasattr(value, "lineno") else None


def _returned_list_appends(func: FuncRef, position: int | None) -> list[WayIn] | None:
    """The appends into the list `func` returns (element `position` of a returned tuple): a local
    list made empty and filled only by `.append(name)`; None when it is anything else."""
    lists: set[str] = set()
    for node in _own_nodes(func.node):
        if isinstance(node, ast.Return):
            value = node.value
            if position is not None:
                if not isinstance(value, ast.Tuple) or position >= len(value.elts):
                    return None
                value = value.elts[position]
            if not isinstance(value, ast.Name):
                return None
            lists.add(value.id)
    if not lists:
        return None
    ways: list[WayIn] = []
    for name in lists:
        bound = _only_binding(func, name)
        if bound is None or not (isinstance(bound[0], ast.List) and not bound[0].elts) or bound[1] is not None:
            return None
        for node in _own_nodes(func.node):
            if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "len") and any(
                    isinstance(a, ast.Name) and a.id == name for a in [*node.args, *(k.value for k in node.keywords)]):
                return None  # the list passed on: what the callee adds to it is not followed
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name:
                call = _called(func.node, node)
                if call is None or node.attr != "append" or not call.args or not isinstance(call.args[0], ast.Name):
                    return None  # the list used otherwise (extended, passed on): not followed
                ways.append(WayIn(func, call, call.args[0].id))
    return ways


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """The nodes of a function, not those of functions or classes defined in it."""
    found = []
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        found.append(child)
        todo.extend(ast.iter_child_nodes(child))
    return found


def _called(root: ast.AST, attribute: ast.Attribute) -> ast.Call | None:
    for node in ast.walk(root):
        if isinstance(node, ast.Call) and node.func is attribute:
            return node
    return None


def _dominating_call(way: WayIn, methods: set[str], attrs: set[str]) -> Evidence | None:
    """A call `<name>.<attr>.<method>(...)` made by a statement that runs on every path to the
    add since `name` was bound, with neither `name` nor `name.<attr>` bound again after it."""
    chain = _statement_chain(way.func.node, way.call.lineno)
    if chain is None:
        return None
    for level, (block, index) in enumerate(reversed(chain)):
        holding = block[index]
        if level and isinstance(holding, (ast.For, ast.AsyncFor)) and _binds_target(holding.target, way.name):
            return None  # the request is bound by this loop: nothing before it ran on this one
        before = block[:index]
        for i in range(len(before) - 1, -1, -1):
            stmt = before[i]
            call = _sender_call(stmt, way.name, methods, attrs)
            if call is not None:
                later = before[i + 1:] + [holding]
                if any(_rebinds(s, way.name, attrs) for s in later):
                    return None
                return Evidence(way.func.path, call.lineno,
                                f"{ast.unparse(call.func)}() runs before {way.name} enters the queue "
                                f"({way.func.path}:{way.call.lineno})")
            if _binds(stmt, way.name):
                return None  # the request was bound here: nothing earlier ran on it
    return None


def _statement_chain(func: ast.AST, line: int) -> list[tuple[list[ast.stmt], int]] | None:
    """(block, index) from the function's body down to the statement holding `line` at each level."""
    chain: list[tuple[list[ast.stmt], int]] = []
    body: list[ast.stmt] | None = getattr(func, "body", None)
    while body:
        for i, stmt in enumerate(body):
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                chain.append((body, i))
                body = next((b for b in _blocks(stmt) if b and b[0].lineno <= line <= (b[-1].end_lineno or 0)), None)
                break
        else:
            return chain or None
    return chain or None


def _sender_call(stmt: ast.stmt, name: str, methods: set[str], attrs: set[str]) -> ast.Call | None:
    """The statement is the call itself (`name.attr.method(...)`, or its value assigned): it runs
    whenever the statement does."""
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if isinstance(value, ast.Await):
        value = value.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in methods:
        recv = value.func.value
        if isinstance(recv, ast.Attribute) and recv.attr in attrs and isinstance(recv.value, ast.Name) \
                and recv.value.id == name:
            return value
    return None


def _binds(stmt: ast.stmt, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(stmt))


def _binds_target(target: ast.expr, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))


def _rebinds(stmt: ast.stmt, name: str, attrs: set[str]) -> bool:
    """`name` or `name.<attr>` bound again (the add itself binds neither)."""
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store):
            return True
        if isinstance(n, ast.Attribute) and n.attr in attrs and isinstance(n.ctx, ast.Store) \
                and isinstance(n.value, ast.Name) and n.value.id == name:
            return True
    return False
