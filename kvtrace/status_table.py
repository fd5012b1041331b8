"""The manager's status table, as a sender's runs read and write it: one room's entry.

A sender's poll() reads its room's state from a table its manager keeps
(`self.kv_mgr.request_status[room]`), and the manager's methods store into it, pop it, test
whether the room is in it. The walker (`flow.Explorer`) never names the table: it asks its
Effects whether an expression is a container the domain models by key (`keyed`), and hands
them the read, store, delete, method call or membership test. The sender's Effects
(kvtrace.effects) answer here, on the path attribute `TABLE`: the states the room's entry can
hold, `ABSENT` among them when the room may be missing. Each answer splits the path into the
room present (the entry narrowed to the states) and absent, and records what it did as an event
(read, store, clear, default, a KeyError).
"""

from __future__ import annotations

import libcst as cst

from kvtrace.flow import COMPANION, EMPTY, Event, Explorer, Frame, PathState, code
from kvtrace.model import EventKind
from kvtrace.states import ABSENT, NONE, Val
from kvtrace.syntax import self_attr

TABLE = "@table"  # attribute key of this room's entry in the manager's status table

Answer = list[tuple[PathState, Val]]


def is_table(run: Explorer, table: str | None, node: cst.CSTNode, frame: Frame) -> bool:
    """`self.<table>` inside the manager (the walker's companion), `self.<mgr>.<table>` inside
    the sender."""
    manager = run.c.companion
    if table is None or not isinstance(node, cst.Attribute) or node.attr.value != table:
        return False
    if frame.prefix == COMPANION:
        return frame.is_self(node.value)
    if frame.prefix == "" and isinstance(node.value, cst.Name) and manager is not None \
            and node.value.value in run.companion_aliases(frame):
        return True  # `mgr.<table>` after `self.kv_mgr = mgr` (0.5.22 receivers' constructor)
    holder = self_attr(node.value, frame.self_name)
    return holder is not None and manager is not None and manager.holds(holder)


def split(run: Explorer, path: PathState) -> tuple[PathState | None, PathState | None]:
    """The path with the room present (narrowed), and with it absent; None when impossible."""
    held = path.attr(TABLE)
    if held is None:
        held = frozenset(run.c.domain.members) | {ABSENT}
    present = held - {ABSENT}
    return (path.set_attr(TABLE, present) if present else None,
            path.set_attr(TABLE, frozenset({ABSENT})) if ABSENT in held else None)


def read(run: Explorer, node: cst.Subscript, path: PathState, frame: Frame) -> Answer:
    """`table[room]`: the held states for a present room, KeyError for an absent one."""
    present, absent = split(run, path)
    out = []
    line = frame.body.line(node)
    if present is not None:
        out.append((present.emit(Event(EventKind.TABLE_READ, frame.func.path, line, frame.func.qualname, code(node))),
                    present.attr(TABLE) or EMPTY))
    if absent is not None:  # KeyError
        out.append((absent.emit(Event(EventKind.TABLE_RAISE, frame.func.path, line, frame.func.qualname,
                                      code(node))).ending("raise"), EMPTY))
    return out


def store(run: Explorer, target: cst.Subscript, value: Val, path: PathState, frame: Frame) -> PathState:
    """`table[room] = value`: the entry holds the states stored (any, for a value kvtrace cannot read)."""
    stored = frozenset(run.c.domain.states(value)) or frozenset(run.c.domain.members)
    return path.set_attr(TABLE, stored).emit(
        Event(EventKind.TABLE_STORE, frame.func.path, frame.body.line(target), frame.func.qualname, ", ".join(sorted(stored))))


def delete(run: Explorer, node: cst.Del, path: PathState, frame: Frame) -> list[PathState]:
    """`del table[room]`: the room is gone; KeyError when it was absent."""
    present, absent = split(run, path)
    line, fn = frame.body.line(node), frame.func.qualname
    out = []
    if present is not None:
        out.append(present.set_attr(TABLE, frozenset({ABSENT})).emit(
            Event(EventKind.TABLE_CLEAR, frame.func.path, line, fn, code(node))))
    if absent is not None:
        out.append(absent.emit(Event(EventKind.TABLE_RAISE, frame.func.path, line, fn, code(node))).ending("raise"))
    return out


def method_call(run: Explorer, node: cst.Call, method: str, values: list[Val], path: PathState, frame: Frame) -> Answer:
    """`table.get(room, d)`, `.pop(room[, d])`, `.setdefault(room, d)`; any other method: unknown."""
    here, line, fn = frame.func.path, frame.body.line(node), frame.func.qualname
    domain = run.c.domain
    present, absent = split(run, path)
    out: Answer = []
    if method in ("get", "pop", "setdefault"):
        default = values[1] if len(values) > 1 else frozenset({NONE})
        if present is not None:
            value = present.attr(TABLE) or EMPTY
            if method == "pop":
                present = present.set_attr(TABLE, frozenset({ABSENT})).emit(Event(EventKind.TABLE_CLEAR, here, line, fn, code(node)))
            else:
                present = present.emit(Event(EventKind.TABLE_READ, here, line, fn, code(node)))
            out.append((present, value))
        if absent is not None:
            if method == "pop" and len(values) < 2:
                out.append((absent.emit(Event(EventKind.TABLE_RAISE, here, line, fn, code(node))).ending("raise"), EMPTY))
            else:
                detail = ", ".join(sorted(domain.states(default))) or (
                    code(node.args[1].value) if len(node.args) > 1 else "None")
                absent = absent.emit(Event(EventKind.TABLE_DEFAULT if method != "pop" else EventKind.TABLE_CLEAR, here, line, fn, detail))
                if method == "setdefault":  # stores the default for an absent room
                    stored = frozenset(domain.states(default)) or frozenset(domain.members)
                    absent = absent.set_attr(TABLE, stored).emit(
                        Event(EventKind.TABLE_STORE, here, line, fn, ", ".join(sorted(stored))))
                out.append((absent, default))
        return out
    return [(path, domain.universe)]


def membership(run: Explorer, node: cst.Comparison, is_in: bool, path: PathState,
               frame: Frame) -> list[tuple[PathState, bool, bool]]:
    """`room in table` (`is_in`) or `not in`: true where the room is present."""
    out: list[tuple[PathState, bool, bool]] = []
    for p, _ in run.eval(node.left, path, frame):
        if p.term is not None:
            out.append((p, False, False))
            continue
        present, absent = split(run, p)
        if present is not None:
            out.append((present, is_in, False))
        if absent is not None:
            absent = absent.emit(Event(EventKind.TABLE_ABSENT, frame.func.path, frame.body.line(node), frame.func.qualname, code(node)))
            out.append((absent, not is_in, False))
    return out
