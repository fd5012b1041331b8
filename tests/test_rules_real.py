"""The link rules on released SGLang wheels from PyPI (downloaded at test time, cached outside the
repo). Each expectation was verified by reading that release's code; the evidence is written next
to it. pinned-state and dropped-state verdicts live in test_real_sglang.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace.model import Report
from kvtrace.scan import scan_path
from tests.sglang_wheels import sglang_tree

D = "sglang/srt/disaggregation"

# (rule, path, line, backend, state) per release, for the rules below. Lines are the statement
# or def where the defect is.
EXPECTED: dict[str, dict[str, set[tuple[str, str, int, str | None, str | None]]]] = {
    "0.4.6.post5": {
        # BaseKVSender (base/conn.py) declares no abort(), nor does any sender: nothing can cancel
        # a transfer, so each backend's poll() is reported at its def.
        "abort-ignored": {("abort-ignored", f"{D}/fake/conn.py", 23, "fake", None),
                          ("abort-ignored", f"{D}/mooncake/conn.py", 498, "mooncake", None),
                          ("abort-ignored", f"{D}/nixl/conn.py", 450, "nixl", None)},
        # NixlKVSender.poll(): `if any([x == "ERR" for x in states]): raise Exception(...)`
        # (line 457); prefill.py:406 calls poll_and_all_reduce outside any try.
        "poll-raises": {("poll-raises", f"{D}/nixl/conn.py", 457, "nixl", None)},
        # `if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]: undone_reqs.append(req)` (415),
        # no logger call on that branch. Bootstrapping has no branch at all (dropped-state's).
        "silent-wait": {("silent-wait", f"{D}/prefill.py", 415, None, "WaitingForInput"),
                        ("silent-wait", f"{D}/prefill.py", 415, None, "Transferring")},
        # No else, no raise in the drain loop; Failed releases (cache_finished_req) and aborts.
        "unhandled-state": set(),
        "release-leak": set(),
        # MooncakeKVManager.update_status (417): `self.request_status[room] = max(
        # self.request_status[room], status)` (422) and base/conn.py `class KVPoll: Failed = 0`.
        "failed-not-sticky": {("failed-not-sticky", f"{D}/mooncake/conn.py", 422, None, "Failed")},
        # check_status (414) is `return self.request_status[bootstrap_room]` (KeyError, no default);
        # update_status stores any status for an absent room (419).
        "absent-room-default": set(),
        "silent-status-drop": set(),
    },
    "0.5.2": {
        # fake and nixl senders define no abort(); MooncakeKVSender.abort() (mooncake/conn.py:1197)
        # sets conclude_state, which poll() (1154) reads first: mooncake and ascend are not reported.
        "abort-ignored": {("abort-ignored", f"{D}/fake/conn.py", 29, "fake", None),
                          ("abort-ignored", f"{D}/nixl/conn.py", 598, "nixl", None)},
        # NixlKVSender.poll(): `raise Exception("KVSender transfer encountered an error.")` (605).
        # MooncakeKVManager.check_status (1002): `self.request_status[bootstrap_room]`, a KeyError
        # for a room another request's clear() popped (a warning resting on a shared room,
        # sglang#40125), for mooncake and ascend (whose sender builds on mooncake's).
        "poll-raises": {("poll-raises", f"{D}/nixl/conn.py", 605, "nixl", None),
                        ("poll-raises", f"{D}/mooncake/conn.py", 1002, "mooncake", None),
                        ("poll-raises", f"{D}/mooncake/conn.py", 1002, "ascend", None)},
        # 506: the PP branch's `assert poll == KVPoll.Success or poll == KVPoll.Failed` fails for
        # the three waiting states; 532: the chain's `else: assert False, "Unexpected polling
        # state"` is where Bootstrapping lands on the normal path (scheduler crash). Bootstrapping
        # and WaitingForInput, which backends return, are state-crash's (tests/test_real_sglang.py);
        # no 0.5.2 backend returns Transferring.
        "unhandled-state": {("unhandled-state", f"{D}/prefill.py", 506, None, "Transferring")},
        # 509: the WaitingForInput/Transferring keep, nothing logged. Bootstrapping is kept only by
        # the PP branch (503, `if req.rid not in rids_to_check: undone_reqs.append(req)`), which
        # tests no poll value and holds every state alike until the other rank concludes: a
        # wait, not a silent keep of Bootstrapping.
        "silent-wait": {("silent-wait", f"{D}/prefill.py", 509, None, "WaitingForInput"),
                        ("silent-wait", f"{D}/prefill.py", 509, None, "Transferring")},
        # Failed: cache_finished_req (524) + prepare_abort (525) + done_reqs; after the loop
        # stream_output(done_reqs) and req_to_metadata_buffer_idx_allocator.free for each.
        "release-leak": set(),
        # Mooncake (1004) stores Failed over the old value, but any other status goes through
        # `max(self.request_status[bootstrap_room], status)` (1012): a stored Failed (0) is
        # replaced; NixlKVManager.update_status (160) is the 0.4.6 max() merge (165).
        "failed-not-sticky": {("failed-not-sticky", f"{D}/mooncake/conn.py", 1012, None, "Failed"),
                              ("failed-not-sticky", f"{D}/nixl/conn.py", 165, None, "Failed")},
        "absent-room-default": set(),
        "silent-status-drop": set(),
    },
    "0.5.23": {
        # Every sender inherits CommonKVSender.poll(), which reads conclude_state, and no poll()
        # raises.
        "abort-ignored": set(),
        "poll-raises": set(),
        # 1240: `else: raise RuntimeError("Unexpected poll state ... in inflight queue")` for a
        # request that is not pending_bootstrap; 1396: handle_pending_bootstrap's final raise for
        # Success/Transferring (it tests Failed, Bootstrapping, WaitingForInput only).
        "unhandled-state": {("unhandled-state", f"{D}/prefill.py", 1240, None, "Bootstrapping"),
                            ("unhandled-state", f"{D}/prefill.py", 1396, None, "Success"),
                            ("unhandled-state", f"{D}/prefill.py", 1396, None, "Transferring")},
        # handle_bootstrap_failure (1352-1377): release_kv_cache under `if req.kv.holds_kv ...`,
        # maybe_release_metadata_buffer, prepare_abort, stream_output: a guarded release is a
        # release, so nothing leaks.
        "release-leak": set(),
        # CommonKVManager.update_status (653): `current = self.request_status.get(room)`; `if
        # current is None:` (655) stores only Bootstrapping/WaitingForInput, then `return`.
        "silent-status-drop": {("silent-status-drop", f"{D}/common/conn.py", 655, None, "Failed")},
        # NixlKVManager.check_status (1084): `.get(bootstrap_room, KVPoll.WaitingForInput)` (1085).
        "absent-room-default": {("absent-room-default", f"{D}/nixl/conn.py", 1085, None, "WaitingForInput")},
        # update_status returns early when the stored value is already Failed.
        "failed-not-sticky": set(),
    },
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def scanned(request: pytest.FixtureRequest) -> tuple[str, Report, Path]:
    root = sglang_tree(request.param)
    return request.param, scan_path(root), root


def test_link_rules_on_real_releases(scanned: tuple[str, Report, Path]) -> None:
    version, report, root = scanned
    assert not report.problems
    for rule, expected in EXPECTED[version].items():
        # The inflight queue's (the bootstrap queue's are held in test_bootstrap_queue.py).
        found = {(f.rule, f.path, f.line, f.backend, f.state) for f in report.findings
                 if f.rule == rule and f.queue in (None, report.queues[0].name)}
        assert found == expected, (version, rule)
        for f in report.findings:
            if f.rule == rule:
                assert f.code.startswith("KVT") and f.evidence
                # Every evidence line exists in the release.
                for e in f.evidence:
                    assert 1 <= e.line <= len((root / e.path).read_text().splitlines())


def test_poll_raises_points_at_the_raise() -> None:
    report = scan_path(sglang_tree("0.5.2"))
    # The unconditional one (the KeyError findings rest on a shared room: test_premises).
    [finding] = [f for f in report.findings if f.rule == "poll-raises" and not f.premise
                 and f.queue == report.queues[0].name]
    line = (sglang_tree("0.5.2") / finding.path).read_text().splitlines()[finding.line - 1]
    assert line.strip().startswith("raise Exception(")
    assert "not inside a try" in finding.message


def test_no_timeout_names_the_deadline_elsewhere() -> None:
    """0.5.2 MooncakeKVSender.poll() (1154): only Bootstrapping has `elapsed >= bootstrap_timeout`
    (1163); WaitingForInput comes from check_status with no deadline. (Transferring is never
    stored in 0.5.2's mooncake request_status: the stores are Bootstrapping, WaitingForInput,
    Success and Failed, so poll() cannot return it.)"""
    report = scan_path(sglang_tree("0.5.2"))
    mooncake = {f.state: f for f in report.findings if f.rule == "no-timeout" and f.backend == "mooncake"}
    assert set(mooncake) == {"WaitingForInput"}
    for finding in mooncake.values():
        assert (finding.path, finding.line) == (f"{D}/mooncake/conn.py", 1154)
        assert f"deadline for Bootstrapping ({D}/mooncake/conn.py:1163)" in finding.message


def test_silent_wait_ignores_the_pp_consensus_wait_and_logged_keeps() -> None:
    """0.5.14 prefill.py: 742-744 `if req.rid not in rids_to_check: undone_reqs.append(req)` (the
    PP consensus wait: no test of the poll value, every state alike) and Bootstrapping's own
    keeps at 758 and 797, each after a `logger.warning_once(...)`. Only the WaitingForInput /
    Transferring keep at 762 is silent."""
    root = sglang_tree("0.5.14")
    report = scan_path(root)
    found = {(f.path, f.line, f.state) for f in report.findings if f.rule == "silent-wait"}
    assert found == {(f"{D}/prefill.py", 762, "WaitingForInput"), (f"{D}/prefill.py", 762, "Transferring")}
    lines = (root / D / "prefill.py").read_text().splitlines()
    assert "req.rid not in rids_to_check" in lines[742 - 1]
    assert "undone_reqs.append(req)" in lines[762 - 1]
