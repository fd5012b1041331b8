"""What every report format shows first, computed once from a Report: the backend x state verdict
grid, the findings grouped by backend (states of one rule at one place merged), the summary line
and the one-line account of what was not analysed. Generic over rules, states and backends."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtrace.baseline import counts_against, mark, tally
from kvtrace.rulemeta import consequence_of
from kvtrace.model import (Backend, Evidence, Finding, Gap, GapKind, PremiseKind, QueueReport, Report, SEVERITIES_WORST_FIRST,
                           Severity, StateVerdict, WayOut)

OK = "ok"
NOT_RETURNED = "-"
UNKNOWN = "?"
NOT_CHECKED = "?"


def unknown_returns(backend: Backend) -> list[str]:
    """`unknown: <why>` for each reason poll() may return a value kvtrace cannot follow: shown
    apart from the states it is known to return, so "can return" never reads as "unknown"."""
    return [f"unknown: {why}" for why in dict.fromkeys(backend.returns_unknown)]


WAY_OUT_TEXT = {WayOut.ABORT: "abort() then poll() ends it", WayOut.TIMEOUT: "a timeout ends it",
                WayOut.NONE: "none (pinned)"}


# abort() ends the state, but no scheduler loop over the queue calls it (kvtrace.freeing): the
# same fact "what frees" states, so the two never read as a contradiction.
ABORT_UNCALLED = "abort() would end it, but nothing scanned calls abort()"


def way_out_text(verdict: StateVerdict, abort_called: bool = True) -> str:
    """One state's way out in a few words (JSON `verdicts` has the full `how` and chain); an
    undecided one says why. `abort_called`: whether the scheduler calls the sender's abort() for
    a request in the queue (kvtrace.freeing.scheduler_aborts)."""
    if verdict.way_out is WayOut.ABORT and not abort_called:
        return ABORT_UNCALLED
    text = WAY_OUT_TEXT.get(verdict.way_out) or verdict.how
    if verdict.chain and verdict.way_out is WayOut.NONE:  # the chain opens with the return that yields it
        text += f", returned at {verdict.chain[0].path}:{verdict.chain[0].line}"
    return text


def rule_label(finding: Finding, short: bool = False) -> str:
    """The grid's word for a finding: its rule's name (upper case for an error, so it stands out
    in plain text too), or its code where names would not fit."""
    if short:
        return finding.code or finding.rule
    return finding.rule.upper() if finding.severity == "error" else finding.rule


@dataclass
class Grid:
    queue: str
    states: list[str]
    backends: list[str]
    cells: dict[tuple[str, str], tuple[str, str | None]]  # (backend, state) -> (text, severity)
    legend_items: list[str]  # one explanation per item; never split between a code and its name

    @property
    def legend(self) -> str:
        return " · ".join(self.legend_items)


def _queue(report: Report, queue: QueueReport | None = None) -> QueueReport | None:
    return queue if queue is not None else (report.queues[0] if report.queues else None)


def _states(report: Report, queue: QueueReport | None = None) -> list[str]:
    queue = _queue(report, queue)
    if queue is not None and queue.states:
        return list(queue.states)
    seen: list[str] = []
    for b in report.backends:
        seen.extend(s for s in b.returns if s not in seen)
    return seen


def unchecked_backends(report: Report) -> list[str]:
    checked = {b.name for b in report.backends}
    return [g.subject for g in report.gaps if g.kind == "backend" and g.subject not in checked]


def partial_backends(report: Report) -> set[str]:
    checked = {b.name for b in report.backends}
    return {g.subject for g in report.gaps if g.kind == "backend" and g.subject in checked}


def _concerns(finding: Finding, backend: Backend) -> bool:
    """Whether a finding that names no backend belongs in this backend's row. A queue rule's is
    about the drain loop, which every backend meets; a backend rule's (a manager method whose
    backend the rule did not name) belongs to the backends whose manager runs that method
    (`Finding.backends`, from kvtrace.managers), never to every row nor to a folder's."""
    from kvtrace.rulemeta import find_rule_meta  # only a grid asks: JSON's summary line does not

    rule = find_rule_meta(finding.rule)
    if rule is None or rule.per_queue:
        return True
    return backend.name in finding.backends


