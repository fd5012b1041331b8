"""What a crash on a transfer state in a queue that holds no KV memory yet rests on.

A request waits in such a queue (the decode prealloc queue) before memory is reserved for it, so
no transfer into it can have started: its own receiver cannot have reached a state that needs
the data (Transferring, Success). The poll answers such a state only when the room's entry in
the status table was moved there by another receiver for the same room: the request entered the
queue again with its bootstrap_room after its transfer ran (a retracted request re-added, which
builds a new receiver for the old room), or two requests share a bootstrap_room. The finding
names each entry into the queue (the paths that bring a request there) and says what it rests on.
"""

from __future__ import annotations

import ast

from kvtrace.model import EventKind, Evidence, PremiseKind
from kvtrace.parse import walk
from kvtrace.rules.base import ScanContext
from kvtrace.rules.premise import Premise

ROOM_REUSED = ("a second KV receiver or sender is built for a room whose transfer already ran (the request re-enters the queue "
               "with its bootstrap_room, as a retracted request re-added does, or two requests share a bootstrap_room)")


def reentry_premise(ctx: ScanContext, state: str) -> Premise | None:
    """The premise of a crash on `state` in a queue the pack says holds nothing yet, while a
    later queue of the pack holds memory: `state` is one the drain does not test (a catch-all
    reaches it, so not the failure the drain aborts on)."""
    pack = ctx.pack
    queue = pack.queue
    if pack.held_in(queue) or not any(pack.held_in(name) for name in pack.queues if name != queue):
        return None
    paths = ctx.queue.paths.get(state, [])
    if any(e.kind is EventKind.CHECK and e.detail == "T" for p in paths for e in p.events):
        return None  # the drain tests for the state by name: it expects it here
    why = [Evidence(site.path, site.line, f"premise: {site.function} brings a request into {queue}; "
                                          f"{_what_it_builds(ctx, site)}") for site in ctx.entries]
    why += _callers_of_entries(ctx)
    why.append(Evidence(ctx.queue.drain.func.path if ctx.queue.drain else "", ctx.queue.loop_line() if ctx.queue.drain else 0,
                        f"premise: a request in {queue} holds no KV memory yet, so no transfer into it has started; "
                        f"{state} here is the state of an earlier transfer for the same room"))
    return Premise(ROOM_REUSED, PremiseKind.ROOM_REUSED, why)


def _what_it_builds(ctx: ScanContext, site) -> str:
    """Whether the entry builds a new receiver (a constructor call among the appended values)."""
    for module in ctx.index.modules.values():
        if module.source.path != site.path:
            continue
        for node in walk(module.tree):
            if isinstance(node, ast.Call) and getattr(node, "lineno", 0) == site.line:
                built = [k.arg for n in walk(node) if isinstance(n, ast.Call)
                         for k in n.keywords if k.arg and "receiver" in k.arg]
                if built:
                    return "each entry builds a new receiver for the request's room"
    return "the request keeps what it carries"


def _callers_of_entries(ctx: ScanContext) -> list[Evidence]:
    """The calls into the functions outside the queue's own class that append to it: the paths
    a request takes into it (a new request, a retracted one)."""
    out: list[Evidence] = []
    own = ctx.queue.drain.cls.name if ctx.queue.drain is not None and ctx.queue.drain.cls is not None else None
    names = {site.function.rsplit(".", 1)[-1] for site in ctx.entries
             if "." not in site.function or site.function.split(".")[0] != own}
    names.discard("<module>")
    for name in sorted(names):
        for caller, call in ctx.index.callers(name):
            if caller.name in names or not (isinstance(call.func, ast.Attribute) and call.func.attr == name
                                            and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
                continue
            out.append(Evidence(caller.path, call.lineno, f"premise: {caller.qualname} calls {name}"))
    return out[:8]
