"""Text from outside (file and folder names, source excerpts, remote stderr, host names, SSH
banners, Prometheus labels, exception messages) made safe to print: control characters cannot
move the cursor, recolour, retitle or clear the terminal, a newline cannot forge a report line,
and rich markup in it (`[bold]`, `[/x]`) is shown as written instead of being interpreted (or
raising MarkupError).

`plain` is the one escaping function; `inert` applies it to every string of a report before a
text writer lays it out (rich would otherwise split a name at its newline before any per-line
escaping could see it). Data formats (JSON, SARIF) keep the exact strings: their own escaping
is already safe.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from typing import Any, TypeVar

# C0 and C1 controls and DEL (tab stays: harmless, and source code has it; newline is escaped so
# one value stays one line), Unicode line/paragraph separators, and the bidi embedding/override/
# isolate controls that reorder what the reader sees ("Trojan Source").
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

T = TypeVar("T")


def plain(text: object) -> str:
    """`text` with every control character shown as an escape (`\\x1b`, `\\n`, `\\u202e`)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


def markup(text: object) -> str:
    """`plain(text)`, safe inside a rich markup string too."""
    from rich.markup import escape  # here: rich.markup (most of rich) would cost every run ~5 ms

    return escape(plain(text))


def needs_escaping(text: str) -> bool:
    return _CONTROL.search(text) is not None


# Fields a text writer never shows as they are: raw bytes, caches, the exported graph.
_SKIPPED_FIELDS = frozenset({"data", "graphs"})


def inert(value: T) -> T:
    """A copy of `value` (a report, or any nesting of dataclasses, lists, tuples, sets and dicts)
    in which every string holding a control character has been through `plain`. Objects with
    nothing to escape are returned as they are (no copy), so the cost is one walk. Private
    fields (a source file's cached text) are left alone: excerpts escape their lines one by one,
    so line numbers stay Python's."""
    return rewrite_strings(value, lambda text: plain(text) if needs_escaping(text) else text, _SKIPPED_FIELDS)


def rewrite_strings(value: T, rewrite: Callable[[str], str], skipped: frozenset[str] = frozenset()) -> T:
    """A copy of `value` (any nesting of dataclasses, lists, tuples, namedtuples, sets and dicts)
    with `rewrite` applied to every string in it. Only what changed is copied: an object whose
    strings all come back as the same objects is returned as it is. Private fields and the
    dataclass fields named in `skipped` are left alone; a shared object is rewritten once."""
    return _walk(value, rewrite, skipped, {})


def _walk(value: Any, rewrite: Callable[[str], str], skipped: frozenset[str], memo: dict[int, Any]) -> Any:
    if isinstance(value, str):
        return rewrite(value)
    if value is None or isinstance(value, (int, float, bytes, bool)):
        return value
    key = id(value)
    if key in memo:
        return memo[key]
    result = value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_walk(item, rewrite, skipped, memo) for item in value]
        if any(new is not old for new, old in zip(items, value)):
            result = type(value)(items) if not isinstance(value, tuple) or type(value) is tuple \
                else type(value)(*items)  # a namedtuple takes its fields as arguments
    elif isinstance(value, dict):
        pairs = [(_walk(k, rewrite, skipped, memo), _walk(v, rewrite, skipped, memo)) for k, v in value.items()]
        if any(nk is not k or nv is not v for (nk, nv), (k, v) in zip(pairs, value.items())):
            result = type(value)(pairs) if type(value) is dict else dict(pairs)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            if f.name.startswith("_") or f.name in skipped:
                continue
            old = getattr(value, f.name)
            new = _walk(old, rewrite, skipped, memo)
            if new is not old:
                changed[f.name] = new
        if changed:
            result = copy.copy(value)
            for name, new in changed.items():
                object.__setattr__(result, name, new)  # frozen dataclasses too: this is a private copy
    memo[key] = result
    return result
