"""`--format markdown`: a bug report that fits an issue. A title line that is the answer, the
summary and the verdict grid; then what pins, per backend, with its chain of path:line, its code
and its state diagram; every other finding in one line; the environment. The rest (the other
backends' diagrams, each finding's evidence, the release map, the fates, the backends) is folded
in `<details>` while the document stays under MARKDOWN_BUDGET characters (GitHub refuses an issue
body over 65,536), and named as left out when it does not fit; `--detail full` writes it all.

Every name and message from the scanned tree is escaped (kvtrace.report.mdtext): a folder named
`<img onerror=...>` stays text, a backtick or `|` never breaks a span or a table.
"""

from __future__ import annotations

import re

from kvtrace.freeing import Freeing, abort_ended, abort_ends_text, scheduler_aborts, what_frees
from kvtrace.model import Consequence, Outcome, Report
from kvtrace.report import modes_line, state_fate_lines
from kvtrace.report.bugreport import code_link, environment_lines, excerpt_details, linked_prose
from kvtrace.report.diagram import diagrams, drawn_queue, mermaid, mermaid_legend
from kvtrace.report.links import Permalinks, permalinks
from kvtrace.report.mdtext import cell, code, html, prose
from kvtrace.report.places import Places
from kvtrace.rulemeta import consequence_of, find_rule_meta
from kvtrace.report.verdicts import (Grid, by_severity, gap_text, summarize, summary_line, unknown_returns, verdict_grids,
                                     way_out_text)

MARKDOWN_BUDGET = 60_000  # characters, the whole document; GitHub's issue body limit is 65,536
DETAILS = ("summary", "full")


def render(reports: list[Report], detail: str = "summary") -> str:
    budget = MARKDOWN_BUDGET // max(1, len(reports)) if detail != "full" else None
    return "\n".join(_report(report, detail, budget) for report in reports)


def _report(report: Report, detail: str, budget: int | None) -> str:
    links = permalinks(report)
    drawn = diagrams(report)  # from the report's own paths (the queue graph's); mermaid shows them via places
    frees = {d.backend.name: what_frees(report, d.backend) for d in drawn if d.pinned}
    places = Places(report, extra=(e.path for found in frees.values() for f in found for e in f.evidence))
    if links is not None:
        links.shown = places.shown()  # a path shown from the working directory links to its upstream line
        links.known = frozenset(links.shown or places.known)  # and each mention of it in prose too
    report, frees = places.localized((report, frees))  # every path as it opens from where the reader stands
    pinning = [d for d in drawn if d.pinned]
    answer = "\n".join([f"# {prose(title_line(report))}", "", *_answer(report, links)]) + "\n"
    environment = "\n".join(["## Environment", "", *environment_lines(report, links), ""]) + "\n"
    pins, findings = _what_pins(report, pinning, frees, links, places), _other_findings(report, links, pinning)
    room = None if budget is None else budget - len(answer) - len(environment) - 400  # the closing note's own room
    told, room = _fitted(pins, room, "chains (pinning backends and errors)", named=True)
    listed, room = _fitted(findings, room, "findings", named=False)
    head = answer + told + listed + environment
    folded = _folded_sections(report, pinning, [d for d in drawn if not d.pinned] if pinning else drawn, links, detail,
                              places)
    # What does not fit is left out, the other backends' diagrams first when a backend pins (the
    # pins' own chains are above); the rest keeps its place in the document.
    texts = ["\n".join(lines) + "\n" for _, lines, _ in folded]
    kept: set[int] = set()
    for i in sorted(range(len(folded)), key=lambda i: folded[i][2]):
        if room is None or len(texts[i]) <= room:
            kept.add(i)
            room = None if room is None else room - len(texts[i])
    body = [texts[i] for i in range(len(folded)) if i in kept]
    left_out = [folded[i][0] for i in range(len(folded)) if i not in kept]
    if left_out:
        body.append(f"*Left out to keep this report under {MARKDOWN_BUDGET:,} characters: "
                    f"{prose(', '.join(left_out))}. `kvtrace scan ... --format markdown --detail full` "
                    "writes them.*\n")
    document = head + "".join(body)
    return document if budget is None or len(document) <= budget else _cut(document, budget)


