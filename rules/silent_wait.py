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


# A pipeline-parallel consensus wait (a request another rank has not finished stays, whatever its
# poll state, with nothing logged) before the logged branches: a wait on the other rank, no
# silent keep of any state.
_PP_WAIT_THEN_LOGGED = """\
            if rids_to_check is not None:
                if req.rid not in rids_to_check:
                    undone_reqs.append(req)
                    continue
""" + _LOGGED_WAIT
_PP_CALLERS = """
    def event_loop(self):
        self.drain_inflight()

    def event_loop_pp(self, finished_upstream):
        self.drain_inflight(rids_to_check=finished_upstream)
"""


class SilentWait(Rule):
    """The drain loop keeps a waiting request without a log line or a metric: only the gauge shows it.

    What it does:
        For each non-terminal poll state the drain loop keeps, looks at the paths through each
        statement that keeps it for a call the pack names as a log (`logger.*`) or a metric
        (`*metrics_collector.*`). Reports the state at a keep statement no path through which
        leaves any trace (preferring the branch that tests for the state). Only paths that test
        the poll value count: a keep that every state reaches alike without a test of it (the
        pipeline-parallel `if req.rid not in rids_to_check: keep`) waits on something else.

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
    title_clause = "{states} wait{s} with no trace{from_backend}"

    VALID = [Sample({"disaggregation/prefill.py": drain(_LOGGED_WAIT)}),
             Sample({"disaggregation/prefill.py": drain(_PP_WAIT_THEN_LOGGED, _PP_CALLERS).replace(
                 "def drain_inflight(self):", "def drain_inflight(self, rids_to_check=None):")})]
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
            # Only paths that test the poll value count: a keep reached without testing it (the
            # pipeline-parallel `if req.rid not in rids_to_check: keep`) is a wait on something
            # else that treats every state alike, not the drain keeping this state.
            sites: dict[tuple[str, int], list] = {}
            for _, deciding, _ in ctx.model.deciding(state):
                for events, outcome in deciding:
                    keep = next((e for e in reversed(events) if e.kind == EventKind.KEEP), None)
                    if outcome is Outcome.KEPT and keep is not None:
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
