"""Release data that more than one test module reads: the SGLang releases with disaggregation on
PyPI, and the poll-raises KeyError sites of the prefill pack per release (read by hand:
tests/test_release_verdicts.py and tests/test_bootstrap_queue.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtrace.rules.premise import SHARED_ROOM

ALL = ("0.4.6.post5 0.4.7 0.4.7.post1 0.4.8 0.4.8.post1 0.4.9.post6 0.4.10.post2 0.5.1.post3 0.5.2 0.5.3.post3 "
       "0.5.4.post3 0.5.5.post3 0.5.6.post2 0.5.7 0.5.8.post1 0.5.9 0.5.10 0.5.10.post1 0.5.11 0.5.12 0.5.12.post1 "
       "0.5.13 0.5.13.post1 0.5.14 0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23").split()


@dataclass(frozen=True)
class Verdict:
    premise: str | None  # None: true as stated (an error); else what it rests on (a warning)
    because: str
    upstream: str
    cited: str  # what the cited line holds


KEYERROR_ROOM = Verdict(SHARED_ROOM, "check_status reads `self.request_status[room]`: KeyError for an absent room, and "
                                     "poll() calls it outside any try; the room leaves the table only through the "
                                     "request's own clear(), which the drain calls as it concludes, so while queued "
                                     "only another request with the same room empties it", "sglang#40125",
                        "self.request_status[")
# (backend, path under disaggregation/, line of the table read) per release: poll-raises KeyError.
KEYERROR_SITES = {
    '0.4.6.post5': [],
    '0.4.7': [('mooncake', 'mooncake/conn.py', 589)],
    '0.4.7.post1': [('mooncake', 'mooncake/conn.py', 589)],
    '0.4.8': [('mooncake', 'mooncake/conn.py', 585)],
    '0.4.8.post1': [('mooncake', 'mooncake/conn.py', 796)],
    '0.4.9.post6': [('ascend', 'mooncake/conn.py', 809), ('mooncake', 'mooncake/conn.py', 809)],
    '0.4.10.post2': [('ascend', 'mooncake/conn.py', 827), ('mooncake', 'mooncake/conn.py', 827)],
    '0.5.1.post3': [('ascend', 'mooncake/conn.py', 999), ('mooncake', 'mooncake/conn.py', 999)],
    '0.5.2': [('ascend', 'mooncake/conn.py', 1002), ('mooncake', 'mooncake/conn.py', 1002)],
    '0.5.3.post3': [('ascend', 'mooncake/conn.py', 1028), ('mooncake', 'mooncake/conn.py', 1028)],
    '0.5.4.post3': [('ascend', 'mooncake/conn.py', 1027), ('mooncake', 'mooncake/conn.py', 1027)],
    '0.5.5.post3': [('ascend', 'mooncake/conn.py', 1021), ('mooncake', 'mooncake/conn.py', 1021)],
    '0.5.6.post2': [('ascend', 'mooncake/conn.py', 1019), ('mooncake', 'mooncake/conn.py', 1019)],
    '0.5.7': [('ascend', 'mooncake/conn.py', 1024), ('mooncake', 'mooncake/conn.py', 1024)],
    '0.5.8.post1': [('ascend', 'mooncake/conn.py', 1024), ('mooncake', 'mooncake/conn.py', 1024)],
    '0.5.9': [('ascend', 'mooncake/conn.py', 1099), ('mooncake', 'mooncake/conn.py', 1099), ('mori', 'mori/conn.py', 297)],
    '0.5.10': [('ascend', 'common/conn.py', 179), ('mooncake', 'common/conn.py', 179), ('mori', 'common/conn.py', 179)],
    '0.5.10.post1': [('ascend', 'common/conn.py', 179), ('mooncake', 'common/conn.py', 179), ('mori', 'common/conn.py', 179)],
    '0.5.11': [('ascend', 'common/conn.py', 180), ('mooncake', 'common/conn.py', 180), ('mori', 'common/conn.py', 180)],
    '0.5.12': [('ascend', 'common/conn.py', 191), ('mooncake', 'common/conn.py', 191)],
    '0.5.12.post1': [('ascend', 'common/conn.py', 191), ('mooncake', 'common/conn.py', 191)],
    '0.5.13': [('ascend', 'common/conn.py', 210), ('mooncake', 'common/conn.py', 210)],
    '0.5.13.post1': [('ascend', 'common/conn.py', 210), ('mooncake', 'common/conn.py', 210)],
    '0.5.14': [('ascend', 'common/conn.py', 212), ('mooncake', 'common/conn.py', 212)],
    '0.5.15.post1': [('ascend', 'common/conn.py', 213), ('mooncake', 'common/conn.py', 213)],
    '0.5.16': [('ascend', 'common/conn.py', 248), ('mooncake', 'common/conn.py', 248)],
    '0.5.17': [('ascend', 'common/conn.py', 310), ('mooncake', 'common/conn.py', 310)],
    '0.5.18': [('ascend', 'common/conn.py', 315), ('mooncake', 'common/conn.py', 315)],
    '0.5.19': [('ascend', 'common/conn.py', 363), ('mooncake', 'common/conn.py', 363)],
    '0.5.20': [('ascend', 'common/conn.py', 393), ('mooncake', 'common/conn.py', 393)],
    '0.5.21': [('ascend', 'common/conn.py', 413), ('mooncake', 'common/conn.py', 413)],
    '0.5.22': [('ascend', 'common/conn.py', 553), ('mooncake', 'common/conn.py', 553)],
    '0.5.23': [],  # see FIXED: the senders' poll tests the room before reading the table
}
