"""The state diagram of one backend, drawn from the analysis graph (networkx), with a layered
layout computed here (no layout engine at view time). Used by the HTML page, the mermaid block
of the markdown report and `--graph` export.

Per backend: each poll state the sender's poll() can return -> the checks, appends, releases and
helpers its paths pass in the drain loop -> kept / leaves / raises / dropped -> for kept states,
the sender's way out (poll() reading the state abort() writes, timeout checks) or its absence.
"""

from __future__ import annotations

import io
import re
import textwrap
import tokenize
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from kvtrace.freeing import abort_ended, abort_ends_text
from kvtrace.model import OUTCOME_ORDER, Backend, Consequence, QueueReport, Report
from kvtrace.rulemeta import consequence_of

ROOT = ("root",)
NODE_W, NODE_H = 220, 60  # room for three lines of text: labels wrap, never cut
GAP, VIRTUAL_W = 16, 24  # between boxes in a layer; the slot a long edge takes in a layer it crosses
ROW_GAP = 52  # layers run top to bottom; the space between them holds the edges' labels
ROW = NODE_H + ROW_GAP
LABEL_CHARS, CODE_CHARS, TEXT_LINES, LINE_H = 30, 29, 9, 15  # a node's text: 12px labels, 11px code
STATEMENT_LINES = 8  # a statement over more source lines than this is shown on hover only
COLUMN = NODE_W + GAP
MARGIN = 10
BACK_EDGE_ROOM = 40  # back edges loop around the right side of the drawing
# An edge's label has a slot of its own in a band of labels under the edge's source row, laid out
# with the nodes: the edge runs down the slot's left side and the text sits right of it, so no
# other edge passes through a label (they pass through their own slots in the band).
LABEL_CHAR_W, LABEL_H = 6.0, 12  # a 10px label's character and line (wide enough for the rendered text)
LABEL_LEAD = 10  # the slot's left part, where its own edge runs down
LABEL_PAD = 5  # above and below the text in its band, clear of the curves entering and leaving it
BAND_GAP = 34  # between a row of nodes and a band of labels: the edges' curves run there
# Characters per label line, widest first: a band takes the widest that keeps it within the drawing.
LABEL_WRAPS = (64, 40, 32, 24, 16)
SLOTS = ("virtual", "label")  # the kinds of a long edge's slots in the rows it crosses
# How much a horizontal run counts in placing x, by how many of its ends are slots: a run between
# two slots of one edge weighs most, so a long edge runs straight down and bends by its ends.
RUN_WEIGHT = (1.0, 2.0, 32.0)
# Each sweep moves a member this much past where its neighbours want it (successive over-relaxation):
# long edges' chains are stiff, and move to where they run straight in a third of the sweeps.
OVER_RELAXATION = 1.8
SWEEPS = 150  # at most; the sweeps stop once nothing moves a quarter pixel


@dataclass
class Diagram:
    backend: Backend
    graph: nx.DiGraph  # nodes: kind, label, path, line, css (list), lines, h; edges: states, css, text
    pinned: list[str]
    _size: tuple[int, int] | None = None

    # Laid out when first drawn (the mermaid block of the markdown report needs no coordinates):
    # then the nodes have layer, x, y and the edges points, side, label (see _layout).
    @property
    def width(self) -> int:
        return self._laid_out()[0]

    @property
    def height(self) -> int:
        return self._laid_out()[1]

    def _laid_out(self) -> tuple[int, int]:
        if self._size is None:
            self._size = _layout(self.graph)
        return self._size


def node_id(node: tuple) -> str:
    """A stable, HTML- and mermaid-safe id for a graph node."""
    text = "-".join(str(part) for part in node)
    return "n-" + "".join(c if c.isalnum() else "-" for c in text)


def _site_label(kind: str, details: set[str], line: int, wait_note: str | None = None,
                after_loop: bool = False) -> str:
    shown = sorted(d for d in details if d not in ("T", "F"))
    after = " (after the loop)" if after_loop else ""
    if kind == "wait":
        return f"L{line} waits: {wait_note}" if wait_note else f"L{line} waits (tests no poll value)"
    if kind == "helper" and shown:
        return f"L{line} calls {shown[0].rsplit('.', 1)[-1]}(){after}"
    return f"L{line} {kind}{after}"


def queue_graph(report: Report) -> nx.DiGraph:
    """The report's queue graph as networkx (the report carries it as plain lists)."""
    graph = nx.DiGraph()
    if report.graph:
        graph.add_nodes_from(report.graph["nodes"])
        graph.add_edges_from(report.graph["edges"])
    return graph


