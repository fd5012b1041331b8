"""The terminal report, answer first: a header, what could not be analysed, the backend x state
verdict grid, the findings grouped by backend (one excerpt each), the summary line; then the
details (release map, the poll states' fates, the backends). rich lays it out; with no terminal
(a pipe, a file, a CI log) it is plain text with no colour, no box lines and no trailing spaces.

Every row that names code carries its `path:line`, and paths are never folded: they sit in
columns that do not wrap, and prose wraps only at spaces."""

from __future__ import annotations

import re
from collections import defaultdict

from rich.console import Console
from rich.padding import Padding
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from kvtrace import __version__
from kvtrace.baseline import counts_against
from kvtrace.freeing import Freeing, abort_ended, abort_ends_text, scheduler_aborts, what_frees
from kvtrace.model import Backend, EventKind, Evidence, Gap, QueueReport, Report, SourceFile
from kvtrace.report import modes_line, state_fate_lines
from kvtrace.report.excerpt import without_annotation
from kvtrace.report.places import Places
from kvtrace.safe_text import inert, plain
from kvtrace.report.verdicts import (
    NOT_CHECKED,
    merged_legend,
    package_place,
    unchecked_backends,
    NOT_RETURNED,
    OK,
    UNKNOWN,
    backend_label,
    unknown_returns,
    way_out_text,
    finding_groups,
    shared_sections,
    gap_text,
    summary_line,
    verdict_grid,
)

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}
OUTCOME_STYLE = {"kept": "yellow", "leaves": "green", "raises": "magenta", "dropped": "red"}
GAPS_UP_FRONT = 5  # more than this are counted up front and all listed at the end


def render(report: Report, console: Console, show_map: bool = True, in_short: bool = True) -> None:
    """`in_short=False`: the answer is not repeated at the end of this report, because several
    reports are printed one after the other and `render_in_short` repeats each one's after all."""
    shown = finding_groups(report)
    # Every backend that keeps a state gets its way out, findings of its own or not: a state a
    # timeout covers raises no no-timeout note, and a queue-level silent-wait names no backend.
    frees = {b.name: what_frees(report, b) for b in report.backends if b.name in shown or b.verdicts}
    # Paths as they open from the working directory; names and notes come from the scanned tree:
    # no control character reaches the terminal.
    places = Places(report, extra=(e.path for found in frees.values() for f in found for e in f.evidence))
    report, frees = inert(places.localized((report, frees)))
    files = {f.path: f for f in report.files}
    _header(report, console)
    _gaps(report.gaps[:GAPS_UP_FRONT], console, more=len(report.gaps) - GAPS_UP_FRONT)
    console.print()
    _grid(report, console)
    groups = finding_groups(report)
    for backend, items in groups.items():
        for label, part in shared_sections(items) if backend is None else [(None, items)]:
            console.print()
            _backend_findings(report, backend, part, files, frees.get(backend or ""), console, label)
    for b in report.backends:
        if b.name not in groups and frees.get(b.name):
            console.print()
            _backend_findings(report, b.name, [], files, frees[b.name], console)
    console.print()
    summary = summary_line(report)
    style = "bold red" if any(f.severity == "error" and counts_against(f) for f in report.findings) else "bold green"
    console.print(Text(summary, style="bold yellow" if report.incomplete and not report.findings else style))
    if show_map:
        _details(report, console)
        if len(report.gaps) > GAPS_UP_FRONT:
            console.print()
            console.print(Text("Not analysed", style="bold"))
            _gaps(report.gaps, console, more=0, heading=False)
        # The details run to hundreds of lines: the answer is repeated last, so that it is what
        # the screen shows when the command ends (no pager needed to find it).
        if in_short:
            console.print()
            render_in_short(report, console)


