"""What ran on a request's sender on its way into the queue, and right after.

A request reaches the queue through an append (`q.append(req)`), or in a list a producer built and
handed over (`q.extend(self.other.pop_ready())`, where `pop_ready` appends each request it lets
through to a local list and returns it). Per way in, one flow over the request's path through the
producer (`producer_flows`): from where it is bound (or its sender last replaced), through the
append, to the end of its iteration. A call of one of the methods that end a state's pin
(`Backend.left_by`: `kv_receiver.init()` starting the waiting clock, `send()` setting the flag
poll() tests) closes a path, directly or in a helper, on both sides of an `if`; a path that leaves
before the append never enters; one that leaves after it unsent skips the call. If every path of
every way in calls one, no request in the queue can be pinned in that state; if some path passes
it by, the pin rests on that path being taken (`send_verdict`). A call that ends no pin but runs on
every path moves poll() past the lines it guards (`init()` setting the flag of its first return):
the pin's chain then cites the lines a request in the queue can reach (`entered_chain`).

Nor can a request be pinned in a state when each way in is guarded by a flag on the request (`if
not req.handshaken: continue`) that code sets only in a drain loop of this host's queues, where
the request's poll() answered a state after which the backend never answers the pinned one again
(`Backend.past`): the answers are read from the paths the drain explored through the test of the
poll value around the store (`answered_before_entry`).

The ways in are followed through the code, never by name: the queue's own wrapper methods
(`add(self, r): self.queue.append(r)`) to their callers, a list handed over to the method that
returns it (through a tuple, `good, failed = ...`), and that list to its appends. When a way in
cannot be followed (a list built by a comprehension, a value of unknown origin), only what
follows each append into the queue counts.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from kvtrace.model import Backend, EventKind, Evidence
from kvtrace.parse import walk
from kvtrace.rules.base import ScanContext
from kvtrace.rules.send_flow import (SEND_SKIPPED, SEND_SKIPPED_ON_THE_WAY_IN, SendFlow, append_at, blocks_of, sender_flow,
                                     function_at, polled_attributes, sender_flows_after_entry)

if TYPE_CHECKING:
    from kvtrace.index import ClassInfo, FuncRef

_ADDS = ("append", "extend", "insert", "appendleft")


@dataclass(frozen=True)
class WayIn:
    """An append of one request (`name`) into the queue, or into a list that reaches it."""

    func: FuncRef
    call: ast.Call
    name: str


def answered_before_entry(ctx: ScanContext, answered: set[str], attrs: set[str]) -> list[Evidence] | None:
    """The flag each way into the queue requires of the request (`if not req.ready: continue`),
    with its line, when every place that sets it runs only where the request's poll() answered
    one of `answered` (in a drain of this host's queues) and its sender (`<request>.<attr>`, attr
    in `attrs`) is never replaced; None when some way in has no such flag, or cannot be
    followed, or there is no way in."""
    ways = ways_in(ctx)
    if not ways or not attrs or not answered:
        return None
    found: list[Evidence] = []
    for way in ways:
        why = _answered_before(ctx, way, answered, attrs)
        if why is None:
            return None
        if why not in found:
            found.append(why)
    return found


def _answered_before(ctx: ScanContext, way: WayIn, answered: set[str], attrs: set[str]) -> Evidence | None:
    """The flag guarding the way in, when every place that sets it runs only for poll answers in
    `answered` and the request's sender is never replaced by another one."""
    guard = _dominating_guard(way)
    if guard is None:
        return None
    flag, line = guard
    if _sender_replaced(ctx, attrs):
        return None
    states = _flag_states(ctx, flag)
    if not states or not states <= answered:
        return None
    return Evidence(way.func.path, line, f"{way.name} enters the queue only with {way.name}.{flag} set, which is set "
                                         f"only once its poll() answered {', '.join(sorted(states))}")


