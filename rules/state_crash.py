from __future__ import annotations

from kvtrace.model import EventKind, Evidence, Finding, Outcome
from kvtrace.rules.base import Rule, Sample, ScanContext, drain_evidence, mode_named, path_evidence
from kvtrace.rules.premise import clause, crash_premise, joined, unseen_caller_premise
from kvtrace.rules.reentry_premise import reentry_premise
from kvtrace.rules.samples import SCHEDULER, STANDARD_BRANCHES, drain, sender

# The standard chain, but Bootstrapping (which the sender below returns while it handshakes)
# fails an assert instead of being kept.
_ASSERTS = STANDARD_BRANCHES.replace(
    "            else:\n                undone_reqs.append(req)",
    '            else:\n                assert False, f"unexpected poll state {poll}"')
# Pipeline-parallel consensus: on a later rank a request the previous rank finished must be
# finished here too; an assert says so. A caller passes rids_to_check, another does not.
_PP_ASSERT = '''\
            if rids_to_check is not None:
                if req.rid not in rids_to_check:
                    undone_reqs.append(req)
                    continue
                assert poll in (KVPoll.Success, KVPoll.Failed)
''' + STANDARD_BRANCHES
_PP_TOLERANT = _PP_ASSERT.replace(
    "                assert poll in (KVPoll.Success, KVPoll.Failed)\n",
    "                if poll not in (KVPoll.Success, KVPoll.Failed):\n"
    "                    undone_reqs.append(req)\n"
    "                    continue\n")
_CALLERS = '''
    def event_loop(self):
        self.drain_inflight()

    def event_loop_pp(self, finished_upstream):
        self.drain_inflight(rids_to_check=finished_upstream)
'''
_HANDSHAKING = sender("Hand", '''\
        if self.conclude_state is not None:
            return self.conclude_state
        return self.mgr.status(self.room)''')


def _pp_drain(branches: str) -> str:
    return drain(branches, _CALLERS).replace("def drain_inflight(self):", "def drain_inflight(self, rids_to_check=None):")


def crash_sites(ctx: ScanContext, state: str) -> dict[tuple[str, int], list[tuple[str, list, list[Evidence]]]]:
    """Where `state` crashes the drain: raise site -> [(mode label, a raising path, where it waits
    first)], for the modes in which every path that tests the poll value raises. Empty when no
    backend's poll() returns the state (or may: values kvtrace cannot read)."""
    if not ctx.model.returning(state) and not any(s.backend.returns_unknown for s in ctx.senders):
        return {}  # it never reaches the loop (unhandled-state still names the shape)
    sites: dict[tuple[str, int], list[tuple[str, list, list[Evidence]]]] = {}
    for (mode, deciding, _), fate in zip(ctx.model.deciding(state), ctx.model.mode_fates(state)):
        if not deciding or any(outcome is not Outcome.RAISES for _, outcome in deciding):
            continue
        for events, _ in deciding:
            raised = next((e for e in reversed(events) if e.kind is EventKind.RAISE), None)
            where = (raised.path, raised.line) if raised else (events[-1].path, events[-1].line)
            entry = sites.setdefault(where, [])
            if mode.label not in [label for label, _, _ in entry]:
                entry.append((mode.label, events, fate.waits))
    return sites


