"""One model of each transfer manager, read by the engine, the sender analysis and the manager
rules alike: which class it is, its check and update methods (through the MRO), the room
parameter, the status table (the one definition of "the table"), and the backends whose sender
works with it. Also the two small readings everything about managers rests on: which backend
folder a file is in (the enum member an expression names is kvtrace.syntax.enum_member).
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from typing import cast

from kvtrace.index import ClassInfo, FuncRef, Index, functions_given_self
from kvtrace.model import Evidence, ManagerRef
from kvtrace.packs import Pack
from kvtrace.parse import parents as _parents
from kvtrace.parse import walk
from kvtrace.states import ABSENT, Domain
from kvtrace.syntax import dotted, self_attr

# Per manager model: function name -> (caller, call) for calls of self.<name>(...) in scope.
CallSites = dict[str, list[tuple[FuncRef, ast.Call]]]


def _below(path: str, root: str) -> list[str]:
    return (path[len(root) + 1 :] if root and path.startswith(root + "/") else path).split("/")


def folder_below(path: str, root: str) -> str | None:
    """The first folder below the package root that holds `path` (`nixl/conn.py` -> `nixl`);
    None for a file in the root itself or outside it."""
    if root and not path.startswith(root + "/"):
        return None
    parts = _below(path, root)
    return parts[0] if len(parts) > 1 else None


def backend_folder(path: str, root: str) -> str:
    """What names the backend a class at `path` belongs to: its folder below the package root,
    else its file (`nixl/conn.py` -> `nixl`, `fake_conn.py` -> `fake_conn`)."""
    parts = _below(path, root)
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


# --- pairing a sender with its manager ---------------------------------------------------------


@dataclass(frozen=True)
class TableMoves:
    """How a room's entry in the status table can change between two polls, whatever thread
    stores, read from every store into the table: `T[room] = max(T[room], x)` only raises the
    entry (the poll enum's members ordered by their int values); a store under `if room not in
    T` only fills an absent room, which happens again only once the room is cleared; any other
    store can set what it stores at any time."""

    order: tuple[tuple[str, int], ...]  # the members and their values
    raises: bool  # some store is max(entry, x)
    set_to: frozenset[str]  # what the other stores can set, the room present or not
    refill: frozenset[str]  # what stores into an absent room can put there
    refill_read: bool  # False: some store into an absent room stores a value kvtrace cannot read
    clears: bool  # some code pops or deletes the room

    def after(self, held: frozenset[str]) -> frozenset[str] | None:
        """What the entry can hold at the next poll when it holds `held` now (None: not bounded)."""
        reach = set(held) | self.set_to
        if self.clears or ABSENT in held:
            if not self.refill_read:
                return None
            reach |= self.refill | ({ABSENT} if self.clears else set())
        if self.raises:  # max(v, x) >= v: anything at or above the lowest member reached
            value = dict(self.order)
            floor = [value[s] for s in reach if s in value]
            reach |= {m for m, v in self.order if floor and v >= min(floor)}
        return frozenset(reach)


@dataclass
class ManagerModel:
    cls: ClassInfo
    ref: ManagerRef
    facts: ManagerFacts
    attrs: frozenset[str]  # sender attributes that hold the manager (`kv_mgr`)
    # The states stored anywhere but in the sender's own constructor (read from the syntax):
    # what the table can be given again once the room has moved on.
    later: frozenset[str] = frozenset()
    # Of ref.unknown, the stores made only in code that runs in another mode of the manager than
    # the one its senders work with (see _other_mode_functions), with why: they never reach a
    # sender's room.
    other_mode_unknown: dict[str, str] = field(default_factory=dict)
    other_mode_methods: frozenset[str] = frozenset()  # their qualnames (nested functions run inside them)
    moves: TableMoves | None = None  # None: some store is not read, or the members are not ordered ints

    @property
    def unknown_in_mode(self) -> tuple[str, ...]:
        return tuple(u for u in self.ref.unknown if u not in self.other_mode_unknown)


def class_mappings(index: Index) -> list[tuple[set[str], str, int]]:
    """Dict literals whose values are class names (`{KVClassType.SENDER: NixlKVSender, ...}`)."""
    found = []
    for module in index.modules.values():
        for node in walk(module.tree):
            if isinstance(node, ast.Dict):
                names = {v.id for v in node.values if isinstance(v, ast.Name) and v.id in index.classes}
                if len(names) >= 2:
                    found.append((names, module.source.path, node.lineno))
    return found


def _is_manager(index: Index, pack: Pack, cls: ClassInfo) -> bool:
    return any(c.name == pack.manager_base for c in index.mro(cls)[1:])


def pair_manager(index: Index, pack: Pack, domain: Domain, cls: ClassInfo, root: str,
                 mappings: list[tuple[set[str], str, int]]) -> ManagerModel | None:
    """The manager a sender works with: from a backend -> classes dict that names the sender,
    else the sender's __init__ parameter annotation (through the MRO, as super().__init__
    passes it on), else the one manager class of the sender's folder."""
    if not pack.manager_base:
        return None
    found: ClassInfo | None = None
    how = ""
    for names, path, line in mappings:
        if cls.name in names:
            candidates = [c for n in names if (c := index.resolve_class(n, near=path)) is not None and _is_manager(index, pack, c)]
            if len(candidates) == 1:
                found, how = candidates[0], f"mapping at {path}:{line}"
                break
    if found is None:
        for c in index.mro(cls):
            init = c.methods.get("__init__")
            if init is None:
                continue
            for arg in init.node.args.args + init.node.args.kwonlyargs:
                name = _annotation_name(arg.annotation)
                target = index.resolve_class(name, near=init.path) if name else None
                if target is not None and _is_manager(index, pack, target):
                    found, how = target, f"annotation at {init.path}:{init.line}"
                    break
            if found is not None:
                break
    if found is None:
        folder = backend_folder(cls.path, root)
        local = [c for c in index.subclasses_of(pack.manager_base) if backend_folder(c.path, root) == folder]
        leaves = [c for c in local if not any(o is not c and c in index.mro(o)[1:] for o in local)]
        if len(leaves) == 1:
            found, how = leaves[0], f"folder {folder}"
    if found is None:
        return None
    return _manager_model(index, pack, domain, cls, found, how)


def manager_model(index: Index, pack: Pack, domain: Domain, sender: ClassInfo, manager: ClassInfo) -> ManagerModel:
    """The model of a manager already paired with `sender` (by pair_manager, e.g. in the scan's child)."""
    return _manager_model(index, pack, domain, sender, manager, "paired before")


def _annotation_name(node: ast.AST | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.strip("'\"").rsplit(".", 1)[-1]
    text = dotted(node) if node is not None else ""
    return text.rsplit(".", 1)[-1] if text else ""


def _manager_model(index: Index, pack: Pack, domain: Domain, sender: ClassInfo, manager: ClassInfo,
                   how: str) -> ManagerModel:
    members = domain.members
    facts = manager_facts(index, manager, pack.check_method, pack.update_method)
    check, update, table = facts.check, facts.update, facts.table
    functions = [f for c in index.mro(manager) + index.mro(sender) for f in c.methods.values()]
    # Module functions the sender hands itself to (`_abort_transfer(self)`) act as its methods.
    self_names = {id(f.node): "self" for f in functions}
    for func, name in functions_given_self(index, index.mro(sender)):
        if id(func.node) not in self_names:
            functions.append(func)
            self_names[id(func.node)] = name
    call_sites: CallSites = {}
    for func in functions:
        for node in index.calls_in(func):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if callee:
                call_sites.setdefault(callee, []).append((func, node))
    reader = _StoreReader(pack, members, index.mro(sender), update, table, self_names, call_sites, index,
                          index.mro(manager))
    for func in functions:
        for node in index.nodes_in(func, _STORES_AND_CALLS):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                reader.read_call(node, node.func, func)
            elif isinstance(node, ast.Delete) and table:
                reader.read_delete(node, func, table)
            elif isinstance(node, ast.Assign) and table:
                reader.read_assign(node, func, table)
    reader.holds |= reader.passed
    # A store of the update method under `if status == X` happens only if some caller passes X.
    for store, func, parents in reader.in_update:
        params = [a.arg for a in func.node.args.posonlyargs + func.node.args.args][1:]
        narrowed = narrowed_by_guard(params[1], store, parents, members) if len(params) > 1 else None
        if narrowed is not None and not reader.passed_unknown and not narrowed & reader.passed:
            continue
        before = len(reader.unknown)
        given = reader.collect(store.value, func, parents, store)
        reader.holds |= given
        reader.later.update(given)
        # The update method's own status is what its callers pass (reader.passed, counted there).
        status = params[1] if len(params) > 1 else None
        if any(isinstance(n, ast.Name) and n.id == status for n in ast.walk(store.value)):
            given, unread = given | reader.passed, len(reader.unknown) > before or reader.passed_unknown
        else:
            unread = len(reader.unknown) > before
        reader.moved(store, given, unread, parents)
    runs = tuple(f"{f.path}:{f.qualname}" for f in (check, update) if f is not None)
    ref = ManagerRef(manager.name, manager.path, manager.line, how, table,
                     tuple(sorted(reader.holds)), tuple(dict.fromkeys(reader.unknown)),
                     tuple(sorted(set(reader.clears), key=lambda e: (e.path, e.line))),
                     runs, tuple(dict.fromkeys(reader.clear_methods)))
    other_mode = _other_mode_functions(index, manager, sender, reader.attrs)
    elsewhere = {u: other_mode[func.qualname] for u, func in reader.unknown_in.items() if func.qualname in other_mode}
    return ManagerModel(manager, ref, facts, frozenset(reader.attrs), frozenset(reader.later), elsewhere,
                        frozenset(other_mode), _table_moves(reader, domain))


def _table_moves(reader: "_StoreReader", domain: Domain) -> TableMoves | None:
    values = [v for v in domain.values if v is not None]
    if len(values) != len(domain.members) or len(set(values)) != len(values):
        return None  # an unordered enum: max() says nothing kvtrace can use
    if any(kind == "set" and unread for kind, _, unread in reader.moves):
        return None
    if reader.table is None or _table_escapes(reader.index, reader.table, frozenset(reader.self_names),
                                              frozenset(id(c.node) for c in reader.manager_mro)):
        return None
    by_kind = {kind: [given for k, given, _ in reader.moves if k == kind] for kind in ("set", "fill")}
    return TableMoves(tuple(zip(domain.members, cast("list[int]", list(domain.values)))),
                      any(kind == "raise" for kind, _, _ in reader.moves),
                      frozenset().union(*by_kind["set"]), frozenset().union(*by_kind["fill"]),
                      not any(kind == "fill" and unread for kind, _, unread in reader.moves), bool(reader.clears))


def _other_mode_functions(index: Index, manager: ClassInfo, sender: ClassInfo, attrs: set[str]) -> dict[str, str]:
    """The manager's methods that run only in a mode its senders never see, each with why. A
    method called only under `if self.<mode> == X` (a thread the constructor starts per mode) does
    not run on a manager whose sender calls a method that asserts `self.<mode> == Y` (Y != X) on
    it, when only constructors assign `self.<mode>`: the mode is fixed for the manager's life, and
    a sender paired with a manager in mode X fails that assert."""
    methods = [f for c in index.mro(manager) for f in c.methods.values()]
    asserted: dict[str, dict[str, str]] = {}  # mode attribute -> value the sender's calls assert -> where
    for c in index.mro(sender):
        for func in c.methods.values():
            for call in index.calls_in(func):
                recv = call.func.value if isinstance(call.func, ast.Attribute) else None
                if isinstance(recv, ast.Attribute) and recv.attr in attrs and isinstance(recv.value, ast.Name) \
                        and recv.value.id == "self" and isinstance(call.func, ast.Attribute):
                    target = index.find_method(manager, call.func.attr)
                    for attr, value, line in _mode_tests(target.node.body if target is not None else [], ast.Assert):
                        asserted.setdefault(attr, {}).setdefault(
                            value, f"{func.qualname}() calls {call.func.attr}(), which asserts it is {value} "
                                   f"({target.path if target else ''}:{line})")
    if not asserted:
        return {}
    fixed = {attr for attr in asserted if not any(
        isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == "self"
        for f in methods if f.name != "__init__" for n in index.nodes_in(f, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))}
    # `self.<name>(...)` calls and `self.<name>` mentions in the methods, by name: one pass, not one per method.
    self_calls: dict[str, list[tuple[FuncRef, ast.Call]]] = {}
    self_named: Counter[str] = Counter()
    for f in methods:
        for call in index.calls_in(f):
            if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "self":
                self_calls.setdefault(call.func.attr, []).append((f, call))
        self_named.update(n.attr for n in index.nodes_in(f, (ast.Attribute,))
                          if isinstance(n.value, ast.Name) and n.value.id == "self")
    found: dict[str, str] = {}
    for method in methods:
        sites = self_calls.get(method.name, [])
        named = self_named[method.name]
        if not sites or named != len(sites):
            continue  # called from outside, or handed on (a thread target): it may run in any mode
        guards = [(f, _guard_of(call, _parents(f.node))) for f, call in sites]
        if all(g is not None and g[0] in fixed and g[1] not in asserted[g[0]] for _, g in guards):
            attr = guards[0][1][0] if guards[0][1] else ""
            where = ", ".join(f"{f.path}:{g[2]}" for f, g in guards if g is not None)
            mine = "; ".join(asserted[attr].values())
            found[method.qualname] = (f"{method.qualname}() runs only when self.{attr} is "
                                      f"{' or '.join(sorted({g[1] for _, g in guards if g is not None}))} ({where}), "
                                      f"set only by the constructor, and {mine}")
    return found


def _mode_tests(body: list[ast.stmt], kind: type) -> list[tuple[str, str, int]]:
    """`self.<attr> == <value>` (with its line) tested by the leading statements of `kind` in `body`."""
    found: list[tuple[str, str, int]] = []
    for stmt in body:
        if not isinstance(stmt, kind):
            break
        test = stmt.test  # type: ignore[attr-defined]
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) \
                and isinstance(test.left, ast.Attribute) and isinstance(test.left.value, ast.Name) \
                and test.left.value.id == "self":
            found.append((test.left.attr, ast.unparse(test.comparators[0]), stmt.lineno))
    return found


def _guard_of(call: ast.Call, parents: dict[int, ast.AST]) -> tuple[str, str, int] | None:
    """The nearest enclosing `if self.<attr> == <value>:` whose body holds the call."""
    node: ast.AST = call
    while id(node) in parents:
        parent = parents[id(node)]
        if isinstance(parent, ast.If) and node in parent.body:
            tests = _mode_tests([parent], ast.If)
            return tests[0] if tests else None
        node = parent
    return None


@dataclass
class _StoreReader:
    """One pass over a manager's and its sender's calls, deletes and assignments: what they
    store into the status table, pass to the update method as the status, and clear."""

    pack: Pack
    members: tuple[str, ...]
    sender_mro: list[ClassInfo]
    update: FuncRef | None
    table: str | None
    self_names: dict[int, str]
    call_sites: CallSites
    index: Index
    manager_mro: list[ClassInfo] = field(default_factory=list)
    holds: set[str] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)
    clears: list[Evidence] = field(default_factory=list)
    clear_methods: list[str] = field(default_factory=list)
    attrs: set[str] = field(default_factory=set)  # sender attributes that hold the manager
    later: set[str] = field(default_factory=set)  # what is stored by a function other than the sender's __init__
    passed: set[str] = field(default_factory=set)  # what the update method's callers pass as the status
    passed_unknown: bool = False
    in_update: list[tuple[ast.Assign, FuncRef, dict[int, ast.AST]]] = field(default_factory=list)
    unknown_in: dict[str, FuncRef] = field(default_factory=dict)  # each unknown store -> the function it is in
    # Each store into the table: how it changes the room's entry ("raise", "fill", "set"), what it
    # stores, and whether some of that could not be read (TableMoves).
    moves: list[tuple[str, frozenset[str], bool]] = field(default_factory=list)

    def moved(self, store: ast.Assign, given: set[str], unread: bool, parents: dict[int, ast.AST]) -> None:
        target = next(t for t in store.targets if isinstance(t, ast.Subscript) and ends_with_attr(t.value, self.table or ""))
        kind = _store_kind(store.value, target, parents, self.table or "")
        if kind == "raise or fill":  # max(T.get(k, d), x): raises a present entry, fills an absent one with d or x
            self.moves += [("raise", frozenset(), False), ("fill", frozenset(given), unread)]
        else:
            self.moves.append((kind, frozenset(given), unread))

    def constructor(self, func: FuncRef) -> bool:
        return func.name == "__init__" and func.owner in self.sender_mro

    def collect(self, value: ast.expr, func: FuncRef, parents: dict[int, ast.AST], site: ast.stmt | ast.expr) -> set[str]:
        given: set[str] = set()
        before = len(self.unknown)
        _collect(value, func, parents, site, given, self.unknown, self.update, self.members, self.call_sites, self.index)
        for entry in self.unknown[before:]:
            self.unknown_in.setdefault(entry, func)
        return given

    def stored(self, given: set[str], func: FuncRef) -> None:
        self.holds |= given
        if not self.constructor(func):
            self.later.update(given)

    def read_call(self, node: ast.Call, called: ast.Attribute, func: FuncRef) -> None:
        pack, table = self.pack, self.table
        recv = called.value
        if called.attr in (pack.check_method, pack.update_method) and isinstance(recv, ast.Attribute) \
                and isinstance(recv.value, ast.Name) and recv.value.id == self.self_names[id(func.node)] \
                and (func.owner is None or func.owner in self.sender_mro):
            self.attrs.add(recv.attr)
        if called.attr == pack.update_method:
            status = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "status"), None)
            if status is not None:
                before = len(self.unknown)
                given = self.collect(status, func, _parents(func.node), node)
                self.passed |= given
                if not self.constructor(func):
                    self.later.update(given)
                self.passed_unknown = self.passed_unknown or len(self.unknown) > before
        if table and called.attr == "setdefault" and ends_with_attr(recv, table) and len(node.args) > 1:
            before = len(self.unknown)
            given = self.collect(node.args[1], func, _parents(func.node), node)
            self.stored(given, func)
            self.moves.append(("fill", frozenset(given), len(self.unknown) > before))
        if table and called.attr == "pop" and ends_with_attr(recv, table):
            self.clears.append(Evidence(func.path, node.lineno, f"{func.qualname}() pops the room from {table}"))
            self.clear_methods.append(func.qualname)

    def read_delete(self, node: ast.Delete, func: FuncRef, table: str) -> None:
        for t in node.targets:
            if isinstance(t, ast.Subscript) and ends_with_attr(t.value, table):
                self.clears.append(Evidence(func.path, node.lineno, f"{func.qualname}() deletes the room from {table}"))
                self.clear_methods.append(func.qualname)

    def read_assign(self, node: ast.Assign, func: FuncRef, table: str) -> None:
        for t in node.targets:
            if isinstance(t, ast.Subscript) and ends_with_attr(t.value, table):
                if self.update is not None and func.name == self.update.name:
                    self.in_update.append((node, func, _parents(func.node)))
                else:
                    parents = _parents(func.node)
                    before = len(self.unknown)
                    given = self.collect(node.value, func, parents, node)
                    self.stored(given, func)
                    self.moved(node, given, len(self.unknown) > before, parents)


_STORES_AND_CALLS = (ast.Call, ast.Delete, ast.Assign)  # what the manager model reads in a function


_TABLE_READS = frozenset({"get", "keys", "values", "items"})  # table.<m>(...): reads only
_TABLE_READ_BY_MODEL = frozenset({"pop", "setdefault"})  # mutations the store reading follows


def _table_escapes(index: Index, table: str, read: frozenset[int], mro: frozenset[int]) -> bool:
    """Whether some code may change this manager's table in a way the store reading did not
    follow: a store, delete or pop outside the functions it read (`read`: their node ids), or any
    use it does not model (passed to a call, bound to another name, `.clear()`, `.update()`, `+=`,
    the table assigned whole outside `__init__`). `self.<table>` in a class outside the manager's
    MRO (`mro`: class node ids) is that object's own table. Then how the entry moves is not bounded."""
    key = ("table escapes", table, read, mro)
    found = index.derived.get(key)
    if found is None:
        found = index.derived[key] = any(_escapes_in(m.tree, table, read, mro) for m in index.modules.values()
                                         if table in (m.source.text or ""))
    return cast("bool", found)


def _escapes_in(tree: ast.AST, table: str, read: frozenset[int], mro: frozenset[int]) -> bool:
    # (node, enclosing class, outermost enclosing function, inside an __init__); no recursion: any depth
    todo: list[tuple[ast.AST, int | None, int | None, bool]] = [(tree, None, None, False)]
    while todo:
        parent, cls, func, in_init = todo.pop()
        for name, value in ast.iter_fields(parent):
            for child in value if isinstance(value, list) else [value]:
                if not isinstance(child, ast.AST):
                    continue
                if isinstance(child, ast.Attribute) and child.attr == table and not _own_elsewhere(child, cls, mro):
                    use = _table_use(parent, name, child)
                    seen = func is not None and func in read
                    if use == "other" or (use == "mutation" and not seen) or (use == "assigned" and not (seen and in_init)):
                        return True
                if isinstance(child, ast.Subscript) and not isinstance(child.ctx, ast.Load) \
                        and isinstance(child.value, ast.Attribute) and child.value.attr == table \
                        and not _own_elsewhere(child.value, cls, mro) \
                        and not (isinstance(parent, ast.Assign) and name == "targets" or isinstance(parent, ast.Delete)):
                    return True  # `table[k] += x`, `table[k], y = ...`: stores the reading does not follow
                if isinstance(child, ast.ClassDef):
                    todo.append((child, id(child), None, False))
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    todo.append((child, cls, func if func is not None else id(child), child.name == "__init__"))
                else:
                    todo.append((child, cls, func, in_init))
    return False


def _own_elsewhere(attr: ast.Attribute, cls: int | None, mro: frozenset[int]) -> bool:
    """`self.<table>` in a class outside the manager's MRO: that object's own table, not this one."""
    return isinstance(attr.value, ast.Name) and attr.value.id == "self" and cls is not None and cls not in mro


def _table_use(parent: ast.AST, field_name: str, attr: ast.Attribute) -> str:
    """How `parent` uses the table attribute `attr`: "read" (nothing changes), "mutation" (a
    change the store reading follows where it reads), "assigned" (the table bound whole), "other"."""
    if isinstance(parent, ast.Subscript) and field_name == "value":
        return "read" if isinstance(parent.ctx, ast.Load) else "mutation"  # (where stored: checked below)
    if isinstance(parent, ast.Attribute) and parent.attr in _TABLE_READS:
        return "read"
    if isinstance(parent, ast.Attribute) and parent.attr in _TABLE_READ_BY_MODEL:
        return "mutation"
    if isinstance(parent, ast.Compare) and field_name == "comparators" \
            and all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops):
        return "read"
    if isinstance(parent, (ast.For, ast.comprehension)) and field_name == "iter":
        return "read"
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "len":
        return "read"
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and field_name in ("targets", "target"):
        return "assigned"
    return "other"


def _store_kind(value: ast.expr, target: ast.Subscript, parents: dict[int, ast.AST], table: str) -> str:
    """"raise": `T[k] = max(T[k], x)`; "raise or fill": `T[k] = max(T.get(k, d), x)`; "fill":
    under `if k not in T` (or the else of `if k in T`), so only into an absent room; "set": any
    other store."""
    key = ast.dump(target.slice)

    def entry(node: ast.AST) -> bool:
        return isinstance(node, ast.Subscript) and ends_with_attr(node.value, table) and ast.dump(node.slice) == key

    def entry_or_default(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and ends_with_attr(node.func.value, table) and len(node.args) == 2 and not node.keywords \
            and ast.dump(node.args[0]) == key

    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "max" \
            and len(value.args) == 2 and not value.keywords:
        if any(entry(a) for a in value.args):
            return "raise"
        if any(entry_or_default(a) for a in value.args):
            return "raise or fill"
    child: ast.AST = target
    node = parents.get(id(target))
    while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 \
                and ast.dump(node.test.left) == key and ends_with_attr(node.test.comparators[0], table):
            op, in_body = node.test.ops[0], any(child is s for s in node.body)
            if (isinstance(op, ast.NotIn) and in_body) or (isinstance(op, ast.In) and not in_body):
                return "fill"
        child, node = node, parents.get(id(node))
    return "set"


def ends_with_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr


def _argument(call: ast.Call, func: FuncRef, param: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == param:
            return keyword.value
    params = [a.arg for a in func.node.args.posonlyargs + func.node.args.args]
    if func.owner is not None and params:
        params = params[1:]
    if param in params and params.index(param) < len(call.args):
        arg = call.args[params.index(param)]
        return None if isinstance(arg, ast.Starred) else arg
    return None


@dataclass
class _Collecting:
    """What one reading of a stored value shares down its recursion."""

    holds: set[str]
    unknown: list[str]
    update: FuncRef | None
    members: tuple[str, ...]
    call_sites: CallSites
    index: Index


# Conversions a value makes on its way over a socket and back (`str(status).encode("ascii")` sent,
# `int(status.decode("ascii"))` received): the member's number goes through unchanged.
WIRE_CALLS = ("int", "str", "bytes")
WIRE_METHODS = ("encode", "decode")


def _wire_inner(value: ast.expr) -> ast.expr | None:
    if isinstance(value, ast.Call) and len(value.args) <= 2 and not value.keywords:
        if isinstance(value.func, ast.Name) and value.func.id in WIRE_CALLS and len(value.args) == 1:
            return value.args[0]
        if isinstance(value.func, ast.Attribute) and value.func.attr in WIRE_METHODS:
            return value.func.value
    return None


def _collect(value: ast.expr, func: FuncRef, parents: dict[int, ast.AST], site: ast.stmt | ast.expr, holds: set[str],
             unknown: list[str], update: FuncRef | None, members: tuple[str, ...], call_sites: CallSites,
             index: Index) -> None:
    """The states a stored value can be: constants, both arms of `a if c else b`, max/min of
    stored values, a local assigned constants, a name narrowed by an enclosing `if name == X`;
    a parameter of the update method is what its call sites pass (collected there); a part of a
    message received from a socket is what the sends of such messages put there (_received)."""
    _collect_in(_Collecting(holds, unknown, update, members, call_sites, index), value, func, parents, site, 0,
                frozenset())


def _collect_in(c: _Collecting, value: ast.expr, func: FuncRef, parents: dict[int, ast.AST],
                site: ast.stmt | ast.expr, depth: int, expanding: frozenset[int]) -> None:
    const = _member_tokens(value, c.members)
    if const is not None:
        c.holds.update(const)
        return
    if isinstance(value, ast.IfExp):
        for arm in (value.body, value.orelse):
            _collect_in(c, arm, func, parents, site, depth, expanding)
        return
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("max", "min"):
        for arg in value.args:  # max(old, new) is one of them: a stored value or a new one
            if not isinstance(arg, (ast.Subscript, ast.Call)):
                _collect_in(c, arg, func, parents, site, depth, expanding)
        return
    inner = _wire_inner(value)
    if inner is not None:
        before = len(c.unknown)
        _collect_in(c, inner, func, parents, site, depth, expanding)
        if len(c.unknown) > before:  # not read through: said of the conversion, as any value not read
            del c.unknown[before:]
            c.unknown.append(_not_read(value, func, site))
        return
    if isinstance(value, ast.Name) and depth < 3 and _collect_name(c, value, func, parents, site, depth, expanding):
        return
    called = getattr(value, "func", None)
    if isinstance(value, (ast.Subscript, ast.Call)) and isinstance(called, ast.Attribute) and called.attr == "get":
        return  # a value read back from a table: nothing new
    c.unknown.append(_not_read(value, func, site))


def _not_read(value: ast.expr, func: FuncRef, site: ast.stmt | ast.expr) -> str:
    return f"{func.path}:{getattr(site, 'lineno', func.line)} {func.qualname}() stores {ast.unparse(value)[:60]}"


def _collect_name(c: _Collecting, value: ast.Name, func: FuncRef, parents: dict[int, ast.AST],
                  site: ast.stmt | ast.expr, depth: int, expanding: frozenset[int]) -> bool:
    """A name's values: narrowed by a guard, passed for a parameter, or assigned in the function
    (False: none of these, the name is read as it is)."""
    params = {a.arg for a in func.node.args.posonlyargs + func.node.args.args + func.node.args.kwonlyargs}
    narrowed = narrowed_by_guard(value.id, site, parents, c.members)
    if narrowed is not None:
        c.holds.update(narrowed)
        return True
    if value.id in params:
        if c.update is not None and func.name == c.update.name:
            return True  # the update method's own parameter: its call sites say what it holds
        bound: list[tuple[ast.expr, FuncRef, ast.Call]] = []
        for caller, call in c.call_sites.get(func.name, []):
            passed = _argument(call, func, value.id)
            if passed is not None:
                bound.append((passed, caller, call))
        if not bound:
            c.unknown.append(f"{func.path}:{site.lineno} {func.qualname}() stores its parameter {value.id}")
        for given, caller, call in bound:  # a helper's parameter: what its callers pass
            _collect_in(c, given, caller, _parents(caller.node), call, depth + 1, frozenset())
        return True
    followed = False
    for assign in walk(func.node):
        if not isinstance(assign, ast.Assign) or id(assign) in expanding:
            continue
        position = _position(assign.targets, value.id)
        if position is None:
            continue
        # `status = int(status)`: the inner name is an earlier binding. An assignment in the same
        # function is followed once per chain (`expanding`), so only hops to other functions count.
        deeper = expanding | {id(assign)}
        if position < 0:
            _collect_in(c, assign.value, func, parents, site, depth, deeper)
            followed = True
            continue
        arity = _unpacked(assign.targets)  # position >= 0: a tuple unpacks it
        parts = _received(c, assign.value, func, position, arity, deeper) if arity else None  # None: not followed
        for part, sender, send in parts or ():
            _collect_in(c, part, sender, _parents(sender.node), send, depth + 1, frozenset())
        followed = followed or parts is not None
    return followed


def _position(targets: list[ast.expr], name: str) -> int | None:
    """-1 when `name` is assigned the whole value, i when it is the i-th name a tuple unpacks."""
    for t in targets:
        if isinstance(t, ast.Name) and t.id == name:
            return -1
        if isinstance(t, (ast.Tuple, ast.List)):
            for i, e in enumerate(t.elts):
                if isinstance(e, ast.Starred):
                    break
                if isinstance(e, ast.Name) and e.id == name:
                    return i if all(not isinstance(x, ast.Starred) for x in t.elts) else None
    return None


RECEIVE, _SEND = "recv_multipart", "send_multipart"


def _received(c: _Collecting, source: ast.expr, func: FuncRef, position: int, arity: int,
              expanding: frozenset[int]) -> list[tuple[ast.expr, FuncRef, ast.Call]] | None:
    """The `position`-th part of a multipart message `source` evaluates to (`a, b = sock.recv_multipart()`,
    or a name assigned it first), as the part each send of a message of as many parts puts there.
    The peer runs the same backend's code (prefill and decode servers run one release), so the
    sends are those of the receiving function's module and of the modules of its class's bases;
    None (anything) when a send there builds its message in a way not read here or none matches."""
    while isinstance(source, ast.Name):  # `msg = sock.recv_multipart()` then `a, b = msg`
        found = [n for n in walk(func.node) if isinstance(n, ast.Assign) and id(n) not in expanding
                 and _position(n.targets, source.id) == -1]
        if len(found) != 1:
            return None
        expanding |= {id(found[0])}
        source = found[0].value
    if not (isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute)
            and source.func.attr == RECEIVE and not source.args):
        return None
    modules = {func.path} | {k.path for k in (c.index.mro(func.owner) if func.owner is not None else [])}
    parts = []
    for sender, send in c.index.callers(_SEND):
        if sender.path not in modules:
            continue
        message = send.args[0] if len(send.args) == 1 and not send.keywords else None
        if not isinstance(message, (ast.List, ast.Tuple)) or any(isinstance(e, ast.Starred) for e in message.elts):
            return None
        if len(message.elts) == arity:
            parts.append((message.elts[position], sender, send))
    return parts or None


class _CallersByName(dict[str, list[tuple[FuncRef, ast.Call]]]):
    """Call sites by callee name over the whole tree, looked up when asked."""

    def __init__(self, index: Index) -> None:
        super().__init__()
        self.index = index

    def get(self, name: str, default: object = None) -> list[tuple[FuncRef, ast.Call]]:
        if name not in self:
            self[name] = self.index.callers(name)
        return self[name]


def received_message(index: Index, func: FuncRef, line: int, members: tuple[str, ...]) -> dict[int, set[str]] | None:
    """The parts of the message `<socket>.recv_multipart()` at `line` of `func` returns, by
    position, each the members the sends put there (_received); a part whose values are not all
    read is left out (anything). None when the call or how many parts it is unpacked into is not
    found, or no send answers it."""
    calls = [n for n in index.calls_in(func) if n.lineno == line and isinstance(n.func, ast.Attribute)
             and n.func.attr == RECEIVE and not n.args]
    if len(calls) != 1:
        return None
    key = ("received", id(func.node), line)
    if key in index.derived:
        return cast("dict[int, set[str]] | None", index.derived[key])
    c = _Collecting(set(), [], None, members, _CallersByName(index), index)
    arity = _message_arity(func, calls[0])
    parts: dict[int, set[str]] = {}
    for position in range(arity or 0):
        sent = _received(c, calls[0], func, position, arity or 0, frozenset())
        if sent is None:
            break
        holds, unknown = set[str](), list[str]()
        for part, sender, send in sent:
            _collect(part, sender, _parents(sender.node), send, holds, unknown, None, members, c.call_sites, index)
        if holds and not unknown:
            parts[position] = holds
    found = parts or None
    index.derived[key] = found
    return found


def _message_arity(func: FuncRef, call: ast.Call) -> int | None:
    """How many names the received message is unpacked into: `a, b = call` or `msg = call`
    then `a, b = msg`."""
    named: set[str] = set()
    for n in walk(func.node):
        if isinstance(n, ast.Assign) and n.value is call:
            if _unpacked(n.targets):
                return _unpacked(n.targets)
            named |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    for n in walk(func.node):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in named and _unpacked(n.targets):
            return _unpacked(n.targets)
    return None


def _unpacked(targets: list[ast.expr]) -> int | None:
    """How many names an assignment's tuple target unpacks (None: no such target, or a starred one)."""
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in t.elts):
            return len(t.elts)
    return None


def narrowed_by_guard(name: str, site: ast.AST, parents: dict[int, ast.AST], members: tuple[str, ...]) -> set[str] | None:
    node = site
    while id(node) in parents:
        parent = parents[id(node)]
        if isinstance(parent, ast.If) and node in parent.body:
            test = parent.test
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) \
                    and test.left.id == name and isinstance(test.ops[0], (ast.Eq, ast.Is, ast.In)):
                tokens = _member_tokens(test.comparators[0], members)
                if tokens is not None:
                    return tokens
        node = parent
    return None


def _member_tokens(value: ast.AST, members: tuple[str, ...]) -> set[str] | None:
    if isinstance(value, ast.Attribute) and value.attr in members:
        return {value.attr}
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        parts = [_member_tokens(e, members) for e in value.elts]
        if all(p is not None for p in parts):
            return set[str]().union(*(p for p in parts if p is not None))
    return None