NOTE_ROOM = 600  # characters kept for each "left out" line (its names are cut to fit)


def _fitted(blocks: list[tuple[str, list[str]]], room: int | None, what: str,
            named: bool) -> tuple[str, int | None]:
    """The blocks' markdown, the first ones whole while they fit in `room` (their headings'
    lines, named "", always), then one line saying how many were left out and which option
    writes them all; and the room left."""
    texts = ["\n".join(lines) + "\n" for _, lines in blocks]
    if room is None:
        return "".join(texts), None
    room -= sum(len(t) for (name, _), t in zip(blocks, texts) if not name)
    last = max((i for i, (name, _) in enumerate(blocks) if name), default=-1)
    kept: list[str] = []
    left: list[str] = []
    for i, ((name, _), text) in enumerate(zip(blocks, texts)):
        # Room for the note is kept while a block may follow that does not fit.
        if name and (left or len(text) > room - (0 if i == last else NOTE_ROOM)):
            left.append(name)  # the first ones whole: once one does not fit, the rest follow it out
            continue
        kept.append(text)
        room -= len(text) if name else 0
    if left:
        names = ": " + ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "") if named else ""
        note = (f"*{len(left)} more {what} left out to keep this report under {MARKDOWN_BUDGET:,} characters"
                f"{prose(names)}. `kvtrace scan ... --format markdown --detail full` writes them all; "
                "`--format json` holds every finding with its chain.*\n\n")
        note = note if len(note) <= NOTE_ROOM else note[:NOTE_ROOM - 6].rsplit(" ", 1)[0] + " …*\n\n"
        kept.insert(len(kept) - (1 if not blocks[-1][0] else 0), note)
        room -= len(note)
    return "".join(kept), room


def _cut(document: str, budget: int) -> str:
    """The last guard, for an answer alone (title and verdict grids) over the budget: the document
    cut at a line, a code fence left open closed, and a line that says so."""
    note = (f"\n*Cut here to keep this report under {MARKDOWN_BUDGET:,} characters: "
            "`kvtrace scan ... --format markdown --detail full` writes it all.*\n")
    text = document[:max(0, budget - len(note) - 8)].rsplit("\n", 1)[0] + "\n"
    if len(re.findall(r"^```", text, re.M)) % 2:
        text += "```\n"
    return text + note


def title_line(report: Report) -> str:
    """`kvtrace: nixl pins WaitingForInput (sglang 0.5.14, disagg_prefill_inflight_queue)`: the
    errors named, else the counts; then what was scanned."""
    parts = summarize(report).parts
    if parts[0].severity == "error":
        # The errors named as sentences, and the pins that hold only under a premise (named with it).
        conditional = [p.named for p in parts[1:] if p.severity == "warning" and p.named]
        answer = "; ".join([*_error_sentences(report), *conditional])
    else:
        told = [p.text for p in parts]
        answer = " · ".join(["no errors", *told]) if report.findings else told[0]
    version = report.version.version if report.version else (report.host_facts or {}).get("sglang_version")
    queue = report.queues[0].name if len(report.queues) == 1 else None
    where = ", ".join(p for p in (f"sglang {version}" if version else None, queue) if p)
    incomplete = " · INCOMPLETE" if report.gaps else ""
    return f"kvtrace: {answer}{incomplete}" + (f" ({where})" if where else "")


