"""What the manager rules read: each transfer manager's status-table methods, from the syntax.

A manager is a class in the scanned package that defines the pack's check and update methods
(`check_status`, `update_status`). Its status table is the `self.<attr>` dict those methods
index by their room parameter. This is a syntactic reading of two methods, not the executed
model of the senders (kvtrace.backends); it is what the manager rules need to point at a line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kvtrace.syntax import self_attr
from kvtrace.index import ClassInfo, FuncRef, Index


@dataclass(frozen=True)
class ManagerMethod:
    cls: ClassInfo
    func: FuncRef
    room: str  # the parameter that keys the table
    table: str | None  # self.<table>[room] / self.<table>.get(room, ...)


def manager_methods(index: Index, method: str) -> list[ManagerMethod]:
    found = []
    for infos in index.classes.values():
        for cls in infos:
            func = cls.methods.get(method)
            if func is None or not index.in_root(func.path):
                continue
            args = [a.arg for a in func.node.args.args]
            if len(args) < 2:
                continue
            room = args[1]
            found.append(ManagerMethod(cls, func, room, _table(func.node, room)))
    return sorted(found, key=lambda m: (m.func.path, m.func.line))


def _table(func: ast.AST, room: str) -> str | None:
    for node in ast.walk(func):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id == room:
            if (attr := self_attr(node.value)) is not None:
                return attr
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop") \
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == room:
            if (attr := self_attr(node.func.value)) is not None:
                return attr
    return None


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
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and reads_slot(node.value, table, room, set()):
            aliases.add(node.targets[0].id)
    return aliases


def stores(func: ast.AST, table: str, room: str) -> list[ast.Assign]:
    return [node for node in ast.walk(func) if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Subscript) and self_attr(t.value) == table and isinstance(t.slice, ast.Name)
        and t.slice.id == room for t in node.targets)]


def member(node: ast.AST, enum: str) -> str | None:
    if isinstance(node, ast.Attribute) and (isinstance(node.value, ast.Name) and node.value.id == enum
                                            or isinstance(node.value, ast.Attribute) and node.value.attr == enum):
        return node.attr
    return None
