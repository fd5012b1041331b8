"""What the manager rules read: each class's own check or update method, with the status table
and room of kvtrace.managers (the one definition the engine and the sender analysis use too) and
the backends whose manager runs that method (ScanModel.managers), so a finding names its rows.

A manager method here is any class in the scanned package defining the pack's check or update
method (`check_status`, `update_status`), paired with a sender or not: the rules point at its
lines.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Sequence

from kvtrace.index import ClassInfo, FuncRef, Index
from kvtrace.managers import ManagerFacts, room_of, table_of
from kvtrace.parse import walk
from kvtrace.syntax import self_attr


@dataclass(frozen=True)
class ManagerMethod:
    cls: ClassInfo
    func: FuncRef
    room: str  # the parameter that keys the table
    table: str | None  # self.<table>[room] / self.<table>.get(room, ...)
    backends: tuple[str, ...] = ()  # the backends whose manager runs this method (none: no sender's)


def manager_methods(index: Index, method: str, managers: Sequence[ManagerFacts] = ()) -> list[ManagerMethod]:
    found = []
    for infos in index.classes.values():
        for cls in infos:
            func = cls.methods.get(method)
            if func is None or not index.in_root(func.path):
                continue
            room = room_of(func)
            if room is None:
                continue
            backends = tuple(b for m in managers if m.runs(func) for b in m.backends)
            found.append(ManagerMethod(cls, func, room, table_of(func, room), backends))
    return sorted(found, key=lambda m: (m.func.path, m.func.line))


def reads_slot(node: ast.AST, table: str, room: str, aliases: set[str]) -> bool:
    """`self.<table>[room]`, `self.<table>.get(room...)`, or a name assigned from one."""
    if isinstance(node, ast.Name) and node.id in aliases:
        return True
    if isinstance(node, ast.Subscript) and self_attr(node.value) == table \
            and isinstance(node.slice, ast.Name) and node.slice.id == room:
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
        and self_attr(node.func.value) == table and bool(node.args) \
        and isinstance(node.args[0], ast.Name) and node.args[0].id == room


def slot_aliases(func: ast.AST, table: str, room: str) -> set[str]:
    aliases: set[str] = set()
    for node in walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and reads_slot(node.value, table, room, set()):
            aliases.add(node.targets[0].id)
    return aliases


def stores(func: ast.AST, table: str, room: str) -> list[ast.Assign]:
    return [node for node in walk(func) if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Subscript) and self_attr(t.value) == table and isinstance(t.slice, ast.Name)
        and t.slice.id == room for t in node.targets)]


