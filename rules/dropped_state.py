from __future__ import annotations

from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.rules.samples import STANDARD_BRANCHES, drain, sender
from kvtrace.model import Consequence, EventKind, Evidence, Finding, Outcome

# The standard chain with its final `else` cut off: Bootstrapping falls through every branch.
_CHAIN_WITHOUT_ELSE = STANDARD_BRANCHES.rsplit("\n            else:", 1)[0]

_HEALTHY_SENDER = '''\
        if self.conclude_state is not None:
            return self.conclude_state
        return self.mgr.status(self.room)'''


class DroppedState(Rule):
    """A poll state for which the drain loop drops the request without releasing or answering it.

    What it does:
        Reports a poll state S when some path through the drain loop with poll == S neither
        puts the request back into the queue, nor hands it to a finished list, nor releases or
        aborts it: the request silently vanishes when the queue is reassigned.

    Why it matters:
        The request's KV cache, tree-cache lock and metadata buffer are never released and its
        client waits forever. The gauge looks healthy, which makes the leak hard to see.

    Example:
        An `if poll in [...] / elif poll == Success / elif poll == Failed` chain with no `else`:
        Bootstrapping falls through every branch.

    Fix:
        End the chain with an `else` that keeps the request (`undone_reqs.append(req)`) or fails
        it loudly (release, prepare_abort, done list).
    """

    code = "KVT002"
    name = "dropped-state"
    title = "Dropped poll state"
    severity = "warning"
    consequence = Consequence.DROPPED

    VALID = [
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES),
            "disaggregation/good/conn.py": sender("Good", _HEALTHY_SENDER),
        }),
    ]
    INVALID = [
        Sample({
            "disaggregation/prefill.py": drain(_CHAIN_WITHOUT_ELSE),
            "disaggregation/good/conn.py": sender("Good", _HEALTHY_SENDER),
        }, expect=((None, "Bootstrapping"),)),
    ]

    def check(self, ctx: ScanContext) -> list[Finding]:
        queue = ctx.queue
        if queue.drain is None:
            return []
        drain = queue.drain
        loop_line = queue.loop_line()
        findings = []
        for state in ctx.domain.members:
            dropped = ctx.model.paths(state, Outcome.DROPPED)
            if not dropped:
                continue
            evidence = [Evidence(drain.func.path, loop_line, f"drain loop in {drain.func.qualname}")]
            seen = set()
            for events in dropped:
                for e in events:
                    if e.kind in (EventKind.CHECK, EventKind.HELPER) and (e.path, e.line) not in seen:
                        seen.add((e.path, e.line))
                        verdict = {"T": "true", "F": "false"}.get(e.detail, e.detail)
                        evidence.append(Evidence(e.path, e.line, f"{e.kind}: {verdict} for {state}"))
            returned_by = ctx.model.returning(state)
            by = f" (returned by: {', '.join(returned_by)})" if returned_by else ""
            message = (
                f"{state}{by} can be dropped from {ctx.pack.queue}: a path of the drain loop neither "
                f"keeps it, finishes it, releases it nor aborts it"
            )
            findings.append(self.finding(message, drain.func.path, loop_line, None, state, evidence))
        return findings
