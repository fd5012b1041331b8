"""The prefill bootstrap queue (`disagg_prefill_bootstrap_queue`, drained in
`PrefillBootstrapQueue.pop_bootstrapped`) on real SGLang releases from PyPI, read by hand against
`sglang/srt/disaggregation/prefill.py` and each backend's sender (issue 22).

A request waits there until its sender's handshake with the decode server is done; the queue
object keeps `self.queue` and removes requests through `indices_to_remove`. The failure a user
sees is `num_prefill_bootstrap_queue_reqs` that never goes back to 0. Each verdict below says
what the cited line is, why the verdict holds or not, and the upstream thread that shows it
(reported before the fix, gone after)."""

from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path

import pytest

from kvtrace.model import Report
from kvtrace.packs import load_pack
from kvtrace.rules.premise import SHARED_ROOM
from kvtrace.scan import scan_path
from tests.releases import ALL, KEYERROR_ROOM, KEYERROR_SITES, Verdict
from tests.sglang_wheels import sglang_tree

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BOOTSTRAP = "disagg_prefill_bootstrap_queue"
S = "sglang/srt"
D = f"{S}/disaggregation"
PREFILL = f"{D}/prefill.py"
RULES = ("pinned-state", "state-crash", "poll-raises")


@lru_cache(maxsize=4)
def scanned(version: str) -> Report:
    """The default scan of `sglang/srt`: both prefill queues (what the inflight drain does to a
    sender bears on the bootstrap queue's premises)."""
    return scan_path(sglang_tree(version) / "sglang" / "srt", load_pack("sglang-prefill"))


def bootstrap(report: Report):
    return next(q for q in report.queues if q.name == BOOTSTRAP)


def sites(report: Report) -> set[tuple[str, str, int, tuple[str, ...]]]:
    return {(s.kind, f"{S}/{s.path}", s.line, s.states) for s in bootstrap(report).sites}


def mode_fates(report: Report, state: str) -> dict[str, tuple[list[str], list[int]]]:
    """mode -> (the state's outcomes in that mode, lines of the waits that keep it there)."""
    return {m.mode: (m.fate, [w.line for w in m.waits]) for m in bootstrap(report).states[state].modes}


