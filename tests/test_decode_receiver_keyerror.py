"""The decode receiver's unguarded check_status on 0.5.23 (issue 23's open item, read by hand).

`CommonKVReceiver.poll()` (common/conn.py:2586) runs `_poll()`, which calls
`self.kv_mgr.check_status(self.bootstrap_room)` (2593) with no test that the room is in the
table; `CommonKVManager.check_status` is `return self.request_status[bootstrap_room]` (609): a
KeyError for an absent room. The prefill sender tests the room first in 0.5.23 (2353), the
receiver does not. NIXL's manager overrides check_status with `.get(room, WaitingForInput)`
(nixl/conn.py:1085): no KeyError there. The receiver's constructor stores the room (or, when it
does not own it, concludes Failed before any table read) and only its own clear() (2935), called
by the decode drains as the request concludes, takes it out: while queued, only another request
with the same room empties it (sglang#40125, #27643). This holds the sender-side reading, which does
not depend on the decode drain's path limit; the drain-side verdict (with its premise) waits for
the decode scan of 0.5.23 to complete.
"""

from __future__ import annotations

from functools import lru_cache

from kvtrace import pipeline
from kvtrace.backends import SenderAnalysis, analyse_backends
from kvtrace.fetch.local import fetch_local
from kvtrace.packs import load_pack
from tests.sglang_wheels import sglang_tree

COMMON = "disaggregation/common/conn.py"


@lru_cache(maxsize=1)
def receivers() -> dict[str, SenderAnalysis]:
    pack = load_pack("sglang-decode")
    target = sglang_tree("0.5.23") / "sglang" / "srt"
    parsed = pipeline.parse(fetch_local(target), pack, None)
    indexed = pipeline.index(parsed, pack, str(target))
    problems: list[str] = []
    found = analyse_backends(indexed.index, pack, indexed.domain, parsed.root, problems)
    assert not problems
    return {s.backend.name: s for s in found}


def test_common_receivers_raise_keyerror_at_check_status_0_5_23() -> None:
    by_name = receivers()
    for name in ("ascend", "mooncake", "mori"):
        analysis = by_name[name]
        assert analysis.backend.poll is not None
        assert (analysis.backend.poll.path.split("srt/")[-1], analysis.backend.poll.line) == (COMMON, 2586)
        assert [(p.split("srt/")[-1], line, f) for p, line, f in analysis.absent_raise_sites] == \
            [(COMMON, 609, "CommonKVManager.check_status")]
    assert by_name["nixl"].absent_raise_sites == []  # check_status is `.get(room, WaitingForInput)`
    lines = (sglang_tree("0.5.23") / "sglang" / "srt" / COMMON).read_text().splitlines()
    assert lines[609 - 1].strip() == "return self.request_status[bootstrap_room]"
    assert lines[2593 - 1].strip() == "status = self.kv_mgr.check_status(self.bootstrap_room)"
