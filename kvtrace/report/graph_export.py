"""`--graph FILE.graphml|.dot|.json`: the analysis graph as data, for other tools.

One graph for all targets: the queue graph of each report (poll states -> sites of the drain
loop and its helpers -> outcomes, each edge carrying the states that take it) plus one node per
backend with `returns` edges to the states its poll() can return. Node ids are strings
(`<target>|state|Bootstrapping`, `<target>|check|path|57`); attributes are scalars so GraphML
and DOT can hold them.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from kvtrace.errors import InputError
from kvtrace.model import Consequence, Report
from kvtrace.report.diagram import ROOT, queue_graph
from kvtrace.rulemeta import consequence_of

FORMATS = (".graphml", ".dot", ".json")


def analysis_graph(reports: list[Report]) -> nx.DiGraph:
    out = nx.DiGraph()
    for report in reports:
        def name(node: tuple) -> str:
            return "|".join([report.target, *map(str, node)])

        states = list(report.queues[0].states) if report.queues else []
        fates = report.queues[0].states if report.queues else {}
        for state in states:
            out.add_node(name(("state", state)), kind="state", label=state, target=report.target,
                         fate=",".join(fates[state].fate))
        graph = queue_graph(report)
        for node, data in graph.nodes(data=True):
            if node == ROOT:
                continue
            attrs = {"kind": data.get("kind", node[0]), "target": report.target,
                     "label": node[1] if node[0] == "outcome" else f"{data.get('path')}:{data.get('line')}"}
            if node[0] != "outcome":
                attrs |= {"path": data["path"], "line": data["line"], "function": data["function"],
                          "detail": ",".join(sorted(d for d in data.get("details", ()) if d not in ("T", "F")))}
            out.add_node(name(node), **attrs)
        for a, b, data in graph.edges(data=True):
            carried = [s for s in states if s in data["states"]]
            sources = [("state", s) for s in carried] if a == ROOT else [a]
            for source in sources:
                edge_states = [source[1]] if a == ROOT else carried
                out.add_edge(name(source), name(b), kind="flow", states=",".join(edge_states))
        pinned = {(f.backend, f.state) for f in report.findings if consequence_of(f.rule) is Consequence.PINNED}
        for backend in report.backends:
            node = name(("backend", backend.name))
            out.add_node(node, kind="backend", label=backend.name, target=report.target, sender=backend.sender,
                         path=backend.poll.path if backend.poll else backend.path,
                         line=backend.poll.line if backend.poll else backend.line,
                         reads_abort_state=backend.reads_abort_state, abort_state=backend.abort_state or "",
                         timeouts=";".join(f"{t.path}:{t.line}={','.join(t.covers)}" for t in backend.timeouts))
            for state in backend.returns:
                if state in states:
                    out.add_edge(node, name(("state", state)), kind="returns",
                                 pinned=(backend.name, state) in pinned,
                                 timeout=any(state in t.covers for t in backend.timeouts))
    return out


def _dot_value(value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph: nx.DiGraph) -> str:
    lines = ["digraph kvtrace {", "  rankdir=TB;"]
    for node, data in graph.nodes(data=True):
        attrs = ", ".join(f"{k}={_dot_value(v)}" for k, v in data.items())
        lines.append(f"  {_dot_value(node)} [{attrs}];")
    for a, b, data in graph.edges(data=True):
        attrs = ", ".join(f"{k}={_dot_value(v)}" for k, v in data.items())
        lines.append(f"  {_dot_value(a)} -> {_dot_value(b)} [{attrs}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def check_path(path: Path) -> None:
    if path.suffix not in FORMATS:
        raise InputError(f"--graph {path}: the name must end in {', '.join(FORMATS)}")


def write(reports: list[Report], path: Path) -> None:
    check_path(path)
    graph = analysis_graph(reports)
    try:
        if path.suffix == ".graphml":
            nx.write_graphml(graph, path)
        elif path.suffix == ".dot":
            path.write_text(to_dot(graph), encoding="utf-8")
        else:
            path.write_text(json.dumps(nx.node_link_data(graph, edges="edges"), indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--graph {path}: {exc.strerror or exc}") from None
