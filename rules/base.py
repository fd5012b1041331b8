"""What every rule is: a short code (KVT001...) and a name (pinned-state), a default severity,
documentation in its docstring, samples that the test suite runs (Fixit's VALID/INVALID
convention), and a check over the analysed scan."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from kvtrace.model import Consequence, EventKind, Evidence, Finding, Severity, Site

if TYPE_CHECKING:  # the rules' docs and samples load without the analysis stack (fast `explain`)
    from kvtrace.backends import SenderAnalysis
    from kvtrace.graph import QueueAnalysis, ScanModel
    from kvtrace.index import Index
    from kvtrace.packs import Pack
    from kvtrace.rules.premise import Premise
    from kvtrace.states import Domain


@dataclass
class ScanContext:
    """Everything a rule may read: the model (queue graph and senders, with their queries
    fate(), paths(), release_map(), way_out()), the enum, the pack and the index."""

    pack: Pack
    domain: Domain
    index: Index
    model: ScanModel
    entries: list[Site]
    # The pack's other queues (the same host's): a request waits in one of them at a time, so what
    # their drains do to a sender acts on another request than one queued here.
    others: list[QueueAnalysis] = field(default_factory=list)
    # In-scope files that were not analysed (unparsable, undecodable, over a limit, unread): what
    # is absent from the analysis may be in them.
    unread: list[str] = field(default_factory=list)

    @property
    def queue(self) -> QueueAnalysis:
        return self.model.queue

    @property
    def senders(self) -> list[SenderAnalysis]:
        return self.model.senders


@dataclass(frozen=True)
class Sample:
    """A small tree (path -> code) in the pack's shapes. Shared files (the enum, utils) are
    added by the test harness; `expect` lists (backend, state) pairs the rule must report."""

    files: dict[str, str]
    expect: tuple[tuple[str | None, str], ...] = ()


class Rule:
    code: ClassVar[str]  # KVT001...: stable, what SARIF ruleId and JSON `id` carry
    name: ClassVar[str]  # pinned-state...: what people type, JSON `rule`
    title: ClassVar[str]  # a human heading
    severity: ClassVar[str]  # default: error, warning, note (SARIF levels)
    per_queue: ClassVar[bool] = True  # False: about the backends alone, checked once per scan
    consequence: ClassVar[Consequence | None] = None  # what its finding says happens to the request
    # Its errors in a title, as a clause (markdown's bug report): {subject} the backend, else "the
    # drain"; {owner} "nixl's", else "the"; {states} "WaitingForInput and Transferring"; {s}/{es}
    # the verb's ending for them; {from_backend} " (from nixl)"; {on_states} " on WaitingForInput".
    # None: "{subject} <the consequence's verb> {states}" for a rule with a consequence, else the
    # title says it ("nixl: failed can be overwritten").
    title_clause: ClassVar[str | None] = None
    VALID: ClassVar[list[Sample]] = []
    INVALID: ClassVar[list[Sample]] = []

    def check(self, ctx: ScanContext) -> list[Finding]:
        raise NotImplementedError

    @classmethod
    def docs(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def summary(cls) -> str:
        # The first paragraph, as one line: a summary sentence may wrap in the docstring.
        return " ".join(cls.docs().split("\n\n")[0].split()) if cls.__doc__ else cls.name

    def finding(self, message: str, path: str, line: int, backend: str | None, state: str | None,
                evidence: list[Evidence], premise: Premise | None = None, backends: tuple[str, ...] = ()) -> Finding:
        """A finding that rests on a premise says so and is at most a warning: a gate on
        errors counts only the findings that need none. `backends`: the grid rows of a finding
        that names no one backend (a manager method several backends run)."""
        severity = "warning" if premise is not None and self.severity == "error" else self.severity
        return Finding(self.name, Severity(severity), message, path, line, backend, state, evidence, code=self.code,
                       premise=premise.text if premise else None, premise_kinds=premise.kinds if premise else (),
                       backends=backends)


def drain_evidence(ctx: ScanContext) -> list[Evidence]:
    """The start of every drain-side chain: where requests enter, where the queue is polled, the loop."""
    evidence = [Evidence(s.path, s.line, f"entry: {s.function} appends to {ctx.pack.queue}") for s in ctx.entries]
    drain = ctx.queue.drain
    if drain is not None:
        if drain.poll_line is not None:
            evidence.append(Evidence(drain.func.path, drain.poll_line, "poll: states read for the queue"))
        evidence.append(Evidence(drain.func.path, drain.body.line(drain.loop), f"drain loop in {drain.func.qualname}"))
    return evidence


def path_evidence(events, state: str, kinds: tuple[EventKind, ...] = (EventKind.CHECK, EventKind.HELPER)) -> list[Evidence]:
    """The decisions along one path, one line each, in order."""
    out: list[Evidence] = []
    seen: set[tuple[str, int]] = set()
    for e in events:
        if e.kind in kinds and (e.path, e.line) not in seen:
            seen.add((e.path, e.line))
            detail = {"T": "true", "F": "false"}.get(e.detail, e.detail)
            out.append(Evidence(e.path, e.line, f"{e.kind}: {detail} for {state}" if e.kind == EventKind.CHECK
                                else f"{e.kind}: {detail}", e.kind))
    return out


def mode_named(label: str) -> str:
    """A drain mode's label as a clause names it: in parentheses when it binds several parameters
    ("when (return_failed_reqs=False, rids_to_check=None) and when (...)": its own commas would
    run into the sentence's)."""
    return f"({label})" if ", " in label else label


def returned_by(ctx: ScanContext, state: str) -> list[str]:
    return ctx.model.returning(state)
