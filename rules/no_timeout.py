from __future__ import annotations

from kvtrace.model import Evidence, Finding
from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.rules.samples import STANDARD_BRANCHES, drain, sender

_DEADLINE_FOR_ALL = '''\
        status = self.mgr.status(self.room)
        if status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring):
            if time.time() - self.started > self.bootstrap_timeout:
                return KVPoll.Failed
        return status'''
_DEADLINE_FOR_BOOTSTRAP = '''\
        status = self.mgr.status(self.room)
        if status == KVPoll.Bootstrapping:
            if time.time() - self.started > self.bootstrap_timeout:
                return KVPoll.Failed
            return status
        if status == KVPoll.Transferring:
            return KVPoll.Transferring
        return KVPoll.Success'''


class NoTimeout(Rule):
    """A non-terminal state a backend's poll() can return with no deadline reachable for it.

    What it does:
        For each backend and each non-terminal state S its poll() can return, looks for an
        elapsed-time check on the paths that return S (in poll() and the helpers it calls)
        whose true branch leaves S. Reports S at poll()'s def when there is none, saying which
        deadlines exist elsewhere: for another state of the same backend, or for S in another
        backend.

    Why it matters:
        A transfer can stall in any state: a peer that died, a lost message, a bootstrap server
        restarted. Without a deadline the state lasts as long as the process, and if the drain
        loop keeps it the request is pinned (see pinned-state for the whole chain).

    Example:
        poll() fails Bootstrapping after bootstrap_timeout, but returns WaitingForInput and
        Transferring for as long as the manager says so.

    Fix:
        Check a deadline for every non-terminal state (a waiting timeout from the moment the
        state was entered) and return Failed, recording why.
    """

    code = "KVT009"
    name = "no-timeout"
    title = "Non-terminal state without a deadline"
    severity = "note"
    per_queue = False
    title_clause = "{subject} has no deadline for {states}"

    VALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                     "disaggregation/timely/conn.py": sender("Timely", _DEADLINE_FOR_ALL)})]
    INVALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                       "disaggregation/partial/conn.py": sender("Partial", _DEADLINE_FOR_BOOTSTRAP)},
                      expect=(("partial", "Transferring"),))]

    def check(self, ctx: ScanContext) -> list[Finding]:
        findings = []
        for analysis in ctx.senders:
            b = analysis.backend
            if b.poll is None:
                continue
            for state in ctx.domain.non_terminal:
                if state not in b.returns or any(state in t.covers for t in b.timeouts):
                    continue
                own = [t for t in b.timeouts if t.covers]
                other = [(s.backend, t) for s in ctx.senders if s is not analysis
                         for t in s.backend.timeouts if state in t.covers]
                elsewhere = []
                if own:
                    elsewhere.append("this backend has a deadline for " + ", ".join(
                        f"{'/'.join(t.covers)} ({t.path}:{t.line})" for t in own))
                if other:
                    elsewhere.append(f"{state} has one in " + ", ".join(
                        f"{o.name} ({t.path}:{t.line})" for o, t in other))
                message = (f"{b.sender}.poll() can return {state} with no deadline reachable for it"
                           + (f"; {'; '.join(elsewhere)}" if elsewhere else "; no deadline anywhere in this backend"))
                inherited = f" (inherited from {b.poll.inherited_from})" if b.poll.inherited_from else ""
                evidence = [Evidence(b.poll.path, b.poll.line, f"{b.sender}.poll(){inherited} can return {state}")]
                evidence += [Evidence(t.path, t.line, f"deadline for {'/'.join(t.covers)} only") for t in own]
                evidence += [Evidence(t.path, t.line, f"{o.name}: deadline covering {state}") for o, t in other]
                findings.append(self.finding(message, b.poll.path, b.poll.line, b.name, state, evidence))
        return findings
