"""The senders analysed in a forked child (kvtrace.beside) give the same report as one process,
a failing child leaves the work to the parent, and a child is never left behind.

Each check runs in a fresh interpreter: a fork is only taken in a process without other threads,
and the test runner's own process may have some (servers of other tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(code: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_child_runs_the_work_in_another_process() -> None:
    out = run("""
import os
from kvtrace.beside import Beside, can_fork
assert can_fork(), "a single-threaded Linux process with 2 CPUs may fork"
with Beside(lambda: str(os.getpid()).encode()) as child:
    data = child.result()
print(int(data) != os.getpid(), int(data) > 0)
""")
    assert out.split() == ["True", "True"]


def test_failing_child_gives_none_and_no_other_thread_disables_it() -> None:
    out = run("""
import threading, time
from kvtrace.beside import Beside, can_fork
def boom():
    raise ValueError("child fails")
with Beside(boom) as child:
    print(child.result())
stop = threading.Event()
t = threading.Thread(target=stop.wait); t.start()
print(can_fork())
with Beside(lambda: b"x") as child:
    print(child.result())  # not forked: a thread is running
stop.set(); t.join()
""")
    assert out.split() == ["None", "False", "None"]


def test_each_item_is_claimed_by_exactly_one_process() -> None:
    out = run("""
import json, time
from kvtrace.beside import Beside, Claims
claims = Claims(400)
with Beside(lambda: json.dumps([i for i in range(400) if claims.claim(i)]).encode()) as child:
    while not claims._taken[0]:  # the child has begun (it takes item 0 first): now both contend
        time.sleep(0.001)
    mine = [i for i in reversed(range(400)) if claims.claim(i)]
    theirs = json.loads(child.result())
claims.close()
print(len(mine) + len(theirs), len(set(mine) | set(theirs)), 0 in theirs)
""")
    assert out.split() == ["400", "400", "True"]


def test_the_last_item_left_is_never_taken_by_claim_unless_last() -> None:
    """The parent leaves the last unclaimed sender to the child, which takes them in order and
    has the runs of their shared code already made; the child's claim still takes it."""
    from kvtrace.beside import Claims

    claims = Claims(6)  # five senders, then a queue
    try:
        senders = range(5)
        assert [claims.claim(i) for i in (0, 1)] == [True, True]
        assert claims.claim_unless_last(4, senders) and claims.claim_unless_last(3, senders)
        assert not claims.claim_unless_last(2, senders)  # the last one left
        assert not claims.claim_unless_last(4, senders)  # taken already
        assert claims.claim(2) and not claims.claim(2)
        assert claims.claim(5)  # a queue: not among the senders
    finally:
        claims.close()


def test_a_child_killed_while_claiming_never_blocks_the_parent() -> None:
    """A child the kernel kills (the OOM killer) between taking the claims' lock and giving it
    back: the parent still claims, at once, what the child had not taken."""
    out = run("""
import os, signal
from kvtrace.beside import Claims
claims = Claims(2)
pid = os.fork()
if pid == 0:
    claims._lock()  # held, never released: the process dies here
    os.kill(os.getpid(), signal.SIGKILL)
os.waitpid(pid, 0)
signal.alarm(10)  # a claim that blocks ends the process (and the test) here
print(claims.claim(0), claims.claim(0), claims.claim(1))
claims.close()
""")
    assert out.split() == ["True", "False", "True"]


def test_leaving_early_ends_the_child() -> None:
    out = run("""
import os, time
from kvtrace.beside import Beside
start = time.monotonic()
try:
    with Beside(lambda: time.sleep(120) or b"late") as child:
        pid = child._pid
        raise KeyboardInterrupt
except KeyboardInterrupt:
    pass
try:
    os.kill(pid, 0)
    print("alive")
except ProcessLookupError:
    print("gone", time.monotonic() - start < 30)
""")
    assert out.split() == ["gone", "True"]