def folded_graph(report: Report) -> nx.DiGraph:
    """The queue graph with each helper's inside folded into the step of the drain loop that calls
    it: a site in another function is drawn as the drain's call that led to it (the first such
    call on its paths), so the picture shows the drain's own steps; the folded sites stay listed
    on the call (`folded`). Keeps that test nothing (waits) are marked `wait`."""
    flow = queue_graph(report)
    queue = drawn_queue(report)
    drain = queue.drain.note if queue is not None and queue.drain is not None else None
    if drain is None:
        return flow

    def own(n: tuple) -> bool:
        return n == ROOT or n[0] == "outcome" or flow.nodes[n].get("function") in (None, drain)

    rep: dict[tuple, tuple] = {n: n for n in flow if own(n)}
    # Execution order is the edge order: walk from the drain's own sites into helpers.
    for start in sorted((n for n in flow if own(n) and n != ROOT), key=str):
        stack = [(start, m) for m in flow.successors(start)]
        while stack:
            via, node = stack.pop()
            if node in rep:
                continue
            rep[node] = rep[via]
            stack.extend((node, m) for m in flow.successors(node))
    folded = nx.DiGraph()
    for n, data in flow.nodes(data=True):
        target = rep.get(n, n)
        if target not in folded:
            folded.add_node(target, **dict(flow.nodes[target]), folded=[])
        if target != n:
            folded.nodes[target]["folded"].append((data.get("kind", n[0]), data.get("path", ""), data.get("line", 0),
                                                   data.get("function", "")))
    for a, b, data in flow.edges(data=True):
        ra, rb = rep.get(a, a), rep.get(b, b)
        if ra == rb:
            continue
        if folded.has_edge(ra, rb):
            folded.edges[ra, rb]["states"] = set(folded.edges[ra, rb]["states"]) | set(data.get("states", ()))
        else:
            folded.add_edge(ra, rb, states=set(data.get("states", ())))
    for n in _waits(folded):
        folded.nodes[n]["kind"] = "wait"
    return folded


def _waits(g: nx.DiGraph) -> list[tuple]:
    """Keeps on a path that tests no poll value: no check (or folded step holding one) lies
    between the top of the loop and the keep on any path to it."""
    untested: set[tuple] = {ROOT}
    changed = True
    while changed:
        changed = False
        for n in g:
            if n in untested or n[0] == "outcome" or g.nodes[n].get("kind") == "check" \
                    or any(kind == "check" for kind, *_ in g.nodes[n].get("folded", ())):
                continue
            if all(p in untested for p in g.predecessors(n)) and any(True for _ in g.predecessors(n)):
                untested.add(n)
                changed = True
    return [n for n in untested if n != ROOT and g.nodes[n].get("kind") == "keep"]


def drawn_queue(report: Report) -> QueueReport | None:
    """The queue whose graph the report carries (it names it; a pack may name several queues)."""
    named = (report.graph or {}).get("queue")
    return next((q for q in report.queues if q.name == named), report.queues[0] if report.queues else None)


def backend_diagram(report: Report, backend: Backend) -> Diagram:
    flow = folded_graph(report)
    queue = drawn_queue(report)
    states = list(queue.states) if queue else []
    ours = [f for f in report.findings if f.queue in (None, queue.name if queue else None)]
    returned = [s for s in states if s in backend.returns] if backend.poll else states
    pinned = sorted({f.state for f in ours if consequence_of(f.rule) is Consequence.PINNED
                     and f.backend == backend.name and f.state}, key=states.index)
    dropped = {f.state for f in ours if consequence_of(f.rule) is Consequence.DROPPED and f.state}
    g = nx.DiGraph()
    poll = backend.poll
    for state in states:
        css = ["state"] + (["pinned"] if state in pinned else []) + (["dropped"] if state in dropped else []) \
            + ([] if state in returned else ["unreturned"])
        where = (poll.path, poll.line) if poll else (report.enum.path, report.enum.line) if report.enum else ("", 0)
        g.add_node(("state", state), kind="state", label=state, path=where[0], line=where[1], css=css,
                   tip=f"{backend.sender}.poll() {'can return' if state in returned else 'never returns'} {state}")

    wanted = set(returned)
    wait_notes = {(w.path, w.line): w.note for fate in (queue.states.values() if queue else ())
                  for mode in fate.modes for w in mode.waits if w.note}
    outcome_lines = _outcome_lines(report)
    for a, b, data in flow.edges(data=True):
        carried = [s for s in states if s in data.get("states", ()) and s in wanted]
        if not carried:
            continue
        sources = [("state", s) for s in carried] if a == ROOT else [a]
        for node in (b,) + (() if a == ROOT else (a,)):
            if node not in g:
                _add_site(g, flow, node, outcome_lines, wait_notes)
        for source in sources:
            edge_states = [source[1]] if a == ROOT else carried
            if g.has_edge(source, b):
                g.edges[source, b]["states"] += [s for s in edge_states if s not in g.edges[source, b]["states"]]
            else:
                g.add_edge(source, b, states=list(edge_states), css=[])
    for a, b, data in g.edges(data=True):
        if "wait" in (g.nodes[a]["kind"], g.nodes[b]["kind"]):
            data["css"].append("wait")  # drawn apart: a wait is no verdict on the state
    _way_out(g, backend, states, returned)
    for a, b, data in g.edges(data=True):
        if "wait" not in data["css"] and any(s in pinned for s in data["states"]):
            data["css"].append("pinned")
    for n, data in g.nodes(data=True):
        data["lines"] = node_lines(report, data)
        data["h"] = max(NODE_H, 12 + len(data["lines"]) * LINE_H)
    shown = [s for s in states if s in returned]
    for a, b, data in g.edges(data=True):
        data["text"] = edge_text(a, data, shown)
    return Diagram(backend, g, pinned)