def _of_queue(finding: Finding, queue: QueueReport | None) -> bool:
    """A finding about one queue's drain belongs in that queue's grid only; one about the
    backends alone (no queue) in every grid."""
    return finding.queue is None or queue is None or finding.queue == queue.name


def rules_left_out(report: Report) -> list[str]:
    """The rules that place findings in the grid's cells (their samples name a state) that
    --select/--ignore or [tool.kvtrace] left out of this scan: with any, a cell where the rules
    run find nothing is not `ok`, since a rule that was not run may fire there."""
    from kvtrace.rulemeta import RULES

    select, ignore = set(report.filters.select), set(report.filters.ignore)
    left_out = []
    for rule in RULES:
        names = {rule.name, rule.code}
        if (select and not names & select) or names & ignore:
            if rule.marks_cells:
                left_out.append(rule.name)
    return left_out


# The grid's last column when a backend has an error about no one state (poll() raises, whatever
# it was asked): without it such an error is in the summary but nowhere in the grid.
# Short, so that a grid that fit 80 columns still fits with rule codes in its cells.
BACKEND_WIDE = "any"
BACKEND_WIDE_LEGEND = "any: a finding about the backend whatever the state (the worst)"

PARTIAL = "*"  # after a backend's name: checked without some of its files
# After a cell's rule: the finding holds only under a premise (two requests share a room, ...).
CONDITIONAL = "~"

# Why a cell reads `?`, each pointing at the part of the report that explains it.
WHY_UNKNOWN = {
    "unchecked": "backend not checked (see INCOMPLETE)",
    "no-drain": "drain loop not analysed (see INCOMPLETE)",
    "undrained": "no drain loop found (see undrained-queue)",
    "returns": "poll() may return it through a value kvtrace cannot follow (see unknown: under Backends)",
    "way-out": "way out not decided (see INCOMPLETE)",
    "rules": "no finding from the rules run, but rules that judge it were left out (see the header)",
}


def verdict_grid(report: Report, short: bool = False, queue: QueueReport | None = None) -> Grid:
    """The backend x state grid for `queue` (default: the report's first queue). A cell says
    `ok` only when the scan established it: the drain loop was analysed and the backend's way
    out decided; anything less reads `?`, with the legend saying why and where to look."""
    queue = _queue(report, queue)
    states = _states(report, queue)
    partial = partial_backends(report)
    # No drain loop read: whether the drain keeps a state is unknown, so no pin can be ruled out.
    drain_unknown = queue is None or queue.drain is None
    narrowed = bool(rules_left_out(report))
    rows: list[str] = []
    cells: dict[tuple[str, str], tuple[str, str | None]] = {}
    used: set[str] = set()
    why: set[str] = set()
    for b in report.backends:
        row = f"{b.name}{PARTIAL}" if b.name in partial else b.name
        rows.append(row)
        for state in states:
            hits = [f for f in report.findings
                    if f.state == state and not f.suppressed and _of_queue(f, queue)
                    and (f.backend == b.name or (f.backend is None and _concerns(f, b)))]
            error = any(f.severity == "error" for f in hits)
            unseen = b.poll is None or (state not in b.returns and not any(f.backend == b.name for f in hits))
            verdict = b.way_out(state)
            if b.poll is not None and b.returns_unknown and (unseen or not b.returns):
                # poll() also returns values kvtrace could not follow: this state may be one of them.
                cells[row, state] = (UNKNOWN, "warning")
                why.add("returns")
            elif unseen:
                cells[row, state] = (NOT_RETURNED, None)
            elif verdict is not None and verdict.way_out is WayOut.UNKNOWN and not error:
                cells[row, state] = (UNKNOWN, "warning")  # whether it pins is not decided: never "ok"
                why.add("way-out")
            elif drain_unknown and not error:
                cells[row, state] = (UNKNOWN, "warning")  # the drain was not read: never "ok"
                why.add("no-drain" if report.gaps else "undrained")
            elif hits:
                # Among equals, the rule that says what happens to the request (pins, drops).
                worst = min(hits, key=lambda f: (_worst_first(f.severity), consequence_of(f.rule) is None))
                label = rule_label(worst, short)
                if worst.premise:  # a pin that holds only under a premise: the legend says which
                    label += CONDITIONAL
                    why.add(f"premise:{worst.premise}")
                cells[row, state] = (label, worst.severity)
            elif narrowed:
                cells[row, state] = (UNKNOWN, "warning")  # a rule left out may fire here: never "ok"
                why.add("rules")
            else:
                cells[row, state] = (OK, None)
            used.add(cells[row, state][0])
    wide = _backend_wide(report, queue, short)
    if wide:
        for backend in report.backends:
            row = f"{backend.name}{PARTIAL}" if backend.name in partial else backend.name
            cells[row, BACKEND_WIDE] = wide.get(backend.name, ("", None))
            used.add(cells[row, BACKEND_WIDE][0])
        states = [*states, BACKEND_WIDE]
    for name in unchecked_backends(report):
        rows.append(name)
        for state in states:
            cells[name, state] = (NOT_CHECKED, "warning")
        used.add(NOT_CHECKED)
        why.add("unchecked")
    name = queue.name if queue is not None else "the queue"
    legend = _legend(report, used, bool(partial), short, why) + ([BACKEND_WIDE_LEGEND] if wide else [])
    return Grid(name, states, rows, cells, legend)


