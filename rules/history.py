"""Which of a sender's methods can have run on it while its request waits in a queue.

A request's sender goes through stages: it is built, a queue's drain polls it, later code sends
on it. While the request waits in a queue whose entry builds a fresh sender right before the
append (the prefill bootstrap queue: `req.sender = SenderClass(...)`, then `self.queue.append(req)`),
only the constructor and the calls that code in reach of that queue makes can have run: the entry
function, the queue's drain and the helpers it goes through, a loop over the queue elsewhere (an
abort), and what those methods call on `self`. An attribute that only a later stage's method
writes (`self.has_sent = True` in send()) still holds the constructor's value there, so a guard
of poll() on it (`if not self.has_sent: return ...`) decides the same way on every poll.

A queue whose requests may come with a sender from before (another entry, a re-entry that does
not build one, an append kvtrace cannot tie to a request) has no such history: None.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtrace.model import Evidence
from kvtrace.parse import walk
from kvtrace.rules.base import ScanContext
from kvtrace.rules.send_flow import append_at, blocks_of, bound_param, function_at, polled_attributes

if TYPE_CHECKING:
    from kvtrace.index import ClassInfo, FuncRef

_APPENDS = ("append", "extend", "insert", "appendleft")
_HELPER_DEPTH = 2  # self.<helper>(...) calls followed from the places in reach of the queue


@dataclass(frozen=True)
class History:
    """The methods (by name) that can have run on a queued request's sender, and why the
    sender comes with no other: where each entry builds it before the append."""

    methods: frozenset[str]
    built: tuple[Evidence, ...]


def sender_history(ctx: ScanContext, sender: ClassInfo) -> History | None:
    """What can have run on `sender` while its request is in ctx's queue; None when its
    requests may bring a sender that ran anything before they entered (once per queue and
    sender: several rules ask)."""
    key = ("sender history", ctx.pack.queue, id(ctx.queue), id(sender.node))
    if key not in ctx.index.derived:
        ctx.index.derived[key] = _sender_history(ctx, sender)
    return ctx.index.derived[key]


def _sender_history(ctx: ScanContext, sender: ClassInfo) -> History | None:
    drain = ctx.queue.drain
    attrs = polled_attributes(ctx)
    if drain is None or not attrs or not ctx.entries or _untied_appends(ctx, drain.list_attr):
        return None
    built: list[Evidence] = []
    places: list[tuple[FuncRef, str | None]] = []  # (function, the request's name in it, None: any receiver)
    for site in ctx.entries:
        func = function_at(ctx, site.path, site.line)
        if func is not None and _holder_method_call(ctx, func, site.line):
            continue  # the holder's own method (`bootstrap_queue.extend(reqs)`): its appends are entries of their own
        located = append_at(func.node, site.line) if func is not None else None
        if func is None or located is None:
            return None
        name = located[0]
        at = _built_before(func.node.body, site.line, name, attrs)
        if at is None:
            return None  # this entry may append a request whose sender has a past
        built.append(Evidence(func.path, at, f"{func.qualname}() builds the request's {ctx.pack.kv_object} before it appends "
                                             f"it to {ctx.pack.queue} (line {site.line})"))
        places.append((func, None))
    if not built:
        return None
    functions = {f.qualname: f for f in ctx.index.all_functions()}
    drained = {drain.func.qualname} | {e.function for paths in ctx.queue.paths.values() for p in paths
                                        for e in p.events if e.function}
    places += [(functions[q], None) for q in sorted(drained) if q in functions]
    called: set[str] = set()
    for func, _ in places:
        called |= _methods_called(ctx, func, 0)
    called |= _calls_in_loops_over_queue(ctx)
    methods = _sender_methods(ctx, sender)
    # A method no code in view calls on a sender may be called from anywhere: it may have run.
    unseen = {m for m in methods if not _called_anywhere(ctx, m, attrs)}
    always = {ctx.pack.poll_method, ctx.pack.abort_method} | {m for m in methods if m.startswith("__")}
    ran = _closure(ctx, sender, (called & methods) | unseen | always)
    return History(frozenset(ran), tuple(built))


def _built_before(body: list[ast.stmt], line: int, name: str, attrs: set[str]) -> int | None:
    """The line of `name.<attr> = <call>` (attr: a sender attribute the drain polls) on every
    path to the append at `line`: a statement before it in its block or an enclosing one."""
    seen: int | None = None
    for stmt in body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            if isinstance(stmt, ast.Expr) and stmt.lineno == line:
                return seen
            for block in blocks_of(stmt):
                inner = _built_before(block, line, name, attrs)
                if inner is not None or any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in block):
                    return inner if inner is not None else seen
            return seen
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and any(
                isinstance(t, ast.Attribute) and t.attr in attrs and isinstance(t.value, ast.Name)
                and t.value.id == name for t in stmt.targets):
            seen = stmt.lineno
    return seen


def _holder_method_call(ctx: ScanContext, func: FuncRef, line: int) -> bool:
    """Whether the entry at `line` calls a method of the object that holds the queue's list
    (`self.<queue>.extend(reqs, ...)` on a class that defines `extend`), not a list's append."""
    drain = ctx.queue.drain
    if drain is None or not drain.list_attr or drain.cls is None:
        return False
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.lineno == line
               and node.func.attr in _APPENDS and isinstance(node.func.value, ast.Attribute)
               and node.func.value.attr == ctx.pack.queue
               and ctx.index.find_method(drain.cls, node.func.attr) is not None
               for node in walk(func.node))


