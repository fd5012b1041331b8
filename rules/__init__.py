"""The rules, one per module. `ALL_RULES` is the registry the scan and the CLI use, in code order."""

from kvtrace.rules.abort_ignored import AbortIgnored
from kvtrace.rules.absent_room_default import AbsentRoomDefault
from kvtrace.rules.base import Rule, ScanContext
from kvtrace.rules.dropped_state import DroppedState
from kvtrace.rules.failed_not_sticky import FailedNotSticky
from kvtrace.rules.no_timeout import NoTimeout
from kvtrace.rules.pinned_state import PinnedState
from kvtrace.rules.poll_raises import PollRaises
from kvtrace.rules.release_leak import ReleaseLeak
from kvtrace.rules.silent_status_drop import SilentStatusDrop
from kvtrace.rules.silent_wait import SilentWait
from kvtrace.rules.skip_poll import SkipPoll
from kvtrace.rules.state_crash import StateCrash
from kvtrace.rules.undrained_queue import UndrainedQueue
from kvtrace.rules.unhandled_state import UnhandledState
from kvtrace.rules.unused_suppression import UnusedSuppression

# In code order; UnusedSuppression (KVT100) stays last: it reports on what the others found
# (kvtrace.suppress).
ALL_RULES: list[type[Rule]] = sorted(
    [PinnedState, DroppedState, UndrainedQueue, UnhandledState, SilentWait, ReleaseLeak, PollRaises,
     AbortIgnored, NoTimeout, SilentStatusDrop, AbsentRoomDefault, FailedNotSticky, StateCrash, SkipPoll, UnusedSuppression],
    key=lambda rule: rule.code,
)


def find_rule(code_or_name: str) -> type[Rule] | None:
    """A rule by its code (KVT001, case-insensitive) or its name (pinned-state)."""
    wanted = code_or_name.strip()
    return next((r for r in ALL_RULES if r.code.lower() == wanted.lower() or r.name == wanted), None)


__all__ = ["ALL_RULES", "Rule", "ScanContext", "find_rule"]
