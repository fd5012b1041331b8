"""What calls do, beyond what the path walker follows: the domain's side of the flow engine.

The walker (`flow.Explorer`) evaluates Python: names, conditions, helper calls. It never names a
queue, a request or a pack; at each call it asks its `Effects` (given in its Options, as
Semgrep's dataflow engine takes a record of callbacks) whether the call is an effect: a request
leaving or staying in the queue, a release, an abort, a poll. The drain loop and the sender are
two implementations, each a frozen record of what its run needs (the drain's queue and removal
set, the sender's status table and abort flags). A new effect is one method here and one entry
in its class's `CALLS`. The sender's also model the manager's status table, the one container
read by key (kvtrace.status_table), through the walker's `keyed` and `on_key_*` callbacks; the
drain's decide `i in S` for the set its queue is filtered by (`on_membership`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import libcst as cst

from kvtrace import status_table
from kvtrace.flow import ITEM, MAX_TUPLE, CallSite, Explorer, Event, Frame, PathState, instance_fact
from kvtrace.managers import RECEIVE, WIRE_CALLS, WIRE_METHODS, received_message
from kvtrace.index import FuncRef, Index
from kvtrace.packs import Pack
from kvtrace.syntax import dotted
from kvtrace.model import EventKind
from kvtrace.states import KEEP, NONE, NOW, REQ, TRUE, Val

Answer = list[tuple[PathState, Val]]
# An effect: (the Effects object, the walker, the call, the path) -> the paths and value, or None
# when the call is not this effect.
CallEffect = Callable[[Any, Explorer, CallSite, PathState], "Answer | None"]
Membership = list[tuple[PathState, bool, bool]]
# Attribute key set once the request's index joined the drain's removal set (`S.add(i)`).
REMOVED = "@removed"


@dataclass(frozen=True)
class PackEffects:
    """The calls the pack names, in both runs: a release, a log line, an abort, a metric, an
    answer to the client, a clock read."""

    pack: Pack

    CALLS: ClassVar[tuple[CallEffect, ...]] = ()

    def on_call(self, run: Explorer, site: CallSite, path: PathState) -> Answer | None:
        for effect in self.CALLS:
            found = effect(self, run, site, path)
            if found is not None:
                return found
        return None

    def on_unresolved_call(self, run: Explorer, site: CallSite, path: PathState) -> PathState:
        """A call the walker can neither enter nor name: the path as it goes on."""
        return path

    def on_self_read(self, run: Explorer, node: cst.Attribute, key: str, path: PathState, frame: Frame) -> PathState:
        return path

    def on_self_write(self, run: Explorer, target: cst.Attribute, key: str, path: PathState, frame: Frame) -> PathState:
        return path

    def on_membership(self, run: Explorer, node: cst.Comparison, is_in: bool, path: PathState,
                      frame: Frame) -> Membership | None:
        return None

    # No container is modelled by key but the sender's status table (SenderEffects): the walker
    # asks `keyed` first and calls the on_key_* below only when it answers True.
    def keyed(self, run: Explorer, node: cst.CSTNode, frame: Frame) -> bool:
        return False

    def on_key_read(self, run: Explorer, node: cst.Subscript, path: PathState, frame: Frame) -> Answer:
        raise NotImplementedError

    def on_key_store(self, run: Explorer, target: cst.Subscript, value: Val, path: PathState, frame: Frame) -> PathState:
        raise NotImplementedError

    def on_key_delete(self, run: Explorer, node: cst.Del, path: PathState, frame: Frame) -> list[PathState]:
        raise NotImplementedError

    def on_key_method(self, run: Explorer, node: cst.Call, method: str, values: list[Val], path: PathState,
                      frame: Frame) -> Answer:
        raise NotImplementedError

    def pack_call(self, run: Explorer, site: CallSite, path: PathState) -> Answer | None:
        pack, callee = self.pack, site.callee
        if not callee:
            return None
        for named, kind, value in ((pack.is_release, EventKind.RELEASE, None), (pack.is_log, EventKind.LOG, _NONE),
                                   (pack.is_abort, EventKind.ABORT, None), (pack.is_metric, EventKind.METRIC, None),
                                   (pack.is_answer, EventKind.ANSWER, None)):
            if named(callee):
                return [(path.emit(site.event(kind, callee)), value if value is not None else run.c.domain.universe)]
        return None

    def clock_read(self, run: Explorer, site: CallSite, path: PathState) -> Answer | None:
        if site.callee and self.pack.is_clock_call(site.callee):
            return [(path, frozenset({NOW}))]
        return None

    def wire(self, run: Explorer, site: CallSite, path: PathState) -> Answer | None:
        """A state's trip over a socket, read as the manager model reads it (kvtrace.managers):
        `str(s).encode()` sent, `int(s.decode())` received keep the member; a message
        `sock.recv_multipart()` is a tuple of what the sends put in each part. None: not such a
        call, or a value that is not a member (then the call is what it was)."""
        node, callee, values, frame = site.node, site.callee, site.values, site.frame
        members = run.c.domain.members
        if callee in WIRE_CALLS and len(values) == 1 and not node.args[0].star:
            return [(path, values[0])] if values[0] and values[0] <= set(members) else None
        method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
        if method in WIRE_METHODS and isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Name):
            held = run.eval(node.func.value, path, frame)
            return held if all(v and v <= set(members) for _, v in held) else None
        if method == RECEIVE and not node.args:
            parts = received_message(run.c.index, frame.func, frame.body.line(node), members)
            if parts is None:
                return None
            return [(path, frozenset(f"{ITEM}{i}:{t}" for i, held in parts.items() if i < MAX_TUPLE for t in held))]
        return None


@dataclass(frozen=True)
class QueueEffects(PackEffects):
    """The drain loop's run for one poll state: where the request goes (kept in the queue, done,
    requeued elsewhere, removed by index) and the poll that gives this run's state."""

    queue_attr: str | None = None  # the queue's attribute: appending to it keeps the request
    removal_set: str | None = None  # `self.q = [x for i, x in enumerate(self.q) if i not in S]`: S.add(i) removes
    # The function that binds S (`S = set()`, nothing else binds it) and the index names of its
    # loops over the queue: there `i in S` is decided by whether this request's index was added.
    removal_scope: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    removal_index: frozenset[str] = frozenset()

    def removal(self, run: Explorer, site: CallSite, path: PathState) -> Answer | None:
        if site.method == "add" and site.receiver and site.receiver == self.removal_set:
            # The request's index joins the set the queue is filtered by: it leaves the queue.
            left = path.emit(site.event(EventKind.DONE, site.receiver))
            if site.frame.func.node is self.removal_scope:
                left = left.set_attr(REMOVED, _TRUE)
            return [(left, _NONE)]
        return None

    def on_membership(self, run: Explorer, node: cst.Comparison, is_in: bool, path: PathState,
                      frame: Frame) -> Membership | None:
        """`i in S`, `i` the index of the request in a loop over the queue of the function that
        binds the removal set S to an empty set: S holds the request's index only if this
        iteration added it (the set starts empty each call; the loops enumerate one queue)."""
        left, right = node.left, node.comparisons[0].comparator
        if frame.func.node is self.removal_scope and isinstance(left, cst.Name) \
                and left.value in self.removal_index and path.get(left.value) is None \
                and isinstance(right, cst.Name) and right.value == self.removal_set:
            return [(path, (path.attr(REMOVED) is not None) == is_in, False)]
        return None

    def queue_entry(self, run: Explorer, site: CallSite, path: PathState) -> Answer | None:
        receiver, node = site.receiver, site.node
        if site.method not in ("append", "extend", "insert", "appendleft") or not receiver:
            return None
        # The request, or a part of it (`decode_req.req`: the queue entry wraps the request).
        has_req = any(REQ in v for v in site.values) or any(
            isinstance(a.value, cst.Attribute) and isinstance(a.value.value, cst.Name)
            and REQ in (path.get(a.value.value.value) or ()) for a in node.args)
        if not has_req:
            return None
        recv_value = path.get(receiver) if "." not in receiver else None
        if receiver.endswith(f"self.{self.queue_attr}") or (recv_value is not None and KEEP in recv_value):
            return [(path.emit(site.event(EventKind.KEEP, receiver)), _NONE)]
        kind = EventKind.DONE if "." not in receiver else EventKind.REQUEUE
        return [(path.emit(site.event(kind, receiver)), _NONE)]

    def poll(self, run: Explorer, site: CallSite, path: PathState) -> Answer | None:
        if site.callee and run.c.state is not None and self.pack.is_poll_call(site.callee):
            return [(path.emit(site.event(EventKind.POLL, site.callee)), run.poll_value())]
        return None

    def abort(self, run: Explorer, site: CallSite, path: PathState) -> Answer | None:
        """An abort call the pack names, with what the called function's first statements store
        on the request it is given (`req.finished_reason = FINISH_ABORT(...)`): a later
        `isinstance(req.finished_reason, FINISH_ABORT)` on the path is then decided."""
        if not site.callee or not self.pack.is_abort(site.callee):
            return None
        answered = PackEffects.pack_call(self, run, site, path)
        func, _ = run.resolve(site.callee, site.frame)
        held = dotted(site.node.args[0].value) if site.node.args and not site.node.args[0].star else ""
        if answered is None or func is None or not held or "(" in held:
            return answered
        stores = leading_stores(run.c.index, func)
        return [(_stored(p, held, stores), value) for p, value in answered]

    CALLS: ClassVar[tuple[CallEffect, ...]] = (removal, queue_entry, abort, PackEffects.pack_call, PackEffects.clock_read,
                                               poll, PackEffects.wire)


