"""The sglang-decode pack on SGLang 0.5.2 from PyPI: both decode queues mapped, checked against
a reading of `sglang/srt/disaggregation/decode.py` by hand (line numbers of that release)."""

from __future__ import annotations

import pytest

from kvtrace.model import ProblemKind, Report
from kvtrace.packs import load_pack
from kvtrace.scan import scan_path
from kvtrace.rules.premise import SHARED_ROOM
from kvtrace.rules.reentry_premise import ROOM_REUSED
from tests.sglang_wheels import sglang_tree

DECODE = "sglang/srt/disaggregation/decode.py"
D = "sglang/srt/disaggregation"


_SCANS: dict[str, Report] = {}


def decode_scan(version: str) -> Report:
    """The decode pack on a release's `srt/` (where the scheduler binds the queues), once per run."""
    if version not in _SCANS:
        _SCANS[version] = scan_path(sglang_tree(version) / "sglang" / "srt", load_pack("sglang-decode"))
    return _SCANS[version]


@pytest.fixture(scope="module")
def report() -> Report:
    return scan_path(sglang_tree("0.5.2"), load_pack("sglang-decode"))


def sites(report: Report, queue: str) -> set[tuple[str, str, int, tuple[str, ...]]]:
    q = next(q for q in report.queues if q.name == queue)
    return {(s.kind, s.path, s.line, s.states) for s in q.sites}


def test_transfer_queue_mapped_by_hand(report: Report) -> None:
    """`scheduler.py:730 self.disagg_decode_transfer_queue = DecodeTransferQueue(...)`; the class
    keeps `self.queue` and drains it in pop_transferred (574-672): polls at 577, loop at 583,
    removal by `indices_to_remove` and `self.queue = [... if i not in indices_to_remove]` (667)."""
    q = next(q for q in report.queues if q.name == "disagg_decode_transfer_queue")
    assert (q.drain.path, q.drain.line, q.drain.note) == (DECODE, 583, "DecodeTransferQueue.pop_transferred")
    fates = {state: fate.fate for state, fate in q.states.items()}
    # 584 Failed: prepare_abort (591), cache_finished_req (600), indices_to_remove.add (601);
    # 605 Success: indices_to_remove.add (652); 653 the three waiting states: `pass` (kept).
    assert fates == {"Failed": ["leaves"], "Success": ["leaves"], "Bootstrapping": ["kept"],
                     "WaitingForInput": ["kept"], "Transferring": ["kept"]}
    expected = {
        ("entry", DECODE, 569, ()),  # DecodeTransferQueue.add: self.queue.append(decode_req)
        ("entry", DECODE, 572, ()),  # DecodeTransferQueue.extend: self.queue.extend(decode_reqs)
        ("entry", DECODE, 890, ()),  # process_decode_queue: self.disagg_decode_transfer_queue.extend(req_conns)
        ("poll", DECODE, 577, ()),
        ("check", DECODE, 584, ("Failed",)),
        ("abort", DECODE, 591, ("Failed",)),
        ("release", DECODE, 600, ("Failed",)),
        ("done", DECODE, 601, ("Failed",)),
        ("check", DECODE, 605, ("Success",)),
        ("done", DECODE, 652, ("Success",)),
        ("check", DECODE, 653, ("Bootstrapping", "WaitingForInput", "Transferring")),
        # `for i in indices_to_remove: self.req_to_metadata_buffer_idx_allocator.free(idx)`
        ("release", DECODE, 665, ("Failed", "Success")),
        ("reassign", DECODE, 667, ()),
        ("gauge", "sglang/srt/managers/scheduler_metrics_mixin.py", 238, ()),  # len(...transfer_queue.queue)
    }
    assert expected <= sites(report, "disagg_decode_transfer_queue")


def test_prealloc_queue_mapped_by_hand(report: Report) -> None:
    """`scheduler.py:740 self.disagg_decode_prealloc_queue = DecodePreallocQueue(...)`;
    pop_preallocated (344) first calls _update_handshake_waiters, whose loop (322) zips
    `self.queue` with `poll_and_all_reduce(...)` (318): Bootstrapping `pass`, WaitingForInput sets
    `waiting_for_input`, Failed calls prepare_abort (334), anything else `raise ValueError` (342).
    Then pop_preallocated's own loops remove aborted requests (366) and preallocated ones (425)
    through `indices_to_remove`, and `self.queue = [...]` (427)."""
    q = next(q for q in report.queues if q.name == "disagg_decode_prealloc_queue")
    assert (q.drain.path, q.drain.line) == (DECODE, 322)
    fates = {state: fate.fate for state, fate in q.states.items()}
    # Failed: prepare_abort (334) first stores `req.finished_reason = FINISH_ABORT(...)`
    # (utils.py 321, FINISH_ABORT imported from managers.schedule_batch there and in decode.py),
    # so the removal loop's `isinstance(decode_req.req.finished_reason, FINISH_ABORT)` (362)
    # holds and `indices_to_remove.add(i)` (366) removes it; the preallocation loop's `if i in
    # indices_to_remove: continue` (370) then passes it by: it only leaves. The other polled
    # states carry no such store: the removal loop may take them (a request aborted elsewhere)
    # or not, and their `assert decode_req.metadata_buffer_index is not None` (419) may fail as
    # far as the engine can tell (it follows the allocator check at 379, so it is no unhandled
    # state). Transferring and Success reach the ValueError.
    assert fates["Failed"] == ["leaves"]
    for state in ("Bootstrapping", "WaitingForInput"):
        assert fates[state] == ["kept", "leaves", "raises"], state
    assert fates["Transferring"] == fates["Success"] == ["raises"]
    expected = {
        ("entry", DECODE, 256, ()),  # DecodePreallocQueue.add: self.queue.append(DecodeRequest(...))
        ("entry", "sglang/srt/managers/scheduler.py", 1351, ()),  # ...prealloc_queue.extend(reqs, ...)
        ("poll", DECODE, 318, ()),
        ("check", DECODE, 323, ("Bootstrapping",)),
        ("check", DECODE, 325, ("WaitingForInput",)),
        ("check", DECODE, 327, ("Failed",)),
        ("abort", DECODE, 334, ("Failed",)),
        ("raise", DECODE, 342, ("Transferring", "Success")),
        ("done", DECODE, 366, ("Failed", "Bootstrapping", "WaitingForInput")),
        ("done", DECODE, 425, ("Bootstrapping", "WaitingForInput")),  # an aborted request never gets here
        ("reassign", DECODE, 427, ()),
        ("gauge", "sglang/srt/managers/scheduler_metrics_mixin.py", 235, ()),
    }
    assert expected <= sites(report, "disagg_decode_prealloc_queue")


