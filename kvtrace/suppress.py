"""In-code suppressions: `# kvtrace: ignore[pinned-state]` (rule ids or codes, comma-separated).

The grammar is strict, so a typo never silences more than was meant: only
`kvtrace: ignore[rule, ...]` after a `#` silences, anywhere in a line's comment (like ruff's
`noqa`: `# type: ignore[override]  # kvtrace: ignore[pinned-state]` counts). The keyword is
case-insensitive (`# KVTRACE: IGNORE[...]`, as ruff reads `# NOQA`), and so are rule names. A
comment that starts like a directive (`# kvtrace:` or `# kvtrace ignore`) but is not one
(`ignore[pinned-state` unclosed, `ignore[]`, `ignore-next-line`, `ignore: pinned-state`, a
bare `ignore` with no rules) silences nothing and is reported itself. There is no blanket
ignore: silencing every rule on a line would also hide the errors (a poll() that raises).

A comment silences a finding when it sits on the finding's line or on the `def` line of the
function that line is in (for a pinned state: the sender's `poll()`). Silenced findings stay in
the report, marked and counted, and never fail the scan. A comment that silences nothing is
reported itself (`unused-suppression`, as ruff's RUF100 does), so stale ones do not pile up.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field

from kvtrace.model import Finding
from kvtrace.parse import ParsedModule

# Something meant as a directive: `# kvtrace:` (the prefix is kvtrace's, as `# type:` is mypy's)
# or `# kvtrace ignore` / `# kvtrace-ignore` with the colon forgotten.
CANDIDATE = re.compile(r"#\s*kvtrace(?:\s*:|[\s_-]*(?:no)?ignore)", re.IGNORECASE)
# ... and what a directive must be: the rule list closed, before any further `#`.
DIRECTIVE = re.compile(r"#\s*kvtrace\s*:\s*ignore\[(?P<codes>[^\]#]*)\]", re.IGNORECASE)
RULE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
SHOWN = 60  # characters of a malformed directive quoted in its report


@dataclass
class Suppression:
    path: str
    line: int
    codes: tuple[str, ...]  # rule ids or codes as written; () for a malformed directive
    used: set[str] = field(default_factory=set)
    malformed: str | None = None  # the text of a directive that is not one (it silences nothing)


def parse_directives(comment: str) -> list[tuple[tuple[str, ...], str | None]]:
    """(codes, None) for each directive in one comment token, ((), text) for each malformed one."""
    found: list[tuple[tuple[str, ...], str | None]] = []
    for candidate in CANDIDATE.finditer(comment):
        match = DIRECTIVE.match(comment, candidate.start())
        codes = tuple(c.strip() for c in match.group("codes").split(",")) if match else ()
        if match and codes and all(RULE_NAME.fullmatch(c) for c in codes):
            found.append((codes, None))
        else:
            text = comment[candidate.start():].split("#", 2)
            shown = "#" + text[1].rstrip()
            found.append(((), shown if len(shown) <= SHOWN else shown[:SHOWN] + "..."))
    return found


def comments(module: ParsedModule) -> list[Suppression]:
    """The suppression comments of one file, from real comment tokens (never from strings)."""
    found: list[Suppression] = []
    text = module.source.text or ""
    if "kvtrace" not in text.lower():
        return found
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return found  # the file parsed with ast, so this is an odd edge; no comments then
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        for codes, malformed in parse_directives(token.string):
            found.append(Suppression(module.source.path, token.start[0], codes, malformed=malformed))
    return found


def enclosing_function(module: ParsedModule, line: int) -> tuple[str, range] | None:
    """(qualified name, lines of its `def` header) of the innermost function containing `line`.

    A function spans its decorators to its last line, so a finding on a decorator or on the
    `def` itself belongs to it; the header runs from `def` to the line before its body, so a
    comment at the end of a signature split over several lines counts.
    """
    best: tuple[str, range, int] | None = None  # (qualname, header lines, depth)

    def visit(node: ast.AST, prefix: str, depth: int) -> None:
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                end = child.end_lineno or child.lineno
                name = f"{prefix}{child.name}"
                if start <= line <= end:
                    if not isinstance(child, ast.ClassDef) and (best is None or depth >= best[2]):
                        header_end = max(child.lineno, child.body[0].lineno - 1)
                        best = (name, range(child.lineno, header_end + 1), depth)
                    visit(child, name + ".", depth + 1)
            else:
                visit(child, prefix, depth)

    visit(module.tree, "", 0)
    return (best[0], best[1]) if best else None


def _names(finding: Finding, codes: dict[str, str]) -> set[str]:
    names = {finding.rule}
    if finding.rule in codes:
        names.add(codes[finding.rule])
    return {n.lower() for n in names}


def apply(findings: list[Finding], modules: dict[str, ParsedModule], codes: dict[str, str],
          ) -> list[Suppression]:
    """Fill each finding's `function` and `suppressed`; return every suppression comment found
    (with `used` filled) so the caller can report the unused ones."""
    by_line: dict[tuple[str, int], list[Suppression]] = {}
    every: list[Suppression] = []
    for path in sorted(modules):
        for s in comments(modules[path]):
            by_line.setdefault((s.path, s.line), []).append(s)
            every.append(s)
    for finding in findings:
        module = modules.get(finding.path)
        if module is None:
            continue
        enclosing = enclosing_function(module, finding.line)
        if enclosing is not None and finding.function is None:
            finding.function = enclosing[0]
        lines = {finding.line, *(enclosing[1] if enclosing else ())}
        names = _names(finding, codes)
        for line in sorted(lines):
            for s in by_line.get((finding.path, line), []):
                hit = [c for c in s.codes if c.lower() in names]
                if hit:
                    s.used.update(hit)
                    if finding.suppressed is None:
                        finding.suppressed = f"{s.path}:{s.line}"
    return every


def unused(suppressions: list[Suppression], known: set[str]) -> list[tuple[Suppression, str, str]]:
    """(comment, code, why) for each code of a comment that silenced nothing."""
    known_lower = {k.lower() for k in known}
    out = []
    for s in suppressions:
        if s.malformed is not None:
            out.append((s, "", f"`{s.malformed}` is not a kvtrace directive and silences nothing "
                                "(write `# kvtrace: ignore[rule, ...]`, naming the rules)"))
            continue
        for code in s.codes:
            if code in s.used:
                continue
            if code.lower() not in known_lower:
                why = f"`{code}` is not a kvtrace rule"
            else:
                why = f"`{code}` silences no finding on this line"
            out.append((s, code, why))
    return out


def silence(findings: list[Finding], modules: dict[str, ParsedModule], report_unused: bool = True) -> list[Finding]:
    """The findings with `function` and `suppressed` filled, plus one `unused-suppression`
    finding per stale comment code (when that rule is selected)."""
    from kvtrace.rules import ALL_RULES
    from kvtrace.rules.unused_suppression import UnusedSuppression

    codes = {r.name: r.code for r in ALL_RULES}
    found = apply(findings, modules, codes)
    if not report_unused:
        return findings
    known = {r.name for r in ALL_RULES} | set(codes.values())
    rule = UnusedSuppression()
    extra = [rule.report_unused(s.path, s.line, why) for s, _, why in unused(found, known)]
    for finding in extra:
        enclosing = enclosing_function(modules[finding.path], finding.line)
        finding.function = enclosing[0] if enclosing else None
    return findings + extra
