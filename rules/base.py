"""What every rule is: an id, a severity, documentation in its docstring, samples that the
test suite runs (Fixit's VALID/INVALID convention), and a check over the analysed scan."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvtrace.model import Evidence, Finding, Site

if TYPE_CHECKING:  # the rules' docs and samples load without the analysis stack (fast `explain`)
    from kvtrace.backends import SenderAnalysis
    from kvtrace.graph import QueueAnalysis
    from kvtrace.index import Index
    from kvtrace.packs import Pack
    from kvtrace.states import Domain


@dataclass
class ScanContext:
    """Everything a rule may read: the queue graph, the senders, the enum and the pack."""

    pack: Pack
    domain: Domain
    index: Index
    queue: QueueAnalysis
    senders: list[SenderAnalysis]
    entries: list[Site]


@dataclass(frozen=True)
class Sample:
    """A small tree (path -> code) in the pack's shapes. Shared files (the enum, utils) are
    added by the test harness; `expect` lists (backend, state) pairs the rule must report."""

    files: dict[str, str]
    expect: tuple[tuple[str | None, str], ...] = ()


class Rule:
    id: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[str]  # error, warning, note (SARIF levels)
    VALID: ClassVar[list[Sample]] = []
    INVALID: ClassVar[list[Sample]] = []

    def check(self, ctx: ScanContext) -> list[Finding]:
        raise NotImplementedError

    @classmethod
    def docs(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def summary(cls) -> str:
        return cls.docs().splitlines()[0] if cls.__doc__ else cls.name

    def finding(self, message: str, path: str, line: int, backend: str | None, state: str | None,
                evidence: list[Evidence]) -> Finding:
        return Finding(self.id, self.severity, message, path, line, backend, state, evidence)
