"""Graph stage for the queue: find its drain loop, walk every path for every poll state, and
build a graph whose nodes are sites (poll, checks, keep/done appends, releases, aborts,
raises) and outcomes, and whose edges carry the set of states that flow along them.

Nothing here names SGLang: the queue, calls and enum come from the rules pack.
"""

from __future__ import annotations

import ast
import bisect
from dataclasses import dataclass, field

import libcst as cst

from kvtrace.flow import NOT_SITES, Config, CstBody, Event, Explorer, Frame, PathState, dotted
from kvtrace.index import ClassInfo, FuncRef, Index
from kvtrace.index import dotted as ast_dotted
from kvtrace.model import OUTCOME_ORDER, Evidence, Site
from kvtrace.packs import Pack, matches
from kvtrace.states import KEEP, POLLS, REQ, Domain

ROOT = ("root",)


class StateGraph:
    """Directed graph of sites; each edge carries the set of states that flow along it.

    A dict of dicts rather than networkx: the analysis only adds nodes and edges and asks for a
    node's in-edges, and importing networkx cost 0.1-0.4 s of every scan."""

    def __init__(self) -> None:
        self.nodes: dict[tuple, dict] = {}
        self.edges: dict[tuple[tuple, tuple], dict] = {}
        self._in: dict[tuple, list[tuple]] = {}

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
        self.edges.setdefault((a, b), {}).update(attrs)

    def in_edges(self, node: tuple) -> list[tuple[tuple, tuple, dict]]:
        return [(a, node, self.edges[a, node]) for a in self._in.get(node, [])]


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


@dataclass
class QueueAnalysis:
    drain: Drain | None
    graph: StateGraph
    paths: dict[str, list[tuple[list[Event], str]]]  # state -> [(events, outcome)]
    static_sites: list[Site]
    truncated: list[str] = field(default_factory=list)

    def fate(self, state: str) -> list[str]:
        """Outcomes reachable from the poll along edges that carry `state`."""
        reached = set()
        for outcome in OUTCOME_ORDER:
            node = ("outcome", outcome)
            if node in self.graph and any(
                state in data["states"] for _, _, data in self.graph.in_edges(node)
            ):
                reached.add(outcome)
        return [o for o in OUTCOME_ORDER if o in reached]


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


def _mentions_queue(node: ast.AST, queue: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == queue for n in ast.walk(node))


def _all_functions(index: Index) -> list[FuncRef]:
    funcs: list[FuncRef] = []
    for infos in index.classes.values():
        for info in infos:
            funcs.extend(info.methods.values())
    for refs in index.functions.values():
        funcs.extend(refs)
    return sorted(funcs, key=lambda f: (not index.in_root(f.path), f.path, f.line))


def find_drains(index: Index, pack: Pack) -> list[Drain]:
    drains = []
    for func in _all_functions(index):
        if pack.queue not in "\n".join(func.module.lines[func.node.lineno - 1 : func.node.end_lineno]):
            continue
        keep = _reassigned_name(func.node, pack.queue)
        loops = [n for n in ast.walk(func.node) if isinstance(n, ast.For) and _mentions_queue(n.iter, pack.queue)]
        if keep is None or not loops:
            continue
        drain = _build_drain(index, pack, func, keep)
        if drain is not None:
            drains.append(drain)
    return drains


def _reassigned_name(func: ast.AST, queue: str) -> str | None:
    for node in ast.walk(func):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == queue and isinstance(node.value, ast.Name):
                    return node.value.id
    return None


def _build_drain(index: Index, pack: Pack, func: FuncRef, keep: str) -> Drain | None:
    cst_func = index.cst(func)
    if cst_func is None:
        return None
    body = CstBody(cst_func.node, cst_func.line)
    loops: list[cst.For] = []
    poll_vars: dict[str, int] = {}

    class Find(cst.CSTVisitor):
        def visit_For(self, node: cst.For) -> None:
            if any(isinstance(n, cst.Attribute) and n.attr.value == pack.queue for n in _walk(node.iter)):
                loops.append(node)

        def visit_Assign(self, node: cst.Assign) -> None:
            if isinstance(node.value, cst.Call) and pack.is_poll_call(dotted(node.value.func)):
                for t in node.targets:
                    if isinstance(t.target, cst.Name):
                        poll_vars[t.target.value] = body.line(node)

    cst_func.node.visit(Find())
    if not loops:
        return None
    loop = loops[0]
    initial: dict[str, str] = {keep: KEEP}
    poll_line = None
    for name, line in poll_vars.items():
        initial[name] = POLLS
        poll_line = line
    _bind_loop_target(loop.target, loop.iter, pack.queue, poll_vars, initial)
    return Drain(func, loop, body, func.owner, keep, initial, poll_line, _post_loop_effects(index, pack, func, body, loop))


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
                            and not any(isinstance(n, cst.Attribute) and n.attr.value == queue for n in _walk(arg.value)):
                        initial[element.value.value] = "@state"
        return
    if isinstance(target, cst.Name):
        if any(isinstance(n, cst.Attribute) and n.attr.value == queue for n in _walk(it)):
            initial[target.value] = REQ
        elif isinstance(it, cst.Name) and it.value in poll_vars:
            initial[target.value] = "@state"