def test_bootstrap_queue_0_5_2_mapped_by_hand() -> None:
    """0.5.2: `scheduler.py:778 self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue(...)`;
    pop_bootstrapped (194-269) polls at 216 and loops at 220. Line by line:
    221-226 `if rids_to_check is not None: if req.rid not in rids_to_check: continue` then
    `assert poll == WaitingForInput or poll == Failed` (PP, ranks after the first);
    228 Bootstrapping: `continue` (kept); 230 Failed: prepare_abort (237), stream_output,
    indices_to_remove.add (241), failed_reqs.append (242); anything else is taken as
    WaitingForInput: `break` when no metadata buffer is free (249-250: it and every later request
    stay), else alloc, `assert req.metadata_buffer_index is not None` (255), init,
    bootstrapped_reqs.append (259), indices_to_remove.add (260); 262 `self.queue = [...]`."""
    report = scanned("0.5.2")
    q = bootstrap(report)
    assert (f"{S}/{q.drain.path}", q.drain.line, q.drain.note) == (PREFILL, 220, "PrefillBootstrapQueue.pop_bootstrapped")
    assert {
        ("entry", PREFILL, 173, ()),  # PrefillBootstrapQueue.add: self.queue.append(req)
        ("entry", f"{S}/managers/scheduler.py", 1346, ()),  # _extend_requests_to_queue: ...bootstrap_queue.extend(
        ("reassign", f"{S}/managers/scheduler.py", 778, ()),  # the binding: = PrefillBootstrapQueue(
        ("poll", PREFILL, 216, ()),  # polls = poll_and_all_reduce(
        ("check", PREFILL, 226, ("Failed", "WaitingForInput")),  # the PP assert lets these two through
        ("raise", PREFILL, 226, ("Bootstrapping", "Transferring", "Success")),  # ... and raises on the rest
        ("check", PREFILL, 228, ("Bootstrapping",)),
        ("check", PREFILL, 230, ("Failed",)),
        ("abort", PREFILL, 237, ("Failed",)),  # prepare_abort(req, error_message, ...)
        ("done", PREFILL, 241, ("Failed",)),  # indices_to_remove.add(i)
        ("done", PREFILL, 242, ("Failed",)),  # failed_reqs.append(req)
        ("raise", PREFILL, 255, ("WaitingForInput", "Transferring", "Success")),  # assert ...buffer_index is not None
        ("done", PREFILL, 259, ("WaitingForInput", "Transferring", "Success")),  # bootstrapped_reqs.append(req)
        ("done", PREFILL, 260, ("WaitingForInput", "Transferring", "Success")),
        ("reassign", PREFILL, 262, ()),  # self.queue = [entry for i, entry in ... not in indices_to_remove]
        ("gauge", f"{S}/managers/scheduler_metrics_mixin.py", 150, ()),  # len(...bootstrap_queue.queue)
    } <= sites(report)
    # No PP: Bootstrapping is kept for ever unless poll() moves it; Failed leaves; WaitingForInput
    # waits at the `break` while no metadata buffer is free, then leaves (or meets the assert at 255).
    plain = "return_failed_reqs=False, rids_to_check=None"
    assert mode_fates(report, "WaitingForInput")[plain] == (["kept", "leaves", "raises"], [])
    assert mode_fates(report, "Bootstrapping")[plain] == (["kept"], [])
    assert mode_fates(report, "Failed")[plain] == (["leaves"], [])
    # PP, a later rank: Bootstrapping for a rid the first rank let through reaches the assert.
    assert mode_fates(report, "Bootstrapping")["rids_to_check passed"] == (["kept", "raises"], [223])
    # A request in the bootstrap queue holds nothing yet: the Failed abort releases nothing and
    # that is no leak (the inflight queue's pack entry says it holds the KV cache and the buffer).
    assert not [f for f in report.findings if f.queue == BOOTSTRAP and f.rule == "release-leak"]


def test_bootstrap_timeouts_and_way_out_per_backend_0_5_2() -> None:
    """What frees Bootstrapping, per backend, in 0.5.2: mooncake's poll() (1154) compares the
    clock with `kv_mgr.bootstrap_timeout` while Bootstrapping (1163, init_time set in __init__)
    and abort() sets Failed; NIXL's poll() (598) returns check_status() until has_sent, reads
    no clock and NixlKVSender has no abort(): nothing frees it (sglang#34692: "a request can
    remain in KVPoll.Bootstrapping indefinitely if Decode destination metadata never arrives")."""
    report = scanned("0.5.2")
    by_name = {b.name: b for b in report.backends}
    mooncake, nixl = by_name["mooncake"], by_name["nixl"]
    assert [(t.path, t.line, tuple(t.covers)) for t in mooncake.timeouts] == \
        [("disaggregation/mooncake/conn.py", 1163, ("Bootstrapping",))]
    assert mooncake.verdicts["Bootstrapping"].way_out.value == "abort"
    assert nixl.timeouts == [] and nixl.verdicts["Bootstrapping"].way_out.value == "none"
    pin = [f for f in report.findings if f.queue == BOOTSTRAP and f.rule == "pinned-state"]
    assert [(f.backend, f.state, f.line, f.severity) for f in pin] == [("nixl", "Bootstrapping", 598, "error")]
    assert f"can pin {BOOTSTRAP} with the nixl backend" in pin[0].message


