"""Report writers: text (rich), json (the kvtrace/2 contract), sarif, markdown."""

from __future__ import annotations

import io
import os
from typing import TextIO

from rich.console import Console

from kvtrace.model import Report


def plain_width() -> int:
    """Width for text that is not going to a terminal: COLUMNS when the user set it, else
    wide enough that no row is folded (each row stays one greppable line)."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) >= 40 else 1000


def render_text_stream(reports: list[Report], stream: TextIO, terminal: bool, show_map: bool = True) -> None:
    from kvtrace.report.text import render

    if terminal:
        console = Console(file=stream, highlight=False)
        for i, report in enumerate(reports):
            if i:
                console.print()
            render(report, console, show_map=show_map)
        return
    stream.write(render_plain(reports, width=plain_width(), show_map=show_map))


def render_plain(reports: list[Report], width: int = 1000, show_map: bool = True) -> str:
    """The text report as plain text: no colour, no trailing spaces."""
    from kvtrace.report.text import render

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, force_terminal=False, highlight=False,
                      color_system=None, emoji=False)
    for i, report in enumerate(reports):
        if i:
            console.print()
        render(report, console, show_map=show_map)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