def edge_text(source: tuple, data: dict, shown: list[str]) -> str:
    """What an edge's label says: the states that take it ("every state" when that is all of
    the drawn states), "waits:" before them on a wait; nothing out of a state node (the state is
    the node above) nor on an edge no state takes."""
    if source[0] == "state" or not data["states"]:
        return ""
    states = "every state" if len(shown) > 2 and set(data["states"]) >= set(shown) else ", ".join(data["states"])
    return f"waits: {states}" if "wait" in data["css"] else states


def wrap_text(text: str, width: int) -> list[str]:
    """Lines of at most `width` characters, broken at spaces; a longer word (a helper's name such
    as `optimistic_release_and_requeue()`) is broken after one of `_ . / (`, between the parts of
    its name, and only a part longer than the line inside it: never cut."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        for i, piece in enumerate(_name_parts(word, width)):
            glue = "" if i or not line else " "  # the parts of one word join without a space
            if line and len(line) + len(glue) + len(piece) > width:
                lines.append(line)
                line = piece
            else:
                line += glue + piece
    return lines + [line] if line or not lines else lines


def _name_parts(word: str, width: int) -> list[str]:
    if len(word) <= width:
        return [word]
    parts: list[str] = []
    for part in re.split(r"(?<=[_./(])", word):
        while len(part) > width:  # no boundary inside: the part itself is broken
            parts.append(part[:width])
            part = part[width:]
        if parts and len(parts[-1]) + len(part) <= width:
            parts[-1] += part
        elif part:
            parts.append(part)
    return parts


def node_lines(report: Report, data: dict) -> list[tuple[str, str]]:
    """(css, text) lines a node shows: its label whole, then the statement at its line when
    that fits in the node's three lines (else it is in the hover text only)."""
    lines = [("", text) for text in wrap_text(data["label"], LABEL_CHARS)]
    if data["kind"] in ("state", "wayout", "outcome") or not data["path"]:
        return lines
    source = next((f for f in report.files if f.path == data["path"]), None)
    statement = whole_statement(source.lines, data["line"]) if source and 0 < data["line"] <= len(source.lines) else ""
    code = wrap_text(statement, CODE_CHARS) if statement else []
    return lines + [("code", text) for text in code] if len(lines) + len(code) <= TEXT_LINES else lines


def whole_statement(lines: list[str], line: int) -> str:
    """The statement that starts at `line` (1-based), with the lines it continues on (an open
    bracket, a backslash), on one line without its comments: `if poll not in (` alone says
    nothing. Empty when it runs over more than STATEMENT_LINES lines or does not tokenize."""
    from kvtrace.report.excerpt import without_annotation

    for count in range(1, STATEMENT_LINES + 1):
        chunk = [without_annotation(text) for text in lines[line - 1: line - 1 + count]]
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(textwrap.dedent("\n".join(chunk)) + "\n").readline))
        except (tokenize.TokenError, IndentationError, SyntaxError):
            if line - 1 + count >= len(lines):
                return ""
            continue
        shown = [t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                                       tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)]
        text = ""
        for previous, token in zip([None, *shown], shown):
            glued = previous is not None and (previous.end == token.start or previous.string in "([{.~" and
                                              previous.type == tokenize.OP or token.string in ")]},.:" and
                                              token.type == tokenize.OP)
            text += ("" if glued or not text else " ") + token.string
        return text
    return ""


