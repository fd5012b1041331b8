"""Verdicts that rest on a premise say so (issue 23): hand-written trees in SGLang's shapes, each
worked out by hand, and the same questions on real releases.

- A state only the sender's constructor stores, that a request has left before it enters the
  queue (pack `entered_past`), comes back only with a second sender for the same room.
- An absent room that only the request's own clear() (called by the drain as it concludes)
  makes is absent while queued only through another request with the same room.
- A send right after the append that makes poll() leave the state: no pin, or a premise naming
  the condition that skips the send.
- Scanning the backends' folder alone, a drain parameter no caller in view passes is free.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtrace.model import PremiseKind, ProblemKind
from kvtrace.report.json import to_json_dict
from kvtrace.report.sarif import to_sarif
from kvtrace.report.verdicts import summary_line
from kvtrace.rules.premise import SHARED_ROOM
from kvtrace.rules.send_flow import SEND_SKIPPED
from kvtrace.rules.samples import SCHEDULER, SHARED_FILES, STANDARD_BRANCHES, drain
from kvtrace.scan import scan_path
from tests.sglang_wheels import sglang_tree

D = "sglang/srt/disaggregation"

# Bootstrapping is not expected in the inflight loop: it raises.
RAISING = STANDARD_BRANCHES.replace(
    "            else:\n                undone_reqs.append(req)",
    '            else:\n                raise RuntimeError("unexpected poll state")')

# The manager: a max()-merging status table, a bootstrap thread that records the handshake.
TABLE_METHODS = '''\
    def check_status(self, room):
        return self.request_status[room]

    def update_status(self, room, status):
        if room not in self.request_status:
            self.request_status[room] = status
        elif status == KVPoll.Failed:
            self.request_status[room] = KVPoll.Failed
        else:
            self.request_status[room] = max(self.request_status[room], status)
'''

MANAGER = '''\
from ..base.conn import KVPoll


class BaseKVManager:
    pass


class NetKVManager(BaseKVManager):
    def __init__(self):
        self.request_status = {}

{table}
    def bootstrap_thread(self, room):
        self.update_status(room, KVPoll.WaitingForInput)
{extra}'''.replace("{table}", TABLE_METHODS)

SENDER = '''\
from ..base.conn import BaseKVSender, KVPoll


class NetKVSender(BaseKVSender):
    def __init__(self, mgr, room):
        self.kv_mgr = mgr
        self.room = room
        self.kv_mgr.update_status(room, KVPoll.Bootstrapping)

    def poll(self) -> KVPoll:
        return self.kv_mgr.check_status(self.room)

    def abort(self):
        self.kv_mgr.update_status(self.room, KVPoll.Failed)
'''


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {**SHARED_FILES, **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def crash(report, state: str):
    return [f for f in report.findings if f.rule == "state-crash" and f.state == state]


def test_constructor_only_state_is_a_shared_room_premise(tmp_path: Path) -> None:
    report = scan_path(write(tmp_path, {"disaggregation/prefill.py": drain(RAISING),
                                        "disaggregation/net/conn.py": SENDER,
                                        "disaggregation/net/mgr.py": MANAGER.replace("{extra}", "")}))
    [finding] = crash(report, "Bootstrapping")
    assert finding.severity == "warning" and finding.premise == SHARED_ROOM
    assert f"true only if {SHARED_ROOM}" in finding.message
    assert any(e.path == "disaggregation/net/conn.py" and e.line == 5 and "only NetKVSender.__init__()" in e.note
               for e in finding.evidence)
    # Every format carries it; the gate on errors does not count it.
    data = to_json_dict(report)
    [row] = [f for f in data["findings"] if f["rule"] == "state-crash"]
    assert row["premise"] == SHARED_ROOM and row["premise_kinds"] == ["shared-room"] and row["severity"] == "warning"
    sarif = to_sarif([report], tmp_path)
    [result] = [r for r in sarif["runs"][0]["results"] if r["properties"]["rule"] == "state-crash"]
    assert result["properties"]["premise"] == SHARED_ROOM and result["level"] == "warning"
    assert result["properties"]["premise_kinds"] == ["shared-room"]


def test_a_later_store_of_the_state_makes_it_unconditional(tmp_path: Path) -> None:
    # A retry path of the manager puts Bootstrapping back for the room: no premise needed.
    retry = '''
    def handle_retry(self, room):
        self.request_status[room] = KVPoll.Bootstrapping
'''
    report = scan_path(write(tmp_path, {"disaggregation/prefill.py": drain(RAISING),
                                        "disaggregation/net/conn.py": SENDER,
                                        "disaggregation/net/mgr.py": MANAGER.replace("{extra}", retry)}))
    [finding] = crash(report, "Bootstrapping")
    assert finding.severity == "error" and finding.premise is None


# A manager built in one of two modes: a decode thread, started only in decode mode, stores a
# status read from the network (a value kvtrace cannot read); the sender's send path asserts
# prefill mode on its manager.
MODAL_MANAGER = '''\
import threading

from ..base.conn import KVPoll


class Mode:
    PREFILL = "prefill"
    DECODE = "decode"


class BaseKVManager:
    pass


class NetKVManager(BaseKVManager):
    def __init__(self, mode, socket):
        self.mode = mode
        self.socket = socket
        self.request_status = {}
        if self.mode == Mode.PREFILL:
            self.start_prefill_thread()
        elif self.mode == Mode.DECODE:
            self.start_decode_thread()

{table}
    def start_prefill_thread(self):
        def bootstrap_thread():
            while True:
                room = int(self.socket.recv())
                self.update_status(room, KVPoll.WaitingForInput)

        threading.Thread(target=bootstrap_thread).start()

    def start_decode_thread(self):
        def decode_thread():
            while True:
                room, status = self.socket.recv_multipart()
                status = int(status.decode("ascii"))
                self.update_status(int(room), status)

        threading.Thread(target=decode_thread).start()

    def add_transfer(self, room, pages):
{check}        self.socket.send(pages)
{extra}'''.replace("{table}", TABLE_METHODS)

MODAL_SENDER = SENDER + '''
    def send(self, pages):
        self.kv_mgr.add_transfer(self.room, pages)
'''

PREFILL_ONLY = "        assert self.mode == Mode.PREFILL\n"


def modal_crash(tmp_path: Path, check: str, extra: str = ""):
    report = scan_path(write(tmp_path, {"disaggregation/prefill.py": drain(RAISING),
                                        "disaggregation/net/conn.py": MODAL_SENDER,
                                        "disaggregation/net/mgr.py": MODAL_MANAGER.replace("{check}", check).replace("{extra}", extra)}))
    [finding] = crash(report, "Bootstrapping")
    return finding


def test_a_store_only_another_mode_makes_leaves_the_premise(tmp_path: Path) -> None:
    # The unreadable store runs only in decode mode; the sender's manager is in prefill mode
    # (send asserts it, only the constructor sets it): the premise holds as without that thread.
    finding = modal_crash(tmp_path, PREFILL_ONLY)
    assert finding.severity == "warning" and finding.premise == SHARED_ROOM
    [why] = [e for e in finding.evidence if "only NetKVSender.__init__()" in e.note]
    assert "NetKVManager.start_decode_thread() runs only when self.mode is Mode.DECODE (disaggregation/net/mgr.py:22)" \
        in why.note and "asserts it is Mode.PREFILL (disaggregation/net/mgr.py:54)" in why.note


def test_without_a_mode_the_sender_holds_the_unreadable_store_counts(tmp_path: Path) -> None:
    # Nothing says which mode the sender's manager is in: the network value may be Bootstrapping.
    assert modal_crash(tmp_path, "").premise is None
    # The mode can change after construction: the assert no longer fixes it.
    switch = "\n    def switch(self):\n        self.mode = Mode.DECODE\n"
    assert modal_crash(tmp_path / "switch", PREFILL_ONLY, switch).premise is None
    # A sender asserting the decode thread's own mode: that thread may run on its manager.
    decode = PREFILL_ONLY.replace("PREFILL", "DECODE")
    assert modal_crash(tmp_path / "decode", decode).premise is None


FAKE = '''\
from ..base.conn import BaseKVSender, KVPoll


class FakeKVSender(BaseKVSender):
    def __init__(self, mgr, room):
        self.has_sent = False

    def poll(self) -> KVPoll:
        if self.has_sent is False:
            return KVPoll.WaitingForInput
        return KVPoll.Success

    def send(self, pages):
        self.has_sent = True
'''

PRODUCER = '''
    def process_result(self, batch):
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)
            self.send_chunk(req, last=True)

    def send_chunk(self, req, last=False):
        pages = self.pages_of(req)
{guard}        req.disagg_kv_sender.send(pages)
'''


def fake_pins(tmp_path: Path, guard: str):
    tree = write(tmp_path, {"disaggregation/prefill.py": drain(STANDARD_BRANCHES, producer=PRODUCER.format(guard=guard)),
                            "disaggregation/fake/conn.py": FAKE})
    return [f for f in scan_path(tree).findings if f.rule == "pinned-state" and f.backend == "fake"]


def test_send_right_after_the_append_leaves_no_pin(tmp_path: Path) -> None:
    assert fake_pins(tmp_path, "") == []


def test_a_path_that_skips_the_send_is_the_premise(tmp_path: Path) -> None:
    [finding] = fake_pins(tmp_path, "        if len(pages) == 0:\n            return\n")
    assert finding.state == "WaitingForInput" and finding.severity == "warning" and finding.premise == SEND_SKIPPED
    assert finding.premise_kinds == (PremiseKind.SEND_SKIPPED,)
    lines = (tmp_path / "disaggregation" / "prefill.py").read_text().splitlines()
    line = lines.index("        if len(pages) == 0:") + 1
    assert lines[line + 1] == "        req.disagg_kv_sender.send(pages)"
    assert f"disaggregation/prefill.py:{line} `len(pages) == 0` leaves before the send" in finding.message
    assert any(e.line == line + 2 and "req.disagg_kv_sender.send() after the append" in e.note for e in finding.evidence)


PP_BRANCHES = '''\
            if rids_to_check is not None:
                if req.rid not in rids_to_check:
                    undone_reqs.append(req)
                    continue
                assert poll == KVPoll.Success or poll == KVPoll.Failed
''' + STANDARD_BRANCHES

WAITING_SENDER = '''\
from ..base.conn import BaseKVSender, KVPoll


class WaitKVSender(BaseKVSender):
    def __init__(self, mgr, room):
        self.mgr = mgr

    def poll(self) -> KVPoll:
        if self.mgr.ready():
            return KVPoll.Success
        return KVPoll.WaitingForInput

    def abort(self):
        pass
'''

PP_CALLER = '''\
class SchedulerPP:
    def event_loop_pp(self, released):
        if self.disagg_prefill_inflight_queue:  # in scope: the file mentions the queue
            self.drain_inflight(released)
'''


def pp_tree(root: Path, caller: bool) -> Path:
    normal = "\n    def event_loop_normal(self):\n        self.drain_inflight()\n"
    prefill = drain(PP_BRANCHES, normal).replace("def drain_inflight(self):", "def drain_inflight(self, rids_to_check=None):")
    # The scheduler composing the mixins (with the PP one when it is there): every caller in view.
    files = {"disaggregation/prefill.py": prefill, "disaggregation/wait/conn.py": WAITING_SENDER,
             "managers/scheduler.py": SCHEDULER}
    if caller:
        files["managers/scheduler_pp.py"] = PP_CALLER
        files["managers/scheduler.py"] = SCHEDULER.replace(
            "from ..disaggregation.prefill import PrefillMixin", "from ..disaggregation.prefill import PrefillMixin\n"
            "from .scheduler_pp import SchedulerPP").replace("class Scheduler(PrefillMixin)", "class Scheduler(SchedulerPP, PrefillMixin)")
    return write(root, files)


def test_a_mode_whose_caller_is_outside_the_scanned_folder_is_still_a_mode(tmp_path: Path) -> None:
    tree = pp_tree(tmp_path, caller=True)
    whole, folder = scan_path(tree), scan_path(tree / "disaggregation")
    key = {(f.rule, f.state, f.line) for f in crash(whole, "WaitingForInput")}
    assert key and key == {(f.rule, f.state, f.line) for f in crash(folder, "WaitingForInput")}
    assert not whole.problems
    # With the caller in view it is a crash as stated; from the folder alone it rests on a caller
    # the scan cannot see: a warning that says so.
    assert {(f.severity, f.premise) for f in crash(whole, "WaitingForInput")} == {("error", None)}
    unseen = "a caller outside the scanned folder passes rids_to_check to drain_inflight"
    [finding] = crash(folder, "WaitingForInput")
    assert (finding.severity, finding.premise, finding.premise_kinds) == ("warning", unseen, (PremiseKind.UNSEEN_CALLER,))
    # The summary names it, as it names the error in the whole scan: a warning that rests on the
    # folder scanned is not one to count and pass over.
    assert "queue state-crash WaitingForInput" in summary_line(whole)
    assert f"queue state-crash WaitingForInput only if {unseen}" in summary_line(folder), summary_line(folder)
    assert f"true only if {unseen}: no caller in view passes rids_to_check, and only the mode rids_to_check " \
           "passed (no caller in view) reaches it" in finding.message
    # The folder scan says what it could not see (INCOMPLETE), and names the mode as unseen.
    assert any(p.kind is ProblemKind.OUT_OF_VIEW and "outside the scanned folder are not seen: rids_to_check" in p.text
               for p in folder.problems)
    assert [m.label for m in folder.queues[0].modes] == ["rids_to_check=None", "rids_to_check passed (no caller in view)"]


def test_with_the_scheduler_in_view_and_no_caller_passing_it_the_branch_is_dead(tmp_path: Path) -> None:
    report = scan_path(pp_tree(tmp_path, caller=False))
    assert crash(report, "WaitingForInput") == [] and not report.problems


# On real releases ------------------------------------------------------------------------------


def test_pp_mode_crash_seen_from_the_disaggregation_folder_alone() -> None:
    """0.5.9: the PP caller (SchedulerPPMixin.event_loop_pp_disagg_prefill) is in managers/;
    before, disaggregation/ alone missed the sglang#20686 crash and said complete."""
    root = sglang_tree("0.5.9")
    found = {(f.state, f.line, f.premise) for f in scan_path(root / "sglang" / "srt").findings if f.rule == "state-crash"}
    assert found == {("WaitingForInput", 576, None), ("Transferring", 576, None),
                     ("Bootstrapping", 576, SHARED_ROOM), ("Bootstrapping", 602, SHARED_ROOM)}
    # From the folder alone: the same sites, and the PP ones rest on the caller it cannot see.
    folder = scan_path(root / D)
    unseen = "a caller outside the scanned folder passes rids_to_check to process_disagg_prefill_inflight_queue"
    found = {(f.state, f.line, f.premise) for f in folder.findings if f.rule == "state-crash"}
    assert found == {("WaitingForInput", 576, unseen), ("Transferring", 576, unseen),
                     ("Bootstrapping", 576, f"{SHARED_ROOM} and {unseen}"), ("Bootstrapping", 602, SHARED_ROOM)}
    kinds = {(f.state, f.line): f.premise_kinds for f in folder.findings if f.rule == "state-crash"}
    assert kinds[("Bootstrapping", 576)] == (PremiseKind.SHARED_ROOM, PremiseKind.UNSEEN_CALLER)
    assert kinds[("Bootstrapping", 602)] == (PremiseKind.SHARED_ROOM,)
    said = summary_line(folder)
    # (Two queues judged: a finding of no one backend is named with its queue.)
    assert f"state-crash WaitingForInput, Transferring in disagg_prefill_inflight_queue only if {unseen}" in said, said
    assert f"state-crash Bootstrapping in disagg_prefill_inflight_queue only if {SHARED_ROOM} and {unseen}" in said, said
    assert any("process_disagg_prefill_inflight_queue (prefill.py:" in p.text and "outside the scanned folder are not seen"
               in p.text for p in folder.problems if p.kind is ProblemKind.OUT_OF_VIEW)
    lines = (root / D / "prefill.py").read_text().splitlines()
    assert lines[576 - 1].strip() == "assert poll == KVPoll.Success or poll == KVPoll.Failed"