def _error_sentences(report: Report) -> list[str]:
    """Each error as a clause: `nixl pins Bootstrapping and WaitingForInput`, `WaitingForInput
    and Transferring crash the scheduler`, `nixl's poll() raises instead of returning Failed`;
    a rule with no title clause by its title (`nixl: failed can be overwritten`)."""
    from kvtrace.baseline import counts_against

    order = {name: i for q in report.queues for i, name in enumerate(q.states)}
    errors = sorted((f for f in report.findings if f.severity == "error" and counts_against(f)),
                    key=lambda f: order.get(f.state or "", len(order)))
    what: dict[tuple[str | None, str], list[str]] = {}
    for f in errors:
        states = what.setdefault((f.backend, f.rule), [])
        if f.state and f.state not in states:
            states.append(f.state)
    told = []
    for (backend, rule), states in what.items():
        joined = states[0] if len(states) == 1 else ", ".join(states[:-1]) + " and " + states[-1] if states else ""
        one = len(states) == 1
        fields = {"subject": backend or "the drain", "owner": f"{backend}'s" if backend else "the",
                  "states": joined or "a state", "s": "s" if one else "", "es": "es" if one else "",
                  "from_backend": f" (from {backend})" if backend else "", "on_states": f" on {joined}" if joined else ""}
        meta = find_rule_meta(rule)
        clause = meta.title_clause if meta is not None else None
        if clause is None and meta is not None and meta.consequence is not None:
            clause = "{subject} " + meta.consequence.verb + " {states}"  # "nixl pins WaitingForInput"
        if clause is None:
            title = meta.title if meta is not None else rule
            clause = "{subject}: " + title[:1].lower() + title[1:] + (" ({states})" if states else "")
        told.append(clause.format(**fields))
    return told


def _answer(report: Report, links: Permalinks | None) -> list[str]:
    out = [f"**{linked_prose(summary_line(report), links)}**", ""]
    if report.filters.active:  # a narrowed scan says so before its verdicts, as the text header does
        out += [f"Filters: {prose(report.filters.describe())}.", ""]
    if report.gaps:
        out.append(f"> **INCOMPLETE**: {linked_prose(gap_text(report.gaps), links)}")
        out.append("")
        for gap in report.gaps:
            subject = code(gap.place) if gap.kind == "file" else f"backend {code(gap.subject)}" \
                if gap.kind == "backend" else "analysis"
            out.append(f"- {subject}: {linked_prose(gap.why, links)}")
        out.append("")
    for grid in verdict_grids(report):
        if grid.backends:
            out += _grid(grid, links)
    return out


def _grid(grid: Grid, links: Permalinks | None) -> list[str]:
    out = [f"Verdicts for {code(grid.queue)}:", "",
           "| backend | " + " | ".join(cell(prose(s)) for s in grid.states) + " |",
           "|---" * (len(grid.states) + 1) + "|"]
    for backend in grid.backends:
        cells = [f"**{linked_prose(text, links)}**" if severity == "error" else linked_prose(text, links)
                 for text, severity in (grid.cells[backend, s] for s in grid.states)]
        out.append(f"| {cell(prose(backend))} | " + " | ".join(cell(c) for c in cells) + " |")
    return out + ["", linked_prose(grid.legend, links), ""]


def _finding_entry(report: Report, f, links: Permalinks | None, evidence: bool, excerpt: bool) -> list[str]:
    of = f" in {code(f.queue)}" if f.queue and len(report.queues) > 1 else ""
    out = [f"- **{prose(f.rule)}** ({prose(f.severity)}){of} {code_link(f.path, f.line, links)}: {linked_prose(f.message, links)}"]
    if evidence:
        out += [f"  - {code_link(e.path, e.line, links)} {linked_prose(e.note, links)}" for e in f.evidence]
    if excerpt:
        out += ["", *("  " + row if row else "" for row in excerpt_details(report, f.path, f.line, links)), ""]
    return out


