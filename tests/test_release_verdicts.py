"""Every error-level verdict (and every one that rests on a premise) on each released SGLang with
disaggregation, read against the code and SGLang's tracker (issue 23). The data below is the
reading: per release, each finding kvtrace must give, scanning `sglang/srt` and
`sglang/srt/disaggregation`, with its verdict class; each class says why and cites the upstream
issue. A bug fixed upstream is reported before the fix and gone after (the releases that lack a
class are part of the data). Lines are the `def poll` of the backend's sender (pinned-state),
the assert/raise the state reaches (state-crash), the raise in poll() (poll-raises).

From `sglang/srt/disaggregation` alone the same rows come back, except that a verdict reached only
in a mode whose caller is out of view (the PP loop in managers/ passing rids_to_check) rests on
that caller: a warning whose premise names it, with the INCOMPLETE line that names the unseen
callers (on 0.4.7.post1 … 0.4.10.post2 no caller passes it at all, so srt/ has no such row).
FIXED lists where a class is gone because the release fixed it, with the line that fixes it.

Grouped by release (one pair of scans each, 1-3 s apiece)."""

from __future__ import annotations


import pytest

from kvtrace.model import ProblemKind, Report
from kvtrace.rules.premise import SHARED_ROOM
from kvtrace.rules.send_flow import SEND_SKIPPED
from kvtrace.scan import scan_path
from tests.releases import ALL, KEYERROR_ROOM, KEYERROR_SITES, Verdict
from tests.sglang_wheels import sglang_tree

D = "sglang/srt/disaggregation"
RULES = ("pinned-state", "state-crash", "poll-raises")


STALLED_NIXL = Verdict(None, "NixlKVSender.poll(): once has_sent, the transfer handles neither all DONE nor any ERR "
                             "return WaitingForInput; abort() is absent or writes conclude_state, which poll() never "
                             "reads; no clock is read: a stalled transfer pins the request", "sglang#24296", "def poll")
MOONCAKE_WAIT = Verdict(None, "MooncakeKVSender.poll() answers check_status(); WaitingForInput has no deadline (the "
                              "bootstrap timeout covers Bootstrapping only) and there is no abort()",
                        "waiting timeout added later (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)", "def poll")
NIXL_RAISES = Verdict(None, "poll() raises on an ERR transfer state and the drain's poll_and_all_reduce is in no try: "
                            "the scheduler crashes instead of failing one request", "sglang#24296", "raise")
FAKE_SKIP = Verdict(SEND_SKIPPED, "FakeKVSender.poll() waits for has_sent; send_kv_chunk(req, last_chunk=True) right "
                                  "after the append sends unless a path returns first (no pages: a fully cached or "
                                  "empty prompt)", "sglang#28652 (fixed in 0.5.21)", "def poll")
CRASH_ROOM = Verdict(SHARED_ROOM, "a request enters the inflight queue only past Bootstrapping; the table only moves "
                                  "up and only the sender's constructor stores Bootstrapping: it comes back only with "
                                  "a second sender for the same room", "sglang#25063, sglang#27643", "")
PP_CRASH = Verdict(None, "the PP branch asserts `poll == Success or poll == Failed` for a rid this rank is told to "
                         "check; a lagging rank still polls a transient state", "sglang#20485, fixed by sglang#20686 "
                         "(0.5.10)", "assert poll == KVPoll.Success or poll == KVPoll.Failed")
PP_CRASH_ROOM = Verdict(SHARED_ROOM, PP_CRASH.because + "; Bootstrapping there needs the table to go back (as "
                                                        "CRASH_ROOM)", PP_CRASH.upstream, PP_CRASH.cited)
NIXL_BOOT = Verdict(SHARED_ROOM, "false as an unconditional pin: poll() reads the table only while not has_sent, and "
                                 "the table never goes back to Bootstrapping once the request passed the bootstrap "
                                 "queue; only a second sender for the room stores it again", "sglang#27643", "def poll")