def test_fake_pin_names_the_skipped_send_on_a_release() -> None:
    """0.5.10.post1: prefill.py appends (505), then send_kv_chunk(req, last_chunk=True) (529)
    calls req.disagg_kv_sender.send (817) unless `len(page_indices) == 0` (812) returns."""
    root = sglang_tree("0.5.10.post1")
    report = scan_path(root)
    [finding] = [f for f in report.findings if f.rule == "pinned-state" and f.backend == "fake"]
    assert finding.premise == SEND_SKIPPED and finding.severity == "warning"
    assert f"{D}/prefill.py:812 `len(page_indices) == 0` leaves before the send" in finding.message
    lines = (root / D / "prefill.py").read_text().splitlines()
    assert lines[817 - 1].strip() == "req.disagg_kv_sender.send(page_indices, state_indices)"
    data = json.loads(json.dumps(to_json_dict(report)))
    assert any(f["premise"] == SEND_SKIPPED for f in data["findings"])


def test_nixl_absent_room_pin_rests_on_a_shared_room() -> None:
    """0.5.12.post1: NixlKVManager.check_status .get(room, WaitingForInput) (nixl/conn.py:561);
    the room leaves request_status only through CommonKVSender.clear() (common/conn.py:716),
    called by the drain at prefill.py:646 as the request concludes (Success)."""
    root = sglang_tree("0.5.12.post1")
    [finding] = [f for f in scan_path(root).findings if f.rule == "pinned-state" and f.backend == "nixl"]
    assert (finding.state, finding.premise, finding.severity) == ("WaitingForInput", SHARED_ROOM, "warning")
    assert any((e.path, e.line) == (f"{D}/prefill.py", 646) and e.note.startswith("premise:") for e in finding.evidence)
    assert "req.disagg_kv_sender.clear()" in (root / D / "prefill.py").read_text().splitlines()[646 - 1]