def _untied_appends(ctx: ScanContext, list_attr: str | None) -> bool:
    """An append to the queue's list through its holder (`sched.<queue>.<list>.append(req)`):
    no entry site of its own, so nothing says what that request's sender has done."""
    if not list_attr:
        return False
    key = ("untied appends", ctx.pack.queue, list_attr)  # the same for every sender: walked once per queue
    if key not in ctx.index.derived:
        ctx.index.derived[key] = _appends_through_holder(ctx, f"{ctx.pack.queue}.{list_attr}")
    return ctx.index.derived[key]


def _appends_through_holder(ctx: ScanContext, wanted: str) -> bool:
    last = wanted.rsplit(".", 1)[-1]
    for module in ctx.index.modules.values():
        if wanted not in (module.source.text or ""):
            continue
        for node in walk(module.tree):
            # Only an attribute's text ends in `.<list>`: the test before unparse is the cheap half of it.
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _APPENDS \
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == last \
                    and ast.unparse(node.func.value).endswith(wanted):
                return True
    return False


def _methods_called(ctx: ScanContext, func: FuncRef, depth: int) -> set[str]:
    """Every `<x>.m(...)` method name called in `func` (any receiver: a call through a local
    alias of the sender counts too), and in the `self.<helper>(...)` it calls."""
    names: set[str] = set()
    for node in walk(func.node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            names.add(node.func.attr)
            if depth < _HELPER_DEPTH and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" \
                    and func.owner is not None:
                helper = ctx.index.find_method(func.owner, node.func.attr)
                if helper is not None and helper is not func:
                    names |= _methods_called(ctx, helper, depth + 1)
    return names


def _calls_in_loops_over_queue(ctx: ScanContext) -> set[str]:
    """The calls made in loops over the queue anywhere in view (`for req in self.<queue>.queue:
    req.sender.abort()`), and in the helpers such a loop hands the request to."""
    names: set[str] = set()
    for func in ctx.index.all_functions():
        module = ctx.index.modules.get(func.path)
        if module is None or ctx.pack.queue not in (module.source.text or ""):
            continue
        for node in walk(func.node):
            if isinstance(node, (ast.For, ast.AsyncFor)) and ctx.pack.queue in ast.unparse(node.iter):
                target = node.target.id if isinstance(node.target, ast.Name) else None
                inside: list[ast.AST] = list(node.body)
            elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) \
                    and any(ctx.pack.queue in ast.unparse(g.iter) for g in node.generators):
                target, inside = None, [node]
            else:
                continue
            for stmt in inside:
                for inner in walk(stmt):
                    if not (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)):
                        continue
                    names.add(inner.func.attr)
                    helper = ctx.index.find_method(func.owner, inner.func.attr) \
                        if func.owner is not None and isinstance(inner.func.value, ast.Name) \
                        and inner.func.value.id == "self" else None
                    if helper is not None and target is not None and bound_param(helper, inner, target):
                        names |= _methods_called(ctx, helper, 1)
    return names


def _sender_methods(ctx: ScanContext, sender: ClassInfo) -> set[str]:
    return {name for c in ctx.index.mro(sender) for name in c.methods}


def _called_anywhere(ctx: ScanContext, method: str, attrs: set[str]) -> bool:
    """Whether code in view calls `method` on a request's sender (`<x>.<attr>.method(...)`) or
    on `self` inside a class (a sender calling its own method)."""
    for _, call in ctx.index.callers(method):
        recv = call.func.value if isinstance(call.func, ast.Attribute) else None
        if isinstance(recv, ast.Attribute) and recv.attr in attrs:
            return True
        if isinstance(recv, ast.Name) and recv.id == "self":
            return True
    return False


def _closure(ctx: ScanContext, sender: ClassInfo, names: set[str]) -> set[str]:
    """`names` and every method of the sender they call on `self` (any implementation in the
    MRO: super() chains reach them all), until nothing new."""
    own = _sender_methods(ctx, sender)
    ran = set(names)
    todo = list(names)
    while todo:
        name = todo.pop()
        for c in ctx.index.mro(sender):
            func = c.methods.get(name)
            if func is None:
                continue
            for node in walk(func.node):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in own and node.func.attr not in ran:
                    ran.add(node.func.attr)
                    todo.append(node.func.attr)
    return ran
