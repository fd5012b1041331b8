from __future__ import annotations

from kvtrace.model import Finding
from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.rules.samples import STANDARD_BRANCHES, drain, sender

_STUCK_POLL = '''\
        if not self.mgr.sent(self.room):
            return KVPoll.WaitingForInput
        return KVPoll.Success'''
_DEF = "def poll(self) -> KVPoll:"


def _suppressed_sender(comment: str) -> str:
    return sender("Stuck", _STUCK_POLL).replace(_DEF, f"{_DEF}  {comment}")


class UnusedSuppression(Rule):
    """A `# kvtrace: ignore[...]` comment that silences no finding, or one that is malformed.

    What it does:
        Reports each rule named in a suppression comment that matched no finding on its line
        or on the findings whose `def` line it is on, names that are not kvtrace rules at all,
        and comments that start like a directive but are not one (`# kvtrace: ignore[rule`
        unclosed, `ignore[]`, `ignore-next-line`, `ignore: rule`, a bare `ignore` naming no
        rule): those silence nothing. It runs after every other rule (ruff's RUF100).

    Why it matters:
        A suppression outlives the code it was written for: once the sender is fixed or the
        code moves, a stale comment would silently swallow the next real finding there.

    Example:
        `def poll(self):  # kvtrace: ignore[pinned-state]` on a sender whose poll() now reads
        its abort state, so pinned-state no longer reports it.

    Fix:
        Delete the comment (or the names in it that no longer match); write a malformed one
        as `# kvtrace: ignore[rule, ...]`.
    """

    code = "KVT100"  # the meta range: about kvtrace's own comments, not about SGLang
    name = "unused-suppression"
    title = "Unused suppression"
    severity = "warning"

    VALID = [
        # The comment silences the pinned WaitingForInput finding on poll()'s def line.
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES),
            "disaggregation/stuck/conn.py": _suppressed_sender("# kvtrace: ignore[pinned-state]"),
        }),
    ]
    INVALID = [
        # dropped-state reports nothing here: the comment is stale.
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES),
            "disaggregation/stuck/conn.py": _suppressed_sender("# kvtrace: ignore[pinned-state, dropped-state]"),
        }, expect=((None, None),)),
        # Unclosed: a typo silences nothing (the pinned finding stands) and is reported.
        Sample({
            "disaggregation/prefill.py": drain(STANDARD_BRANCHES),
            "disaggregation/stuck/conn.py": _suppressed_sender("# kvtrace: ignore[pinned-state"),
        }, expect=((None, None),)),
    ]

    def check(self, ctx: ScanContext) -> list[Finding]:
        # Needs the other rules' findings: kvtrace.scan calls `report_unused` after them.
        return []

    def report_unused(self, path: str, line: int, why: str) -> Finding:
        return self.finding(f"unused suppression: {why}", path, line, None, None, [])
