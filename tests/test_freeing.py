"""What frees each state says whether anything in view calls the backend's abort() for a
request in the queue: the scheduler's abort path (a loop over the queue calling the request's
sender's abort()), with its line, or that nothing does, in which case abort cannot free it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvtrace.freeing import scheduler_aborts, what_frees
from kvtrace.report.json import to_json_dict
from kvtrace.scan import scan_path
from tests.trees import EXAMPLES


# The scheduler's abort path in our own words: a loop over the inflight queue (through
# enumerate) that calls the request's sender's abort(), guarded as SGLang guards it.
SCHEDULER = '''
class Scheduler:
    def abort_request(self, recv_req):
        for i, req in enumerate(self.disagg_prefill_inflight_queue):
            if recv_req.abort_all or req.rid.startswith(recv_req.rid):
                if hasattr(req.disagg_kv_sender, "abort"):
                    req.disagg_kv_sender.abort()

    def not_an_abort_path(self):
        for req in self.waiting_queue:
            req.disagg_kv_sender.abort()
        for req in self.disagg_prefill_inflight_queue:
            req.abort()
'''


def _tree(tmp_path: Path, scheduler: bool) -> Path:
    tree = tmp_path / "srt"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    if scheduler:
        (tree / "managers" / "scheduler.py").write_text(SCHEDULER)
    return tree


def test_the_scheduler_abort_path_is_named_with_its_line(tmp_path: Path) -> None:
    tree = _tree(tmp_path, scheduler=True)
    report = scan_path(tree)
    calls = scheduler_aborts(report)
    # Only the loop over the queue that aborts the request's sender; not another queue's loop,
    # nor an abort() of the request object itself.
    assert [(c.path, c.line) for c in calls] == [("managers/scheduler.py", 7)]
    assert "req.disagg_kv_sender.abort()" in (tree / calls[0].path).read_text().splitlines()[calls[0].line - 1]
    assert (calls[0].function, calls[0].call) == ("Scheduler.abort_request", "req.disagg_kv_sender.abort()")
    assert calls[0].evidence.note.startswith("Scheduler.abort_request() calls req.disagg_kv_sender.abort()")
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    frees = {f.state: f for f in what_frees(report, mooncake)}
    boot = frees["Bootstrapping"]
    assert boot.how == "abort"
    assert "the scheduler does: Scheduler.abort_request() calls abort() for it at managers/scheduler.py:7" in boot.text
    assert calls[0].evidence in boot.evidence
    nixl = next(b for b in report.backends if b.name == "nixl")
    pinned = {f.state for f in report.findings if f.rule == "pinned-state" and f.backend == "nixl"}
    assert pinned
    for freeing in what_frees(report, nixl):
        if freeing.state in pinned:  # abort() is called, and does not end the state
            assert freeing.how == "nothing"
            assert "Scheduler.abort_request() calls abort() for it at managers/scheduler.py:7, to no effect" in freeing.text


def test_without_a_caller_abort_cannot_free_it(tmp_path: Path) -> None:
    report = scan_path(_tree(tmp_path, scheduler=False))
    assert scheduler_aborts(report) == []
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    for freeing in what_frees(report, mooncake):
        if "abort() would end it" in freeing.text:
            assert "nothing in the scanned code calls abort() for a request in disagg_prefill_inflight_queue, " \
                   "so abort cannot free it" in freeing.text
            assert freeing.how in ("timeout", "nothing")
            if freeing.how == "nothing":
                assert "until the server restarts" in freeing.text


@pytest.mark.parametrize(("version", "line"), [("0.4.8", None), ("0.5.2", 2376), ("0.5.14", 3841), ("0.5.23", 5758)])
def test_real_releases(version: str, line: int | None) -> None:
    """0.4.8's Scheduler.abort_request does not touch the inflight queue; from 0.5.2 it loops
    over it (`for i, req in enumerate(self.disagg_prefill_inflight_queue)` in 0.5.2) and calls
    `req.disagg_kv_sender.abort()`."""
    from tests.sglang_wheels import sglang_tree

    tree = sglang_tree(version) / "sglang" / "srt"
    report = scan_path(tree)
    calls = scheduler_aborts(report)
    if line is None:
        assert calls == []
        assert "def abort_request" in (tree / "managers" / "scheduler.py").read_text()
        text = " ".join(f.text for b in report.backends for f in what_frees(report, b))
        assert "nothing in the scanned code calls abort() for a request in disagg_prefill_inflight_queue" in text
        return
    # The report judges both prefill queues: abort_request loops over each (the bootstrap queue's
    # loop comes first); the inflight queue's call is the one at `line`.
    assert ("managers/scheduler.py", line) in [(c.path, c.line) for c in calls]
    assert all(c.path == "managers/scheduler.py" for c in calls) and len(calls) <= 2
    source = (tree / "managers" / "scheduler.py").read_text().splitlines()
    assert all(source[c.line - 1].strip() == "req.disagg_kv_sender.abort()" for c in calls)
    inflight = next(c for c in calls if c.line == line)
    assert inflight.queue == "disagg_prefill_inflight_queue"
    loop = inflight.loop_line
    assert "disagg_prefill_inflight_queue" in source[loop - 1] and source[loop - 1].lstrip().startswith("for ")
    enclosing = next(source[n] for n in range(loop - 1, -1, -1) if source[n].lstrip().startswith("def "))
    assert enclosing.lstrip().startswith("def abort_request(")


def test_a_sender_without_a_concrete_abort_is_said_to_have_none(tmp_path: Path) -> None:
    """The scheduler's abort() call cannot reach a sender whose classes only declare abort()
    abstract (or have none: SGLang guards the call with hasattr): what frees a pinned state says
    the sender has no concrete abort(), not that the call runs to no effect."""
    tree = _tree(tmp_path, scheduler=True)
    conn = tree / "disaggregation" / "nixl" / "conn.py"
    text = conn.read_text()
    concrete = "    def abort(self) -> None:\n        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)\n" \
               "        self.conclude_state = KVPoll.Failed\n"
    assert text.count(concrete) == 1
    conn.write_text(text.replace(concrete, ""))
    report = scan_path(tree)
    nixl = next(b for b in report.backends if b.name == "nixl")
    assert not nixl.has_abort and next(b for b in report.backends if b.name == "mooncake").has_abort
    written = {b["name"]: b["has_abort"] for b in to_json_dict(report)["backends"]}
    assert written["nixl"] is False and written["mooncake"] is True, written
    pinned = {f.state for f in report.findings if f.rule == "pinned-state" and f.backend == "nixl"}
    assert pinned
    for freeing in what_frees(report, nixl):
        if freeing.state in pinned:
            assert freeing.how == "nothing"
            assert f"frees it: {nixl.sender} has no concrete abort() (Scheduler.abort_request() calls abort() " \
                   "for it at managers/scheduler.py:7, and none of those calls reaches its poll()) and " \
                   in freeing.text, freeing.text
            assert "to no effect" not in freeing.text and "abort() does not end it" not in freeing.text
    ignored = [f for f in report.findings if f.rule == "abort-ignored" and f.backend == "nixl"]
    assert len(ignored) == 1 and "cannot be aborted: abort() is abstract in every class " \
        f"{nixl.sender} inherits" in ignored[0].message, [f.message for f in ignored]


def test_a_relative_import_names_a_file_inside_the_target_never_one_above_it(tmp_path: Path) -> None:
    """Before: `from ..envs import envs` gave the module "..envs", which the lookup of a module
    beside the package split into empty parts: every folder above the target matched, and the
    first envs.py found there (outside the scanned tree) was cited as the timeout's default. A
    relative import names a file by the importing file's place, and only one inside the target
    is read."""
    from kvtrace.freeing import _absolute
    from kvtrace.outside import module_beside

    (tmp_path / "envs.py").write_text("SGLANG_X = EnvInt(1)\n")  # above the target: never read
    target = tmp_path / "proj"
    (target / "pkg" / "disagg").mkdir(parents=True)
    assert module_beside(str(target), "pkg/disagg", "..envs") is None
    assert _absolute("..envs", "pkg/disagg/conn.py") == "pkg/envs.py"
    assert _absolute("...envs", "pkg/disagg/conn.py") == "envs.py"
    assert _absolute("....envs", "pkg/disagg/conn.py") is None  # above the target
    assert module_beside(str(target), "pkg/disagg", "pkg/envs.py") is None  # not there
    (target / "pkg" / "envs.py").write_text("SGLANG_X = EnvInt(2)\n")
    assert module_beside(str(target), "pkg/disagg", "pkg/envs.py") == ("pkg/envs.py", ["SGLANG_X = EnvInt(2)"])
    assert module_beside(str(target), "pkg/disagg", "../envs.py") is None  # outside the target


def test_a_package_without_the_module_never_reads_another_packages_copy(tmp_path: Path) -> None:
    """versions/sglang/ and versions/sglang-0.5.x/ side by side (--all): the second package has
    no srt/environ.py, and the lookup must not take the first package's."""
    from kvtrace.outside import module_beside

    versions = tmp_path / "versions"
    for name in ("sglang", "sglang-0.5.x"):
        (versions / name / "srt" / "disaggregation").mkdir(parents=True)
    (versions / "sglang" / "srt" / "environ.py").write_text("SGLANG_X = EnvInt(1)\n")
    assert module_beside(str(versions), "sglang-0.5.x/srt/disaggregation", "sglang.srt.environ") is None
    assert module_beside(str(versions), "sglang/srt/disaggregation", "sglang.srt.environ") == (
        "sglang/srt/environ.py", ["SGLANG_X = EnvInt(1)"])