@pytest.mark.parametrize("example", ["nixl-pin", "manager-shapes", "pp-crash"])
def test_scan_with_the_senders_beside_is_the_scan_in_one_process(example: str) -> None:
    """The report (every field) is the same whether the senders ran in a child or not, and the
    child really ran (its pid is recorded by a wrapper around the work)."""
    program = f"""
import json, os, pathlib
import kvtrace.scan as scan
from kvtrace.beside import Beside
from kvtrace.report.json import to_document
forked = []
class Watched(Beside):
    def result(self):
        data = super().result()
        forked.append(data is not None)
        return data
scan.Beside = Watched
scan.PARALLEL_MIN_BYTES = 0
report = scan.scan_path(pathlib.Path("examples/{example}"))
print(json.dumps({{"forked": forked, "report": to_document([report])}}))
"""
    together = json.loads(run(program))
    alone = json.loads(run(program, {"KVTRACE_NO_FORK": "1"}))
    assert together["forked"] == [True] and alone["forked"] == [False]
    _without_run_fields(together, alone)
    assert together["report"] == alone["report"]
    assert together["report"]["reports"][0]["findings"], "the example has findings to compare"


@pytest.mark.parametrize(("version", "pack", "steps"), [
    ("0.5.14", "sglang-decode", None), ("0.5.23", "sglang-prefill", None),
    # A work budget small enough to cut the explorations short: where each stopped, and why,
    # crosses from the child as it is (a Cut, not its text alone).
    ("0.5.14", "sglang-decode", 300),
])
def test_a_queue_the_child_explored_gives_the_report_of_one_process(version: str, pack: str, steps: int | None,
                                                                     tmp_path: Path) -> None:
    """The child, its senders done, takes a queue the parent has not started, and the parent
    assembles that queue from what the child sends: the report (every field) is the one process's.
    The parent's first queue waits until the child has taken one, so the child always does."""
    from tests.sglang_wheels import sglang_tree

    program = f"""
import json, os, pathlib, time
import kvtrace.flow
kvtrace.flow.MAX_STEPS = {steps or 2_000_000}
import kvtrace.pipeline as pipeline
import kvtrace.scan as scan
from kvtrace.packs import load_pack
from kvtrace.report.json import to_document
marker = pathlib.Path({str(tmp_path / "taken")!r})
explore, queue, explored = pipeline.explore_queue, pipeline._queue, pipeline._explored
def explore_queue(*args):
    marker.write_text("taken")
    return explore(*args)
waited = [True] if os.environ.get("KVTRACE_NO_FORK") else []
def first_waits(*args, **kwargs):
    if not waited:
        deadline = time.monotonic() + 240
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        waited.append(marker.exists())
    return queue(*args, **kwargs)
assembled = []
def from_child(record):
    assembled.append(record.position)
    return explored(record)
pipeline.explore_queue, pipeline._queue, pipeline._explored = explore_queue, first_waits, from_child
scan.PARALLEL_MIN_BYTES = 0
report = scan.scan_path(pathlib.Path({str(sglang_tree(version))!r}), load_pack({pack!r}))
print(json.dumps({{"waited": waited, "assembled": assembled, "report": to_document([report])}}))
"""
    together = json.loads(run(program))
    alone = json.loads(run(program, {"KVTRACE_NO_FORK": "1"}))
    assert together["waited"] == [True] and together["assembled"] == [1], together["assembled"]
    assert alone["assembled"] == []
    _without_run_fields(together, alone)
    assert together["report"] == alone["report"]
    assert together["report"]["reports"][0]["findings"], "the tree has findings to compare"
    assert ("analysis cut short" in json.dumps(together["report"])) == bool(steps)