def test_decode_findings(report: Report) -> None:
    found = {(f.rule, f.path, f.line, f.backend, f.state) for f in report.findings
             if f.rule in ("pinned-state", "unhandled-state", "release-leak", "dropped-state", "state-crash", "skip-poll")}
    assert found == {
        # NixlKVReceiver.poll() (nixl/conn.py:650): `if not self.started_transfer: return
        # WaitingForInput`, then WaitingForInput until check_transfer_done; conclude_state is
        # only set by poll() itself (no abort() in the receiver or its bases), no deadline; the
        # transfer queue keeps WaitingForInput with `pass` (653).
        ("pinned-state", f"{D}/nixl/conn.py", 650, "nixl", "WaitingForInput"),
        # FakeKVReceiver.poll() (fake/conn.py:69) returns WaitingForInput until init(): not
        # reported, as every request in the transfer queue went through pop_preallocated's
        # `decode_req.kv_receiver.init(...)` before its append (rules/way_in.py).
        # _update_handshake_waiters: `else: raise ValueError(f"Unexpected poll case: {poll}")`.
        # No receiver returns Transferring: a catch-all no backend is seen to reach.
        ("unhandled-state", DECODE, 342, None, "Transferring"),
        # Every receiver's poll() returns Success, and every path of the prealloc queue's drain
        # that tests it ends in that raise; a warning: see test_prealloc_crash_names_its_premise.
        ("state-crash", DECODE, 342, None, "Success"),
        # `if all(decode_req.waiting_for_input for decode_req in self.queue): return` (315),
        # before the poll (318): mooncake's heartbeat_checker thread (conn.py:901, decode side)
        # calls _handle_node_failure, which stores Failed for every room of a lost prefill node
        # (1099); while all queued requests wait for memory nothing polls (sglang#37483).
        ("skip-poll", DECODE, 315, "mooncake", "Failed"),
        ("skip-poll", DECODE, 315, "ascend", "Failed"),
    }
    # The prealloc queue keeps WaitingForInput only until pop_preallocated moves it on: no pin there.
    assert not any(f.rule == "pinned-state" and "prealloc" in f.message for f in report.findings)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_decode_pack_completes_without_a_path_limit(version: str) -> None:
    """Issue 22: pop_preallocated's prealloc loop (decode.py 868-1060 in 0.5.14) runs each
    request through allocation helpers that enter other helpers or not and do nothing to it,
    after a poll pass and an abort pass: their combinations passed the per-statement limit,
    and the scan was incomplete with every state of both queues `kept, leaves, raises`.
    0.5.23 passed it in pop_preallocated (decode.py 1788, 1816); it completes since the HiSparse
    `assert prefix_len == 0` in _pre_alloc (2324) is no longer read as a test of the poll value
    (issue 22's item 1: a comparison tells the poll state only for a value that came from the poll)."""
    scanned = decode_scan(version)  # the same scan as the 0.5.14 rows of HAND_READ
    assert not [p for p in scanned.problems if p.kind in (ProblemKind.PATH_LIMIT, ProblemKind.CUT)], scanned.problems
    assert {q.name for q in scanned.queues} == {"disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"}


def test_prealloc_crash_names_its_premise(report: Report) -> None:
    """Issue 22: the prealloc loop's `raise ValueError` (342) on Success is reached only through a
    room whose transfer already ran, since a request in the prealloc queue holds no KV memory
    yet: a retracted request re-added (scheduler.py:1783 update_running_batch ->
    _extend_requests_to_queue (1351) -> DecodePreallocQueue.add (256), which builds a new
    receiver for the old room; sglang#6857) or two requests sharing a bootstrap_room
    (sglang#40125). The finding is a warning that names those entries."""
    crash = next(f for f in report.findings if f.rule == "state-crash" and f.state == "Success")
    assert crash.severity == "warning"
    assert crash.premise is not None and "re-enters the queue" in crash.premise and "share a bootstrap_room" in crash.premise
    lines = {(e.path, e.line) for e in crash.evidence if e.note.startswith("premise:")}
    assert {(DECODE, 256), ("sglang/srt/managers/scheduler.py", 1351),
            ("sglang/srt/managers/scheduler.py", 1783)} <= lines, lines
    # Transferring reaches the same raise (no receiver is seen returning it, so it is
    # unhandled-state's, not a crash): it rests on the same premise, and says so.
    unhandled = next(f for f in report.findings if f.rule == "unhandled-state" and f.state == "Transferring")
    assert (unhandled.path, unhandled.line, unhandled.severity) == (DECODE, 342, "warning")
    assert unhandled.premise == crash.premise and "true only if" in unhandled.message
    assert {(DECODE, 256), ("sglang/srt/managers/scheduler.py", 1351)} <= {
        (e.path, e.line) for e in unhandled.evidence if e.note.startswith("premise:")}


def test_skip_poll_names_the_thread_that_stores_failed(report: Report) -> None:
    found = next(f for f in report.findings if f.rule == "skip-poll" and f.backend == "mooncake")
    assert found.severity == "warning"
    assert (f"{D}/mooncake/conn.py", 1099) in {(e.path, e.line) for e in found.evidence}
    assert "_handle_node_failure" in found.message


# --- 0.4.8: both queues read by hand (line numbers of that release) --------------------------

SCHED = "sglang/srt/managers/scheduler.py"


def _srt(path: str) -> str:
    return f"disaggregation/{path}" if not path.startswith("managers/") else path


def _queue(report: Report, name: str):
    return next(q for q in report.queues if q.name == name)


def _sites(report: Report, name: str) -> set[tuple[str, str, int, tuple[str, ...]]]:
    return {(s.kind, s.path, s.line, s.states) for s in _queue(report, name).sites}


def test_0_4_8_prealloc_queue_mapped_by_hand() -> None:
    """`_update_handshake_waiters` (302): `if all(decode_req.waiting_for_input ...): return`
    (306), `polls = poll_and_all_reduce(...)` (309), loop (313): Bootstrapping `pass` (314),
    WaitingForInput sets the flag (316-317), Failed prepare_abort (318, 325), `else: raise
    ValueError` (330-331). Requests enter through DecodePreallocQueue.add's
    `self.queue.append(DecodeRequest(...))` (247), called from scheduler.py 1181/1192."""
    report = decode_scan("0.4.8")
    q = _queue(report, "disagg_decode_prealloc_queue")
    assert (q.drain.path, q.drain.line) == (_srt("decode.py"), 313)
    fates = {state: fate.fate for state, fate in q.states.items()}
    # Transferring and Success reach only the raise; Bootstrapping and WaitingForInput go on to
    # pop_preallocated's own loops, which may keep, move on or (an assert on the metadata
    # buffer) raise. Failed only leaves: prepare_abort stores FINISH_ABORT in finished_reason,
    # so the removal loop's isinstance test (351) removes it (355) and the preallocation loop
    # passes it by (`if i in indices_to_remove: continue`, 359).
    assert fates["Transferring"] == fates["Success"] == ["raises"]
    assert fates["Failed"] == ["leaves"]
    for state in ("Bootstrapping", "WaitingForInput"):
        assert fates[state] == ["kept", "leaves", "raises"], state
    expected = {
        ("entry", _srt("decode.py"), 247, ()),
        ("entry", SCHED[len("sglang/srt/"):], 1192, ()),
        ("poll", _srt("decode.py"), 309, ()),
        ("check", _srt("decode.py"), 314, ("Bootstrapping",)),
        ("check", _srt("decode.py"), 316, ("WaitingForInput",)),
        ("check", _srt("decode.py"), 318, ("Failed",)),
        ("abort", _srt("decode.py"), 325, ("Failed",)),
        ("raise", _srt("decode.py"), 331, ("Transferring", "Success")),
    }
    assert expected <= _sites(report, "disagg_decode_prealloc_queue"), expected - _sites(report, "disagg_decode_prealloc_queue")


def test_0_4_8_transfer_queue_mapped_by_hand() -> None:
    """`pop_transferred` (548): polls (551), loop (557): Failed prepare_abort (565),
    cache_finished_req (574), indices_to_remove.add (575); Success (577) ...
    indices_to_remove.add (612); the three waiting states `pass` (613-618); `else: raise`
    (620); the removed indices' metadata buffers freed (625), `self.queue = [...]` (627)."""
    report = decode_scan("0.4.8")
    q = _queue(report, "disagg_decode_transfer_queue")
    assert (q.drain.path, q.drain.line) == (_srt("decode.py"), 557)
    assert {state: fate.fate for state, fate in q.states.items()} == {
        "Failed": ["leaves"], "Success": ["leaves"], "Bootstrapping": ["kept"], "WaitingForInput": ["kept"],
        "Transferring": ["kept"]}
    expected = {
        ("entry", _srt("decode.py"), 543, ()),  # add: self.queue.append(decode_req)
        ("entry", _srt("decode.py"), 857, ()),  # process_decode_queue: ...transfer_queue.extend(req_conns)
        ("poll", _srt("decode.py"), 551, ()),
        ("check", _srt("decode.py"), 558, ("Failed",)),
        ("abort", _srt("decode.py"), 565, ("Failed",)),
        ("release", _srt("decode.py"), 574, ("Failed",)),
        ("done", _srt("decode.py"), 575, ("Failed",)),
        ("check", _srt("decode.py"), 577, ("Success",)),
        ("done", _srt("decode.py"), 612, ("Success",)),
        ("release", _srt("decode.py"), 625, ("Failed", "Success")),
        ("reassign", _srt("decode.py"), 627, ()),
    }
    assert expected <= _sites(report, "disagg_decode_transfer_queue"), expected - _sites(report, "disagg_decode_transfer_queue")


