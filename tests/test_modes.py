"""Modes of the drain (its defaulted parameters, bound as the callers in the tree bind them), waits,
pins and crashes per mode, and one decision per path for a repeated side-effect-free comparison.
Every expectation is worked out by hand from the small trees below."""

from __future__ import annotations

import json
from pathlib import Path
import pytest

from kvtrace.report import render_plain
from kvtrace.report.json import to_json_dict
from kvtrace.rules.samples import SCHEDULER, SHARED_FILES
from kvtrace.scan import scan_path

DRAIN = '''\
from .base.conn import KVPoll
from .utils import poll_and_all_reduce, prepare_abort, release_kv_cache


class PrefillMixin:
    def finish_batch(self, batch):
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)

    def drain_inflight(self, rids_to_check=None):
        polls = poll_and_all_reduce([r.disagg_kv_sender for r in self.disagg_prefill_inflight_queue], self.group)
        undone_reqs = []
        done_reqs = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):
            if rids_to_check is not None and req.rid not in rids_to_check:
                undone_reqs.append(req)
                continue
            if poll in (KVPoll.WaitingForInput, KVPoll.Transferring):
                undone_reqs.append(req)
            elif poll == KVPoll.Success:
                release_kv_cache(req, self.tree_cache)
                done_reqs.append(req)
            elif poll == KVPoll.Failed:
                release_kv_cache(req, self.tree_cache)
                prepare_abort(req, "failed")
                done_reqs.append(req)
            elif rids_to_check is not None:
                undone_reqs.append(req)
            else:
                raise RuntimeError("unexpected poll state")
        self.disagg_prefill_inflight_queue = undone_reqs
        return done_reqs
'''
GUARD_LINE = 15  # `if rids_to_check is not None and req.rid not in rids_to_check:`
RAISE_LINE = 30
CALLERS = '''
    def event_loop(self):
        self.drain_inflight()

    def event_loop_pp(self, upstream):
        self.drain_inflight(upstream)

    def event_loop_pp_kw(self, upstream):
        self.drain_inflight(rids_to_check=upstream)
'''
# poll() answers the manager's status unread by abort(): every state it returns is pinned.
STUCK_SENDER = '''\
from ..base.conn import BaseKVSender, KVPoll


class StuckKVSender(BaseKVSender):
    def __init__(self, mgr, room):
        self.mgr = mgr
        self.room = room
        self.conclude_state = None

    def poll(self) -> KVPoll:
        return self.mgr.status(self.room)

    def abort(self):
        self.conclude_state = KVPoll.Failed
'''


def write(root: Path, prefill: str, sender: str | None = None, scheduler: bool = True) -> Path:
    """The tree; `scheduler`: managers/scheduler.py composes the mixin, so every caller is in view."""
    files = dict(SHARED_FILES)
    if scheduler:
        files["managers/scheduler.py"] = SCHEDULER
    files["disaggregation/prefill.py"] = prefill
    if sender is not None:
        files["disaggregation/stuck/conn.py"] = sender
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def mode_fates(report) -> dict[str, dict[str, tuple[list[str], list[int]]]]:
    out: dict[str, dict[str, tuple[list[str], list[int]]]] = {}
    for state, fate in report.queues[0].states.items():
        for m in fate.modes:
            out.setdefault(m.mode, {})[state] = ([str(o) for o in m.then], [w.line for w in m.waits])
    return out


def test_no_caller_passes_the_parameter_so_its_branches_are_dead(tmp_path: Path) -> None:
    report = scan_path(write(tmp_path, DRAIN))
    queue = report.queues[0]
    assert [(m.label, m.passed, m.callers) for m in queue.modes] == [("rids_to_check=None", (), ())]
    # rids_to_check is None: no wait, and Bootstrapping reaches the raise.
    assert mode_fates(report) == {"rids_to_check=None": {
        "Failed": (["leaves"], []), "Bootstrapping": (["raises"], []), "WaitingForInput": (["kept"], []),
        "Transferring": (["kept"], []), "Success": (["leaves"], [])}}
    assert {s: [str(o) for o in f.fate] for s, f in queue.states.items()}["Success"] == ["leaves"]


def test_with_no_class_in_view_composing_the_mixin_the_parameter_is_free(tmp_path: Path) -> None:
    """The same tree without managers/scheduler.py: the object is assembled out of view, where
    another base may pass rids_to_check; its branches are analysed as passed and the scan says
    what it could not see. Before, a tree holding disaggregation/ inside another folder was read
    as if the scheduler were in view."""
    from kvtrace.model import ProblemKind

    report = scan_path(write(tmp_path, DRAIN, scheduler=False))
    assert [m.label for m in report.queues[0].modes] == ["rids_to_check=None", "rids_to_check passed (no caller in view)"]
    assert any(p.kind is ProblemKind.OUT_OF_VIEW and "drain_inflight" in p.text for p in report.problems)
    assert report.incomplete


