from __future__ import annotations

from kvtrace.rules.base import Rule, Sample, ScanContext, mode_named
from kvtrace.rules.premise import Premise, clause, joined, unseen_caller_premise, verdict_premise
from kvtrace.rules.send_flow import polled_attributes
from kvtrace.rules.way_in import answered_before_entry, entered_chain, send_verdict
from kvtrace.rules.samples import STANDARD_BRANCHES, drain, sender
from kvtrace.model import Consequence, EventKind, Evidence, Finding, Outcome, PremiseKind


_WAITS_UNTIL_BEGUN = '''\
        if not self.begun:
            return KVPoll.WaitingForInput
        if time.time() - self.begun_at > self.bootstrap_timeout:
            return KVPoll.Failed
        return KVPoll.Success'''
_BEGIN_METHOD = '''
    def begin(self):
        self.begun = True
        self.begun_at = time.time()
'''
_NOT_BEGUN = "        self.begun = False\n"
_BEGIN = "            req.disagg_kv_sender.begin()\n"
_BEGIN_SOMETIMES = "            if req.ready:\n                req.disagg_kv_sender.begin()\n"


class PinnedState(Rule):
    """A poll state that the drain loop always keeps and the backend's poll() never leaves.

    What it does:
        For each transfer backend and each non-terminal poll state S, reports S when (1) in some
        mode of the drain (the ways its callers bind its parameters, e.g. `rids_to_check` left at
        its default or passed by a pipeline-parallel loop) a path on which the poll value decides
        (a path that tests it) keeps the request and no path takes it out (a path that keeps it
        without testing the poll value waits on something else; when every deciding path raises
        it is `state-crash`'s),
        (2) the poll() the backend really runs can return S (with the manager's status table
        holding a state, or the room absent from it), and (3) from there neither abort() followed
        by poll() nor the clock past every deadline makes poll() return a terminal state. A
        sender call that ends the pin (it sets the flag poll() tests, or starts the clock of a
        timeout) and runs on every request's way into the queue, or right after the append,
        rules the state out; so does a flag the request must carry to get in (`if not
        req.handshaken: continue`) that is set only where its poll() answered a state after
        which poll() never answers S again (the receiver's handshake, never undone). The
        finding lists the chain of reasons, each with its line.

    Why it matters:
        Such a request stays in the queue forever once the transfer stalls or is aborted: the
        queue's length gauge sticks at 1 or more (num_prefill_bootstrap_queue_reqs or
        num_prefill_inflight_queue_reqs on a prefill server, num_decode_prealloc_queue_reqs or
        num_decode_transfer_queue_reqs on a decode server), what the request holds there (its
        KV cache and metadata buffer, or the KV memory reserved for it) is never released, and
        its client never gets an answer.

    Example:
        A NIXL-style sender whose poll() returns WaitingForInput until its transfer finishes,
        with an abort() that sets self.conclude_state which poll() never looks at.

    Fix:
        Make poll() return the abort state first (`if self.conclude_state is not None: return
        self.conclude_state`), and check a bootstrap/waiting timeout for every non-terminal
        state it can return, turning it into Failed.
    """

    code = "KVT001"
    name = "pinned-state"
    title = "Pinned poll state"
    severity = "error"
    consequence = Consequence.PINNED

    VALID = [
        # poll() reads the abort state and times out while waiting.
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES),
            "disaggregation/good/conn.py": sender("Good", '''\
        if self.conclude_state is not None:
            return self.conclude_state
        if time.time() - self.started > self.bootstrap_timeout:
            return KVPoll.Failed
        return self.mgr.status(self.room)'''),
        }),
        # poll() waits without a deadline only until begin(), which starts the clock of a
        # timeout; every request runs begin() on its way into the queue.
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES, entering=_BEGIN),
            "disaggregation/clocked/conn.py": sender("Clocked", _WAITS_UNTIL_BEGUN, _BEGIN_METHOD, _NOT_BEGUN),
        }),
    ]
    INVALID = [
        # poll() ignores conclude_state and has no timeout: WaitingForInput is pinned.
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES),
            "disaggregation/stuck/conn.py": sender("Stuck", '''\
        if not self.mgr.sent(self.room):
            return KVPoll.WaitingForInput
        return KVPoll.Success'''),
        }, expect=(("stuck", "WaitingForInput"),)),
        # A timeout that only covers Bootstrapping leaves Transferring pinned.
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES),
            "disaggregation/partial/conn.py": sender("Partial", '''\
        status = self.mgr.status(self.room)
        if status == KVPoll.Bootstrapping:
            if time.time() - self.started > self.bootstrap_timeout:
                return KVPoll.Failed
            return status
        if status == KVPoll.Transferring:
            return KVPoll.Transferring
        return KVPoll.Success'''),
        }, expect=(("partial", "Transferring"),)),
        # begin() runs only on some requests' way in: the others wait without a deadline.
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES, entering=_BEGIN_SOMETIMES),
            "disaggregation/clocked/conn.py": sender("Clocked", _WAITS_UNTIL_BEGUN, _BEGIN_METHOD, _NOT_BEGUN),
        }, expect=(("clocked", "WaitingForInput"),)),
    ]

    def check(self, ctx: ScanContext) -> list[Finding]:
        queue = ctx.queue
        if queue.drain is None:
            return []
        several = len(queue.modes) > 1
        findings = []
        for state in ctx.domain.non_terminal:
            # Per mode of the drain: some path on which the poll value decides (one that tests
            # it) keeps the request, and no path takes it out. A path that keeps it without
            # testing the poll value is a wait on something else (`req.rid not in
            # rids_to_check`), not a pin; when every deciding path raises it is state-crash's.
            pinned = []
            for mode, deciding, every in ctx.model.deciding(state):
                if any(outcome is Outcome.KEPT for _, outcome in deciding) \
                        and not any(outcome in (Outcome.LEAVES, Outcome.DROPPED) for _, outcome in every):
                    pinned.append((mode, deciding))
            if not pinned:
                continue
            raises = any(outcome is Outcome.RAISES for _, deciding in pinned for _, outcome in deciding)
            keep_paths = [events for _, deciding in pinned for events, outcome in deciding if outcome is Outcome.KEPT]
            keep_sites = sorted({(e.path, e.line) for events in keep_paths for e in events if e.kind == EventKind.KEEP})
            silent = not any(e.kind == EventKind.LOG for events in keep_paths for e in events)
            keeps = "the drain loop keeps it" + (" (or raises)" if raises else "") + " and never lets it out"
            if not several:
                where = keeps
            elif len(pinned) == len(queue.modes):
                where = f"in every mode of the drain ({'; '.join(m.label for m, _ in pinned)}) {keeps}"
            else:
                where = f"when {' and when '.join(mode_named(m.label) for m, _ in pinned)}, {keeps}"
            for analysis in ctx.senders:
                b = analysis.backend
                verdict = ctx.model.way_out(b.name, state)
                if b.poll is None or verdict is None or not verdict.pinned:
                    continue
                # Every request entered with a sender method run (init() setting the flag of an
                # early return): the chain poll() gives after it, and that call.
                entered = entered_chain(ctx, b, state)
                chain = verdict.chain if entered is None else (entered[1], *entered[0])
                message = (
                    f"{state} can pin {ctx.pack.queue} with the {b.name} backend: {where}, and {b.sender}.poll() "
                    f"has no way out of it: " + "; ".join(link.note for link in chain)
                    + ("; the loop logs nothing when it keeps it, so only the queue gauge shows it" if silent else "")
                )
                evidence = [Evidence(s.path, s.line, f"entry: {s.function} appends to the queue") for s in ctx.entries]
                drain = queue.drain
                if drain.poll_line is not None:
                    evidence.append(Evidence(drain.func.path, drain.poll_line, "poll: states read for the queue"))
                evidence.append(Evidence(drain.func.path, queue.loop_line(), f"drain loop in {drain.func.qualname}"))
                if several:
                    evidence += [Evidence(c.path, c.line, f"mode {m.label}: {c.note}") for m, _ in pinned for c in m.callers[:1]]
                evidence += [Evidence(p, line, f"keep: back into the queue for {state}") for p, line in keep_sites]
                evidence += list(chain)
                unseen = unseen_caller_premise(ctx, [m for m, _ in pinned])
                premise = joined(verdict_premise(ctx, b, state, verdict), unseen)
                if answered_before_entry(ctx, set(b.past.get(state, ())), polled_attributes(ctx)):
                    continue  # every way in requires a flag set only once poll() answered past the state
                sent = send_verdict(ctx, b, state)
                if sent is not None and sent[0] == "gone":
                    continue  # every path calls what ends the pin, on its way in or right after the append
                if sent is not None and (premise is None or premise is unseen):
                    kind, why, text = sent
                    skipped = Premise(text, PremiseKind.SEND_SKIPPED, list(why))
                    skips = [e for e in why if "skips it" in e.note or "leaves before" in e.note]
                    message += f"; true only if {text}" + (": " + "; ".join(f"{e.path}:{e.line} {e.note}" for e in skips)
                                                            if skips else "")
                    evidence += [e for e in why if e not in evidence]
                    if unseen is not None:
                        message += "; " + clause(unseen)
                        evidence += [e for e in unseen.why if e not in evidence]
                    findings.append(self.finding(message, b.poll.path, b.poll.line, b.name, state, evidence,
                                                 joined(skipped, unseen)))
                    continue
                if premise is not None:
                    message += "; " + clause(premise)
                    evidence += [e for e in premise.why if e not in evidence]
                findings.append(self.finding(message, b.poll.path, b.poll.line, b.name, state, evidence,
                                             premise))
        return findings