def _outcome_lines(report: Report) -> dict[str, tuple[str, int]]:
    """Where each outcome happens: `kept` at the line that assigns the keep list back to the queue,
    the others at the drain loop's `for` (the request leaves, raises or falls out of it there)."""
    queue = drawn_queue(report)
    if queue is None or queue.drain is None:
        return {}
    loop = (queue.drain.path, queue.drain.line)
    reassign = next(((s.path, s.line) for s in queue.sites if s.kind == "reassign" and s.function == queue.drain.note
                     and s.path == queue.drain.path), loop)
    return {o: reassign if o == "kept" else loop for o in OUTCOME_ORDER}


def _add_site(g: nx.DiGraph, flow: nx.DiGraph, node: tuple, outcome_lines: dict[str, tuple[str, int]],
              wait_notes: dict[tuple[str, int], str] | None = None) -> None:
    data = flow.nodes[node]
    if node[0] == "outcome":
        outcome = node[1]
        path, line = outcome_lines.get(outcome, ("", 0))
        g.add_node(node, kind="outcome", label=outcome, path=path, line=line, css=["outcome", f"outcome-{outcome}"],
                   tip={"kept": "back into the queue", "leaves": "out of the queue (finished, released or aborted)",
                        "raises": "the drain loop raises", "dropped": "out of the queue with nothing done"}[outcome],
                   folded=[])
        return
    kind = data.get("kind", node[0])
    path, line = data.get("path", ""), data.get("line", 0)
    note = _wait_note(wait_notes or {}, path, line) if kind == "wait" else None
    folded = list(data.get("folded", ()))
    inside = "".join(f"\n  L{at} {what} in {fn}" for what, _, at, fn in sorted(folded, key=lambda f: (f[1], f[2])))
    tip = (f"keeps the request without testing the poll value: a wait, not a verdict on the state, in "
           f"{data.get('function', '?')}" if kind == "wait" else f"{kind} in {data.get('function', '?')}")
    g.add_node(node, kind=kind, label=_site_label(kind, data.get("details", set()), line, note, bool(data.get("after_loop"))),
               path=path, line=line, css=["site", f"site-{kind}"],
               tip=tip + (f"; folded inside ({len(folded)} steps):{inside}" if folded else ""), folded=folded)


def _wait_note(notes: dict[tuple[str, int], str], path: str, line: int) -> str | None:
    """The guard of a wait (`req.rid not in rids_to_check`): the nearest one at or above the keep."""
    above = [(at, note) for (where, at), note in notes.items() if where == path and at <= line]
    return max(above)[1] if above else None


