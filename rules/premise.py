"""What a drain-side verdict rests on when it is not unconditional.

A status table that a request's own code never sends back to a state (or never empties while the
request is queued) can still be sent back by a second request that shares its room: a second
sender built for the same room stores its opening state again, and its clear() takes the room
out. Such a verdict is true only if two requests share a bootstrap_room (sglang#25063, #27643);
the finding says so and is a warning, so that a gate on errors counts only what needs no premise.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtrace.model import Backend, Evidence, PremiseKind, StateVerdict
from kvtrace.parse import walk
from kvtrace.rules.base import ScanContext
from kvtrace.rules.history import sender_history
from kvtrace.rules.send_flow import polled_attributes
from kvtrace.rules.way_in import answered_before_entry

if TYPE_CHECKING:
    from kvtrace.index import ClassInfo, FuncRef, Index

SHARED_ROOM = "two requests share a bootstrap_room"


@dataclass(frozen=True)
class Premise:
    text: str  # what must hold for the finding to be true
    kind: PremiseKind | None  # what it is about (None: several, see `parts`)
    why: list[Evidence]  # the links that show it is needed
    parts: tuple["Premise", ...] = ()  # several premises that must all hold (see `joined`)

    @property
    def kinds(self) -> tuple[PremiseKind, ...]:
        return tuple(dict.fromkeys(p.kind for p in (self.parts or (self,)) if p.kind is not None))


def clause(premise: Premise) -> str:
    """What the message says of the premise: each part with the reason it is needed."""
    return "; ".join(f"true only if {p.text}: " + p.why[-1].note.removeprefix("premise: ")
                     for p in (premise.parts or (premise,)))


def state_premise(ctx: ScanContext, backend: Backend, state: str) -> Premise | None:
    """A state the backend's poll() returns only from the status table, that only its sender's
    constructor stores there, reaches this queue's drain only with a second sender for the room:
    a request enters the queue only once its poll moved past it (the pack's `entered_past`)."""
    if state in ctx.pack.reached_later(ctx.pack.queue):
        at = backend.poll or backend
        return Premise(SHARED_ROOM, PremiseKind.SHARED_ROOM, [Evidence(at.path, at.line, f"premise: a request leaves {ctx.pack.queue} before its "
                                              f"KV is sent, and its own {ctx.pack.kv_object} reaches {state} only after that, so "
                                              f"{state} seen here is another request's, for the same room")])
    where = backend.constructor_only.get(state)
    if where is None:
        return None
    if state in ctx.pack.left_before(ctx.pack.queue):
        return Premise(SHARED_ROOM, PremiseKind.SHARED_ROOM, [
            where,
            Evidence(where.path, where.line, f"premise: a request enters {ctx.pack.queue} only after its poll left "
                                             f"{state}, so {state} comes back only when a second {ctx.pack.kv_object} for "
                                             "the same room is built"),
        ])
    # Read from the code: every way in requires a flag set only where poll() answered another
    # state, read from the table, so the table had moved off this one.
    moved = set(backend.from_table) - {state}
    flags = answered_before_entry(ctx, moved, polled_attributes(ctx)) if moved else None
    if flags is None:
        return None
    table = backend.manager.table if backend.manager is not None and backend.manager.table else "the status table"
    return Premise(SHARED_ROOM, PremiseKind.SHARED_ROOM, [
        where, *flags,
        Evidence(where.path, where.line, f"premise: a request enters {ctx.pack.queue} only after its poll() answered "
                                         f"another state read from {table}, so {state} comes back only when a second "
                                         f"{backend.sender} for the same room is built"),
    ])


def absent_room_premise(ctx: ScanContext, backend: Backend, verdict: StateVerdict) -> Premise | None:
    """A verdict read with the room absent from the table, when the constructor always stores the
    room and the only code that takes it out is a method of the request's own sender that the
    scheduler calls only from the drain (as the request concludes): while the request is queued,
    only another request's sender for the same room can take it out."""
    manager = backend.manager
    drain = ctx.queue.drain
    if not verdict.absent_room or backend.unborn is not None or manager is None or drain is None \
            or not manager.clear_methods:
        return None
    sender_classes = _sender_classes(ctx, backend)
    sender_attrs = polled_attributes(ctx)
    if not sender_attrs:
        return None
    why: list[Evidence] = []
    history = _history(ctx, backend)
    for qualname in manager.clear_methods:
        owner, _, method = qualname.rpartition(".")
        if owner not in sender_classes:
            return None  # the manager takes the room out itself: it may be this request's
        calls = [(caller, call) for caller, call in ctx.index.callers(method)
                 if isinstance(call.func, ast.Attribute) and _last_attr(call.func.value) in sender_attrs]
        if history is not None and method not in history.methods:
            # Only a later stage calls it: this request's own sender has not run it while queued here.
            why += [Evidence(caller.path, call.lineno, f"premise: {qualname}() is called on a request's {ctx.pack.kv_object} only "
                                                       f"here, after the request left {ctx.pack.queue}")
                    for caller, call in calls] + list(history.built)
            continue
        entered = _drain_functions(ctx)
        for caller, call in calls:
            if caller.qualname in entered:
                why.append(Evidence(caller.path, call.lineno, f"premise: {qualname}() is called on a queued request's "
                                                              f"{ctx.pack.kv_object} only here, in the drain, as the request concludes"))
                continue
            handed = _handed_over(ctx, caller, entered)
            if handed is None:
                return None
            why.append(Evidence(caller.path, call.lineno, f"premise: {qualname}() is called here only on requests the "
                                                          f"drain took out of its queue and put in {handed}"))
    # Cited at the loop that polls the queued request, where "while the request is queued" holds.
    why.append(Evidence(drain.func.path, drain.body.line(drain.loop),
                        f"premise: while the request is queued, only another request's {ctx.pack.kv_object} for the "
                        "same room takes the room out of the table"))
    return Premise(SHARED_ROOM, PremiseKind.SHARED_ROOM, why)


def _handed_over(ctx: ScanContext, func: FuncRef, drains: set[str]) -> str | None:
    """`self.<held>` when every caller of `func` (a method outside the drains) takes its requests
    from a list of the same object that only the drains add to (requests they removed from their
    queue: a deferred release) and never reads a queue: the requests `func` concludes have left."""
    queues = {ctx.pack.queue} | {q.drain.list_attr for q in [ctx.queue, *ctx.others]
                                 if q.drain is not None and q.drain.list_attr}
    if func.owner is None:
        return None
    callers = [(g, call) for g, call in ctx.index.callers(func.name) if isinstance(call.func, ast.Attribute)
               and isinstance(call.func.value, ast.Name) and call.func.value.id == "self" and g.owner is not None
               and func.owner in ctx.index.mro(g.owner)]
    if not callers or len(callers) != len(ctx.index.callers(func.name)):
        return None
    held: set[str] = set()
    for caller, _ in callers:
        if caller.qualname in drains:
            return None  # a drain function that the closure missed: not a hand-over
        read = {n.attr for n in ctx.index.nodes_in(caller, (ast.Attribute,))
                if isinstance(n.value, ast.Name) and n.value.id == "self"}
        filled = {attr for attr in read - queues if _filled_only_by(ctx.index, caller.owner, attr, drains)}
        if read & queues or not filled:
            return None
        held |= filled
    return ", ".join(f"self.{attr}" for attr in sorted(held))


def _filled_only_by(index: Index, cls: ClassInfo, attr: str, drains: set[str]) -> bool:
    """Whether only `drains` add items to `self.<attr>` (`append`, `extend`, `insert`, `+=`);
    elsewhere it is only emptied or set to a part of itself (a local filled while iterating it)."""
    added = False
    for func in (m for c in index.mro(cls) for m in c.methods.values()):
        for node in index.nodes_in(func, (ast.Call, ast.Assign, ast.AugAssign, ast.AnnAssign)):
            if isinstance(node, ast.Call):
                if isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend", "insert") \
                        and _is_self_attr(node.func.value, attr):
                    if func.qualname not in drains:
                        return False
                    added = True
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not any(_is_self_attr(t, attr) for t in targets):
                continue
            if isinstance(node, ast.AugAssign) or node.value is None:
                if func.qualname not in drains:
                    return False
                added = True
            elif not _empty(node.value) and not _part_of_itself(index, func, node.value, attr):
                return False
    return added


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) \
        and node.value.id == "self"


