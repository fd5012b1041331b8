"""Graph stage for the queue: find its drain loop, walk every path for every poll state, and
build a graph whose nodes are sites (poll, checks, keep/done appends, releases, aborts,
raises) and outcomes, and whose edges carry the set of states that flow along them.

Nothing here names SGLang: the queue, calls and enum come from the rules pack.
"""

from __future__ import annotations

import ast
import bisect
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple, Sequence

import libcst as cst

from kvtrace.effects import QueueEffects
from kvtrace.flow import NOT_SITES, Companion, CstBody, Event, Explorer, Frame, Options, PathState, acting_events, ast_constant
from kvtrace.index import ClassInfo, FuncRef, Index
from kvtrace.managers import ManagerFacts
from kvtrace.model import OUTCOME_ORDER, Backend, EventKind, Evidence, ModeFate, Outcome, Site, StateFate, StateVerdict
from kvtrace.packs import Pack, matches
from kvtrace.parse import ParsedModule
from kvtrace.parse import walk as walk_ast
from kvtrace.syntax import dotted, mentions_attr, walk
from kvtrace.states import KEEP, POLLS, REQ, Domain, Val

MAX_MODES = 4  # distinct ways the callers in the tree bind the drain's parameters

if TYPE_CHECKING:
    from kvtrace.backends import SenderAnalysis

ROOT = ("root",)


_QUERY_ATTRS = frozenset({"detail", "taken"})  # node attributes the release map reads, not exported


class StateGraph:
    """Directed graph of sites; each edge carries the set of states that flow along it.

    A dict of dicts rather than networkx: the analysis only adds nodes and edges and asks for a
    node's in-edges, and importing networkx cost 0.1-0.4 s of every scan."""

    def __init__(self) -> None:
        self.nodes: dict[tuple, dict] = {}
        self.edges: dict[tuple[tuple, tuple], dict] = {}
        self._in: dict[tuple, list[tuple]] = {}
        self._out: dict[tuple, list[tuple]] = {}

    def __contains__(self, node: tuple) -> bool:
        return node in self.nodes

    def add_node(self, node: tuple, **attrs: object) -> None:
        self.nodes.setdefault(node, {}).update(attrs)

    def has_edge(self, a: tuple, b: tuple) -> bool:
        return (a, b) in self.edges

    def add_edge(self, a: tuple, b: tuple, **attrs: object) -> None:
        self.add_node(a)
        self.add_node(b)
        if (a, b) not in self.edges:
            self._in.setdefault(b, []).append(a)
            self._out.setdefault(a, []).append(b)
        self.edges.setdefault((a, b), {}).update(attrs)

    def in_edges(self, node: tuple) -> list[tuple[tuple, tuple, dict]]:
        return [(a, node, self.edges[a, node]) for a in self._in.get(node, [])]

    def as_data(self) -> dict[str, list]:
        """Plain lists and strings ({"nodes": [(node, attrs)], "edges": [(a, b, attrs)]}) for the
        report: it goes into the cache as JSON, and GraphML/DOT writers take only plain values."""
        def plain(node: tuple) -> tuple:
            return tuple(str(part) if isinstance(part, str) else part for part in node)

        nodes = [(plain(node), {k: str(v) if k == "kind" else v for k, v in data.items() if k not in _QUERY_ATTRS})
                 for node, data in self.nodes.items()]
        edges = [(plain(a), plain(b), data) for (a, b), data in self.edges.items()]
        return {"nodes": nodes, "edges": edges}

    def successors(self, node: tuple, state: str) -> list[tuple]:
        """The nodes reached from `node` along an edge that carries `state`."""
        return [b for b in self._out.get(node, []) if state in self.edges[node, b]["states"]]


@dataclass
class Drain:
    func: FuncRef
    loop: cst.For
    body: CstBody
    cls: ClassInfo | None
    keep_name: str
    initial: dict[str, str]  # name -> role token, or "@state" for the poll value
    poll_line: int | None
    post_effects: dict[str, list[Event]]  # done-list name -> releases/aborts after the loop
    removal_set: str | None = None  # the queue is filtered by this set of indices: not added = kept
    list_attr: str | None = None  # for a queue held by another object: its list attribute (`.queue`)
    # When the poll loop is in a helper the drain calls first: the drain's own loops over the
    # queue, run after it (they remove requests by what the poll pass left on them).
    then: list[tuple[FuncRef, CstBody, cst.For, dict[str, str]]] = field(default_factory=list)
    owner: FuncRef | None = None  # the function that reassigns the queue (func, unless it polls in a helper)
    # The index names of the owner's loops over the queue, when it binds the removal set to an
    # empty set and nothing else binds it (see QueueEffects.removal_index).
    removal_index: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Mode:
    """One way the callers in the tree run the drain: the values of its defaulted parameters.

    `passed` names the parameters a caller gives in this mode (empty: every one is at its
    default, which is also the mode when no caller in the tree passes any)."""

    label: str
    bindings: tuple[tuple[str, Val], ...]
    passed: tuple[str, ...]
    callers: tuple[Evidence, ...]


class QueuePath(NamedTuple):
    """One path through one iteration of the drain loop for one poll state."""

    events: list[Event]
    outcome: Outcome