def test_mooncake_bootstrap_timeout_was_dead_in_the_bootstrap_queue_until_0_4_8_post1() -> None:
    """0.4.8 mooncake/conn.py: poll() (719) checks `elapsed >= bootstrap_time_out` only `if
    self.init_time is not None` (725); __init__ sets `self.init_time = None` (689) and only
    init() (696) sets the clock, which pop_bootstrapped calls as the request leaves the queue
    (WaitingForInput). While Bootstrapping in the queue the deadline is never read: pinned
    (the timeout of sglang#6685, meant for "requests [that] never transit from bootstrapping"
    when the decode server failed). 0.4.8.post1 sets init_time in __init__ (900): gone."""
    before, after = scanned("0.4.8"), scanned("0.4.8.post1")
    moon_before = next(b for b in before.backends if b.name == "mooncake")
    assert [(t.line, tuple(t.covers)) for t in moon_before.timeouts] == [(728, ("Bootstrapping",))]
    assert moon_before.verdicts["Bootstrapping"].way_out.value == "none"
    assert ("pinned-state", "mooncake", "Bootstrapping", 719) in {
        (f.rule, f.backend, f.state, f.line) for f in before.findings if f.queue == BOOTSTRAP and f.severity == "error"}
    moon_after = next(b for b in after.backends if b.name == "mooncake")
    assert moon_after.verdicts["Bootstrapping"].way_out.value == "timeout"
    assert not [f for f in after.findings if f.queue == BOOTSTRAP and f.backend == "mooncake" and f.rule == "pinned-state"]


def test_pp_consensus_skip_kept_failed_before_0_5_13_and_lets_it_out_after() -> None:
    """sglang#26912 (fixed by sglang#27028 in 0.5.13): with PP, `if rids_to_check is not None:
    if req.rid not in rids_to_check: continue` (0.5.12 prefill.py:294-297) ran before the Failed
    branch, so an aborted request on a later PP rank whose rid the earlier rank no longer sends
    stayed in the bootstrap queue for ever. 0.5.13 (337-344) skips only `poll != KVPoll.Failed`.

    kvtrace maps it: in the PP mode, Failed is kept at the consensus skip (a wait on another
    rank, line 296) on 0.5.12 and only leaves on 0.5.13. No rule calls it a pin: the inflight
    queue's consensus keeps Failed the same way on every release with PP (0.5.13 line 693), and
    whether the other rank ever lists the rid again is not in the code of one rank."""
    before, after = scanned("0.5.12"), scanned("0.5.13")
    pp = "return_failed_reqs=True, rids_to_check passed"
    assert mode_fates(before, "Failed")[pp] == (["kept", "leaves"], [296])
    assert mode_fates(after, "Failed")[pp] == (["leaves"], [])
    # The other states still wait for the consensus in 0.5.13: the skip now tests the poll value.
    assert ("check", PREFILL, 337, ("Bootstrapping", "WaitingForInput", "Transferring", "Success")) in sites(after)


def test_unexpected_state_raise_0_5_13_rests_on_a_shared_room() -> None:
    """0.5.13 pop_bootstrapped ends its chain with `else: raise RuntimeError("Unexpected poll
    state ...")` (368): Transferring and Success reach it. A request leaves the bootstrap queue
    at WaitingForInput, before its KV is sent (send_kv_chunk runs after its prefill), so its own
    sender reports them only later: seen here they are another request's for the same room (the
    pack's `reached_after`). A warning with that premise, never an error."""
    report = scanned("0.5.13")
    crashes = {(f.state, f.line, f.severity, f.premise) for f in report.findings
               if f.queue == BOOTSTRAP and f.rule == "state-crash"}
    assert crashes == {("Transferring", 368, "warning", SHARED_ROOM), ("Success", 368, "warning", SHARED_ROOM)}
    text = (sglang_tree("0.5.13") / PREFILL).read_text().splitlines()[368 - 1]
    assert text.strip().startswith("raise RuntimeError(")


MOONCAKE_NO_CLOCK = Verdict(None, "MooncakeKVSender.poll() is `return self.kv_mgr.check_status(room)`: no deadline, no "
                                  "abort(); a decode server that never connects leaves the request Bootstrapping",
                            "sglang#6685 (the bootstrap timeout, 0.4.7)", "def poll")
MOONCAKE_DEAD_CLOCK = Verdict(None, "the bootstrap deadline is read only once init_time is set, and only init() sets it, "
                                    "as the request leaves this queue: dead while it waits here", "sglang#6685; "
                              "init_time moved to __init__ in 0.4.8.post1", "def poll")