@pytest.mark.parametrize("layout", ["the folder itself", "a folder holding only it", "with the scheduler's module"])
def test_abort_out_of_view_is_said_as_such(tmp_path: Path, layout: str) -> None:
    """Scanned alone, the disaggregation folder does not hold the scheduler, whose abort path may
    free the request: 'stays until the server restarts' is said only with that condition. The
    target may be the folder itself (the located package is the target: no folder prefix) or a
    folder holding only it; the bundled example's `managers/` models the scheduler's module, and
    nothing there aborts, so there it is said outright."""
    tree = _tree(tmp_path, scheduler=False)
    if layout == "the folder itself":
        target = tree / "disaggregation"
    elif layout == "a folder holding only it":
        shutil.rmtree(tree / "managers")
        target = tree
    else:
        target = tree
    report = scan_path(target)
    assert scheduler_aborts(report) == []
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    texts = [f.text for f in what_frees(report, mooncake)
             if "abort() would end it" in f.text and "a timeout frees it" not in f.text]
    assert len(texts) == 2, "mooncake's abort ends WaitingForInput and Transferring, which no timeout covers"
    for text in texts:
        if layout == "with the scheduler's module":
            assert "scheduler's files were not scanned" not in text and "unless" not in text
            assert text.endswith("no timeout covers it either, so the request stays until the server restarts")
        else:
            assert "(the scheduler's files were not scanned: scan the whole srt package to see its abort path)" in text
            assert text.endswith("no timeout covers it either, so unless code outside the scanned folder aborts it, "
                                 "the request stays until the server restarts")
