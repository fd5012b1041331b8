"""Plain data shared by every stage of a scan. No behaviour lives here (the queries over the
analysed model live in kvtrace.graph.ScanModel).

The pipeline is target -> fetch -> parse -> index -> graph -> checks -> report; each stage
takes and returns the types below, so any stage can be read (and tested) on its own.

Every dataclass here has a docstring: @dataclass writes one from inspect.signature for a class
without, on each start (a cached rescan imports this module too).
"""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Literal

SCHEMA = "kvtrace/1"

FileStatus = Literal["ok", "syntax-error", "not-utf8", "too-large", "skipped", "unreadable"]


class TextEnum(str, Enum):
    """An enum whose members are their string values wherever text is made (f-strings, str(),
    JSON, sorting, hashing), so reports stay byte-identical to plain strings while code names
    its values and a typo fails at import."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    def __repr__(self) -> str:
        return repr(self.value)


class Outcome(TextEnum):
    """How one path through the drain loop ends for the request it polled."""

    KEPT = "kept"  # appended to the keep list (or back onto the queue), or the loop returned early
    LEAVES = "leaves"  # handed to another list, released or aborted on the way out
    RAISES = "raises"  # an exception leaves the queue unassigned
    DROPPED = "dropped"  # none of these: the request is lost


OUTCOME_ORDER: tuple[Outcome, ...] = tuple(Outcome)


class Severity(TextEnum):
    """How bad a finding is, ordered (NOTE < WARNING < ERROR: `max` is the worst, `sorted(...,
    reverse=True)` worst first). Its text is the reports' lowercase level, so JSON, SARIF and text
    read as plain strings and a reader of them gets a member back with `Severity(text)`."""

    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANKS[self]

    def __lt__(self, other: object) -> bool:
        return self.rank < Severity(other).rank if isinstance(other, str) else NotImplemented

    def __le__(self, other: object) -> bool:
        return self.rank <= Severity(other).rank if isinstance(other, str) else NotImplemented

    def __gt__(self, other: object) -> bool:
        return self.rank > Severity(other).rank if isinstance(other, str) else NotImplemented

    def __ge__(self, other: object) -> bool:
        return self.rank >= Severity(other).rank if isinstance(other, str) else NotImplemented


_SEVERITY_RANKS = {Severity.NOTE: 0, Severity.WARNING: 1, Severity.ERROR: 2}
SEVERITIES_WORST_FIRST: tuple[Severity, ...] = tuple(Severity)


class EventKind(TextEnum):
    """What happens at one line of one path. The first group are sites (rows of the release map
    and nodes of the queue graph); the rest describe a path without being sites."""

    ENTRY = "entry"  # a request is appended to the queue
    POLL = "poll"  # the queue's poll states are read
    CHECK = "check"  # a condition on the path (detail "T"/"F": which branch)
    KEEP = "keep"  # appended to the keep list: stays queued
    DONE = "done"  # appended to a finished list
    REQUEUE = "requeue"  # handed to another queue
    RELEASE = "release"  # a resource is released
    ABORT = "abort"  # the request is aborted
    REASSIGN = "reassign"  # the queue is assigned
    RAISE = "raise"
    GAUGE = "gauge"  # the queue's length is stored (a metric)
    HELPER = "helper"  # a helper that acts on the request is entered
    TIMEOUT = "timeout"  # an elapsed-time comparison
    ABORT_READ = "abort-read"  # poll() reads what abort() writes
    LOG = "log"
    METRIC = "metric"
    ANSWER = "answer"  # a reply to the client
    ATTR_WRITE = "attr-write"  # self.X = ... (recorded while abort() runs)
    TABLE_READ = "table-read"  # the manager's status table is read for the room
    TABLE_DEFAULT = "table-default"  # ... and the absent room gives the .get default
    TABLE_STORE = "table-store"
    TABLE_CLEAR = "table-clear"  # the room is removed from the table
    TABLE_ABSENT = "table-absent"  # the room is absent on this path
    TABLE_RAISE = "table-raise"  # reading an absent room raises
    TABLE_UNKNOWN = "table-unknown"  # a status update on an object not tied to the manager
    GUARD = "guard"  # a test of one of the drain's mode parameters (detail: the condition that held)
    RETURN = "return"  # a return statement (sender runs only; detail: the states it returns)

    @property
    def is_site(self) -> bool:
        return self in SITE_KINDS


def _site_kind(kind: str) -> EventKind:
    found = EventKind(kind)
    if found not in SITE_KINDS:
        raise ValueError(f"{kind!r} is not a site kind")
    return found


SITE_KINDS: frozenset[EventKind] = frozenset(EventKind.__members__[name] for name in (
    "ENTRY", "POLL", "CHECK", "KEEP", "DONE", "REQUEUE", "RELEASE", "ABORT", "REASSIGN", "RAISE", "GAUGE", "HELPER"))


def source_lines(text: str) -> list[str]:
    """The lines of a source text as Python numbers them: only \\n, \\r\\n and \\r end a line.
    str.splitlines() also ends one at a form feed (a page break some code has between
    definitions), \\x1c-\\x1e, \\x85, U+2028 and U+2029, which shifts every later line number."""
    if not text:
        return []
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines[-1] == "" else lines


@dataclass(frozen=True)
class FetchLimits:
    """Bounds on what a fetch may read; exceeding one is an input error, not a silent cut."""

    # With these, a scan stays under ~500 MB (bytes held + the parse budget in parse.py).
    # SGLang 0.5.23: largest file 0.3 MB; the whole installed package 67 MB in 4,719 files.
    max_file_bytes: int = 1024 * 1024
    max_files: int = 20_000
    max_total_bytes: int = 128 * 1024 * 1024


def _decode(data: bytes) -> tuple[str | None, str | None]:
    """(text, None), or (None, why) when the bytes do not decode as Python source."""
    try:
        # Python's own rule (PEP 263): UTF-8, a BOM, or a `coding:` cookie in line 1 or 2.
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), None
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        where = f"byte {exc.start} ({exc.reason})" if isinstance(exc, UnicodeDecodeError) else str(exc)
        return None, f"not UTF-8 and no usable coding cookie: {where}"


@dataclass(frozen=True)
class SourceFile:
    """One fetched file, as read: never changed afterwards (what a later stage learns about it,
    a parse failure, is a FileMark applied to a copy). `path` is relative to the scanned root,
    with '/' separators. The text is decoded once, when the record is made (1-2 ms for the files
    a scan of SGLang's srt/ fetches)."""

    path: str
    data: bytes
    sha256: str
    status: FileStatus = "ok"
    error: str | None = None
    # Private (a leading "_"): what walks a report's fields (safe_text.rewrite_strings, the cache
    # codec) leaves the source text alone.
    _text: str | None = field(init=False, repr=False, compare=False)
    _undecodable: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text, why = _decode(self.data)
        object.__setattr__(self, "_text", text)  # a frozen record's own fields, set once at creation
        object.__setattr__(self, "_undecodable", why)

    @property
    def text(self) -> str | None:
        """The decoded text, or None when the bytes do not decode (`undecodable` says why)."""
        return self._text

    @property
    def undecodable(self) -> str | None:
        """Why the bytes do not decode as Python source, or None when they do."""
        return self._undecodable

    @property
    def as_read(self) -> tuple[FileStatus, str | None]:
        """The status and error, counting bytes that do not decode as not-utf8 even before the
        parse stage has recorded it."""
        if self.status == "ok" and self.text is None:
            return "not-utf8", self.undecodable
        return self.status, self.error

    @property
    def lines(self) -> list[str]:
        """The text's lines, numbered as Python and every report numbers them ([] if unreadable)."""
        return source_lines(self.text or "")


@dataclass(frozen=True)
class FileMark:
    """What the analysis learned about a file after parsing it (libcst was not handed a function
    nested too deep): a record the pipeline collects and applies once, never a change the engine
    makes to a SourceFile."""

    path: str
    status: FileStatus
    error: str


def with_marks(files: list[SourceFile], marks: list[FileMark]) -> list[SourceFile]:
    """The files as the marks leave them, each marked one a new record: the fetched files stay as
    they were read. Several marks of a file give every reason, sorted, so the result does not
    depend on the order they were found in (which process met which function first)."""
    by_path: dict[str, list[FileMark]] = {}
    for mark in marks:
        by_path.setdefault(mark.path, []).append(mark)
    out = []
    for f in files:
        found = by_path.get(f.path)
        if found is None:
            out.append(f)
            continue
        status = min(m.status for m in found)
        out.append(replace(f, status=status, error="; ".join(sorted({m.error for m in found if m.status == status}))))
    return out


@dataclass
class FetchResult:
    """What a fetch stage hands on: the label of the target and the files read."""

    target: str
    files: list[SourceFile]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Evidence:
    """A line of the scanned code a finding, a fate or a verdict rests on, and what it shows."""

    path: str
    line: int
    note: str
    # The kind of event the line was seen as, when it is one (a writer tells a path's decisions
    # from its effects by this, never by the note); not part of what the evidence is equal to.
    kind: EventKind | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Site:
    """A line of the release map: what happens to the queue at path:line."""

    kind: EventKind  # one of SITE_KINDS
    path: str
    line: int
    function: str
    states: tuple[str, ...] = ()
    note: str = ""
    mode: str = ""  # the drain's modes that reach it, when not every mode does ("" otherwise)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, EventKind) or not self.kind.is_site:
            object.__setattr__(self, "kind", _site_kind(self.kind))


@dataclass
class ModeFate:
    """A state's fate in one mode of the drain (one way its callers bind its parameters).

    `fate` is every outcome in the mode. `waits` are where the state is kept on a path that
    never tests the poll value (the guard that holds it, e.g. `req.rid not in rids_to_check`,
    or the keep): a wait on something else, not a verdict on the state. `then` is the fate on
    every other path: what happens once it no longer waits."""

    mode: str
    fate: list[Outcome]
    then: list[Outcome]
    waits: list[Evidence] = field(default_factory=list)


@dataclass(frozen=True)
class ModeInfo:
    """One mode of the drain: its label, the parameters a caller passes in it, and the callers."""

    label: str
    passed: tuple[str, ...]
    callers: tuple[Evidence, ...]


@dataclass
class StateFate:
    """What becomes of a request in one poll state at the drain: every outcome, the lines that show them, per mode."""

    fate: list[Outcome]  # every outcome, all modes together
    evidence: list[Evidence]
    modes: list[ModeFate] = field(default_factory=list)  # per mode, in QueueReport.modes' order


@dataclass
class QueueReport:
    """One judged queue: its drain loop, the release map's sites, each poll state's fate, the drain's modes."""

    name: str
    drain: Evidence | None
    sites: list[Site]
    states: dict[str, StateFate]
    modes: list[ModeInfo] = field(default_factory=list)


@dataclass(frozen=True)
class PollRef:
    """Where a backend's poll() is defined, and the class it is inherited from when not its own."""

    path: str
    line: int
    inherited_from: str | None


@dataclass(frozen=True)
class TimeoutCheck:
    """An elapsed-time comparison in poll() and the states it ends."""

    path: str
    line: int
    covers: tuple[str, ...]


class WayOut(str, Enum):
    """How a backend gets a request out of a state (or why it cannot)."""

    ABORT = "abort"  # abort() and then poll() returns a terminal state
    TIMEOUT = "timeout"  # with the clock past every deadline, poll() returns a terminal state
    NONE = "none"  # neither: pinned
    UNKNOWN = "unknown"  # not decided: a function the answer depends on could not be parsed (a gap)


@dataclass(frozen=True)
class StateVerdict:
    """One non-terminal state a backend's poll() can return, and its way out.

    `chain` is why: for a pinned state each link of the reasoning with its path:line (what
    poll() returns it from, what abort() writes and whether poll() reads it, what the manager
    does for an absent room, which path clears the room, which timeouts are reached)."""

    state: str
    way_out: WayOut
    how: str
    chain: tuple[Evidence, ...] = ()
    absent_room: bool = False  # pinned from the configuration where the room is absent from the table
    # For WayOut.ABORT: how abort() reaches poll(), each with its line (what abort() writes, where
    # poll() reads it), so every sentence about abort states the same mechanism.
    abort_via: tuple[Evidence, ...] = ()

    @property
    def pinned(self) -> bool:
        return self.way_out is WayOut.NONE


@dataclass(frozen=True)
class ManagerRef:
    """The manager paired with a sender, how it was found, and its status table."""

    name: str
    path: str
    line: int
    found_by: str  # "mapping" (a backend -> classes dict), "annotation", "folder"
    table: str | None
    holds: tuple[str, ...]  # states stored into the table somewhere in the backend
    unknown: tuple[str, ...] = ()  # why some stored values are unknown
    clears: tuple[Evidence, ...] = ()  # paths that remove the room from the table
    # "path:Class.method" of the check and update methods its MRO resolves: the code the backend
    # runs, so a manager rule's finding in a base class (common/) belongs to its row.
    runs: tuple[str, ...] = ()
    # "Class.method" of each function in `clears` (the methods that take the room out).
    clear_methods: tuple[str, ...] = ()


@dataclass
class Backend:
    """One transfer backend (its sender class): what its poll() returns and each state's way out."""

    name: str
    sender: str
    path: str
    line: int
    poll: PollRef | None
    returns: list[str]  # states poll() is known to return
    reads_abort_state: bool
    abort_state: str | None
    timeouts: list[TimeoutCheck]
    notes: list[str] = field(default_factory=list)
    returns_unknown: list[str] = field(default_factory=list)  # "<why>" for values kvtrace cannot see
    manager: ManagerRef | None = None
    verdicts: dict[str, StateVerdict] = field(default_factory=dict)  # non-terminal state -> way out
    # state -> where the only store of it is: poll() returns it only from the status table, and
    # only the sender's constructor stores it there (no other run of the backend's code does).
    # Once the room has moved past it, it comes back only with a second sender for the room.
    constructor_only: dict[str, Evidence] = field(default_factory=dict)
    unborn: Evidence | None = None  # why the room can be missing before anything clears it
    # pinned state -> sender method -> where: once that method has run (on every path through
    # it), poll() no longer returns the state. Whether the scheduler calls it on the request
    # after it enters the queue (and whether a path skips it) is the drain side's question.
    left_by: dict[str, dict[str, Evidence]] = field(default_factory=dict)
    # pinned state -> sender method -> the pin's chain once that method has run, where it cites
    # other lines than the verdict's (poll()'s first return is behind a flag the method sets).
    # A queue every request enters with the method run cites these (rules.way_in).
    pinned_after: dict[str, dict[str, tuple[Evidence, ...]]] = field(default_factory=dict)
    # pinned state -> state -> where: once poll() has answered that state, it never answers the
    # pinned one again (fake's init() setting `bootstrap_done` for good). A request that enters
    # the queue only after such an answer cannot be pinned in it.
    past: dict[str, dict[str, Evidence]] = field(default_factory=dict)
    # The states poll() returns only as read from the status table (no path answers them
    # otherwise): an answer of one of them means the table held it at that moment.
    from_table: tuple[str, ...] = ()
    # A concrete abort() in the sender's MRO: without one, a scheduler's abort() call is skipped
    # (`hasattr`), fails, or reaches an abstract method, and never the sender's poll().
    has_abort: bool = True
    # Where abort() (or a method it calls) writes each attribute of abort_state, in line order.
    abort_writes: tuple[Evidence, ...] = ()

    def way_out(self, state: str) -> StateVerdict | None:
        return self.verdicts.get(state)


@dataclass
class SenderRecord:
    """One sender's analysis as data: its class, poll() and manager named by (path, line), which
    the parent resolves on its own index (what crosses from the forked child, kvtrace.pipeline)."""

    cls: tuple[str, int]
    backend: Backend
    poll: tuple[str, int] | None
    raise_sites: list[tuple[str, int, str]]
    absent_raise_sites: list[tuple[str, int, str]]
    manager: tuple[str, int] | None
    other_mode_unknown: tuple[str, ...] = ()  # SenderAnalysis.other_mode_unknown


@dataclass(frozen=True)
class EventRecord:
    """A drain path's event (kvtrace.flow.Event) as data."""

    kind: EventKind
    path: str
    line: int
    function: str
    detail: str
    after_loop: bool


@dataclass
class PathRecord:
    """A drain path (kvtrace.graph.QueuePath) as data."""

    events: list[EventRecord]
    outcome: Outcome


@dataclass(frozen=True)
class CutRecord:
    """Where an exploration stopped (kvtrace.gaps.Cut, with its kind, where and what; or, with
    no kind, the plain `path:line` of a path limit) as data."""

    text: str
    kind: str = ""
    where: str = ""
    what: str = ""


@dataclass
class QueueRecord:
    """A queue's exploration done by the forked child (kvtrace.graph.explore_queue): the pack's
    queue it is (`position`), per mode the paths per poll state, and what the exploration cut
    short or could not parse. The parent assembles the queue's analysis from it."""

    position: int
    modes: list[dict[str, list[PathRecord]]]
    truncated: list[CutRecord]
    unparsed: list[str]


@dataclass
class SendersResult:
    """What the forked child returns, as JSON (kvtrace.cachecodec): its senders, the queues it
    explored, the problems it met and what it learned about files. Data only: loading it runs
    no code."""

    senders: list[SenderRecord]
    problems: list[Problem]
    marks: list[FileMark]
    queues: list[QueueRecord] = field(default_factory=list)


class Consequence(TextEnum):
    """What a rule's finding says happens to the request itself (the report names such findings
    by a verb, "nixl pins WaitingForInput", and colours the state); most rules say something
    about the code instead and have none."""

    PINNED = "pinned"  # it stays in the queue for good
    DROPPED = "dropped"  # it leaves the queue without release or answer

    @property
    def verb(self) -> str:
        return {Consequence.PINNED: "pins", Consequence.DROPPED: "drops"}[self]


class PremiseKind(TextEnum):
    """What a finding's premise is about (kvtrace.rules.premise): a writer tells them apart by
    this, never by the text."""

    SHARED_ROOM = "shared-room"  # two requests share a bootstrap_room
    ROOM_REUSED = "room-reused"  # a second sender or receiver is built for a room whose transfer ran
    SEND_SKIPPED = "send-skipped"  # the sender call on the request's way in, or after it, is skipped
    # A caller outside the scanned folder passes the drain a parameter: scanning the folder that
    # holds the callers decides it (an error, or no finding), so the verdict rests on the folder.
    UNSEEN_CALLER = "unseen-caller"


@dataclass
class Finding:
    """What a rule found, where, and about which backend, state and queue."""

    rule: str
    severity: Severity
    message: str
    path: str
    line: int
    backend: str | None
    state: str | None
    evidence: list[Evidence]
    # Set after the rules run (kvtrace.suppress / kvtrace.baseline):
    function: str | None = None  # qualified name of the function path:line is in (fingerprint part)
    suppressed: str | None = None  # path:line of the `# kvtrace: ignore[...]` comment that silences it
    baseline: str | None = None  # "new" or "unchanged" when compared with a baseline
    code: str = ""  # the rule's short code (KVT001); `rule` is its name
    queue: str | None = None  # the queue whose drain it is about (None: the backends alone)
    # What the finding rests on, when it is not unconditional ("two requests share a
    # bootstrap_room", "the send is skipped"): such a finding is a warning, so a gate on
    # errors counts only what needs no premise.
    premise: str | None = None
    premise_kinds: tuple[PremiseKind, ...] = ()  # what each part of the premise is about
    role: str | None = None  # what the finding is about beyond rule/backend/state (kvtrace.baseline.assign_roles)
    # A manager rule's finding in a method several backends' managers run: those backends (the grid
    # rows it belongs in, from kvtrace.managers.ManagerFacts); empty: `backend`, or none known.
    backends: tuple[str, ...] = ()


class GapKind(TextEnum):
    """What a gap is about (its text is the reports' `kind`)."""

    FILE = "file"  # not read or not parsed
    BACKEND = "backend"  # not checked, or checked without one of its files (Gap.partial)
    ANALYSIS = "analysis"  # a part of the analysis was cut or failed


class ProblemKind(TextEnum):
    """What a problem the analysis met is (a writer tells them apart by this, never by the text)."""

    TOO_DEEP = "too-deep"  # code nested past Python's recursion limit: not analysed
    UNPARSED = "unparsed"  # a function libcst could not parse
    PATH_LIMIT = "path-limit"  # the engine's path limit: paths were cut
    CUT = "cut"  # a run stopped following the code (a statement kind not modelled, the work budget)
    UNDRAINED = "undrained"  # a queue not drained (nor filled, or with files not analysed) in the files analysed
    OUT_OF_VIEW = "out-of-view"  # callers, or where the queue is bound, outside the scanned folder
    FETCH = "fetch"  # something reading the target could not do


@dataclass(frozen=True)
class Problem:
    """Something the analysis could not do: any problem makes the report INCOMPLETE (a `Gap` of
    kind ANALYSIS). `text` is for people and is what every format prints; `where` is the
    path:line it is about, when there is one."""

    kind: ProblemKind
    text: str
    where: str | None = None


@dataclass(frozen=True)
class Gap:
    """Something the scan could not analyse; any gap makes the report INCOMPLETE. `reason` is
    for people; what a writer tells apart is in the typed fields."""

    kind: GapKind
    subject: str
    reason: str
    partial: bool = False  # a backend gap: checked, but without what `reason` names (else not checked at all)
    problem: ProblemKind | None = None  # an analysis gap: what kind of problem it is
    line: int | None = None  # a file gap at a line of it (a syntax error's), which `reason` also says

    @property
    def place(self) -> str:
        """The subject as a person opens it: `path:line` for a file gap at a line."""
        return f"{self.subject}:{self.line}" if self.line is not None else self.subject

    @property
    def why(self) -> str:
        """The reason without the line `place` already gives."""
        return self.reason.replace(f"line {self.line}: ", "", 1) if self.line is not None else self.reason


@dataclass(frozen=True)
class DetectedVersion:
    """The version the scanned tree declares (`__version__` in a version.py above the package)."""

    package: str
    version: str
    path: str
    line: int


@dataclass(frozen=True)
class Filters:
    """What the scan was told to leave out and where that came from, so a report never hides
    that it was filtered (text header, JSON `filters`)."""

    config: str | None = None  # the pyproject.toml whose [tool.kvtrace] was applied
    select: tuple[str, ...] = ()  # only these rules (empty: every rule)
    ignore: tuple[str, ...] = ()  # rules left out
    ignored_backends: tuple[str, ...] = ()  # backends of the tree that were left out
    unknown_backends: tuple[str, ...] = ()  # backends asked to be left out that the tree does not have

    @property
    def active(self) -> bool:
        return bool(self.config or self.select or self.ignore or self.ignored_backends or self.unknown_backends)

    def describe(self) -> str:
        """One line: `config pyproject.toml · left out: backend fake · rules: only pinned-state`."""
        parts = [f"config {self.config}"] if self.config else []
        if self.ignored_backends:
            parts.append("left out: backend" + ("s " if len(self.ignored_backends) > 1 else " ")
                         + ", ".join(self.ignored_backends))
        if self.unknown_backends:
            parts.append("no such backend to leave out: " + ", ".join(self.unknown_backends))
        if self.select:
            parts.append("rules: only " + ", ".join(self.select))
        if self.ignore:
            parts.append("rules left out: " + ", ".join(self.ignore))
        if len(parts) == 1 and self.config:
            parts.append("nothing left out")
        return " · ".join(parts)


@dataclass
class Report:
    """Everything one scan of one package found: what every report format is written from."""

    target: str
    files: list[SourceFile]
    queues: list[QueueReport]
    backends: list[Backend]
    findings: list[Finding]
    root: str = ""  # the located disaggregation folder, relative to the target
    enum: Evidence | None = None
    problems: list[Problem] = field(default_factory=list)
    schema: str = SCHEMA
    gaps: list[Gap] = field(default_factory=list)
    version: DetectedVersion | None = None
    filters: Filters = field(default_factory=Filters)

    @property
    def incomplete(self) -> bool:
        return bool(self.gaps)
    # Facts about where the tree was found, set by kvtrace.fleet: host, sglang_version, metrics.
    host_facts: dict[str, object] = field(default_factory=dict)
    # Each judged queue's graph, the fates were read from, by queue name in the pack's order, as
    # {"nodes": [(node, attrs)], "edges": [(a, b, attrs)]} (kvtrace.report.diagram.queue_graph
    # rebuilds one); `drawn` names the one the diagrams and --graph show.
    graphs: dict[str, dict[str, list[Any]]] = field(default_factory=dict, repr=False, compare=False)
    drawn: str | None = None

    @property
    def graph(self) -> dict[str, Any] | None:
        """The drawn queue's graph, with its name under "queue" (what a report carried before it
        kept one graph per queue)."""
        if self.drawn is None or self.drawn not in self.graphs:
            return None
        return {**self.graphs[self.drawn], "queue": self.drawn}
