"""Markdown that carries untrusted text (file, folder and function names, messages quoting
source) as text: a name never becomes HTML, a link, emphasis or a table column.

- `code(text)`: a code span whose backtick fence is longer than any backtick run inside;
- `prose(text)`: inline text with HTML special characters as entities and markdown
  punctuation backslash-escaped;
- `cell(markdown)`: any of the above made safe for a table cell (`|` escaped, one line);
- `html(text)`: for text inside an HTML block (`<summary>`), where markdown is not parsed.
"""

from __future__ import annotations

import re
from html import escape

# `_` inside a word (disagg_prefill_inflight_queue) never emphasises: left as it is, for raw readers.
_PUNCTUATION = re.compile(r"([\\`*\[\]~!#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def _one_line(text: str) -> str:
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text


def code(text: str) -> str:
    text = _one_line(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    if longest >= 2:
        # A fence of three backticks at the start of a line (a list item) opens a code block:
        # such text goes in an HTML code element, escaped like prose.
        return f"<code>{prose(text)}</code>"
    fence = "`" * (longest + 1)
    # A span that starts or ends with a backtick needs a space between it and the fence.
    pad = " " if text.startswith("`") or text.endswith("`") or (text.startswith(" ") and text.endswith(" ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def prose(text: str) -> str:
    return _PUNCTUATION.sub(r"\\\1", escape(_one_line(text), quote=False))


def cell(markdown: str) -> str:
    """A table cell: GFM splits rows on `|` before anything else, code spans included."""
    return _one_line(markdown).replace("|", "\\|")


def html(text: str) -> str:
    return escape(_one_line(text), quote=True)


def link(label_markdown: str, url: str | None) -> str:
    if not url:
        return label_markdown
    safe = url.replace("(", "%28").replace(")", "%29").replace(" ", "%20").replace("<", "%3C").replace(">", "%3E")
    return f"[{label_markdown}]({safe})"