def render_in_short(report: Report, console: Console, several: bool = False, label: str | None = None) -> list[str]:
    """The grid and the summary line again, under a heading that says which report it is when
    `several` are printed (--role all: the prefill and the decode side; --all: `label`, the
    target and the package). With several, the grids' legends are not printed but returned, for
    one legend after all of them (so that every report's answer fits on the last screen)."""
    heading = Text("In short (as at the top)", style="bold")
    role = (report.host_facts or {}).get("role")
    if several:
        heading.append(f": role {role}" if role else f": {label or report.target}", "bold")
    _print_wrapped(console, heading)
    legend = _grid(report, console, legends=not several)
    summary = summary_line(report)
    style = "bold red" if any(f.severity == "error" and counts_against(f) for f in report.findings) else "bold green"
    console.print(Text(summary, style="bold yellow" if report.incomplete and not report.findings else style))
    return legend


def print_legend(items: list[str], console: Console) -> None:
    """A legend: one grid's, or several grids' merged into one (verdicts.merged_legend)."""
    for line in legend_lines(merged_legend(items), console.width):
        console.print(Text(line, style="dim"), no_wrap=True, overflow="ignore")


def _header(report: Report, console: Console) -> None:
    title = Text.assemble(("kvtrace ", "bold"), __version__, " · ")
    installed = (report.host_facts or {}).get("sglang_version")  # the package's metadata, above a folder scanned
    if report.version is not None:
        title.append(f"{report.version.package} {report.version.version}", "bold")
        title.append(" · ")
    elif installed:
        title.append(f"sglang {installed}", "bold")
        title.append(" · ")
    role = (report.host_facts or {}).get("role")  # --role all: which of the reports this is
    target = Text(report.target, "bold")
    # A target too wide to share the line: the rest first, the target on a line of its own (left
    # whole for the terminal to wrap, never cut).
    alone = title.cell_len + target.cell_len + (len(f" · role {role}") if role else 0) > console.width
    if alone:
        title.right_crop(len(" · "))
    else:
        title.append_text(target)
    if role:
        title.append(" · role ")
        title.append(str(role), "bold")
    console.print(title, soft_wrap=True)
    if alone:
        console.print(target, soft_wrap=True)
    analysed = sum(1 for f in report.files if f.status == "ok")
    where = package_place(report)
    # A backend whose files could not be read is in the grid (`?`): counted, and said unchecked.
    unchecked = len(unchecked_backends(report))
    backends = len(report.backends) + unchecked
    parts = [where, f"{analysed} of {len(report.files)} files analysed",
             f"{backends} backend{'' if backends == 1 else 's'}" + (f" ({unchecked} not checked)" if unchecked else "")]
    if report.version is not None:
        parts.append(f"version from {report.version.path}:{report.version.line}")
    elif installed:
        parts.append("version from the installed package's metadata")
    # Wrapped between parts, never inside one ("5" and "backends" on one line).
    lines = [""]
    for part in parts:
        if lines[-1] and len(lines[-1]) + 3 + len(part) > console.width:
            lines.append(part)
        else:
            lines[-1] += (" · " if lines[-1] else "") + part
    for line in lines:
        console.print(Text(line, style="dim"))
    if report.filters.active:  # a filtered scan says so, and by whose word
        console.print(Text(report.filters.describe(), style="dim"), soft_wrap=True)


def _gaps(gaps: list[Gap], console: Console, more: int, heading: bool = True) -> None:
    if not gaps:
        return
    if heading:
        console.print(Text(f"INCOMPLETE: {gap_text(gaps, more)}", style="bold yellow"))
    subjects = [Text("analysis" if gap.kind == "analysis" else gap.place if gap.kind != "backend"
                     else f"backend {gap.subject}", style="yellow") for gap in gaps]
    label_width = max(s.cell_len for s in subjects) + 1
    for subject, gap in zip(subjects, gaps):
        # Beside its subject only if the reason's longest word fits there (never cut an identifier).
        longest = max((len(word) for word in gap.why.split()), default=0)
        if 2 + label_width + max(24, longest) <= console.width:
            _print_wrapped(console, Text(gap.why), 2, subject, label_width)
        else:  # a long path: whole on its line, the reason under it
            _print_wrapped(console, subject, 2)
            _print_wrapped(console, Text(gap.why), 4)
    if more > 0:
        console.print(Text(f"  ... and {more} more (listed at the end)", style="yellow"))