def _dominating_guard(way: WayIn) -> tuple[str, int] | None:
    """(flag, line): the add runs only when `name.<flag>` is true: an earlier statement of a
    block around it leaves when the flag is false (`if not name.flag: continue`), or an `if
    name.flag:` holds it; with neither `name` nor the flag bound again in between."""
    chain = _statement_chain(way.func.node, way.call.lineno)
    if chain is None:
        return None
    levels = list(reversed(chain))
    for level, (block, index) in enumerate(levels):
        holding = block[index]
        if level and isinstance(holding, (ast.For, ast.AsyncFor)) and _binds_target(holding.target, way.name):
            return None
        if level and isinstance(holding, ast.If) and levels[level - 1][0] is holding.body:
            flag = _flag_in(holding.test, way.name, ast.And, negated=False)
            if flag is not None and not any(_rebinds(s, way.name, {flag}) for s in holding.body):
                return flag, holding.test.lineno
        before = block[:index]
        for i in range(len(before) - 1, -1, -1):
            stmt = before[i]
            if isinstance(stmt, ast.If) and not stmt.orelse and stmt.body \
                    and isinstance(stmt.body[-1], (ast.Continue, ast.Break, ast.Return, ast.Raise)):
                flag = _flag_in(stmt.test, way.name, ast.Or, negated=True)
                if flag is not None:
                    later = before[i + 1:] + [holding]
                    if any(_rebinds(s, way.name, {flag}) for s in later):
                        return None
                    return flag, stmt.test.lineno
            if _binds(stmt, way.name):
                return None
    return None