@dataclass
class QueueAnalysis:
    """The analysed queue: its drain loop, every path per poll state, and the graph of sites
    those paths make. Rules and reports ask it questions rather than reading the paths."""

    drain: Drain | None
    graph: StateGraph
    paths: dict[str, list[QueuePath]]  # state -> its paths, in exploration order, every mode together
    static_sites: list[Site]
    truncated: list[str] = field(default_factory=list)
    modes: list[Mode] = field(default_factory=list)
    mode_paths: list[dict[str, list[QueuePath]]] = field(default_factory=list)  # per mode, in `modes`' order
    # Functions the analysis had to read (a drain loop, a helper it enters) that libcst could
    # not parse: the queue's analysis is incomplete and the scan says so.
    unparsed: list[str] = field(default_factory=list)
    # What the scan could not see of the drain's callers (scanning the backends' folder alone):
    # the parameters are then analysed free, and the scan is incomplete.
    unseen_callers: list[str] = field(default_factory=list)

    def mode_fates(self, state: str) -> list[ModeFate]:
        """The state's fate in each mode: its outcomes, and where it waits (kept on a path
        that never tests the poll value: a guard on a parameter or a flag holds it)."""
        return [mode_fate(mode, paths.get(state, [])) for mode, paths in zip(self.modes, self.mode_paths)]

    def deciding(self, state: str) -> list[tuple[Mode, list[QueuePath], list[QueuePath]]]:
        """Per mode: the paths on which the poll value decides (a test of it), and all paths."""
        out = []
        for mode, paths in zip(self.modes, self.mode_paths):
            state_paths = paths.get(state, [])
            out.append((mode, [p for p in state_paths if _tests_poll(p.events)], state_paths))
        return out

    def fate(self, state: str) -> list[Outcome]:
        """The outcomes reachable from the poll along edges that carry `state`."""
        reached: set[tuple] = set()
        todo = [ROOT]
        while todo:
            node = todo.pop()
            for nxt in self.graph.successors(node, state):
                if nxt not in reached:
                    reached.add(nxt)
                    todo.append(nxt)
        return [o for o in OUTCOME_ORDER if ("outcome", o) in reached]

    def paths_of(self, state: str, *outcomes: Outcome) -> list[list[Event]]:
        """The event lists of the paths `state` takes (those ending in one of `outcomes`, if given)."""
        return [p.events for p in self.paths.get(state, []) if not outcomes or p.outcome in outcomes]

    def loop_line(self) -> int | None:
        """The line of the drain loop's `for` (None without a drain loop)."""
        return self.drain.body.line(self.drain.loop) if self.drain is not None else None

    def drain_ref(self) -> Evidence | None:
        drain = self.drain
        return Evidence(drain.func.path, drain.body.line(drain.loop), drain.func.qualname) if drain else None

    def release_map(self, members: tuple[str, ...]) -> list[Site]:
        """Every site of the queue, each with the states that reach it (a check: that take its
        true branch), read from the graph; plus the entries, reassignments and gauges found
        without paths, and the poll. A helper is a site only when it (or one it calls) acts on
        the request. Sorted by path, line and kind."""
        order = {m: i for i, m in enumerate(members)}
        sites: list[Site] = list(self.static_sites)
        drain = self.drain
        if drain is not None and drain.poll_line is not None:
            sites.append(Site(EventKind.POLL, drain.func.path, drain.poll_line, drain.func.qualname))
        if drain is not None:
            nodes = [(node, data) for node, data in self.graph.nodes.items() if node != ROOT and node[0] != "outcome"]
            relevant = _helpers_with_effects([(data["kind"], data["function"], data["detail"]) for _, data in nodes])
            for node, data in nodes:
                kind = data["kind"]
                if kind is EventKind.HELPER and data["detail"] not in relevant:
                    continue  # a helper that does nothing to the request is not part of the map
                reached = data["taken"] if kind is EventKind.CHECK else {
                    s for _, _, edge in self.graph.in_edges(node) for s in edge["states"]}
                note = data["detail"] if kind is not EventKind.CHECK else ""
                sites.append(Site(kind, data["path"], data["line"], data["function"],
                                  tuple(sorted(reached, key=lambda s: order.get(s, -1))), note))
        unique = {(s.kind, s.path, s.line): s for s in sites}
        if len(self.modes) > 1:  # a site only some modes reach says which (the PP branch's checks)
            reached_in = [{(e.path, e.line) for paths in by_state.values() for qp in paths for e in qp.events}
                          for by_state in self.mode_paths]
            for key, site in unique.items():
                labels = [m.label for m, seen in zip(self.modes, reached_in) if (site.path, site.line) in seen]
                if labels and len(labels) < len(self.modes) and site.kind is not EventKind.POLL:
                    unique[key] = replace(site, mode="; ".join(labels))
        return sorted(unique.values(), key=lambda s: (s.path, s.line, s.kind))

    def state_fates(self, members: tuple[str, ...]) -> dict[str, StateFate]:
        """Each state's fate and the lines its paths pass, first note per line."""
        states: dict[str, StateFate] = {}
        for state in members:
            evidence: dict[tuple[str, int], tuple[str, EventKind | None]] = {}
            for events, outcome in self.paths.get(state, []):
                for e in events:
                    if e.kind in NOT_SITES:
                        continue
                    note = {"T": "check: true", "F": "check: false"}.get(e.detail, f"{e.kind}: {e.detail}") \
                        if e.kind is EventKind.CHECK else f"{e.kind}: {e.detail}" if e.detail else str(e.kind)
                    evidence.setdefault((e.path, e.line), (note, e.kind))
                if self.drain is not None and outcome is Outcome.DROPPED:
                    # Nothing marks where a dropped request goes: point at the loop it falls out of.
                    evidence[(self.drain.func.path, self.drain.body.line(self.drain.loop))] = \
                        ("dropped: no keep, done, release or abort on this path", None)
            fate = self.fate(state) if self.drain is not None else []
            states[state] = StateFate(fate, [Evidence(p, line, n, kind) for (p, line), (n, kind) in sorted(evidence.items())],
                                      self.mode_fates(state) if self.drain is not None else [])
        return states


def _helpers_with_effects(sites: list[tuple[EventKind, str, str]]) -> set[str]:
    """Functions that (directly or through the helpers they call) act on the request, from the
    sites (kind, function, detail); a helper site's detail is the function it enters."""
    effectful = {function for kind, function, _ in sites if kind is not EventKind.HELPER}
    calls = [(function, detail) for kind, function, detail in sites if kind is EventKind.HELPER]
    changed = True
    while changed:
        changed = False
        for caller, callee in calls:
            if callee in effectful and caller not in effectful:
                effectful.add(caller)
                changed = True
    return effectful


