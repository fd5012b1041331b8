"""`kvtrace diff BASE HEAD`: what a change did to the queue.

BASE and HEAD are two trees, or two git revisions of the checkout in the working directory (each
read as stored objects into a temporary folder by kvtrace.gitread, so the checkout itself is never
touched and nothing from the repository runs).
Findings are matched by fingerprint (kvtrace.baseline: rule, queue, backend, state and the
site's role, never the function), so code that only moved is `moved` or `unchanged`; release-map
rows are matched by kind, file, function and note (and their order among equals), never by line,
and reported when the states reaching them moved.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from kvtrace.baseline import fingerprint
from kvtrace.safe_text import plain
from kvtrace.model import FetchLimits, FetchResult, Finding, Outcome, Report, Site, SourceFile
from kvtrace.report.places import Places

T = TypeVar("T")


@dataclass
class SiteChange:
    queue: str
    kind: str
    path: str
    function: str
    note: str
    base: tuple[str, ...] | None  # None: the row is new in HEAD
    head: tuple[str, ...] | None  # None: the row is gone in HEAD
    base_line: int | None
    head_line: int | None


@dataclass
class Moved:
    """One finding in both trees (same fingerprint) whose code now lives elsewhere: another file
    or another function (poll() moved into a base class). A line shift alone is `unchanged`."""

    base: Finding
    head: Finding


@dataclass
class Diff:
    base: Report
    head: Report
    added: list[Finding] = field(default_factory=list)
    fixed: list[Finding] = field(default_factory=list)
    moved: list[Moved] = field(default_factory=list)
    unchanged: list[Finding] = field(default_factory=list)
    sites: list[SiteChange] = field(default_factory=list)
    # (queue, state) -> (base fate, head fate), for every queue either side judged
    fates: dict[tuple[str, str], tuple[list[Outcome], list[Outcome]]] = field(default_factory=dict)

    @property
    def several_queues(self) -> bool:
        """Whether either side judged more than one queue: then every row says which."""
        return len({q.name for q in self.base.queues} | {q.name for q in self.head.queues}) > 1

    @property
    def incomplete(self) -> bool:
        return self.base.incomplete or self.head.incomplete


def _place(f: Finding) -> tuple[str, str | None]:
    return f.path, f.function


def compare(base: Report, head: Report, baseline: Counter | None = None) -> Diff:
    """Findings matched by fingerprint (kvtrace.baseline: what a finding is about, not where its
    code is): in HEAD only `added`, in BASE only `fixed`, in both `moved` when the code is in
    another file or function, else `unchanged`. Among equal fingerprints a pair in the same
    place is matched first. With `baseline`, added findings it holds are marked `unchanged`
    there and do not fail (kvtrace.gate)."""
    diff = Diff(base, head)
    waiting: dict[object, list[Finding]] = {}
    for finding in (f for f in base.findings if not f.suppressed):
        waiting.setdefault(fingerprint(finding), []).append(finding)
    for finding in (f for f in head.findings if not f.suppressed):
        candidates = waiting.get(fingerprint(finding), [])
        if not candidates:
            diff.added.append(finding)
            continue
        index = next((i for i, c in enumerate(candidates) if _place(c) == _place(finding)), None)
        before = candidates.pop(0 if index is None else index)
        if index is not None:
            diff.unchanged.append(finding)
        else:
            diff.moved.append(Moved(before, finding))
    unmatched = {id(f) for left in waiting.values() for f in left}
    diff.fixed = [f for f in base.findings if id(f) in unmatched]
    if baseline is not None:
        from kvtrace.baseline import apply

        apply(diff.added, baseline)
    diff.sites = _site_changes(base, head)
    base_queues = {q.name: q.states for q in base.queues}
    head_queues = {q.name: q.states for q in head.queues}
    for queue in dict.fromkeys([*base_queues, *head_queues]):
        base_states, head_states = base_queues.get(queue, {}), head_queues.get(queue, {})
        for state in dict.fromkeys([*base_states, *head_states]):
            before_fate = base_states[state].fate if state in base_states else []
            after = head_states[state].fate if state in head_states else []
            if before_fate != after:
                diff.fates[queue, state] = (before_fate, after)
    return diff


def localized(diff: Diff, base_places: Places, head_places: Places) -> Diff:
    """A copy of `diff` for people: every path, and every path in a message or note, as it opens
    from the working directory (BASE's findings against BASE's tree, HEAD's against HEAD's; a
    release-map row by the side it is still in). JSON keeps the trees' own paths."""
    shown = Diff(base_places.localized(diff.base), head_places.localized(diff.head))
    shown.added = head_places.localized(diff.added)
    shown.fixed = base_places.localized(diff.fixed)
    shown.moved = [Moved(base_places.localized(m.base), head_places.localized(m.head)) for m in diff.moved]
    shown.unchanged = head_places.localized(diff.unchanged)
    shown.sites = [dataclasses.replace(c, path=(head_places if c.head_line else base_places).path(c.path))
                   for c in diff.sites]
    shown.fates = diff.fates
    return shown