@dataclass(frozen=True)
class SenderEffects(PackEffects):
    """A sender's and its manager's methods: the pack's calls, status updates kvtrace cannot tie
    to the manager, the manager's status table (`table`, kvtrace.status_table), the one container
    read by key, and the flags abort() sets."""

    table: str | None = None  # the manager's attribute that holds the status table
    abort_attrs: frozenset[str] = frozenset()  # attribute keys abort() writes: a read is an abort-read event
    record_writes: bool = False  # an attr-write event for every self.X = ... (abort()'s runs)

    def keyed(self, run: Explorer, node: cst.CSTNode, frame: Frame) -> bool:
        return status_table.is_table(run, self.table, node, frame)

    def on_key_read(self, run: Explorer, node: cst.Subscript, path: PathState, frame: Frame) -> Answer:
        return status_table.read(run, node, path, frame)

    def on_key_store(self, run: Explorer, target: cst.Subscript, value: Val, path: PathState, frame: Frame) -> PathState:
        return status_table.store(run, target, value, path, frame)

    def on_key_delete(self, run: Explorer, node: cst.Del, path: PathState, frame: Frame) -> list[PathState]:
        return status_table.delete(run, node, path, frame)

    def on_key_method(self, run: Explorer, node: cst.Call, method: str, values: list[Val], path: PathState,
                      frame: Frame) -> Answer:
        return status_table.method_call(run, node, method, values, path, frame)

    def on_membership(self, run: Explorer, node: cst.Comparison, is_in: bool, path: PathState,
                      frame: Frame) -> Membership | None:
        if not self.keyed(run, node.comparisons[0].comparator, frame):
            return None
        return status_table.membership(run, node, is_in, path, frame)

    def on_self_read(self, run: Explorer, node: cst.Attribute, key: str, path: PathState, frame: Frame) -> PathState:
        if key in self.abort_attrs:
            return path.emit(Event(EventKind.ABORT_READ, frame.func.path, frame.body.line(node), frame.func.qualname,
                                   node.attr.value))
        return path

    def on_self_write(self, run: Explorer, target: cst.Attribute, key: str, path: PathState, frame: Frame) -> PathState:
        if self.record_writes:
            return path.emit(Event(EventKind.ATTR_WRITE, frame.func.path, frame.body.line(target), frame.func.qualname, key))
        return path

    def on_unresolved_call(self, run: Explorer, site: CallSite, path: PathState) -> PathState:
        if self.table is not None and site.method == self.pack.update_method:
            # A status update on an object kvtrace cannot tie to the manager: what it
            # stores is not followed (a reachability question must not rely on this path).
            return path.emit(site.event(EventKind.TABLE_UNKNOWN, site.callee))
        return path

    CALLS: ClassVar[tuple[CallEffect, ...]] = (PackEffects.pack_call, PackEffects.clock_read, PackEffects.wire)