def test_silent_status_drop_sees_the_returning_if_in_common_update_status() -> None:
    """0.5.14 common/conn.py:215 `if bootstrap_room not in self.request_status:` then `if status
    == KVPoll.Failed: return` (220-221) before the store (222): before, only mori's override
    (mori/conn.py:420) was reported."""
    root = sglang_tree("0.5.14")
    found = {(f.path, f.line) for f in scan_path(root).findings if f.rule == "silent-status-drop"}
    assert found == {(f"{D}/common/conn.py", 215), (f"{D}/mori/conn.py", 420)}
    lines = (root / D / "common/conn.py").read_text().splitlines()
    assert lines[221 - 1].strip() == "return" and "self.request_status[bootstrap_room] = status" in lines[222 - 1]


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_decode_queues_bound_in_managers_are_a_gap_from_the_folder_alone(version: str) -> None:
    """0.5.2 decode: scheduler.py (managers/) binds self.disagg_decode_prealloc_queue and
    self.disagg_decode_transfer_queue to their queue objects; decode.py appends to the transfer
    queue (890). Before, disaggregation/ alone gave two undrained-queue errors there. 0.5.23's
    role_switch.py clears both (`scheduler.disagg_decode_prealloc_queue = None`): that binds no
    object, and before it hid the gap (two grids of `?`, no INCOMPLETE line)."""
    from kvtrace.packs import load_pack

    root = sglang_tree(version)
    folder = scan_path(root / D, load_pack("sglang-decode"))
    assert not [f for f in folder.findings if f.rule == "undrained-queue"]
    for queue in ("disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"):
        assert any(p.kind is ProblemKind.OUT_OF_VIEW and p.text.startswith(f"self.{queue} is bound outside the scanned folder")
                   for p in folder.problems), queue
    whole = scan_path(root / "sglang" / "srt", load_pack("sglang-decode"))
    assert not [f for f in whole.findings if f.rule == "undrained-queue"]
    assert not any(p.kind is ProblemKind.OUT_OF_VIEW and "bound outside the scanned folder" in p.text for p in whole.problems)


# A timeout whose condition also tests the status covers only that status (issue 23 §3).
TIMED_MANAGER = '''\
from ..base.conn import KVPoll


class BaseKVManager:
    pass


class NetKVManager(BaseKVManager):
    def __init__(self):
        self.request_status = {}

    def check_status(self, room):
        return self.request_status[room]

    def update_status(self, room, status):
        self.request_status[room] = status

    def handshake(self, room):
        self.update_status(room, KVPoll.WaitingForInput)

    def transfer(self, room):
        self.update_status(room, KVPoll.Transferring)
'''
TIMED_SENDER = '''\
import time

from ..base.conn import BaseKVSender, KVPoll


class NetKVSender(BaseKVSender):
    def __init__(self, mgr, room):
        self.kv_mgr = mgr
        self.room = room
        self.start = time.time()
        self.kv_mgr.update_status(room, KVPoll.WaitingForInput)

    def poll(self) -> KVPoll:
        status = self.kv_mgr.check_status(self.room)
%s
        return status

    def abort(self):
        pass
'''
GUARDED_FLAT = '''        if time.time() - self.start >= 30 and status == KVPoll.WaitingForInput:
            return KVPoll.Failed'''
GUARDED_NESTED = '''        if time.time() - self.start >= 30:
            if status == KVPoll.WaitingForInput:
                return KVPoll.Failed'''


@pytest.mark.parametrize("guard", ["flat", "nested"])
def test_a_status_guarded_timeout_covers_only_that_status(tmp_path: Path, guard: str) -> None:
    body = GUARDED_FLAT if guard == "flat" else GUARDED_NESTED
    report = scan_path(write(tmp_path, {"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                                        "disaggregation/net/conn.py": TIMED_SENDER % body,
                                        "disaggregation/net/mgr.py": TIMED_MANAGER}))
    [backend] = report.backends
    assert [(t.line, t.covers) for t in backend.timeouts] == [(15, ("WaitingForInput",))]
    assert {s: v.way_out.value for s, v in backend.verdicts.items()} == {"WaitingForInput": "timeout", "Transferring": "none"}
    assert [(f.state, f.severity) for f in report.findings if f.rule == "pinned-state"] == [("Transferring", "error")]


def test_the_gate_on_errors_counts_only_unconditional_findings(tmp_path: Path) -> None:
    import subprocess
    import sys

    premised = write(tmp_path / "premised", {"disaggregation/prefill.py": drain(RAISING),
                                             "disaggregation/net/conn.py": SENDER,
                                             "disaggregation/net/mgr.py": MANAGER.replace("{extra}", "")})
    retry = "\n    def handle_retry(self, room):\n        self.request_status[room] = KVPoll.Bootstrapping\n"
    plain = write(tmp_path / "plain", {"disaggregation/prefill.py": drain(RAISING),
                                       "disaggregation/net/conn.py": SENDER,
                                       "disaggregation/net/mgr.py": MANAGER.replace("{extra}", retry)})

    def gate(tree: Path, level: str) -> int:
        return subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(tree), "--no-cache", "-q",
                               "--fail-on", level], capture_output=True, text=True, timeout=300).returncode

    assert gate(premised, "error") == 0 and gate(premised, "warning") == 1
    assert gate(plain, "error") == 1