def _described(report: Report) -> list[tuple[Site, tuple[str, ...], str, str]]:
    """Each map row of every judged queue with what identifies it across an edit elsewhere:
    (queue, kind, file, function, note, the statement's text) and, to tell identical statements
    apart, the code line above it; last, its queue."""
    texts = {f.path: f.lines for f in report.files}
    rows: list[tuple[Site, tuple[str, ...], str, str]] = []
    for queue, site in sorted(((q.name, s) for q in report.queues for s in q.sites),
                              key=lambda qs: (qs[0], qs[1].path, qs[1].line, qs[1].kind)):
        lines = texts.get(site.path, [])
        code = above = ""
        if 0 < site.line <= len(lines):
            code = " ".join(lines[site.line - 1].split())
            above = " ".join(next((lines[n] for n in range(site.line - 2, -1, -1)
                                   if lines[n].strip() and not lines[n].lstrip().startswith("#")), "").split())
        rows.append((site, (queue, site.kind, site.path, site.function, site.note, code), above, queue))
    return rows


def _match(before: list, after: list) -> list[tuple[Site, Site, str]]:
    """Pair rows of the same statement, the most similar context first; remove the paired rows
    from both lists (what is left was added or removed)."""
    candidates = sorted(
        ((SequenceMatcher(None, old[2], new[2]).ratio(), i, j)
         for i, old in enumerate(before) for j, new in enumerate(after) if old[1] == new[1]),
        key=lambda c: (-c[0], c[1], c[2]),
    )
    used_old, used_new, pairs = set(), set(), []
    for _, i, j in candidates:
        if i not in used_old and j not in used_new:
            used_old.add(i)
            used_new.add(j)
            pairs.append((before[i][0], after[j][0], before[i][3]))
    before[:] = [row for i, row in enumerate(before) if i not in used_old]
    after[:] = [row for j, row in enumerate(after) if j not in used_new]
    return pairs


def _site_changes(base: Report, head: Report) -> list[SiteChange]:
    """Rows matched by statement (and the line above it), never by line number."""
    before, after = _described(base), _described(head)
    pairs = _match(before, after)
    changes = [SiteChange(queue, old.kind, old.path, old.function, old.note, old.states, new.states, old.line,
                          new.line) for old, new, queue in pairs if old.states != new.states]
    changes += [SiteChange(q, s.kind, s.path, s.function, s.note, s.states, None, s.line, None) for s, _, _, q in before]
    changes += [SiteChange(q, s.kind, s.path, s.function, s.note, None, s.states, None, s.line) for s, _, _, q in after]
    order = {name: n for n, name in enumerate(dict.fromkeys(q.name for q in (*head.queues, *base.queues)))}
    return sorted(changes, key=lambda c: (order.get(c.queue, len(order)), c.path, c.head_line or c.base_line or 0,
                                          c.kind))


class Checkout:
    """Two trees for BASE and HEAD: existing folders as they are, else git revisions read from
    the repository at `repo` by kvtrace.gitread (optionally only `subdir` of it)."""

    def __init__(self, repo: Path, subdir: str | None = None):
        from kvtrace.gitread import clean_subdir

        self.repo = repo
        self.subdir = subdir
        # Inside a folder as inside a revision: `--path /x` is the tree's x, never the machine's /x.
        self.inside = clean_subdir(subdir)
        self.stack = ExitStack()
        self.skipped: dict[Path, list[SourceFile]] = {}  # per exported tree: what it holds that no fetch can see

    def __enter__(self) -> "Checkout":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def tree(self, spec: str) -> Path:
        path = Path(spec)
        try:
            is_folder = path.is_dir()
        except OSError:  # a name too long to be a folder: maybe a revision
            is_folder = False
        if is_folder:
            return path / self.inside if self.inside else path
        return self._export(spec)

    def fetch(self, tree: Path, limits: FetchLimits = FetchLimits()) -> FetchResult:
        """The local fetch of `tree`, with the submodules and unreadable entries of an exported
        revision added as gaps."""
        from kvtrace.fetch.local import fetch_local

        fetched = fetch_local(tree, limits)
        fetched.files += self.skipped.get(tree, [])
        return fetched

    def _export(self, rev: str) -> Path:
        from kvtrace.gitread import export_revision, resolve_commit

        commit = resolve_commit(self.repo, rev)
        folder = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix=f"kvtrace-{commit[:12]}-")))
        exported = export_revision(self.repo, commit, self.subdir, folder, FetchLimits())
        self.skipped[exported.folder] = exported.skipped
        return exported.folder


