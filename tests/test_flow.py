"""How conditions, jumps and helpers decide each poll state's fate: one small drain loop per
case, in SGLang's shape, with the fates worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace.rules.samples import drain
from kvtrace.scan import scan_path
from tests.trees import write_tree

F, B, W, T, S = "Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"
SENDER = {"disaggregation/ok/conn.py": '''\
from ..base.conn import BaseKVSender, KVPoll


class OkKVSender(BaseKVSender):
    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        return self.mgr.status()

    def abort(self):
        self.conclude_state = KVPoll.Failed
'''}

CASES: dict[str, tuple[str | tuple[str, str], dict[str, list[str]], str]] = {
    "not-equal": ('''\
            if poll != KVPoll.Success:
                undone_reqs.append(req)
            else:
                done_reqs.append(req)''', {F: ["kept"], B: ["kept"], W: ["kept"], T: ["kept"], S: ["leaves"]}, ""),
    "not-in-tuple-and-is": ('''\
            if poll not in (KVPoll.Success, KVPoll.Failed):
                undone_reqs.append(req)
            elif poll is KVPoll.Failed:
                prepare_abort(req, "failed")
            else:
                release_kv_cache(req, self.tree_cache)
                done_reqs.append(req)''', {F: ["leaves"], B: ["kept"], W: ["kept"], T: ["kept"], S: ["leaves"]}, ""),
    "or-and-not": ('''\
            if poll == KVPoll.Bootstrapping or (poll == KVPoll.Transferring and not req.stalled):
                undone_reqs.append(req)
            elif not (poll == KVPoll.Success or poll == KVPoll.Failed):
                raise RuntimeError(poll)
            else:
                done_reqs.append(req)''', {F: ["leaves"], B: ["kept"], W: ["raises"], T: ["kept", "raises"], S: ["leaves"]}, ""),
    "int-literal-compares-by-value": ('''\
            if poll == 2 or poll == 3:
                undone_reqs.append(req)
            elif poll in (0, 4):
                done_reqs.append(req)
            else:
                undone_reqs.append(req)''', {F: ["leaves"], B: ["kept"], W: ["kept"], T: ["kept"], S: ["leaves"]}, ""),
    "early-continue-on-a-flag": ('''\
            if req.parked:
                undone_reqs.append(req)
                continue
            if poll == KVPoll.Success:
                done_reqs.append(req)
            elif poll == KVPoll.Failed:
                done_reqs.append(req)''', {F: ["kept", "leaves"], B: ["kept", "dropped"], W: ["kept", "dropped"],
                                           T: ["kept", "dropped"], S: ["kept", "leaves"]}, "dropped-state"),
    "helper-returns-bool-of-poll": (('''\
            if self.concluded(req, poll):
                done_reqs.append(req)
            else:
                self.keep(req, undone_reqs)''', '''
    def concluded(self, req, value):
        if value in [KVPoll.Success, KVPoll.Failed]:
            release_kv_cache(req, self.tree_cache)
            return True
        return False

    def keep(self, req, into):
        into.append(req)
'''), {F: ["leaves"], B: ["kept"], W: ["kept"], T: ["kept"], S: ["leaves"]}, ""),
    "return-in-loop-keeps-the-queue": ('''\
            if poll == KVPoll.Failed:
                return
            done_reqs.append(req)''', {F: ["kept"], B: ["leaves"], W: ["leaves"], T: ["leaves"], S: ["leaves"]}, ""),
    "break-and-assert": ('''\
            assert poll != KVPoll.Bootstrapping, "not bootstrapped"
            if poll == KVPoll.Transferring:
                break
            if poll == KVPoll.WaitingForInput:
                undone_reqs.append(req)
                break
            done_reqs.append(req)''', {F: ["leaves"], B: ["raises"], W: ["kept"], T: ["dropped"], S: ["leaves"]}, "dropped-state"),
    "try-except-around-failure": ('''\
            if poll == KVPoll.Failed:
                try:
                    req.disagg_kv_sender.failure_exception()
                except Exception as exc:
                    prepare_abort(req, str(exc))
                done_reqs.append(req)
            elif poll == KVPoll.Success:
                done_reqs.append(req)
            else:
                undone_reqs.append(req)''', {F: ["leaves"], B: ["kept"], W: ["kept"], T: ["kept"], S: ["leaves"]}, ""),
    "mutually-recursive-helpers-end": (('''\
            if self.ping(req, poll):
                undone_reqs.append(req)
            else:
                done_reqs.append(req)''', '''
    def ping(self, req, poll):
        if poll == KVPoll.Success:
            return False
        return self.pong(req, poll)

    def pong(self, req, poll):
        return self.ping(req, poll)
'''), {F: ["kept", "leaves"], B: ["kept", "leaves"], W: ["kept", "leaves"],
                             T: ["kept", "leaves"], S: ["leaves"]}, ""),
    "match-case-value-patterns": ('''\
            match poll:
                case KVPoll.WaitingForInput | KVPoll.Transferring:
                    undone_reqs.append(req)
                case KVPoll.Success if req.streamed:
                    done_reqs.append(req)
                case KVPoll.Failed:
                    prepare_abort(req, "failed")
                case _:
                    raise RuntimeError(poll)''', {F: ["leaves"], B: ["raises"], W: ["kept"], T: ["kept"], S: ["leaves", "raises"]}, ""),
    "module-level-constant-tuple": ('''\
            if poll in IN_FLIGHT:
                undone_reqs.append(req)
            elif poll not in FINISHED:
                raise RuntimeError(poll)
            else:
                done_reqs.append(req)''', {F: ["leaves"], B: ["raises"], W: ["kept"], T: ["kept"], S: ["leaves"]}, ""),
    "poll-value-stored-in-another-name": ('''\
            state = poll
            finished = state in (KVPoll.Success, KVPoll.Failed)
            if finished:
                done_reqs.append(req)
            else:
                undone_reqs.append(req)''', {F: ["leaves"], B: ["kept"], W: ["kept"], T: ["kept"], S: ["leaves"]}, ""),
}


def test_poll_values_from_any_sequence_zipped_with_the_queue(tmp_path: Path) -> None:
    """The poll list may come from a helper or a comprehension rather than a known poll call."""
    source = drain(CASES["not-equal"][0]).replace(
        "polls = poll_and_all_reduce(", "polls = self.gather_states(")
    assert "gather_states" in source
    report = scan_path(write_tree(tmp_path, {"disaggregation/prefill.py": source, **SENDER}))
    fates = {state: fate.fate for state, fate in report.queues[0].states.items()}
    assert fates == CASES["not-equal"][1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_fates(name: str, tmp_path: Path) -> None:
    code, expected, rule = CASES[name]
    branches, methods = code if isinstance(code, tuple) else (code, "")
    source = drain(branches, methods)
    if "IN_FLIGHT" in branches:  # module-level constants, defined after the imports
        source = source.replace("\n\nclass PrefillMixin", "\nIN_FLIGHT = (KVPoll.WaitingForInput, KVPoll.Transferring)\n"
                                "FINISHED = frozenset({KVPoll.Success, KVPoll.Failed})\n\n\nclass PrefillMixin")
    report = scan_path(write_tree(tmp_path, {"disaggregation/prefill.py": source, **SENDER}))
    assert all(f.status == "ok" for f in report.files), [(f.path, f.error) for f in report.files]
    fates = {state: fate.fate for state, fate in report.queues[0].states.items()}
    assert fates == expected
    # The fate rules only: the link rules (silent-wait, release-leak, ...) have their own samples.
    rules = {f.rule for f in report.findings if f.rule in ("pinned-state", "dropped-state", "undrained-queue")}
    assert rules == ({rule} if rule else set())