# A status read passed along as a bound method (0.5.22 … 0.5.23: `self._poll_with_status(
# self.kv_mgr.check_status)`): the engine follows the callable wherever it is called.
KEYED_MANAGER = MANAGER.replace("{extra}", "")
KEYED_SENDER = '''\
from ..base.conn import BaseKVSender, KVPoll


def poll_through(check, room):
    return check(room)


class NetKVSender(BaseKVSender):
    def __init__(self, mgr, room):
        self.kv_mgr = mgr
        self.room = room
        self.kv_mgr.update_status(room, KVPoll.Bootstrapping)

    def poll(self) -> KVPoll:
%s

    def _poll_with(self, check):
%s

    def abort(self):
        self.kv_mgr.update_status(self.room, KVPoll.Failed)

    def clear(self):
        self.kv_mgr.request_status.pop(self.room, None)
'''
CALLS_IT = "        return check(self.room)"
KEYED_POLLS = {
    "direct": ("        return self.kv_mgr.check_status(self.room)", CALLS_IT),
    "argument": ("        return self._poll_with(self.kv_mgr.check_status)", CALLS_IT),
    "local": ("        check = self.kv_mgr.check_status\n        return check(self.room)", CALLS_IT),
    "module function": ("        return poll_through(self.kv_mgr.check_status, self.room)", CALLS_IT),
    "argument, room tested first": ("        return self._poll_with(self.kv_mgr.check_status)",
                                    "        if self.room in self.kv_mgr.request_status:\n"
                                    "            return check(self.room)\n        return KVPoll.Failed"),
}
CLEARING = STANDARD_BRANCHES.replace("            elif poll == KVPoll.Success:\n",
                                     "            elif poll == KVPoll.Success:\n                req.disagg_kv_sender.clear()\n")


@pytest.mark.parametrize("shape", list(KEYED_POLLS))
def test_a_status_read_passed_as_a_bound_method_is_followed(tmp_path: Path, shape: str) -> None:
    poll, helper = KEYED_POLLS[shape]
    tree = write(tmp_path, {"disaggregation/prefill.py": drain(CLEARING),
                            "disaggregation/net/conn.py": KEYED_SENDER % (poll, helper),
                            "disaggregation/net/mgr.py": KEYED_MANAGER})
    found = [(f.path, f.line, f.severity, f.premise) for f in scan_path(tree).findings if f.rule == "poll-raises"]
    table_read = KEYED_MANAGER.splitlines().index("        return self.request_status[room]") + 1
    if shape.endswith("room tested first"):
        assert found == []  # the absent room answers Failed before the table is read
    else:
        assert found == [("disaggregation/net/mgr.py", table_read, "warning", SHARED_ROOM)]


def test_0_5_23_tests_the_room_before_the_bound_check_status_reads_it(tmp_path: Path) -> None:
    """0.5.23 common/conn.py: poll() is `self._poll_with_status(self.kv_mgr.check_status)` (2344);
    `_poll_with_status` calls it only `if self.bootstrap_room in self.kv_mgr.request_status`
    (2353), else Failed: no KeyError (sglang#40125) from the senders' poll. The same release with
    that test taken out raises at check_status's `self.request_status[bootstrap_room]` (609)."""
    import shutil

    root = sglang_tree("0.5.23") / D
    lines = (root / "common/conn.py").read_text().splitlines()
    assert lines[2344 - 1].strip() == "return self._poll_with_status(self.kv_mgr.check_status)"
    assert lines[2353 - 1].strip() == "if self.bootstrap_room in self.kv_mgr.request_status:"
    assert lines[609 - 1].strip() == "return self.request_status[bootstrap_room]"
    assert not [f for f in scan_path(root).findings if f.rule == "poll-raises"]

    mutated = tmp_path / "disaggregation"
    shutil.copytree(root, mutated)
    guarded = "\n".join(lines[2352:2356]) + "\n"
    assert guarded.splitlines()[-1].strip() == "status = KVPoll.Failed"
    text = (mutated / "common/conn.py").read_text()
    (mutated / "common/conn.py").write_text(text.replace(guarded, "        status = check_status(self.bootstrap_room)\n"
                                                         "        pass\n        pass\n        pass\n"))
    found = {(f.backend, f.path, f.line, f.premise) for f in scan_path(mutated).findings if f.rule == "poll-raises"}
    assert found == {(b, "common/conn.py", 609, SHARED_ROOM) for b in ("ascend", "mooncake", "mori")}


def test_release_map_sites_of_one_mode_say_which(tmp_path: Path) -> None:
    """The PP branch's sites (its keep, its assert) are reached only when rids_to_check is
    passed; the standard chain's keep only when it is not (the assert ends the lagging states
    first): each row says so in text, markdown and JSON. Sites every mode reaches say nothing."""
    import io

    from rich.console import Console

    from kvtrace.report.markdown import render as render_markdown
    from kvtrace.report.text import render as render_text

    tree = pp_tree(tmp_path, caller=True)
    report = scan_path(tree)
    lines = (tree / "disaggregation" / "prefill.py").read_text().splitlines()
    assert_line = next(i for i, t in enumerate(lines, 1) if t.strip().startswith("assert poll =="))
    pp_keep = next(i for i, t in enumerate(lines, 1) if t.strip() == "if req.rid not in rids_to_check:") + 1
    normal_keep = next(i for i, t in enumerate(lines, 1) if t.strip().startswith("if poll in [KVPoll.WaitingForInput")) + 1
    success_check = normal_keep + 1
    by_key = {(s.kind, s.line): s.mode for s in report.queues[0].sites}
    assert by_key[("raise", assert_line)] == "rids_to_check passed"
    assert by_key[("keep", pp_keep)] == "rids_to_check passed"
    assert by_key[("keep", normal_keep)] == "rids_to_check=None"
    assert by_key[("check", success_check)] == ""  # Success passes the assert: both modes reach it

    rows = {(s["kind"], s["line"]): s.get("mode") for s in to_json_dict(report)["queues"][0]["sites"]}
    assert rows[("raise", assert_line)] == "rids_to_check passed" and rows[("check", success_check)] is None
    buffer = io.StringIO()
    render_text(report, Console(file=buffer, width=200, force_terminal=False, color_system=None, highlight=False))
    [text_row] = [r for r in buffer.getvalue().splitlines() if r.strip().startswith("raise")
                  and f"prefill.py:{assert_line}" in r]
    assert text_row.rstrip().endswith("(only when rids_to_check passed)")
    markdown = render_markdown([report], detail="full")
    [md_row] = [r for r in markdown.splitlines() if r.startswith("| raise |") and f"prefill.py:{assert_line}" in r]
    assert "(only when rids\\_to\\_check passed)" in md_row or "(only when rids_to_check passed)" in md_row
    # One mode only (no PP caller, whole tree): no row is marked.
    plain = scan_path(pp_tree(tmp_path / "plain", caller=False))
    assert not any(s.mode for s in plain.queues[0].sites)


POLLED_IN_A_HELPER = '''
    def _poll_inflight(self):
        pollers = [r.disagg_kv_sender for r in self.disagg_prefill_inflight_queue]
        return poll_and_all_reduce(pollers, self.group)
'''


# 0.5.23's transfer queue: `return poll_and_all_reduce(self._pollers(), ...)`, and _pollers()
# returns `[dr.kv_receiver for dr in self.queue]`.
POLLERS_FROM_A_METHOD = """
    def _pollers(self):
        return [r.disagg_kv_sender for r in self.disagg_prefill_inflight_queue]

    def _poll_inflight(self):
        return poll_and_all_reduce(self._pollers(), self.group)
"""


