from __future__ import annotations

import ast

from typing import TYPE_CHECKING

from kvtrace.model import Evidence, Finding, StateVerdict, WayOut
from kvtrace.parse import walk
from kvtrace.rules.history import sender_history
from kvtrace.rules.premise import absent_room_premise
from kvtrace.rules.base import Rule, Sample, ScanContext, drain_evidence
from kvtrace.rules.samples import STANDARD_BRANCHES, drain, sender

if TYPE_CHECKING:  # the rules' docs load without the analysis stack (fast `explain`)
    from kvtrace.backends import SenderAnalysis

_RAISING_POLL = '''\
        if self.conclude_state is not None:
            return self.conclude_state
        if self.mgr.lost(self.room):
            raise RuntimeError("peer lost")
        return self.mgr.status(self.room)'''
_FAILING_POLL = _RAISING_POLL.replace('raise RuntimeError("peer lost")', "return KVPoll.Failed")


class PollRaises(Rule):
    """A backend's poll() raises instead of returning Failed, and the drain loop does not catch it.

    What it does:
        Walks the poll() each backend really runs (inherited ones and the helpers it calls) and
        reports it, at the raise, when a path ends in an exception. It says what the drain loop
        does with it: whether the poll call of the queue sits inside a try that handles it.

    Why it matters:
        poll() is called for every queued request on every scheduler step. An exception there
        leaves the drain loop and the scheduler's event loop: one bad transfer takes down the
        server instead of failing one request. Failed exists so that the drain loop can release
        and answer that one request.

    Example:
        `if self.peer_lost: raise RuntimeError("peer lost")` inside poll(), called through
        `poll_and_all_reduce([req.sender for req in queue], ...)` with no try around it.

    Fix:
        Record the error (`self.failure = exc`), set the abort state and return Failed; let
        `failure_exception()` raise it for the log line the drain loop already writes.
    """

    code = "KVT007"
    name = "poll-raises"
    title = "poll() raises instead of returning Failed"
    severity = "error"
    per_queue = True  # the verdict depends on the queue's drain (does it catch?)
    title_clause = "{owner} poll() raises instead of returning Failed{on_states}"

    VALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                     "disaggregation/calm/conn.py": sender("Calm", _FAILING_POLL)})]
    INVALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                       "disaggregation/loud/conn.py": sender("Loud", _RAISING_POLL)},
                      expect=(("loud", None),))]

    def check(self, ctx: ScanContext) -> list[Finding]:
        drain = ctx.queue.drain
        if drain is None:
            return []
        caught = drain.poll_line is not None and _inside_handled_try(drain.func.node, drain.poll_line)
        if caught:
            return []  # the drain loop handles the exception: a failure, not a crash
        where = (f"the poll of {ctx.pack.queue} at {drain.func.path}:{drain.poll_line} is not inside a try, so the "
                 f"exception leaves {drain.func.qualname} and the scheduler loop"
                 if drain.poll_line is not None else f"{drain.func.qualname} does not catch it")
        findings = []
        for analysis in ctx.senders:
            b = analysis.backend
            raise_sites = _raise_sites_while_queued(ctx, analysis)
            if b.poll is not None and analysis.absent_raise_sites and not raise_sites:
                findings.append(self._absent_room(ctx, analysis, where))
            if b.poll is None or not raise_sites:
                continue
            path, line, function = raise_sites[0]
            others = len(raise_sites) - 1
            message = (f"{b.sender}.poll() (backend {b.name}) raises at {function} line {line}"
                       f"{f' (and {others} more places)' if others else ''} instead of returning Failed: {where}")
            evidence = drain_evidence(ctx) + [Evidence(b.poll.path, b.poll.line, f"{b.sender}.poll()")] + [
                Evidence(p, line, f"raise in {f}") for p, line, f in raise_sites]
            findings.append(self.finding(message, path, line, b.name, None, evidence))
        return findings


    def _absent_room(self, ctx: ScanContext, analysis, where: str) -> Finding:
        """poll() reads the status table with `table[room]` and the room can be absent: KeyError.
        Whether the room can be absent while the request is queued is the premise's question."""
        b = analysis.backend
        path, line, function = analysis.absent_raise_sites[0]
        message = (f"{b.sender}.poll() (backend {b.name}) raises KeyError at {function} line {line} when the room is "
                   f"absent from the status table: {where}")
        evidence = drain_evidence(ctx) + [Evidence(b.poll.path, b.poll.line, f"{b.sender}.poll()")] + [
            Evidence(p, line, f"{f}() reads the table for an absent room: KeyError") for p, line, f in analysis.absent_raise_sites]
        evidence += list(b.manager.clears) if b.manager else []
        premise = absent_room_premise(ctx, b, StateVerdict("", WayOut.NONE, "", absent_room=True))
        if premise is not None:
            message += f"; true only if {premise.text}: " + premise.why[-1].note.removeprefix("premise: ")
            evidence += [e for e in premise.why if e not in evidence]
        return self.finding(message, path, line, b.name, None, evidence, premise)


def _raise_sites_while_queued(ctx: ScanContext, analysis: SenderAnalysis) -> list[tuple[str, int, str]]:
    """The places poll() can raise at while the request is in this queue: when the queue's
    entry builds the sender, only what the methods that can have run since then write is on it
    (a raise behind a flag that only a later stage's send() sets cannot happen here)."""
    if analysis.poll is None or not analysis.raise_sites:
        return analysis.raise_sites
    history = sender_history(ctx, analysis.cls)
    if history is None:
        return analysis.raise_sites
    from kvtrace.backends import raise_sites_with_history
    return raise_sites_with_history(ctx.index, ctx.pack, ctx.domain, analysis, history.methods)


def _inside_handled_try(func: ast.AST, line: int) -> bool:
    return any(isinstance(node, ast.Try) and node.handlers and node.body
               and node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno)
               for node in walk(func))