@dataclass
class ScanModel:
    """The analysed scan as one structure: the queue (its graph and paths) and the senders with
    their way-out verdicts. Rules and reports query it instead of reading raw paths or syntax."""

    queue: QueueAnalysis
    senders: list[SenderAnalysis]
    domain: Domain

    @property
    def managers(self) -> list[ManagerFacts]:
        """One ManagerFacts per manager a sender works with, naming the backends that use it."""
        found: dict[tuple[str, int], ManagerFacts] = {}
        for sender in self.senders:
            if sender.manager is not None:
                key = (sender.manager.cls.path, sender.manager.cls.line)
                known = found.get(key, sender.manager)
                found[key] = replace(known, backends=known.backends + (sender.backend.name,))
        return list(found.values())

    def fate(self, state: str) -> list[Outcome]:
        return self.queue.fate(state)

    def paths(self, state: str, *outcomes: Outcome) -> list[list[Event]]:
        return self.queue.paths_of(state, *outcomes)

    def release_map(self) -> list[Site]:
        return self.queue.release_map(self.domain.members)

    def deciding(self, state: str) -> list[tuple[Mode, list[QueuePath], list[QueuePath]]]:
        """Per mode of the drain: the paths of `state` that test the poll value, and all of them."""
        return self.queue.deciding(state)

    def mode_fates(self, state: str) -> list[ModeFate]:
        return self.queue.mode_fates(state)

    def state_fates(self) -> dict[str, StateFate]:
        return self.queue.state_fates(self.domain.members)

    def backend(self, name: str) -> Backend | None:
        return next((s.backend for s in self.senders if s.backend.name == name), None)

    def way_out(self, backend: str, state: str) -> StateVerdict | None:
        """How `backend` gets a request out of `state` (None: its poll() never returns it, or
        the state is terminal, or no such backend)."""
        found = self.backend(backend)
        return found.way_out(state) if found is not None else None

    def returning(self, state: str) -> list[str]:
        """The backends whose poll() can return `state`."""
        return [s.backend.name for s in self.senders if state in s.backend.returns]


def _tests_poll(events: list[Event]) -> bool:
    return any(e.kind is EventKind.CHECK for e in events)


def mode_fate(mode: Mode, state_paths: list[QueuePath]) -> ModeFate:
    waits: dict[tuple[str, int], str] = {}
    rest: set[Outcome] = set()
    for events, outcome in state_paths:
        if outcome is Outcome.KEPT and not _tests_poll(events):
            guard = next((e for e in reversed(events) if e.kind is EventKind.GUARD), None)
            keep = next((e for e in reversed(events) if e.kind is EventKind.KEEP), None)
            where = guard or keep
            if where is not None:
                waits.setdefault((where.path, where.line), guard.detail if guard else "")
                continue
        rest.add(outcome)
    outcomes = {o for _, o in state_paths}
    return ModeFate(mode.label, [o for o in OUTCOME_ORDER if o in outcomes], [o for o in OUTCOME_ORDER if o in rest],
                    [Evidence(p, line, n) for (p, line), n in sorted(waits.items())])


