from __future__ import annotations

from kvtrace.model import EventKind, Evidence, Finding, Outcome
from kvtrace.rules.base import Rule, Sample, ScanContext, drain_evidence, path_evidence
from kvtrace.rules.samples import STANDARD_BRANCHES, drain

_LOGGED_WAIT = STANDARD_BRANCHES.replace(
    "            if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:\n                undone_reqs.append(req)",
    "            if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:\n"
    "                self.metrics_collector.observe_waiting(req)\n"
    "                undone_reqs.append(req)").replace(
    "            else:\n                undone_reqs.append(req)",
    '            else:\n                logger.debug("still bootstrapping %s", req.rid)\n                undone_reqs.append(req)')


class SilentWait(Rule):
    """The drain loop keeps a waiting request without a log line or a metric: only the gauge shows it.

    What it does:
        For each non-terminal poll state the drain loop keeps, looks at the paths through each
        statement that keeps it for a call the pack names as a log (`logger.*`) or a metric
        (`*metrics_collector.*`). Reports the state at a keep statement no path through which
        leaves any trace (preferring the branch that tests for the state).

    Why it matters:
        A request stuck in that state is visible only as a queue-length gauge that does not go
        down. Nothing says which request, which room, since when, or which backend, so on-call
        engineers start from a number and grep the source (the investigation this tool replaces).

    Example:
        `if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]: undone_reqs.append(req)` with
        no logging anywhere on that branch.

    Fix:
        Log (rate-limited, at debug or warning once a request waits long) the rid, room, state
        and age when keeping it, or count waiting requests per state in a metric.
    """

    code = "KVT005"
    name = "silent-wait"
    title = "Waiting request leaves no trace"
    severity = "note"

    VALID = [Sample({"disaggregation/prefill.py": drain(_LOGGED_WAIT)})]
    INVALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES)},
                      expect=((None, "Bootstrapping"), (None, "WaitingForInput"), (None, "Transferring")))]

    def check(self, ctx: ScanContext) -> list[Finding]:
        queue = ctx.queue
        if queue.drain is None:
            return []
        findings = []
        for state in ctx.domain.non_terminal:
            # Per keep site: a log on another branch (say, the pipeline-parallel one) does not
            # make the ordinary wait visible.
            sites: dict[tuple[str, int], list] = {}
            for events in ctx.model.paths(state, Outcome.KEPT):
                keep = next((e for e in reversed(events) if e.kind == EventKind.KEEP), None)
                if keep is not None:
                    sites.setdefault((keep.path, keep.line), []).append(events)
            silent = [(where, group) for where, group in sites.items()
                      if not any(e.kind in (EventKind.LOG, EventKind.METRIC) for events in group for e in events)]
            if not silent:
                continue
            # Prefer the site where the poll value was matched (the branch meant for S).
            silent.sort(key=lambda item: not any(e.kind == EventKind.CHECK and e.detail == "T"
                                                 for events in item[1] for e in events))
            (path, line), group = silent[0]
            message = (f"{ctx.pack.queue} keeps {state} at line {line} without a log line or a metric: a request "
                       f"stuck in {state} shows only in the queue gauge")
            evidence = drain_evidence(ctx) + path_evidence(group[0], state) + [
                Evidence(path, line, f"keep: back into the queue for {state}, nothing logged")]
            findings.append(self.finding(message, path, line, None, state, evidence))
        return findings