def _empty(value: ast.expr) -> bool:
    return isinstance(value, (ast.List, ast.Tuple, ast.Set, ast.Dict)) and not getattr(value, "elts", getattr(value, "keys", [])) \
        or isinstance(value, ast.Call) and not value.args and isinstance(value.func, ast.Name)


def _part_of_itself(index: Index, func: FuncRef, value: ast.expr, attr: str) -> bool:
    """`self.x = kept` where `kept` gets only items of loops over `self.x` (or a comprehension over
    it): the item itself, or its unpacked parts packed again."""
    if isinstance(value, ast.ListComp):
        return all(any(_is_self_attr(n, attr) for n in walk(g.iter)) for g in value.generators)
    if not isinstance(value, ast.Name):
        return False
    loop_names: set[str] = set()
    for loop in index.nodes_in(func, (ast.For,)):
        if any(_is_self_attr(n, attr) for n in walk(loop.iter)):
            loop_names |= {n.id for n in walk(loop.target) if isinstance(n, ast.Name)}
    adds = [c for c in index.calls_in(func) if isinstance(c.func, ast.Attribute) and c.func.attr in ("append", "extend")
            and isinstance(c.func.value, ast.Name) and c.func.value.id == value.id]
    return all(len(c.args) == 1 and _made_of(c.args[0], loop_names) for c in adds)