@pytest.mark.parametrize("polled_in", ["the drain", "a helper", "a helper's pollers method"])
def test_a_drain_that_polls_through_a_helper_rests_on_the_same_premise(tmp_path: Path, polled_in: str) -> None:
    """0.5.14's transfer queue reads its poll values from `polls = self._poll_with_metadata_gate()`,
    whose poll_and_all_reduce gets `[dr.kv_receiver for dr in self.queue]`: the sender attribute
    (whose clear() only the drain calls, as the request concludes) is the helper's, and the
    absent-room KeyError rests on a shared room as when the drain polls itself. 0.5.23 builds
    that list in one more method (`self._pollers()`): the same."""
    text = drain(CLEARING, POLLERS_FROM_A_METHOD if polled_in.endswith("method") else POLLED_IN_A_HELPER)
    if polled_in != "the drain":
        direct = ("        polls = poll_and_all_reduce(\n"
                  "            [r.disagg_kv_sender for r in self.disagg_prefill_inflight_queue], self.group\n"
                  "        )\n")
        assert direct in text
        text = text.replace(direct, "        polls = self._poll_inflight()\n")
    tree = write(tmp_path, {"disaggregation/prefill.py": text,
                            "disaggregation/net/conn.py": KEYED_SENDER % KEYED_POLLS["direct"],
                            "disaggregation/net/mgr.py": KEYED_MANAGER})
    found = [(f.path, f.line, f.severity, f.premise) for f in scan_path(tree).findings if f.rule == "poll-raises"]
    table_read = KEYED_MANAGER.splitlines().index("        return self.request_status[room]") + 1
    assert found == [("disaggregation/net/mgr.py", table_read, "warning", SHARED_ROOM)]


# The bootstrap queue's shape (0.4.8 pop_bootstrapped 217-246): Bootstrapping waits, Failed
# leaves, anything else is taken as WaitingForInput: `break`-like keep while no metadata buffer
# is free, else alloc, `assert req.metadata_buffer_index is not None`, hand-over.
BUFFER_GATED = '''\
            if poll == KVPoll.Bootstrapping:
                undone_reqs.append(req)
                continue
            elif poll == KVPoll.Failed:
                release_kv_cache(req, self.tree_cache)
                prepare_abort(req, "bootstrap failed")
                done_reqs.append(req)
                continue
            if self.req_to_metadata_buffer_idx_allocator.available_size() == 0:
                undone_reqs.append(req)
                continue
            req.metadata_buffer_index = self.req_to_metadata_buffer_idx_allocator.alloc()
            assert req.metadata_buffer_index is not None
            done_reqs.append(req)'''


def test_an_assert_not_about_the_poll_value_is_no_unhandled_state_and_a_gated_catch_all_waits(tmp_path: Path) -> None:
    """An assert whose test is not about the poll value (the allocator invariant) fails, if ever,
    for every state alike: no state is unhandled there (0.4.6.post5 … 0.5.12.post1 gave false
    unhandled-state WaitingForInput/Transferring/Success at the assert). The engine stays exact:
    the assert can still raise, so the fates say so (the executing oracle agrees). Success, which
    only the catch-all meets, is kept while no buffer is free and leaves once one is: it waits."""
    tree = write(tmp_path, {"disaggregation/prefill.py": drain(BUFFER_GATED)})
    report = scan_path(tree)
    assert not [(f.state, f.line) for f in report.findings if f.rule in ("unhandled-state", "state-crash")]
    fates = report.queues[0].states
    assert [str(o) for o in fates["Success"].fate] == ["kept", "leaves", "raises"]
    # An assert kvtrace can tie to the poll value still decides: the same chain asserting on it crashes.
    on_poll = BUFFER_GATED.replace("assert req.metadata_buffer_index is not None",
                                   "assert poll == KVPoll.WaitingForInput")
    crashing = scan_path(write(tmp_path / "on-poll", {"disaggregation/prefill.py": drain(on_poll)}))
    assert {f.state for f in crashing.findings if f.rule == "unhandled-state"} >= {"Transferring", "Success"}


# A catch-all that lets a terminal state out only when a PP caller passes rids_to_check: in
# the default mode (the other caller) it keeps it for ever.
LEFT_ONLY_IN_PP = '''\
            if poll in [KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring]:
                undone_reqs.append(req)
            elif poll == KVPoll.Failed:
                release_kv_cache(req, self.tree_cache)
                prepare_abort(req, "transfer failed")
                done_reqs.append(req)
            elif rids_to_check is not None:
                release_kv_cache(req, self.tree_cache)
                done_reqs.append(req)
            else:
                undone_reqs.append(req)'''
BOTH_CALLERS = '''
    def event_loop(self):
        self.drain_inflight()

    def event_loop_pp(self, finished_upstream):
        self.drain_inflight(rids_to_check=finished_upstream)
'''


def test_a_terminal_state_let_out_only_in_another_mode_is_pinned(tmp_path: Path) -> None:
    """Success leaves through the catch-all only in the PP mode; a request of the default mode
    never runs that path, so there it is kept for ever: the way out of another mode is no wait."""
    text = drain(LEFT_ONLY_IN_PP, BOTH_CALLERS).replace("def drain_inflight(self):",
                                                        "def drain_inflight(self, rids_to_check=None):")
    report = scan_path(write(tmp_path, {"disaggregation/prefill.py": text}))
    kept = [f for f in report.findings if f.rule == "unhandled-state" and f.state == "Success"]
    keep_line = text.splitlines().index("                undone_reqs.append(req)", text.splitlines().index(
        "            else:")) + 1
    assert [(f.line, "queue for ever" in f.message) for f in kept] == [(keep_line, True)]


def test_0_5_23_transfer_queue_names_the_receiver_it_polls_through_a_pollers_method() -> None:
    """0.5.23 pop_transferred (decode.py 2833) polls through `self._poll_with_staging()` (2847) or
    `self._poll_with_metadata_gate()` (2849), both passing `self._pollers()` (2779), which
    returns `[dr.kv_receiver for dr in self.queue]` (2782): the request's receiver attribute,
    whose clear() only the drains call as a request concludes, is what the shared-room premise
    of the absent-room KeyError needs. Read from the drain alone (the decode scan of 0.5.23 is
    too slow for a unit test)."""
    from types import SimpleNamespace

    from kvtrace import pipeline
    from kvtrace.fetch.local import fetch_local
    from kvtrace.graph import find_drains, held_queue
    from kvtrace.packs import load_pack
    from kvtrace.rules.send_flow import polled_attributes

    pack = load_pack("sglang-decode").for_queue("disagg_decode_transfer_queue")
    target = sglang_tree("0.5.23") / "sglang" / "srt"
    index = pipeline.index(pipeline.parse(fetch_local(target), pack, None), pack, str(target)).index
    assert not find_drains(index, pack)  # the queue is an object that drains itself
    held = held_queue(index, pack)
    assert held is not None
    cls, attr = held.cls, held.attr
    list_pack = pack.for_queue(attr)
    [drain] = find_drains(index, list_pack, [m for c in index.mro(cls) for m in c.methods.values()])
    assert (drain.func.qualname, drain.poll_line) == ("DecodeTransferQueue.pop_transferred", None)
    lines = (target / "disaggregation" / "decode.py").read_text().splitlines()
    assert lines[2782 - 1].strip() == "return [dr.kv_receiver for dr in self.queue]"
    context = SimpleNamespace(queue=SimpleNamespace(drain=drain), pack=list_pack, index=index)
    assert polled_attributes(context) == {"kv_receiver"}  # type: ignore[arg-type]