def _what_pins(report: Report, pinning: list, frees: dict[str, list[Freeing]], links: Permalinks | None,
               places: Places) -> list[tuple[str, list[str]]]:
    """Each error with its chain and code; per backend that pins, its way out and one diagram:
    (what it is, its lines), worst first, after the heading's own ("" names it)."""
    errors = [f for f in by_severity(report.findings) if f.severity == "error"]
    if not errors and not pinning:
        return []
    blocks: list[tuple[str, list[str]]] = [("", ["## What fails", ""])]
    named = {d.backend.name for d in pinning}
    for f in errors:
        if f.backend not in named:
            blocks.append((f"{f.rule} at {f.path}:{f.line}", _finding_entry(report, f, links, evidence=True, excerpt=True)))
    shown = {b.name: b for b in report.backends}
    chained = _chained(report, pinning)  # worst first, so a backend with an error comes before
    first: dict[str | None, int] = {}    # one pinned only under a premise
    for i, f in enumerate(chained):
        first.setdefault(f.backend, i)
    for diagram in sorted(pinning, key=lambda d: first.get(d.backend.name, len(chained))):
        b = shown.get(diagram.backend.name, diagram.backend)  # the backend with its paths as shown
        poll = f" at {code_link(b.poll.path, b.poll.line, links)}" if b.poll else ""
        out = [f"### {prose(b.name)} pins {_pins_per_queue(report, diagram, chained)}", "",
                f"{code(b.sender + '.poll()')}{poll}. What frees each state it can return and keep:", ""]
        told: dict[str, str] = {}  # state -> the queue it was told for (what frees it is the backend's)
        for queue, kept in _kept_per_queue(report, frees.get(b.name, [])):
            if len(report.queues) > 1:  # each queue names only the states it keeps
                out += [f"In {code(queue)}:", ""]
            for freeing in kept:
                if freeing.state in told:
                    out.append(f"- {prose(freeing.state)}: as in {code(told[freeing.state])}")
                    continue
                told[freeing.state] = queue
                cited = [e for e in freeing.evidence if f"{e.path}:{e.line}" not in freeing.text]  # not twice
                where = ", ".join(code_link(e.path, e.line, links) for e in cited[:3])
                out.append(f"- {prose(freeing.state)}: {linked_prose(freeing.text, links)}" + (f" ({where})" if where else ""))
            out.append("")
        for f in chained:
            if f.backend == b.name:
                out += _finding_entry(report, f, links, evidence=True, excerpt=True)
        out += ["", mermaid_legend(), "", "```mermaid", mermaid(diagram, places.path).rstrip("\n"), "```", ""]
        blocks.append((b.name, out))
    return blocks


def _pins_per_queue(report: Report, diagram, chained: list) -> str:
    """`WaitingForInput` (one queue), or each queue with the states this backend pins in it, the
    drawn queue first: `WaitingForInput in `inflight`; Bootstrapping in `bootstrap``."""
    drawn = drawn_queue(report)
    if drawn is None or len(report.queues) < 2:
        return prose(", ".join(diagram.pinned))
    pins: dict[str, list[str]] = {drawn.name: list(diagram.pinned)}
    for f in chained:
        if consequence_of(f.rule) is Consequence.PINNED and f.backend == diagram.backend.name and f.queue and f.state:
            states = pins.setdefault(f.queue, [])
            if f.state not in states:
                states.append(f.state)
    return "; ".join(f"{prose(', '.join(states))} in {code(queue)}" for queue, states in pins.items() if states)


def _kept_per_queue(report: Report, frees: list[Freeing]) -> list[tuple[str, list[Freeing]]]:
    """(queue, what frees each state it keeps): a state another queue keeps is not this queue's
    to tell (0.4.8: only the bootstrap queue keeps Bootstrapping). The drawn queue first."""
    drawn = drawn_queue(report)
    queues = sorted(report.queues, key=lambda q: q is not drawn)
    found = []
    for queue in queues:
        kept = [f for f in frees if f.state in queue.states and Outcome.KEPT in queue.states[f.state].fate]
        if kept:
            found.append((queue.name, kept))
    return found


def _chained(report: Report, pinning: list) -> list:
    """The findings told above with their chain: every error, and each pin of a backend that pins
    (a warning when it holds only under a premise: its chain is what the reader checks it by)."""
    named = {d.backend.name for d in pinning}
    return [f for f in by_severity(report.findings)
            if f.severity == "error" or (consequence_of(f.rule) is Consequence.PINNED and f.backend in named)]


def _not_chained(report: Report, chained: list) -> list:
    """The findings not told with their chain in "What fails", worst first."""
    return [f for f in by_severity(report.findings) if not any(f is g for g in chained)]


def _other_findings(report: Report, links: Permalinks | None, pinning: list) -> list[tuple[str, list[str]]]:
    """The heading's lines ("" names them), then one block per finding not told above."""
    above = _chained(report, pinning)
    others = _not_chained(report, above)
    out = [f"## Findings ({len(report.findings)})", ""]
    if not report.findings:
        return [("", out + ["None.", ""])]
    errors = sum(f.severity == "error" for f in above)
    pins = len(above) - errors
    if above:
        told = [f"{n} {word}{'s' if n > 1 else ''}" for n, word in ((errors, "error"), (pins, "pin")) if n]
        out += [f"{' and '.join(told)} above; the others, worst first:", ""]
    return [("", out), *((f"{f.rule} at {f.path}:{f.line}", _finding_entry(report, f, links, evidence=False,
                                                                             excerpt=False)) for f in others),
            ("", [""])]