def _made_of(value: ast.expr, names: set[str]) -> bool:
    """A name of `names`, or a tuple of them (the loop's item unpacked and packed again)."""
    if isinstance(value, ast.Tuple):
        return all(_made_of(e, names) for e in value.elts)
    return isinstance(value, ast.Name) and value.id in names


def verdict_premise(ctx: ScanContext, backend: Backend, state: str, verdict: StateVerdict) -> Premise | None:
    return state_premise(ctx, backend, state) or absent_room_premise(ctx, backend, verdict)


def unseen_caller_premise(ctx: ScanContext, modes: list) -> Premise | None:
    """A verdict reached only in modes of the drain that no caller in view binds (a parameter
    passed by callers outside the scanned folder: the pipeline-parallel loop in managers/) is
    true only if such a caller exists. Scanning the folder that holds the callers binds the
    mode to them (and then it needs no premise), or shows none passes it (and the verdict goes)."""
    drain = ctx.queue.drain
    if drain is None or not modes or not all(m.passed and not m.callers for m in modes):
        return None
    passed = sorted({p for m in modes for p in m.passed})
    text = f"a caller outside the scanned folder passes {', '.join(passed)} to {drain.func.name}"
    return Premise(text, PremiseKind.UNSEEN_CALLER, [Evidence(drain.func.path, drain.func.line,
                                   f"premise: no caller in view passes {', '.join(passed)}, and only the mode "
                                   f"{'; '.join(m.label for m in modes)} reaches it")])


def joined(*premises: Premise | None) -> Premise | None:
    """Several premises a verdict rests on at once: all must hold."""
    found = [q for p in premises if p is not None for q in (p.parts or (p,))]
    if len(found) <= 1:
        return found[0] if found else None
    return Premise(" and ".join(dict.fromkeys(p.text for p in found)), None,
                   list(dict.fromkeys(e for p in found for e in p.why)), tuple(found))


def crash_premise(ctx: ScanContext, state: str) -> Premise | None:
    """A crash on `state` rests on a premise when every backend that returns it does so only
    under that premise (and none returns values kvtrace cannot read)."""
    by = ctx.model.returning(state)
    if by and state in ctx.pack.reached_later(ctx.pack.queue):  # whichever backend returns it, only later
        found = [state_premise(ctx, b, state) for b in (ctx.model.backend(name) for name in by) if b is not None]
        return Premise(SHARED_ROOM, PremiseKind.SHARED_ROOM, list(dict.fromkeys(e for p in found if p is not None for e in p.why)))
    if not by or any(s.unknown_in_mode for s in ctx.senders):
        return None
    found = [state_premise(ctx, backend, state) for backend in (ctx.model.backend(name) for name in by)
             if backend is not None]
    if len(found) != len(by) or any(p is None for p in found):
        return None
    texts = {p.text for p in found if p is not None}
    if len(texts) != 1:
        return None
    why = list(dict.fromkeys(e for p in found if p is not None for e in p.why))
    return Premise(texts.pop(), next(p.kind for p in found if p is not None), why)