def _grid_width(grid, by_state: bool) -> int:
    """The printed width: columns two spaces apart, no padding at the edges (pad_edge=False)."""
    def width(values: list[str], head: str) -> int:
        return max([len(head)] + [len(v) for v in values]) + 2

    if by_state:  # one column per state
        return width(grid.backends, "backend") + sum(
            width([grid.cells[b, s][0] for b in grid.backends], s) for s in grid.states) - 2
    return width(grid.states, "state") + sum(
        width([grid.cells[b, s][0] for s in grid.states], b) for b in grid.backends) - 2


def _grid(report: Report, console: Console, legends: bool = True) -> list[str]:
    """One grid per queue. Names in the cells when they fit (states as columns, else backends
    as columns), else rule codes with a legend: a name is never folded or cut. Every grid of
    the report is laid out the same way (the first way all of them fit), so one queue's grid
    never shows names where the next one shows codes. `legends=False`: each grid's legend is
    not printed under it but returned (the items of all, in order)."""
    queues: list[QueueReport] | list[None] = report.queues or [None]
    # Backends as rows first (names, then codes), then states as rows.
    for by_states, short in ((True, False), (True, True), (False, False), (False, True)):
        grids = [verdict_grid(report, short, queue) for queue in queues]
        if all(_grid_width(grid, by_states) <= console.width for grid in grids):
            break
    items: list[str] = []
    for number, grid in enumerate(grids):
        if number:
            console.print()
        _one_grid(grid, by_states, console, legends)
        items += grid.legend_items if grid.backends else []
    return items


def _one_grid(grid, by_states: bool, console: Console, legend: bool = True) -> None:
    if not grid.backends:
        console.print(Text(f"No backends found for {grid.queue}.", style="yellow"))
        return
    styles = {OK: "green", NOT_RETURNED: "dim", UNKNOWN: "yellow", NOT_CHECKED: "yellow"}
    table = Table(box=None, show_edge=False, pad_edge=False, title_justify="left", header_style="bold",
                  title=Text(f"Verdicts for {grid.queue}"), title_style="bold")

    def cell(value: str, severity: str | None) -> Text:
        return Text(value, style=SEVERITY_STYLE.get(severity or "", styles.get(value, "")))

    if by_states:
        table.add_column("backend", no_wrap=True)
        for state in grid.states:
            table.add_column(Text(state), no_wrap=True)
        for backend in grid.backends:
            table.add_row(Text(backend), *(cell(*grid.cells[backend, s]) for s in grid.states))
    else:  # many states: backends as columns instead, so no name is ever folded
        table.add_column("state", no_wrap=True)
        for backend in grid.backends:
            table.add_column(Text(backend), no_wrap=True)
        for state in grid.states:
            table.add_row(Text(state), *(cell(*grid.cells[b, state]) for b in grid.backends))
    console.print(table)
    if legend:
        print_legend(grid.legend_items, console)