NIXL_NO_CLOCK = Verdict(None, "NixlKVSender.poll() returns check_status(room) until has_sent, reads no clock, and "
                              "abort() is absent or never read: nothing frees Bootstrapping", "sglang#34692 (NIXL "
                        "bootstrap timeout); from 0.5.12 CommonKVSender.abort() sets Failed", "def poll")
NIXL_KEYERROR_AFTER_SEND = Verdict(
    SHARED_ROOM, "poll() reads check_status(room), `self.request_status[room]` (KeyError for an absent room), while "
                 "has_sent is False, and that is all it can do in this queue: has_sent and the `del "
                 "request_status[room]` are both in send(), which only the inflight stage calls, after the request "
                 "left (its raise on an ERR transfer handle, behind has_sent, cannot happen here; that one is an "
                 "error on the inflight queue, sglang#24296). Only another request's send() for the same room "
                 "empties the table while this one waits", "sglang#40125, sglang#27643 (\"only when multiple "
                 "requests share the same bootstrap_room\")", "self.request_status[")
PP_BOOT_ASSERT = Verdict(None, "PP: a later rank asserts `poll == WaitingForInput or poll == Failed` for each rid the "
                               "first rank let through; its own handshake may still be Bootstrapping", "sglang#14494 "
                         "(\"assertion ... would fail ... PP1 and PP0 have different bootstrapped requests\"); the "
                         "0.5.7 consensus (ready on every rank) replaced the assert", "assert poll == KVPoll.WaitingForInput")
LATER_STATE = Verdict(SHARED_ROOM, "the request's own sender reaches Transferring/Success only after its KV is sent, "
                                   "after it left this queue: seen here, another request's for the same room",
                      "sglang#40125 (rooms shared)", "")
KEYERROR = KEYERROR_ROOM

RELEASES: dict[str, list[tuple[str, str | None, str | None, str, int, Verdict]]] = {v: [] for v in ALL}


def _add(versions: str, rule: str, backend: str | None, state: str | None, path: str, lines: str,
         verdict: Verdict) -> None:
    assert len(versions.split()) == len(lines.split()), (rule, backend, state)
    for version, line in zip(versions.split(), lines.split()):
        RELEASES[version].append((rule, backend, state, path, int(line), verdict))


_add("0.4.6.post5", "pinned-state", "mooncake", "Bootstrapping", "mooncake/conn.py", "498", MOONCAKE_NO_CLOCK)
_add("0.4.7 0.4.7.post1 0.4.8", "pinned-state", "mooncake", "Bootstrapping", "mooncake/conn.py", "718 723 719",
     MOONCAKE_DEAD_CLOCK)
_add(" ".join(ALL[1:ALL.index("0.5.11") + 1]), "pinned-state", "nixl", "Bootstrapping", "nixl/conn.py",
     "390 395 395 427 437 437 437 598 727 727 724 721 745 742 963 940 940 1146", NIXL_NO_CLOCK)
# 0.4.6.post5 … 0.4.8: nothing takes the room out (no `del` in send()), and the raise is behind has_sent: no row.
_NIXL_DEL = " ".join(ALL[ALL.index("0.4.8.post1"):ALL.index("0.5.9") + 1])
_add(_NIXL_DEL, "poll-raises", "nixl", None, "nixl/conn.py", "145 152 152 152 158 264 264 264 260 272 269 310",
     NIXL_KEYERROR_AFTER_SEND)
_add("0.5.10 0.5.10.post1 0.5.11", "poll-raises", "nixl", None, "common/conn.py", "179 179 180", NIXL_KEYERROR_AFTER_SEND)
_PP = "0.5.1.post3 0.5.2 0.5.3.post3 0.5.4.post3 0.5.5.post3 0.5.6.post2"
_PP_LINES = "224 226 260 255 256 256"
_add(_PP, "state-crash", None, "Bootstrapping", "prefill.py", _PP_LINES, PP_BOOT_ASSERT)
_add(_PP, "state-crash", None, "Success", "prefill.py", _PP_LINES, LATER_STATE)
_RAISE = "0.5.13 0.5.13.post1 0.5.14 0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23"
_RAISE_LINES = "368 368 370 374 399 450 462 488 507 537 528 550"
for _state in ("Transferring", "Success"):
    _add(_RAISE, "state-crash", None, _state, "prefill.py", _RAISE_LINES, LATER_STATE)