def _folded_sections(report: Report, pinning: list, more_diagrams: list, links: Permalinks | None,
                     detail: str, places: Places) -> list[tuple[str, list[str], bool]]:
    """(what it is, markdown, whether it is left out first) of the detail sections, most useful
    first; when a backend pins, the other backends' diagrams are what is left out first."""
    full = detail == "full"
    sections: list[tuple[str, list[str], bool]] = []
    others = _not_chained(report, _chained(report, pinning))
    if others:
        rows = [row for f in others for row in _finding_entry(report, f, links, evidence=True, excerpt=True)]
        sections.append(("the evidence and code of each warning and note",
                         _fold("Evidence and code of each warning and note", rows, full), False))
    queue = drawn_queue(report)
    of = f" of {queue.name}" if queue is not None and len(report.queues) > 1 else ""
    for diagram in more_diagrams:
        verdict = f"pins {', '.join(diagram.pinned)}" if diagram.pinned else "no pinned state"
        rows = [mermaid_legend(), "", "```mermaid", mermaid(diagram, places.path).rstrip("\n"), "```"]
        sections.append((f"the state diagram of {diagram.backend.name}",
                         _fold(f"State diagram{of}: {diagram.backend.name} ({diagram.backend.sender}): {verdict}",
                               rows, full), bool(pinning)))
    for queue in report.queues:
        sections.append((f"the release map of {queue.name}",
                         _fold(f"Release map: {queue.name}", _map(queue, links), full), False))
    sections.append(("the backends table", _fold("Backends", _backends(report, links), full), False))
    return sections


def _fold(summary: str, rows: list[str], full: bool) -> list[str]:
    if full:
        return [f"## {prose(summary)}", "", *rows, ""]
    return [f"<details><summary>{html(summary)}</summary>", "", *rows, "", "</details>", ""]


def _map(queue, links: Permalinks | None) -> list[str]:
    out = ["| kind | path:line | function | states |", "|---|---|---|---|"]
    for s in queue.sites:
        note = f" ({linked_prose(s.note, links)})" if s.note else ""
        note += f" (only when {linked_prose(s.mode, links)})" if s.mode else ""
        out.append(f"| {prose(s.kind)} | {cell(code_link(s.path, s.line, links))} | {cell(code(s.function))} | "
                   f"{cell(prose(', '.join(s.states)) + note)} |")
    modes = modes_line(queue)
    if modes:
        out += ["", linked_prose(modes, links)]
    out += ["", "| state | fate |", "|---|---|"]
    for state, fate in queue.states.items():
        described = "<br>".join(cell(linked_prose(f"{mode}: {text}" if mode else text, links)) for mode, text in state_fate_lines(queue, fate))
        out.append(f"| {cell(prose(state))} | {described} |")
    return out


def _backends(report: Report, links: Permalinks | None) -> list[str]:
    out = ["| backend | class | poll() | returns | reads abort state | timeouts | way out |",
           "|---|---|---|---|---|---|---|"]
    abort_called = bool(scheduler_aborts(report))
    for b in report.backends:
        poll = cell(code_link(b.poll.path, b.poll.line, links)) if b.poll else "-"
        timeouts = "; ".join(f"{code_link(t.path, t.line, links)} {prose(', '.join(t.covers))}" for t in b.timeouts) or "none"
        returns = "<br>".join([prose(", ".join(b.returns)) or "-"] + [linked_prose(u, links) for u in unknown_returns(b)])
        ways = "<br>".join(linked_prose(f"{state}: {way_out_text(v, abort_called)}", links) for state, v in b.verdicts.items()) or "-"
        reads = "yes" if b.reads_abort_state else \
            f"no; {cell(linked_prose(abort_ends_text(b), links))}" if abort_ended(b) else "no"
        out.append(f"| {cell(prose(b.name))} | {cell(code(b.sender))} | {poll} | {cell(returns)} | "
                   f"{reads} | {cell(timeouts)} | {cell(ways)} |")
    return out