# --- output ------------------------------------------------------------------------------------

# GitHub refuses a comment body over 65,536 characters; the markdown stays under this, with room
# for whatever a workflow wraps around it.
MARKDOWN_LIMIT = 60_000


def failed_findings(diff: Diff, fail_on: str) -> list[Finding]:
    """The added findings that fail the diff: at or above `fail_on`, not in the baseline."""
    from kvtrace.gate import failing

    return failing(diff.added, fail_on)


def verdict(diff: Diff, fail_on: str, source: str) -> str:
    """`failed: 1 error added (--fail-on error)`, `passed: ...`, or INCOMPLETE."""
    from kvtrace.gate import counted

    failed = failed_findings(diff, fail_on)
    if failed:
        return f"failed: {counted(failed)} added ({source})"
    if diff.incomplete:
        return "INCOMPLETE: the scan of BASE or HEAD could not analyse everything (exit 3)"
    worse = {"error": "error", "warning": "warning or error", "note": "finding", "never": "finding"}[fail_on]
    return f"passed: no {worse} added ({source})" if fail_on != "never" else f"passed ({source})"


def _where(f: Finding, queue: bool) -> str:
    """Backend and state, and the queue when the diff holds several (a finding of the same backend
    and state in two queues is two findings, not one printed twice)."""
    return " ".join(p for p in (f.backend, f.state, f"in {f.queue}" if queue and f.queue else None) if p)


def _finding_line(f: Finding, queue: bool = False) -> str:
    return f"{f.severity}[{f.rule}] {_where(f, queue)}  {f.path}:{f.line}".rstrip()


def _states(states: tuple[str, ...] | None) -> str:
    return "(gone)" if states is None else ", ".join(states) or "-"


def _moved_line(m: Moved, queue: bool = False) -> str:
    what = " ".join(p for p in (f"{m.head.severity}[{m.head.rule}]", _where(m.head, queue)) if p)
    functions = f" ({m.base.function} -> {m.head.function})" if m.base.function != m.head.function else ""
    return f"{what}  {m.base.path}:{m.base.line} -> {m.head.path}:{m.head.line}{functions}"


def _mark(f: Finding) -> str:
    return "  [in baseline]" if f.baseline == "unchanged" else ""


def _tally(diff: Diff) -> str:
    return (f"{len(diff.added)} added, {len(diff.fixed)} fixed, {len(diff.moved)} moved, "
            f"{len(diff.unchanged)} unchanged")


def render_text(diff: Diff, base_label: str, head_label: str, outcome: str | None = None, width: int = 1000) -> str:
    """`width`: the terminal's (scan's text folds the same way); rows wider are folded at spaces,
    continued under their own text, so a path or a name is never cut."""
    several = diff.several_queues
    out = [f"kvtrace diff {base_label} -> {head_label}"]
    out.append(f"\nadded ({len(diff.added)})")
    for f in diff.added:
        out.append(f"  + {_finding_line(f, several)}{_mark(f)}")
        out.append(f"      {' '.join(f.message.split())}")
        out += [f"      {e.path}:{e.line}  {e.note}" for e in f.evidence]
    out.append(f"\nfixed ({len(diff.fixed)})")
    out += [f"  - {_finding_line(f, several)}" for f in diff.fixed]
    out.append(f"\nmoved ({len(diff.moved)})")
    out += [f"  > {_moved_line(m, several)}" for m in diff.moved]
    out.append(f"\nunchanged ({len(diff.unchanged)})")
    out += [f"  = {_finding_line(f, several)}" for f in diff.unchanged]
    moved_rows = [c for c in diff.sites if c.base is not None and c.head is not None]
    gone_or_new = len(diff.sites) - len(moved_rows)
    out.append(f"\nrelease map: {len(moved_rows)} row(s) moved state, {gone_or_new} row(s) added or removed")
    for queue, changes in _by_queue(diff.sites, lambda c: c.queue):
        if several:
            out.append(f"  {queue}")
        out += [f"{'  ' if several else ''}  ~ {_site_label(c)}: "
                f"{_states(c.base) if c.base is not None else '(new)'} -> {_states(c.head)}" for c in changes]
    if diff.fates:
        out.append("\nfates")
        for queue, fates in _by_queue(diff.fates.items(), lambda item: item[0][0]):
            if several:
                out.append(f"  {queue}")
            out += [f"{'  ' if several else ''}  ~ {state}: {', '.join(b) or '-'} -> {', '.join(h) or '-'}"
                    for (_, state), (b, h) in fates]
    out.append(f"\n{_tally(diff)}" + (f"; {outcome}" if outcome else ""))
    # Names, notes and messages come from the two trees: no control character or newline of
    # theirs reaches the terminal or forges a line (each row's own leading blank line is ours).
    return "\n".join(("\n" + fold(plain(row[1:]), width)) if row.startswith("\n") else fold(plain(row), width)
                     for row in out) + "\n"


