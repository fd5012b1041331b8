"""The rules, one per module. `ALL_RULES` is the registry the scan and the CLI use."""

from kvtrace.rules.base import Rule, ScanContext
from kvtrace.rules.dropped_state import DroppedState
from kvtrace.rules.pinned_state import PinnedState
from kvtrace.rules.undrained_queue import UndrainedQueue
from kvtrace.rules.unused_suppression import UnusedSuppression

# UnusedSuppression stays last: it reports on what the others found (kvtrace.suppress).
ALL_RULES: list[type[Rule]] = [PinnedState, DroppedState, UndrainedQueue, UnusedSuppression]


def rule_by_id(rule_id: str) -> type[Rule] | None:
    return next((r for r in ALL_RULES if r.id == rule_id), None)


__all__ = ["ALL_RULES", "Rule", "ScanContext", "rule_by_id"]
