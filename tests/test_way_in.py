"""What ran on a request's way into the queue (rules/way_in.py), by the shape of the way in: a call
that ends the pin and dominates every append rules the pinned state out; anything less keeps it.

Each case is a small tree: the prefill drain, a sender whose poll() waits without a deadline
until begin() (which starts the clock of a timeout), and the producer code under test."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace.rules.samples import SHARED_FILES, STANDARD_BRANCHES, drain, sender
from kvtrace.scan import scan_path

_SENDER = sender("Clocked", '''\
        if not self.begun:
            return KVPoll.WaitingForInput
        if time.time() - self.begun_at > self.bootstrap_timeout:
            return KVPoll.Failed
        return KVPoll.Success''', '''
    def begin(self):
        self.begun = True
        self.begun_at = time.time()
''', "        self.begun = False\n")

_FINISH = '''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)
'''

# The scheduler binds the inflight queue and the ready queue the producer takes requests from.
_SCHEDULER = '''\
from ..disaggregation.prefill import PrefillMixin, ReadyQueue


class Scheduler(PrefillMixin):
    def __init__(self):
        self.disagg_prefill_inflight_queue = []
        self.ready_queue = ReadyQueue()


def run_scheduler_process():
    Scheduler().event_loop()
'''


def _tree(root: Path, finish: str, ready_queue: str = "") -> Path:
    prefill = drain(STANDARD_BRANCHES).replace(_FINISH, finish)
    assert finish in prefill
    files = {**SHARED_FILES,
             "disaggregation/prefill.py": prefill + ready_queue,
             "disaggregation/clocked/conn.py": _SENDER,
             "managers/scheduler.py": _SCHEDULER}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _pinned(root: Path) -> set[str]:
    report = scan_path(root)
    assert all(f.status == "ok" for f in report.files), [(f.path, f.error) for f in report.files]
    return {f.state for f in report.findings if f.rule == "pinned-state" and f.backend == "clocked"}


_READY_QUEUE = '''

class ReadyQueue:
    def __init__(self):
        self.queue = []

    def pop_ready(self):
        ready, failed = [], []
        for req in self.queue:
            if req.broken:
                failed.append(req)
                continue
{body}
        return ready, failed
'''

CASES = [
    # begin() dominates the append in the producer's own loop.
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            req.disagg_kv_sender.begin()
            self.disagg_prefill_inflight_queue.append(req)
''', "", set(), id="begun-before-the-append"),
    # ... but only on some paths.
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            if req.ready:
                req.disagg_kv_sender.begin()
            self.disagg_prefill_inflight_queue.append(req)
''', "", {"WaitingForInput"}, id="begun-on-some-paths"),
    # begin() ran, then the request's sender was replaced by one on which it did not run.
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            req.disagg_kv_sender.begin()
            req.disagg_kv_sender = self.new_sender(req)
            self.disagg_prefill_inflight_queue.append(req)
''', "", {"WaitingForInput"}, id="sender-replaced-after-begin"),
    # begin() ran on the previous request of the loop, not on this one.
    pytest.param('''\
    def finish_batch(self, batch):
        last = batch.first
        last.disagg_kv_sender.begin()
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)
''', "", {"WaitingForInput"}, id="begun-on-another-request"),
    # A list handed over by the ready queue (a tuple's first element), each of whose appends
    # comes after begin().
    pytest.param('''\
    def finish_batch(self, batch):
        ready, _ = self.ready_queue.pop_ready()
        self.disagg_prefill_inflight_queue.extend(ready)
''', _READY_QUEUE.format(body='''\
            req.disagg_kv_sender.begin()
            ready.append(req)'''), set(), id="handed-over-after-begin"),
    # The same list, but the other element of the tuple: the failed ones never ran begin().
    pytest.param('''\
    def finish_batch(self, batch):
        _, failed = self.ready_queue.pop_ready()
        self.disagg_prefill_inflight_queue.extend(failed)
''', _READY_QUEUE.format(body='''\
            req.disagg_kv_sender.begin()
            ready.append(req)'''), {"WaitingForInput"}, id="handed-over-the-other-list"),
    # The handed-over list is also passed to a helper, which may add requests of its own.
    pytest.param('''\
    def finish_batch(self, batch):
        ready, _ = self.ready_queue.pop_ready()
        self.disagg_prefill_inflight_queue.extend(ready)
''', _READY_QUEUE.format(body='''\
            req.disagg_kv_sender.begin()
            ready.append(req)
        self.add_retried(ready)'''), {"WaitingForInput"}, id="handed-over-list-passed-on"),
    # A list built by a comprehension: not followed, no claim.
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            req.disagg_kv_sender.begin()
        self.disagg_prefill_inflight_queue.extend([req for req in batch.reqs])
''', "", {"WaitingForInput"}, id="comprehension-not-followed"),
    # A helper of the scheduler's that appends what its callers pass: each call is a way in.
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            req.disagg_kv_sender.begin()
            self.enqueue(req)

    def enqueue(self, req):
        self.disagg_prefill_inflight_queue.append(req)
''', "", set(), id="helper-called-after-begin"),
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            req.disagg_kv_sender.begin()
            self.enqueue(req)
        self.enqueue(batch.extra)

    def enqueue(self, req):
        self.disagg_prefill_inflight_queue.append(req)
''', "", {"WaitingForInput"}, id="helper-called-once-without"),
    # Two producers: one begins before its append, the other appends its request as it is.
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            req.disagg_kv_sender.begin()
            self.disagg_prefill_inflight_queue.append(req)

    def retry(self, req):
        self.disagg_prefill_inflight_queue.append(req)
''', "", {"WaitingForInput"}, id="another-producer-without-the-call"),
    # begin() on both sides of an if, or on one side while the other leaves before the append.
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            if req.chunked:
                req.disagg_kv_sender.begin()
            else:
                req.disagg_kv_sender.begin()
            self.disagg_prefill_inflight_queue.append(req)
''', "", set(), id="begun-on-both-sides-of-an-if"),
    pytest.param('''\
    def finish_batch(self, batch):
        for req in batch.reqs:
            if req.ready:
                req.disagg_kv_sender.begin()
            else:
                continue
            self.disagg_prefill_inflight_queue.append(req)
''', "", set(), id="begun-or-never-entering"),
]


@pytest.mark.parametrize(("finish", "ready_queue", "pinned"), CASES)
def test_a_call_that_ends_the_pin_counts_only_when_it_dominates_every_way_in(
        finish: str, ready_queue: str, pinned: set[str], tmp_path: Path) -> None:
    assert _pinned(_tree(tmp_path, finish, ready_queue)) == pinned


# poll() waits without a deadline both before begin() (its first return) and after it (its
# last): begin() ends no pin, but a request that entered with it run is past the first return.
_WAITS_EITHER_WAY = sender("Clocked", '''\
        if not self.begun:
            return KVPoll.WaitingForInput
        if self.mgr.done(self.room):
            return KVPoll.Success
        return KVPoll.WaitingForInput''', '''
    def begin(self):
        self.begun = True
''', "        self.begun = False\n")


@pytest.mark.parametrize(("finish", "cited"), [
    pytest.param(CASES[0].values[0], "last", id="begun-on-every-way-in"),
    pytest.param(CASES[1].values[0], "first", id="begun-on-some-paths"),
])
def test_a_pin_cites_the_return_a_request_that_entered_can_reach(finish: str, cited: str, tmp_path: Path) -> None:
    """The chain of a pin names the line poll() answers the state at for a request in the
    queue: with begin() run on every way in, the return after the flag's test, and the begin()
    call; else the first return (a request that entered without begin() reaches it)."""
    root = _tree(tmp_path, finish)
    conn = root / "disaggregation/clocked/conn.py"
    conn.write_text(_WAITS_EITHER_WAY)
    lines = conn.read_text().splitlines()
    returns = [n for n, text in enumerate(lines, 1) if text.strip() == "return KVPoll.WaitingForInput"]
    assert len(returns) == 2
    report = scan_path(root)
    [pin] = [f for f in report.findings if f.rule == "pinned-state" and f.backend == "clocked"]
    returned = [e.line for e in pin.evidence if e.path.endswith("clocked/conn.py") and "returns WaitingForInput at" in e.note]
    assert returned == [returns[-1] if cited == "last" else returns[0]], pin.evidence
    begun = [e for e in pin.evidence if "way into the queue runs" in e.note]
    if cited == "last":
        prefill = (root / "disaggregation/prefill.py").read_text().splitlines()
        [e] = begun
        assert prefill[e.line - 1].strip() == "req.disagg_kv_sender.begin()"
        assert e.note.endswith(f"so ClockedKVSender.poll() gets past its return of WaitingForInput at line {returns[0]}"), e
        assert f"returns WaitingForInput at line {returns[-1]}" in pin.message
    else:
        assert begun == []