def _by_queue(items: Iterable[T], queue_of: Callable[[T], str]) -> list[tuple[str, list[T]]]:
    """Items grouped by queue, in the order the queues first appear."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(queue_of(item), []).append(item)
    return list(groups.items())


def fold(row: str, width: int) -> str:
    """A row wrapped at spaces to `width`, each continuation indented two more than the row; a
    word too wide for that is indented less, as far as it then fits, and one wider than the
    line stays whole on its own line (a path or a name is never cut)."""
    if len(row) <= width:
        return row
    lead = row[: len(row) - len(row.lstrip(" "))]
    lines: list[str] = []
    line = lead
    for gap, word in re.findall(r"( *)(\S+)", row[len(lead):]):
        if line.strip() and len(line) + len(gap) + len(word) > width:
            lines.append(line)
            line = " " * max(0, min(len(lead) + 2, width - len(word))) + word
        else:
            line += gap + word
    lines.append(line)
    return "\n".join(lines)


def _site_label(c: SiteChange) -> str:
    line = f"{c.base_line}->{c.head_line}" if c.base_line and c.head_line else (c.head_line or c.base_line)
    return f"{c.kind} {c.path}:{line} {c.function}" + (f" [{c.note}]" if c.note else "")


def _finding_json(f: Finding, evidence: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {"rule": f.rule, "id": f.code, "severity": f.severity, "queue": f.queue, "backend": f.backend,
            "state": f.state, "function": f.function, "fingerprint": str(fingerprint(f)), "path": f.path,
            "line": f.line, "message": f.message}
    if evidence:
        data["evidence"] = [{"path": e.path, "line": e.line, "note": e.note} for e in f.evidence]
    if f.baseline:
        data["baseline"] = f.baseline
    return data


def to_json(diff: Diff, base_label: str, head_label: str, fail_on: str | None = None,
            outcome: str | None = None) -> str:
    data = {
        "schema": "kvtrace-diff/3", "base": base_label, "head": head_label,
        "fail_on": fail_on, "verdict": outcome, "complete": not diff.incomplete,
        "added": [_finding_json(f, evidence=True) for f in diff.added],
        "fixed": [_finding_json(f) for f in diff.fixed],
        "moved": [{"base": _finding_json(m.base), "head": _finding_json(m.head)} for m in diff.moved],
        "unchanged": [_finding_json(f) for f in diff.unchanged],
        "sites": [{"queue": c.queue, "kind": c.kind, "path": c.path, "function": c.function, "note": c.note,
                   "base": list(c.base) if c.base is not None else None,
                   "head": list(c.head) if c.head is not None else None,
                   "base_line": c.base_line, "head_line": c.head_line} for c in diff.sites],
        "fates": {queue: {state: {"base": b, "head": h} for (_, state), (b, h) in fates}
                  for queue, fates in _by_queue(diff.fates.items(), lambda item: item[0][0])},
    }
    return json.dumps(data, indent=2) + "\n"


def _md(text: object) -> str:
    """Inline text for a markdown table cell or list item: no pipes, no newlines, no HTML."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\n", " ").replace("`", "'"))