def test_the_parent_takes_the_senders_left_from_the_last(tmp_path: Path) -> None:
    """The child takes the senders from the first, the parent (its queues done) from the last, so
    they meet once: each process analyses a run of neighbours. The child is slowed so that the
    parent has some to take; the report is the one process's."""
    from tests.sglang_wheels import sglang_tree

    program = f"""
import json, os, pathlib, time
import kvtrace.backends as backends
import kvtrace.scan as scan
from kvtrace.report.json import to_document
parent = os.getpid()
log = pathlib.Path({str(tmp_path)!r})
analyse = backends.analyse_sender
def watched(index, pack, domain, cls, *args, **kwargs):
    if os.getpid() != parent:
        time.sleep(0.3)
    with open(log / ("parent" if os.getpid() == parent else "child"), "a") as out:
        out.write(cls.name + "\\n")
    return analyse(index, pack, domain, cls, *args, **kwargs)
backends.analyse_sender = watched
scan.PARALLEL_MIN_BYTES = 0
report = scan.scan_path(pathlib.Path({str(sglang_tree("0.5.23"))!r}))
names = [s.name for s in report.backends]
print(json.dumps({{"report": to_document([report]), "names": names}}))
"""
    together = json.loads(run(program))
    child = (tmp_path / "child").read_text().split()
    parent = (tmp_path / "parent").read_text().split()
    (tmp_path / "child").unlink()
    (tmp_path / "parent").unlink()
    alone = json.loads(run(program, {"KVTRACE_NO_FORK": "1"}))
    order = (tmp_path / "parent").read_text().split()  # one process: every sender, in order
    assert child and parent, (child, parent)
    assert child == order[:len(child)] and parent == order[::-1][:len(parent)]
    assert sorted(child + parent) == sorted(order)
    _without_run_fields(together, alone)
    assert together["report"] == alone["report"]


def _without_run_fields(*docs: dict) -> None:
    """Drop what depends on the run (when, how long), not on the results."""
    for doc in docs:
        doc["report"].pop("generated", None)
        for r in doc["report"].get("reports", []):
            r.pop("duration_seconds", None)


def test_server_answers_in_another_process_and_a_failed_request_is_none() -> None:
    out = run("""
import os
from kvtrace.beside import Server
def handle(request):
    if request == b"boom":
        raise ValueError("this one fails")
    return request.upper() + b" " + str(os.getpid()).encode()
with Server(handle) as server:
    print(server.call(b"one").split()[0].decode(), server.call(b"boom"), server.call(b"x" * 3_000_000)[:3].decode())
    pid = int(server.call(b"two").split()[1])
    print(pid != os.getpid())
try:
    os.kill(pid, 0)
    print("alive")
except ProcessLookupError:
    print("gone")
""")
    assert out.split() == ["ONE", "None", "XXX", "True", "gone"]


def test_server_gone_leaves_every_later_request_to_the_caller() -> None:
    out = run("""
import os, signal
from kvtrace.beside import Server
with Server(lambda request: b"pid " + str(os.getpid()).encode()) as server:
    pid = int(server.call(b"?").split()[1])
    os.kill(pid, signal.SIGKILL)
    print(server.call(b"?"), server.call(b"?"))
""")
    assert out.split() == ["None", "None"]


def test_fleet_analysed_by_the_server_is_the_fleet_analysed_here() -> None:
    """Several targets: each tree is analysed in the forked server (the replies are counted) and
    every report is the one the same run gives without it; a tree the server cannot scan (no
    package) is the host's own error line, as without it."""
    program = """
import json
from kvtrace.beside import Server
from kvtrace.fleet import FleetOptions, run_fleet
from kvtrace.packs import load_pack
from kvtrace.report.json import to_document
answered = []
real_call = Server.call
def counted(self, request):
    reply = real_call(self, request)
    answered.append(reply is not None)
    return reply
Server.call = counted
targets = ["examples/nixl-pin", "examples/manager-shapes", "examples/nixl-pin", "kvtrace/report"]
pack = load_pack()
results = run_fleet(targets, FleetOptions({t: pack for t in targets}, {}, jobs=2))
documents = [to_document([r.report]) if r.report is not None else None for r in results]
for doc in documents:
    if doc is not None:
        doc.pop("generated", None)
        for r in doc.get("reports", []):
            r.pop("duration_seconds", None)
print(json.dumps({"answered": answered, "errors": [r.error for r in results], "documents": documents}))
"""
    served = json.loads(run(program))
    here = json.loads(run(program, {"KVTRACE_NO_FORK": "1"}))
    # Two distinct trees scanned in the server (the third target repeats the first: the run's
    # memo answers it; the folder without a package fails before any scan), none without it.
    assert served["answered"] == [True, True] and here["answered"] == [False, False]
    assert served["errors"] == here["errors"] and served["errors"][3] is not None
    assert served["documents"] == here["documents"]
    assert all(doc is not None and doc["reports"][0]["findings"] for doc in served["documents"][:3])