# 0.5.23's transfer queue: a failed request the drain cannot free yet goes to `_deferred_releases`
# (decode.py 2966 -> `_defer_release` 3008), and `resolve_deferred_releases` (3046), run by the
# scheduler outside the drain, clears its receiver later (`_do_release` 3028).
DEFERRING = CLEARING.replace('''                prepare_abort(req, "transfer failed")
                done_reqs.append(req)''', '''                prepare_abort(req, "transfer failed")
                self._defer(req)''')
DEFERRED_RELEASE = '''
    def _defer(self, req):
        self.deferred_releases.append(req)

    def resolve_deferred_releases(self):
        still_held = []
        for req in self.deferred_releases:
            if req.ready:
                self._release(req)
            else:
                still_held.append(req)
        self.deferred_releases = still_held

    def _release(self, req):
        req.disagg_kv_sender.clear()
'''
# 0.5.19 … 0.5.22 hold (request, deadline, ...) tuples and keep the unexpired ones packed again.
DEFERRED_AS_TUPLES = DEFERRED_RELEASE.replace("self.deferred_releases.append(req)",
                                              "self.deferred_releases.append((req, 30))").replace(
    """        for req in self.deferred_releases:
            if req.ready:
                self._release(req)
            else:
                still_held.append(req)""", """        for req, deadline in self.deferred_releases:
            if req.ready:
                self._release(req)
            else:
                still_held.append((req, deadline))""")
assert "still_held.append((req, deadline))" in DEFERRED_AS_TUPLES
# What makes the later clear() possibly this queued request's: the held list is also filled
# outside the drain, or the releasing method takes its requests from the queue itself.
NOT_HANDED_OVER = {
    "filled outside the drain": DEFERRED_RELEASE + '''
    def hold(self, req):
        self.deferred_releases.append(req)
''',
    "reads the queue": DEFERRED_RELEASE.replace("for req in self.deferred_releases:",
                                                "for req in self.deferred_releases + self.disagg_prefill_inflight_queue:"),
}


@pytest.mark.parametrize("shape", ["handed over", "handed over as tuples", *NOT_HANDED_OVER])
def test_a_clear_on_requests_the_drain_handed_over_rests_on_a_shared_room(tmp_path: Path, shape: str) -> None:
    """A clear() outside the drain, on requests the drain alone put in a list of its own object
    after taking them out of the queue (a deferred release), takes out a room that is no queued
    request's unless two share it: the KeyError rests on a shared room, and the chain names that
    call. If something else fills the list, or the releasing method reads the queue, it is an error."""
    methods = {"handed over": DEFERRED_RELEASE, "handed over as tuples": DEFERRED_AS_TUPLES, **NOT_HANDED_OVER}[shape]
    tree = write(tmp_path, {"disaggregation/prefill.py": drain(DEFERRING, methods),
                            "disaggregation/net/conn.py": KEYED_SENDER % KEYED_POLLS["direct"],
                            "disaggregation/net/mgr.py": KEYED_MANAGER})
    found = [f for f in scan_path(tree).findings if f.rule == "poll-raises"]
    table_read = KEYED_MANAGER.splitlines().index("        return self.request_status[room]") + 1
    assert [(f.path, f.line) for f in found] == [("disaggregation/net/mgr.py", table_read)]
    [finding] = found
    if not shape.startswith("handed over"):
        assert (finding.severity, finding.premise) == ("error", None)
        return
    assert (finding.severity, finding.premise) == ("warning", SHARED_ROOM)
    lines = (tree / "disaggregation/prefill.py").read_text().splitlines()
    later_clear = next(i for i, t in enumerate(lines, 1) if t.strip() == "req.disagg_kv_sender.clear()"
                       and lines[i - 2].strip() == "def _release(self, req):")
    notes = {e.line: e.note for e in finding.evidence if e.path == "disaggregation/prefill.py"}
    assert "self.deferred_releases" in notes[later_clear], notes


# The drain reaches the clear() only through a chain of its own methods (`self.a()` -> super()
# -> a module function given the object -> `Base.m(self)`): the closure reads them from the code.
CHAINED = '''\
from .base.conn import KVPoll


def conclude(obj, req):
    obj.finish(req)


class Base:
    def finish(self, req):
        Helpers.really_finish(self, req)


class Helpers:
    def really_finish(self, req):
        req.sender.clear()

    def unrelated(self, req):
        req.sender.clear()


class Queue(Base):
    def drain(self):
        for req in self.queue:
            self.step(req)

    def step(self, req):
        self.later(req)

    def later(self, req):
        callback = self.last
        callback(req)

    def last(self, req):
        conclude(self, req)

    def finish(self, req):
        super().finish(req)

    def never_called(self, req):
        req.sender.clear()
'''


def test_the_drains_helpers_are_the_static_closure_of_its_own_calls(tmp_path: Path) -> None:
    """`self.m()`, `self.m` handed on as a value, a module function by bare name, an inherited
    method, `Base.m(self)`: every function the drain may run on its object, read from the code
    (the explored paths stop short at the path limit, 0.5.23's decode drains). A method nothing
    calls is not in it."""
    from kvtrace.fetch.local import fetch_local
    from kvtrace.index import Index
    from kvtrace.parse import parse_modules
    from kvtrace.rules.premise import self_call_closure

    (tmp_path / "q.py").write_text(CHAINED)
    index = Index(parse_modules(fetch_local(tmp_path).files).modules)
    [queue] = index.classes["Queue"]
    closure = self_call_closure(index, [queue.methods["drain"]], queue)
    assert {f.qualname for f in closure} == {"Queue.drain", "Queue.step", "Queue.later", "Queue.last", "conclude",
                                              "Queue.finish", "Base.finish",
                                              "Helpers.really_finish"}


def test_0_5_23_every_receiver_clear_is_a_drains_or_on_a_request_it_handed_over() -> None:
    """0.5.23's decode KeyError (common/conn.py 609, `self.request_status[bootstrap_room]`) rests on
    a shared room only if nothing takes a queued request's room out: every `kv_receiver.clear()`
    (decode.py 1401, 1601, 2651, 2670, 2774, 2925, 2970, 3028) is in the drains' static closure
    (pop_preallocated, pop_transferred -> _commit_transfer_to_req) or, for `_do_release` (3028,
    run by resolve_deferred_releases 3046 from the scheduler loop), on requests that only the
    transfer drain put in `self._deferred_releases` (`_defer_release` 3008) after taking them out
    of its queue. The explored paths stop at the path limit there, so the closure is read from the
    code. (The decode scan of 0.5.23 is too slow for a unit test: the drains are read alone.)"""
    from types import SimpleNamespace

    from kvtrace import pipeline
    from kvtrace.fetch.local import fetch_local
    from kvtrace.graph import find_drains, held_queue
    from kvtrace.packs import load_pack
    from kvtrace.rules.premise import _drain_functions, _handed_over

    target = sglang_tree("0.5.23") / "sglang" / "srt"
    lines = (target / "disaggregation" / "decode.py").read_text().splitlines()
    base = load_pack("sglang-decode")
    first = base.for_queue("disagg_decode_prealloc_queue")
    index = pipeline.index(pipeline.parse(fetch_local(target), first, None), first, str(target)).index
    queues = []
    for name in ("disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"):
        held = held_queue(index, base.for_queue(name))
        assert held is not None
        cls, attr = held.cls, held.attr
        list_pack = base.for_queue(name).for_queue(attr)
        [drain] = find_drains(index, list_pack, [m for c in index.mro(cls) for m in c.methods.values()])
        queues.append((list_pack, SimpleNamespace(drain=drain)))
    clears = {(caller.qualname, call.lineno) for caller, call in index.callers("clear")
              if _last_attr_is(call.func, "kv_receiver")}
    assert {line for _, line in clears} == {1401, 1601, 2651, 2670, 2774, 2925, 2970, 3028}
    assert all(lines[line - 1].strip() == "decode_req.kv_receiver.clear()" for _, line in clears)
    for at, (list_pack, queue) in enumerate(queues):
        others = [q for other, (_, q) in enumerate(queues) if other != at]
        context = SimpleNamespace(queue=queue, others=others, pack=list_pack, index=index)
        drains = _drain_functions(context)
        outside = {(name, line) for name, line in clears if name not in drains}
        assert outside == {("DecodeTransferQueue._do_release", 3028)}
        [do_release] = [f for f in index.all_functions() if f.qualname == "DecodeTransferQueue._do_release"]
        assert _handed_over(context, do_release, drains) == "self._deferred_releases"