for _v, _sites in KEYERROR_SITES.items():
    for _backend, _path, _line in _sites:
        RELEASES[_v].append(("poll-raises", _backend, None, _path, _line, KEYERROR))


def verdict_rows(report: Report) -> set[tuple[str, str | None, str | None, str, int, str | None, str]]:
    return {(f.rule, f.backend, f.state, f.path.split("disaggregation/", 1)[-1], f.line, f.premise, f.severity)
            for f in report.findings if f.queue == BOOTSTRAP and f.rule in RULES and (f.severity == "error" or f.premise)}


def expected_rows(version: str) -> set[tuple[str, str | None, str | None, str, int, str | None, str]]:
    return {(rule, backend, state, path, line, v.premise, "warning" if v.premise else "error")
            for rule, backend, state, path, line, v in RELEASES[version]}


@pytest.mark.parametrize("version", ALL)
def test_bootstrap_queue_verdicts(version: str) -> None:
    """Every error (and every verdict resting on a premise) about the bootstrap queue, on every
    release: exactly the rows above, each cited line what its verdict says it is."""
    report = scanned(version)
    assert bootstrap(report).drain is not None
    assert verdict_rows(report) == expected_rows(version)
    root = sglang_tree(version)
    for rule, _backend, _state, path, line, verdict in RELEASES[version]:
        text = (root / D / path).read_text().splitlines()[line - 1].strip()
        cited = verdict.cited or ("assert" if "assert" in text else "raise")
        assert cited in text, (version, path, line, text)


def test_nixl_raise_behind_has_sent_is_no_bootstrap_queue_error() -> None:
    """NixlKVSender.poll() raises on an ERR transfer handle only once has_sent, which send()
    sets; send() runs in the inflight stage, after the request left the bootstrap queue, and the
    queue's entry (PrefillBootstrapQueue.add) builds a fresh sender right before the append. So
    on the bootstrap queue only the KeyError of check_status is left, and only another
    request's send() for the same room takes the room out: a warning with that premise. The
    inflight queue keeps the raise as an error (has_sent is set there)."""
    report = scanned("0.5.9")
    nixl = {f.queue: f for f in report.findings if f.rule == "poll-raises" and f.backend == "nixl"}
    boot, inflight = nixl[BOOTSTRAP], nixl["disagg_prefill_inflight_queue"]
    assert (boot.line, boot.severity, boot.premise) == (310, "warning", SHARED_ROOM)
    assert (inflight.line, inflight.severity, inflight.premise) == (970, "error", None)
    notes = {(e.path.split("disaggregation/", 1)[-1], e.line): e.note for e in boot.evidence}
    assert "builds the request's sender before it appends it" in notes[("prefill.py", 222)]
    assert "NixlKVSender.send() is called on a request's sender only here, after the request left" in \
        notes[("prefill.py", 750)]
    root = sglang_tree("0.5.9") / D
    assert (root / "prefill.py").read_text().splitlines()[222 - 1].strip().startswith("req.disagg_kv_sender = ")
    assert "req.disagg_kv_sender.send(" in (root / "prefill.py").read_text().splitlines()[750 - 1]
    # 0.4.8: send() sets has_sent and takes nothing out of the table: nothing on the bootstrap queue.
    old = scanned("0.4.8")
    assert [(f.queue, f.line, f.severity) for f in old.findings if f.rule == "poll-raises" and f.backend == "nixl"] \
        == [("disagg_prefill_inflight_queue", 402, "error")]


