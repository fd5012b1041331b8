"""`kvtrace diff BASE HEAD`: what a change did to the queue.

BASE and HEAD are two trees, or two git revisions of the checkout in the working directory (each
read as stored objects into a temporary folder by kvtrace.gitread, so the checkout itself is never
touched and nothing from the repository runs).
Findings are matched by fingerprint (kvtrace.baseline: rule, backend, state, function), so code
that only moved is `unchanged`; release-map rows are matched by kind, file, function and note
(and their order among equals), never by line, and reported when the states reaching them moved.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from kvtrace.baseline import fingerprint
from kvtrace.model import FetchLimits, FetchResult, Finding, Report, Site, SourceFile


@dataclass
class SiteChange:
    kind: str
    path: str
    function: str
    note: str
    base: tuple[str, ...] | None  # None: the row is new in HEAD
    head: tuple[str, ...] | None  # None: the row is gone in HEAD
    base_line: int | None
    head_line: int | None


@dataclass
class Diff:
    base: Report
    head: Report
    added: list[Finding] = field(default_factory=list)
    fixed: list[Finding] = field(default_factory=list)
    unchanged: list[Finding] = field(default_factory=list)
    sites: list[SiteChange] = field(default_factory=list)
    fates: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # state -> (base, head)


def compare(base: Report, head: Report) -> Diff:
    diff = Diff(base, head)
    live = [f for f in base.findings if not f.suppressed]
    pool = Counter(fingerprint(f) for f in live)
    for finding in (f for f in head.findings if not f.suppressed):
        key = fingerprint(finding)
        if pool[key] > 0:
            pool[key] -= 1
            diff.unchanged.append(finding)
        else:
            diff.added.append(finding)
    for finding in live:
        if pool[fingerprint(finding)] > 0:
            pool[fingerprint(finding)] -= 1
            diff.fixed.append(finding)
    diff.sites = _site_changes(base, head)
    base_states = base.queues[0].states if base.queues else {}
    head_states = head.queues[0].states if head.queues else {}
    for state in dict.fromkeys([*base_states, *head_states]):
        before = base_states[state].fate if state in base_states else []
        after = head_states[state].fate if state in head_states else []
        if before != after:
            diff.fates[state] = (before, after)
    return diff


def _described(report: Report) -> list[tuple[Site, tuple[str, ...], str]]:
    """Each map row with what identifies it across an edit elsewhere: (kind, file, function,
    note, the statement's text) and, to tell identical statements apart, the code line above it."""
    texts = {f.path: f.lines for f in report.files}
    rows = []
    for site in sorted(report.queues[0].sites if report.queues else [], key=lambda s: (s.path, s.line, s.kind)):
        lines = texts.get(site.path, [])
        code = above = ""
        if 0 < site.line <= len(lines):
            code = " ".join(lines[site.line - 1].split())
            above = " ".join(next((lines[n] for n in range(site.line - 2, -1, -1) if lines[n].strip() and not lines[n].lstrip().startswith("#")), "").split())
        rows.append((site, (site.kind, site.path, site.function, site.note, code), above))
    return rows


def _match(before: list, after: list) -> list[tuple[Site, Site]]:
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
            pairs.append((before[i][0], after[j][0]))
    before[:] = [row for i, row in enumerate(before) if i not in used_old]
    after[:] = [row for j, row in enumerate(after) if j not in used_new]
    return pairs


def _site_changes(base: Report, head: Report) -> list[SiteChange]:
    """Rows matched by statement (and the line above it), never by line number."""
    before, after = _described(base), _described(head)
    pairs = _match(before, after)
    changes = [SiteChange(old.kind, old.path, old.function, old.note, old.states, new.states, old.line, new.line)
               for old, new in pairs if old.states != new.states]
    changes += [SiteChange(s.kind, s.path, s.function, s.note, s.states, None, s.line, None) for s, _, _ in before]
    changes += [SiteChange(s.kind, s.path, s.function, s.note, None, s.states, None, s.line) for s, _, _ in after]
    return sorted(changes, key=lambda c: (c.path, c.head_line or c.base_line or 0, c.kind))


class Checkout:
    """Two trees for BASE and HEAD: existing folders as they are, else git revisions read from
    the repository at `repo` by kvtrace.gitread (optionally only `subdir` of it)."""

    def __init__(self, repo: Path, subdir: str | None = None):
        self.repo = repo
        self.subdir = subdir
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
            return path / self.subdir if self.subdir else path
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

def _finding_line(f: Finding) -> str:
    where = " ".join(p for p in (f.backend, f.state) if p)
    return f"{f.severity}[{f.rule}] {where}  {f.path}:{f.line}".rstrip()


def _states(states: tuple[str, ...] | None) -> str:
    return "(gone)" if states is None else ", ".join(states) or "-"


def render_text(diff: Diff, base_label: str, head_label: str) -> str:
    out = [f"kvtrace diff {base_label} -> {head_label}"]
    for title, mark, items in (("added", "+", diff.added), ("fixed", "-", diff.fixed),
                               ("unchanged", "=", diff.unchanged)):
        out.append(f"\n{title} ({len(items)})")
        out += [f"  {mark} {_finding_line(f)}" for f in items]
    moved = [c for c in diff.sites if c.base is not None and c.head is not None]
    gone_or_new = len(diff.sites) - len(moved)
    out.append(f"\nrelease map: {len(moved)} row(s) moved state, {gone_or_new} row(s) added or removed")
    for c in diff.sites:
        line = f"{c.base_line}->{c.head_line}" if c.base_line and c.head_line else (c.head_line or c.base_line)
        label = f"{c.kind} {c.path}:{line} {c.function}" + (f" [{c.note}]" if c.note else "")
        out.append(f"  ~ {label}: {_states(c.base) if c.base is not None else '(new)'} -> {_states(c.head)}")
    if diff.fates:
        out.append("\nfates")
        out += [f"  ~ {state}: {', '.join(b) or '-'} -> {', '.join(h) or '-'}" for state, (b, h) in diff.fates.items()]
    out.append(f"\n{len(diff.added)} added, {len(diff.fixed)} fixed, {len(diff.unchanged)} unchanged")
    return "\n".join(out) + "\n"


def to_json(diff: Diff, base_label: str, head_label: str) -> str:
    def finding(f: Finding) -> dict[str, Any]:
        return {"rule": f.rule, "severity": f.severity, "backend": f.backend, "state": f.state,
                "function": f.function, "fingerprint": str(fingerprint(f)), "path": f.path, "line": f.line,
                "message": f.message}

    data = {
        "schema": "kvtrace-diff/1", "base": base_label, "head": head_label,
        "added": [finding(f) for f in diff.added], "fixed": [finding(f) for f in diff.fixed],
        "unchanged": [finding(f) for f in diff.unchanged],
        "sites": [{"kind": c.kind, "path": c.path, "function": c.function, "note": c.note,
                   "base": list(c.base) if c.base is not None else None,
                   "head": list(c.head) if c.head is not None else None,
                   "base_line": c.base_line, "head_line": c.head_line} for c in diff.sites],
        "fates": {state: {"base": b, "head": h} for state, (b, h) in diff.fates.items()},
    }
    return json.dumps(data, indent=2) + "\n"
