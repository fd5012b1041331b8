"""How a room's entry in the status table moves between two polls (kvtrace.managers.TableMoves),
against running the manager: generated managers (the update shapes SGLang's backends have had:
max() of the entry, a store only into an absent room, Failed stored as is or dropped, `.get`
inside max(); a clear by pop or del; other threads storing a state as is, by setdefault or by
max), imported and driven from each state through every call the tree makes, in every order.

Oracle: every value the entry takes (a member, or the room absent) is in what TableMoves says
the entry can move to from the state it started at. A value outside it is a state kvtrace would
call "never again" that execution reaches: a pin it would hide.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from kvtrace.rules.samples import SHARED_FILES
from kvtrace.states import ABSENT

from .gen import budget

MEMBERS = ("Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success")
VALUE = {m: i for i, m in enumerate(MEMBERS)}  # as SHARED_FILES' KVPoll: Failed = 0 ... Success = 4
T = "self.request_status"

UPDATES = {
    # if absent: store; else max (0.4.6.post5)
    "rises": [f"if room not in {T}:", f"    {T}[room] = status", "else:", f"    {T}[room] = max({T}[room], status)"],
    # the same through `in`
    "rises_in": [f"if room in {T}:", f"    {T}[room] = max({T}[room], status)", "else:", f"    {T}[room] = status"],
    # Failed stored as is, else max (0.4.7)
    "failed_as_is": [f"if room not in {T}:", f"    {T}[room] = status", "elif status == KVPoll.Failed:",
                     f"    {T}[room] = KVPoll.Failed", "else:", f"    {T}[room] = max({T}[room], status)"],
    "max_get": [f"{T}[room] = max({T}.get(room, status), status)"],
    "plain": [f"{T}[room] = status"],
    "ignore_absent": [f"if room not in {T}:", "    return", f"{T}[room] = status"],
}
CLEARS = {"none": [], "pop": [f"{T}.pop(room, None)"], "del": [f"if room in {T}:", f"    del {T}[room]"]}
# Another thread's store of a state: as is, by setdefault (only into an absent room), by max().
STORES = {"as_is": f"{T}[room] = KVPoll.{{s}}", "setdefault": f"{T}.setdefault(room, KVPoll.{{s}})",
          "max": f"{T}[room] = max({T}[room], KVPoll.{{s}})"}


@dataclass(frozen=True)
class Manager:
    update: str
    clear: str
    passed: tuple[str, ...]  # what threads pass to update_status (besides the sender's Bootstrapping, Failed)
    stores: tuple[tuple[str, str], ...]  # (how, state): other threads' stores into the table
    outside: bool = False  # a module function pops the room through the manager it is given

    def source(self) -> str:
        lines = ["from ..base.conn import BaseKVSender, KVPoll", "", "",
                 "class NetKVManager:", "    def __init__(self):", f"        {T} = {{}}", "",
                 "    def check_status(self, room):", f"        return {T}[room]", "",
                 "    def update_status(self, room, status):"]
        lines += [f"        {line}" for line in UPDATES[self.update]]
        if self.clear != "none":
            lines += ["", "    def clear(self, room):"] + [f"        {line}" for line in CLEARS[self.clear]]
        for i, state in enumerate(self.passed):
            lines += ["", f"    def thread_{i}(self, room):", f"        self.update_status(room, KVPoll.{state})"]
        for i, (how, state) in enumerate(self.stores):
            lines += ["", f"    def store_{i}(self, room):", "        " + STORES[how].format(s=state)]
        if self.outside:
            lines += ["", "", "def drop_room(mgr, room):", f"    mgr.{T.removeprefix('self.')}.pop(room, None)"]
        lines += ["", "", "class NetKVSender(BaseKVSender):", "    def __init__(self, mgr, room):",
                  "        self.kv_mgr = mgr", "        self.room = room",
                  "        self.kv_mgr.update_status(room, KVPoll.Bootstrapping)", "",
                  "    def poll(self) -> KVPoll:", "        return self.kv_mgr.check_status(self.room)", "",
                  "    def abort(self):", "        self.kv_mgr.update_status(self.room, KVPoll.Failed)", ""]
        return "\n".join(lines)


managers = st.builds(
    Manager,
    update=st.sampled_from(sorted(UPDATES)),
    clear=st.sampled_from(sorted(CLEARS)),
    passed=st.lists(st.sampled_from(MEMBERS), max_size=3).map(tuple),
    stores=st.lists(st.tuples(st.sampled_from(sorted(STORES)), st.sampled_from(MEMBERS)), max_size=2).map(tuple),
    outside=st.booleans(),
)


def _moves(manager: Manager):
    from kvtrace.fetch.local import fetch_local
    from kvtrace.graph import find_enum
    from kvtrace.index import Index
    from kvtrace.managers import manager_model
    from kvtrace.packs import load_pack
    from kvtrace.parse import parse_modules

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rel, text in {**SHARED_FILES, "disaggregation/net/conn.py": manager.source()}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        pack = load_pack()
        index = Index(parse_modules(fetch_local(root).files).modules, "disaggregation")
        found = find_enum(index, pack)
        assert found is not None
        [sender], [mgr] = index.classes["NetKVSender"], index.classes["NetKVManager"]
        return manager_model(index, pack, found[0], sender, mgr).moves


def _reached(manager: Manager, start: str) -> set[str]:
    """Every value the room's entry takes, run from `start` through every call the code makes
    (each thread, the sender's constructor and abort(), clear()), in any order, any number of times."""
    kvpoll = type("KVPoll", (), dict(VALUE))
    space: dict = {"KVPoll": kvpoll, "BaseKVSender": object}
    exec(manager.source().split("\n", 1)[1], space)  # the module without its relative import
    mgr_cls = space["NetKVManager"]
    calls = [lambda m, room: m.update_status(room, kvpoll.Bootstrapping),  # the sender's __init__
             lambda m, room: m.update_status(room, kvpoll.Failed)]  # its abort()
    calls += [getattr(mgr_cls, f"thread_{i}") for i in range(len(manager.passed))]
    calls += [getattr(mgr_cls, f"store_{i}") for i in range(len(manager.stores))]
    if manager.clear != "none":
        calls.append(mgr_cls.clear)
    if manager.outside:
        calls.append(space["drop_room"])
    name = {v: m for m, v in VALUE.items()}
    seen, todo = {start}, [start]
    while todo:
        now = todo.pop()
        for call in calls:
            m = mgr_cls()
            if now != ABSENT:
                m.request_status[7] = VALUE[now]
            try:
                call(m, 7)
            except KeyError:  # max() of an absent room's entry: nothing stored
                continue
            after = name[m.request_status[7]] if 7 in m.request_status else ABSENT
            if after not in seen:
                seen.add(after)
                todo.append(after)
    return seen


@budget(ci=40, slow=400)
@given(manager=managers)
@example(manager=Manager("rises", "none", ("WaitingForInput",), ()))
@example(manager=Manager("rises", "pop", ("WaitingForInput",), ()))
@example(manager=Manager("failed_as_is", "none", ("Success",), ()))
@example(manager=Manager("max_get", "del", (), (("setdefault", "Bootstrapping"),)))
@example(manager=Manager("rises", "none", (), (("max", "Success"), ("as_is", "Failed"))))
@example(manager=Manager("rises", "none", ("WaitingForInput",), (), outside=True))
def test_the_entry_moves_only_where_table_moves_says(manager: Manager) -> None:
    moves = _moves(manager)
    if moves is None:
        return  # not bounded: kvtrace takes the table as holding anything it can (checked elsewhere)
    for start in MEMBERS:
        allowed = moves.after(frozenset({start}))
        if allowed is None:
            continue
        reached = _reached(manager, start)
        assert reached <= allowed, (manager.source(), start, sorted(reached - allowed))


def test_the_oracle_sees_a_table_that_only_rises() -> None:
    """The oracle can fail: a table that only rises never goes back from WaitingForInput to
    Bootstrapping when run, and does once a clear lets a store into the absent room."""
    rising = Manager("rises", "none", ("WaitingForInput",), ())
    assert "Bootstrapping" not in _reached(rising, "WaitingForInput")
    assert {"Bootstrapping", ABSENT} <= _reached(Manager("rises", "pop", (), ()), "WaitingForInput")
    moves = _moves(rising)
    assert moves is not None and "Bootstrapping" not in (moves.after(frozenset({"WaitingForInput"})) or {"Bootstrapping"})
