"""Report writers: text (rich), json (the kvtrace/2 contract), sarif, markdown, github, html, and
concise (kvtrace.report.concise: one line per finding, for hooks); `kvtrace scan --format` picks one."""

from __future__ import annotations

import io
import os
import sys
from typing import TYPE_CHECKING, TextIO

from kvtrace.model import ModeFate, QueueReport, Report, StateFate

if TYPE_CHECKING:  # rich is imported where a report is laid out: a kept rendering never needs it
    from rich.console import Console


def plain_width(piped: bool = False) -> int:
    """Width for text that is not going to a terminal: COLUMNS when the user set it; piped (to
    `less`, `head`) with stderr or /dev/tty on a terminal, that terminal's width, so it reads as it would
    on screen; else (a file, a CI log) wide enough that no row
    is folded (each row stays one greppable line)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= 40:
        return int(columns)
    if piped:
        width = _terminal_width()
        if width is not None and width >= 40:
            return width
    return 1000


def _terminal_width() -> int | None:
    """The terminal the user is looking at when stdout is piped: stderr's, else the controlling
    terminal (/dev/tty: `kvtrace scan X 2>&1 | less` pipes both). A CI runner or a test harness
    has no controlling terminal to open, so it gets the unfolded, greppable text."""
    try:
        return os.get_terminal_size(2).columns
    except OSError:
        pass
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return None
    try:
        return os.get_terminal_size(tty).columns
    except OSError:
        return None
    finally:
        os.close(tty)


def render_text_stream(reports: list[Report], stream: TextIO, terminal: bool, show_map: bool = True) -> None:

    if terminal:
        from rich.console import Console

        # No markup, no emoji codes: a name like `[/x]` or `:warning:` from the tree is text.
        console = Console(file=stream, highlight=False, markup=False, emoji=False)
        _render_all(reports, console, show_map)
        return
    stream.write(render_plain(reports, width=plain_width(piped=stream is sys.stdout), show_map=show_map))


def _render_all(reports: list[Report], console: Console, show_map: bool) -> None:
    """Each report in turn; with several (--role all), every report's short answer is repeated
    together at the end, its grids under one legend, so the end screen holds each role's
    answer, not only the last one's."""
    from kvtrace.report.text import print_legend, render, render_in_short

    several = show_map and len(reports) > 1
    for i, report in enumerate(reports):
        if i:
            console.print()
        render(report, console, show_map=show_map, in_short=not several)
    if several:
        legend: list[str] = []
        from kvtrace.fleet import report_label

        for report in reports:
            console.print()
            legend += render_in_short(report, console, several=True, label=report_label(report, reports))
        if legend:  # one legend for every grid above (each report's top grids have their own)
            console.print()
            print_legend(legend, console)


def render_plain(reports: list[Report], width: int = 1000, show_map: bool = True) -> str:
    """The text report as plain text: no colour, no trailing spaces."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, force_terminal=False, highlight=False,
                      color_system=None, emoji=False, markup=False)
    _render_all(reports, console, show_map)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


def mode_fate_text(fate: ModeFate) -> str:
    """A state's fate in one mode, read as a sentence: where it waits (kept on a path that never
    tests the poll value), then what happens once it no longer waits."""
    then = ", ".join(fate.then)
    if not fate.waits:
        return ", ".join(fate.fate) or "-"
    waits = " or ".join(f"while {w.note} ({w.path}:{w.line})" if w.note else f"whatever the poll says ({w.path}:{w.line})"
                        for w in fate.waits)
    return f"waits {waits}, then {then}" if then else f"waits {waits}"


def state_fate_lines(queue: QueueReport, fate: StateFate) -> list[tuple[str, str]]:
    """(mode label, fate text) per mode of the drain; one row with no label when it has one mode."""
    if not fate.modes:
        return [("", ", ".join(fate.fate) or "-")]
    if len(fate.modes) == 1:
        return [("", mode_fate_text(fate.modes[0]))]
    return [(m.mode, mode_fate_text(m)) for m in fate.modes]


def modes_line(queue: QueueReport) -> str | None:
    """The modes of the drain and who calls it so, when a parameter decides anything."""
    if not queue.modes or (len(queue.modes) == 1 and not queue.modes[0].passed and queue.modes[0].label == "default"):
        return None
    parts = []
    for mode in queue.modes:
        callers = ", ".join(f"{c.path}:{c.line}" for c in mode.callers) or "no caller in the tree"
        parts.append(f"{mode.label} (called so at {callers})" if mode.callers else f"{mode.label} ({callers})")
    return "modes: " + "; ".join(parts)