def _last_attr_is(func, attr: str) -> bool:
    import ast

    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and func.value.attr == attr


# 0.5.22 … 0.5.23 CommonKVReceiver.__init__: a receiver for a room already in the table does not
# own it and returns before storing it (`_owns_bootstrap_room = not (mgr.defer_decode_allocation and
# bootstrap_room in mgr.request_status)`), testing the table through the constructor's `mgr`.
NOT_OWNED_RETURNS = KEYED_SENDER.replace(
    "        self.kv_mgr.update_status(room, KVPoll.Bootstrapping)\n",
    "        if room in mgr.request_status:\n            return\n"
    "        self.kv_mgr.update_status(room, KVPoll.Bootstrapping)\n", 1)
# 0.5.23: the room is popped in `_clear()`, which the drains reach through `clear()`.
CLEARED_THROUGH = KEYED_SENDER.replace(
    "    def clear(self):\n        self.kv_mgr.request_status.pop(self.room, None)\n",
    "    def clear(self):\n        self._clear()\n\n    def _clear(self):\n"
    "        self.kv_mgr.request_status.pop(self.room, None)\n")
FLUSHES_THE_QUEUE = '''
    def flush_all(self):
        for req in self.disagg_prefill_inflight_queue:
            req.disagg_kv_sender.clear()
'''


def test_a_constructor_that_tests_the_table_through_its_manager_argument_stores_the_room(tmp_path: Path) -> None:
    """A constructor that returns early only when the room is already in the table (`room in
    mgr.request_status`, `mgr` being what it stores in `self.kv_mgr`) stores the room on every path
    from a table without it: the room is never missing from birth, and the absent-room KeyError
    rests on a shared room (0.5.22 … 0.5.23 gave six decode errors with "can return without
    storing the room")."""
    tree = write(tmp_path, {"disaggregation/prefill.py": drain(CLEARING),
                            "disaggregation/net/conn.py": NOT_OWNED_RETURNS % KEYED_POLLS["direct"],
                            "disaggregation/net/mgr.py": KEYED_MANAGER})
    found = [(f.path, f.line, f.severity, f.premise) for f in scan_path(tree).findings if f.rule == "poll-raises"]
    table_read = KEYED_MANAGER.splitlines().index("        return self.request_status[room]") + 1
    assert found == [("disaggregation/net/mgr.py", table_read, "warning", SHARED_ROOM)]


def test_known_miss_a_pop_reached_through_clear_is_not_followed_to_its_callers(tmp_path: Path) -> None:
    """A kvtrace miss, kept as such. The room is popped in `_clear()`, which `clear()` calls
    (0.5.23 CommonKVReceiver): the premise looks only for calls of `_clear` on a request's sender
    and finds none, so a `clear()` on queued requests outside the drain (a flush over the queue,
    which may be this request's) goes unseen and the KeyError is called a shared-room warning.
    Following every sender method that reaches the pop is not enough either: mori's `abort()`
    calls `self.clear()` (0.5.9 … 0.5.22) on the request being aborted, whose poll then answers
    its own conclusion; telling the two apart needs what poll() reads after that method. When
    that is done this fails: expect ("error", None)."""
    tree = write(tmp_path, {"disaggregation/prefill.py": drain(CLEARING, FLUSHES_THE_QUEUE),
                            "disaggregation/net/conn.py": CLEARED_THROUGH % KEYED_POLLS["direct"],
                            "disaggregation/net/mgr.py": KEYED_MANAGER})
    found = [(f.severity, f.premise) for f in scan_path(tree).findings if f.rule == "poll-raises"]
    assert found == [("warning", SHARED_ROOM)]


# A manager whose status thread stores what a peer sends over a socket, and the send that builds
# that message (both sides run the same backend module: prefill and decode run one release).
WIRE = '''
    def status_thread(self):
        while True:
            (room, status) = self.server_socket.recv_multipart()
            status = int(status.decode("ascii"))
            room = int(room.decode("ascii"))
            self.update_status(room, status)

    def notify(self, remote, room, status):
        self._connect(remote).send_multipart([str(room).encode("ascii"), str(status).encode("ascii")])

    def transfer_done(self, remote, room, ok):
        self.notify(remote, room, KVPoll.Success if ok else KVPoll.Failed)
'''


def _net_manager(tmp_path: Path, extra: str, files: dict[str, str] | None = None):
    report = scan_path(write(tmp_path, {"disaggregation/prefill.py": drain(RAISING),
                                        "disaggregation/net/conn.py": SENDER,
                                        "disaggregation/net/mgr.py": MANAGER.replace("{extra}", extra), **(files or {})}))
    net = next(b for b in report.backends if b.name == "net")
    assert net.manager is not None
    return net


def test_a_value_received_from_a_socket_is_what_the_sends_put_there(tmp_path: Path) -> None:
    """`int(status.decode())` of a received part is the member the send put in that part
    (`str(status).encode()` of its caller's KVPoll.Success or Failed): read, not unknown."""
    net = _net_manager(tmp_path, WIRE)
    assert net.manager.unknown == () and net.returns_unknown == []
    assert "Transferring" not in net.manager.holds
    # The runs that settle the table read the message the same way (kvtrace.flow `wire`): the
    # status thread stores Success or Failed, so only the constructor stores Bootstrapping and the
    # crash on it rests on a shared room, as without that thread.
    assert "Bootstrapping" in net.constructor_only


def test_the_runs_of_the_table_read_a_received_message_as_the_store_reading_does(tmp_path: Path) -> None:
    report = scan_path(write(tmp_path, {"disaggregation/prefill.py": drain(RAISING),
                                        "disaggregation/net/conn.py": SENDER,
                                        "disaggregation/net/mgr.py": MANAGER.replace("{extra}", WIRE)}))
    [finding] = crash(report, "Bootstrapping")
    assert (finding.severity, finding.premise) == ("warning", SHARED_ROOM)
    # A status thread that stores a part no send bounds (a message built elsewhere) makes it an error.
    built = WIRE + '''
    def forward(self, remote, parts):
        self._connect(remote).send_multipart(parts)
'''
    other = tmp_path / "other"
    report = scan_path(write(other, {"disaggregation/prefill.py": drain(RAISING),
                                     "disaggregation/net/conn.py": SENDER,
                                     "disaggregation/net/mgr.py": MANAGER.replace("{extra}", built)}))
    [finding] = crash(report, "Bootstrapping")
    assert (finding.severity, finding.premise) == ("error", None)


def test_a_send_of_another_member_in_the_module_is_what_it_receives(tmp_path: Path) -> None:
    net = _net_manager(tmp_path, WIRE.replace("KVPoll.Success if ok", "KVPoll.Transferring if ok"))
    assert net.manager.unknown == () and "Transferring" in net.manager.holds


def test_a_message_not_built_in_place_is_a_value_not_read(tmp_path: Path) -> None:
    # One send's message is a variable: which part holds what is not read, so nothing is assumed.
    built = WIRE + '''
    def forward(self, remote, parts):
        self._connect(remote).send_multipart(parts)
'''
    net = _net_manager(tmp_path, built)
    line = (tmp_path / "disaggregation/net/mgr.py").read_text().splitlines().index(
        "            self.update_status(room, status)") + 1
    assert net.manager.unknown == (f"disaggregation/net/mgr.py:{line} NetKVManager.status_thread() stores "
                                   "int(status.decode('ascii'))",), net.manager.unknown
    assert any("stores a value kvtrace cannot read" in u for u in net.returns_unknown)