# Every error and every decode-only verdict of the three releases read by hand:
# (version, rule, backend, state, path, line, severity, why, upstream).
HAND_READ = [
    # 0.4.8 ---------------------------------------------------------------------------------
    # (fake WaitingForInput and mooncake Bootstrapping in the transfer queue were rows here, read
    # as true; read again they are false or rest on a shared room: SHARED_ROOM_PINS below.)
    ("0.4.8", "skip-poll", "mooncake", "Failed", "decode.py", 306, "warning",
     "heartbeat_checker -> _handle_node_failure stores Failed (mooncake/conn.py:666); the return at 306 skips the poll",
     "sglang#37483 (fixed 0.5.20)"),
    ("0.4.8", "state-crash", None, "Success", "decode.py", 331, "warning",
     "raise ValueError in the handshake loop; Success needs a room whose transfer already ran (retracted requests "
     "go to retracted_queue since 0.4.8, so two requests sharing a room remain)", "sglang#6857, sglang#40125"),
    # Transferring: no receiver's poll() returns it (mooncake's decode thread stores what the prefill
    # sends, Success or Failed: read since stop 27, before a value kvtrace could not read and a
    # state-crash "maybe by mooncake"); the raise is reached only by a room another receiver moved.
    ("0.4.8", "unhandled-state", None, "Transferring", "decode.py", 331, "warning",
     "same raise; no receiver's poll() returns Transferring", "sglang#40125"),
    # The room is cleared while this request is queued only by another request's receiver for the
    # same room (#40125 is that case): a warning resting on a shared room, as on the prefill side.
    ("0.4.8", "poll-raises", "mooncake", None, "mooncake/conn.py", 585, "warning",
     "check_status indexes request_status[room]: a room cleared before the poll raises KeyError", "sglang#40125"),
    # 0.5.2 ----------------------------------------------------------------------------------
    ("0.5.2", "skip-poll", "mooncake", "Failed", "decode.py", 315, "warning",
     "heartbeat_checker -> _handle_node_failure stores Failed (mooncake/conn.py:1099)", "sglang#37483 (fixed 0.5.20)"),
    ("0.5.2", "skip-poll", "ascend", "Failed", "decode.py", 315, "warning",
     "ascend's receiver is mooncake's: the same thread", "sglang#37483 (fixed 0.5.20)"),
    ("0.5.2", "state-crash", None, "Success", "decode.py", 342, "warning",
     "raise ValueError; Success only through a reused room", "sglang#6857, sglang#40125"),
    # 0.5.9 ----------------------------------------------------------------------------------
    ("0.5.9", "skip-poll", "mooncake", "Failed", "decode.py", 436, "warning",
     "heartbeat thread -> _handle_node_failure stores Failed; return at 436 before the poll (439)", "sglang#37483"),
    ("0.5.9", "skip-poll", "nixl", "Failed", "decode.py", 436, "warning",
     "NixlKVManager._handle_node_failure stores Failed for a lost prefill node", "sglang#37483"),
    ("0.5.9", "skip-poll", "mori", "Failed", "decode.py", 436, "warning",
     "MoriKVManager's decode thread stores Failed", "sglang#37483"),
    ("0.5.9", "state-crash", None, "Success", "decode.py", 466, "warning",
     "raise ValueError after the PP consensus guard; Success only through a reused room", "sglang#6857, sglang#40125"),
    ("0.5.9", "state-crash", None, "Transferring", "decode.py", 466, "warning",
     "mori's poll() returns Transferring; the same raise, the same premise", "sglang#40125"),
    # NixlKVReceiver.poll (1044): `if not self.started_transfer: return WaitingForInput` before
    # any deadline; waiting_timeout counts only from init(), which the prealloc drain calls only
    # once memory is reserved: while allocation is blocked nothing frees it.
    ("0.5.9", "poll-raises", "mooncake", None, "mooncake/conn.py", 1099, "warning",
     "check_status: `return self.request_status[bootstrap_room]`, a KeyError once the room is cleared", "sglang#40125"),
    ("0.5.9", "poll-raises", "mori", None, "mori/conn.py", 297, "warning",
     "the same indexing in MoriKVManager.check_status", "sglang#40125"),
    # 0.5.14 ---------------------------------------------------------------------------------
    # _update_handshake_waiters (634): `if all(waiting_for_input) and not any(conclude_state ==
    # Failed): return` (641) before the poll (647); the receiver's own abort is seen, a Failed the
    # manager stores from its heartbeat thread (_handle_node_failure) is not.
    ("0.5.14", "skip-poll", "mooncake", "Failed", "decode.py", 641, "warning",
     "CommonKVManager._handle_node_failure stores Failed; return at 641 before the poll (647)", "sglang#37483 (fixed 0.5.20)"),
    ("0.5.14", "skip-poll", "ascend", "Failed", "decode.py", 641, "warning",
     "ascend's receiver is mooncake's: the same thread", "sglang#37483 (fixed 0.5.20)"),
    ("0.5.14", "skip-poll", "nixl", "Failed", "decode.py", 641, "warning",
     "the nixl manager is a CommonKVManager: the same _handle_node_failure", "sglang#37483 (fixed 0.5.20)"),
    ("0.5.14", "skip-poll", "mori", "Failed", "decode.py", 641, "warning",
     "MoriKVManager's decode thread stores Failed", "sglang#37483 (fixed 0.5.20)"),
    # CommonKVManager.check_status (212) indexes request_status[room]; the receiver's room is
    # stored at its __init__ and popped only by CommonKVReceiver.clear (1159), which the drains
    # call as the request leaves: the KeyError needs another request's receiver for the same room
    # (a client-supplied bootstrap_room: sglang#40125; rooms are random 63-bit otherwise, #27643).
    ("0.5.14", "poll-raises", "mooncake", None, "common/conn.py", 212, "warning",
     "check_status: `return self.request_status[bootstrap_room]`; a room cleared by a request sharing it",
     "sglang#40125, sglang#27643", "disagg_decode_prealloc_queue"),
    ("0.5.14", "poll-raises", "ascend", None, "common/conn.py", 212, "warning",
     "the same check_status (ascend's receiver is mooncake's)", "sglang#40125", "disagg_decode_prealloc_queue"),
    ("0.5.14", "poll-raises", "mori", None, "common/conn.py", 212, "warning",
     "the same check_status (MoriKVReceiver is a CommonKVReceiver)", "sglang#40125", "disagg_decode_prealloc_queue"),
    # The same KeyError for the transfer queue, which polls through a helper (pop_transferred 1638:
    # `polls = self._poll_with_metadata_gate()`, whose poll_and_all_reduce (1594) gets
    # `[dr.kv_receiver for dr in self.queue]`, 1592). A request there came from the prealloc queue, whose
    # drain clears only the receivers of requests leaving it (aborted: pop_preallocated 824); its
    # own receiver is cleared only as it leaves the transfer queue (pop_transferred 1681 on Failed,
    # _commit_transfer_to_req 1517/1536/1583 on Success): again only a request sharing the room.
    *[("0.5.14", "poll-raises", backend, None, "common/conn.py", 212, "warning",
       "check_status indexes request_status[room]; while the request is in the transfer queue only a request "
       "sharing its room clears it", "sglang#40125, sglang#27643", "disagg_decode_transfer_queue")
      for backend in ("ascend", "mooncake", "mori")],
    # 0.5.19 ---------------------------------------------------------------------------------
    # The same KeyError (CommonKVManager.check_status 363). Deferred decode KV release (sglang#35049)
    # adds a clear() outside the drains: resolve_deferred_releases (2405, from the scheduler loop
    # 2676) -> _do_release -> `decode_req.kv_receiver.clear()` (2399), on requests that only
    # pop_transferred put in `self._deferred_releases` (_defer_release 2386) after removing them
    # from its queue. Still only a request sharing the room takes a queued request's room out.
    *[("0.5.19", "poll-raises", backend, None, "common/conn.py", 363, "warning",
       "check_status indexes request_status[room]; the deferred release clears only requests the transfer "
       "drain took out of its queue", "sglang#40125, sglang#27643, sglang#35049", queue)
      for backend in ("ascend", "mooncake", "mori")
      for queue in ("disagg_decode_prealloc_queue", "disagg_decode_transfer_queue")],
]