def _way_out(g: nx.DiGraph, backend: Backend, states: list[str], returned: list[str]) -> None:
    """The sender's exits for the states the drain loop keeps: abort state read, timeouts."""
    kept = ("outcome", "kept")
    if kept not in g:
        return
    # A wait keeps every state whatever poll() says; what needs a way out is a non-terminal
    # state (one the backend has a verdict for) kept on a path that tested the poll value.
    non_terminal = set(backend.verdicts) if backend.verdicts else set(states)
    kept_states = [s for s in states if s in non_terminal and any(
        s in d["states"] for a, _, d in g.in_edges(kept, data=True) if g.nodes[a]["kind"] != "wait")]
    if not kept_states:
        return
    poll = backend.poll
    poll_path, poll_line = (poll.path, poll.line) if poll else (backend.path, backend.line)
    path, line = poll_path, poll_line
    ended = [s for s in kept_states if s in abort_ended(backend)]
    if backend.reads_abort_state:
        label, css = f"abort: poll() reads {backend.abort_state}", ["wayout", "ok"]
    elif ended:  # poll() reads what abort() stores elsewhere (the manager's table) for these states
        label, css = f"abort: ends {', '.join(ended)}", ["wayout", "ok" if ended == kept_states else "partial"]
    elif backend.abort_state:
        label, css = f"abort: {backend.abort_state} never read", ["wayout", "missing"]
    else:
        label, css = "abort: no state to read", ["wayout", "missing"]
    via = backend.verdicts[ended[0]].abort_via if ended and not backend.reads_abort_state else ()
    if via:  # the line where abort() makes its write
        path, line = via[0].path, via[0].line
    tip = abort_ends_text(backend) if ended and not backend.reads_abort_state else \
        f"{backend.sender}.abort() writes {backend.abort_state or 'nothing poll() reads'}"
    g.add_node(("wayout", "abort"), kind="wayout", label=label, path=path, line=line, css=css, tip=tip)
    reached = kept_states if backend.reads_abort_state else ended
    g.add_edge(kept, ("wayout", "abort"), states=reached, css=[] if reached else ["missing"])
    covered: set[str] = set()
    for i, t in enumerate(backend.timeouts):
        # A check that ends a state on other runs of poll() but is not reached on the run that
        # pins it (the state's verdict is "no way out") is no way out for it.
        unreached = [s for s in t.covers if s in backend.verdicts and backend.verdicts[s].pinned]
        covers = [s for s in kept_states if s in t.covers and s not in unreached]
        covered.update(covers)
        ends = [s for s in t.covers if s not in unreached]
        label = f"L{t.line} timeout: {', '.join(ends) or 'none'}" if ends or not unreached else f"L{t.line} timeout"
        if unreached:
            label += f"{';' if ends else ','} not reached for pinned {', '.join(unreached)}"
        g.add_node(("wayout", "timeout", i), kind="wayout", label=label,
                   path=t.path, line=t.line, css=["wayout", "ok" if covers else "partial"],
                   tip=f"timeout check covering {', '.join(t.covers) or 'no state'}"
                   + (f"; not reached on the run of poll() that pins {', '.join(unreached)}" if unreached else ""))
        g.add_edge(kept, ("wayout", "timeout", i), states=covers, css=[] if covers else ["missing"])
    uncovered = [s for s in kept_states if s in returned and s not in covered]
    if uncovered:
        # Without a timeout the abort state is the only way out; without either, the state pins.
        severity = "partial" if backend.reads_abort_state else "missing"
        # Cited at poll(), where a timeout would be checked: the abort box may have moved to abort()'s write.
        g.add_node(("wayout", "no-timeout"), kind="wayout", label=f"no timeout: {', '.join(uncovered)}",
                   path=poll_path, line=poll_line, css=["wayout", severity],
                   tip=f"no timeout check in {backend.sender}.poll() covers {', '.join(uncovered)}")
        g.add_edge(kept, ("wayout", "no-timeout"), states=uncovered, css=[severity])


def _layers(g: nx.DiGraph) -> dict[tuple, int]:
    """Longest-path layers on the graph without its back edges (found by DFS from the states)."""
    dag = nx.DiGraph()
    dag.add_nodes_from(g)
    visited: set[tuple] = set()
    for start in [n for n in g if g.nodes[n]["kind"] == "state"] + list(g):
        if start in visited:
            continue
        stack: list[tuple[tuple, list]] = [(start, list(g.successors(start)))]
        on_stack = {start}
        visited.add(start)
        while stack:
            node, todo = stack[-1]
            if not todo:
                stack.pop()
                on_stack.discard(node)
                continue
            nxt = todo.pop(0)
            if nxt in on_stack:
                continue  # a back edge: drawn, but not used for layering
            dag.add_edge(node, nxt)
            if nxt not in visited:
                visited.add(nxt)
                on_stack.add(nxt)
                stack.append((nxt, list(g.successors(nxt))))
    layer: dict[tuple, int] = {}
    for node in nx.topological_sort(dag):
        preds = [layer[p] + 1 for p in dag.predecessors(node)]
        layer[node] = max(preds, default=0)
    kind = nx.get_node_attributes(g, "kind")
    sites = [layer[n] for n in g if kind[n] not in ("outcome", "wayout")]
    outcome_layer = max(sites, default=0) + 1
    for n in g:
        if kind[n] == "state":
            layer[n] = 0
        elif kind[n] == "outcome":
            layer[n] = outcome_layer
        elif kind[n] == "wayout":
            layer[n] = outcome_layer + 1
    return layer


@dataclass
class _Rows:
    """The rows of a layout: each layer's nodes and, under a layer whose edges carry labels, a band
    of labels; an edge spanning rows has a slot in each row between (`("label" | "virtual", a, b, row)`)."""
    routing: nx.DiGraph  # the nodes and the slots, each edge between consecutive rows
    level: dict[tuple, int]  # the row of each node and slot
    rows: dict[int, list[tuple]]  # each row's nodes and slots, left to right once ordered
    bands: set[int]
    chains: dict[tuple[tuple, tuple], list[tuple]]  # an edge's slots, top to bottom


