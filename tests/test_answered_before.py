"""A flag the request must carry to enter the queue, set only where its poll() answered a state
past the pinned one (rules/way_in.py `_answered_before`, backends `_past_states`): the pin is ruled
out only while each link holds. Each case edits the decode pack's valid sample (a prealloc drain that
sets `handshaken` when poll() answered WaitingForInput; a transfer queue that takes only requests
with it set; a receiver that answers Bootstrapping until a handshake that is never undone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace.packs import load_pack, load_samples
from kvtrace.scan import scan_path
from tests.trees import write_tree

_SHARED, _SAMPLES = load_samples("sglang-decode")
_VALID = next(s for s in _SAMPLES if s.kind == "valid" and "disaggregation/flag/conn.py" in s.files)
_DECODE = "disaggregation/decode.py"
_RECEIVER = "disaggregation/flag/conn.py"


def _pinned_in_transfer_queue(root: Path, edits: dict[str, tuple[str, str]]) -> set[str]:
    files = dict(_VALID.files)
    for path, (old, new) in edits.items():
        assert old in files[path], old
        files[path] = files[path].replace(old, new)
    report = scan_path(write_tree(root, files, _SHARED), load_pack("sglang-decode"))
    assert all(f.status == "ok" for f in report.files), [(f.path, f.error) for f in report.files]
    return {f.state for f in report.findings
            if (f.rule, f.backend, f.queue) == ("pinned-state", "flag", "disagg_decode_transfer_queue")}


CASES = [
    pytest.param({}, set(), id="flag-set-after-the-handshake"),
    # The guard tests the flag with `and`: still required.
    pytest.param({_DECODE: ("if not decode_req.handshaken:", "if not decode_req.handshaken or not decode_req.req:")},
                 set(), id="guard-in-an-or"),
    # The flag is also set where poll() answered Bootstrapping.
    pytest.param({_DECODE: ("            if poll == KVPoll.Bootstrapping:\n                pass",
                            "            if poll == KVPoll.Bootstrapping:\n                decode_req.handshaken = True")},
                 {"Bootstrapping"}, id="flag-also-set-while-bootstrapping"),
    # ... or outside any drain, on every request.
    pytest.param({_DECODE: ("        decode_req.kv_receiver.init()\n",
                            "        decode_req.kv_receiver.init()\n        decode_req.handshaken = True\n")},
                 {"Bootstrapping"}, id="flag-set-on-the-way-into-prealloc"),
    # A receiver built with the flag already set.
    pytest.param({_DECODE: ("self.disagg_decode_prealloc_queue.add(DecodeRequest(req, receiver))",
                            "self.disagg_decode_prealloc_queue.add(DecodeRequest(req, receiver, handshaken=True))"),
                  },
                 {"Bootstrapping"}, id="built-with-the-flag"),
    # The receiver can fall back to Bootstrapping after answering WaitingForInput.
    pytest.param({_RECEIVER: ("    def send_metadata(self):",
                              "    def reconnect(self):\n        self.bootstrapped = False\n\n    def send_metadata(self):")},
                 {"Bootstrapping"}, id="handshake-undone-by-a-method"),
    # ... or code outside it resets the receiver's handshake.
    pytest.param({_DECODE: ("            decode_req.kv_receiver.send_metadata()\n",
                            "            decode_req.kv_receiver.send_metadata()\n"
                            "            decode_req.kv_receiver.bootstrapped = False\n")},
                 {"Bootstrapping"}, id="handshake-undone-from-outside"),
    # The request's receiver is replaced after the handshake.
    pytest.param({_DECODE: ("            decode_req.kv_receiver.send_metadata()\n",
                            "            decode_req.kv_receiver = self.fresh_receiver(decode_req)\n"
                            "            decode_req.kv_receiver.send_metadata()\n")},
                 {"Bootstrapping"}, id="receiver-replaced"),
    # The flag is reset between the guard and the hand-over.
    pytest.param({_DECODE: ("            decode_req.kv_receiver.send_metadata()\n",
                            "            decode_req.handshaken = self.recheck(decode_req)\n"
                            "            decode_req.kv_receiver.send_metadata()\n")},
                 {"Bootstrapping"}, id="flag-rebound-after-the-guard"),
]


@pytest.mark.parametrize(("edits", "pinned"), CASES)
def test_flag_guard_on_the_way_in(tmp_path: Path, edits: dict[str, tuple[str, str]], pinned: set[str]) -> None:
    assert _pinned_in_transfer_queue(tmp_path, edits) == pinned