def render_markdown(diff: Diff, base_label: str, head_label: str, outcome: str,
                    limit: int = MARKDOWN_LIMIT) -> str:
    """A pull-request comment: a title line with the tally, the verdict, then added findings (each
    with its evidence chain, folded), fixed and moved ones; unchanged ones and release-map rows
    folded. Always under `limit` characters: items that do not fit are left out and counted, with
    a pointer to the full JSON."""
    icon = ":x:" if outcome.startswith("failed") else \
        ":warning:" if outcome.startswith("INCOMPLETE") else ":white_check_mark:"
    title = [f"### {icon} kvtrace diff `{_md(base_label)}` → `{_md(head_label)}`: {_tally(diff)}", "",
             f"**{_md(outcome)}**", "", ""]
    sections: list[tuple[str, list[str], str]] = []  # (header, items, footer): items are cut whole
    several = diff.several_queues
    # With several queues the tables name each finding's queue (two queues' rows would look alike).
    queue_head, queue_rule = ("| queue ", "|---") if several else ("", "")

    def queue_cell(f: Finding) -> str:
        return f"| {_md(f.queue or '')} " if several else ""

    if diff.added:
        items = []
        for f in diff.added:
            where = _where(f, several)
            chain = "\n".join(f"{n}. `{_md(e.path)}:{e.line}` {_md(e.note)}" for n, e in enumerate(f.evidence, 1))
            items.append(f"<details><summary><b>{f.severity}</b> {f.code} {f.rule} {_md(where)} — "
                         f"<code>{_md(f.path)}:{f.line}</code>{' (in baseline)' if f.baseline == 'unchanged' else ''}"
                         f"</summary>\n\n{_md(' '.join(f.message.split()))}\n\n{chain}\n\n</details>\n")
        sections.append((f"#### Added ({len(diff.added)})\n", items, ""))
    if diff.fixed:
        sections.append((f"#### Fixed ({len(diff.fixed)})\n\n| severity | rule | backend | state {queue_head}| was at |\n"
                         f"|---|---|---|---{queue_rule}|---|",
                         [f"| {f.severity} | {f.code} {f.rule} | {_md(f.backend or '')} | {_md(f.state or '')} "
                          f"{queue_cell(f)}| `{_md(f.path)}:{f.line}` |" for f in diff.fixed], ""))
    if diff.moved:
        sections.append((f"#### Moved ({len(diff.moved)})\n\n| severity | rule | backend | state {queue_head}| from | to |\n"
                         f"|---|---|---|---{queue_rule}|---|---|",
                         [f"| {m.head.severity} | {m.head.code} {m.head.rule} | {_md(m.head.backend or '')} "
                          f"| {_md(m.head.state or '')} {queue_cell(m.head)}| `{_md(m.base.path)}:{m.base.line}` {_md(m.base.function or '')} "
                          f"| `{_md(m.head.path)}:{m.head.line}` {_md(m.head.function or '')} |" for m in diff.moved], ""))
    if diff.unchanged:
        sections.append((f"<details><summary>Unchanged ({len(diff.unchanged)})</summary>\n",
                         [f"- {f.severity} {f.code} {f.rule} {_md(_where(f, several))} "
                          f"`{_md(f.path)}:{f.line}`" for f in diff.unchanged], "\n</details>\n"))
    if diff.sites:
        sections.append((f"<details><summary>Release map: {len(diff.sites)} row(s) changed</summary>\n",
                         [f"- {_md((c.queue + ': ') if several else '')}{_md(_site_label(c))}: "
                          f"{_md(_states(c.base) if c.base is not None else '(new)')} → {_md(_states(c.head))}"
                          for c in diff.sites], "\n</details>\n"))
    cut = "_{n} item(s) left out to fit a comment: `kvtrace diff --format json` has everything._\n"
    out = ["\n".join(title)]
    budget = limit - len(out[0]) - len(cut) - 10
    left = 0
    for header, items, footer in sections:
        if len(header) + len(footer) + 2 > budget:
            left += len(items)
            continue
        out.append(header)
        budget -= len(header) + len(footer) + 2
        for item in items:
            if len(item) + 1 > budget:
                left += 1
                continue
            out.append(item)
            budget -= len(item) + 1
        out.append(footer)
    if left:
        out.append(cut.format(n=left))
    return "\n".join(out).rstrip("\n") + "\n"


def render_github(diff: Diff, outcome: str) -> str:
    """Workflow commands: an annotation on HEAD's file for each added finding (error/warning/notice
    by severity; notice when the baseline holds it), then the tally and verdict. Paths are the
    diff's as they are: give it `localized` so that they open from the working directory."""
    from kvtrace.report.github import LEVEL, _data, _property

    lines = []
    for f in diff.added:
        level = "notice" if f.baseline == "unchanged" else LEVEL.get(f.severity, "warning")
        where = " / ".join(p for p in (f.backend, f.state, f.queue if diff.several_queues else None) if p)
        title = f"kvtrace diff: added {f.rule}" + (f" ({where})" if where else "")
        chain = "\n".join(f"{e.path}:{e.line} {e.note}" for e in f.evidence)
        lines.append(f"::{level} file={_property(f.path)},line={f.line},title={_property(title)}::"
                     f"{_data(f.message + (chr(10) + chain if chain else ''))}")
    lines.append(f"kvtrace diff: {_tally(diff)}; {outcome}")
    return "\n".join(lines) + "\n"
