"""Text from outside (remote stderr, file names, SSH banners, exception messages) made safe to
print: control characters cannot move the cursor, recolour or clear the terminal, and rich
markup in it (`[bold]`, `[/x]`) is shown as written instead of being interpreted (or raising
MarkupError)."""

from __future__ import annotations

import re

from rich.markup import escape

# C0 and C1 controls and DEL; tab stays (harmless), newline is escaped so one message stays one line.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def plain(text: object) -> str:
    """`text` with every control character shown as an escape (`\\x1b`, `\\n`)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


def markup(text: object) -> str:
    """`plain(text)`, safe inside a rich markup string too."""
    return escape(plain(text))