def test_callers_that_differ_give_one_mode_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = scan_path(write(tmp_path, DRAIN + CALLERS, STUCK_SENDER))
    queue = report.queues[0]
    # The positional and the keyword caller bind alike: one mode.
    assert [(m.label, m.passed, [c.line for c in m.callers]) for m in queue.modes] == [
        ("rids_to_check=None", (), [35]), ("rids_to_check passed", ("rids_to_check",), [38, 41])]
    assert mode_fates(report) == {
        "rids_to_check=None": {
            "Failed": (["leaves"], []), "Bootstrapping": (["raises"], []), "WaitingForInput": (["kept"], []),
            "Transferring": (["kept"], []), "Success": (["leaves"], [])},
        # Every state first waits for its rid at the guard; then Bootstrapping is kept by the
        # `elif rids_to_check is not None` branch instead of raising.
        "rids_to_check passed": {
            state: (fate, [GUARD_LINE]) for state, fate in {
                "Failed": ["leaves"], "Bootstrapping": ["kept"], "WaitingForInput": ["kept"],
                "Transferring": ["kept"], "Success": ["leaves"]}.items()},
    }
    findings = {(f.rule, f.backend, f.state, f.line) for f in report.findings if f.rule in ("pinned-state", "state-crash")}
    # Bootstrapping: a crash when rids_to_check is None, a pin (with this sender) when it is
    # passed; W/T are pinned in both modes.
    assert ("state-crash", None, "Bootstrapping", RAISE_LINE) in findings
    pins = [f for f in report.findings if f.rule == "pinned-state"]
    assert {(f.state) for f in pins} == {"Bootstrapping", "WaitingForInput", "Transferring"}
    bootstrapping = next(f for f in pins if f.state == "Bootstrapping")
    assert "when rids_to_check passed, the drain loop keeps it" in bootstrapping.message
    waiting = next(f for f in pins if f.state == "WaitingForInput")
    assert "in every mode of the drain" in waiting.message

    monkeypatch.chdir(report.target)  # the text shows paths from the working directory: here, the report's own
    text = render_plain([report])
    assert f"modes: rids_to_check=None (called so at disaggregation/prefill.py:35)" in text
    assert ("rids_to_check passed: waits while rids_to_check is not None and req.rid not in rids_to_check "
            f"(disaggregation/prefill.py:{GUARD_LINE}), then leaves") in text

    data = json.loads(json.dumps(to_json_dict(report)))
    states = data["reports"][0]["queues"][0]["states"] if "reports" in data else data["queues"][0]["states"]
    success = states["Success"]["modes"]
    assert [(m["mode"], m["fate"], m["then"], [w["line"] for w in m["waits"]]) for m in success] == [
        ("rids_to_check=None", ["leaves"], ["leaves"], []),
        ("rids_to_check passed", ["kept", "leaves"], ["leaves"], [GUARD_LINE])]


def test_a_repeated_comparison_is_decided_once_per_path(tmp_path: Path) -> None:
    # `req.rid in rids_to_check` after `req.rid not in rids_to_check` kept what was not in it:
    # the request always is in it there, so it leaves; `req.mode != "x"` after `req.mode ==
    # "x" and ...` is false exactly when the first test's left side held.
    prefill = DRAIN.replace('''            if poll in (KVPoll.WaitingForInput, KVPoll.Transferring):''', '''\
            if rids_to_check is not None and req.rid in rids_to_check:
                done_reqs.append(req)
                continue
            if req.mode == "x" and poll == KVPoll.Bootstrapping:
                undone_reqs.append(req)
                continue
            if req.mode != "x":
                done_reqs.append(req)
                continue
            if poll in (KVPoll.WaitingForInput, KVPoll.Transferring):''')
    report = scan_path(write(tmp_path, prefill + CALLERS))
    fates = mode_fates(report)
    # Passed: every rid that passes the guard is in rids_to_check, so nothing reaches the chain.
    assert {state: then for state, (then, _) in fates["rids_to_check passed"].items()} == {
        state: ["leaves"] for state in ("Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success")}
    # At the default: mode == "x" reaches the chain (Bootstrapping: kept by the flag branch).
    normal = {state: then for state, (then, _) in fates["rids_to_check=None"].items()}
    assert normal == {"Failed": ["leaves"], "Bootstrapping": ["kept", "leaves"], "WaitingForInput": ["kept", "leaves"],
                      "Transferring": ["kept", "leaves"], "Success": ["leaves"]}