def _backend_wide(report: Report, queue: QueueReport | None, short: bool) -> dict[str, tuple[str, str | None]]:
    """backend -> the cell for its worst finding about no one state (poll-raises, abort-ignored),
    when some backend has such an error in this queue; else nothing (no column)."""
    worst: dict[str, Finding] = {}
    for f in report.findings:
        if f.state or not f.backend or f.suppressed or not _of_queue(f, queue):
            continue
        rank = (_worst_first(f.severity), f.rule)
        if f.backend not in worst or rank < (_worst_first(worst[f.backend].severity), worst[f.backend].rule):
            worst[f.backend] = f
    if not any(f.severity == "error" for f in worst.values()):
        return {}
    return {backend: (rule_label(f, short) + (CONDITIONAL if f.premise else ""), f.severity)
            for backend, f in worst.items()}


def verdict_grids(report: Report, short: bool = False) -> list[Grid]:
    """One grid per queue the pack names (decode: the prealloc and the transfer queue)."""
    if not report.queues:
        return [verdict_grid(report, short)]
    return [verdict_grid(report, short, queue) for queue in report.queues]


_SHORT_PREMISE = 160  # characters: two lines at 80 columns
_ANY_PREMISE = f"{CONDITIONAL}: a warning, it holds only under the premise its finding states"


def _legend(report: Report, used: set[str], partial: bool, short: bool, why: set[str]) -> list[str]:
    parts = []
    if short:
        labels = {rule_label(f, True): f.rule for f in report.findings if f.state or f.backend}
        parts += [f"{label}: {rule}" for label, rule in sorted(labels.items())
                  if label in used or label + CONDITIONAL in used]
    if OK in used:
        parts.append("ok: poll() returns it, it has a way out")
    if NOT_RETURNED in used:
        parts.append("-: poll() never returns it")
    if UNKNOWN in used:
        reasons = [text for key, text in WHY_UNKNOWN.items() if key in why] or ["not checked"]
        parts.append("?: " + "; or ".join(reasons))
    premises = sorted(key.split(":", 1)[1] for key in why if key.startswith("premise:"))
    if premises:
        told = f"{CONDITIONAL}: a warning, it holds only if {' or '.join(premises)}"
        # Short labels are for a narrow screen: a premise of several lines is left to its finding.
        parts.append(told if not short or len(told) <= _SHORT_PREMISE else _ANY_PREMISE)
    if partial:
        parts.append(f"{PARTIAL}: checked without some of its files")
    return parts