NIXL_ABSENT = Verdict(SHARED_ROOM, "check_status answers WaitingForInput for an absent room and update_status(Failed) "
                                   "is a no-op for it; the only code that takes the room out is CommonKVSender.clear(), "
                                   "which the drain calls as the request concludes: while queued, only another "
                                   "request with the same room empties it", "sglang#25063, sglang#27643", "def poll")

# (rule, backend, state, path under disaggregation/, line, verdict) per release.
RELEASES: dict[str, list[tuple[str, str | None, str | None, str, int, Verdict]]] = {}


def _add(versions: str, rule: str, backend: str | None, state: str | None, path: str, lines: str,
         verdict: Verdict) -> None:
    assert len(versions.split()) == len(lines.split()), (rule, backend, state)
    for version, line in zip(versions.split(), lines.split()):
        RELEASES.setdefault(version, []).append((rule, backend, state, path, int(line), verdict))


for _v in ALL:
    RELEASES.setdefault(_v, [])

_UP_TO_0511 = " ".join(ALL[:ALL.index("0.5.11") + 1])
_add(_UP_TO_0511, "pinned-state", "nixl", "WaitingForInput", "nixl/conn.py",
     "450 390 395 395 427 437 437 437 598 727 727 724 721 745 742 963 940 940 1146", STALLED_NIXL)
_add(_UP_TO_0511, "poll-raises", "nixl", None, "nixl/conn.py",
     "457 397 402 402 434 444 444 444 605 734 734 731 728 752 749 970 947 947 1153", NIXL_RAISES)
_add("0.4.6.post5 0.4.7 0.4.7.post1 0.4.8 0.4.8.post1", "pinned-state", "mooncake", "WaitingForInput",
     "mooncake/conn.py", "498 718 723 719 932", MOONCAKE_WAIT)
_add(" ".join(ALL[:ALL.index("0.5.12.post1") + 1]), "pinned-state", "fake", "WaitingForInput", "fake/conn.py",
     "23 23 29 29 29 29 29 29 29 29 29 29 29 29 29 43 46 46 48 50 50", FAKE_SKIP)
# 0.4.7.post1, 0.4.8: mooncake's decode thread stores a value read from the network
# (int(status.decode('ascii'))), but only start_decode_thread() runs it, called only under
# `self.disaggregation_mode == DECODE`; the sender's add_transfer_request() asserts PREFILL on its
# manager, and only the constructor sets the mode: it never stores into a prefill sender's room.
_add("0.4.7.post1 0.4.8 0.4.8.post1 0.4.9.post6 0.4.10.post2 0.5.1.post3 0.5.2 0.5.3.post3 0.5.4.post3 0.5.5.post3 "
     "0.5.6.post2 0.5.7 0.5.8.post1 0.5.9", "state-crash", None, "Bootstrapping", "prefill.py",
     "501 505 506 518 515 530 532 564 561 558 558 580 576 602", CRASH_ROOM)
_PP = "0.5.1.post3 0.5.2 0.5.3.post3 0.5.4.post3 0.5.5.post3 0.5.6.post2 0.5.7 0.5.8.post1 0.5.9"
_PP_LINES = "504 506 538 535 532 532 554 550 576"
_add(_PP, "state-crash", None, "WaitingForInput", "prefill.py", _PP_LINES, PP_CRASH)
_add(_PP, "state-crash", None, "Bootstrapping", "prefill.py", _PP_LINES, PP_CRASH_ROOM)
_add("0.5.9", "state-crash", None, "Transferring", "prefill.py", "576", PP_CRASH)  # mori returns it from 0.5.9
_add("0.5.10 0.5.10.post1 0.5.11", "pinned-state", "nixl", "Bootstrapping", "nixl/conn.py", "940 940 1146", NIXL_BOOT)
_add("0.5.12 0.5.12.post1 0.5.13 0.5.13.post1 0.5.14 0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22",
     "pinned-state", "nixl", "WaitingForInput", "nixl/conn.py",
     "1878 1881 1936 1936 1936 2435 2512 2761 2790 2841 3089 3159 3338", NIXL_ABSENT)


for _v, _sites in KEYERROR_SITES.items():
    for _backend, _path, _line in _sites:
        RELEASES[_v].append(("poll-raises", _backend, None, _path, _line, KEYERROR_ROOM))