def _rows(g: nx.DiGraph, layer: dict[tuple, int]) -> _Rows:
    labelled = {(a, b) for a, b in g.edges() if layer[b] > layer[a] and g.edges[a, b]["text"]}
    banded = sorted({layer[a] for a, _ in labelled})
    row = {k: k + sum(1 for j in banded if j < k) for k in set(layer.values())}
    routing = nx.DiGraph()
    routing.add_nodes_from(g)
    level = {n: row[layer[n]] for n in g}
    chains: dict[tuple[tuple, tuple], list[tuple]] = {}
    for a, b in g.edges():
        if level[b] - level[a] > 1:
            chain = [("label" if (a, b) in labelled and k == level[a] + 1 else "virtual", a, b, k)
                     for k in range(level[a] + 1, level[b])]
            level.update({v: v[3] for v in chain})
            nx.add_path(routing, [a, *chain, b])
            chains[(a, b)] = chain
        else:
            routing.add_edge(a, b)
    rows: dict[int, list[tuple]] = {}
    for n in routing:
        rows.setdefault(level[n], []).append(n)
    return _Rows(routing, level, rows, {row[k] + 1 for k in banded}, chains)


def _order(g: nx.DiGraph, r: _Rows) -> None:
    """Barycentre sweeps: each row ordered by the mean position of its neighbours; the states keep
    the enum's order, the outcomes theirs."""
    outcome_rank = {("outcome", o): i for i, o in enumerate(OUTCOME_ORDER)}
    state_rank = {n: i for i, n in enumerate(n for n in g if g.nodes[n]["kind"] == "state")}

    def initial(n: tuple) -> tuple:
        if n[0] in ("virtual", "label"):
            n = n[1]
        data = g.nodes[n]
        return (state_rank.get(n, 0), outcome_rank.get(n, 0), data["path"], data["line"], str(n))

    for nodes in r.rows.values():
        nodes.sort(key=initial)
    for sweep in range(6):
        order = {n: i for nodes in r.rows.values() for i, n in enumerate(nodes)}
        down = sweep % 2 == 0
        for at in sorted(r.rows, reverse=not down)[1:]:
            if at == 0:
                continue

            def centre(n: tuple) -> float:
                near = [order[m] for m in (r.routing.predecessors(n) if down else r.routing.successors(n))]
                return sum(near) / len(near) if near else order[n]

            r.rows[at].sort(key=lambda n: (centre(n), initial(n)))
            order.update({n: i for i, n in enumerate(r.rows[at])})


def _place(r: _Rows, width: dict[tuple, float], anchor: dict[tuple, float], widest: float) -> dict[tuple, float]:
    """Each node's and slot's left x: in its row's order, GAP apart, within the drawing, and as
    near as that allows to straight edges. Sweeps over the rows until nothing moves, each row
    placed where the weighted sum of its edges' squared horizontal runs is least (isotonic
    regression by pooling adjacent violators); a run between two slots of a long edge weighs
    most, so a long edge runs straight down and bends next to its ends."""
    index = {n: i for i, n in enumerate(r.level)}
    centre = [0.0] * len(index)  # where each one's edges meet it
    # Per row: its room to move, its members (index, x - shift, (neighbour, weight) per edge, sum of weights).
    rows: list[tuple[float, list[tuple[int, float, list[tuple[int, float]], float]]]] = []
    for at in sorted(r.rows):
        packed, members = 0.0, []
        for n in r.rows[at]:
            near = [(index[m], RUN_WEIGHT[(n[0] in SLOTS) + (m[0] in SLOTS)])
                    for m in (*r.routing.predecessors(n), *r.routing.successors(n))]
            members.append((index[n], packed + anchor[n], near, sum(w for _, w in near)))  # x = shift + base
            packed += width[n] + GAP
        room = widest - (packed - GAP)
        for i, base, _, _ in members:
            centre[i] = MARGIN + room / 2 + base  # centred, until placed
        rows.append((room, members))
    for _ in range(SWEEPS):
        moved = 0.0
        for room, members in rows:
            blocks: list[list[float]] = []  # pooled members: [weighted sum of wanted shifts, weight, count]
            for i, base, near, total in members:
                wanted = sum(w * centre[m] for m, w in near) / total if near else centre[i]
                wanted = centre[i] + OVER_RELAXATION * (wanted - centre[i])
                total = total or 1e-3
                blocks.append([(wanted - base) * total, total, 1])
                while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                    s, w, c = blocks.pop()
                    blocks[-1] = [blocks[-1][0] + s, blocks[-1][1] + w, blocks[-1][2] + c]
            shifts = [min(max(s / w, MARGIN), MARGIN + room) for s, w, c in blocks for _ in range(int(c))]
            for (i, base, _, _), shift in zip(members, shifts):
                moved = max(moved, abs(centre[i] - shift - base))
                centre[i] = shift + base
        if moved < 0.25:
            break
    return {n: centre[i] - anchor[n] for n, i in index.items()}


