from __future__ import annotations

from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.rules.samples import SCHEDULER, STANDARD_BRANCHES, drain
from kvtrace.model import Evidence, Finding

_FILL_ONLY = '''\
class PrefillMixin:
    def finish_batch(self, batch):
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)

    def report(self):
        return {"inflight": len(self.disagg_prefill_inflight_queue)}
'''


class UndrainedQueue(Rule):
    """Requests are appended to the queue, but no loop drains it.

    What it does:
        Reports each place that appends to the queue when no function in the tree both iterates
        the queue and assigns it back (the drain loop the pack describes).

    Why it matters:
        Every request that enters is pinned: the gauge only grows. This is usually a refactor
        that renamed or moved the drain method, or a fork that dropped it.

    Example:
        `self.disagg_prefill_inflight_queue.append(req)` after the forward pass, and no
        `process_disagg_prefill_inflight_queue` (or any loop that reassigns the queue).

    Fix:
        Restore the drain loop, or point kvtrace at the tree that has it (`--rules` for a fork
        whose queue or drain differs).
    """

    code = "KVT003"
    name = "undrained-queue"
    title = "Queue never drained"
    severity = "error"
    title_clause = "the queue is never drained"

    VALID = [
        Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES)}),
        # Filled, and bound nowhere in view: the object is built (and may be drained) out of view.
        Sample({"disaggregation/prefill.py": _FILL_ONLY}),
    ]
    # The scheduler in view composes the mixin and binds the queue: nothing in view drains it.
    INVALID = [Sample({"disaggregation/prefill.py": _FILL_ONLY, "managers/scheduler.py": SCHEDULER},
                      expect=((None, None),))]

    def check(self, ctx: ScanContext) -> list[Finding]:
        if ctx.queue.drain is not None or ctx.queue.unparsed or ctx.queue.unseen_callers or ctx.unread:
            return []  # drained, or what may drain it could not be read or seen (a gap, not a finding)
        return [
            self.finding(
                f"{site.function} appends to {ctx.pack.queue}, but no function in the tree iterates it and "
                f"assigns it back: nothing ever takes a request out",
                site.path, site.line, None, None, [Evidence(site.path, site.line, "entry")],
            )
            for site in ctx.entries
        ]
