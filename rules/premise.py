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

from kvtrace.model import Backend, Evidence, StateVerdict
from kvtrace.rules.base import ScanContext

SHARED_ROOM = "two requests share a bootstrap_room"


@dataclass(frozen=True)
class Premise:
    text: str  # what must hold for the finding to be true
    why: list[Evidence]  # the links that show it is needed


def state_premise(ctx: ScanContext, backend: Backend, state: str) -> Premise | None:
    """A state the backend's poll() returns only from the status table, that only its sender's
    constructor stores there, reaches this queue's drain only with a second sender for the room:
    a request enters the queue only once its poll moved past it (the pack's `entered_past`)."""
    where = backend.constructor_only.get(state)
    if where is None or state not in ctx.pack.left_before(ctx.pack.queue):
        return None
    return Premise(SHARED_ROOM, [
        where,
        Evidence(where.path, where.line, f"premise: a request enters {ctx.pack.queue} only after its poll left {state}, "
                                         f"so {state} comes back only when a second sender for the same room is built"),
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
    sender_attrs = _polled_attributes(ctx)
    if not sender_attrs:
        return None
    why: list[Evidence] = []
    for qualname in manager.clear_methods:
        owner, _, method = qualname.rpartition(".")
        if owner not in sender_classes:
            return None  # the manager takes the room out itself: it may be this request's
        calls = [(caller, call) for caller, call in ctx.index.callers(method)
                 if isinstance(call.func, ast.Attribute) and _last_attr(call.func.value) in sender_attrs]
        entered = _drain_functions(ctx)
        if any(caller.qualname not in entered for caller, _ in calls):
            return None
        why += [Evidence(caller.path, call.lineno, f"premise: {qualname}() is called on a queued request's sender only "
                                                   f"here, in the drain, as the request concludes")
                for caller, call in calls]
    why.append(Evidence(drain.func.path, drain.func.line,
                        "premise: while the request is queued, only another request's sender for the same room "
                        "takes the room out of the table"))
    return Premise(SHARED_ROOM, why)


def verdict_premise(ctx: ScanContext, backend: Backend, state: str, verdict: StateVerdict) -> Premise | None:
    return state_premise(ctx, backend, state) or absent_room_premise(ctx, backend, verdict)


def crash_premise(ctx: ScanContext, state: str) -> Premise | None:
    """A crash on `state` rests on a premise when every backend that returns it does so only
    under that premise (and none returns values kvtrace cannot read)."""
    by = ctx.model.returning(state)
    if not by or any(s.backend.returns_unknown for s in ctx.senders):
        return None
    found = [state_premise(ctx, backend, state) for backend in (ctx.model.backend(name) for name in by)
             if backend is not None]
    if len(found) != len(by) or any(p is None for p in found):
        return None
    texts = {p.text for p in found if p is not None}
    if len(texts) != 1:
        return None
    why = list(dict.fromkeys(e for p in found if p is not None for e in p.why))
    return Premise(texts.pop(), why)


def _sender_classes(ctx: ScanContext, backend: Backend) -> set[str]:
    analysis = next((s for s in ctx.senders if s.backend is backend), None)
    if analysis is None:
        return set()
    return {c.name for c in ctx.index.mro(analysis.cls)}


def _polled_attributes(ctx: ScanContext) -> set[str]:
    """The attributes the drain's poll statement reads on each request (`r.disagg_kv_sender`):
    a call through one of them acts on a queued request's sender."""
    drain = ctx.queue.drain
    if drain is None or drain.poll_line is None:
        return set()
    found: set[str] = set()
    for node in ast.walk(drain.func.node):
        if isinstance(node, ast.stmt) and node.lineno <= drain.poll_line <= (node.end_lineno or node.lineno) \
                and not isinstance(node, (ast.For, ast.While, ast.If, ast.With, ast.Try, ast.FunctionDef)):
            found |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name)}
    return found - {ctx.pack.queue}


def _drain_functions(ctx: ScanContext) -> set[str]:
    """The drain function and every function its paths go through (its helpers)."""
    drain = ctx.queue.drain
    names = {drain.func.qualname} if drain is not None else set()
    for paths in ctx.queue.paths.values():
        for path in paths:
            names.update(e.function for e in path.events if e.function)
    return names


def _last_attr(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else None