# Where a class is gone because the release fixed it: (release, rule, path under disaggregation/,
# line, what the line holds, why). The rows above have no such finding on that release.
FIXED = [
    ("0.5.23", "poll-raises", "common/conn.py", 2353, "if self.bootstrap_room in self.kv_mgr.request_status:",
     "_poll_with_status calls the check_status it is passed (poll(): self.kv_mgr.check_status, 2344) only for a "
     "room in the table, else answers Failed: KEYERROR_ROOM (sglang#40125) is gone from the senders' poll; "
     "a copy of 0.5.23 without this test raises again (tests/test_premises.py)"),
]
UNSEEN_CALLER = "a caller outside the scanned folder passes rids_to_check to process_disagg_prefill_inflight_queue"


def verdict_rows(report: Report) -> set[tuple[str, str | None, str | None, str, int, str | None, str]]:
    # The bootstrap queue's verdicts are read in tests/test_bootstrap_queue.py.
    return {(f.rule, f.backend, f.state, f.path.split("disaggregation/", 1)[-1], f.line, f.premise, f.severity)
            for f in report.findings if f.rule in RULES and (f.severity == "error" or f.premise)
            and f.queue != "disagg_prefill_bootstrap_queue"}


def expected_rows(version: str) -> set[tuple[str, str | None, str | None, str, int, str | None, str]]:
    return {(rule, backend, state, path, line, v.premise, "warning" if v.premise else "error")
            for rule, backend, state, path, line, v in RELEASES[version]}


@pytest.mark.parametrize("version", ALL)
def test_release_verdicts(version: str) -> None:
    root = sglang_tree(version)
    whole = scan_path(root / "sglang" / "srt")
    assert verdict_rows(whole) == expected_rows(version)
    # Each cited line is what the verdict says it is.
    for rule, backend, state, path, line, verdict in RELEASES[version]:
        text = (root / D / path).read_text().splitlines()[line - 1].strip()
        cited = verdict.cited or ("assert" if "assert" in text else "raise")
        assert cited in text and (rule != "state-crash" or text.startswith(("assert", "raise"))), (version, path, line, text)
    for release, rule, path, line, holds, _ in FIXED:
        if release == version:
            assert holds in (root / D / path).read_text().splitlines()[line - 1]
            assert not [r for r in verdict_rows(whole) if r[0] == rule and r[3] == path], (version, rule)
    # The backends' folder alone gives the same verdicts, or says what it could not see (the
    # callers of the drain, in managers/): a verdict reached only in a mode such a caller would
    # bind rests on that caller (a warning with that premise), never an error.
    folder = scan_path(root / D)
    # A queue judged from srt/ but not from the folder alone is bound outside it: the folder's
    # scan says so (0.5.23's role_switch.py clears the bootstrap queue with `= None`; before,
    # that hid it and the queue's grid went missing with no INCOMPLETE line).
    drained = {q.name for q in whole.queues if q.drain is not None}
    for queue in drained - {q.name for q in folder.queues if q.drain is not None}:
        assert any(p.kind is ProblemKind.OUT_OF_VIEW and p.text.startswith(f"self.{queue} is bound outside the scanned folder")
                   for p in folder.problems), (version, queue)
    wide = {r[:5]: r[5:] for r in verdict_rows(whole)}
    narrow = {r[:5]: r[5:] for r in verdict_rows(folder)}
    assert set(wide) <= set(narrow), (version, set(wide) - set(narrow))
    for key, (premise, severity) in narrow.items():
        if key in wide and wide[key] == (premise, severity):
            continue
        assert premise is not None and severity == "warning" and premise.endswith(UNSEEN_CALLER), (version, key, premise)
        if key in wide:  # the mode's callers are in view from srt/: there it is the other premise alone
            assert premise.removesuffix(UNSEEN_CALLER).removesuffix(" and ") == (wide[key][0] or ""), (version, key)
        assert any(p.kind is ProblemKind.OUT_OF_VIEW and "outside the scanned folder are not seen: rids_to_check" in p.text
                   for p in folder.problems), version