def _straighten(r: _Rows, x: dict[tuple, float], width: dict[tuple, float], anchor: dict[tuple, float],
                widest: float) -> None:
    """Each long edge's run through the rows (its slots after the label's) moved onto one vertical
    line where its neighbours in every row leave room for one, the nearest to its slots' median;
    longest edges first. The placement leaves them drifting a little at every row."""
    place = {n: i for nodes in r.rows.values() for i, n in enumerate(nodes)}

    def room(n: tuple) -> tuple[float, float]:
        """The lines the slot's edge may run down, between its neighbours in its row."""
        row, i = r.rows[r.level[n]], place[n]
        low = x[row[i - 1]] + width[row[i - 1]] + GAP if i else MARGIN
        high = x[row[i + 1]] - GAP - width[n] if i + 1 < len(row) else MARGIN + widest - width[n]
        return low + anchor[n], high + anchor[n]

    runs = [[v for v in chain if v[0] == "virtual"] for chain in r.chains.values()]
    for run in sorted((run for run in runs if len(run) > 1), key=len, reverse=True):
        rooms = [room(v) for v in run]
        low, high = max(lo for lo, _ in rooms), min(hi for _, hi in rooms)
        if low <= high:
            lines = sorted(x[v] + anchor[v] for v in run)
            line = min(max(lines[len(lines) // 2], low), high)
            x.update({v: line - anchor[v] for v in run})


def _layout(g: nx.DiGraph) -> tuple[int, int]:
    """Sugiyama-style: layers top to bottom; an edge spanning several rows gets a slot in each row
    it crosses (so it is routed around nodes, not through them); under each layer whose edges are
    labelled, a band where each label has a slot of its own (as dot lays labels out), so no edge
    passes through another's label. Written into the graph: x, y of the nodes; per edge `points`
    (the slots it passes: the x it runs down at, top, bottom), `side` (the x a back edge runs up
    at) and, when labelled, `label` ((x, first baseline), its lines)."""
    layer = _layers(g)
    r = _rows(g, layer)
    _order(g, r)
    texts = {n: g.edges[n[1], n[2]]["text"] for n in r.level if n[0] == "label"}

    def span(nodes: list[tuple], wrap: int) -> float:
        return sum(_slot_width(n, texts, wrap) for n in nodes) + GAP * (len(nodes) - 1)

    widest = max((span(nodes, 0) for at, nodes in r.rows.items() if at not in r.bands), default=NODE_W)
    # Each band's labels on lines as long as keep it within the widest row of nodes, else as short as they go.
    wraps = {at: next((w for w in LABEL_WRAPS if span(r.rows[at], w) <= widest), LABEL_WRAPS[-1]) for at in r.bands}
    widest = max([widest] + [span(r.rows[at], wraps[at]) for at in r.bands])
    lines = {n: wrap_text(text, wraps[r.level[n]]) for n, text in texts.items()}
    width = {n: _slot_width(n, texts, wraps.get(r.level[n], 0)) for n in r.level}
    anchor = {n: LABEL_LEAD / 2 if n[0] == "label" else width[n] / 2 for n in r.level}  # where edges meet it
    heights = {at: max(len(lines[n]) * LABEL_H for n in nodes if n in lines) + 2 * LABEL_PAD if at in r.bands else
               max([g.nodes[n].get("h", NODE_H) for n in nodes if n[0] != "virtual"] + [NODE_H])
               for at, nodes in r.rows.items()}
    tops: dict[int, int] = {}
    y = MARGIN
    for at in sorted(r.rows):
        tops[at] = y
        y += heights[at] + (BAND_GAP if at in r.bands or at + 1 in r.bands else ROW_GAP)
    x = _place(r, width, anchor, widest)
    _straighten(r, x, width, anchor, widest)
    for n in g:
        g.nodes[n].update(layer=layer[n], x=round(x[n]), y=tops[r.level[n]])
        g.nodes[n].setdefault("h", NODE_H)
    side = MARGIN + widest + BACK_EDGE_ROOM / 2  # right of every node and label
    for (a, b), data in g.edges.items():
        slots = r.chains.get((a, b), [])
        data["points"] = [(round(x[v] + anchor[v]), tops[v[3]], tops[v[3]] + heights[v[3]]) for v in slots]
        data["side"] = side
        for slot in (v for v in slots if v[0] == "label"):
            top = tops[slot[3]] + (heights[slot[3]] - len(lines[slot]) * LABEL_H) / 2
            data["label"] = ((round(x[slot]) + LABEL_LEAD, top + LABEL_H - 2.5), lines[slot])
    return int(2 * MARGIN + widest + BACK_EDGE_ROOM), y - ROW_GAP + MARGIN


def _slot_width(n: tuple, texts: dict[tuple, str], wrap: int) -> float:
    if n[0] == "label":
        return LABEL_LEAD + max(len(line) for line in wrap_text(texts[n], wrap or LABEL_WRAPS[0])) * LABEL_CHAR_W + 4
    return VIRTUAL_W if n[0] == "virtual" else NODE_W


def diagrams(report: Report) -> list[Diagram]:
    """One diagram per backend, the backends that pin first (the answer), then in report order."""
    drawn = [backend_diagram(report, b) for b in report.backends]
    return sorted(drawn, key=lambda d: not d.pinned)


def _mermaid_id(node: tuple) -> str:
    # Letters, digits and underscores only: `-` runs could read as mermaid edge syntax.
    return "n_" + "".join(c if c.isalnum() else "_" for c in "_".join(str(p) for p in node))


def _mermaid_text(text: str) -> str:
    # Entities for what would end the label or read as markup (a backtick opens a markdown string).
    return (text.replace("#", "#35;").replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
            .replace("`", "#96;"))


def mermaid(diagram: Diagram, shown: Callable[[str], str] | None = None) -> str:
    """The diagram as a mermaid flowchart (GitHub renders ```mermaid blocks). A way-out box names
    its file whole, as `shown` gives it (as it opens from the working directory): the drain's
    steps all sit in one file, the way out in another (several backends have a `conn.py`)."""
    g = diagram.graph
    out = ["flowchart TD"]
    for n, data in g.nodes(data=True):
        file = data["path"].rsplit("/", 1)[-1]
        if data["kind"] == "wayout" and data["path"]:
            label = f"{data['label']} · {(shown or str)(data['path'])}:{data['line']}"
        elif data["kind"] not in ("state", "outcome", "wayout"):
            label = f"{file}:{data['line']} {data['label'].split(' ', 1)[1]}"  # "L58 keep" -> "prefill.py:58 keep"
        else:
            label = data["label"]
        label = _mermaid_text(label)
        shape = f'(["{label}"])' if data["kind"] == "state" else f'{{{{"{label}"}}}}' \
            if data["kind"] == "outcome" else f'["{label}"]'
        out.append(f"    {_mermaid_id(n)}{shape}")
    for a, b, data in g.edges(data=True):
        states = ", ".join(data["states"])
        arrow = "-.->" if {"missing", "partial", "wait"} & set(data["css"]) else "==>" if "pinned" in data["css"] else "-->"
        if "wait" in data["css"] and states:
            states = f"waits: {states}"
        text = f'|"{_mermaid_text(states)}"|' if states and a[0] != "state" else ""
        out.append(f"    {_mermaid_id(a)} {arrow}{text} {_mermaid_id(b)}")
    styles = {
        "pinned": "fill:#ffebe9,stroke:#cf222e,stroke-width:3px,color:#a40e26",
        "unreturned": "fill:#f6f8fa,stroke:#d0d7de,color:#8c959f",
        "state": "fill:#ddf4ff,stroke:#0969da",
        "missing": "fill:#ffebe9,stroke:#cf222e,stroke-dasharray:5 3",
        "ok": "fill:#dafbe1,stroke:#1a7f37",
        "kept": "fill:#fff8c5",
        "dropped": "fill:#fff1e5,stroke:#bc4c00",
    }
    members: dict[str, list[str]] = {}
    for n, data in g.nodes(data=True):
        css = data["css"]
        cls = next((c for c in ("pinned", "unreturned", "missing", "ok") if c in css), None)
        if cls is None and "state" in css:
            cls = "state"
        if cls is None and n in (("outcome", "kept"), ("outcome", "dropped")):
            cls = n[1]
        if cls:
            members.setdefault(cls, []).append(_mermaid_id(n))
    for cls, ids in members.items():
        out.append(f"    classDef kv_{cls} {styles[cls]}")
        out.append(f"    class {','.join(ids)} kv_{cls}")
    return "\n".join(out) + "\n"


def mermaid_legend() -> str:
    return ("Each poll state → the drain loop's branches → kept / leaves / raises / dropped → the backend's "
            "way out; red: pinned, thick arrows: a pinned state's path, dotted: a missing way out.")