def _history(ctx: ScanContext, backend: Backend):
    """What can have run on the backend's sender while its request is in this queue (rules.history)."""
    analysis = next((s for s in ctx.senders if s.backend is backend), None)
    return sender_history(ctx, analysis.cls) if analysis is not None else None


def _sender_classes(ctx: ScanContext, backend: Backend) -> set[str]:
    analysis = next((s for s in ctx.senders if s.backend is backend), None)
    if analysis is None:
        return set()
    return {c.name for c in ctx.index.mro(analysis.cls)}


def _drain_functions(ctx: ScanContext) -> set[str]:
    """The drain function and every function it runs on its own object (its helpers), of this
    queue and of the pack's other queues: a request is queued in one at a time, so a call there
    on a sender is this request's as it concludes, or another request's. Read from the code (the
    calls' static closure), not from the explored paths: those stop short at the path limit."""
    names: set[str] = set()
    for queue in [ctx.queue, *ctx.others]:
        drain = queue.drain
        if drain is None:
            continue
        roots = [drain.func, *(func for func, *_ in drain.then)] + ([drain.owner] if drain.owner else [])
        names |= {f.qualname for f in self_call_closure(ctx.index, roots, drain.cls or drain.func.owner)}
    return names


def self_call_closure(index: Index, roots: list[FuncRef], cls: ClassInfo | None) -> list[FuncRef]:
    """`roots` and every function they run on the same object, until nothing new: `self.m()`
    (and `self.m` handed on as a value) through `cls`'s MRO, `super().m()` past the caller's
    class, `Base.m(self)`, and module functions by bare name (on the object when given `self`),
    as kvtrace.flow resolves calls."""
    found: dict[int, FuncRef] = {id(f.node): f for f in roots}
    todo = [(f, _self_param(f)) for f in roots]
    while todo:
        func, me = todo.pop()
        for callee, callee_me in _callees(index, func, me, cls):
            if id(callee.node) not in found:
                found[id(callee.node)] = callee
                todo.append((callee, callee_me))
    return list(found.values())


def _self_param(func: FuncRef) -> str | None:
    params = func.node.args.posonlyargs + func.node.args.args
    return params[0].arg if func.owner is not None and params else None


def _callees(index: Index, func: FuncRef, me: str | None, cls: ClassInfo | None) -> list[tuple[FuncRef, str | None]]:
    """What `func` runs (with the name of its object parameter), `me` naming the object in `func`."""
    on = cls if cls is not None and (func.owner is None or func.owner in index.mro(cls)) else func.owner
    found: list[tuple[FuncRef | None, str | None]] = []
    for node in index.nodes_in(func, (ast.Attribute,)):
        if me is not None and on is not None and isinstance(node.value, ast.Name) and node.value.id == me:
            method = index.find_method(on, node.attr)  # `self.m()`, or `self.m` handed on
            found.append((method, _self_param(method) if method is not None else None))
        elif isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                and node.value.func.id == "super" and func.owner is not None and on is not None:
            mro = index.mro(on)
            after = mro[next((i for i, c in enumerate(mro) if c is func.owner), len(mro)) + 1:]
            method = next((c.methods[node.attr] for c in after if node.attr in c.methods), None)
            found.append((method, _self_param(method) if method is not None else None))
    for call in index.calls_in(func):
        given = next((i for i, a in enumerate(call.args) if me is not None and isinstance(a, ast.Name) and a.id == me),
                     None)
        if isinstance(call.func, ast.Name):
            target = index.resolve_function(call.func.id, func.path)
            params = [a.arg for a in target.node.args.posonlyargs + target.node.args.args] if target else []
            found.append((target, params[given] if given is not None and given < len(params) else None))
        elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and given == 0:
            base = index.resolve_class(call.func.value.id, near=func.path)  # `Base.m(self)`
            method = index.find_method(base, call.func.attr) if base is not None else None
            found.append((method, _self_param(method) if method is not None else None))
    return [(f, m) for f, m in found if f is not None]


def _last_attr(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else None