# --- Every other release, read by hand (issue 22) ---------------------------------------------
# Releases whose decode.py drain and backend code give the same verdict are grouped; each group
# says what was read once for all of them.
BOTH_QUEUES = ("disagg_decode_prealloc_queue", "disagg_decode_transfer_queue")
# MooncakeKVManager.check_status (mooncake/conn.py) and, from 0.5.10, CommonKVManager.check_status
# (common/conn.py): `return self.request_status[bootstrap_room]`. The room is stored by the
# receiver's constructor and popped only by `clear()`, which the drains call on a request as it
# leaves its queue (0.4.7 pop_transferred 476, 0.5.6.post2 _commit_transfer_to_req 720, 0.5.12
# 1432/1461): a queued request's room goes only if another request shares it (sglang#40125; with
# SGLang's own random rooms it does not happen, maintainers on sglang#27643). A warning with that
# premise on both queues, for every backend whose receiver reads that table (ascend's receiver is
# mooncake's from 0.4.9; MoriKVReceiver is a CommonKVReceiver from 0.5.10).
# The receivers that read CommonKVManager.check_status from 0.5.10.
_COMMON_RECEIVERS = ("ascend", "mooncake", "mori")
_KEYERROR_AT: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "0.4.7": ("mooncake/conn.py", 589, ("mooncake",)),
    "0.4.7.post1": ("mooncake/conn.py", 589, ("mooncake",)),
    "0.4.8.post1": ("mooncake/conn.py", 796, ("mooncake",)),
    "0.4.9.post6": ("mooncake/conn.py", 809, ("ascend", "mooncake")),
    "0.4.10.post2": ("mooncake/conn.py", 827, ("ascend", "mooncake")),
    "0.5.1.post3": ("mooncake/conn.py", 999, ("ascend", "mooncake")),
    "0.5.2": ("mooncake/conn.py", 1002, ("ascend", "mooncake")),
    "0.5.3.post3": ("mooncake/conn.py", 1028, ("ascend", "mooncake")),
    "0.5.4.post3": ("mooncake/conn.py", 1027, ("ascend", "mooncake")),
    "0.5.5.post3": ("mooncake/conn.py", 1021, ("ascend", "mooncake")),
    "0.5.6.post2": ("mooncake/conn.py", 1019, ("ascend", "mooncake")),
    "0.5.7": ("mooncake/conn.py", 1024, ("ascend", "mooncake")),
    "0.5.8.post1": ("mooncake/conn.py", 1024, ("ascend", "mooncake")),
    "0.5.9": ("mooncake/conn.py", 1099, ("ascend",)),  # mooncake and mori: the 0.5.9 rows above
    "0.5.10": ("common/conn.py", 179, _COMMON_RECEIVERS),
    "0.5.10.post1": ("common/conn.py", 179, _COMMON_RECEIVERS),
    "0.5.11": ("common/conn.py", 180, _COMMON_RECEIVERS),
    "0.5.12": ("common/conn.py", 191, _COMMON_RECEIVERS),
    "0.5.12.post1": ("common/conn.py", 191, _COMMON_RECEIVERS),
    "0.5.13": ("common/conn.py", 210, _COMMON_RECEIVERS),
    "0.5.13.post1": ("common/conn.py", 210, _COMMON_RECEIVERS),
    # 0.5.14: the rows above; the transfer queue's clear() calls are the same drains' (0.5.15.post1
    # 835/1552/1571/1624/1722, 0.5.16 914/1714/1733/1819/1917).
    "0.5.15.post1": ("common/conn.py", 213, _COMMON_RECEIVERS),
    "0.5.16": ("common/conn.py", 248, _COMMON_RECEIVERS),
    "0.5.17": ("common/conn.py", 310, _COMMON_RECEIVERS),
    "0.5.18": ("common/conn.py", 315, _COMMON_RECEIVERS),
    # 0.5.19: the rows above. 0.5.20 keeps the deferred release's clear() (_do_release, on requests
    # pop_transferred already took out of its queue), as 0.5.19.
    "0.5.20": ("common/conn.py", 393, _COMMON_RECEIVERS),
    "0.5.21": ("common/conn.py", 413, _COMMON_RECEIVERS),
    "0.5.22": ("common/conn.py", 553, _COMMON_RECEIVERS),  # 0.5.23: test_0_5_23_decode_keyerror_rests_on_a_shared_room
}
# _update_handshake_waiters: Bootstrapping, WaitingForInput and Failed have branches, `else: raise
# ValueError(f"Unexpected poll case: {poll}")` at these lines. A request in the prealloc queue
# holds no KV memory, so no transfer into it has started: Success (and Transferring, which mori's
# and, from 0.5.10, the common receivers' tables can hold) comes only from a room another receiver
# moved there (a re-added request, sglang#6857, or two requests sharing a room, sglang#40125). A
# warning that says so, as on 0.4.8, 0.5.2 and 0.5.9 above.
_HANDSHAKE_RAISE_AT: dict[str, tuple[int, tuple[str, ...]]] = {
    "0.4.7.post1": (334, ("Success",)),  # Transferring: an unhandled-state, as on 0.4.8
    "0.4.8.post1": (331, ("Success",)),
    "0.4.9.post6": (331, ("Success",)),
    "0.4.10.post2": (331, ("Success",)),
    "0.5.1.post3": (340, ("Success",)),
    "0.5.3.post3": (406, ("Success",)),
    "0.5.4.post3": (408, ("Success",)),
    "0.5.5.post3": (407, ("Success",)),
    "0.5.6.post2": (411, ("Success",)),
    "0.5.7": (444, ("Success",)),
    "0.5.8.post1": (445, ("Success",)),
    "0.5.10": (552, ("Success", "Transferring")),
    "0.5.10.post1": (552, ("Success", "Transferring")),
    "0.5.11": (610, ("Success", "Transferring")),
    "0.5.12": (643, ("Success", "Transferring")),
    "0.5.12.post1": (643, ("Success", "Transferring")),
    # 0.5.13: test_0_5_13_decode_has_no_error_and_no_state_unhandled_at_the_hisparse_assert.
    "0.5.13.post1": (665, ("Success", "Transferring")),
    "0.5.14": (681, ("Success", "Transferring")),
    "0.5.15.post1": (692, ("Success", "Transferring")),
    "0.5.16": (768, ("Success", "Transferring")),
    # From 0.5.17 the same raise (0.5.17 804, 0.5.18 831, 0.5.19 926, 0.5.20 942, 0.5.21 1077) is an unhandled-state warning
    # with the same premise, not a state-crash.
}
# Releases that have no error and that this file scans only for the warning rows above: each
# costs a whole decode scan in CI (minutes from 0.5.15.post1 on); these rows are the ones to drop
# if that cost is not worth it.
WARNING_ONLY_SCANS = ("0.5.13.post1", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.21")
HAND_READ += [
    *[(version, "poll-raises", backend, None, path, line, "warning",
       "check_status indexes request_status[room]; only a request sharing the room clears it while this one is queued",
       "sglang#40125, sglang#27643", queue)
      for version, (path, line, backends) in _KEYERROR_AT.items() for backend in backends for queue in BOTH_QUEUES],
    *[(version, "state-crash", None, state, "decode.py", line, "warning",
       "raise ValueError in the handshake loop; a prealloc request holds no KV memory, so only a reused room",
       "sglang#6857, sglang#40125")
      for version, (line, states) in _HANDSHAKE_RAISE_AT.items() for state in states],
    ("0.4.7.post1", "unhandled-state", None, "Transferring", "decode.py", 334, "warning",
     "the handshake loop's raise; no receiver's poll() returns Transferring", "sglang#40125"),
    # 0.4.6.post5 … 0.4.8.post1, mooncake, transfer queue: MooncakeKVReceiver.poll returns the
    # table's value until it is Success or Failed. After init() the room stays at WaitingForInput
    # until the prefill sends a status (decode_thread) or, from 0.4.7, the heartbeat thread marks
    # a lost prefill node Failed (_handle_node_failure). A prefill that drops the request alive
    # (an abort there never notifies the decode: sglang#28651) leaves it pinned: no decode-side
    # deadline until SGLANG_DISAGGREGATION_WAITING_TIMEOUT (first in 0.4.9.post6, where the pin
    # is gone). True.
    *[(version, "pinned-state", "mooncake", "WaitingForInput", "mooncake/conn.py", line, "error",
       "no decode-side deadline after init(); only a status from the prefill or a dead prefill node frees it",
       "sglang#28651 (a prefill abort never notifies the decode); waiting timeout from 0.4.9.post6")
      for version, line in (("0.4.6.post5", 726), ("0.4.7", 990), ("0.4.7.post1", 995), ("0.4.8", 991),
                            ("0.4.8.post1", 1226))],
    # 0.4.6.post5 … 0.5.5.post3, nixl, transfer queue: after init() (`started_transfer = True`)
    # NixlKVReceiver.poll returns WaitingForInput until check_transfer_done; no abort, no deadline
    # (the heartbeat from 0.5.3.post3 covers a dead prefill node only). True; 0.5.6.post2 adds the
    # waiting timeout counted from init(), which runs before the append (no pin reported: see
    # test_no_pin_in_the_transfer_queue_for_a_state_the_entry_path_moved_past). 0.5.2's is also
    # in test_decode_findings.
    *[(version, "pinned-state", "nixl", "WaitingForInput", "nixl/conn.py", line, "error",
       "after init() WaitingForInput until the transfer is done; no abort, no deadline",
       "no tracker issue found; nixl's waiting timeout first in 0.5.6.post2 (nixl/conn.py 806)")
      for version, line in (("0.4.6.post5", 625), ("0.4.7", 457), ("0.4.7.post1", 462), ("0.4.8", 462),
                            ("0.4.8.post1", 482), ("0.4.9.post6", 489), ("0.4.10.post2", 489),
                            ("0.5.1.post3", 489), ("0.5.2", 650), ("0.5.3.post3", 790), ("0.5.4.post3", 797), ("0.5.5.post3", 794))],
]


@pytest.mark.parametrize("row", HAND_READ, ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}-{r[3]}" + "".join(f"-{q}" for q in r[9:]))
def test_decode_verdicts_read_by_hand(row: tuple) -> None:
    version, rule, backend, state, path, line, severity, why, upstream, *queue = row
    report = decode_scan(version)
    found = [f for f in report.findings if (f.rule, f.backend, f.state, f.path, f.line) ==
             (rule, backend, state, _srt(path), line) and (not queue or f.queue == queue[0])]
    assert found, f"{version}: {rule} {backend} {state} at {path}:{line} not reported ({why}; {upstream})"
    assert severity in {f.severity for f in found}, (why, [f.severity for f in found])
    if queue and severity == "warning":  # a row read for one queue says what it rests on
        assert all(f.premise == SHARED_ROOM for f in found), [f.premise for f in found]


def test_transfer_queue_keyerror_names_who_clears_the_room() -> None:
    """The transfer queue's KeyError rests on a shared room because of where clear() runs:
    the chain names those calls (the prealloc drain's for requests leaving it, the transfer
    drain's as its own request leaves) and says it is the room's only way out."""
    found = [f for f in decode_scan("0.5.14").findings if f.rule == "poll-raises"
             and f.queue == "disagg_decode_transfer_queue"]
    assert {f.backend for f in found} == {"ascend", "mooncake", "mori"}
    for f in found:
        premise_lines = {(e.path, e.line) for e in f.evidence if e.note.startswith("premise:")}
        assert {(_srt("decode.py"), 824), (_srt("decode.py"), 1681), (_srt("decode.py"), 1583)} <= premise_lines, premise_lines
        assert "true only if two requests share a bootstrap_room" in f.message
        # The decode side's backend object is the request's KV receiver, and the chain says so.
        notes = " ".join(e.note for e in f.evidence)
        assert "another request's receiver for the same room" in notes and "request's sender" not in notes


@pytest.mark.parametrize(("version", "reported"), [("0.5.19", True), ("0.5.20", False)])
def test_skip_poll_before_and_after_its_fix(version: str, reported: bool) -> None:
    """sglang#37483: 0.5.19's `_update_handshake_waiters` returns before polling when
    `self.pp_size <= 1 and all(decode_req.waiting_for_input ...) and not any(
    decode_req.kv_receiver.conclude_state == KVPoll.Failed ...)` (872): the receiver's own
    abort is seen, a Failed stored by the manager's heartbeat thread (_handle_node_failure) is
    not. 0.5.20 removed the early return: it always polls."""
    report = decode_scan(version)
    found = [f for f in report.findings if f.rule == "skip-poll"]
    if reported:
        assert {(f.path, f.line) for f in found} == {(_srt("decode.py"), 872)}
        assert "mooncake" in {f.backend for f in found}
        assert all(f.state == "Failed" and f.severity == "warning" for f in found)
    else:
        assert found == []


def test_known_miss_success_kept_in_the_prealloc_queue_0_4_6_post5() -> None:
    """A kvtrace miss, not a verdict (the finding was right before the catch-all rule learned to
    call "kept on one path, let out on another" a wait). 0.4.6.post5 `_update_handshake_waiters`
    (178-194) has no branch for Success: it falls through, `waiting_for_input` stays as it was.
    A retracted request re-enters the prealloc queue with a fresh DecodeRequest (scheduler.py
    1522 -> decode.py add 160, waiting_for_input False) whose receiver reads its room's Success
    (issue 22's reading, sglang#6857; 0.4.7 gave retracted requests their own queue, sglang#7196),
    or a request sharing the room concluded it: pop_preallocated's `if not decode_req.waiting_for_input: continue` keeps it
    for ever, unless aborted (210). kvtrace's paths do not say which test kept a request, so the
    pop_preallocated exit, open only to a request whose WaitingForInput branch ran, counts as
    the wait's end and the unhandled-state Success warning (decode.py 183) is gone. When kvtrace
    tells a keep on a request flag only another state's branch sets from a keep on a resource
    (the bootstrap queue's metadata-buffer `break`), this fails: assert the warning instead."""
    report = decode_scan("0.4.6.post5")
    lines = (sglang_tree("0.4.6.post5") / DECODE).read_text().splitlines()
    assert lines[183 - 1].strip() == "elif poll == KVPoll.Failed:"
    assert lines[160 - 1].strip().startswith("self.queue.append(DecodeRequest(")
    assert not [f for f in report.findings if f.rule == "unhandled-state" and f.state == "Success"
                and f.queue == "disagg_decode_prealloc_queue"]


def test_0_5_13_decode_has_no_error_and_no_state_unhandled_at_the_hisparse_assert() -> None:
    """The decode pack on 0.5.13 (decode.py as read by hand): complete, no path limit, no error.
    `_pre_alloc(..., prefix_len: Optional[int] = None, ...)` (1246) sets `prefix_len = 0` when
    None (1257-1258; the other caller, pop_preallocated 924, passes `prefix_match.l1_prefix_len` or
    `0`), and under `if self.scheduler.enable_hisparse:` (1307) asserts `prefix_len == 0` (1310):
    an invariant of the HiSparse mode about an int, not about the poll value. It fails, if ever, for
    every state alike, so no state is unhandled there (kvtrace used to read `== 0` as a test for
    Failed = 0 and reported all five states)."""
    report = decode_scan("0.5.13")
    assert not [p for p in report.problems if p.kind in (ProblemKind.PATH_LIMIT, ProblemKind.CUT)], report.problems
    assert not [(f.rule, f.backend, f.path, f.line) for f in report.findings if f.severity == "error"]
    lines = (sglang_tree("0.5.13") / DECODE).read_text().splitlines()
    assert lines[1310 - 1].strip() == "assert prefix_len == 0"
    assert lines[1307 - 1].strip() == "if self.scheduler.enable_hisparse:"
    assert [lines[1257 - 1].strip(), lines[1258 - 1].strip()] == ["if prefix_len is None:", "prefix_len = 0"]
    assert not [f for f in report.findings if (f.path, f.line) == (_srt("decode.py"), 1310)]
    # The drain's own tests of the poll value are still read: the Unexpected-poll-case raise of
    # _update_handshake_waiters (665; Bootstrapping, WaitingForInput and Failed have branches,
    # 630-664) is reached by Success and Transferring only. A request in the prealloc queue holds
    # no KV memory, so no transfer into it has started: its receiver answers those states only
    # from a room another receiver moved there (a request added again with its bootstrap_room, or
    # two requests sharing one: sglang#6857, #40125); the finding says so and is a warning.
    assert lines[665 - 1].strip() == 'raise ValueError(f"Unexpected poll case: {poll}")'
    at_raise = [f for f in report.findings if (f.path, f.line) == (_srt("decode.py"), 665)]
    assert {f.state for f in at_raise} == {"Success", "Transferring"}
    assert all(f.severity == "warning" and f.premise == ROOM_REUSED for f in at_raise), \
        [(f.rule, f.severity, f.premise) for f in at_raise]


def test_0_5_22_decode_raises_read_by_hand() -> None:
    """0.5.22 decode.py, three raises in the prealloc queue's drain, read by hand:
    - `_update_handshake_waiters` (1094): Bootstrapping / WaitingForInput / Failed have branches
      (1123-1147), `else: raise ValueError("Unexpected poll case")` (1149). Success and
      Transferring reach it only from a room another receiver moved there: a request re-added
      with its bootstrap_room (`add(..., is_rebootstrap=True)` 784 -> `_create_receiver_and_enqueue`
      883 builds a new receiver for `req.bootstrap_room`, and CommonKVReceiver.__init__ skips
      storing the room when it is already in the table) or two requests sharing one
      (sglang#40125, #6857). A warning that says so.
    - `raise NotImplementedError("HiSparse device-only PD transfer currently requires the Mooncake
      backend")` (1751), under `if self.transfer_backend != TransferBackend.MOONCAKE:` (1750) in
      pop_preallocated: a configuration refused whatever the poll value, reached by every state
      alike: no state is unhandled there.
    - `assert prefix_len == 0` (2253, _pre_alloc under enable_hisparse): an int, not the poll."""
    report = decode_scan("0.5.22")
    lines = (sglang_tree("0.5.22") / DECODE).read_text().splitlines()
    assert lines[1149 - 1].strip() == 'raise ValueError(f"Unexpected poll case: {poll}")'
    assert lines[1750 - 1].strip() == "if self.transfer_backend != TransferBackend.MOONCAKE:"
    assert lines[1751 - 1].strip() == "raise NotImplementedError("
    assert lines[2253 - 1].strip() == "assert prefix_len == 0"
    _handshake_raise_rests_on_a_reused_room_and_nothing_at(report, 1149, quiet=(1751, 2253))


def _handshake_raise_rests_on_a_reused_room_and_nothing_at(report: Report, raise_line: int, quiet: tuple[int, ...]) -> None:
    """The Unexpected-poll-case raise: Success and Transferring, warnings on a reused room; no
    finding at the `quiet` lines of decode.py; no error anywhere."""
    at = {line: [f for f in report.findings if (f.path, f.line) == (_srt("decode.py"), line)] for line in (raise_line, *quiet)}
    assert {f.state for f in at[raise_line]} == {"Success", "Transferring"}
    assert all((f.rule, f.severity, f.premise) == ("unhandled-state", "warning", ROOM_REUSED) for f in at[raise_line])
    assert not [f for line in quiet for f in at[line]], [(f.rule, f.state, f.line) for line in quiet for f in at[line]]
    assert not [f for f in report.findings if f.severity == "error"]


def test_0_5_23_decode_raises_and_the_failed_transfer_release_read_by_hand() -> None:
    """0.5.23 decode.py, read by hand:
    - `raise ValueError("Unexpected poll case")` (1179, _update_handshake_waiters): Success and
      Transferring only, a warning resting on a room another receiver moved there (as 0.5.22).
    - `raise NotImplementedError(` (1809) under `if self.transfer_backend != TransferBackend.MOONCAKE:`
      (1808): a configuration refused whatever the poll value: no per-state finding.
    - release-leak Failed at `prepare_abort(` (2885, pop_transferred) was false: the Failed branch
      puts the request in `failed` (2907); after the loop `for (i, decode_req, _), hold in
      zip(failed, held):` (2964) either releases it at once (`self._release_request(decode_req)`
      2969, whose body calls `release_kv_cache` 2820) or defers it (`self._defer_release` 2966 ->
      `self._deferred_releases`, emptied by resolve_deferred_releases 3046, run on every scheduler
      iteration 3467, -> _do_release -> `_release_request` 3023; sglang#35049). The metadata buffer
      is freed after the loop (2988) or at _do_release. No kv_cache leaks."""
    report = decode_scan("0.5.23")
    lines = (sglang_tree("0.5.23") / DECODE).read_text().splitlines()
    assert lines[1179 - 1].strip() == 'raise ValueError(f"Unexpected poll case: {poll}")'
    assert lines[1809 - 1].strip() == "raise NotImplementedError("
    assert lines[2885 - 1].strip() == "prepare_abort("
    assert lines[2964 - 1].strip() == "for (i, decode_req, _), hold in zip(failed, held):"
    assert lines[2969 - 1].strip() == "self._release_request(decode_req)"
    _handshake_raise_rests_on_a_reused_room_and_nothing_at(report, 1179, quiet=(1809, 2885))
    assert not [f for f in report.findings if f.rule == "release-leak"]


def test_0_5_23_decode_keyerror_rests_on_a_shared_room() -> None:
    """Issue 22/23: 0.5.23's decode pack reaches the path limit in pop_preallocated (its
    allocation helpers), so the drains' helpers cannot be read from the explored paths. The
    KeyError of CommonKVManager.check_status (common/conn.py 609, `self.request_status[
    bootstrap_room]`), read by both queues' receivers, rests on a shared room all the same: every
    `kv_receiver.clear()` is in a drain's static closure, or in `_do_release` (3028) on requests
    the transfer drain deferred (sglang#35049) after removing them from its queue (checked in
    test_premises.py; the chain does not list them, as the pop is in `_clear()`: a known miss
    there). CommonKVReceiver.__init__ returns before storing the room only when `bootstrap_room
    in mgr.request_status` (2500), i.e. another request holds the room. Upstream: a
    duplicated client-supplied room crashes the scheduler there (sglang#40125, fix #40185 open);
    with SGLang's own random 63-bit rooms it does not happen (maintainers on sglang#27643)."""
    report = decode_scan("0.5.23")
    lines = (sglang_tree("0.5.23") / D / "common/conn.py").read_text().splitlines()
    assert lines[609 - 1].strip() == "return self.request_status[bootstrap_room]"
    found = [f for f in report.findings if f.rule == "poll-raises" and (f.path, f.line) == (_srt("common/conn.py"), 609)]
    assert {(f.backend, f.queue) for f in found} == {(b, q) for b in ("ascend", "mooncake", "mori")
                                                      for q in ("disagg_decode_prealloc_queue",
                                                                "disagg_decode_transfer_queue")}
    for f in found:
        assert (f.severity, f.premise) == ("warning", SHARED_ROOM), (f.backend, f.queue, f.severity, f.premise)
        assert not any("can return without storing the room" in e.note for e in f.evidence)


# --- Errors read as false (issue 22): held where a call ending the pin dominates the way in or the table never goes back; else shared-room warnings ---
# What each transfer-queue request went through on its way in: pop_preallocated lets only a request
# with `waiting_for_input` set past `if not decode_req.waiting_for_input: continue`, calls
# `decode_req.kv_receiver.init(...)` (up to 0.5.9) or `.send_metadata(...)` (from 0.5.10) and only
# then `preallocated_reqs.append(decode_req)`; the transfer queue is filled from that list alone
# (process_decode_queue's `extend(req_conns)`, and from 0.5.9 the PP mixin's `extend(good_reqs)`).
# (release, the `waiting_for_input` test, the init()/send_metadata() call, the append; decode.py)
# and the fake receiver's flag that call sets (fake/conn.py).
_PREALLOC_WAY_OUT: dict[str, tuple[int, int, int, int]] = {
    "0.4.6.post5": (216, 251, 252, 72), "0.4.7": (279, 314, 315, 73), "0.4.7.post1": (365, 412, 413, 79),
    "0.4.8": (362, 409, 410, 79), "0.4.8.post1": (362, 409, 410, 79), "0.4.9.post6": (362, 409, 410, 79),
    "0.4.10.post2": (362, 409, 410, 79), "0.5.1.post3": (371, 421, 422, 79), "0.5.2": (373, 423, 424, 79),
    "0.5.3.post3": (437, 525, 529, 87), "0.5.4.post3": (439, 527, 530, 87), "0.5.5.post3": (438, 526, 529, 87),
    "0.5.6.post2": (442, 530, 533, 87), "0.5.7": (484, 572, 575, 87), "0.5.8.post1": (485, 573, 576, 87),
    "0.5.9": (506, 594, 597, 101), "0.5.10": (679, 774, 784, 109), "0.5.10.post1": (679, 774, 784, 109),
    "0.5.11": (752, 896, 910, 113), "0.5.12": (810, 984, 998, 118), "0.5.12.post1": (810, 984, 998, 118),
}
# From 0.5.10 the fake receiver answers Bootstrapping until init(prefill_dp_rank) and
# WaitingForInput until send_metadata(); `waiting_for_input` is set only on WaitingForInput.
_SEND_METADATA = ("0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1")
# From 0.5.10: _update_handshake_waiters sets the flag only under `elif poll == KVPoll.WaitingForInput:`
# (decode.py), and FakeKVReceiver.poll() answers Bootstrapping only `if not self.bootstrap_done:`,
# which init() sets for good (fake/conn.py).
_FLAG_SET_AFTER_HANDSHAKE: dict[str, tuple[int, int, int, int]] = {
    "0.5.10": (534, 535, 90, 101), "0.5.10.post1": (534, 535, 90, 101), "0.5.11": (592, 593, 93, 104),
    "0.5.12": (625, 626, 98, 109), "0.5.12.post1": (625, 626, 98, 109),
}
# MooncakeKVReceiver.__init__: the Bootstrapping store and the WaitingForInput store it ends with
# (mooncake/conn.py); its only other ways out store Failed and return.
_MOONCAKE_RECEIVER_STORES: dict[str, tuple[int, int]] = {
    "0.4.6.post5": (522, 629), "0.4.7": (774, 896), "0.4.7.post1": (779, 901), "0.4.8": (775, 897),
    "0.4.8.post1": (988, 1123),
}
# NixlKVReceiver: init() sets `self.started_transfer = True` and `self.init_time = time.time()`;
# poll() returns WaitingForInput on `if not self.started_transfer:` and else fails the request on
# `if elapsed >= self.kv_mgr.waiting_timeout:` (nixl/conn.py).
_NIXL_WAITING_TIMEOUT: dict[str, tuple[int, int, int, int]] = {
    "0.5.6.post2": (790, 791, 800, 806), "0.5.7": (814, 815, 824, 830), "0.5.8.post1": (811, 812, 821, 827),
    "0.5.9": (1041, 1042, 1051, 1057),
}
# MooncakeKVReceiver.__init__ stores Bootstrapping and, before it returns, WaitingForInput or Failed;
# nothing else on a decode server stores Bootstrapping (the decode thread stores what the prefill
# side sends: Success or Failed, or the value its own table held) and the table only moves up
# (max, Failed aside): a request that reached the transfer queue (only once its poll() answered
# WaitingForInput) reads Bootstrapping again only when a second receiver for its room is built
# over a Failed (max(Failed, Bootstrapping)): a warning resting on a shared room, as on the
# prefill side. (Strict xfails until the manager model read the socket's values, stop 27.)
# Read as false at stop 22 and now held (rules/way_in.py): fake's WaitingForInput (init()/send_metadata()
# sets the flag poll() tests) and nixl's (init() starts the clock of the waiting timeout poll() checks);
# and from 0.5.10 fake's Bootstrapping: FakeKVReceiver.poll() answers Bootstrapping until init() sets
# `bootstrap_done` (never unset), and pop_preallocated lets into the transfer queue only a request
# whose `waiting_for_input` flag _update_handshake_waiters set where poll() answered WaitingForInput.
ENTRY_PATH_MOVED_PAST = [
    *[pytest.param(v, "fake", "WaitingForInput", id=f"{v}-fake-WaitingForInput") for v in _PREALLOC_WAY_OUT],
    *[pytest.param(v, "nixl", "WaitingForInput", id=f"{v}-nixl-WaitingForInput") for v in _NIXL_WAITING_TIMEOUT],
    *[pytest.param(v, "fake", "Bootstrapping", id=f"{v}-fake-Bootstrapping") for v in _SEND_METADATA],
]
# 0.4.6.post5: no pin at all. Its update_status stores into an absent room, else max(entry, status)
# (Failed is not stored as is there), and nothing pops a room: once poll() read WaitingForInput the
# entry never goes below it, whoever stores (the prefill's status over the socket, its own table's
# value; a second receiver for the room). A strict xfail (an error) until the manager model read
# how the table's entry moves between polls (kvtrace.managers.TableMoves, stop 28).
_MONOTONE_UPDATE: dict[str, tuple[int, int]] = {"0.4.6.post5": (417, 422)}  # update_status, its max() store
TABLE_ONLY_RISES = [pytest.param(v, "mooncake", "Bootstrapping", id=f"{v}-mooncake-Bootstrapping-rises")
                    for v in _MONOTONE_UPDATE]
SHARED_ROOM_PINS = [pytest.param(v, "mooncake", "Bootstrapping", id=f"{v}-mooncake-Bootstrapping")
                    for v in _MOONCAKE_RECEIVER_STORES if v not in _MONOTONE_UPDATE]


@pytest.mark.parametrize(("version", "backend", "state"), ENTRY_PATH_MOVED_PAST + TABLE_ONLY_RISES + SHARED_ROOM_PINS)
def test_no_pin_in_the_transfer_queue_for_a_state_the_entry_path_moved_past(version: str, backend: str, state: str) -> None:
    """The right verdict for pinned-state errors read as false: no pin where a call that ends it
    dominates every way into the transfer queue (held) or where the status table never goes back
    below what poll() answered before the entry, and a warning resting on a shared room where the
    room can only come back to the state with a second receiver. The lines they rest on
    are checked by
    test_the_lines_that_make_those_transfer_queue_pins_false, which must pass."""
    found = [f for f in decode_scan(version).findings if (f.rule, f.backend, f.state, f.queue) ==
             ("pinned-state", backend, state, "disagg_decode_transfer_queue")]
    if any(p.values == (version, backend, state) for p in SHARED_ROOM_PINS):  # true only with a shared room
        assert found and all((f.severity, f.premise) == ("warning", SHARED_ROOM) for f in found), \
            [(f.path, f.line, f.severity, f.premise) for f in found]
        assert all("only after its poll() answered another state read from request_status" in f.message
                   for f in found), [f.message for f in found]
    else:
        assert not found, [(f.path, f.line, f.severity) for f in found]


@pytest.mark.parametrize("version", sorted({row[0] for row in HAND_READ}))
def test_every_error_of_a_release_read_by_hand_is_a_row_or_a_known_false_pin(version: str) -> None:
    """The rows are the whole reading: a new error on a release read by hand (or one a row no
    longer holds) fails here until it is read."""
    rows = {(rule, backend, state, _srt(path), line) for v, rule, backend, state, path, line, *_ in HAND_READ
            if v == version}
    errors = {(f.rule, f.backend, f.state, f.path, f.line) for f in decode_scan(version).findings if f.severity == "error"}
    assert errors <= rows, sorted(errors - rows, key=str)


def test_the_lines_that_make_those_transfer_queue_pins_false() -> None:
    """The code the verdicts above rest on, line by line (no scan)."""
    for version, (waiting, init, append, flag) in _PREALLOC_WAY_OUT.items():
        decode = (sglang_tree(version) / DECODE).read_text().splitlines()
        fake = (sglang_tree(version) / D / "fake/conn.py").read_text().splitlines()
        assert decode[waiting - 1].strip() == "if not decode_req.waiting_for_input:", version
        call = "send_metadata(" if version in _SEND_METADATA else "init("
        assert decode[init - 1].strip().startswith(f"decode_req.kv_receiver.{call}"), (version, decode[init - 1])
        assert decode[append - 1].strip() == "preallocated_reqs.append(decode_req)", version
        assert fake[flag - 1].strip() == ("self.has_sent_metadata = True" if call == "send_metadata(" else "self.has_init = True"), version
    for version, (answered, flag, not_done, done) in _FLAG_SET_AFTER_HANDSHAKE.items():
        decode = (sglang_tree(version) / DECODE).read_text().splitlines()
        fake = (sglang_tree(version) / D / "fake/conn.py").read_text()
        assert [decode[answered - 1].strip(), decode[flag - 1].strip()] == [
            "elif poll == KVPoll.WaitingForInput:", "decode_req.waiting_for_input = True"], version
        assert [fake.splitlines()[not_done - 1].strip(), fake.splitlines()[done - 1].strip()] == [
            "if not self.bootstrap_done:", "self.bootstrap_done = True"], version
        assert fake.count("self.bootstrap_done = ") == 2 and "self.bootstrap_done = False" in fake, version  # __init__, init()
    for version, (bootstrapping, waiting) in _MOONCAKE_RECEIVER_STORES.items():
        conn = (sglang_tree(version) / D / "mooncake/conn.py").read_text().splitlines()
        assert conn[bootstrapping - 1].strip().endswith("KVPoll.Bootstrapping)"), version
        assert conn[waiting - 1].strip().endswith("KVPoll.WaitingForInput)"), version
        receiver = "\n".join(conn[bootstrapping:waiting - 1])
        assert "KVPoll.Bootstrapping" not in receiver and receiver.count("return\n") == receiver.count("KVPoll.Failed)"), version
    for version, (update, raised) in _MONOTONE_UPDATE.items():
        text = (sglang_tree(version) / D / "mooncake/conn.py").read_text()
        conn = text.splitlines()
        assert conn[update - 1].strip().startswith("def update_status(self, bootstrap_room"), version
        assert [conn[update].strip(), conn[update + 1].strip(), conn[update + 2].strip()] == [
            "if bootstrap_room not in self.request_status:", "self.request_status[bootstrap_room] = status", "else:"], version
        assert conn[raised - 1].strip() == "self.request_status[bootstrap_room] = max(", version
        assert text.count("self.request_status[") == 4 and "request_status.pop" not in text \
            and "del self.request_status" not in text, version  # stores: those two; reads: max's, check_status
    for version, (started, init_time, not_started, timeout) in _NIXL_WAITING_TIMEOUT.items():
        conn = (sglang_tree(version) / D / "nixl/conn.py").read_text().splitlines()
        assert [conn[started - 1].strip(), conn[init_time - 1].strip(), conn[not_started - 1].strip(),
                conn[timeout - 1].strip()] == ["self.started_transfer = True", "self.init_time = time.time()",
                                               "if not self.started_transfer:",
                                               "if elapsed >= self.kv_mgr.waiting_timeout:"], version


@pytest.mark.parametrize("version", [*WARNING_ONLY_SCANS, "0.5.14", "0.5.19", "0.5.20"])
def test_releases_read_for_warnings_only_have_no_error_and_no_path_limit(version: str) -> None:
    """From 0.5.13 the decode pack reports no error (0.5.13 and 0.5.22 have their own tests):
    each of these scans is complete, without a path limit, and error-free (the scans the rows reuse)."""
    report = decode_scan(version)
    assert not [p for p in report.problems if p.kind in (ProblemKind.PATH_LIMIT, ProblemKind.CUT)], report.problems
    assert not report.incomplete, report.gaps
    assert not [(f.rule, f.backend, f.state, f.path, f.line) for f in report.findings if f.severity == "error"]


@pytest.mark.parametrize("version", ["0.5.6.post2", "0.5.7", "0.5.8.post1", "0.5.9"])
def test_the_receivers_init_is_followed_whole(version: str) -> None:
    """CommonKVReceiver.__init__ in these releases splits on a dozen settings (TP and PP sizes,
    MLA, page sizes) before it stores the room: past 4,096 paths, run from a table without the
    room. The paths differ in facts and locals the question (can it return with the room still
    absent?) never reads; they are joined, not cut, so mooncake's and ascend's receivers are
    judged on every path, with no path limit, and the scan is complete."""
    report = decode_scan(version)
    assert not [p for p in report.problems if p.kind in (ProblemKind.PATH_LIMIT, ProblemKind.CUT)], report.problems
    assert not [(b.name, n) for b in report.backends for n in b.notes if "path limit" in n]
    assert not report.incomplete, report.gaps
    assert {b.name for b in report.backends} >= {"ascend", "mooncake"}


def test_what_frees_a_state_no_queue_pins_says_so_instead_of_a_restart() -> None:
    """0.5.9: NixlKVReceiver.poll() never ends WaitingForInput on its own (no abort(), its
    timeout not reached on the run that keeps it), yet both decode grids show it `ok` (the
    prealloc drain moves it on; the transfer queue's way in moved past it). Its "what frees"
    line said the request stays until the server restarts, against the grid; a backend that
    does pin a state (0.4.6.post5 nixl, WaitingForInput in the transfer queue) keeps saying it."""
    from kvtrace.freeing import what_frees

    report = decode_scan("0.5.9")
    nixl = next(b for b in report.backends if b.name == "nixl")
    freeing = next(f for f in what_frees(report, nixl) if f.state == "WaitingForInput")
    assert freeing.how == "nothing" and "no queue scanned keeps a request in it for good" in freeing.text
    assert "until the server restarts" not in freeing.text
    old = decode_scan("0.4.6.post5")
    pinned = next(f for f in what_frees(old, next(b for b in old.backends if b.name == "nixl")) if f.state == "WaitingForInput")
    assert pinned.text.endswith("so the request stays until the server restarts")


@pytest.mark.parametrize(("version", "entered_past_the_flag"), [
    ("0.4.6.post5", True), ("0.5.2", True), ("0.5.3.post3", True),
    # init() returns before `started_transfer = True` when the bootstrap info could not be
    # fetched (its `if self.bootstrap_infos is None: ... return`): the first return stays reachable.
    ("0.5.4.post3", False),
])
def test_nixl_transfer_queue_pin_cites_the_return_a_request_that_ran_init_reaches(
        version: str, entered_past_the_flag: bool) -> None:
    """NixlKVReceiver.poll() answers WaitingForInput twice: under `if not self.started_transfer`
    (before init()) and after check_transfer_done. Every request enters the transfer queue with
    init() run (pop_preallocated calls it before the append), so where init() always sets the
    flag the pin's chain cites the second return and the init() call."""
    report = decode_scan(version)
    [pin] = [f for f in report.findings if (f.rule, f.backend, f.state, f.queue) ==
             ("pinned-state", "nixl", "WaitingForInput", "disagg_decode_transfer_queue")]
    conn = sglang_tree(version) / "sglang/srt/disaggregation/nixl/conn.py"
    lines = conn.read_text().splitlines()
    poll = next(e.line for e in pin.evidence if e.note == "no timeout check is reached for WaitingForInput")
    body = range(poll + 1, next(n for n in range(poll + 1, len(lines) + 1) if lines[n - 1].startswith("    def ")))
    returns = [n for n in body if lines[n - 1].strip().startswith("return KVPoll.WaitingForInput")]
    assert len(returns) == 2 and "not self.started_transfer" in lines[returns[0] - 2], returns
    [cited] = [e.line for e in pin.evidence if e.path == _srt("nixl/conn.py") and "returns WaitingForInput at" in e.note]
    assert cited == returns[1 if entered_past_the_flag else 0]
    init = [e for e in pin.evidence if "way into the queue runs" in e.note]
    if entered_past_the_flag:
        [e] = init
        decode = (sglang_tree(version) / DECODE).read_text().splitlines()
        assert e.path == _srt("decode.py") and ".kv_receiver.init(" in decode[e.line - 1], e
        assert e.note.endswith(f"so NixlKVReceiver.poll() gets past its return of WaitingForInput at line {returns[0]}"), e
    else:
        assert init == []