def legend_lines(items: list[str], width: int) -> list[str]:
    """The legend's items joined with ` · `, a line break only between items, so a code is never
    parted from its name; an item wider than the line is wrapped at spaces on its own lines,
    its continuation indented."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 3 + len(item) <= width:
            lines[-1] += " · " + item
            continue
        words = item.split(" ")
        line = words[0]
        for word in words[1:]:
            if len(line) + 1 + len(word) <= width:
                line += " " + word
            else:
                lines.append(line)
                line = "  " + word
        lines.append(line)
    return lines


def _print_wrapped(console: Console, body: Text, indent: int = 0, label: Text | str = "",
                   label_width: int = 0) -> None:
    """`label` (padded to `label_width`) at `indent`, then `body` wrapped at spaces in the room
    left, its continuation lines hanging under it. A word wider than that room (an absolute
    `path:line`) gets a line of its own and is left whole for the terminal to wrap: rich would
    cut or split it, and a person must be able to copy it and open it."""
    head = Text(" " * indent)
    head.append_text(label if isinstance(label, Text) else Text(label, style="dim"))
    if label_width:
        head.pad_right(max(0, indent + label_width - head.cell_len))
    hang = head.cell_len
    room = max(20, console.width - hang)
    lead = re.match(r"\s*(\S+)", body.plain)
    if head.plain.strip() and lead is not None and len(lead.group(1)) > room and "/" in lead.group(1):
        # A path too wide to follow its label: the label alone, the path on the next line.
        head.rstrip()
        console.print(head, soft_wrap=True)
        head = Text(" " * (indent + 2))
        hang = head.cell_len
        room = max(20, console.width - hang)
    first = True
    for part in body.split("\n", allow_blank=True):
        plain_part = part.plain
        cuts: list[int] = []  # where each printed line starts
        line_start, line_len = 0, 0
        for match in re.finditer(r"\S+", plain_part):
            start, end = match.span()
            if line_len and end - line_start > room:
                cuts.append(start)
                line_start, line_len = start, 0
            if end - start > room and "/" not in match.group():  # long code, not a path: folded
                cuts += range(start + room, end, room)
                line_start = cuts[-1] if cuts[-1] > start else line_start
            line_len = end - line_start
        for piece in part.divide(cuts) if cuts else [part]:
            piece.rstrip()
            alone = piece.plain.strip()
            # A path wider than the room, on its own line: as far left as the label's own.
            wide = len(alone) > room and "/" in alone and " " not in alone
            line = head.copy() if first else Text(" " * (min(hang, indent + 2) if wide else hang))
            line.append_text(piece)
            line.rstrip()
            console.print(line, soft_wrap=True)
            first = False
    if first:
        head.rstrip()
        console.print(head, soft_wrap=True)


def _backend_findings(report: Report, backend: str | None, groups, files: dict[str, SourceFile],
                      frees: list[Freeing] | None, console: Console, label: str | None = None) -> None:
    info = next((b for b in report.backends if b.name == backend), None)
    _print_wrapped(console, Text(label or backend_label(backend, info), style="bold"))
    shown: set[tuple[str, int]] = set()
    for group in groups:
        head = Text.assemble(
            (f"{group.severity}[{group.rule}]", SEVERITY_STYLE.get(group.severity, "")),
            " at ", (f"{group.path}:{group.line}", "bold"))
        if group.queue and len(report.queues) > 1:  # several grids: say which queue's drain it is about
            head.append(f" in {group.queue}")
        if group.mark:
            head.append(f" ({group.mark})", "dim")
        _print_wrapped(console, head, 2)
        _print_wrapped(console, Text(group.message), 4)
        excerpt = None
        if (group.path, group.line) not in shown:  # one excerpt per place, however many rules
            shown.add((group.path, group.line))
            excerpt = _excerpt(files.get(group.path), group.line, console.width - 4)
        if excerpt is not None:
            console.print(Padding(excerpt, (0, 0, 0, 2)))
        if group.evidence:
            _print_evidence(console, group.evidence, 4)
    if frees:
        _what_frees(frees, console)


def _what_frees(frees: list[Freeing], console: Console) -> None:
    """For each non-terminal state the backend's poll() returns: abort (and whether the scheduler
    calls it), a timeout (its variable and default) or a restart, so that the engineer on call
    knows what to do now."""
    for freeing in frees:
        cited = [e for e in freeing.evidence if f"{e.path}:{e.line}" not in freeing.text]  # not twice
        where = "; ".join(f"{e.path}:{e.line} {e.note}" for e in cited[:3])
        line = Text.assemble(("what frees ", "bold"), (freeing.state, "bold"), ": ", freeing.text)
        if where:
            line.append(f" (see {where})", "dim")
        _print_wrapped(console, line, 2)


def _excerpt(source: SourceFile | None, line: int, width: int, context: int = 2) -> Syntax | None:
    if source is None or not source.text:
        return None
    lines = source.lines
    if not 1 <= line <= len(lines):
        return None
    start, end = max(1, line - context), min(len(lines), line + context)
    # Long code lines are cut at a space with a marker, never mid-name by the terminal edge.
    room = max(20, width - len(str(end)) - 4)
    # The finding's own line is kept (what the finding is about may sit at its end), folded at
    # spaces under its code, up to a few rows (a generated line can be megabytes); its neighbours
    # are context only.
    shown = [_cut(plain(without_annotation(lines[n - 1])), room * (OWN_LINE_ROWS if n == line else 1))
             for n in range(start, end + 1)]
    return Syntax("\n".join(shown), "python", line_numbers=True, start_line=start, highlight_lines={line},
                  word_wrap=True, background_color="default", theme="ansi_dark")


OWN_LINE_ROWS = 4


def _cut(code: str, room: int) -> str:
    if len(code) <= room:
        return code
    cut = code.rfind(" ", 0, room - 2)
    return code[: cut if cut > room // 2 else room - 2].rstrip() + " …"


def _print_evidence(console: Console, evidence: list[Evidence], indent: int) -> None:
    """`path:line  note` rows; when the widest note word would not fit beside the paths, each
    note goes under its path instead, so neither is ever cut or folded (a path wider than the
    terminal is left whole on its own line)."""
    width = console.width - indent
    path_width = max((len(f"{e.path}:{e.line}") for e in evidence), default=0)
    longest_word = max((len(word) for e in evidence for word in e.note.split()), default=0)
    if path_width + 2 + max(longest_word, 24) <= width:
        table = Table.grid(padding=(0, 2))
        table.add_column(no_wrap=True, style="dim")
        table.add_column(overflow="fold")
        for e in evidence:
            table.add_row(Text(f"{e.path}:{e.line}"), _literal(e.note))
        console.print(Padding(table, (0, 0, 0, indent)))
        return
    for e in evidence:
        _print_wrapped(console, Text(f"{e.path}:{e.line}", style="dim"), indent)
        _print_wrapped(console, _literal(e.note), indent + 2)


def _details(report: Report, console: Console) -> None:
    for queue in report.queues:
        console.print()
        console.print(Text(f"Release map: {queue.name}", style="bold"))
        if queue.drain:
            _print_wrapped(console, Text(f"drain loop at {queue.drain.path}:{queue.drain.line} in {queue.drain.note}",
                                         style="dim"))
        by_function: dict[str, list] = defaultdict(list)
        for site in queue.sites:
            by_function[site.function].append(site)
        path_width = max((len(f"{s.path}:{s.line}") for s in queue.sites), default=10)
        for function, sites in by_function.items():
            console.print(Text(f"  {function}", style="italic"), no_wrap=True, overflow="ignore")
            _print_map(console, sites, path_width, 4)
        console.print()
        console.print(Text("Poll states", style="bold"))
        modes = modes_line(queue)
        if modes:
            head, _, rest = modes.partition(" ")
            _print_wrapped(console, Text(rest, style="dim"), 2, Text(head, style="dim"), len(head) + 1)
        state_width = max((len(s) for s in queue.states), default=0)
        for state, fate in queue.states.items():
            # state | `mode: fate`: a fate that wraps hangs under its column, never under the state.
            for i, (mode, described) in enumerate(state_fate_lines(queue, fate)):
                fate_text = Text()
                if mode:
                    fate_text.append(f"{mode}: ", "dim")
                for word in re.split(r"(\b(?:kept|leaves|raises|dropped)\b)", described):
                    fate_text.append(word, OUTCOME_STYLE.get(word, ""))
                _print_wrapped(console, fate_text, 2, Text(state if not i else ""), state_width + 2)
            where = [e for e in fate.evidence if e.kind not in (EventKind.CHECK, EventKind.HELPER)]
            if where:
                _print_evidence(console, where, 4)

    if report.backends:
        console.print()
        console.print(Text("Backends", style="bold"))
        abort_called = bool(scheduler_aborts(report))
        for b in report.backends:
            _print_backend_detail(console, b, abort_called)


def _print_map(console: Console, sites: list, path_width: int, indent: int) -> None:
    """`kind  path:line  states [note]` rows. When the states' longest word would not fit beside
    the paths (a long path, a narrow terminal), they go on their own line under the path,
    indented, so a state name is never cut and a note wraps with a hanging indent."""
    width = console.width - indent
    texts = []
    for site in sites:
        states = ", ".join(site.states)
        note = site.note
        owner = site.function.rpartition(".")[0]
        if owner and note.startswith(owner + "."):
            note = note[len(owner) + 1:]  # a method of the function's own class: its name is enough
        if note and site.kind not in ("check", "poll", "entry", "reassign", "raise"):
            states = f"{states} [{note}]" if states else f"[{note}]"
        if site.mode:  # a site of one mode of the drain only
            states = f"{states} (only when {site.mode})".lstrip()
        texts.append(states)
    longest = max((len(word) for text in texts for word in text.split()), default=0)
    own_width = max((len(f"{s.path}:{s.line}") for s in sites), default=0)
    if 8 + 2 + path_width + 2 + max(longest, 24) > width:
        path_width = own_width  # aligned with the other functions' tables only where that fits
    side_by_side = 8 + 2 + path_width + 2 + max(longest, 24) <= width
    if side_by_side:
        table = Table.grid(padding=(0, 2))
        table.add_column(no_wrap=True, min_width=8)
        table.add_column(no_wrap=True, min_width=path_width)
        table.add_column(overflow="fold")
        for site, text in zip(sites, texts):
            table.add_row(Text(site.kind), Text(f"{site.path}:{site.line}"), _literal(text))
        console.print(Padding(table, (0, 0, 0, indent)))
        return
    for site, text in zip(sites, texts):
        _print_wrapped(console, Text(f"{site.path}:{site.line}"), indent, Text(site.kind), 10)
        if text:
            _print_wrapped(console, _literal(text), indent + 12)


def _literal(text: str) -> Text:
    """A table cell shown as written: a plain str cell is read as rich markup, which would
    swallow source text such as `self.request_status[bootstrap_room]`. Lines stay lines;
    other control characters are shown escaped."""
    return Text("\n".join(plain(line) for line in text.split("\n")))


def _print_backend_detail(console: Console, b: Backend, abort_called: bool = True) -> None:
    rows: list[tuple[str, str]] = [("class", f"{b.sender}  {b.path}:{b.line}")]
    if b.poll:
        inherited = f" (inherited from {b.poll.inherited_from})" if b.poll.inherited_from else ""
        rows.append(("poll()", f"{b.poll.path}:{b.poll.line}{inherited}"))
    rows.append(("returns", "\n".join([", ".join(b.returns) or "-"] + unknown_returns(b))))
    abort = (f"read ({b.abort_state})" if b.reads_abort_state else
             f"not read (abort() writes {b.abort_state})" if b.abort_state else "none (no abort state)")
    if not b.reads_abort_state and abort_ended(b):
        abort += f"; {abort_ends_text(b)}"
    rows.append(("abort state", abort))
    timeouts = [f"{t.path}:{t.line} covers {', '.join(t.covers) or 'no state'}" for t in b.timeouts]
    rows.append(("timeouts", "\n".join(timeouts) or "none"))
    for state, verdict in b.verdicts.items():
        rows.append(("way out", f"{state}: {way_out_text(verdict, abort_called)}"))
    rows += [("note", note) for note in b.notes]
    console.print(Padding(Text(b.name, style="bold"), (0, 0, 0, 2)))
    label_width = max(len(label) for label, _ in rows) + 2
    for label, value in rows:
        _print_wrapped(console, _literal(value), 4, label, label_width)