def _flag_in(test: ast.expr, name: str, joined: type[ast.boolop], negated: bool) -> str | None:
    """`name.flag` (or `not name.flag` when negated) as the test or one operand of an `and`
    (`or` when negated): the test holds only if the flag is set (fails whenever it is not)."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, joined) else [test]
    for part in parts:
        if negated:
            if not (isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not)):
                continue
            part = part.operand
        if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == name:
            return part.attr
    return None


def _falsy(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Constant) and not value.value


def _sender_replaced(ctx: ScanContext, attrs: set[str]) -> bool:
    """Some code stores a sender on a request (`req.<attr> = other`) other than dropping it (None)."""
    for module in ctx.index.modules.values():
        for node in ctx.index.assignments(module):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not _falsy(node.value) and any(isinstance(t, ast.Attribute) and t.attr in attrs
                                              and not (isinstance(t.value, ast.Name) and t.value.id == "self")
                                              for t in targets):
                return True
    return False


def _flag_states(ctx: ScanContext, flag: str) -> set[str] | None:
    """The poll answers for which some code sets `<request>.<flag>` to a true value: each such
    store must be in a drain loop of one of this host's queues, on the loop's request, and the
    answers are those of the paths the drain explored through the innermost test of the poll
    value around it (every answer when none is). None when a store is anything else."""
    found: set[str] = set()
    for func, node in _attribute_writes(ctx).get(flag, []):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            return None  # `x.flag += ...`, `setattr(x, "flag", ...)`, built with `flag=...`
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        stored = [t for t in targets if isinstance(t, ast.Attribute) and t.attr == flag]
        if len(stored) != 1 or not isinstance(stored[0].value, ast.Name):
            return None
        states = _states_at_store(ctx, func, node, stored[0].value.id)
        if not states:
            return None
        found |= states
    return found or None


def _attribute_writes(ctx: ScanContext) -> dict[str, list[tuple[FuncRef, ast.AST]]]:
    """attribute name -> the statements and calls in view that can give it a true value: an
    assignment of anything but a false constant, an augmented assignment, a `setattr` naming it,
    a call passing it as a keyword (a constructor); once per index."""
    key = ("way in: attribute writes",)
    cached = ctx.index.derived.get(key)
    if cached is not None:
        return cast("dict[str, list[tuple[FuncRef, ast.AST]]]", cached)
    writes: dict[str, list[tuple[FuncRef, ast.AST]]] = {}
    for func in ctx.index.all_functions():
        for node in _own_nodes(func.node):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and not _falsy(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for attr in dict.fromkeys(t.attr for t in targets if isinstance(t, ast.Attribute)):
                    writes.setdefault(attr, []).append((func, node))
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute):
                writes.setdefault(node.target.attr, []).append((func, node))
            elif isinstance(node, ast.Call):
                if isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(node.args) > 1 \
                        and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    writes.setdefault(node.args[1].value, []).append((func, node))
                for keyword in node.keywords:
                    if keyword.arg is not None and not _falsy(keyword.value):
                        writes.setdefault(keyword.arg, []).append((func, node))
    ctx.index.derived[key] = writes
    return writes


def _states_at_store(ctx: ScanContext, func: FuncRef, store: ast.stmt, name: str) -> set[str] | None:
    for queue in [ctx.queue, *ctx.others]:
        drain = queue.drain
        if drain is None or queue.truncated:
            continue
        loops = [(drain.func, drain.body.line(drain.loop), drain.initial)]
        loops += [(f, body.line(loop), initial) for f, body, loop, initial in drain.then]
        for loop_func, line, initial in loops:
            if loop_func.path != func.path or loop_func.line != func.line or initial.get(name) != "@req":
                continue
            loop = next((n for n in walk(func.node) if isinstance(n, (ast.For, ast.AsyncFor)) and n.lineno == line), None)
            around = _ancestors(loop, store) if loop is not None else None
            if around is None:
                continue
            for test, branch in around:  # innermost first; a test with no CHECK is not about the poll value
                checked = {(s, e.detail) for s, paths in queue.paths.items() for p in paths for e in p.events
                           if e.kind is EventKind.CHECK and e.path == func.path and e.line == test}
                if checked:
                    return {s for s, taken in checked if taken == branch}
            return {s for s, paths in queue.paths.items() if paths}
    return None


def _ancestors(loop: ast.AST, store: ast.stmt) -> list[tuple[int, str]] | None:
    """The `if` tests between the loop and the store, innermost first, with the branch ("T"/"F")
    that holds it; None when the loop does not hold it, or a `match` does."""
    def descend(node: ast.AST, tests: list[tuple[int, str]]) -> list[tuple[int, str]] | None:
        if node is store:
            return tests
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Match)):
            return None
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.If) and child is not node.test:
                branch = "T" if child in node.body else "F"
                found = descend(child, [(node.test.lineno, branch), *tests])
            else:
                found = descend(child, tests)
            if found is not None:
                return found
        return None
    return descend(loop, [])


def send_verdict(ctx: ScanContext, backend: Backend, state: str) -> tuple[str, list[Evidence], str] | None:
    """Whether what the producer runs on the request's way into the queue and right after the
    append (before any drain) takes `state` away: ("gone", why, _) when every path calls a sender
    method after which poll() no longer returns it; ("skipped", why, premise) when some path
    passes that call by (the premise is that such a path is taken); None when the producer calls
    none of them."""
    methods = backend.left_by.get(state)
    if not methods:
        return None
    flows = producer_flows(ctx, set(methods))
    if flows is None:
        return None
    first = flows[0].calls[0]
    why = [methods[first.method], first.at]
    skipped = [f for f in flows if f.skipped]
    if not skipped:
        return "gone", why, ""
    on_the_way_in = any(c.before for f in skipped for c in f.calls)
    return ("skipped", why + list(dict.fromkeys(s for f in skipped for s in f.skips)),
            SEND_SKIPPED_ON_THE_WAY_IN if on_the_way_in else SEND_SKIPPED)


def entered_chain(ctx: ScanContext, backend: Backend, state: str) -> tuple[tuple[Evidence, ...], Evidence] | None:
    """The chain of `state`'s pin as poll() answers it in this queue, when every request enters
    it with a sender method run that moves poll() past the lines of the backend's own chain
    (`Backend.pinned_after`: `init()` set the flag poll()'s first return tests): that chain, and
    the call on the way in. None when no such method runs on every path of every way in."""
    verdict = backend.way_out(state)
    passed = verdict.chain[0] if verdict is not None and verdict.chain else None
    for method, chain in backend.pinned_after.get(state, {}).items():
        flows = producer_flows(ctx, {method})
        if flows is not None and not any(f.skipped for f in flows):
            call = flows[0].calls[0].at
            note = f"every request's way into the queue runs {call.note}"
            if passed is not None and chain and (passed.path, passed.line) != (chain[0].path, chain[0].line):
                # What the call rules out: the line the backend's own chain starts at.
                where = f"line {passed.line}" if backend.poll is not None and passed.path == backend.poll.path \
                    else f"{passed.path}:{passed.line}"
                # The return the call gets past, not the state: poll() still answers it at the
                # chain's first row, the evidence that follows.
                note += f", so {backend.sender}.{ctx.pack.poll_method}() gets past its return of {state} at {where}"
            return chain, Evidence(call.path, call.line, note)
    return None


def producer_flows(ctx: ScanContext, methods: set[str]) -> list[SendFlow] | None:
    """Per way into the queue, one flow over the request's whole path through the producer: from
    where it is bound, through the append, to the end of its iteration. A call of `methods` on its
    sender closes a path; a path that leaves before the append never enters; one that leaves
    after it unsent skips the call. When the ways in cannot be followed: what follows each
    append, as far as it is seen (appends that call none of them ignored). None when a way in
    never calls one of them (a request can enter without it) or none of the appends does."""
    attrs = polled_attributes(ctx)
    if not attrs:
        return None
    ways = ways_in(ctx)
    if not ways:
        flows = [f for f in sender_flows_after_entry(ctx, methods) if f.calls]
        return flows or None
    flows = [_joined(_before_append(ctx, way, attrs, methods), _after_append(ctx, way, attrs, methods)) for way in ways]
    return flows if all(f.calls for f in flows) else None


def _after_append(ctx: ScanContext, way: WayIn, attrs: set[str], methods: set[str]) -> SendFlow:
    located = append_at(way.func.node, way.call.lineno)
    if located is None or located[0] != way.name:
        return SendFlow([], False, True, [])
    return sender_flow(ctx, way.func, located[1], way.name, attrs, methods, 0)


def _before_append(ctx: ScanContext, way: WayIn, attrs: set[str], methods: set[str]) -> SendFlow | None:
    """The paths from the request's binding (or the last store of its sender) to the append:
    the statements before it in each block around it, outermost first. None when the add is not
    found in its function."""
    chain = _statement_chain(way.func.node, way.call.lineno)
    if chain is None:
        return None
    levels: list[list[ast.stmt]] = []
    for level, (block, index) in enumerate(reversed(chain)):
        holding = block[index]
        if level and isinstance(holding, (ast.For, ast.AsyncFor)) and _binds_target(holding.target, way.name):
            break  # the request is bound by this loop
        before = block[:index]
        start = next((i + 1 for i in range(len(before) - 1, -1, -1)
                      if _binds(before[i], way.name) or _rebinds(before[i], way.name, attrs)), None)
        levels.append(before[start or 0:])
        if start is not None:
            break  # bound (or its sender replaced) here: nothing earlier ran on this one
    flow = SendFlow([], False, True, [])
    for stmts in reversed(levels):
        part = sender_flow(ctx, way.func, stmts, way.name, attrs, methods, 0, before=True)
        flow.calls += part.calls
        flow.skips += part.skips
        flow.open_end = flow.open_end and part.open_end
    return flow


def _joined(before: SendFlow | None, after: SendFlow) -> SendFlow:
    """The whole path: a request that got in having passed a call on every path needs nothing
    after; one that may have got in without it goes on to what follows the append."""
    if before is None or not before.calls:
        return after
    if not before.open_end:
        return SendFlow(before.calls, False, False, [])
    return SendFlow(before.calls + after.calls, after.exited, after.open_end, before.skips + after.skips)


def ways_in(ctx: ScanContext) -> list[WayIn] | None:
    """Every append that puts one request into the queue, followed back from the queue's entry
    sites; None when one of them cannot be followed."""
    todo: list[tuple[FuncRef, ast.Call, ast.expr, str]] = []
    for site in ctx.entries:
        func = function_at(ctx, site.path, site.line)
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
    for node in walk(func.node):
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
    for node in walk(func.node):
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
                isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in walk(node)
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
    for node in walk(root):
        if isinstance(node, ast.Call) and node.func is attribute:
            return node
    return None


def _statement_chain(func: ast.AST, line: int) -> list[tuple[list[ast.stmt], int]] | None:
    """(block, index) from the function's body down to the statement holding `line` at each level."""
    chain: list[tuple[list[ast.stmt], int]] = []
    body: list[ast.stmt] | None = getattr(func, "body", None)
    while body:
        for i, stmt in enumerate(body):
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                chain.append((body, i))
                body = next((b for b in blocks_of(stmt) if b and b[0].lineno <= line <= (b[-1].end_lineno or 0)), None)
                break
        else:
            return chain or None
    return chain or None


def _binds(stmt: ast.stmt, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in walk(stmt))


def _binds_target(target: ast.expr, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in walk(target))


def _rebinds(stmt: ast.stmt, name: str, attrs: set[str]) -> bool:
    """`name` or `name.<attr>` bound again (the add itself binds neither)."""
    for n in walk(stmt):
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store):
            return True
        if isinstance(n, ast.Attribute) and n.attr in attrs and isinstance(n.ctx, ast.Store) \
                and isinstance(n.value, ast.Name) and n.value.id == name:
            return True
    return False
