"""Abstract values for the poll enum, and what a condition on them decides.

A value is a finite set of tokens drawn from a small universe: the enum's members, None, True,
False, OTHER (anything else), plus role markers (@req, @keep, @polls) that say which object a
name holds. An unknown value is the whole universe, so every comparison works on plain sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

Val = frozenset[str]

NONE, TRUE, FALSE, OTHER = "None", "True", "False", "?"
REQ, KEEP, POLLS = "@req", "@keep", "@polls"
# A value computed from a clock call in the current call (`time.time() - start`): it grows.
NOW = "@now"
# The room is not in the manager's status table (popped, deleted, or never stored).
ABSENT = "@absent"
ROLES = frozenset({REQ, KEEP, POLLS})
# A number written in the code (`prefix_len = 0`): it equals the member of its value (KVPoll is a
# plain int class), but it is no poll value, so a test of it says nothing about the poll state.
INT = "@int"
# Tokens that say where a value came from, not what it holds: a split keeps them on every part.
MARKERS = frozenset({INT})


@dataclass(frozen=True)
class Domain:
    """The poll enum as read from the scanned source: member name -> value (if an int)."""

    enum: str
    members: tuple[str, ...]
    values: tuple[int | None, ...]
    terminal: tuple[str, ...]

    @cached_property  # asked at most calls the analysis cannot enter: built once
    def universe(self) -> Val:
        return frozenset(self.members) | {NONE, TRUE, FALSE, OTHER}

    @property
    def non_terminal(self) -> tuple[str, ...]:
        return tuple(m for m in self.members if m not in self.terminal)

    def member_for_int(self, number: int) -> str | None:
        """`poll == 2` compares with the member whose value is 2 (KVPoll is a plain int class)."""
        for name, value in zip(self.members, self.values):
            if value == number:
                return name
        return None

    def falsy(self) -> Val:
        """Tokens that can be false in `if x:` (a member with value 0 is falsy, like Failed)."""
        zero = {m for m, v in zip(self.members, self.values) if v == 0}
        return frozenset(zero | {NONE, FALSE, OTHER})

    def truthy(self) -> Val:
        nonzero = {m for m, v in zip(self.members, self.values) if v != 0}
        return frozenset(nonzero | {TRUE, OTHER} | ROLES)

    def states(self, value: Val) -> set[str]:
        return {m for m in self.members if m in value}


def refine(op: str, value: Val, constants: Val) -> tuple[Val, Val]:
    """Split `value` by `value OP constants` into (true part, false part).

    `constants` is the exact set of possible right-hand values; for ==/is it must be a single
    token to be decidable on the false side, for in/not in it is the container's elements.
    """
    marks, held, constants = value & MARKERS, value - MARKERS, constants - MARKERS
    yes, no = _split(op, held, constants)
    return (yes | marks if yes else yes), (no | marks if no else no)


def _split(op: str, value: Val, constants: Val) -> tuple[Val, Val]:
    if op in ("==", "is"):
        if len(constants) == 1:
            return value & constants, value - constants
        return value & constants, value
    if op in ("!=", "is not"):
        yes, no = _split("==", value, constants)
        return no, yes
    if op == "in":
        return value & constants, value - constants
    if op == "not in":
        return value - constants, value & constants
    return value, value