def leading_stores(index: Index, func: FuncRef) -> tuple[tuple[str, str], ...]:
    """`(attr, origin)` for each `<first parameter>.<attr> = C(...)` among the statements `func`
    runs first, before anything that could return early (only a docstring, imports and `pass`
    may come between); origin: where `C` comes from (Index.origin). Cached per function."""
    key = ("leading stores", id(func.node))
    found = index.derived.get(key)
    if found is None:
        params = [a.arg for a in func.node.args.posonlyargs + func.node.args.args]
        stores: list[tuple[str, str]] = []
        for stmt in func.node.body if params else []:
            if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)) or (
                    isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                continue
            stored = _param_store(stmt, params[0])
            if stored is None:
                break
            attr, cls = stored
            origin = index.origin(func, cls)
            if origin is not None:
                stores.append((attr, origin))
        found = index.derived[key] = tuple(stores)
    return found


def _param_store(stmt: ast.stmt, param: str) -> tuple[str, str] | None:
    """`<param>.<attr> = C(...)`: (attr, C); None for any other statement."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return None
    target, value = stmt.targets[0], stmt.value
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == param \
            and isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return target.attr, value.func.id
    return None


def _stored(path: PathState, held: str, stores: tuple[tuple[str, str], ...]) -> PathState:
    for attr, origin in stores:
        path = path.set_attr(instance_fact(f"{held}.{attr}"), frozenset({origin}))
    return path


_NONE: Val = frozenset({NONE})
_TRUE: Val = frozenset({TRUE})