def _walk(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _walk(child)


def _post_loop_effects(index: Index, pack: Pack, func: FuncRef, body: CstBody, drain_loop: cst.For) -> dict[str, list[Event]]:
    """What is done, after the drain loop, for every request of a finished list: releases,
    aborts and answers in a loop over the list, or a call given the whole list."""
    effects: dict[str, list[Event]] = {}

    def kind_of(callee: str) -> str | None:
        return "release" if pack.is_release(callee) else "abort" if pack.is_abort(callee) \
            else "answer" if pack.is_answer(callee) else None

    inside_loop = {id(n) for n in _walk(drain_loop)}
    for node in _walk(body.node):
        if id(node) in inside_loop:
            continue
        if isinstance(node, cst.For) and isinstance(node.iter, cst.Name):
            for inner in _walk(node.body):
                if isinstance(inner, cst.Call) and (kind := kind_of(dotted(inner.func))):
                    effects.setdefault(node.iter.value, []).append(Event(
                        kind, func.path, body.line(inner), func.qualname, dotted(inner.func) + " (after the loop)"))
        elif isinstance(node, cst.Call) and (kind := kind_of(dotted(node.func))):
            for arg in node.args:
                if isinstance(arg.value, cst.Name):
                    effects.setdefault(arg.value.value, []).append(Event(
                        kind, func.path, body.line(node), func.qualname, dotted(node.func) + " (after the loop)"))
    return effects


def outcome_of(events: tuple[Event, ...] | list[Event], term: str | None) -> str:
    if term == "raise":
        return "raises"
    if term == "return":
        return "kept"  # returned before `self.<queue> = ...`: the queue is unchanged
    kinds = {e.kind for e in events}
    if "keep" in kinds:
        return "kept"
    if kinds & {"done", "requeue", "release", "abort"}:
        return "leaves"
    return "dropped"


def analyse_queue(index: Index, pack: Pack, domain: Domain) -> QueueAnalysis:
    drains = find_drains(index, pack)
    graph = StateGraph()
    graph.add_node(ROOT)
    static = static_sites(index, pack)
    if not drains:
        return QueueAnalysis(None, graph, {}, static)
    drain = drains[0]
    truncated: list[str] = []
    paths: dict[str, list[tuple[list[Event], str]]] = {}
    for state in domain.members:
        config = Config(index, pack, domain, state=state, queue_attr=pack.queue)
        explorer = Explorer(config)
        env = {name: frozenset({state}) if role == "@state" else frozenset({role}) for name, role in drain.initial.items()}
        start = PathState(env=tuple(sorted(env.items())))
        frame = Frame(drain.func, drain.body, drain.cls)
        explorer.stack.append(id(drain.func.node))
        ends = explorer.run_block(drain.loop.body.body, [start], frame)
        truncated.extend(config.truncated)
        state_paths = []
        for end in ends:
            events = list(end.events)
            outcome = outcome_of(events, end.term)
            if outcome == "leaves":
                for e in list(events):
                    if e.kind == "done":
                        events.extend(drain.post_effects.get(e.detail, []))
            state_paths.append((events, outcome))
        paths[state] = state_paths
        _add_paths(graph, state, state_paths)
    return QueueAnalysis(drain, graph, paths, static, sorted(set(truncated)))


def _add_paths(graph: StateGraph, state: str, state_paths: list[tuple[list[Event], str]]) -> None:
    for events, outcome in state_paths:
        previous = ROOT
        for e in events:
            if e.kind in NOT_SITES:
                continue
            node = (e.kind, e.path, e.line)
            graph.add_node(node, kind=e.kind, path=e.path, line=e.line, function=e.function)
            graph.nodes[node].setdefault("details", set()).add(e.detail)
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
                    sites.append(Site("entry", path, node.lineno, where))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == pack.queue for t in targets):
                    sites.append(Site("reassign", path, node.lineno, where))
            if isinstance(node, ast.Call) and pack.gauge_calls and pack.queue in _source(module, node) \
                    and any(_mentions_queue(a, pack.queue) for a in node.args):
                callee = ast_dotted(node.func)
                if callee and matches(callee, pack.gauge_calls) and _is_stored(node, parents):
                    sites.append(Site("gauge", path, node.lineno, where, note=callee))
            stack.extend((child, node, where) for child in ast.iter_child_nodes(node))
    return sorted(sites, key=lambda s: (s.path, s.line, s.kind))


def _source(module, node: ast.AST) -> str:
    return "\n".join(module.lines[node.lineno - 1 : (node.end_lineno or node.lineno)])


def _is_stored(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """A gauge reads the queue into a value that is kept (assigned, passed, returned), not tested."""
    parent = parents.get(id(node))
    while parent is not None and isinstance(parent, (ast.Call, ast.BinOp, ast.keyword, ast.Tuple, ast.Dict, ast.List)):
        if isinstance(parent, ast.Call) and node in parent.args:
            break
        node, parent = parent, parents.get(id(parent))
    return isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.keyword, ast.Call, ast.Dict))