def test_failed_is_answered_through_the_scheduler_the_queue_was_built_by() -> None:
    """0.5.14 onward the bootstrap queue hands a Failed request to
    `self.scheduler.handle_bootstrap_failure(req)` (0.5.23 prefill.py:525), which releases its KV
    and metadata buffer, aborts it and streams the answer (1371-1375). `self.scheduler` is the
    object that built the queue (`PrefillBootstrapQueue(..., scheduler=self)` in
    managers/scheduler.py, kept as `self.scheduler = scheduler`), so the call runs the
    scheduler's method. Before, it was a call into the unknown, and 0.5.22 and 0.5.23 reported a
    release-leak warning ("no abort, no answer call") for a request that is answered."""
    for version, lines in (("0.5.14", (349, 873, 874, 876)), ("0.5.23", (525, 1371, 1372, 1374))):
        report = scanned(version)
        assert not [f for f in report.findings if f.rule == "release-leak" and f.queue == BOOTSTRAP], version
        evidence = {(e.line, e.note.partition(":")[0]) for e in bootstrap(report).states["Failed"].evidence}
        helper, *released, aborted = lines
        assert (helper, "helper") in evidence, (version, evidence)
        assert {(line, "release") for line in released} | {(aborted, "abort")} <= evidence, (version, evidence)
        source = (sglang_tree(version) / PREFILL).read_text().splitlines()
        assert "self.scheduler.handle_bootstrap_failure(req)" in source[helper - 1]
        assert "prepare_abort(" in source[aborted - 1]


def test_a_call_through_the_builder_kept_by_a_held_queue_runs_the_builders_method(tmp_path: Path) -> None:
    """examples/installed-layout, with the bootstrap queue built as `PrefillBootstrapQueue(self,
    ...)` by a scheduler class that composes the prefill mixin, and its Failed branch handing the
    request to `self.scheduler.fail_bootstrap(req)`, a mixin method that aborts and answers it: the
    path runs that method (its abort and answer are on the path), and nothing says the client is
    never answered. With the builder's `self` passed to another parameter, the call is unknown
    again and the request is reported lost (dropped: nothing keeps, ends or answers it), as before."""
    tree = tmp_path / "tree"
    shutil.copytree(EXAMPLES / "installed-layout", tree)
    prefill = tree / D / "prefill.py"
    text = prefill.read_text()
    text = text.replace(
        "                reason = f\"bootstrap of {req.rid} failed\"\n"
        "                prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)\n"
        "                self.scheduler.stream_output([req], req.return_logprob)\n",
        "                self.scheduler.fail_bootstrap(req)\n")
    text = text.replace(
        "class SchedulerDisaggregationPrefillMixin:\n"
        "    \"\"\"Methods the scheduler gains when it only runs prefill.\"\"\"\n",
        "class SchedulerDisaggregationPrefillMixin:\n"
        "    \"\"\"Methods the scheduler gains when it only runs prefill.\"\"\"\n\n"
        "    def fail_bootstrap(self, req):\n"
        "        prepare_abort(req, \"bootstrap failed\", status_code=HTTPStatus.INTERNAL_SERVER_ERROR)\n"
        "        self.stream_output([req], req.return_logprob)\n")
    assert text.count("fail_bootstrap") == 2
    prefill.write_text(text)
    binding = tree / S / "managers" / "scheduler_metrics_mixin.py"
    built = binding.read_text().replace(
        "class SchedulerQueueBinding:", "class SchedulerQueueBinding(SchedulerDisaggregationPrefillMixin):  # noqa: F821")
    for builder, followed in (("PrefillBootstrapQueue(self, None, None)", True),
                              ("PrefillBootstrapQueue(None, self, None)", False)):
        binding.write_text(built.replace("PrefillBootstrapQueue()", builder))
        report = scan_path(tree / S, load_pack("sglang-prefill"))
        failed = bootstrap(report).states["Failed"]
        notes = [e.note for e in failed.evidence]
        lost = [f for f in report.findings
                if f.rule in ("release-leak", "dropped-state") and f.queue == BOOTSTRAP and f.state == "Failed"]
        assert ("helper: SchedulerDisaggregationPrefillMixin.fail_bootstrap" in notes) == followed, notes
        assert any(n.startswith("abort") for n in notes) == followed, notes
        assert bool(lost) != followed, (builder, lost)
