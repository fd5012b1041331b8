from __future__ import annotations

from kvtrace.freeing import abort_ended, abort_ends_text
from kvtrace.model import Evidence, Finding
from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.rules.samples import STANDARD_BRANCHES, drain, sender

_READS_ABORT = '''\
        if self.conclude_state is not None:
            return self.conclude_state
        return self.mgr.status(self.room)'''
_IGNORES_ABORT = '''\
        return self.mgr.status(self.room)'''


class AbortIgnored(Rule):
    """A sender's poll() never consults what its abort() changes: aborting it changes nothing.

    What it does:
        For each backend, collects what abort() writes (the sender's own attributes, through the
        methods it calls) and walks the poll() the backend really runs. Reports poll(), at its
        def, when no path reads any of it, or when the backend has no concrete abort() at all,
        unless abort() still ends every state poll() can wait in another way (a Failed it
        stores in the manager's status table that poll() reads back).

    Why it matters:
        abort() is how the scheduler gives up on a transfer (a client disconnect, a failed peer,
        a bootstrap failure on the other side). If poll() never looks, the queue keeps polling
        the old status: the request is only freed if the transfer itself moves on, which is the
        one thing that is not happening when it was aborted.

    Example:
        `abort()` sets `self.conclude_state = KVPoll.Failed`; `poll()` returns
        `self.kv_mgr.check_status(self.room)` and never looks at conclude_state.

    Fix:
        Start poll() with `if self.conclude_state is not None: return self.conclude_state`
        (or have abort() record Failed in the manager's status table that poll() reads).
    """

    code = "KVT008"
    name = "abort-ignored"
    title = "poll() ignores abort()"
    severity = "warning"
    per_queue = False
    title_clause = "{owner} poll() ignores abort(){on_states}"

    VALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                     "disaggregation/good/conn.py": sender("Good", _READS_ABORT)})]
    INVALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                       "disaggregation/deaf/conn.py": sender("Deaf", _IGNORES_ABORT)},
                      expect=(("deaf", None),))]

    def check(self, ctx: ScanContext) -> list[Finding]:
        findings = []
        for analysis in ctx.senders:
            b = analysis.backend
            if b.poll is None or b.reads_abort_state:
                continue
            if not any(state in ctx.domain.non_terminal for state in b.returns):
                continue  # poll() only ever concludes: there is no wait for an abort to cut short
            ended = abort_ended(b)
            others = [s for s in b.verdicts if s not in ended]
            if ended and not others and all(b.verdicts[state].abort_via for state in ended):
                continue  # abort() reaches poll() another way (a Failed in the manager's table) for every state
            abort = ctx.index.find_method(analysis.cls, ctx.pack.abort_method)
            evidence = [Evidence(b.path, b.line, f"class {b.sender} (backend {b.name})")]
            if b.abort_writes:  # each write at its own line, in abort() or a method it calls
                evidence.extend(b.abort_writes)
            elif abort is not None:
                evidence.append(Evidence(abort.path, abort.line, f"{ctx.pack.abort_method}() writes nothing poll() could read"))
            inherited = f" (inherited from {b.poll.inherited_from})" if b.poll.inherited_from else ""
            read = "never reads it" if abort is not None else f"reads no abort state (there is no {ctx.pack.abort_method}())"
            evidence.append(Evidence(b.poll.path, b.poll.line, f"{b.sender}.poll(){inherited} {read}"))
            if b.abort_state:
                what = f"never reads {b.abort_state}, which {ctx.pack.abort_method}() writes"
            elif abort is None:
                what = (f"cannot be aborted: {b.sender} has no {ctx.pack.abort_method}() at all, so nothing can "
                        f"cancel the transfer and the queue waits for it")
            elif not b.has_abort:
                what = f"cannot be aborted: {ctx.pack.abort_method}() is abstract in every class {b.sender} inherits"
            else:
                what = f"cannot see an abort: {ctx.pack.abort_method}() writes no attribute of the {ctx.pack.kv_object}"
            # abort() may still reach poll() another way (a Failed stored in the manager's table):
            # then say which states it ends, as "what frees" does, and which it does not.
            if ended:
                tail = f"; {abort_ends_text(b)}" + (f", but not {', '.join(others)}" if others else "")
            elif abort is not None:
                tail = f": aborting {_article(b.name)} {b.name} transfer does not change what the queue polls"
            else:
                tail = ""
            message = f"{b.sender}.poll(){inherited} {what}{tail}"
            findings.append(self.finding(message, b.poll.path, b.poll.line, b.name, None, evidence))
        return findings


def _article(word: str) -> str:
    """`an ascend`, `a nixl`, `a mooncake`: by the first letter's sound as most names are read."""
    return "an" if word[:1].lower() in "aeiou" else "a"
