"""`--format html`: one self-contained page a person opens first. Per backend the state diagram
(inline SVG laid out in Python by kvtrace.report.diagram; pinned states red; every node a link to
its path:line with the code excerpt on hover), then the findings and the release map.

Nothing is fetched when the page is viewed: styles are inline, there is no script. Node links
go to GitHub (the release tag of an installed SGLang, or a pushed commit holding the same file in a
checkout; kvtrace.report.links), else to the excerpt on this page.
"""

from __future__ import annotations

import re

from html import escape

from kvtrace import __version__
from kvtrace.baseline import counts_against, mark
from kvtrace.model import Report
from kvtrace.report import modes_line, state_fate_lines
from kvtrace.report.excerpt import excerpt
from kvtrace.report.diagram import LINE_H, NODE_W, Diagram, diagrams, drawn_queue, node_id
from kvtrace.report.links import Permalinks, permalinks
from kvtrace.report.verdicts import OK, Grid, by_severity, summary_line, unknown_returns, verdict_grids

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1500px;padding:16px 24px;color:#1f2328}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #d0d7de}
.meta{color:#59636e}.bad{color:#b42318;font-weight:600}.good{color:#1a7f37;font-weight:600}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}pre{background:#f6f8fa;padding:8px;overflow:auto;margin:4px 0}
.hl{background:#fff1b8;display:block}.diagram{overflow-x:auto;border:1px solid #d0d7de;border-radius:6px;margin:6px 0}
svg text{font:12px system-ui,sans-serif;pointer-events:none}svg text.code{font:11px ui-monospace,Menlo,monospace;fill:#59636e}
.node rect{fill:#fff;stroke:#8c959f;stroke-width:1.2}.node:hover rect{stroke-width:2.5}
.state rect{fill:#ddf4ff;stroke:#0969da}.state.unreturned rect{fill:#f6f8fa;stroke:#d0d7de}.state.unreturned text{fill:#8c959f}
.state.pinned rect{fill:#ffebe9;stroke:#cf222e;stroke-width:2.5}.state.pinned text{fill:#a40e26;font-weight:700}
.state.dropped rect{stroke:#bc4c00;stroke-dasharray:4 2}
.outcome-kept rect{fill:#fff8c5}.outcome-leaves rect{fill:#dafbe1}.outcome-raises rect{fill:#fbefff}.outcome-dropped rect{fill:#fff1e5;stroke:#bc4c00}
.wayout.ok rect{fill:#dafbe1;stroke:#1a7f37}.wayout.missing rect{fill:#ffebe9;stroke:#cf222e;stroke-dasharray:5 3}\
.wayout.partial rect{stroke-dasharray:2 2}
.edge{fill:none;stroke:#8c959f;stroke-width:1.3}.edge.pinned{stroke:#cf222e;stroke-width:2}.edge.missing{stroke:#cf222e;stroke-dasharray:5 3}
.edge.wait{stroke:#9a6700;stroke-dasharray:2 3}
.site-wait rect{fill:#fff8c5;stroke:#9a6700;stroke-dasharray:4 2}
table.grid th{background:#f6f8fa}table.grid caption{text-align:left;font-weight:600;padding:2px 0}
td.sev-error{background:#ffebe9;color:#a40e26;font-weight:700}td.sev-warning{background:#fff8c5}td.sev-note{background:#ddf4ff}
td.ok{color:#1a7f37}td.never{color:#8c959f}.summary{font-size:16px}
.elabel{fill:#1f2328;font-size:10px!important;paint-order:stroke;stroke:#fff;stroke-width:4px;stroke-linejoin:round}
"""


def _excerpt(report: Report, path: str, line: int, context: int = 2) -> list[tuple[int, str]]:
    return excerpt(report, path, line, context)


def _anchor(path: str, line: int) -> str:
    return "src-" + "".join(c if c.isalnum() else "-" for c in f"{path}-{line}")


class _Page:
    def __init__(self, report: Report):
        self.report = report
        self.links: Permalinks | None = permalinks(report)
        self.sources: dict[tuple[str, int], None] = {}  # excerpts to list at the end, in order

    def href(self, path: str, line: int) -> str:
        self.sources.setdefault((path, line), None)
        url = self.links.url(path, line) if self.links else None
        return url or f"#{_anchor(path, line)}"

    def code(self, path: str, line: int) -> str:
        return "\n".join(f"{'>' if n == line else ' '}{n:5d} | {text}" for n, text in _excerpt(self.report, path, line))


def _diagram_svg(page: _Page, diagram: Diagram) -> str:
    g = diagram.graph
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="state-diagram" width="{diagram.width}" '
           f'height="{diagram.height}" viewBox="0 0 {diagram.width} {diagram.height}" '
           f'style="max-width:100%;height:auto" '
           f'role="img" aria-label="state diagram of the {escape(diagram.backend.name)} backend">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#8c959f"/></marker></defs>']
    # (label, edge start, first stop, the edge's index); every edge's drawn points, to keep labels off them.
    wanted: list[tuple[str, tuple[float, float], tuple[float, float], int]] = []
    drawn: list[list[tuple[float, float]]] = []
    for index, (a, b, data) in enumerate(g.edges(data=True)):
        na, nb = g.nodes[a], g.nodes[b]
        x1, y1 = na["x"] + NODE_W / 2, na["y"] + na["h"]
        x2, y2 = nb["x"] + NODE_W / 2, nb["y"]
        segments: list[tuple[tuple[float, float], ...]] = []  # a line (2 points) or a cubic Bezier (4)
        if y2 <= y1:  # a back edge: around the right side of both nodes
            side = max(na["x"], nb["x"]) + NODE_W + 30
            segments.append(((na["x"] + NODE_W, y1 - na["h"] / 2), (side, y1), (side, y2),
                             (nb["x"] + NODE_W, y2 + nb["h"] / 2)))
        else:
            # Through the centres of the virtual slots of a long edge, one curve per layer gap.
            slots = data["points"]
            stops = [(x1, y1), *[(px, top) for px, top, _ in slots], (x2, y2)]
            for i, (sx, sy) in enumerate(stops[1:]):
                px, py = stops[i]
                if i > 0:  # straight down through the slot, then curve to the next one
                    segments.append(((px, py), (px, slots[i - 1][2])))
                    py = slots[i - 1][2]
                mid = (py + sy) / 2
                segments.append(((px, py), (px, mid), (sx, mid), (sx, sy)))
        d = f"M{segments[0][0][0]},{segments[0][0][1]}" + "".join(
            f" L{seg[1][0]},{seg[1][1]}" if len(seg) == 2 else
            f" C{seg[1][0]},{seg[1][1]} {seg[2][0]},{seg[2][1]} {seg[3][0]},{seg[3][1]}" for seg in segments)
        drawn.append([point for seg in segments for point in _sampled(seg)])
        css = " ".join(["edge", *data["css"]])
        states = ", ".join(data["states"]) or "not covered"
        out.append(f'<path class="{css}" d="{d}" data-edge="{index}" marker-end="url(#arrow)">'
                   f'<title>{escape(states)}</title></path>')
        if a[0] != "state" and y2 > y1 and data["states"]:
            first = stops[1]
            shown = "every state" if len(data["states"]) == len(diagram_states(diagram)) and len(data["states"]) > 2 \
                else states
            wanted.append((f"waits: {shown}" if "wait" in data["css"] else shown, (x1, y1), first, index))
    for n, data in g.nodes(data=True):
        tip = data["tip"]
        where = f"{data['path']}:{data['line']}" if data["path"] else ""
        code = page.code(data["path"], data["line"]) if data["path"] else ""
        title = "\n".join(part for part in (tip, where, code) if part)
        lines = data["lines"]
        top = data["y"] + (data["h"] - len(lines) * LINE_H) / 2 + LINE_H - 4
        texts = "".join(f'<text{CODE_CLASS if css else ""} x="{data["x"] + 8}" y="{top + i * LINE_H:.0f}">'
                        f"{escape(text)}</text>" for i, (css, text) in enumerate(lines))
        body = (f'<g class="{" ".join(["node", *data["css"]])}" id="{node_id(n)}-{escape(diagram.backend.name)}" '
                f'data-kind="{escape(data["kind"])}" data-label="{escape(data["label"])}" '
                f'data-path="{escape(data["path"])}" data-line="{data["line"]}">'
                f'<title>{escape(title)}</title>'
                f'<rect x="{data["x"]}" y="{data["y"]}" width="{NODE_W}" height="{data["h"]}" rx="6"/>{texts}</g>')
        out.append(f'<a href="{escape(page.href(data["path"], data["line"]))}">{body}</a>' if data["path"] else body)
    out += _edge_labels(wanted, g, diagram.width, drawn)  # drawn last, over the edges and nodes
    out.append("</svg>")
    return "\n".join(out)


CODE_CLASS = ' class="code"'


LABEL_CHAR_W, LABEL_H = 6.0, 12  # an edge label's box at 10px (wide enough to hold the rendered text)
# Where along its first curve a label may sit, in order: the middle first, then out to the ends.
LABEL_AT = (0.5, 0.42, 0.58, 0.35, 0.65, 0.28, 0.72, 0.2, 0.8, 0.14, 0.86, 0.08, 0.92)
# Else beside the edge, right then left, this far from it: near first, on one line then on two.
LABEL_GAPS = ((4, 24), (56,))


def _sampled(segment: tuple[tuple[float, float], ...], steps: int = 32) -> list[tuple[float, float]]:
    """Points along a line or a cubic Bezier, close enough that a label box meets one if it meets the edge."""
    if len(segment) == 2:
        (ax, ay), (bx, by) = segment
        return [(ax + (bx - ax) * i / steps, ay + (by - ay) * i / steps) for i in range(steps + 1)]
    (ax, ay), (bx, by), (cx, cy), (dx, dy) = segment
    points = []
    for i in range(steps + 1):
        t = i / steps
        u = 1 - t
        points.append((u ** 3 * ax + 3 * u * u * t * bx + 3 * u * t * t * cx + t ** 3 * dx,
                       u ** 3 * ay + 3 * u * u * t * by + 3 * u * t * t * cy + t ** 3 * dy))
    return points


def _edge_labels(wanted: list[tuple[str, tuple[float, float], tuple[float, float], int]], g, width: int,
                 drawn: list[list[tuple[float, float]]]) -> list[str]:
    """Each edge's states on the edge's first curve (from its source down to the next layer),
    centred on it or beside it, on one line or else on two, at the first place where its box
    meets no node, no label already placed and no other edge; where every place does, at the one
    of least overlap (nodes and labels weigh more than a crossing edge)."""
    taken = [(d["x"], d["y"], d["x"] + NODE_W, d["y"] + d["h"]) for _, d in g.nodes(data=True)]
    out = []
    for label, (x1, y1), (sx, sy), index in wanted:
        mid = (y1 + sy) / 2
        others = [p for i, points in enumerate(drawn) if i != index for p in points]
        best: tuple[float, float, float, list[str]] | None = None
        for gaps, lines in [(gaps, lines) for gaps in LABEL_GAPS for lines in _label_forms(label)]:
            w = max(len(line) for line in lines) * LABEL_CHAR_W + 4
            h = LABEL_H * len(lines)
            for t in LABEL_AT:
                # The cubic Bezier the edge is drawn with: (x1,y1) C (x1,mid) (sx,mid) (sx,sy).
                u = 1 - t
                on_x = u ** 3 * x1 + 3 * u * u * t * x1 + 3 * u * t * t * sx + t ** 3 * sx
                y = u ** 3 * y1 + 3 * u * u * t * mid + 3 * u * t * t * mid + t ** 3 * sy
                for shift in (0.0, *(side * (w / 2 + gap) for gap in gaps for side in (1, -1))):
                    x = min(max(on_x + shift, w / 2 + 2), width - w / 2 - 2)
                    box = (x - w / 2, y - h / 2, x + w / 2, y + h / 2)
                    crossed = sum(1 for px, py in others
                                  if box[0] - 1 <= px <= box[2] + 1 and box[1] - 1 <= py <= box[3] + 1)
                    overlap = sum(_overlap(box, other) for other in taken) * 100 + crossed
                    if best is None or overlap < best[0]:
                        best = (overlap, x, y, lines)
                    if not overlap:
                        break
                if best is not None and not best[0]:
                    break
            if best is not None and not best[0]:
                break
        assert best is not None  # LABEL_AT is not empty: every label has a place
        _, x, y, lines = best
        w = max(len(line) for line in lines) * LABEL_CHAR_W + 4
        h = LABEL_H * len(lines)
        taken.append((x - w / 2, y - h / 2, x + w / 2, y + h / 2))
        top = y - h / 2 + LABEL_H / 2 + 3.5  # the first line's baseline
        spans = "".join(f'<tspan x="{x:.0f}" y="{top + i * LABEL_H:.0f}">{escape(line)}</tspan>'
                        for i, line in enumerate(lines))
        out.append(f'<text class="elabel" data-edge="{index}" x="{x:.0f}" y="{top:.0f}" '
                   f'text-anchor="middle">{spans}</text>')
    return out


def _label_forms(label: str) -> list[list[str]]:
    """The label on one line, then (a list of states) on two lines split at the comma nearest its middle."""
    forms = [[label]]
    commas = [i for i, c in enumerate(label) if c == ","]
    if commas:
        cut = min(commas, key=lambda i: abs(i - len(label) / 2))
        forms.append([label[:cut + 1], label[cut + 1:].strip()])
    return forms


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _folded_steps(page: _Page, diagram: Diagram) -> list[str]:
    """What each helper call does inside, folded out of the picture (expand to read it)."""
    calls = [(n, d) for n, d in diagram.graph.nodes(data=True) if d.get("folded")]
    if not calls:
        return []
    out = [f'<details class="folded"><summary>Inside the helpers the diagram folds into their calls '
           f'({sum(len(d["folded"]) for _, d in calls)} steps)</summary><ul>']
    for _, d in sorted(calls, key=lambda c: (c[1]["path"], c[1]["line"])):
        steps = "".join(f'<li><a href="{escape(page.href(path, line))}"><code>{escape(path)}:{line}</code></a> '
                        f"{escape(kind)} in <code>{escape(function)}</code></li>"
                        for kind, path, line, function in sorted(d["folded"], key=lambda f: (f[1], f[2])))
        out.append(f'<li><a href="{escape(page.href(d["path"], d["line"]))}">{escape(d["label"])}</a><ul>{steps}</ul></li>')
    out.append("</ul></details>")
    return out


def diagram_states(diagram: Diagram) -> list[str]:
    return [n[1] for n in diagram.graph if n[0] == "state" and "unreturned" not in diagram.graph.nodes[n]["css"]]


def _grid_html(grid: Grid) -> str:
    """The backend x state verdict grid, a cell per state, coloured by the worst rule there."""
    if not grid.backends:
        return f'<p class="bad">No backends found for <code>{escape(grid.queue)}</code>.</p>'
    rows = [f'<table class="grid" data-queue="{escape(grid.queue)}"><caption>Verdicts for '
            f"<code>{escape(grid.queue)}</code></caption><tr><th>backend</th>"
            + "".join(f"<th>{escape(s)}</th>" for s in grid.states) + "</tr>"]
    for backend in grid.backends:
        cells = []
        for state in grid.states:
            text, severity = grid.cells[backend, state]
            css = f"sev-{severity}" if severity else "ok" if text == OK else "never"
            cells.append(f'<td class="{css}" data-state="{escape(state)}">{escape(text)}</td>')
        rows.append(f'<tr data-backend="{escape(backend)}"><th>{escape(backend)}</th>{"".join(cells)}</tr>')
    rows.append("</table>")
    rows.append(f'<p class="meta legend">{escape(grid.legend)}</p>')
    return "".join(rows)


def _report(report: Report, out: list[str]) -> None:
    page = _Page(report)
    version = getattr(report, "version", None)
    installed = (report.host_facts or {}).get("sglang_version")  # the package's metadata, above a folder scanned
    detected = (f" — {escape(version.package)} {escape(version.version)}" if version else
                f" — sglang {escape(str(installed))}" if installed else "")
    out.append(f"<h1>kvtrace: <code>{escape(report.target)}</code>{detected}</h1>")
    analysed = sum(f.status == "ok" for f in report.files)
    out.append(f'<p class="meta">kvtrace {__version__}; package <code>{escape(report.root or ".")}</code>; '
               f"{analysed}/{len(report.files)} files analysed.</p>")
    if report.filters.active:  # a narrowed scan says so, as the text report's header does
        out.append(f'<p class="meta filters">{escape(report.filters.describe())}</p>')
    problems = [f"{f.path}: {f.status}: {f.error}" for f in report.files if f.status != "ok"] + list(report.problems)
    if problems:
        out.append('<p class="bad">INCOMPLETE: ' + "; ".join(escape(p) for p in problems) + "</p>")
    # The answer first, as in the text report: what pins (the summary line), then the grid.
    failing = any(counts_against(f) for f in report.findings)
    out.append(f'<p class="summary {"bad" if failing else "good"}">{escape(summary_line(report))}</p>')
    for grid in verdict_grids(report):
        out.append(_grid_html(grid))
    queue = drawn_queue(report)
    of = f" of <code>{escape(queue.name)}</code>" if queue is not None and len(report.queues) > 1 else ""
    out.append(f"<h2>State diagrams{of}</h2>")
    out.append('<p class="meta">Each poll state the sender\'s poll() can return → the branches and helpers of the '
               "drain loop it passes → kept / leaves / raises / dropped → for kept states, the sender's way out "
               "(the abort state read by poll(), timeout checks) or its absence. <span class=\"bad\">Red</span>: pinned. "
               "Hover a node for its code, click it to open the line.</p>")
    for diagram in diagrams(report):
        b = diagram.backend
        poll = f"{b.poll.path}:{b.poll.line}" if b.poll else "no poll()"
        verdict = (f'<span class="bad">pins {", ".join(diagram.pinned)}</span>' if diagram.pinned
                   else '<span class="good">no pinned state</span>')
        out.append(f'<section class="backend" id="backend-{escape(b.name)}" data-backend="{escape(b.name)}">')
        out.append(f"<h3>{escape(b.name)} — <code>{escape(b.sender)}</code>, poll() at "
                   f'<a href="{escape(page.href(b.poll.path, b.poll.line) if b.poll else "#")}"><code>{escape(poll)}</code></a>: {verdict}</h3>')
        returns = ", ".join(b.returns) or "no state"
        unknown = "".join(f'<br><span class="bad">{escape(u)}</span>' for u in unknown_returns(b))
        out.append(f'<p class="meta">poll() returns {escape(returns)}{unknown}</p>')
        out.append(f'<div class="diagram">{_diagram_svg(page, diagram)}</div>')
        out += _folded_steps(page, diagram)
        out.append("</section>")

    out.append(f"<h2>Findings ({len(report.findings)})</h2>")
    if not report.findings:
        out.append('<p class="good">None.</p>')
    for f in by_severity(report.findings):
        tag = mark(f)
        out.append(f'<div class="finding" data-rule="{escape(f.rule)}"><p><b>{escape(f.severity)}[{escape(f.rule)}]</b> '
                   f'<a href="{escape(page.href(f.path, f.line))}"><code>{escape(f.path)}:{f.line}</code></a>'
                   + (f" in <code>{escape(f.queue)}</code>" if f.queue and len(report.queues) > 1 else "")
                   + (f" <i>({escape(tag)})</i>" if tag else "") + f"<br>{escape(f.message)}</p>")
        out.append(f"<pre>{escape(page.code(f.path, f.line))}</pre>")
        if f.evidence:
            out.append("<ul>" + "".join(
                f'<li><a href="{escape(page.href(e.path, e.line))}"><code>{escape(e.path)}:{e.line}</code></a> '
                f"{escape(e.note)}</li>" for e in f.evidence) + "</ul>")
        out.append("</div>")

    for queue in report.queues:
        out.append(f"<h2>Release map: <code>{escape(queue.name)}</code></h2>")
        out.append("<table><tr><th>kind</th><th>path:line</th><th>function</th><th>states</th></tr>")
        for s in queue.sites:
            note = f" [{escape(s.note)}]" if s.note else ""
            note += f" (only when {escape(s.mode)})" if s.mode else ""
            out.append(f'<tr><td>{escape(s.kind)}</td><td><a href="{escape(page.href(s.path, s.line))}">'
                       f"<code>{_breakable(s.path, '/')}:{s.line}</code></a></td><td><code>{_breakable(s.function)}</code></td>"
                       f"<td>{escape(', '.join(s.states))}{note}</td></tr>")
        out.append("</table>")
        modes = modes_line(queue)
        if modes:
            out.append(f"<p>{escape(modes)}</p>")
        out.append("<table><tr><th>state</th><th>fate</th></tr>" + "".join(
            f"<tr><td>{escape(state)}</td><td>" + "<br>".join(
                escape(f"{mode}: {text}" if mode else text) for mode, text in state_fate_lines(queue, fate)) + "</td></tr>"
            for state, fate in queue.states.items()) + "</table>")

    out.append("<h2>Code</h2>")
    for path, line in sorted(page.sources):
        rows = "".join(f'<span class="hl">{escape(f"{n:5d} | {t}")}</span>' if n == line else escape(f"{n:5d} | {t}") + "\n"
                       for n, t in _excerpt(report, path, line))
        out.append(f'<div class="source" id="{_anchor(path, line)}"><code>{escape(path)}:{line}</code><pre>{rows}</pre></div>')


def _breakable(name: str, after: str = ".") -> str:
    """A qualified name (a path: `after="/"`) that may wrap after each `after` (between its parts,
    never inside one), so a table of long names fits the page instead of widening it past the window."""
    return "<wbr>".join(escape(part) for part in re.split(f"(?<={re.escape(after)})", name))


def render(reports: list[Report]) -> str:
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width,initial-scale=1">',
           f"<title>kvtrace: {escape(', '.join(r.target for r in reports))}</title><style>{CSS}</style></head><body>"]
    for report in reports:
        _report(report, out)
    out.append("</body></html>")
    return "\n".join(out) + "\n"