class StateCrash(Rule):
    """A poll state that a backend returns and the drain loop always raises on: a scheduler crash.

    What it does:
        For each mode of the drain (the ways the callers in the tree bind its parameters, such
        as `rids_to_check` passed by a pipeline-parallel event loop, or left at its default) and
        each poll state S some backend's poll() returns (or may: a value kvtrace cannot read),
        takes the paths of the drain loop on
        which the poll value decides (paths that test it). Reports S when every one of them
        raises: once a request polls S in that mode, the exception leaves the drain loop and the
        scheduler's event loop. Paths that keep the request without testing the poll value (a
        guard such as `req.rid not in rids_to_check`) only delay it. Such a state is a crash,
        never a pin: `pinned-state` needs a deciding path that keeps it. (`unhandled-state` names
        a raising catch-all that no backend is seen to reach, and leaves this one to this rule.)

    Why it matters:
        The whole server goes down, with every request on it, not one transfer. Under pipeline
        parallelism it needs only one rank to see a transfer end before another (clock skew,
        propagation delay): an `assert poll in (Success, Failed)` after the consensus check is
        enough.

    Example:
        `if rids_to_check is not None: ... assert poll == KVPoll.Success or poll ==
        KVPoll.Failed` (SGLang 0.5.2): on a later pipeline rank, a request the previous rank
        finished while this rank still polls WaitingForInput fails the assert.

    Fix:
        Keep the request (`undone_reqs.append(req); continue`) with a warning, or fail that one
        request (release, prepare_abort, finished list), instead of raising.
    """

    code = "KVT013"
    name = "state-crash"
    title = "Poll state that crashes the scheduler"
    severity = "error"
    title_clause = "{states} crash{es} the scheduler{from_backend}"

    VALID = [
        Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                "disaggregation/hand/conn.py": _HANDSHAKING}),
        # Consensus that keeps a lagging state instead of asserting.
        Sample({"disaggregation/prefill.py": _pp_drain(_PP_TOLERANT),
                "disaggregation/hand/conn.py": _HANDSHAKING}),
        # The assert is there, but the scheduler composing the mixin is in view and no caller
        # passes rids_to_check: the branch is dead.
        Sample({"disaggregation/prefill.py": drain(_PP_ASSERT).replace(
            "def drain_inflight(self):", "def drain_inflight(self, rids_to_check=None):"),
            "disaggregation/hand/conn.py": _HANDSHAKING, "managers/scheduler.py": SCHEDULER}),
    ]
    INVALID = [
        Sample({"disaggregation/prefill.py": drain(_ASSERTS),
                "disaggregation/hand/conn.py": _HANDSHAKING}, expect=((None, "Bootstrapping"),)),
        # The pipeline-parallel caller passes rids_to_check: every waiting state crashes there.
        Sample({"disaggregation/prefill.py": _pp_drain(_PP_ASSERT),
                "disaggregation/hand/conn.py": _HANDSHAKING},
               expect=((None, "Bootstrapping"), (None, "WaitingForInput"), (None, "Transferring"))),
    ]

    def check(self, ctx: ScanContext) -> list[Finding]:
        queue = ctx.queue
        if queue.drain is None:
            return []
        several = len(queue.modes) > 1
        findings = []
        for state in ctx.domain.members:
            by = ctx.model.returning(state)
            maybe = [s.backend.name for s in ctx.senders if s.backend.returns_unknown and s.backend.name not in by]
            sites = crash_sites(ctx, state)
            shared = (crash_premise(ctx, state) or reentry_premise(ctx, state)) if sites else None
            for (path, line), modes in sites.items():
                premise = joined(shared, unseen_caller_premise(
                    ctx, [m for m in queue.modes if m.label in [x for x, _, _ in modes]]))
                label, events, waits = modes[0]
                raised = next((e for e in reversed(events) if e.kind is EventKind.RAISE), None)
                what = f"{'an' if raised and raised.detail == 'assert' else 'a'} {raised.detail if raised else 'raise'}"
                when = ""
                if several:
                    when = " when " + " and when ".join(mode_named(m) for m, _, _ in modes) + \
                        "".join(f" (called so at {c.path}:{c.line})" for m in queue.modes
                                if m.label in [x for x, _, _ in modes] for c in m.callers[:1])
                held = f" once `{waits[0].note}` is false (the request waits while it holds)" if waits and waits[0].note else ""
                who = "; ".join(([f"returned by: {', '.join(by)}"] if by else []) +
                                ([f"maybe by: {', '.join(maybe)}, whose poll() returns values kvtrace cannot read"]
                                 if maybe else []))
                who = f" ({who})" if who else ""
                message = (f"{state}{who} crashes the scheduler{when}: every path of the drain loop of "
                           f"{ctx.pack.queue} that tests the poll value reaches {what} at line {line}{held}; "
                           f"the exception leaves the drain loop and the event loop instead of failing one request")
                evidence = drain_evidence(ctx) + [Evidence(c.path, c.line, f"mode {m.label}: {c.note}")
                                                  for m in queue.modes if several and m.label in [x for x, _, _ in modes]
                                                  for c in m.callers[:1]]
                evidence += [Evidence(w.path, w.line, f"waits first: {w.note}") for w in waits if w.note]
                evidence += path_evidence(events, state) + [Evidence(path, line, f"raise: {state} crashes here")]
                if premise is not None:
                    message += "; " + clause(premise)
                    evidence += [e for e in premise.why if e not in evidence]
                findings.append(self.finding(message, path, line, None, state, evidence,
                                             premise))
        return findings