def merged_legend(items: list[str]) -> list[str]:
    """One legend for several grids: each item once, the codes first (in order); where grids
    explain one mark differently, one item: the reasons for `?` joined, and for a premise's mark
    the premise left to each finding."""
    merged: dict[str, str] = {}
    for item in items:
        mark, _, text = item.partition(": ")
        known = merged.get(mark)
        if known is None or known == item:
            merged[mark] = item
        elif mark == UNKNOWN:
            reasons = known.partition(": ")[2].split("; or ")
            merged[mark] = f"{UNKNOWN}: " + "; or ".join(dict.fromkeys(reasons + text.split("; or ")))
        else:
            merged[mark] = _ANY_PREMISE if mark == CONDITIONAL else known
    marks = {OK, NOT_RETURNED, UNKNOWN, CONDITIONAL, PARTIAL, BACKEND_WIDE}
    return sorted(item for mark, item in merged.items() if mark not in marks) + \
        [item for mark, item in merged.items() if mark in marks]


def _worst_first(severity: str) -> int:
    """A sort key: errors first, then warnings, then notes."""
    return -Severity(severity).rank


def by_severity(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then notes; by place within each (the order a reader wants)."""
    return sorted(findings, key=lambda f: (_worst_first(f.severity), f.path, f.line, f.rule,
                                           f.backend or "", f.state or ""))


@dataclass
class FindingGroup:
    """Findings of one rule at one place for one backend: one excerpt, the states listed."""

    rule: str
    severity: str
    path: str
    line: int
    backend: str | None
    mark: str = ""  # why it does not fail the scan (suppressed, in baseline) or that it is new
    queue: str | None = None  # the queue whose drain it is about (None: the backends alone)
    states: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def message(self) -> str:
        return merged_message(self.findings)

    @property
    def evidence(self) -> list[Evidence]:
        return merged_evidence(self.findings)


def finding_groups(report: Report) -> dict[str | None, list[FindingGroup]]:
    """backend (None: the queue itself, every backend) -> its finding groups, worst first."""
    order = {name: i for i, name in enumerate(_states(report))}
    backend_order = {b.name: i for i, b in enumerate(report.backends)}
    groups: dict[tuple, FindingGroup] = {}
    for f in report.findings:
        # An error and a warning at one line stay apart: a group is told under one severity.
        key = (f.backend, f.rule, f.path, f.line, mark(f), f.queue, f.severity)
        group = groups.setdefault(key, FindingGroup(f.rule, f.severity, f.path, f.line, f.backend, mark(f), f.queue))
        group.findings.append(f)
        if f.state and f.state not in group.states:
            group.states.append(f.state)
    for group in groups.values():
        group.states.sort(key=lambda s: order.get(s, len(order)))
        group.findings.sort(key=lambda f: order.get(f.state or "", len(order)))
    result: dict[str | None, list[FindingGroup]] = {}
    ranked = sorted(groups.values(), key=lambda g: (
        min(_worst_first(x.severity) for x in groups.values() if x.backend == g.backend),
        -1 if g.backend is None else backend_order.get(g.backend, len(backend_order)),
        g.backend or "", _worst_first(g.severity), g.path, g.line, g.rule))
    for group in ranked:
        result.setdefault(group.backend, []).append(group)
    return result


def shared_sections(groups: list[FindingGroup]) -> list[tuple[str, list[FindingGroup]]]:
    """The groups of findings that name no backend, under what they are about: the queue's drain
    loop, which every backend meets, or a manager's method, which only the backends whose
    managers run it meet (the grid's rows for it). In the order the groups come."""
    sections: dict[str, list[FindingGroup]] = {}
    for group in groups:
        sections.setdefault(_shared_label(group.findings[0]), []).append(group)
    return list(sections.items())


def _shared_label(finding: Finding) -> str:
    if finding.backends and finding.function and "." in finding.function:
        manager = finding.function.rsplit(".", 1)[0]
        return f"manager {manager} (backend{'s' if len(finding.backends) > 1 else ''} {_join(list(finding.backends))})"
    return "the queue (every backend)"


def _join(states: list[str]) -> str:
    return states[0] if len(states) == 1 else ", ".join(states[:-1]) + " and " + states[-1]


_WORD = re.compile(r"(\w+)")


def merged_by_position(texts: list[tuple[str, str]]) -> str | None:
    """One text for several (text, state) pairs whose words differ only where each holds its own
    state, at the same positions in all: there the states are listed, the rest is kept as it is
    (a state named in the shared part stays as written). None when they differ anywhere else."""
    if len(texts) < 2:
        return texts[0][0] if texts else None
    split = [_WORD.split(text) for text, _ in texts]
    if len({len(words) for words in split}) != 1:
        return None
    states = [state for _, state in texts]
    listed = _join(states)
    merged = []
    for words in zip(*split):
        if len(set(words)) == 1:
            merged.append(words[0])
        elif list(words) == states:
            merged.append(listed)
        else:
            return None
    return "".join(merged)


def merged_message(findings: list[Finding]) -> str:
    """One message for several states when the messages differ only by the state's name."""
    if len(findings) == 1 or any(not f.state for f in findings):
        return findings[0].message if len(findings) == 1 else "\n".join(f.message for f in findings)
    merged = merged_by_position([(f.message, f.state or "") for f in findings])
    return merged if merged is not None else "\n".join(f.message for f in findings)


def merged_evidence(findings: list[Finding]) -> list[Evidence]:
    """The findings' evidence in order, one row per place; notes that differ only by the
    state's name are merged the same way as the messages."""
    rows: dict[tuple[str, int], list[tuple[str | None, str]]] = {}
    for f in findings:
        for e in f.evidence:
            notes = rows.setdefault((e.path, e.line), [])
            if all(note != e.note for _, note in notes):
                notes.append((f.state, e.note))
    merged: list[Evidence] = []
    for (path, line), notes in rows.items():
        together = merged_by_position([(note, state) for state, note in notes if state]) \
            if len(notes) > 1 and all(state for state, _ in notes) else None
        if together is not None:
            merged.append(Evidence(path, line, together))
        else:
            merged.extend(Evidence(path, line, note) for _, note in notes)
    return merged


def package_place(report: Report) -> str:
    """Where the package is, for a header: `package disaggregation/` below the target, or the
    target itself, named by its folder (`the target is the package (my_fork/)`: a package of any
    name is recognised by what it defines)."""
    if report.root:
        return f"package {report.root}/"
    name = report.target.rstrip("/").rsplit("/", 1)[-1]
    named = f" ({name}/)" if name and name not in (".", "..") and ":" not in name else ""
    return f"the target is the package{named}"


def backend_label(name: str | None, info: Backend | None) -> str:
    if name is None:
        return "the queue (every backend)"
    if info is None:
        return name
    if info.poll is not None:
        return f"{name}: {info.sender}.poll() at {info.poll.path}:{info.poll.line}"
    return f"{name}: {info.sender} at {info.path}:{info.line}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def gap_text(gaps: list[Gap], more: int = 0) -> str:
    """`2 files not analysed, backend nixl not checked, 1 analysis problem`."""
    files = sum(1 for g in gaps if g.kind is GapKind.FILE)
    parts = []
    if files:
        parts.append(f"{_plural(files, 'file')} not analysed")
    unchecked = [g.subject for g in gaps if g.kind is GapKind.BACKEND and not g.partial]
    partial = [g.subject for g in gaps if g.kind is GapKind.BACKEND and g.partial]
    if unchecked:
        parts.append(f"backend{'s' if len(unchecked) > 1 else ''} {', '.join(unchecked)} not checked")
    if partial:
        parts.append(f"backend{'s' if len(partial) > 1 else ''} {', '.join(partial)} checked in part")
    problems = sum(1 for g in gaps if g.kind is GapKind.ANALYSIS)
    if problems:
        parts.append(_plural(problems, "analysis problem"))
    if more > 0:
        parts.append(f"{more} more")
    return ", ".join(parts)


def _named(findings: list[Finding], several: bool = False, reached: Callable[[Finding], list[str]] | None = None) -> str:
    """`nixl pins Bootstrapping, WaitingForInput; nixl: poll-raises`, each with its premise if it
    has one (`... only if two requests share a bootstrap_room`); with `several` queues judged,
    each names its queue (`nixl pins WaitingForInput in disagg_decode_transfer_queue`). A finding
    of no one backend about a state names the backends it reaches (`reached`), as its grid shows;
    states are named together only where they reach the same backends."""
    what: dict[tuple[str | None, str, str | None, str | None, tuple[str, ...]], list[str]] = {}
    for f in findings:
        backends = tuple(reached(f)) if reached is not None and f.backend is None else ()
        states = what.setdefault((f.backend, f.rule, f.premise, f.queue if several else None, backends), [])
        if f.state and f.state not in states:
            states.append(f.state)
    named = []
    for (backend, rule, premise, queue, backends), states in what.items():
        consequence = consequence_of(rule)  # "nixl pins ...": what happens to the request; else the rule's id
        if backend is None and queue:  # a finding of no one backend, with several queues: where it is
            said = f"{rule} {', '.join(states)} in {queue}" if states else f"{queue}: {rule}"
        else:
            subject = backend or "queue"
            said = (f"{subject} {consequence.verb if consequence else rule} {', '.join(states)}" if states
                    else f"{subject}: {rule}") + (f" in {queue}" if queue else "")
        named.append(said + (f" ({', '.join(backends)})" if backends else "") + (f" only if {premise}" if premise else ""))
    return "; ".join(named)


def _reached(report: Report) -> Callable[[Finding], list[str]]:
    """The backends a finding of no one backend about a state reaches: those whose poll() returns
    the state and whose row it belongs in (the grid's cells that show it), in the report's order."""
    def reached(finding: Finding) -> list[str]:
        if finding.state is None:
            return []
        return [b.name for b in report.backends
                if b.poll is not None and finding.state in b.returns and _concerns(finding, b)]
    return reached


def _conditional(findings: list[Finding], several: bool = False) -> str:
    """The warnings an on-call reader looks for by name: a pin that holds only under a premise,
    and any finding that rests on a caller outside the scanned folder (an error, or nothing,
    when the folder that holds the callers is scanned)."""
    return _named([f for f in findings if f.premise and (
        (f.backend and consequence_of(f.rule) and f.state) or PremiseKind.UNSEEN_CALLER in f.premise_kinds)], several)


@dataclass(frozen=True)
class SummaryPart:
    """One part of the summary line: a severity's count and what it names (`2 errors: nixl pins
    WaitingForInput`), or a line of its own (`No findings`, what suppressions silenced)."""

    text: str
    severity: str | None = None  # the severity counted; None for a part that counts none
    named: str = ""  # the findings named after the count; "" when only counted


@dataclass(frozen=True)
class Summary:
    """What the summary line says, in parts a writer can pick from without re-reading the line."""

    parts: tuple[SummaryPart, ...]
    incomplete: str | None  # why the scan is incomplete (its gaps), None when complete

    def line(self) -> str:
        line = " · ".join(p.text for p in self.parts)
        return line + (f" · INCOMPLETE: {self.incomplete}" if self.incomplete is not None else "")


def summary_line(report: Report) -> str:
    """`2 errors: nixl pins WaitingForInput, Transferring · 1 warning · 3 notes · INCOMPLETE: ...`:
    errors are named (backend, what, states); warnings and notes are counted."""
    return summarize(report).line()


def summarize(report: Report) -> Summary:
    """The summary line's parts: errors named, warnings and notes counted (a warning named when
    it is a pin under a premise or rests on a caller outside the folder), then what was silenced."""
    parts: list[SummaryPart] = []
    order = {name: i for i, name in enumerate(_states(report))}
    findings = sorted((f for f in report.findings if counts_against(f)), key=lambda f: order.get(f.state or "", len(order)))
    for severity in SEVERITIES_WORST_FIRST:
        found = [f for f in findings if f.severity == severity]
        if not found:
            if severity == "warning" and findings:
                parts.append(SummaryPart("0 warnings", severity))
            continue
        # A pin that holds only under a premise is a warning, but it is still the answer an
        # on-call reader looks for: name it with what it rests on.
        several = len(report.queues) > 1
        named = _named(found, several, _reached(report)) if severity == "error" else _conditional(found, several)
        counted = _plural(len(found), severity)
        parts.append(SummaryPart(f"{counted}: {named}" if named else counted, severity, named))
    if not findings:
        parts.append(SummaryPart("No findings in what was analysed" if report.gaps else "No findings"))
    silenced = tally(report.findings)
    if silenced:
        parts.append(SummaryPart(silenced))
    return Summary(tuple(parts), gap_text(report.gaps) if report.gaps else None)
