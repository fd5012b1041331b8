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
from kvtrace.report.diagram import LABEL_H, LINE_H, NODE_W, Diagram, diagrams, drawn_queue, node_id
from kvtrace.report.links import Permalinks, permalinks
from kvtrace.report.verdicts import OK, Grid, by_severity, package_place, summary_line, unknown_returns, verdict_grids

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1500px;padding:16px 24px;color:#1f2328}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #d0d7de}
.meta{color:#59636e}.bad{color:#b42318;font-weight:600}.good{color:#1a7f37;font-weight:600}
table{border-collapse:collapse;margin:8px 0;max-width:100%}
td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
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
    labels: list[str] = []
    for index, (a, b, data) in enumerate(g.edges(data=True)):
        na, nb = g.nodes[a], g.nodes[b]
        x1, y1 = na["x"] + NODE_W / 2, na["y"] + na["h"]
        x2, y2 = nb["x"] + NODE_W / 2, nb["y"]
        if y2 <= y1:  # a back edge: up the right side of the drawing, clear of every node and label
            side = data["side"]
            d = (f"M{na['x'] + NODE_W},{y1 - na['h'] / 2} C{side},{y1 - na['h'] / 2} {side},{y1} {side},{y1}"
                 f" L{side},{y2} C{side},{y2} {side},{y2 + nb['h'] / 2} {nb['x'] + NODE_W},{y2 + nb['h'] / 2}")
        else:
            # Through the slots of the rows it crosses: straight down each slot, one curve per gap.
            d = f"M{x1},{y1}"
            px, py = x1, y1
            for sx, top, bottom in [*data["points"], (x2, y2, y2)]:
                mid = (py + top) / 2
                d += f" C{px},{mid} {sx},{mid} {sx},{top}"
                if bottom > top:
                    d += f" L{sx},{bottom}"
                px, py = sx, bottom
        css = " ".join(["edge", *data["css"]])
        states = ", ".join(data["states"]) or "not covered"
        out.append(f'<path class="{css}" d="{d}" data-edge="{index}" marker-end="url(#arrow)">'
                   f'<title>{escape(states)}</title></path>')
        if "label" in data:
            (x, baseline), lines = data["label"]
            spans = "".join(f'<tspan x="{x:.0f}" y="{baseline + i * LABEL_H:.0f}">{escape(line)}</tspan>'
                            for i, line in enumerate(lines))
            labels.append(f'<text class="elabel" data-edge="{index}" x="{x:.0f}" y="{baseline:.0f}">{spans}</text>')
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
    out += labels  # drawn last, over the edges and nodes
    out.append("</svg>")
    return "\n".join(out)


CODE_CLASS = ' class="code"'


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
    out.append(f'<p class="meta">kvtrace {__version__}; {escape(package_place(report))}; '
               f"{analysed}/{len(report.files)} files analysed.</p>")
    if report.filters.active:  # a narrowed scan says so, as the text report's header does
        out.append(f'<p class="meta filters">{escape(report.filters.describe())}</p>')
    problems = [f"{g.place}: {g.why}" for g in report.gaps if g.kind == "file"] + [p.text for p in report.problems]
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
    out.append('<p class="meta">Each poll state the backend\'s poll() can return → the branches and helpers of the '
               "drain loop it passes → kept / leaves / raises / dropped → for kept states, the backend's way out "
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
