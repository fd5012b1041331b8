"""A drain that returns before polling once every queued request carries a flag set on a waiting
state, while the failure state can still arrive through another channel (a thread of the
transfer manager writes it into the status table): nothing polls, nothing sees it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from kvtrace.model import EventKind, Evidence, Finding
from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.rules.samples import MANAGED_SENDER, manager
from kvtrace.syntax import dotted
from kvtrace.packs import matches
from kvtrace.parse import walk


@dataclass(frozen=True)
class SkipGuard:
    """`if all(r.<flag> for r in self.<queue>) ...: return` before the poll."""

    node: ast.If
    flag: str
    reads: frozenset[str]  # attributes of the queued request the guard's other tests read


def skip_guards(func: ast.FunctionDef | ast.AsyncFunctionDef, poll_line: int, lists: set[str],
                reads_status: Callable[[ast.Call], bool]) -> list[SkipGuard]:
    """The early returns of `func`, before its poll statement, taken when every request of the
    queue list carries a flag, and decided without polling or reading the status table."""
    found = []
    for stmt in func.body:
        if stmt.lineno >= poll_line:
            break
        if not isinstance(stmt, ast.If) or stmt.orelse or not all(isinstance(s, ast.Return) for s in stmt.body):
            continue
        if any(isinstance(n, ast.Call) and reads_status(n) for n in walk(stmt.test)):
            continue
        for call in (n for n in walk(stmt.test) if isinstance(n, ast.Call)):
            if not (isinstance(call.func, ast.Name) and call.func.id == "all" and len(call.args) == 1
                    and isinstance(call.args[0], (ast.GeneratorExp, ast.ListComp))):
                continue
            comp = call.args[0]
            gen = comp.generators[0]
            elt = comp.elt
            if isinstance(gen.target, ast.Name) and isinstance(gen.iter, ast.Attribute) and gen.iter.attr in lists \
                    and isinstance(elt, ast.Attribute) and isinstance(elt.value, ast.Name) \
                    and elt.value.id == gen.target.id:
                reads = frozenset(n.attr for n in walk(stmt.test) if isinstance(n, ast.Attribute)) - {elt.attr}
                found.append(SkipGuard(stmt, elt.attr, reads))
    return found


def flag_states(func: ast.AST, flag: str, members: tuple[str, ...]) -> dict[str, int]:
    """The poll states under whose branch `<x>.<flag> = True` is set: state -> line."""
    parents: dict[int, ast.AST] = {}
    for node in walk(func):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    states: dict[str, int] = {}
    for node in walk(func):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is True \
                and any(isinstance(t, ast.Attribute) and t.attr == flag for t in node.targets):
            child, up = node, parents.get(id(node))
            while up is not None:
                if isinstance(up, ast.If) and child in up.body:
                    named = {n.attr for n in walk(up.test) if isinstance(n, ast.Attribute) and n.attr in members}
                    if named:
                        for state in named:
                            states.setdefault(state, node.lineno)
                        break
                child, up = up, parents.get(id(up))
    return states


def _tested_then_aborted(events) -> bool:
    tested = False
    for e in events:
        tested = tested or (e.kind is EventKind.CHECK and e.detail == "T")
        if tested and e.kind is EventKind.ABORT:
            return True
    return False


def _self_refs(node: ast.AST) -> set[str]:
    """The `self.<name>` the code refers to (called, or handed to a thread as its target)."""
    return {n.attr for n in walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _other_side_methods(owners: list, side: str) -> set[str]:
    """The manager methods that run only in another mode: the constructor starts them in a
    branch on `<Mode>.<X>` with X not this side, and nothing this side starts reaches them."""
    if not side:
        return set()
    methods = {m.name: m for owner in reversed(owners) for m in owner.methods.values()}
    mine: set[str] = set()
    theirs: set[str] = set()
    for owner in owners:
        init = owner.methods.get("__init__")
        if init is None:
            continue
        for node in walk(init.node):
            if not isinstance(node, ast.If):
                continue
            modes = {n.attr for n in walk(node.test) if isinstance(n, ast.Attribute) and n.attr.isupper()}
            if not modes:
                continue
            refs = set().union(*(_self_refs(stmt) for stmt in node.body)) & set(methods)
            (mine if side in modes else theirs).update(refs)
    if not mine:
        return set()

    def reach(start: set[str]) -> set[str]:
        seen, todo = set(), list(start)
        while todo:
            name = todo.pop()
            if name in seen or name not in methods:
                continue
            seen.add(name)
            todo.extend(_self_refs(methods[name].node) - seen)
        return seen

    return reach(theirs) - reach(mine)


def _function_defs(node: ast.AST):
    for n in walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield n


# A manager whose bootstrap thread records a failed peer in the status table.
_THREADED_MANAGER = manager() + '''
    def bootstrap_thread(self, room):
        self.update_status(room, KVPoll.Failed)
'''


class SkipPoll(Rule):
    """A drain returns without polling once every queued request has reached a waiting state,
    while the failure can arrive through another channel.

    What it does:
        Finds, in the function that polls the queue, an early `return` before the poll taken
        when `all(r.<flag> for r in <queue>)`, where the drain sets `<flag> = True` on a
        waiting state and nothing sets it back. For each backend whose transfer manager stores
        the failure state into the status table from a function its poll() does not run (a
        bootstrap or heartbeat thread), the guard is reported unless it reads what that function
        writes (the table, or an attribute the function sets).

    Why it matters:
        A request whose handshake has ended (flag set) waits in the queue for memory. When the
        peer fails meanwhile, the manager's thread records Failed for its room, but nothing
        polls: the request is not aborted, keeps its slot and its client waits, for as long as
        every queued request carries the flag (allocation blocked).

    Example:
        `if all(decode_req.waiting_for_input for decode_req in self.queue): return` in
        `_update_handshake_waiters` (sglang#25561); with `and not any(r.kv_receiver.conclude_state
        == KVPoll.Failed ...)` the receiver's own abort is seen but a Failed the bootstrap
        thread writes into `request_status` is not (sglang#37483, fixed in 0.5.20 by polling).

    Fix:
        Poll every round (the poll is cheap), or have the guard read the status table.
    """

    code = "KVT022"
    name = "skip-poll"
    title = "Drain skips the poll that would see a failure"
    severity = "warning"

    VALID = [
        # The guard polls: a Failed in the table is seen.
        Sample({"disaggregation/prefill.py": '''\
from .base.conn import KVPoll
from .utils import poll_and_all_reduce, prepare_abort


class PrefillMixin:
    def finish_batch(self, batch):
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)

    def drain_inflight(self):
        if all(r.waiting_for_input for r in self.disagg_prefill_inflight_queue) and not any(
                p == KVPoll.Failed for p in poll_and_all_reduce(
                    [r.disagg_kv_sender for r in self.disagg_prefill_inflight_queue], self.group)):
            return
        polls = poll_and_all_reduce([r.disagg_kv_sender for r in self.disagg_prefill_inflight_queue], self.group)
        undone_reqs = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):
            if poll == KVPoll.WaitingForInput:
                req.waiting_for_input = True
                undone_reqs.append(req)
            elif poll == KVPoll.Failed:
                prepare_abort(req, "failed")
            else:
                undone_reqs.append(req)
        self.disagg_prefill_inflight_queue = undone_reqs
''', "disaggregation/net/conn.py": MANAGED_SENDER, "disaggregation/net/mgr.py": _THREADED_MANAGER}),
    ]
    INVALID = [
        Sample({"disaggregation/prefill.py": '''\
from .base.conn import KVPoll
from .utils import poll_and_all_reduce, prepare_abort


class PrefillMixin:
    def finish_batch(self, batch):
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)

    def drain_inflight(self):
        if all(r.waiting_for_input for r in self.disagg_prefill_inflight_queue) and not any(
                r.disagg_kv_sender.conclude_state == KVPoll.Failed for r in self.disagg_prefill_inflight_queue):
            return
        polls = poll_and_all_reduce([r.disagg_kv_sender for r in self.disagg_prefill_inflight_queue], self.group)
        undone_reqs = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):
            if poll == KVPoll.WaitingForInput:
                req.waiting_for_input = True
                undone_reqs.append(req)
            elif poll == KVPoll.Failed:
                prepare_abort(req, "failed")
            else:
                undone_reqs.append(req)
        self.disagg_prefill_inflight_queue = undone_reqs
''', "disaggregation/net/conn.py": MANAGED_SENDER, "disaggregation/net/mgr.py": _THREADED_MANAGER}, expect=(("net", "Failed"),)),
    ]

    def check(self, ctx: ScanContext) -> list[Finding]:
        drain = ctx.queue.drain
        if drain is None or drain.poll_line is None:
            return []
        pack = ctx.pack
        lists = {pack.queue} | ({drain.list_attr} if drain.list_attr else set())
        status_methods = {m for m in (pack.check_method, pack.poll_method) if m}

        def reads_status(call: ast.Call) -> bool:
            name = dotted(call.func, calls=True) or ""
            return matches(name, pack.poll_calls) or name.rsplit(".", 1)[-1] in status_methods

        guards = skip_guards(drain.func.node, drain.poll_line, lists, reads_status)
        if not guards:
            return []
        # The states the drain fails a request on: a branch that tests for the state is taken and
        # an abort follows on its path. What the skipped poll would have seen.
        failing = [s for s in ctx.domain.members if any(_tested_then_aborted(p.events) for p in ctx.queue.paths.get(s, []))]
        functions = [drain.func.node] + [f.node for f, _, _, _ in drain.then]
        findings = []
        for guard in guards:
            waiting = {}
            for node in functions:
                waiting.update(flag_states(node, guard.flag, ctx.domain.members))
            if not waiting or self._flag_cleared(ctx, guard.flag):
                continue
            for state in failing:
                for analysis in ctx.senders:
                    stores = self._other_channel(ctx, analysis, state, guard.reads)
                    if not stores:
                        continue
                    where = drain.func.path, guard.node.lineno
                    flagged = ", ".join(f"{s} (line {line})" for s, line in sorted(waiting.items()))
                    message = (f"{analysis.backend.name}: {state} written into the status table by "
                               f"{stores[0].note.split(':', 1)[0]} is never seen while every request in "
                               f"{pack.queue} has `{guard.flag}` set: the drain returns at line {guard.node.lineno} "
                               f"before it polls (line {drain.poll_line}); `{guard.flag}` is set on {flagged} and "
                               f"never cleared, so the request is neither aborted nor freed while allocation is blocked")
                    evidence = [Evidence(where[0], where[1], f"return before the poll when every request has {guard.flag}"),
                                Evidence(drain.func.path, drain.poll_line, "poll: skipped by the return above")]
                    evidence += [Evidence(drain.func.path, line, f"{guard.flag} = True on {s}") for s, line in sorted(waiting.items())]
                    evidence += stores
                    findings.append(self.finding(message, where[0], where[1], analysis.backend.name, state, evidence))
        return findings

    @staticmethod
    def _flag_cleared(ctx: ScanContext, flag: str) -> bool:
        """Some analysed code sets the flag back to a false value (outside class bodies' defaults)."""
        for module in ctx.index.modules.values():
            if flag not in (module.source.text or ""):
                continue
            for func in _function_defs(module.tree):
                for node in walk(func):
                    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and not node.value.value \
                            and any(isinstance(t, ast.Attribute) and t.attr == flag for t in node.targets):
                        return True
        return False

    @staticmethod
    def _other_channel(ctx: ScanContext, analysis, state: str, guard_reads: frozenset[str]) -> list[Evidence]:
        """Where the backend's manager stores `state` into its table from a function its poll()
        does not call, and that writes none of the attributes the guard reads."""
        backend = analysis.backend
        ref = backend.manager
        if state not in backend.returns:
            return []
        # The paired manager, else the classes beside the backend that define the update method.
        folder = backend.path.rsplit("/", 1)[0]
        classes = [c for c in [ctx.index.resolve_class(ref.name, ref.path)] if c is not None] if ref is not None else \
            [c for infos in ctx.index.classes.values() for c in infos
             if c.path.rsplit("/", 1)[0] == folder and ctx.pack.update_method in c.methods]
        update = ctx.pack.update_method
        poll_calls = set()
        if analysis.poll is not None:
            poll_calls = {dotted(n.func, calls=True).rsplit(".", 1)[-1] for n in walk(analysis.poll.node)
                          if isinstance(n, ast.Call) and dotted(n.func, calls=True)}
        found: list[Evidence] = []
        owners = list(dict.fromkeys(o for cls in classes for o in ctx.index.mro(cls)))
        elsewhere = _other_side_methods(owners, ctx.pack.manager_side)
        for owner in owners:
            for method in owner.methods.values():
                if method.name in poll_calls or method.name == update or method.name in elsewhere:
                    continue
                for func in _function_defs(method.node):
                    if func is not method.node and func.name in poll_calls:
                        continue
                    writes = {t.attr for n in walk(func) if isinstance(n, ast.Assign)
                              for t in n.targets if isinstance(t, ast.Attribute)}
                    if writes & guard_reads:
                        continue
                    for call in walk(func):
                        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                                and call.func.attr == update and len(call.args) >= 2 \
                                and isinstance(call.args[1], ast.Attribute) and call.args[1].attr == state:
                            note = f"{owner.name}.{method.name}" + (f" ({func.name})" if func is not method.node else "")
                            found.append(Evidence(method.path, call.lineno,
                                                  f"{note}: stores {state} into the table, outside poll()"))
        # Thread bodies (nested functions) first: the channel is a thread the scheduler does not wait on.
        return sorted(found, key=lambda e: "(" not in e.note)
