"""The skip-poll shape (sglang#25561, #37483): a drain that returns before polling once every
queued request carries a flag set on WaitingForInput. Generated variants of the guard, the flag
and the manager's thread are run with recording fakes (does a Failed the thread stores into the
status table abort the request in the next round?) and kvtrace's `skip-poll` must say the same.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import example, given, strategies as st

from kvtrace.scan import scan_path
from kvtrace.rules.samples import MANAGED_SENDER, SHARED_FILES, manager
from tests.property.gen import budget

# The guard before the poll, in the drain's words (`Q` is the queue list).
GUARDS = {
    "none": None,
    "all": "all(r.waiting_for_input for r in Q)",
    # The receiver's own abort is seen (sglang 0.5.19), the table is not.
    "all-but-aborted": "all(r.waiting_for_input for r in Q) and not any("
                       "r.disagg_kv_sender.conclude_state == KVPoll.Failed for r in Q)",
    # The guard polls: whatever the table holds is seen.
    "all-but-polled": "all(r.waiting_for_input for r in Q) and not any("
                      "p == KVPoll.Failed for p in poll_and_all_reduce([r.disagg_kv_sender for r in Q], self.group))",
    # Another flag than the one the drain sets: never all set.
    "other-flag": "all(r.bootstrap_done for r in Q)",
}


@dataclass(frozen=True)
class Shape:
    guard: str
    sets_flag: bool  # the drain sets waiting_for_input on WaitingForInput
    thread_stores_failed: bool  # the manager's bootstrap thread stores Failed into the table

    def drain(self) -> str:
        q = "self.disagg_prefill_inflight_queue"
        guard = GUARDS[self.guard]
        skip = f"        if {guard.replace('Q', q)}:\n            return\n" if guard else ""
        flag = "                req.waiting_for_input = True\n" if self.sets_flag else ""
        return f'''\
from .base.conn import KVPoll
from .utils import poll_and_all_reduce, prepare_abort


class PrefillMixin:
    def finish_batch(self, batch):
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)

    def drain_inflight(self):
{skip}        polls = poll_and_all_reduce([r.disagg_kv_sender for r in {q}], self.group)
        undone_reqs = []
        for req, poll in zip({q}, polls):
            if poll == KVPoll.WaitingForInput:
{flag}                undone_reqs.append(req)
            elif poll == KVPoll.Failed:
                prepare_abort(req, "failed")
            else:
                undone_reqs.append(req)
        self.disagg_prefill_inflight_queue = undone_reqs
'''

    def manager(self) -> str:
        thread = "        self.update_status(room, KVPoll.Failed)" if self.thread_stores_failed else "        pass"
        return manager() + f"\n    def bootstrap_thread(self, room):\n{thread}\n"


shapes = st.builds(Shape, st.sampled_from(sorted(GUARDS)), st.booleans(), st.booleans())


class _Poll:
    Failed, Bootstrapping, WaitingForInput, Transferring, Success = range(5)


def oracle_missed(shape: Shape) -> bool:
    """Run two rounds with fakes: the request polls WaitingForInput, then the thread stores
    Failed; True when the second round leaves the request in the queue, not aborted."""
    table: dict[int, int] = {7: _Poll.WaitingForInput}

    class Sender:
        conclude_state = None

        def poll(self) -> int:
            return self.conclude_state if self.conclude_state is not None else table[7]

    class Req:
        def __init__(self) -> None:
            self.disagg_kv_sender = Sender()
            self.waiting_for_input = False
            self.bootstrap_done = False
            self.finished_reason = None

    def prepare_abort(req: Req, message: str) -> None:
        req.finished_reason = message

    source = "\n".join(line for line in shape.drain().splitlines() if not line.startswith("from "))
    namespace = {"KVPoll": _Poll, "prepare_abort": prepare_abort,
                 "poll_and_all_reduce": lambda senders, group: [s.poll() for s in senders]}
    exec(compile(source, "<drain>", "exec"), namespace)
    mixin = namespace["PrefillMixin"]()
    req = Req()
    mixin.group = None
    mixin.disagg_prefill_inflight_queue = [req]
    mixin.drain_inflight()  # round 1: WaitingForInput
    if shape.thread_stores_failed:
        table[7] = _Poll.Failed  # the manager's thread, between rounds
    mixin.drain_inflight()  # round 2
    return shape.thread_stores_failed and req.finished_reason is None


def kvtrace_missed(shape: Shape, root: Path) -> bool:
    files = {**SHARED_FILES, "disaggregation/prefill.py": shape.drain(),
             "disaggregation/net/conn.py": MANAGED_SENDER, "disaggregation/net/mgr.py": shape.manager()}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    report = scan_path(root)
    return any(f.rule == "skip-poll" and f.backend == "net" and f.state == "Failed" for f in report.findings)


@budget(ci=12, slow=200)
@given(shape=shapes)
@example(shape=Shape("all", True, True))  # sglang#25561's shape
@example(shape=Shape("all-but-aborted", True, True))  # sglang#37483 (0.5.19)
@example(shape=Shape("none", True, True))  # 0.5.20: always polls
@example(shape=Shape("all-but-polled", True, True))
def test_skip_poll_matches_execution(shape: Shape) -> None:
    with tempfile.TemporaryDirectory() as d:
        assert kvtrace_missed(shape, Path(d)) == oracle_missed(shape), shape


def test_oracle_on_known_shapes() -> None:
    """The oracle on its own: the two upstream shapes miss the thread's Failed, polling sees it."""
    assert oracle_missed(Shape("all", True, True))
    assert oracle_missed(Shape("all-but-aborted", True, True))
    assert not oracle_missed(Shape("none", True, True))
    assert not oracle_missed(Shape("all-but-polled", True, True))
    assert not oracle_missed(Shape("all", False, True))  # the flag is never set: it polls
    assert not oracle_missed(Shape("all", True, False))  # nothing to miss