def test_sends_of_another_module_are_not_this_backends_messages(tmp_path: Path) -> None:
    # An events publisher elsewhere sends two-part messages too: not to this backend's socket.
    events = '''\
from .base.conn import KVPoll


class Publisher:
    def publish(self):
        self.pub.send_multipart([b"topic", str(KVPoll.Transferring).encode("ascii")])
'''
    net = _net_manager(tmp_path, WIRE, {"disaggregation/kv_events.py": events})
    assert net.manager.unknown == () and "Transferring" not in net.manager.holds


# A status table whose entry only rises once the room is in it (max of the entry and the new
# status) and which nothing clears: once poll() read WaitingForInput there, Bootstrapping (lower)
# can never be read again, whoever stores, a second sender for the room included.
MONOTONE_TABLE = TABLE_METHODS.replace(
    "        elif status == KVPoll.Failed:\n            self.request_status[room] = KVPoll.Failed\n"
    "        else:\n", "        else:\n")  # TABLE_METHODS without its store of Failed as is
assert "KVPoll.Failed" not in MONOTONE_TABLE


def _monotone_net(tmp_path: Path, table: str, extra: str = "") -> object:
    manager = MANAGER.replace(TABLE_METHODS, table).replace("{extra}", extra)
    report = scan_path(write(tmp_path, {"disaggregation/prefill.py": drain(STANDARD_BRANCHES),
                                        "disaggregation/net/conn.py": SENDER,
                                        "disaggregation/net/mgr.py": manager}))
    return next(b for b in report.backends if b.name == "net")


@pytest.mark.parametrize(("name", "table", "extra", "never_again"), [
    ("max-only, never cleared", MONOTONE_TABLE, "", True),
    # The room popped: a store into an absent room can put Bootstrapping there again.
    ("cleared", MONOTONE_TABLE, "\n    def clear(self, room):\n        self.request_status.pop(room)\n", False),
    # A plain store of Failed (0) by another thread: a later max() can climb back to Bootstrapping.
    ("Failed stored as is", MONOTONE_TABLE,
     "\n    def fail(self, room):\n        self.request_status[room] = KVPoll.Failed\n", False),
    # A store of a value kvtrace cannot read, outside the update method: nothing is bounded.
    ("an unread store", MONOTONE_TABLE,
     "\n    def restore(self, room, saved):\n        self.request_status[room] = saved.status\n", False),
    # The other arm of `if room in table`: still only into an absent room.
    ("in-test's else", MONOTONE_TABLE.replace(
        "        if room not in self.request_status:\n            self.request_status[room] = status\n"
        "        else:\n            self.request_status[room] = max(self.request_status[room], status)\n",
        "        if room in self.request_status:\n            self.request_status[room] = max(self.request_status[room], status)\n"
        "        else:\n            self.request_status[room] = status\n"), "", True),
    # The table changed where the store reading does not look: nothing is bounded.
    ("popped by a module function", MONOTONE_TABLE,
     "\n\ndef drop(mgr, room):\n    mgr.request_status.pop(room, None)\n", False),
    ("cleared whole", MONOTONE_TABLE, "\n    def reset(self):\n        self.request_status.clear()\n", False),
    ("handed to a call", MONOTONE_TABLE, "\n    def save(self):\n        persist(self.request_status)\n", False),
    # Another class's own table of the same name is not this one.
    ("another object's table", MONOTONE_TABLE,
     "\n\nclass Ledger:\n    def __init__(self):\n        self.request_status = {}\n\n"
     "    def forget(self, room):\n        self.request_status.pop(room)\n", True),
    # max() of the entry or, for an absent room, of the new status: the same.
    ("max of get", MONOTONE_TABLE.replace(
        "        if room not in self.request_status:\n            self.request_status[room] = status\n"
        "        else:\n            self.request_status[room] = max(self.request_status[room], status)\n",
        "        self.request_status[room] = max(self.request_status.get(room, status), status)\n"), "", True),
    ("max of get, cleared", MONOTONE_TABLE.replace(
        "        if room not in self.request_status:\n            self.request_status[room] = status\n"
        "        else:\n            self.request_status[room] = max(self.request_status[room], status)\n",
        "        self.request_status[room] = max(self.request_status.get(room, status), status)\n"),
     "\n    def clear(self, room):\n        del self.request_status[room]\n", False),
])
def test_a_table_that_only_rises_never_answers_a_lower_state_again(tmp_path: Path, name: str, table: str, extra: str,
                                                                  never_again: bool) -> None:
    """Between two polls the table is what any thread can make of it; when every store into it
    is read (a max() of the entry, a store into an absent room, a plain store), the entry can
    only move to what those stores allow from what poll() read (kvtrace.managers.TableMoves)."""
    net = _monotone_net(tmp_path, table, extra)
    assert net.verdicts["Bootstrapping"].pinned, name  # abort()'s Failed is lost in max(): a pin to judge
    assert ("WaitingForInput" in net.past.get("Bootstrapping", {})) is never_again, (name, net.past)


def test_table_moves_rise_from_the_lowest_state_reached() -> None:
    from kvtrace.managers import TableMoves
    from kvtrace.states import ABSENT

    order = (("Failed", 0), ("Bootstrapping", 1), ("WaitingForInput", 2), ("Transferring", 3), ("Success", 4))
    rising = TableMoves(order, raises=True, set_to=frozenset(), refill=frozenset({"Bootstrapping"}), refill_read=True,
                        clears=False)
    assert rising.after(frozenset({"WaitingForInput"})) == {"WaitingForInput", "Transferring", "Success"}
    assert rising.after(frozenset({ABSENT})) == {ABSENT, "Bootstrapping", "WaitingForInput", "Transferring", "Success"}
    failed = TableMoves(order, raises=True, set_to=frozenset({"Failed"}), refill=frozenset(), refill_read=True, clears=False)
    assert failed.after(frozenset({"Success"})) == {m for m, _ in order}
    cleared = TableMoves(order, raises=False, set_to=frozenset(), refill=frozenset({"Bootstrapping"}), refill_read=True,
                         clears=True)
    assert cleared.after(frozenset({"Success"})) == {"Success", "Bootstrapping", ABSENT}
    unread = TableMoves(order, raises=False, set_to=frozenset(), refill=frozenset(), refill_read=False, clears=True)
    assert unread.after(frozenset({"Success"})) is None


@pytest.mark.parametrize(("version", "pack"), [("0.5.9", "sglang-prefill"), ("0.5.23", "sglang-decode")])
def test_the_shared_room_premise_is_cited_at_the_loop_that_polls_the_queued_request(version: str, pack: str) -> None:
    """"While the request is queued, only another request's sender (receiver) for the same room
    takes the room out" is said of the loop over the queue that polls it: the line cited opens
    that `for`, the drain loop the finding also cites, not the `def` of its function."""
    from kvtrace.packs import load_pack

    root = sglang_tree(version) / "sglang" / "srt"
    report = scan_path(root, load_pack(pack))
    cited = [(f, e) for f in report.findings for e in f.evidence
             if e.note.startswith("premise: while the request is queued, only another request's")]
    assert cited, "the release has shared-room premises"
    for finding, evidence in cited:
        source = (root / evidence.path).read_text().splitlines()[evidence.line - 1]
        assert source.lstrip().startswith("for "), (evidence.path, evidence.line, source)
        loops = [e.line for e in finding.evidence if e.note.startswith("drain loop in ")]
        assert evidence.line in loops, (finding.rule, finding.queue, evidence.line, loops)
