"""One model of each transfer manager, read by the engine, the sender analysis and the manager
rules alike: which class it is, its check and update methods (through the MRO), the room
parameter, the status table (the one definition of "the table"), and the backends whose sender
works with it. Also the two small readings everything about managers rests on: which backend
folder a file is in (the enum member an expression names is kvtrace.syntax.enum_member).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kvtrace.index import ClassInfo, FuncRef, Index
from kvtrace.syntax import self_attr


def backend_folder(path: str, root: str) -> str:
    """The backend's folder below the package root (`nixl/conn.py` -> `nixl`)."""
    rel = path[len(root) + 1 :] if root and path.startswith(root + "/") else path
    parts = rel.split("/")
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def room_of(func: FuncRef) -> str | None:
    """The parameter a check or update method keys the table by: its first after `self`."""
    args = [a.arg for a in func.node.args.args]
    return args[1] if len(args) > 1 else None


def table_of(func: FuncRef, room: str | None = None) -> str | None:
    """The status table: the `self.<attr>` dict `func` indexes by its room parameter
    (`self.X[room]`, `self.X.get(room, ...)`, `self.X.pop(room, ...)`)."""
    room = room if room is not None else room_of(func)
    if room is None:
        return None
    for node in ast.walk(func.node):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id == room:
            if (attr := self_attr(node.value)) is not None:
                return attr
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop") \
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == room:
            if (attr := self_attr(node.func.value)) is not None:
                return attr
    return None


@dataclass(frozen=True)
class ManagerFacts:
    """A manager class as every reader sees it. `check`/`update`: the methods its MRO resolves
    (what the backend runs); `table`: read from `check` with its room parameter; `backends`: the
    backends whose sender is paired with it (kvtrace.backends.pair_manager), in scan order."""

    cls: ClassInfo
    check: FuncRef | None
    update: FuncRef | None
    room: str | None
    table: str | None
    backends: tuple[str, ...] = ()

    def runs(self, func: FuncRef) -> bool:
        """Whether `func` is the check or update method this manager runs (by place: the facts
        cross the scan's fork, their syntax trees copied)."""
        return any(f is not None and (f.path, f.line, f.qualname) == (func.path, func.line, func.qualname)
                   for f in (self.check, self.update))


def manager_facts(index: Index, cls: ClassInfo, check_method: str, update_method: str,
                  backends: tuple[str, ...] = ()) -> ManagerFacts:
    check = index.find_method(cls, check_method)
    update = index.find_method(cls, update_method)
    room = room_of(check) if check is not None else None
    return ManagerFacts(cls, check, update, room, table_of(check, room) if check is not None else None, backends)