def find_modes(index: Index, func: FuncRef, domain: Domain, unseen_out: list[str] | None = None) -> tuple[list[Mode], list[str]]:
    """The modes of the drain function `func`, from the call sites of its name in the tree.

    A parameter with a default that the function reads is a mode parameter. Each call site
    binds it to its default (not passed), to a constant, or to a value kvtrace cannot read;
    the distinct bindings are the modes. With no caller passing it, it is its default: a branch
    that needs another value is dead. A value kvtrace cannot read stands for "not the default"
    when another mode covers the default (the default's paths are that mode's), else for any
    value. Returns the modes and what was cut (more than MAX_MODES)."""
    node = func.node
    args = node.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    defaults: dict[str, ast.expr] = dict(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    if func.owner is not None and positional and not any(
            getattr(d, "id", None) == "staticmethod" for d in node.decorator_list):
        positional = positional[1:]
    read = {n.id for n in walk_ast(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    params = [p for p in defaults if p in read]
    default_of = {p: ast_constant(defaults[p], domain) for p in params}
    universe = domain.universe
    # Per call site: for each parameter, None (its default), or (what it is given, its value).
    sites: dict[tuple, list[Evidence]] = {}
    for caller, call in index.callers(func.name):
        if caller is func:
            continue
        starred = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
        given: list[tuple[str, Val | None] | None] = []
        for p in params:
            keyword = next((k.value for k in call.keywords if k.arg == p), None)
            at = positional.index(p) if p in positional else None
            if keyword is None and at is not None and at < len(call.args) and not starred:
                keyword = call.args[at]
            if keyword is None and not starred:
                given.append(None)
                continue
            value = ast_constant(keyword, domain) if keyword is not None else None
            if value is not None and value == default_of[p]:
                given.append(None)  # passes the default itself
            else:
                written = ast.unparse(keyword) if keyword is not None else "*args"
                given.append((written if value is not None else "", value))
        sites.setdefault(tuple(given), []).append(
            Evidence(caller.path, call.lineno, f"{caller.qualname} calls {func.name}"))
    if not sites:
        sites[tuple(None for _ in params)] = []
    # When the drain's object is assembled outside the view, its other parts call it unseen
    # (SGLang's pipeline-parallel loop is another base of the Scheduler, in managers/): a
    # parameter no caller in view passes is still free, so it also gets a mode where it is
    # passed a value kvtrace cannot read, and the scan says what it could not see.
    unseen: set[tuple] = set()
    for at, p in enumerate(params if not _callers_in_view(index, func) else ()):
        if all(key[at] is None for key in sites):
            if unseen_out is not None:
                unseen_out.append(f"callers of {func.qualname} ({func.path}:{func.line}) outside the scanned folder are "
                                  f"not seen: {p} is analysed at its default and passed (no caller in view); scan the "
                                  f"folder that holds the scheduler to bind it as its callers do")
            key = tuple(("", None) if i == at else None for i in range(len(params)))
            if key not in sites:
                sites[key] = []
                unseen.add(key)
    keys = sorted(sites, key=lambda k: (sum(g is not None for g in k), str(k)))
    cut = [f"{func.path}:{func.line} ({len(keys) - MAX_MODES} more ways of calling {func.name} not separated)"] \
        if len(keys) > MAX_MODES else []
    keys = keys[:MAX_MODES]
    defaulted = {p for key in keys for p, g in zip(params, key) if g is None}
    modes: dict[tuple, Mode] = {}
    for key in keys:
        bindings: list[tuple[str, Val]] = []
        passed: list[str] = []
        shown: list[str] = []
        for p, g in zip(params, key):
            default = default_of[p]
            if g is None:
                bindings.append((p, default if default is not None else universe))
                continue
            passed.append(p)
            text, given_value = g
            value = given_value if given_value is not None else (
                universe - default if p in defaulted and default is not None else universe)
            bindings.append((p, value))
            shown.append(f"{p}={text}" if text else f"{p} passed")
        if key in unseen:
            shown = [f"{text} (no caller in view)" for text in shown]
        label = ", ".join(shown) if shown else (
            "default" if not params else ", ".join(f"{p}={ast.unparse(defaults[p])}" for p in params))
        binding = tuple(bindings)
        if binding in modes:  # two callers that bind alike are one mode
            old = modes[binding]
            modes[binding] = replace(old, callers=old.callers + tuple(sites[key]))
        else:
            modes[binding] = Mode(label, binding, tuple(passed), tuple(sites[key]))
    return list(modes.values()), cut


def find_enum(index: Index, pack: Pack) -> tuple[Domain, Evidence] | None:
    """The poll enum's members, read from its class body (plain ints or an Enum)."""
    candidates = index.classes.get(pack.enum, [])
    for info in candidates:
        members: list[str] = []
        values: list[int | None] = []
        for stmt in info.node.body:
            target = value = None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                target, value = stmt.targets[0].id, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                target, value = stmt.target.id, stmt.value
            if target is None or target.startswith("_"):
                continue
            members.append(target)
            values.append(value.value if isinstance(value, ast.Constant) and isinstance(value.value, int) else None)
        if members:
            terminal = tuple(t for t in pack.terminal if t in members)
            return Domain(pack.enum, tuple(members), tuple(values), terminal), Evidence(info.path, info.line, f"class {pack.enum}")
    return None


def find_drains(index: Index, pack: Pack, within: list[FuncRef] | None = None,
                unparsed: list[str] | None = None) -> list[Drain]:
    """The drain loops of the queue. A function that is one by its `ast` shape but that libcst
    cannot parse is added to `unparsed` (the scan must say so, never call the queue undrained)."""
    drains = []
    for func in within if within is not None else index.all_functions():
        if pack.queue not in "\n".join(func.module.lines[func.node.lineno - 1 : func.node.end_lineno]):
            continue
        keep = _reassigned_name(func.node, pack.queue)
        removal = _removal_set(func.node, pack.queue) if keep is None else None
        loops = [n for n in walk_ast(func.node) if isinstance(n, ast.For) and mentions_attr(n.iter, pack.queue)]
        if (keep is None and removal is None) or not loops:
            continue
        if index.cst(func) is None:
            if unparsed is not None:
                unparsed.append(_unparsed_name(func))
            continue
        drain = _build_drain(index, pack, func, keep or "", removal, unparsed)
        if drain is not None:
            drains.append(drain)
    # A drain that reads poll values first (a removal-filtered drain may poll in a helper).
    return sorted(drains, key=lambda d: not any(role == "@state" for role in d.initial.values()))


def _reassigned_name(func: ast.AST, queue: str) -> str | None:
    for node in walk_ast(func):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == queue and isinstance(node.value, ast.Name):
                    return node.value.id
    return None


def _removal_set(func: ast.AST, queue: str) -> str | None:
    """`self.<queue> = [x for i, x in enumerate(self.<queue>) if i not in S]`: the set S."""
    for node in walk_ast(func):
        if not isinstance(node, ast.Assign) or not any(isinstance(t, ast.Attribute) and t.attr == queue
                                                       for t in node.targets):
            continue
        comp = node.value
        if isinstance(comp, ast.ListComp) and len(comp.generators) == 1 and mentions_attr(comp.generators[0].iter, queue):
            for test in comp.generators[0].ifs:
                if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotIn) \
                        and isinstance(test.comparators[0], ast.Name):
                    return test.comparators[0].id
    return None


def _removal_index(func: ast.AST, removal: str, queue: str) -> frozenset[str]:
    """The index names `i` of `for i, x in enumerate(self.<queue>)` in `func`, when `func` binds
    `removal` once, to `set()`, and it is no parameter: then the set holds this call's additions
    only. Else none (a membership test of it stays undecided)."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return frozenset()
    params = func.args.posonlyargs + func.args.args + func.args.kwonlyargs + [a for a in (func.args.vararg, func.args.kwarg) if a]
    if any(a.arg == removal for a in params):
        return frozenset()
    binds = [node for node in walk_ast(func) if isinstance(node, ast.Name) and node.id == removal
             and isinstance(node.ctx, (ast.Store, ast.Del))]
    fresh = [node for node in walk_ast(func) if isinstance(node, ast.Assign) and len(node.targets) == 1
             and isinstance(node.targets[0], ast.Name) and node.targets[0].id == removal
             and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
             and node.value.func.id == "set" and not node.value.args and not node.value.keywords]
    if len(binds) != 1 or len(fresh) != 1 or any(isinstance(n, (ast.Global, ast.Nonlocal)) and removal in n.names
                                                  for n in walk_ast(func)):
        return frozenset()
    names = set()
    for node in walk_ast(func):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Name) \
                and node.iter.func.id == "enumerate" and node.iter.args and mentions_attr(node.iter.args[0], queue) \
                and isinstance(node.target, ast.Tuple) and len(node.target.elts) == 2 \
                and isinstance(node.target.elts[0], ast.Name):
            names.add(node.target.elts[0].id)
    return frozenset(names)


class HeldQueue(NamedTuple):
    """A queue that is an object: the class that keeps and drains its list, the list attribute,
    the construction that binds it (`self.<queue> = SomeQueue(...)`) and that file's path."""

    cls: ClassInfo
    attr: str
    built: ast.Assign
    path: str


def held_queue(index: Index, pack: Pack) -> HeldQueue | None:
    """A queue that is an object (`self.<queue> = SomeQueue(...)`) whose class keeps the requests
    in a list attribute and drains it itself.

    The list is the attribute the class polls (`poll_and_all_reduce([r.receiver for r in self.X])`)
    and reassigns; the outside reads it as `self.<queue>.X` (the gauge)."""
    for module in index.modules.values():
        for node in index.assignments(module):
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                continue
            if not any(isinstance(t, ast.Attribute) and t.attr == pack.queue for t in node.targets):
                continue
            name = dotted(node.value.func, calls=True).rsplit(".", 1)[-1] if dotted(node.value.func, calls=True) else ""
            for cls in index.classes.get(name, []):
                attr = _polled_list(index, pack, cls)
                if attr is not None:
                    return HeldQueue(cls, attr, node, module.source.path)
    return None


def holder_companion(index: Index, held: HeldQueue) -> Companion | None:
    """The object that builds a held queue and hands itself to it (`PrefillBootstrapQueue(...,
    scheduler=self)`, kept as `self.scheduler = scheduler`): the drain's calls through that
    attribute (`self.scheduler.handle_bootstrap_failure(req)`) run the builder's methods, found
    through the class of the method that builds the queue (its MRO: the mixins it composes)."""
    node, call = held.built, held.built.value
    assert isinstance(call, ast.Call)  # held_queue keeps constructions only
    builder = _enclosing_method(index, held.path, node.lineno)
    if builder is None or builder.owner is None or not builder.node.args.args:
        return None
    init = next((c.methods["__init__"] for c in index.mro(held.cls) if "__init__" in c.methods), None)
    if init is None:
        return None
    me = builder.node.args.args[0].arg
    params = [a.arg for a in init.node.args.args[1:]]
    handed = [kw.arg for kw in call.keywords if isinstance(kw.value, ast.Name) and kw.value.id == me]
    handed += [params[i] for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == me and i < len(params)]
    attrs = frozenset(attr for name in handed if name for attr in _kept_as(index, init, name))
    # Only a call handed the request can answer, end or release it: the others are left
    # unknown, as before (entering them all added a quarter to a decode scan).
    return Companion(builder.owner, attrs, given=REQ) if attrs else None


def _enclosing_method(index: Index, path: str, line: int) -> FuncRef | None:
    inside = [f for f in index.all_functions() if f.path == path and f.owner is not None
              and f.node.lineno <= line <= (f.node.end_lineno or f.node.lineno)]
    return max(inside, key=lambda f: f.node.lineno, default=None)


def _kept_as(index: Index, init: FuncRef, param: str) -> list[str]:
    """The attributes __init__ keeps a parameter in (`self.scheduler = scheduler`)."""
    return [t.attr for node in index.nodes_in(init, (ast.Assign,))
            if isinstance(node.value, ast.Name) and node.value.id == param
            for t in node.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"]


def _polled_list(index: Index, pack: Pack, cls: ClassInfo) -> str | None:
    reassigned: set[str] = set()
    polled: list[str] = []
    for c in index.mro(cls):
        for func in c.methods.values():
            for node in walk_ast(func.node):
                if isinstance(node, ast.Assign) and func.name != "__init__":
                    reassigned.update(t.attr for t in node.targets if isinstance(t, ast.Attribute)
                                      and isinstance(t.value, ast.Name) and t.value.id == "self")
                if isinstance(node, ast.Call) and node.args:
                    callee = dotted(node.func, calls=True) or ""
                    if pack.is_poll_call(callee):
                        polled += [n.attr for a in node.args for n in walk_ast(a) if isinstance(n, ast.Attribute)
                                   and isinstance(n.value, ast.Name) and n.value.id == "self"]
    return next((attr for attr in polled if attr in reassigned), None)


def _unparsed_name(func: FuncRef) -> str:
    return f"{func.path}:{func.line} {func.qualname}()"


def _build_drain(index: Index, pack: Pack, func: FuncRef, keep: str, removal: str | None = None,
                 unparsed: list[str] | None = None) -> Drain | None:
    found = _queue_loop(index, pack, func)
    if found is None:
        return None
    loop, body, initial, poll_line = found
    owner_func, owner_body = func, body
    if removal is not None and not any(role == "@state" for role in initial.values()) and func.owner is not None:
        # A filtered queue may read its poll values in a helper the drain calls first (a pass
        # that marks requests) and remove them in its own loops: analyse the loop that polls.
        for node in walk_ast(func.node):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                helper = index.find_method(func.owner, node.func.attr)
                if helper is not None and helper is not func and unparsed is not None and index.cst(helper) is None \
                        and any(isinstance(n, ast.For) for n in walk_ast(helper.node)):
                    unparsed.append(_unparsed_name(helper))  # it may be the pass that polls
                polled = _queue_loop(index, pack, helper) if helper is not None and helper is not func else None
                if helper is not None and polled is not None and any(role == "@state" for role in polled[2].values()):
                    then = _own_loops(pack, owner_func, owner_body)
                    func, (loop, body, initial, poll_line) = helper, polled
                    break
    if keep:
        initial[keep] = KEEP
    drain = Drain(func, loop, body, func.owner, keep, initial, poll_line,
                  _post_loop_effects(index, pack, owner_func, owner_body, loop), removal)
    drain.owner = owner_func
    if removal is not None:
        drain.removal_index = _removal_index(owner_func.node, removal, pack.queue)
    if func is not owner_func:
        drain.then = then
    return drain


def _own_loops(pack: Pack, func: FuncRef, body: CstBody) -> list[tuple[FuncRef, CstBody, cst.For, dict[str, str]]]:
    """The top-level loops of `func` over the queue, in order, with their names' roles."""
    loops = []
    for stmt in body.node.body.body if isinstance(body.node.body, cst.IndentedBlock) else []:
        if isinstance(stmt, cst.For) and mentions_attr(stmt.iter, pack.queue):
            roles: dict[str, str] = {}
            _bind_loop_target(stmt.target, stmt.iter, pack.queue, {}, roles)
            loops.append((func, body, stmt, roles))
    return loops


def _queue_loop(index: Index, pack: Pack, func: FuncRef) -> tuple[cst.For, CstBody, dict[str, str], int | None] | None:
    """The loop of `func` over the queue (the first one that pairs requests with poll values,
    else the first), its body, the roles of its names, and the line of the poll call."""
    cst_func = index.cst(func)
    if cst_func is None:
        return None
    body = CstBody(cst_func.node, cst_func.line)
    loops: list[cst.For] = []
    poll_vars: dict[str, int] = {}

    class Find(cst.CSTVisitor):
        def visit_For(self, node: cst.For) -> None:
            if mentions_attr(node.iter, pack.queue):
                loops.append(node)

        def visit_Assign(self, node: cst.Assign) -> None:
            if isinstance(node.value, cst.Call) and pack.is_poll_call(dotted(node.value.func)):
                for t in node.targets:
                    if isinstance(t.target, cst.Name):
                        poll_vars[t.target.value] = body.line(node)

    cst_func.node.visit(Find())
    if not loops:
        return None
    poll_line = None
    base: dict[str, str] = {}
    for name, line in poll_vars.items():
        base[name] = POLLS
        poll_line = line
    choices = []
    for loop in loops:
        initial = dict(base)
        _bind_loop_target(loop.target, loop.iter, pack.queue, poll_vars, initial)
        choices.append((loop, initial))
    loop, initial = next(((c, i) for c, i in choices if "@state" in i.values()), choices[0])
    return loop, body, initial, poll_line


def _bind_loop_target(target: cst.BaseExpression, it: cst.BaseExpression, queue: str,
                      poll_vars: dict[str, int], initial: dict[str, str]) -> None:
    """Give the loop's names their roles: the queued request, and the poll value."""
    if isinstance(it, cst.Call) and dotted(it.func) == "enumerate" and it.args:
        if isinstance(target, cst.Tuple) and len(target.elements) == 2:
            _bind_loop_target(target.elements[1].value, it.args[0].value, queue, poll_vars, initial)
        return
    if isinstance(it, cst.Call) and dotted(it.func) == "zip":
        if isinstance(target, (cst.Tuple, cst.List)):
            pairs = list(zip(target.elements, it.args))
            for element, arg in pairs:
                _bind_loop_target(element.value, arg.value, queue, poll_vars, initial)
            # zip(queue, values): the sequence zipped with the queue holds one poll value per
            # request, however it was computed (a helper, a comprehension, a renamed call).
            if len(pairs) == 2 and not any(role == "@state" for role in initial.values()):
                for element, arg in pairs:
                    if isinstance(element.value, cst.Name) and element.value.value not in initial \
                            and not mentions_attr(arg.value, queue):
                        initial[element.value.value] = "@state"
        return
    if isinstance(target, cst.Name):
        if mentions_attr(it, queue):
            initial[target.value] = REQ
        elif isinstance(it, cst.Name) and it.value in poll_vars:
            initial[target.value] = "@state"


def _post_loop_effects(index: Index, pack: Pack, func: FuncRef, body: CstBody, drain_loop: cst.For) -> dict[str, list[Event]]:
    """What is done, after the drain loop, for every request of a finished list: releases,
    aborts and answers in a loop over the list, or a call given the whole list."""
    effects: dict[str, list[Event]] = {}

    def kind_of(callee: str) -> EventKind | None:
        return EventKind.RELEASE if pack.is_release(callee) else EventKind.ABORT if pack.is_abort(callee) \
            else EventKind.ANSWER if pack.is_answer(callee) else None

    def through(call: cst.Call) -> list[tuple[EventKind, str]]:
        """The pack's calls a call makes: itself, or those in the body of the method of the
        drain's class it names (`self._release_request(decode_req)` -> `release_kv_cache`)."""
        callee = dotted(call.func)
        if (kind := kind_of(callee)):
            return [(kind, callee)]
        me = callee.split(".")
        if len(me) != 2 or me[0] != "self" or func.owner is None:
            return []
        helper = index.find_method(func.owner, me[1])
        if helper is None or helper is func:
            return []
        return [(kind, name) for n in walk_ast(helper.node) if isinstance(n, ast.Call)
                for name in [dotted(n.func)] if (kind := kind_of(name))]

    children: dict[int, Sequence[cst.CSTNode]] = {}  # a loop's body is walked twice
    for node in walk(body.node, skip=drain_loop, memo=children):
        if isinstance(node, cst.For) and (listed := _iterated_list(node.iter)) is not None:
            # `for req in done:`, `for i, req in enumerate(done):`, `for (i, req, _), hold in zip(failed, held):`
            for inner in walk(node.body, memo=children):
                if isinstance(inner, cst.Call):
                    for kind, callee in through(inner):
                        effects.setdefault(listed, []).append(Event(
                            kind, func.path, body.line(inner), func.qualname, callee + " (after the loop)", after_loop=True))
        elif isinstance(node, cst.Call) and (call_kind := kind_of(dotted(node.func))):
            for arg in node.args:
                if isinstance(arg.value, cst.Name):
                    effects.setdefault(arg.value.value, []).append(Event(
                        call_kind, func.path, body.line(node), func.qualname, dotted(node.func) + " (after the loop)", after_loop=True))
    return effects


def _iterated_list(it: cst.BaseExpression) -> str | None:
    """The list a loop goes over: a name, or the first sequence of `enumerate()` / `zip()`."""
    if isinstance(it, cst.Name):
        return it.value
    if isinstance(it, cst.Call) and dotted(it.func) in ("enumerate", "zip") and it.args \
            and isinstance(it.args[0].value, cst.Name) and it.args[0].star == "":
        return it.args[0].value.value
    return None


def outcome_of(events: tuple[Event, ...] | list[Event], term: str | None, removal: bool = False) -> Outcome:
    if term == "raise":
        return Outcome.RAISES
    if term == "return":
        return Outcome.KEPT  # returned before `self.<queue> = ...`: the queue is unchanged
    kinds = {e.kind for e in events}
    if removal:
        # The queue is filtered by a set of indices: a request stays unless it was added to it.
        return Outcome.LEAVES if kinds & {EventKind.DONE, EventKind.REQUEUE} else Outcome.KEPT
    if EventKind.KEEP in kinds:
        return Outcome.KEPT
    if kinds & {EventKind.DONE, EventKind.REQUEUE, EventKind.RELEASE, EventKind.ABORT}:
        return Outcome.LEAVES
    return Outcome.DROPPED


# What exploring a queue's drain finds, per mode (in find_modes' order) the paths per poll state,
# and what the exploration alone cut short and could not parse (analyse_queue adds the rest).
Explored = tuple[list[dict[str, list[QueuePath]]], list[str], list[str]]


def analyse_queue(index: Index, pack: Pack, domain: Domain, explored: Explored | None = None) -> QueueAnalysis:
    """The queue's analysis; its exploration taken from `explored` when another process did it
    (explore_queue on the same tree), else done here."""
    unparsed: list[str] = []
    planned = _plan(index, pack, unparsed)
    if isinstance(planned, QueueAnalysis):
        return planned
    drain, static, list_pack, companion = planned
    unseen: list[str] = []
    modes, truncated = find_modes(index, drain.func, domain, unseen)
    if explored is None:
        mode_paths = _explore_modes(index, list_pack, domain, drain, modes, truncated, unparsed, companion)
    else:
        mode_paths = explored[0]
        truncated += explored[1]
        unparsed += explored[2]
    paths: dict[str, list[QueuePath]] = mode_paths[0] if len(mode_paths) == 1 else {}
    for found in mode_paths if len(mode_paths) > 1 else []:
        for state, state_paths in found.items():
            merged = paths.setdefault(state, [])
            seen = {(tuple(p.events), p.outcome) for p in merged}
            merged.extend(p for p in state_paths if (tuple(p.events), p.outcome) not in seen)
    graph = StateGraph()
    graph.add_node(ROOT)
    for state, state_paths in paths.items():
        _add_paths(graph, state, state_paths)
    return QueueAnalysis(drain, graph, paths, static, sorted(set(truncated)), modes, mode_paths,
                         sorted(set(unparsed)), unseen)


def explore_queue(index: Index, pack: Pack, domain: Domain) -> Explored | None:
    """The costly part of analyse_queue, for a forked child to do: None when there is no drain
    loop to explore (analyse_queue then needs nothing from it)."""
    planned = _plan(index, pack, [])
    if isinstance(planned, QueueAnalysis):
        return None
    drain, _static, list_pack, companion = planned
    modes, _truncated = find_modes(index, drain.func, domain, [])
    truncated: list[str] = []
    unparsed: list[str] = []
    return _explore_modes(index, list_pack, domain, drain, modes, truncated, unparsed, companion), truncated, unparsed


def _explore_modes(index: Index, list_pack: Pack, domain: Domain, drain: Drain, modes: list[Mode], truncated: list[str],
                   unparsed: list[str], companion: Companion | None) -> list[dict[str, list[QueuePath]]]:
    guards = frozenset(name for mode in modes for name, _ in mode.bindings)
    return [_explore_mode(index, list_pack, domain, drain, dict(mode.bindings), guards, truncated, unparsed, companion)
            for mode in modes]


def _plan(index: Index, pack: Pack, unparsed: list[str]) -> tuple[Drain, list[Site], Pack, Companion | None] | QueueAnalysis:
    """The drain loop to explore, the queue's static sites, the pack of the list it drains and
    the companion of a held queue; or, with no drain loop, the queue's whole analysis."""
    drains = find_drains(index, pack, unparsed=unparsed)
    static = static_sites(index, pack)
    list_pack = pack
    companion = None
    if not drains:
        held = held_queue(index, pack)
        if held is not None:
            # The queue is an object whose class holds the list and drains it itself.
            cls, attr = held.cls, held.attr
            list_pack = pack.for_queue(attr)
            methods = [m for c in index.mro(cls) for m in c.methods.values()]
            drains = find_drains(index, list_pack, methods, unparsed)
            static = sorted(static + _held_sites(index, list_pack, cls, methods), key=lambda s: (s.path, s.line, s.kind))
            for drain in drains:
                drain.list_attr = attr
            companion = holder_companion(index, held)
    if not drains:
        unseen: list[str] = [] if _assigned_in_tree(index, pack.queue) or not _used_in_tree(index, pack.queue) else [
            f"self.{pack.queue} is bound outside the scanned folder (nothing here binds it to an object), so the object that "
            f"drains it is not seen; scan the folder that holds the scheduler"]
        graph = StateGraph()
        graph.add_node(ROOT)
        return QueueAnalysis(None, graph, {}, static, unparsed=sorted(set(unparsed)), unseen_callers=unseen)
    return drains[0], static, list_pack, companion


def _callers_in_view(index: Index, func: FuncRef) -> bool:
    """Whether the code that can call `func` is in view: for a method, whether its object's class
    is assembled in view; a module function is called in view when some call of it is."""
    return _assembled_in_view(index, func.owner) if func.owner is not None else bool(index.callers(func.name))


def _assembled_in_view(index: Index, cls: ClassInfo) -> bool:
    """Whether an object of `cls` gets its class from code in view: a class in view derives from
    it, or code in view instantiates it. Else the object is built out of view: a part of a class
    composed there (SGLang's Scheduler composes the disaggregation mixins in managers/), or an
    object held there (the decode queues); the unseen code may call its methods with any
    argument and read or drain what it binds."""
    return bool(index.subclasses_of(cls.name)) or bool(index.callers(cls.name))


def _used_in_tree(index: Index, attr: str) -> bool:
    """Whether some analysed file reads `<x>.<attr>`: code in view works with the queue object."""
    return any(isinstance(node, ast.Attribute) and node.attr == attr
               for module in index.modules.values() if index.may_name(module, attr) for node in walk_ast(module.tree))


def _assigned_in_tree(index: Index, attr: str) -> bool:
    """Whether some analysed file assigns `<x>.<attr> = ...` (where the queue object is bound).
    `<x>.<attr> = None` (a teardown: 0.5.23's role_switch.py) and a bare annotation bind no
    object: the queue's own binding is still elsewhere."""
    for module in index.modules.values():
        for node in index.assignments(module):
            if node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == attr for t in targets):
                return True
    return False


def _explore_mode(index: Index, list_pack: Pack, domain: Domain, drain: Drain, bindings: dict[str, Val],
                  guards: frozenset[str], truncated: list[str], unparsed: list[str],
                  companion: Companion | None = None) -> dict[str, list[QueuePath]]:
    """Every path of one iteration of the drain loop, per poll state, with the drain's mode
    parameters bound (`companion`: the object that builds a held queue, see holder_companion)."""
    paths: dict[str, list[QueuePath]] = {}
    effects = QueueEffects(list_pack, list_pack.queue, drain.removal_set,
                           (drain.owner or drain.func).node if drain.removal_index else None, drain.removal_index)
    for state in domain.members:
        explorer = Explorer(Options(index, domain, state=state, guards=guards, effects=effects, companion=companion))
        env = {name: frozenset({state}) if role == "@state" else frozenset({role}) for name, role in drain.initial.items()}
        env.update({name: value for name, value in bindings.items() if name not in env})
        start = PathState(env=tuple(sorted(env.items())))
        frame = Frame(drain.func, drain.body, drain.cls)
        explorer.stack.append(id(drain.func.node))
        ends = explorer.run_block(drain.loop.body.body, [start], frame)
        for func, body, loop, roles in drain.then:
            # The drain's own loops see each request the poll pass did not raise on.
            ready = [replace(end, term=None, env=tuple(sorted({n: frozenset({r}) for n, r in roles.items()}.items())))
                     for end in ends if end.term != "raise"]
            explorer.stack.append(id(func.node))
            after = explorer.run_block(loop.body.body, ready, Frame(func, body, func.owner)) if ready else []
            explorer.stack.pop()
            ends = [end for end in ends if end.term == "raise"] + [
                replace(end, term=None) if end.term in ("continue", "break") else end for end in after]
        truncated.extend(explorer.log.truncated)
        unparsed.extend(f"{u}()" for u in explorer.log.unparsed)
        state_paths = []
        for end in ends:
            events = list(acting_events(end))
            outcome = outcome_of(events, end.term, removal=drain.removal_set is not None)
            if outcome == Outcome.LEAVES:
                for e in list(events):
                    if e.kind == EventKind.DONE:
                        events.extend(drain.post_effects.get(e.detail, []))
            state_paths.append(QueuePath(events, outcome))
        paths[state] = state_paths
    return paths


def _held_sites(index: Index, list_pack: Pack, cls: ClassInfo, methods: list[FuncRef]) -> list[Site]:
    """Entries into and reassignments of the holder's own list (`self.queue.append(...)` in its
    methods); other classes' lists of the same name are not this queue."""
    sites = []
    for func in methods:
        for node in walk_ast(func.node):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("append", "extend", "insert", "appendleft") \
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == list_pack.queue \
                    and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "self":
                sites.append(Site(EventKind.ENTRY, func.path, node.lineno, func.qualname))
            elif isinstance(node, ast.Assign) and func.name != "__init__" and any(
                    isinstance(t, ast.Attribute) and t.attr == list_pack.queue for t in node.targets):
                sites.append(Site(EventKind.REASSIGN, func.path, node.lineno, func.qualname))
    return sites


def _add_paths(graph: StateGraph, state: str, state_paths: list[QueuePath]) -> None:
    for events, outcome in state_paths:
        previous: tuple = ROOT
        for e in events:
            if e.kind in NOT_SITES:
                continue
            node = (e.kind, e.path, e.line)
            graph.add_node(node, kind=e.kind, path=e.path, line=e.line, function=e.function)
            data = graph.nodes[node]
            data.setdefault("details", set()).add(e.detail)
            data.setdefault("detail", e.detail)  # the first seen: the release map's note
            if e.after_loop:
                data["after_loop"] = True  # the diagram says so without reading the note's words
            if e.kind is EventKind.CHECK:
                taken = data.setdefault("taken", set())  # states that take the true branch
                if e.detail == "T":
                    taken.add(state)
            _add_edge(graph, previous, node, state)
            previous = node
        end = ("outcome", outcome)
        graph.add_node(end, kind="outcome")
        _add_edge(graph, previous, end, state)


def _add_edge(graph: StateGraph, a: tuple, b: tuple, state: str) -> None:
    if graph.has_edge(a, b):
        graph.edges[a, b]["states"].add(state)
    else:
        graph.add_edge(a, b, states={state})


def static_sites(index: Index, pack: Pack) -> list[Site]:
    """Entry appends, reassignments and gauge reads of the queue anywhere in scope (from ast)."""
    sites: list[Site] = []
    for module in index.modules.values():
        if pack.queue not in (module.source.text or ""):
            continue
        path = module.source.path
        # Every site names the queue on its own lines, so only nodes whose line span holds a
        # line that mentions it are walked (scheduler files are large; few lines name the queue).
        queue_lines = [i for i, text in enumerate(module.lines, 1) if pack.queue in text]

        def mentions(node: ast.AST) -> bool:
            first = getattr(node, "lineno", None)
            if first is None:
                return True  # containers without positions (arguments, match cases...)
            first = min([first] + [d.lineno for d in getattr(node, "decorator_list", ())])
            at = bisect.bisect_left(queue_lines, first)
            return at < len(queue_lines) and queue_lines[at] <= (getattr(node, "end_lineno", None) or first)

        # One walk that remembers each node's parent and enclosing function.
        stack: list[tuple[ast.AST, ast.AST | None, str]] = [(module.tree, None, "<module>")]
        parents: dict[int, ast.AST] = {}
        while stack:
            node, parent, where = stack.pop()
            if not mentions(node):
                continue
            if parent is not None:
                parents[id(node)] = parent
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = node.name if where == "<module>" or "." in where else f"{where}.{node.name}"
            elif isinstance(node, ast.ClassDef):
                where = node.name
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                recv = node.func.value
                if node.func.attr in ("append", "extend", "insert", "appendleft") \
                        and isinstance(recv, ast.Attribute) and recv.attr == pack.queue:
                    sites.append(Site(EventKind.ENTRY, path, node.lineno, where))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == pack.queue for t in targets):
                    sites.append(Site(EventKind.REASSIGN, path, node.lineno, where))
            if isinstance(node, ast.Call) and pack.gauge_calls and pack.queue in _source(module, node) \
                    and any(mentions_attr(a, pack.queue) for a in node.args):
                callee = dotted(node.func, calls=True)
                if callee and matches(callee, pack.gauge_calls) and _is_stored(node, parents):
                    sites.append(Site(EventKind.GAUGE, path, node.lineno, where, note=callee))
            stack.extend((child, node, where) for child in ast.iter_child_nodes(node))
    return sorted(sites, key=lambda s: (s.path, s.line, s.kind))


def _source(module: ParsedModule, node: ast.stmt | ast.expr) -> str:
    return "\n".join(module.lines[node.lineno - 1 : (node.end_lineno or node.lineno)])


def _is_stored(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """A gauge reads the queue into a value that is kept (assigned, passed, returned), not tested."""
    parent = parents.get(id(node))
    while parent is not None and isinstance(parent, (ast.Call, ast.BinOp, ast.keyword, ast.Tuple, ast.Dict, ast.List)):
        if isinstance(parent, ast.Call) and node in parent.args:
            break
        node, parent = parent, parents.get(id(parent))
    return isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.keyword, ast.Call, ast.Dict))
