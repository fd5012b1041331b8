"""Path exploration over libcst function bodies.

Given one concrete poll state (or none, for a sender's poll()), walk every path through a block
of statements, following helper methods and module functions, and record what happens on each
path as a sequence of events. Conditions on tracked values are decided or refined
(==, !=, is, in, not in, and/or/not, truthiness); any other condition goes both ways.
Identical path states are merged after every statement, so n independent unknown conditions
that change nothing do not cost 2**n.
"""

from __future__ import annotations

import ast
import bisect
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

import libcst as cst

from kvtrace.gaps import Cut
from kvtrace.index import ClassInfo, FuncRef, Index, holds_text, same_origin
from kvtrace.parse import CstFunction
from kvtrace.model import SITE_KINDS, EventKind
from kvtrace.syntax import cst_descendants, dotted, enum_member, self_attr
from kvtrace.states import ABSENT, FALSE, INT, MARKERS, NONE, NOW, OTHER, POLLS, ROLES, TRUE, Domain, Val, refine

MAX_PATHS = 4096  # per statement; past this the analysis says it is incomplete
# Path steps (one statement run on one live path) one exploration may take in all, helper runs
# included: past it the run stops where it is and says so (a Cut, INCOMPLETE). Counted in steps,
# not seconds, so that a scan's result never depends on the machine. The largest drain or sender
# exploration of the SGLang releases tested takes under 1% of it.
MAX_STEPS = 2_000_000
MAX_DEPTH = 12  # helper call depth

EMPTY: Val = frozenset()
# Events that describe a path but are not rows of the release map.
NOT_SITES: frozenset[EventKind] = frozenset(EventKind) - SITE_KINDS


_HASHED: dict[type, Callable[[object], tuple]] = {}


def _cached_hash(self) -> int:
    """The dataclass hash (of the fields in order), computed once per immutable instance."""
    own = self.__dict__
    found = own.get("_hash")
    if found is None:
        fields_of = _HASHED.get(type(self))
        if fields_of is None:
            names = tuple(f.name for f in fields(self) if (f.compare if f.hash is None else f.hash))
            fields_of = _HASHED[type(self)] = attrgetter(*names) if len(names) > 1 else (lambda o: (getattr(o, names[0]),))
        found = own["_hash"] = hash(fields_of(self))
    return found


def _without_hash(self) -> dict:
    # str hashes differ between processes: a pickled instance never carries its cached hash.
    return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_events")}


class _Keyed:
    """A value whose hash is computed once: a part of the keys paths are merged by, hashed at
    every statement, while the event sequence it stands for is shared by many paths and changes
    far less often (hashing a sequence calls each event's __hash__)."""

    __slots__ = ("value", "hashed", "stripping")

    def __init__(self, value: object, hashed: int | None = None) -> None:
        self.value = value
        self.hashed = hash(value) if hashed is None else hashed
        # An event sequence's _Stripping, once widen() asked for it: carried forward to the
        # sequences made from it (_extended), so each is stripped in the events it appended.
        self.stripping: _Stripping | None = None

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Keyed) and self.hashed == other.hashed
                                 and (self.value is other.value or self.value == other.value))


# (id of an event sequence, view) -> (the sequence, its keyed view). The entry holds the sequence,
# so the id stays its own while the entry lives; the bound only limits memory (a miss recomputes):
# a fate view holds a tuple per site of its sequence, and 32k of them held ~100 MB of 0.5.23's
# decode scan alive once a path's own events no longer pass through here.
_VIEWS: dict[tuple[int, Callable | None], tuple[tuple, _Keyed]] = {}
_VIEWS_MAX = 1 << 12


def _viewed(events: tuple, view: Callable[[tuple], object] | None = None) -> _Keyed:
    """`view(events)` (or the events), keyed; computed once per sequence object and view."""
    key = (id(events), view)
    found = _VIEWS.get(key)
    if found is not None and found[0] is events:
        return found[1]
    keyed = _Keyed(events, _sequence_hash(events)) if view is None else _Keyed(view(events))
    if len(_VIEWS) >= _VIEWS_MAX:
        _VIEWS.clear()
    _VIEWS[key] = (events, keyed)
    return keyed


_EMPTY_SEQUENCE_HASH = 0x6B76  # where every event sequence's hash starts


def _sequence_hash(events: Iterable["Event"], start: int = _EMPTY_SEQUENCE_HASH) -> int:
    """An event sequence's hash, folded event by event from its prefix's (`start`): a path
    that emits one event is hashed in one step, not one per event it holds. It depends on the
    events alone, so equal sequences hash equal however they were built."""
    hashed = start
    for event in events:
        hashed = hash((hashed, event))
    return hashed


# (id of a sequence's key, the events appended) -> (that key, the key of the longer sequence).
# An entry holds the shorter key, so its id stays its own while the entry lives.
_EXTENDED: dict[tuple[int, tuple], tuple[_Keyed, _Keyed]] = {}
_EXTENDED_MAX = 1 << 16


def _extended(keyed: _Keyed, added: tuple["Event", ...]) -> _Keyed:
    """The key of `keyed`'s sequence followed by `added`, one object per such sequence while
    remembered (hash-consing): paths that differ in their bindings but went through the same
    events get the same key and the same tuple, so comparing them (a merge, widen()'s table of
    stripped sequences) is an identity check instead of a walk over thousands of events. A key
    made twice (after the table is cleared) still compares equal by content."""
    entry = (id(keyed), added)
    found = _EXTENDED.get(entry)
    if found is not None and found[0] is keyed:
        return found[1]
    longer = _Keyed(keyed.value + added, _sequence_hash(added, keyed.hashed))  # type: ignore[operator]
    if keyed.stripping is not None:
        longer.stripping = keyed.stripping.advanced(added)
    if len(_EXTENDED) >= _EXTENDED_MAX:
        _EXTENDED.clear()
    _EXTENDED[entry] = (keyed, longer)
    return longer


def _path_hash(self: "PathState") -> int:
    """_cached_hash, with the events' hash taken once per sequence rather than once per path
    (bindings change on most statements, the events on few)."""
    own = self.__dict__
    found = own.get("_hash")
    if found is None:
        found = own["_hash"] = hash((self.env, self.attrs, _events_keyed(self).hashed, self.term, self.ret))
    return found


def _events_keyed(path: "PathState") -> _Keyed:
    """The path's event sequence, keyed; kept on the path (widen() asks again after merges have
    hashed it, by when the shared view may have been evicted)."""
    own = path.__dict__
    found = own.get("_events")
    if found is None:
        found = own["_events"] = _viewed(path.events)
    return found


_Result = TypeVar("_Result")


def _by_state(paths: list[PathState], step: Callable[[PathState], list[_Result]],
              moved: Callable[[_Result, PathState, PathState], _Result]) -> Iterator[list[_Result]]:
    """step(path) for each path in order, run once per state: what a statement does to a path
    depends on its bindings, facts, ending and return value, never on its events (helper runs
    are remembered on the same grounds), and paths that differ only in their events are most of
    a drain's. The other paths of a state get the first one's results moved onto their own
    events (`moved(result, first, path)`)."""
    seen: dict[tuple, tuple[PathState, list[_Result]]] = {}
    for path in paths:
        key = (path.env, path.attrs, path.term, path.ret)
        known = seen.get(key)
        if known is None:
            results = step(path)
            seen[key] = (path, results)
            yield results
        else:
            first, results = known
            yield [moved(result, first, path) for result in results]


def _moved(result: PathState, first: PathState, path: PathState) -> PathState:
    """`result` (what a step made of `first`) with `path`'s events before the step's own."""
    if result is first:
        return path
    if result.events is first.events:
        return _path(result.env, result.attrs, path.events, result.term, result.ret, path)
    return _appending(path, result.env, result.attrs, result.events[len(first.events):], result.term, result.ret)


def _moved_pair(result: tuple[PathState, Val], first: PathState, path: PathState) -> tuple[PathState, Val]:
    return _moved(result[0], first, path), result[1]


def _moved_decision(result: tuple[PathState, bool, bool], first: PathState, path: PathState) -> tuple[PathState, bool, bool]:
    return _moved(result[0], first, path), result[1], result[2]


class PathLimit(Exception):
    """More paths than a `give_up` exploration allows."""


@dataclass(frozen=True)
class Event:
    kind: EventKind
    path: str
    line: int
    function: str
    detail: str = ""
    after_loop: bool = False  # done after the drain loop, for each request of a finished list

    # Paths are merged by hashing after every statement; each event is hashed once, not per merge.
    __hash__ = _cached_hash
    __getstate__ = _without_hash

    def __post_init__(self) -> None:
        # EventKind("keep") raises on a kind that does not exist, so a typo never passes as a site.
        if not isinstance(self.kind, EventKind):
            object.__setattr__(self, "kind", EventKind(self.kind))


Bindings = tuple[tuple[str, Val], ...]


class _Touched(threading.local):
    """The attribute keys each run in progress read or wrote (PathState.attr, set_attr), the
    innermost last: what a run's result can depend on besides the facts it may forget (see
    Explorer.call_function). A run that ends adds its own to its caller's. One stack per thread:
    scans that threads of one process run at once never add to each other's runs."""

    def __init__(self) -> None:
        self.runs: list[set[str]] = []


_TOUCHED = _Touched()


def _lookup(bindings: Bindings, name: str) -> Val | None:
    for key, value in bindings:
        if key == name:
            return value
    return None


def _with(bindings: Bindings, name: str, value: Val) -> Bindings:
    """The bindings (sorted by name, names unique) with `name` bound to `value`."""
    at = bisect.bisect_left(bindings, name, key=_name_of)
    after = at + 1 if at < len(bindings) and bindings[at][0] == name else at
    return bindings[:at] + ((name, value),) + bindings[after:]


def _name_of(binding: tuple[str, Val]) -> str:
    return binding[0]


@dataclass(frozen=True)
class PathState:
    env: Bindings = ()
    attrs: Bindings = ()  # self.X assigned on this path
    events: tuple[Event, ...] = ()
    term: str | None = None  # continue, break, return, raise
    ret: Val | None = None

    __hash__ = _path_hash  # a path is hashed at every merge while it lives
    __getstate__ = _without_hash

    # env and attrs are sorted tuples of (name, value) so that equal paths hash equal and merge.
    def get(self, name: str) -> Val | None:
        return _lookup(self.env, name)

    def bind(self, name: str, value: Val) -> "PathState":
        return _path(_with(self.env, name, value), self.attrs, self.events, self.term, self.ret, self)

    def attr(self, name: str) -> Val | None:
        runs = _TOUCHED.runs
        if runs:
            runs[-1].add(name)
        return _lookup(self.attrs, name)

    def set_attr(self, name: str, value: Val) -> "PathState":
        runs = _TOUCHED.runs
        if runs:
            runs[-1].add(name)
        return _path(self.env, _with(self.attrs, name, value), self.events, self.term, self.ret, self)

    def emit(self, event: Event) -> "PathState":
        return _appending(self, self.env, self.attrs, (event,), self.term, self.ret)

    def ending(self, term: str | None) -> "PathState":
        """The path, ended by `term` (None: running again)."""
        return _path(self.env, self.attrs, self.events, term, self.ret, self)

    def returning(self, value: Val) -> "PathState":
        """The path, ended by a return of `value`."""
        return _path(self.env, self.attrs, self.events, "return", value, self)


def _path(env: Bindings, attrs: Bindings, events: tuple[Event, ...], term: str | None, ret: Val | None,
          source: PathState | None = None) -> PathState:
    """PathState(env, attrs, events, term, ret) without the frozen dataclass's __init__ (or
    dataclasses.replace): paths are made ~10^5 times a scan. `source`, the path it was made
    from, holds the same `events`: the key of its events, once computed, is carried over
    instead of hashing the whole sequence again."""
    path = _new(PathState)
    fields_of = path.__dict__
    fields_of["env"] = env
    fields_of["attrs"] = attrs
    fields_of["events"] = events
    fields_of["term"] = term
    fields_of["ret"] = ret
    if source is not None:
        keyed = source.__dict__.get("_events")
        if keyed is not None:
            fields_of["_events"] = keyed
    return path


def _appending(source: PathState, env: Bindings, attrs: Bindings, added: tuple[Event, ...], term: str | None,
               ret: Val | None) -> PathState:
    """A path made from `source` whose events are `source`'s followed by `added`: the longer
    sequence is built once, and when `source`'s key is known it is folded forward and the
    sequence shared with every path that appended the same events to it (`_extended`)."""
    if not added:
        return _path(env, attrs, source.events, term, ret, source)
    keyed = source.__dict__.get("_events")
    if keyed is None:
        return _path(env, attrs, source.events + added, term, ret)
    keyed = _extended(keyed, added)
    path = _path(env, attrs, keyed.value, term, ret)  # type: ignore[arg-type]  # one tuple per sequence
    path.__dict__["_events"] = keyed
    return path


_new = object.__new__


@dataclass
class Frame:
    func: FuncRef
    body: "CstBody"
    cls: ClassInfo | None  # the class whose MRO `self.` resolves in
    # Whose attributes `self.X` are: "" for the object under analysis, COMPANION for the object
    # behind it (Options.companion). PathState.attrs keys are prefix + name, so both live on one path.
    prefix: str = ""
    # The name that holds the object: "self", or a module function's parameter given `self`.
    self_name: str = "self"

    def is_self(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Name) and node.value == self.self_name

    def is_self_attr(self, node: cst.CSTNode) -> bool:
        return self_attr(node, self.self_name) is not None


COMPANION = "@obj."  # attribute-key prefix of the companion object (Options.companion)
METHOD = "@fn:"  # value token of a bound method: "@fn:<prefix>|<name>"


@dataclass
class CstBody:
    node: cst.FunctionDef
    line: Callable[[cst.CSTNode], int]


@dataclass(frozen=True)
class Companion:
    """A second object the analysed one holds in attributes of its own (`self.kv_mgr`): calls of
    its methods through them run on that object, whose attributes live on the same path under
    COMPANION. `enterable`: the ids of its methods worth entering (None: all); a call of any
    other is an unknown value."""

    cls: ClassInfo
    attrs: frozenset[str]
    enterable: frozenset[int] | None = None
    # A token one argument must hold for a call from the analysed object to be entered (a queue's
    # builder: the request, `self.scheduler.handle_bootstrap_failure(req)`); None: any call.
    given: str | None = None

    def holds(self, attr: str) -> bool:
        return attr in self.attrs

    def enters(self, func: FuncRef) -> bool:
        return self.enterable is None or id(func.node) in self.enterable


@dataclass(frozen=True)
class Options:
    """What one exploration tracks: fixed for the run (what it learns is its RunLog). `state` is
    the poll state of this run (drain mode)."""

    index: Index
    domain: Domain
    state: str | None = None
    attr_values: Callable[[str], Val] | None = None
    companion: Companion | None = None  # the object behind the analysed one (a sender's manager)
    clock_far: bool = False  # the clock is past every deadline: timeout comparisons are decided
    all_facts: bool = False  # remember every test of an unknown chain (sender mode)
    # Drain mode: the drain's mode parameters (graph.find_modes); a test of one is a `guard` event.
    guards: frozenset[str] = frozenset()
    max_paths: int = MAX_PATHS  # per statement; a quick question (table reachability) asks for fewer
    give_up: bool = False  # past max_paths raise PathLimit (the question has no answer) instead of truncating
    max_steps: int | None = None  # path steps in all; None: MAX_STEPS
    record_returns: bool = False  # emit a return event at each return (a sender's poll(): the line a state comes from)
    # What calls, attribute reads and writes and membership tests do to the request, the queue or
    # the table (kvtrace.effects): the drain loop's or the sender's. Frozen: part of the memo key.
    effects: Effects = field(kw_only=True)


@dataclass(frozen=True)
class CallSite:
    """A call on a live path, as the walker's Effects see it: the node, its callee's dotted text
    ("" when the callee is not a name chain), the arguments' values, and where it is."""

    node: cst.Call
    callee: str
    values: list[Val]
    frame: Frame

    @property
    def method(self) -> str:
        return self.callee.rsplit(".", 1)[-1] if self.callee else ""

    @property
    def receiver(self) -> str:
        return self.callee.rsplit(".", 1)[0] if "." in self.callee else ""

    def event(self, kind: EventKind, detail: str) -> Event:
        """An event at this call (its line is read only here: positions cost a libcst pass)."""
        frame = self.frame
        return Event(kind, frame.func.path, frame.body.line(self.node), frame.func.qualname, detail)


class Effects(Protocol):
    """The walker's callbacks at a call (see kvtrace.effects): the domain lives there, never here."""

    def on_call(self, run: Explorer, site: CallSite, path: PathState) -> list[tuple[PathState, Val]] | None:
        """The paths and value of a call that is an effect; None: the walker follows the call."""

    def on_unresolved_call(self, run: Explorer, site: CallSite, path: PathState) -> PathState:
        """The path before a call the walker can neither enter nor name goes on as unknown."""

    def on_self_read(self, run: Explorer, node: cst.Attribute, key: str, path: PathState, frame: Frame) -> PathState:
        """`self.X` read (`key`: its attribute key, prefix and name): the path as it goes on."""

    def on_self_write(self, run: Explorer, target: cst.Attribute, key: str, path: PathState, frame: Frame) -> PathState:
        """`self.X = ...`, before the value is stored under `key`."""

    def on_membership(self, run: Explorer, node: cst.Comparison, is_in: bool, path: PathState,
                      frame: Frame) -> list[tuple[PathState, bool, bool]] | None:
        """`k in c` (`is_in`) or `k not in c` where the domain knows `c`: each path with the
        test's truth (and whether the poll value decided it); None: the walker's own comparison."""

    def keyed(self, run: Explorer, node: cst.CSTNode, frame: Frame) -> bool:
        """Whether the expression is a container the domain models by key (the manager's status
        table): its reads, stores, deletes and methods are the calls below."""

    def on_key_read(self, run: Explorer, node: cst.Subscript, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        """`c[k]`."""

    def on_key_store(self, run: Explorer, target: cst.Subscript, value: Val, path: PathState, frame: Frame) -> PathState:
        """`c[k] = value`."""

    def on_key_delete(self, run: Explorer, node: cst.Del, path: PathState, frame: Frame) -> list[PathState]:
        """`del c[k]`."""

    def on_key_method(self, run: Explorer, node: cst.Call, method: str, values: list[Val], path: PathState,
                      frame: Frame) -> list[tuple[PathState, Val]]:
        """`c.<method>(values...)`."""


@dataclass
class RunLog:
    """What an exploration learned besides its paths, returned to its caller (never written into
    its Options): where it cut paths or stopped (`path:line`, or a Cut for the step budget and
    statements it has no handler for), and the functions it had to enter but libcst could not
    parse (the scan is then incomplete)."""

    truncated: list[str] = field(default_factory=list)
    unparsed: set[str] = field(default_factory=set)


_CODE = cst.Module(body=[])


@lru_cache(maxsize=4096)
def code(node: cst.CSTNode) -> str:
    # Keyed by identity (libcst nodes compare by identity; a cached node stays alive, so its id
    # is never reused): the same few conditions are rendered ~70 times each in a scan.
    return _CODE.code_for_node(node)


def names_in(node: cst.CSTNode) -> set[str]:
    """Every identifier and attribute name in an expression (for timeout detection)."""
    found: set[str] = set()
    for n in cst_descendants(node):
        if isinstance(n, cst.Name):
            found.add(n.value)
        elif isinstance(n, cst.Attribute):
            found.add(n.attr.value)
    return found


_FORGETTABLE = frozenset({"chain", "self-chain", "comparison", "instance"})  # fact kinds forget_dead drops once read no more
_CHAIN = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")  # a name or attribute chain: what live_after lists


def _lines_of(func: FuncRef) -> list[str]:
    return func.module.lines[func.node.lineno - 1: func.node.end_lineno or func.node.lineno]


def _holds(index: Index, func: FuncRef, text: str) -> bool:
    """Whether one of the function's lines holds `text` (its lines joined once)."""
    key = ("function text", id(func.node))
    joined = index.derived.get(key)
    if joined is None:
        joined = index.derived[key] = "\n".join(_lines_of(func))
    return holds_text(_lines_of(func), joined, text)


def merge(paths: Iterable[PathState]) -> list[PathState]:
    return list(dict.fromkeys(paths))


def widen(paths: list[PathState]) -> list[PathState]:
    """Paths that differ only in which helpers they entered that did nothing on them (no event
    but entering further helpers) are one path, the first: after every statement of a drain run
    (its paths are read as acting_events, where they are equal), and past the path limit,
    before anything is cut, of a sender's. No fate or verdict reads such an entry, and what a path
    does next depends on its bindings, facts and ending, never on its events: the first path's
    future is every merged one's."""
    return list(_first_by(paths, lambda p: (p.env, p.attrs, p.term, p.ret, _idle_stripped(p))))


def acting_events(path: PathState) -> tuple[Event, ...]:
    """The path's events without the entries of helper runs in which nothing but entering other
    helpers happened: what a drain path's fate, map rows and evidence are read from (a helper
    that did nothing on the path is no line of it a person needs to open)."""
    return _idle_stripped(path).value  # type: ignore[return-value]


def _idle_stripped(path: PathState) -> _Keyed:
    """The path's events without idle helper entries, keyed (see _Stripping)."""
    raw = _events_keyed(path)
    if raw.stripping is None:
        raw.stripping = _Stripping.EMPTY.advanced(raw.value)  # type: ignore[arg-type]
    return raw.stripping.kept


class _Stripping:
    """An event sequence being stripped of the entries of helper runs in which nothing but entering
    other helpers happened, as far as it goes; `advanced(added)` is the same for the sequence
    followed by `added`. Calls are rebuilt from the events: a helper entry opens a call of its
    detail (the callee), an event of a function closes the calls opened after that function's,
    and an event other than an entry inside a call makes it and every call around it do
    something. So the calls still open that did nothing are the innermost ones, their entries are
    the last events seen but for closed idle calls' (`waiting`), and everything before is decided
    (`kept`): the sequence stripped is `kept` (an open call that did nothing so far is idle if the
    sequence ends there). Paths past the limit hold many sequences that share prefixes (0.5.21's
    decode drains: 206k stripped sequences of thousands of events): each is stripped in the
    events it appended to its source's, and `kept` is hash-consed like the sequences (_extended)."""

    __slots__ = ("kept", "calls", "waiting")

    EMPTY: "_Stripping"

    def __init__(self, kept: _Keyed, calls: tuple[str, ...], waiting: tuple["Event", ...]) -> None:
        self.kept = kept  # the decided events, keyed
        self.calls = calls  # callees of the open calls, outermost first
        self.waiting = waiting  # entries of the innermost open calls that did nothing yet

    def advanced(self, added: tuple["Event", ...]) -> "_Stripping":
        kept, calls, waiting = self.kept, self.calls, self.waiting
        decided: tuple[Event, ...] = ()
        for event in added:
            if calls and calls[-1] != event.function:  # else nothing closes: most events stay in their function
                depth = len(calls)
                if event.function in calls:
                    while calls[depth - 1] != event.function:
                        depth -= 1
                else:
                    depth = 0
                closed = len(calls) - depth
                calls = calls[:depth]
                # Closed calls that did nothing drop their entries; the others' are decided.
                waiting = waiting[:max(len(waiting) - closed, 0)]
            if event.kind is EventKind.HELPER:
                calls = (*calls, event.detail)
                waiting = (*waiting, event)
            else:  # inside a call: it and every call around it did something
                decided = (*decided, *waiting, event)
                waiting = ()
        if decided:
            kept = _extended(kept, decided)
        return _Stripping(kept, calls, waiting)


_Stripping.EMPTY = _Stripping(_Keyed((), _EMPTY_SEQUENCE_HASH), (), ())


def fold(paths: list[PathState]) -> list[PathState]:
    """Still past the path limit after widen(): paths that agree on all a fate, a map row or a
    rule reads of their events are one, the first. What is read is the sequence of release-map
    sites with their details (the queue graph and its edges), the set of event kinds (outcome,
    whether a path logs, answers or counts) and the last mode guard (where a path that skips the
    poll waits). Events outside that (which log line, which idle helper, the order of logs) give
    paths with the same future and the same reading; the first path stands for them and its
    events are the ones a finding shows."""
    return list(_first_by(paths, lambda p: (p.env, p.attrs, p.term, p.ret, _viewed(p.events, _fate_view))))


def _fate_view(events: tuple[Event, ...]) -> tuple:
    sites = tuple((e.kind, e.path, e.line, e.detail) for e in events if e.kind not in NOT_SITES)
    guard = next(((e.path, e.line, e.detail) for e in reversed(events) if e.kind is EventKind.GUARD), None)
    return sites, frozenset(e.kind for e in events), guard


def _first_by(paths: list[PathState], key: Callable[[PathState], tuple]) -> Iterable[PathState]:
    seen: set[tuple] = set()
    for path in paths:
        k = key(path)
        if k not in seen:
            seen.add(k)
            yield path


PARK_ENDED = True  # False: every statement forgets, merges and widens the ended paths too (the tests' reference)
SHARE_RUNS = True  # False: a helper's run serves only paths with all the same attributes (the tests' reference)
SHARE_STARTED = True  # False: a sender method's run serves only the attributes it started from (StartedRun; the tests' reference)


class _Parked:
    """Ended paths a block set aside (Explorer.run_block), in batches in the order they ended,
    each with the first of the statements since whose forgetting it still owes (`steps`: each
    statement's live names and the statement, for dead_fact)."""

    __slots__ = ("batches", "steps", "count")

    def __init__(self) -> None:
        self.batches: list[tuple[list[PathState], int]] = []
        self.steps: list[tuple[frozenset[str], cst.CSTNode]] = []
        self.count = 0

    def add(self, paths: list[PathState]) -> None:
        if paths:
            self.batches.append((paths, len(self.steps)))
            self.count += len(paths)

    def clear(self) -> None:
        self.batches, self.steps, self.count = [], [], 0

    def __len__(self) -> int:
        return self.count


class Explorer:
    def __init__(self, options: Options):
        self.c = options
        self.log = RunLog()
        self.stack: list[int] = []
        self._fact_cache: dict[tuple[int, str], bool] = {}
        # Per Comparison node and object. The node is kept with its key: chained comparisons are
        # split into throwaway nodes, and a freed node's id() may be reused by the next one.
        self._comparison_keys: dict[tuple[int, str], tuple[cst.Comparison, str | None]] = {}
        self._discarded: cst.CSTNode | None = None  # the call of an expression statement
        self._read_state = False  # the poll state's value was used (by the helper run in progress)
        self._unparsed_log: list[str] = []  # every RunLog.unparsed addition, in order
        self._key: tuple | None = None
        self._calls = 0  # helper runs in progress: 0 in the run's own frames (drain loop, its owner's loops)
        self.steps = 0  # path steps taken (see MAX_STEPS)
        self.spent = False  # the step budget ran out: no statement runs any more
        self.max_steps = options.max_steps if options.max_steps is not None else MAX_STEPS

    # --- entry points ----------------------------------------------------------------------

    def explore_function(self, func: FuncRef, parsed: CstFunction, cls: ClassInfo | None,
                         starts: list[PathState], prefix: str = "") -> tuple[list[PathState], RunLog]:
        """Every path through `func`'s body (its libcst tree `parsed`) from `starts`, `self.` being
        an object of `cls`; with what the run learned besides (this explorer's log)."""
        self.stack.append(id(func.node))
        ends = self.run_block(function_body(parsed.node), starts, Frame(func, CstBody(parsed.node, parsed.line), cls, prefix))
        return ends, self.log

    def run_block(self, stmts: Iterable[cst.CSTNode], paths: list[PathState], frame: Frame) -> list[PathState]:
        # Only the poll state's runs forget what is read no more: a sender's facts outlive the
        # run (poll() runs again after abort() on the same attributes).
        forget = self.c.state is not None and not self.c.all_facts
        # Ended paths only wait for the block's end, most of a drain's (0.5.23's preallocation
        # loop: 8k of 12k paths past its helpers' raises): they are set aside, and what each
        # statement would have done to them (forget, merge, widen) is done once when they are
        # taken back, with the same result (see _Parked).
        parked = _Parked()
        for stmt in stmts:
            live = [p for p in paths if p.term is None]
            if not live or self.spent:
                break
            self.steps += len(live)
            if self.steps > self.max_steps:
                self.spend(stmt, frame)
                break
            ended = [p for p in paths if p.term is not None]
            if PARK_ENDED:
                parked.add(ended)
                paths = self.stmt(stmt, live, frame)
            else:
                paths = ended + self.stmt(stmt, live, frame)
            if parked and (not paths or len(paths) + len(parked) > self.c.max_paths):
                paths = self.unpark(parked, frame, forget) + paths  # the limit and a lone path need the exact count
            if forget and (len(paths) > 1 or parked):
                after = live_after(frame.body.node, stmt, self.c.index.derived)
                if after is not None:
                    parked.steps.append((after, stmt))
                paths = self.forget_dead(paths, stmt, frame)
            paths = merge(paths)
            # A drain run's paths are read without their idle helper entries (acting_events),
            # so paths that differ only in those are one path at every statement; a sender's
            # only past the limit (its events are the lines of poll()'s answers).
            if forget or len(paths) > self.c.max_paths:
                paths = widen(paths)
            # A drain run's paths end in fates and map rows (what fold keeps); a sender's facts
            # outlive its run (poll() again after abort()), so only a drain run folds them.
            if forget and len(paths) > self.c.max_paths:
                paths = fold(paths)
            # Past the limit any run joins before it cuts, a sender's too: forgetting its facts
            # there loses precision, cutting loses paths. A quick question gives up instead.
            if (forget or not self.c.give_up) and len(paths) > self.c.max_paths:
                paths = self.coarsen(paths)
            if len(paths) > self.c.max_paths:
                if self.c.give_up:
                    raise PathLimit(f"{frame.func.path}:{frame.body.line(stmt)}")
                self.log.truncated.append(f"{frame.func.path}:{frame.body.line(stmt)}")
                paths = paths[:self.c.max_paths]
        if not parked:
            return paths
        paths = merge(self.unpark(parked, frame, forget) + paths)
        return widen(paths) if forget else paths

    def unpark(self, parked: "_Parked", frame: Frame, forget: bool) -> list[PathState]:
        """The paths set aside, as the statements run since would have left them: each forgets
        what none of those statements' ends read again (the names not live after every one of
        them, the facts dead after any), then merged and widened as one list, in their order.
        The same as doing it statement by statement: a path set aside never changes but by
        forgetting, and two paths equal once stay equal after forgetting more."""
        ready: list[PathState] = []
        for batch, first in parked.batches:
            steps = parked.steps[first:]
            if steps:
                live_after_all = frozenset.intersection(*(after for after, _ in steps))
                batch = self._forgetting(batch, live_after_all.__contains__,
                                         lambda key: any(self.dead_fact(key, after, stmt, frame) for after, stmt in steps))
            ready += batch
        parked.clear()
        ready = merge(ready)
        return widen(ready) if forget else ready

    def coarsen(self, paths: list[PathState]) -> list[PathState]:
        """The last step before paths are cut: forget what the path's tests found about attribute
        chains and comparisons (facts), and join the values of locals that hold neither a role
        (the request, a keep list), the clock nor the poll state of this run: paths equal but
        for those become one whose locals hold the union of their values (the join of abstract
        interpretation). A later test then goes both ways where it went one way on each: more
        paths are possible and none is lost, where cutting would lose some and leave the scan
        incomplete. Object attributes and the status table are kept."""
        exact = ROLES | {NOW, ABSENT} | ({self.c.state} if self.c.state else set())

        def kept(binding: tuple[str, Val]) -> bool:
            return not (isinstance(binding[0], FactKey) and binding[0].kind in _FORGETTABLE)

        groups: dict[tuple, list[PathState]] = {}
        for p in paths:
            shape = tuple((name, value if value & exact else None) for name, value in p.env)
            key = (shape, tuple(filter(kept, p.attrs)), p.term, p.ret, _viewed(p.events, _fate_view))
            groups.setdefault(key, []).append(p)
        out = []
        for (shape, attrs, _, _, _), members in groups.items():
            first = members[0]
            env = tuple((name, value if value is not None else frozenset().union(*(m.env[i][1] for m in members)))
                        for i, (name, value) in enumerate(shape))
            out.append(_path(env, attrs, first.events, first.term, first.ret, first))
        return out

    def spend(self, stmt: cst.CSTNode, frame: Frame) -> None:
        """The step budget ran out at `stmt`: the exploration stops there and says so."""
        where = f"{frame.func.path}:{frame.body.line(stmt)}"
        if self.c.give_up:
            raise PathLimit(where)
        self.spent = True
        self.log.truncated.append(Cut.budget(where, self.max_steps))

    def forget_dead(self, paths: list[PathState], stmt: cst.CSTNode, frame: Frame) -> list[PathState]:
        """Drop what no later statement can read, so that paths differing only in it merge
        (`if req.a: x = 1` twenty times is not 2**20 paths): the function's local names not
        read after `stmt`, and facts no test after it nor in any other function can read again
        (a callee's local of the same name would read the same fact): an attribute chain of a
        local or of the object, and a comparison one of whose sides is a chain read no more."""
        after = live_after(frame.body.node, stmt, self.c.index.derived)
        if after is None:
            return paths
        return self._forgetting(paths, after.__contains__, lambda key: self.dead_fact(key, after, stmt, frame))

    @staticmethod
    def _forgetting(paths: list[PathState], live_name: Callable[[str], bool],
                    dead_key: Callable[["FactKey"], bool]) -> list[PathState]:
        """The paths without the bindings of names not live and the forgettable facts dead."""
        # Paths share their bindings and facts (a branch splits paths, it rarely rebinds them all):
        # each distinct tuple is filtered, and each fact judged, once.
        envs: dict[int, Bindings] = {}
        facts: dict[int, Bindings] = {}
        dead: dict[int, bool] = {}  # by identity: keys of one text may differ in kind

        def alive(key: object) -> bool:
            if not isinstance(key, FactKey):
                return True
            known = dead.get(id(key))
            if known is None:
                known = dead[id(key)] = dead_key(key)
            return not known

        out = []
        for path in paths:
            env = envs.get(id(path.env))
            if env is None:
                env = envs[id(path.env)] = tuple(b for b in path.env if live_name(b[0]))
            attrs = facts.get(id(path.attrs))
            if attrs is None:
                attrs = path.attrs
                if any(isinstance(k, FactKey) and k.kind in _FORGETTABLE for k, _ in attrs):
                    kept = tuple(b for b in attrs if alive(b[0]))
                    if len(kept) < len(attrs):  # the same path when nothing was dropped: it keeps its hash
                        attrs = kept
                facts[id(path.attrs)] = attrs
            out.append(path if len(env) == len(path.env) and attrs is path.attrs
                       else _path(env, attrs, path.events, path.term, path.ret, path))
        return out

    def dead_fact(self, key: "FactKey", after: frozenset[str], stmt: cst.CSTNode, frame: Frame) -> bool:
        """Whether no test after `stmt` (`after`: what the function reads after it) nor in a
        function that can run later can read `key` again."""
        if key.kind == "chain":
            return key.chain not in after and not self.read_later(key.chain, after, stmt, frame)
        if key.kind == "self-chain":
            return bool(key.sides) and f"{frame.self_name}.{key.sides[0]}" not in after \
                and not self.read_later(key.sides[0], after, stmt, frame)
        if key.kind == "instance":
            return key.sides[0] not in after and not self.read_later(key.sides[0], after, stmt, frame)
        if key.kind == "comparison":  # a test again needs both sides' text
            return any(_CHAIN.fullmatch(side) is not None and side not in after
                       and not self.read_later(side, after, stmt, frame) for side in key.sides)
        return False

    def read_later(self, text: str, after: frozenset[str], stmt: cst.CSTNode, frame: Frame) -> bool:
        """Whether `text` appears in a function that can run after `stmt`. Inside a helper's run
        its caller goes on afterwards: any other function may (read_elsewhere). In a run's own
        frame: the functions the rest of it calls, with theirs; and for the drain loop, the
        functions that call the drain (its owner's loops run after it), with theirs."""
        if self._calls:
            return self.read_elsewhere(text, frame)
        key = ("read later", id(frame.func.node), id(stmt), len(self.stack) == 1, text)
        known = self.c.index.derived.get(key)
        if known is None:
            known = any(_holds(self.c.index, func, text) for func in self.later_functions(after, stmt, frame))
            self.c.index.derived[key] = known
        return known

    def later_functions(self, after: frozenset[str], stmt: cst.CSTNode, frame: Frame) -> list[FuncRef]:
        key = ("later functions", id(frame.func.node), id(stmt), len(self.stack) == 1)
        found = self.c.index.derived.get(key)
        if found is None:
            # The union of what each name reaches: the statements of one function share most
            # names, so each name's reach is found once per function (and class).
            seen: dict[int, FuncRef] = {}
            for name in {t.rsplit(".", 1)[-1] for t in after}:
                seen.update(self._reach(name, frame))
            if len(self.stack) == 1:  # the drain loop: its callers' loops run after it
                seen.update(self._reach(None, frame))
            found = self.c.index.derived[key] = list(seen.values())
        return found

    def _reach(self, name: str | None, frame: Frame) -> dict[int, FuncRef]:
        """The functions a call of `name` can enter, with those they call in turn (by name, in
        the frame's class), never through the frame's own function; `name` None: the callers of
        the frame's function, with theirs."""
        index, cls, func = self.c.index, frame.cls, frame.func
        key = ("reach", id(func.node), id(cls), name)
        found = index.derived.get(key)
        if found is None:
            seen: dict[int, FuncRef] = {}
            todo = self._named(name, cls, func.path) if name is not None else [caller for caller, _ in index.callers(func.name)]
            while todo:
                f = todo.pop()
                if id(f.node) in seen or f.node is func.node:
                    continue
                seen[id(f.node)] = f
                for call in index.calls_in(f):
                    callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
                    if callee:
                        todo.extend(self._named(callee, cls, f.path))
            found = index.derived[key] = seen
        return found

    def _named(self, name: str, cls: ClassInfo | None, near: str) -> list[FuncRef]:
        """What a call of `name` can enter: the class's methods of that name (any in its MRO,
        for super()), or a module function."""
        index = self.c.index
        found = [c.methods[name] for c in index.mro(cls) if name in c.methods] if cls is not None else []
        function = index.resolve_function(name, near)
        return found + ([function] if function is not None else [])

    def read_elsewhere(self, chain: str, frame: Frame) -> bool:
        """Whether the text of `chain` appears in any function but the frame's (conservative:
        any mention, in any analysed file)."""
        key = ("chain elsewhere", id(frame.func.node), chain)
        known = self.c.index.derived.get(key)
        if known is None:
            func, index = frame.func, self.c.index
            known = False
            for path, module in index.modules.items():
                lines = module.lines
                if path == func.path:  # the file without the function's own lines
                    held = any(chain in line for line in lines[: func.node.lineno - 1] + lines[func.node.end_lineno or len(lines):])
                else:
                    held = holds_text(lines, module.source.text or "", chain)
                if held:
                    known = True
                    break
            index.derived[key] = known
        return known

    def call_function(self, func: FuncRef, cls: ClassInfo | None, args: dict[str, Val], path: PathState,
                      prefix: str = "", self_name: str = "self") -> list[tuple[PathState, Val]]:
        """Follow a call: run the callee on its own env, give back the caller's env + effects."""
        cst_func = self.c.index.cst(func)
        if cst_func is None:
            self._unparsed(f"{func.path}:{func.line} {func.qualname}")
        if cst_func is None or id(func.node) in self.stack or len(self.stack) >= MAX_DEPTH:
            return [(path, self.c.domain.universe)]
        env = tuple(sorted(args.items()))
        # The drain loop is explored once per state and calls the same helpers with the same
        # arguments on many paths. A run depends on this key, never on the events before the call
        # (carried through unchanged), and of the caller's attributes only on those it read or
        # wrote: one run serves every path that agrees with it on those and holds the same facts
        # (forget_dead, forget and coarsen drop a fact by its key, unread), the others taken as
        # they are (_rebaser). It is remembered per state only when it read the poll value.
        static = (self._options_key(), id(func.node), id(cls), prefix, self_name, env, tuple(self.stack))
        memo = self.c.index.call_memo
        states = (None, self.c.state) if self.c.state is not None else (None,)
        known = next((found for s in states if (found := memo.get((static, path.attrs, s))) is not None), None)
        if known is None:
            lookup = (static, fact_keys(path.attrs))
            known = next((run for s in states for run in memo.get((lookup, s), ()) if run.serves(path.attrs)), None) \
                if SHARE_RUNS else None
            if known is None:
                known = self._run_call(func, cst_func, cls, env, path, prefix, self_name)
                state = self.c.state if known.read_state else None
                memo[(static, path.attrs, state)] = known
                memo.setdefault((lookup, state), []).append(known)
                return self._call_results(path, known)
        self.log.truncated.extend(known.truncated)
        for where in known.unparsed:
            self._unparsed(where)
        if known.clears_discarded:
            self._discarded = None
        self._read_state = self._read_state or known.read_state
        if _TOUCHED.runs:
            _TOUCHED.runs[-1].update(known.touched)
        return self._call_results(path, known)

    @staticmethod
    def _call_results(path: PathState, known: "_CallRun") -> list[tuple[PathState, Val]]:
        results = []
        rebased = _rebaser(known.start, path.attrs, known.touched)
        for attrs, events, term, value in known.ends:
            attrs = rebased(attrs)
            results.append((_appending(path, path.env, attrs, events, term if term is not None else path.term, path.ret),
                            value))
        return _merge_pairs(results)

    def _run_call(self, func: FuncRef, cst_func: CstFunction, cls: ClassInfo | None, env: Bindings,
                  path: PathState, prefix: str, self_name: str) -> "_CallRun":
        frame = Frame(func, CstBody(cst_func.node, cst_func.line), cls, prefix, self_name)
        start = _path(env, path.attrs, path.events, None, None, path)
        truncated, unparsed = len(self.log.truncated), len(self._unparsed_log)
        read_before, self._read_state = self._read_state, False
        # The caller's discarded call is never a node of the callee: a marker stands for it, so
        # the run shows whether the callee cleared it (as an expression statement does).
        outer, self._discarded = self._discarded, _OUTER
        self.stack.append(id(func.node))
        self._calls += 1
        try:
            with recording_touched() as touched:
                ends = self.run_block(function_body(cst_func.node), [start], frame)
        finally:
            self._calls -= 1
            self.stack.pop()
            cleared = self._discarded is None
            self._discarded = None if cleared else outer
        read, self._read_state = self._read_state, read_before or self._read_state
        skip = len(path.events)
        results: list[tuple[Bindings, tuple[Event, ...], str | None, Val]] = []
        for end in ends:
            if end.term == "raise":
                results.append((end.attrs, end.events[skip:], "raise", EMPTY))
            else:
                results.append((end.attrs, end.events[skip:], None, end.ret if end.ret is not None else frozenset({NONE})))
        return _CallRun(tuple(results), tuple(self.log.truncated[truncated:]), tuple(self._unparsed_log[unparsed:]),
                        cleared, read, path.attrs, frozenset(touched))

    def _unparsed(self, where: str) -> None:
        self.log.unparsed.add(where)
        self._unparsed_log.append(where)

    def _options_key(self) -> tuple:
        """Everything the exploration reads from its Options but the poll state's value (so a
        field added to Options is part of the key without anyone remembering to add it). Objects
        are taken by identity and kept alive by the memo, so that their ids stay theirs."""
        if self._key is None:
            alive = self.c.index.call_memo.setdefault("alive", [])
            self._key = (self.c.state is None,) + tuple(_key_part(getattr(self.c, name), alive) for name in _OPTION_FIELDS)
        return self._key

    def poll_value(self) -> Val:
        """The poll state of this run as a value; a helper run that reads it is remembered per state."""
        self._read_state = True
        return frozenset({self.c.state}) if self.c.state is not None else self.c.domain.universe

    # --- statements ------------------------------------------------------------------------

    def stmt(self, node: cst.CSTNode, paths: list[PathState], frame: Frame) -> list[PathState]:
        handler = _STATEMENT_HANDLERS.get(type(node))
        if handler is None:
            return self.unmodelled(node, paths, frame)
        return handler(self, node, paths, frame)

    def unmodelled(self, node: cst.CSTNode, paths: list[PathState], frame: Frame) -> list[PathState]:
        """A statement kind the tables below do not know: the paths go on as if it did nothing,
        and the run says where it could not follow the code (the scan is incomplete)."""
        self.log.truncated.append(Cut.unmodelled(f"{frame.func.path}:{frame.body.line(node)}", type(node).__name__))
        return paths

    def simple_line(self, node: cst.SimpleStatementLine, paths: list[PathState], frame: Frame) -> list[PathState]:
        for small in node.body:
            live = [p for p in paths if p.term is None]
            done = [p for p in paths if p.term is not None]
            paths = done + self.small(small, live, frame)
        return paths

    def with_stmt(self, node: cst.With, paths: list[PathState], frame: Frame) -> list[PathState]:
        out = []
        for path in paths:
            for p, _ in self.eval_all([i.item for i in node.items], path, frame):
                out.append(p)
        return self.run_block(node.body.body, merge(out), frame)

    def not_run(self, node: cst.CSTNode, paths: list[PathState], frame: Frame) -> list[PathState]:
        """A nested def or class: defined here, its body not executed."""
        return paths

    def small(self, node: cst.BaseSmallStatement, paths: list[PathState], frame: Frame) -> list[PathState]:
        handler = _SMALL_HANDLERS.get(type(node))
        if handler is None:
            if not paths:
                return paths
            self.log.truncated.append(Cut.unmodelled(f"{frame.func.path}:{frame.body.line(node)}", type(node).__name__))
            return merge(paths)
        out: list[PathState] = []
        for results in _by_state(paths, lambda path: handler(self, node, path, frame), _moved):
            out.extend(results)
        return merge(out)

    # One path in, the paths out: a small statement (one of a line's `;`-separated parts).

    def expr_stmt(self, node: cst.Expr, path: PathState, frame: Frame) -> list[PathState]:
        self._discarded = node.value
        try:
            return [p for p, _ in self.eval(node.value, path, frame)]
        finally:
            self._discarded = None

    def assign_stmt(self, node: cst.Assign | cst.AnnAssign, path: PathState, frame: Frame) -> list[PathState]:
        if node.value is None:
            return [path]
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        out = []
        for p, value in self.eval(node.value, path, frame):
            for target in targets:
                p = self.assign(target, value, p, frame)
            out.append(p)
        return out

    def aug_assign_stmt(self, node: cst.AugAssign, path: PathState, frame: Frame) -> list[PathState]:
        return [p for p, _ in self.eval(node.value, path, frame)]

    def return_stmt(self, node: cst.Return, path: PathState, frame: Frame) -> list[PathState]:
        if node.value is None:
            return [self._returned(path, frame, node, frozenset({NONE})).returning(frozenset({NONE}))]
        # A value that raised while evaluated (`return table[room]`, room absent) keeps its raise.
        return [p if p.term is not None else self._returned(p, frame, node, v).returning(v)
                for p, v in self.eval(node.value, path, frame)]

    def raise_stmt(self, node: cst.Raise, path: PathState, frame: Frame) -> list[PathState]:
        event = Event(EventKind.RAISE, frame.func.path, frame.body.line(node), frame.func.qualname, "raise")
        return [path.emit(event).ending("raise")]

    def assert_stmt(self, node: cst.Assert, path: PathState, frame: Frame) -> list[PathState]:
        fn = frame.func.qualname
        out = []
        for p, truth, about_poll in self.decide(node.test, path, frame):
            if about_poll:
                p = p.emit(Event(EventKind.CHECK, frame.func.path, frame.body.line(node), fn, "T" if truth else "F"))
            if truth:
                out.append(p)
            else:
                out.append(p.emit(Event(EventKind.RAISE, frame.func.path, frame.body.line(node), fn, "assert")).ending("raise"))
        return out

    def del_stmt(self, node: cst.Del, path: PathState, frame: Frame) -> list[PathState]:
        targets = [e.value for e in node.target.elements] if isinstance(node.target, (cst.Tuple, cst.List)) else [node.target]
        for target in targets:
            if isinstance(target, cst.Subscript) and self.c.effects.keyed(self, target.value, frame):
                return self.c.effects.on_key_delete(self, node, path, frame)
        return [path]

    def continue_stmt(self, node: cst.Continue, path: PathState, frame: Frame) -> list[PathState]:
        return [path.ending("continue")]

    def break_stmt(self, node: cst.Break, path: PathState, frame: Frame) -> list[PathState]:
        return [path.ending("break")]

    def no_effect(self, node: cst.BaseSmallStatement, path: PathState, frame: Frame) -> list[PathState]:
        """`pass`, imports, `global`/`nonlocal`, `type X = ...`: nothing a path records."""
        return [path]

    def _returned(self, path: PathState, frame: Frame, node: cst.Return, value: Val) -> PathState:
        """Sender runs: mark the return statement (the line a returned state comes from)."""
        if not self.c.record_returns:
            return path
        return path.emit(Event(EventKind.RETURN, frame.func.path, frame.body.line(node), frame.func.qualname,
                               ", ".join(sorted(self.c.domain.states(value)))))

    def assign(self, target: cst.CSTNode, value: Val, path: PathState, frame: Frame | None = None) -> PathState:
        if isinstance(target, cst.Name):
            return forget(path, {("local", target.value), ("word", target.value)}).bind(target.value, value)
        if frame is not None and isinstance(target, cst.Subscript) and self.c.effects.keyed(self, target.value, frame):
            return self.c.effects.on_key_store(self, target, value, path, frame)
        if isinstance(target, cst.Attribute):  # `x.a = ...` ends what the path knew x.a's class to be
            path = forget(path, {("field", target.attr.value)})
        if frame is not None and isinstance(target, cst.Attribute) and frame.is_self_attr(target):
            return self.write_self_attr(target, value, path, frame)
        if isinstance(target, (cst.Tuple, cst.List)):
            starred = any(isinstance(e, cst.StarredElement) for e in target.elements)
            for i, element in enumerate(target.elements):
                item = None if starred else item_of(value, i)
                path = self.assign(element.value, item if item is not None else self.c.domain.universe, path, frame)
        return path

    def write_self_attr(self, target: cst.Attribute, value: Val, path: PathState, frame: Frame) -> PathState:
        key = frame.prefix + target.attr.value
        path = forget(path, {("attr", key), ("word", target.attr.value)})
        if NOW in value:  # a stored clock reading is a fixed past time, not one that grows
            value = (value - {NOW}) | {OTHER}
        return self.c.effects.on_self_write(self, target, key, path, frame).set_attr(key, value)

    def if_stmt(self, node: cst.If, paths: list[PathState], frame: Frame) -> list[PathState]:
        yes: list[PathState] = []
        no: list[PathState] = []
        # Only in the drain's own body, where its parameters are bound (a helper's names are its own).
        guard = bool(self.c.guards) and len(self.stack) <= 1 and bool(names_in(node.test) & self.c.guards)
        for decided in _by_state(paths, lambda path: self.decide(node.test, path, frame), _moved_decision):
            for p, truth, about_poll in decided:
                if about_poll:
                    line = frame.body.line(node.test)
                    p = p.emit(Event(EventKind.CHECK, frame.func.path, line, frame.func.qualname, "T" if truth else "F"))
                if guard and p.term is None:
                    text = code(node.test)
                    p = p.emit(Event(EventKind.GUARD, frame.func.path, frame.body.line(node.test), frame.func.qualname,
                                     text if truth else f"not ({text})"))
                (yes if truth else no).append(p)
        out = self.run_block(node.body.body, merge(yes), frame) if yes else []
        no = merge(no)
        if node.orelse is None:
            return out + no
        if isinstance(node.orelse, cst.If):
            return out + (self.if_stmt(node.orelse, no, frame) if no else [])
        return out + (self.run_block(node.orelse.body.body, no, frame) if no else [])

    def match_stmt(self, node: cst.Match, paths: list[PathState], frame: Frame) -> list[PathState]:
        """Cases in order; a value pattern (`case KVPoll.A | KVPoll.B:`) splits the subject's
        values like `in`, a wildcard takes the rest, anything else goes both ways."""
        out: list[PathState] = []
        pending: list[tuple[PathState, Val]] = []
        for path in paths:
            pending.extend(self.eval(node.subject, path, frame))
        subject = node.subject.value if isinstance(node.subject, cst.Name) else None
        for case in node.cases:
            entering: list[PathState] = []
            rest: list[tuple[PathState, Val]] = []
            constants = self.pattern_values(case.pattern, frame)
            for p, value in pending:
                if p.term is not None:
                    out.append(p)
                    continue
                if constants is None:  # a pattern kvtrace cannot evaluate
                    yes, no = value, value
                else:
                    yes, no = refine("in", value, constants)
                about = bool(self.c.domain.states(value)) and self._is_state_valued(value)
                for part, target in ((yes, entering), (no, None)):
                    if not part:
                        continue
                    q = p.bind(subject, part) if subject and p.get(subject) is not None else p
                    if target is None:
                        rest.append((q, part))
                        continue
                    if about:
                        q = q.emit(Event(EventKind.CHECK, frame.func.path, frame.body.line(case), frame.func.qualname, "T"))
                    if isinstance(case.pattern, cst.MatchAs) and case.pattern.name is not None:
                        q = q.bind(case.pattern.name.value, part)
                    if case.guard is not None:
                        rest.append((q, part))  # a guard can fail: the next cases still see the value
                        guarded = [g for g, truth, _ in self.branch(case.guard, q, frame) if truth]
                        target.extend(guarded)
                    else:
                        target.append(q)
            if entering:
                out.extend(self.run_block(case.body.body, merge(entering), frame))
            pending = _merge_pairs(rest)
        out.extend(p for p, _ in pending)  # no case matched: falls through
        return merge(out)

    def pattern_values(self, pattern: cst.MatchPattern, frame: Frame) -> Val | None:
        """The values a pattern matches: a set of tokens, the universe for `_`/a capture, or None."""
        if isinstance(pattern, cst.MatchAs):
            return self.c.domain.universe if pattern.pattern is None else self.pattern_values(pattern.pattern, frame)
        if isinstance(pattern, cst.MatchValue):
            return self.constant(pattern.value, frame)
        if isinstance(pattern, cst.MatchSingleton):
            return self.constant(pattern.value, frame)
        if isinstance(pattern, cst.MatchOr):
            return union_of(self.pattern_values(e.pattern, frame) for e in pattern.patterns)
        return None

    def loop(self, node: cst.For | cst.While, paths: list[PathState], frame: Frame) -> list[PathState]:
        """A nested loop runs its body zero or one time (enough for what a path can do)."""
        entered: list[PathState] = []
        if isinstance(node, cst.For):
            for evaluated in _by_state(paths, lambda path: self.eval(node.iter, path, frame), _moved_pair):
                for p, _ in evaluated:
                    entered.append(self.assign(node.target, self.c.domain.universe, p, frame))
            skipped = list(entered)
        else:
            skipped = []
            for decided in _by_state(paths, lambda path: self.decide(node.test, path, frame), _moved_decision):
                for p, truth, _ in decided:
                    (entered if truth else skipped).append(p)
        body_out = self.run_block(node.body.body, merge(entered), frame) if entered else []
        after = []
        for p in body_out:
            if p.term in ("continue", None):
                after.append(p.ending(None))
            elif p.term == "break":
                after.append(p.ending(None))
            else:
                after.append(p)
        normal = merge(skipped + [p for p in after])
        if node.orelse is not None:
            # The else clause runs when the loop was not broken; approximate with every normal exit.
            normal = self.run_block(node.orelse.body.body, normal, frame)
        return normal

    def try_stmt(self, node: cst.Try | cst.TryStar, paths: list[PathState], frame: Frame) -> list[PathState]:
        """`try` and `try/except*` (one handler or several can run: either way, each handler runs
        after what can raise)."""
        body_out = self.run_block(node.body.body, paths, frame)
        out: list[PathState] = []
        if node.handlers:
            # A handler can run after an explicit raise, or after any call in the body failed:
            # approximate the latter by the body's normal exits (effects included).
            into_handler = [p.ending(None) for p in body_out if p.term in ("raise", None)]
            for handler in node.handlers:
                out.extend(self.run_block(handler.body.body, merge(into_handler), frame))
        normal = [p for p in body_out if p.term is None]
        other = [p for p in body_out if p.term not in (None, "raise")]
        if node.orelse is not None:
            normal = self.run_block(node.orelse.body.body, normal, frame)
        raised = [] if node.handlers else [p for p in body_out if p.term == "raise"]
        out = merge(out + normal + other + raised)
        if node.finalbody is not None:
            held = [(p, p.term) for p in out]
            finished = []
            for p, term in held:
                for q in self.run_block(node.finalbody.body.body, [p.ending(None)], frame):
                    finished.append(q if q.term is not None else q.ending(term))
            out = merge(finished)
        return out

    # --- expressions -----------------------------------------------------------------------

    def eval_all(self, nodes: list[cst.CSTNode], path: PathState, frame: Frame) -> list[tuple[PathState, list[Val]]]:
        states: list[tuple[PathState, list[Val]]] = [(path, [])]
        for node in nodes:
            nxt = []
            for p, values in states:
                if p.term is not None:
                    nxt.append((p, values + [EMPTY]))
                    continue
                for q, v in self.eval(node, p, frame):
                    nxt.append((q, values + [v]))
            states = nxt
        return states

    def eval(self, node: cst.CSTNode, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        """Every (path, value) of an expression; its kind's method is found by the node's class."""
        handler = _EXPRESSION_HANDLERS.get(type(node))
        if handler is None:
            # Anything else (lambdas, comprehensions, arithmetic...): evaluate calls inside for effects.
            return self.eval_children_for_effects(node, path, frame)
        return handler(self, node, path, frame)

    def eval_name(self, node: cst.Name, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        if node.value == "None":
            return [(path, frozenset({NONE}))]
        if node.value in ("True", "False"):
            return [(path, frozenset({node.value}))]
        value = path.get(node.value)
        if value is None:
            value = self.constant(node, frame) if node.value not in self.local_names(frame) else None
        return [(path, value if value is not None else self.c.domain.universe)]

    def eval_attribute(self, node: cst.Attribute, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        d = self.c.domain
        const = self.constant(node)
        if const is not None:
            return [(path, const)]
        key = fact_key(node, frame)
        if isinstance(key, FactKey):
            known = path.attr(key)
            if known is not None:
                return [(path, known)]
        method = self.method_value(node, frame)
        if method is not None:
            return [(path, method)]
        if frame.is_self_attr(node):
            key = frame.prefix + node.attr.value
            read = self.read_self_attr(node, path, frame)
            value = self.self_attr_value(key, path)
            if self.c.all_facts and frame.prefix == "" and path.attr(key) is None and value != d.universe \
                    and len(value - MARKERS) > 1:
                # A sender starts from one configuration: the first read of an attribute
                # fixes which of its assigned values it holds, for every later call too.
                marks = value & MARKERS
                return [(read.set_attr(key, frozenset({token}) | marks), frozenset({token}) | marks)
                        for token in sorted(value - MARKERS)]
            return [(read, value)]
        return [(p, d.universe) for p, _ in self.eval(node.value, path, frame)]

    def eval_integer(self, node: cst.Integer, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        const = self.constant(node)
        return [(path, const if const is not None else frozenset({OTHER}))]

    def eval_call(self, node: cst.Call, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        return self.call(node, path, frame)

    def eval_subscript(self, node: cst.Subscript, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        if self.c.effects.keyed(self, node.value, frame):
            return self.c.effects.on_key_read(self, node, path, frame)
        d = self.c.domain
        out = []
        element = node.slice[0].slice if len(node.slice) == 1 else None
        index = element if isinstance(element, cst.Index) else None
        position = int(index.value.value) if index is not None and isinstance(index.value, cst.Integer) \
            and index.value.value.isdigit() else None
        for p, container in self.eval(node.value, path, frame):
            value = d.universe
            if POLLS in container and self.c.state is not None:
                value = self.poll_value()
            elif position is not None and (item := item_of(container, position)) is not None:
                value = item  # `f()[0]` of a tuple kvtrace built
            out.append((p, value))
        return out

    def eval_binary(self, node: cst.BinaryOperation, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        out = []
        for p, (left, right) in self.eval_all([node.left, node.right], path, frame):
            out.append((p, frozenset({NOW}) if NOW in left or NOW in right else self.c.domain.universe))
        return _merge_pairs(out)

    def eval_test(self, node: cst.BaseExpression, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        """A comparison, `and`/`or`, `not`: True or False on each path the condition splits into."""
        out = []
        for p, truth, _ in self.branch(node, path, frame):
            out.append((p, frozenset({TRUE if truth else FALSE})))
        return _merge_pairs(out)

    def eval_unary(self, node: cst.UnaryOperation, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        if isinstance(node.operator, cst.Not):
            return self.eval_test(node, path, frame)
        return self.eval_children_for_effects(node, path, frame)

    def eval_sequence(self, node: cst.Tuple | cst.List | cst.Set, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        out = []
        # A tuple is the union of its elements (for `in`), plus each element by position
        # (`return KVPoll.Failed, reason` unpacked by `status, _ = f()`).
        ordered = isinstance(node, cst.Tuple) and len(node.elements) <= MAX_TUPLE \
            and not any(isinstance(e, cst.StarredElement) for e in node.elements)
        for p, values in self.eval_all([e.value for e in node.elements], path, frame):
            value = frozenset().union(*values) if values else EMPTY
            if ordered:
                value |= {f"{ITEM}{i}:{t}" for i, v in enumerate(values) for t in v if not t.startswith(ITEM)}
            out.append((p, value))
        return out

    def eval_await(self, node: cst.Await, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        return self.eval(node.expression, path, frame)

    def eval_ifexp(self, node: cst.IfExp, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        out = []
        for p, truth, _ in self.decide(node.test, path, frame):
            out.extend(self.eval(node.body if truth else node.orelse, p, frame))
        return out

    def eval_text(self, node: cst.BaseExpression, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        """A string or float literal: a value that is none of the tracked ones."""
        return [(path, frozenset({OTHER}))]

    def eval_children_for_effects(self, node: cst.CSTNode, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        if isinstance(node, (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            return [(path, self.c.domain.universe)]
        children = [c for c in node.children if isinstance(c, cst.BaseExpression)]
        paths = [(path, self.c.domain.universe)]
        for child in children:
            nxt = []
            for p, _ in paths:
                for q, _ in self.eval(child, p, frame):
                    nxt.append((q, self.c.domain.universe))
            paths = _merge_pairs(nxt)
        return paths

    def constant(self, node: cst.CSTNode, frame: Frame | None = None) -> Val | None:
        """The exact set of values of a constant expression (members, None, literals), else None."""
        handler = _CONSTANT_HANDLERS.get(type(node))
        return handler(self, node, frame) if handler is not None else None

    def constant_attribute(self, node: cst.Attribute, frame: Frame | None) -> Val | None:
        d = self.c.domain
        if isinstance(node.value, cst.Name) and node.value.value == d.enum and node.attr.value in d.members:
            return frozenset({node.attr.value})
        if dotted(node).endswith(f"{d.enum}.{node.attr.value}") and node.attr.value in d.members:
            return frozenset({node.attr.value})
        return None

    def constant_name(self, node: cst.Name, frame: Frame | None) -> Val | None:
        if node.value == "None":
            return frozenset({NONE})
        if node.value in ("True", "False"):
            return frozenset({node.value})
        if frame is not None and node.value not in self.local_names(frame):
            return self.module_constant(node.value, frame)
        return None

    def constant_integer(self, node: cst.Integer, frame: Frame | None) -> Val | None:
        try:
            member = self.c.domain.member_for_int(int(node.evaluated_value))
        except ValueError:
            member = None
        return frozenset({member, INT}) if member else frozenset({OTHER})

    def constant_unary(self, node: cst.UnaryOperation, frame: Frame | None) -> Val | None:
        if isinstance(node.operator, cst.Minus) and isinstance(node.expression, cst.Integer):
            return frozenset({OTHER})
        return None

    def constant_sequence(self, node: cst.Tuple | cst.List | cst.Set, frame: Frame | None) -> Val | None:
        if any(isinstance(e, cst.StarredElement) for e in node.elements):
            return None
        return union_of(self.constant(e.value, frame) for e in node.elements)

    def constant_text(self, node: cst.SimpleString | cst.Float, frame: Frame | None) -> Val | None:
        return frozenset({OTHER})

    def local_names(self, frame: Frame) -> set[str]:
        """Names the function binds itself (parameters and assignments): never module constants."""
        return self.c.index.local_names(frame.func)

    def module_constant(self, name: str, frame: Frame) -> Val | None:
        value = self.c.index.module_constant(name, frame.func.path)
        if value is None:
            return None
        return ast_constant(value, self.c.domain)

    def read_self_attr(self, node: cst.Attribute, path: PathState, frame: Frame) -> PathState:
        return self.c.effects.on_self_read(self, node, frame.prefix + node.attr.value, path, frame)

    def self_attr_value(self, name: str, path: PathState) -> Val:
        value = path.attr(name)
        if value is not None:
            return value
        if self.c.attr_values is not None:
            return self.c.attr_values(name)
        return self.c.domain.universe

    # --- conditions ------------------------------------------------------------------------

    def decide(self, node: cst.CSTNode, path: PathState, frame: Frame) -> list[tuple[PathState, bool, bool]]:
        """`branch`, and in sender mode the world holds still: a test kvtrace cannot decide
        (a transfer handle's state, a flag of another object) answers the same when poll()
        runs again after abort(). Timeout comparisons are not frozen: the clock moves."""
        results = self.branch(node, path, frame)
        if not self.c.all_facts:
            return results
        live = [r for r in results if r[0].term is None]
        if len({t for _, t, _ in live}) < 2:
            return results
        if any(e.kind == EventKind.TIMEOUT for r in live for e in r[0].events[len(path.events):]):
            return results
        key = FactKey(f"if:{frame.func.path}:{frame.body.line(node)}", "branch")
        known = path.attr(key)
        if known is not None:
            return [r for r in results if r[0].term is not None or (TRUE in known) == r[1]]
        return [(p.set_attr(key, frozenset({TRUE if t else FALSE})) if p.term is None else p, t, a) for p, t, a in results]

    def branch(self, node: cst.CSTNode, path: PathState, frame: Frame) -> list[tuple[PathState, bool, bool]]:
        """Every feasible (path, truth, decided-by-the-poll-value) for condition `node`."""
        d = self.c.domain
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            return [(p, not t, a) for p, t, a in self.branch(node.expression, path, frame)]
        if isinstance(node, cst.BooleanOperation):
            is_and = isinstance(node.operator, cst.And)
            out = []
            for p, t, a in self.branch(node.left, path, frame):
                if t != is_and:  # short-circuit: `False and ...`, `True or ...`
                    out.append((p, t, a))
                else:
                    out.extend((q, t2, a or a2) for q, t2, a2 in self.branch(node.right, p, frame))
            return out
        if isinstance(node, cst.Comparison):
            return self.compare(node, path, frame)
        # Truthiness of a value.
        out = []
        for p, value in self.eval(node, path, frame):
            if p.term is not None:
                out.append((p, False, False))
                continue
            target = node.value if isinstance(node, cst.Name) else None
            about = bool(d.states(value)) and self._is_state_valued(value) and target not in self.c.guards
            key = fact_key(node, frame)
            marks = value & MARKERS
            yes, no = value & d.truthy(), value & d.falsy()
            if not value - {TRUE, FALSE, NONE} and value:  # a plain bool/None: exact
                yes, no = value & {TRUE}, value & {FALSE, NONE}
            elif key is not None and value == d.universe and self.keeps_fact(node, frame):
                # An unknown attribute tested once on a path reads the same the next time
                # (OTHER, which is both truthy and falsy, is dropped so the split is exact).
                yes, no = d.truthy() - {OTHER}, d.falsy() - {OTHER}
            for truth, part in ((True, yes), (False, no)):
                if part:
                    part = part | marks
                    q = p.bind(target, part) if target and p.get(target) is not None else p
                    if key is not None and target is None and self.keeps_fact(node, frame):
                        q = q.set_attr(key, part)
                    out.append((q, truth, about and part != value))
        return out

    def _is_state_valued(self, value: Val) -> bool:
        """A value that holds enum members because it is the poll value or a copy of it (a
        poll(), the status table, a `KVPoll.X`), not one that merely could be an int equal to
        a member: an unknown (the universe, or what is left of it after `is None`: it keeps
        OTHER) or a number written in the code (INT)."""
        return value != self.c.domain.universe and OTHER not in value and INT not in value

    def compare(self, node: cst.Comparison, path: PathState, frame: Frame) -> list[tuple[PathState, bool, bool]]:
        if len(node.comparisons) > 1:
            # a < b < c  ==  a < b and b < c ; decide pairwise, unknown when not about tracked values.
            first = node.comparisons[0]
            first_pair = cst.Comparison(left=node.left, comparisons=[first])
            rest = cst.Comparison(left=first.comparator, comparisons=list(node.comparisons[1:]))
            out: list[tuple[PathState, bool, bool]] = []
            for p, t, a in self.compare(first_pair, path, frame):
                if not t:
                    out.append((p, t, a))
                else:
                    out.extend((q, t2, a or a2) for q, t2, a2 in self.compare(rest, p, frame))
            return out
        comparison = node.comparisons[0]
        op = _op(comparison.operator)
        d = self.c.domain
        if op in ("<", "<=", ">", ">="):
            return self.order_compare(node, op, path, frame)
        known = self.known_membership(node, op, path, frame)
        if known is not None:
            return known
        out = []
        for p, values in self.eval_all([node.left, comparison.comparator], path, frame):
            if p.term is not None:
                out.append((p, False, False))
                continue
            left, right = values
            if op not in ("==", "!=", "is", "is not", "in", "not in"):
                out.extend([(p, True, False), (p, False, False)])
                continue

            left_const = self.constant(node.left, frame)
            right_const = self.constant(comparison.comparator, frame)
            if op in ("in", "not in"):
                if right_const is None:
                    out.extend(self.undecided(node, op, p, frame))
                    continue
                tracked, tracked_node, constants = left, node.left, right_const
            elif right_const is not None:
                tracked, tracked_node, constants = left, node.left, right_const
            elif left_const is not None:
                tracked, tracked_node, constants = right, comparison.comparator, left_const
            else:
                out.extend(self.undecided(node, op, p, frame))
                continue
            if OTHER in constants:  # compared with something we cannot name: either way
                out.extend(self.undecided(node, op, p, frame))
                continue
            yes, no = refine(op, tracked, constants)
            # A mode parameter of the drain is not the poll value, whatever it may hold.
            about = bool(d.states(tracked)) and self._is_state_valued(tracked) and not (
                isinstance(tracked_node, cst.Name) and tracked_node.value in self.c.guards)
            name = tracked_node.value if isinstance(tracked_node, cst.Name) else None
            for truth, part in ((True, yes), (False, no)):
                if not part:
                    continue
                q = p
                key = fact_key(tracked_node, frame)
                if name is not None and p.get(name) is not None:
                    q = p.bind(name, part)
                elif key is not None and (frame.is_self_attr(tracked_node) or self.keeps_fact(tracked_node, frame)):
                    q = p.set_attr(key, part)
                out.append((q, truth, about and (not yes or not no or self.c.state is not None)))
        return out

    def known_membership(self, node: cst.Comparison, op: str, path: PathState, frame: Frame,
                         ) -> list[tuple[PathState, bool, bool]] | None:
        """`x in C` (or `not in`) where the domain knows C (Effects.on_membership); None: it does not."""
        if op not in ("in", "not in"):
            return None
        return self.c.effects.on_membership(self, node, op == "in", path, frame)

    def undecided(self, node: cst.Comparison, op: str, path: PathState, frame: Frame) -> list[tuple[PathState, bool, bool]]:
        """A comparison kvtrace cannot decide goes both ways; but when it has no side effect,
        its answer is remembered on the path (as the positive form: `in`, `==`, `is`), so the
        same comparison, or its negation, later on the path answers the same (`if req.rid not in
        rids_to_check: keep` then `if req.rid in rids_to_check: ...`)."""
        key = self.comparison_key(node, op, frame)
        if key is None:
            return [(path, True, False), (path, False, False)]
        negated = op in ("!=", "is not", "not in")
        known = path.attr(key)
        if known is not None:
            return [(path, (TRUE in known) != negated, False)]
        return [(path.set_attr(key, frozenset({TRUE if truth != negated else FALSE})), truth, False) for truth in (True, False)]

    def comparison_key(self, node: cst.Comparison, op: str, frame: Frame) -> str | None:
        cached = self._comparison_keys.get((id(node), frame.prefix))
        if cached is not None and cached[0] is node:
            return cached[1]
        key = None
        if not any(isinstance(n, (cst.Call, cst.Await, cst.Yield, cst.NamedExpr, cst.Lambda)) for n in cst_descendants(node)) \
                and (self.keeps_fact(node.left, frame) or self.keeps_fact(node.comparisons[0].comparator, frame)):
            # (A comparison tested once in the function: nothing would read the fact again.)
            left, right = code(node.left), code(node.comparisons[0].comparator)
            family = {"!=": "==", "is not": "is", "not in": "in"}.get(op, op)
            key = comparison_fact(f"{frame.prefix}{left} {family} {right}", (left, right))
        self._comparison_keys[(id(node), frame.prefix)] = (node, key)
        return key

    def order_compare(self, node: cst.Comparison, op: str, path: PathState, frame: Frame,
                      ) -> list[tuple[PathState, bool, bool]]:
        """`<`, `<=`, `>`, `>=`: a timeout check when exactly one side grows with the clock.
        It goes both ways, except with the clock past every deadline (`clock_far`)."""
        comparison = node.comparisons[0]
        out: list[tuple[PathState, bool, bool]] = []
        for p, (left, right) in self.eval_all([node.left, comparison.comparator], path, frame):
            if p.term is not None:
                out.append((p, False, False))
                continue
            if (NOW in left) != (NOW in right):
                p = p.emit(Event(EventKind.TIMEOUT, frame.func.path, frame.body.line(node), frame.func.qualname, code(node)))
                if self.c.clock_far:
                    out.append((p, (op in (">", ">=")) == (NOW in left), False))
                    continue
            out.extend([(p, True, False), (p, False, False)])
        return out

    # --- calls -----------------------------------------------------------------------------

    def call(self, node: cst.Call, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        callee = dotted(node.func)
        fn = frame.func.qualname
        here = frame.func.path
        # The receiver first (`self.sender().poll()`, `self.conclude_state.name`), then the arguments.
        receivers = [(path, EMPTY)]
        if isinstance(node.func, cst.Attribute) and not isinstance(node.func.value, cst.Name):
            receivers = self.eval(node.func.value, path, frame)
        keyed_method = node.func.attr.value if isinstance(node.func, cst.Attribute) \
            and self.c.effects.keyed(self, node.func.value, frame) else None
        if keyed_method is not None:
            receivers = [(path, EMPTY)]
        results: list[tuple[PathState, Val]] = []
        for start, _ in receivers:
            for p, values in self.eval_all([a.value for a in node.args], start, frame):
                if p.term is not None:
                    results.append((p, EMPTY))
                elif keyed_method is not None:
                    results.extend(self.c.effects.on_key_method(self, node, keyed_method, values, p, frame))
                else:
                    results.extend(self.call_with(node, callee, values, p, frame, fn, here))
        return _merge_pairs(results)

    def call_with(self, node: cst.Call, callee: str, values: list[Val], p: PathState, frame: Frame,
                  fn: str, here: str) -> list[tuple[PathState, Val]]:
        d = self.c.domain
        site = CallSite(node, callee, values, frame)
        effect = self.c.effects.on_call(self, site, p)
        if effect is not None:
            return effect
        if callee == "bool" and len(values) == 1 and not node.args[0].star:
            value = values[0]
            exact = value and not value - {TRUE, FALSE, NONE}
            truths = {TRUE} if exact and TRUE in value else set()
            truths |= {FALSE} if exact and value & {FALSE, NONE} else set()
            if not exact:
                truths = ({TRUE} if value & d.truthy() else set()) | ({FALSE} if value & d.falsy() else set())
            return [(p, frozenset(truths))]
        if callee in ("max", "min") and len(values) >= 2 and not any(a.star for a in node.args):
            return [(p, self.extreme(callee, values))]
        if callee == "isinstance" and len(node.args) == 2 and self.known_instance(node, p, frame):
            return [(p, frozenset({TRUE}))]
        target = self.resolve_call(node, callee, frame, p)
        companion = self.c.companion
        if target is not None and target.prefix == COMPANION and frame.prefix == "" and companion is not None \
                and companion.given is not None and not any(companion.given in v for v in values):
            target = None  # not handed what the companion is entered for: its value is unknown
        if target is None:
            return self.opaque_call(node, callee, self.c.effects.on_unresolved_call(self, site, p), frame)
        args = self.bind_args(target.func, node, values, target.drop_first)
        p = p.emit(site.event(EventKind.HELPER, target.func.qualname))
        self_name = target.self_name
        if target.self_param is not None:
            params = [a.arg for a in target.func.node.args.posonlyargs + target.func.node.args.args]
            self_name = params[target.self_param] if target.self_param < len(params) else "self"
        return self.call_function(target.func, target.cls, args, p, target.prefix, self_name)

    def known_instance(self, node: cst.Call, path: PathState, frame: Frame) -> bool:
        """`isinstance(x.a, C)` where the path stored `C(...)` in `x.a` (an instance fact) and
        both `C`s come from one place: true. Else not known (the call goes on as before)."""
        held = dotted(node.args[0].value)
        if not held or "(" in held:
            return False
        stored = path.attr(instance_fact(held))
        kinds = node.args[1].value
        names = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
        return stored is not None and any(
            isinstance(n, cst.Name) and any(same_origin(origin, self.c.index.origin(frame.func, n.value)) for origin in stored)
            for n in names)

    def resolve_call(self, node: cst.Call, callee: str, frame: Frame, path: PathState) -> "CallTarget | None":
        """What a call runs, and on which object: `self.m()`, `super().m()`, `Base.m(self)`,
        a module function (given `self`: it then works on the same object)."""
        func, cls = self.resolve(callee, frame)
        companion = self.c.companion
        if func is not None and frame.prefix == COMPANION and companion is not None and not companion.enters(func):
            return None
        parts = callee.split(".")
        held = path.get(callee) if callee and "." not in callee else None
        if func is None and held is not None and len(held) == 1 and next(iter(held)).startswith(METHOD):
            prefix, _, name = next(iter(held))[len(METHOD):].partition("|")
            owner = (companion.cls if companion is not None else None) if prefix == COMPANION else frame.cls
            found = self.c.index.find_method(owner, name) if owner is not None else None
            if found is not None and prefix == COMPANION and companion is not None and not companion.enters(found):
                return None  # as when called through the attribute: not worth entering, its value unknown
            if found is not None:
                return CallTarget(found, owner, prefix, "self")
        if func is None and companion is not None and frame.prefix == "" and len(parts) == 2 \
                and parts[0] in self.companion_aliases(frame):
            parts = [frame.self_name, next(iter(companion.attrs)), parts[1]]
        if func is None and companion is not None and frame.prefix == "" and len(parts) == 3 \
                and parts[0] == frame.self_name and companion.holds(parts[1]):
            # `self.<attr>.<method>(...)`: the companion's method, on the companion object.
            found = self.c.index.find_method(companion.cls, parts[2])
            if found is not None and companion.enters(found):
                return CallTarget(found, companion.cls, COMPANION, "self")
            if found is not None:
                return None  # a method not worth entering (Companion.enterable): its value is unknown
        if func is not None:
            if cls is None:  # a module function: does it get our object?
                at = next((i for i, a in enumerate(node.args) if frame.is_self(a.value) and not a.star), None)
                if at is not None:
                    return CallTarget(func, frame.cls, frame.prefix, "self", self_param=at)
            return CallTarget(func, cls, frame.prefix if cls is not None else "", frame.self_name if cls is not None else "self")
        if len(parts) == 2 and node.args and frame.is_self(node.args[0].value) and frame.cls is not None:
            base = self.c.index.resolve_class(parts[0], near=frame.func.path)
            if base is not None:  # `Base.abort(self)`: Base's method (or its bases'), on our object
                found = self.c.index.find_method(base, parts[1])
                if found is not None:
                    return CallTarget(found, frame.cls, frame.prefix, frame.self_name, drop_first=True)
        return None

    def companion_aliases(self, frame: Frame) -> set[str]:
        """Local names the function stores into an attribute that holds the companion
        (`self.kv_mgr = mgr`): the same object, so `mgr.update_status(...)` is its method."""
        attrs = self.c.companion.attrs if self.c.companion is not None else frozenset()
        key = ("companion aliases", id(frame.func.node), frame.self_name, attrs)
        cached = self.c.index.derived.get(key)
        if cached is None:
            cached = set()
            for n in self.c.index.nodes_in(frame.func, (ast.Assign,)):
                if isinstance(n.value, ast.Name) and any(
                        isinstance(t, ast.Attribute) and t.attr in attrs and isinstance(t.value, ast.Name)
                        and t.value.id == frame.self_name for t in n.targets):
                    cached.add(n.value.id)
            self.c.index.derived[key] = cached
        return cached

    def opaque_call(self, node: cst.Call, callee: str, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        """A call kvtrace cannot enter. In sender mode, a method of an object behind the sender
        that no analysed class defines (`self.kv_mgr.check_status(...)` with no companion found)
        answers some fixed value, the same on every later call: each member (or something else)
        on its own path. Elsewhere, and when the value is thrown away, it is simply unknown."""
        d = self.c.domain
        parts = callee.split(".")
        if not self.c.all_facts or node is self._discarded or len(parts) != 3 or parts[0] != frame.self_name \
                or frame.prefix != "" or (self.c.companion is not None and self.c.companion.holds(parts[1])):
            return [(path, d.universe)]
        key = FactKey("()" + ".".join(parts[1:]), "call")
        known = path.attr(key)
        if known is not None:
            return [(path, known)]
        return [(path.set_attr(key, frozenset({token})), frozenset({token})) for token in d.members + (OTHER,)]

    def keeps_fact(self, node: cst.CSTNode, frame: Frame) -> bool:
        """Remember what a test found only where it can be asked again: always for a sender
        (poll() runs again after abort()), else when the function tests the chain twice. A fact
        nobody reads again would only keep equal paths from merging."""
        if self.c.all_facts:
            return True
        # The chain's own text: `(req.flag)` in `a and (req.flag)` is the same chain as `req.flag`.
        text = (dotted(node) if isinstance(node, cst.Attribute) else None) or code(node)
        cache = self._fact_cache
        key = (id(frame.func.node), text)
        if key not in cache:
            func = frame.func
            source = "\n".join(func.module.lines[func.node.lineno - 1: func.node.end_lineno])
            cache[key] = source.count(text) > 1
        return cache[key]

    def method_value(self, node: cst.Attribute, frame: Frame) -> Val | None:
        """A bound method used as a value (`self._poll_with(self.kv_mgr.check_status)`): a token
        that a later call of the name holding it resolves."""
        parts = dotted(node).split(".")
        if len(parts) == 2 and parts[0] == frame.self_name and frame.cls is not None \
                and self.c.index.find_method(frame.cls, parts[1]) is not None:
            return frozenset({f"{METHOD}{frame.prefix}|{parts[1]}"})
        companion = self.c.companion
        if len(parts) == 3 and parts[0] == frame.self_name and frame.prefix == "" and companion is not None \
                and companion.holds(parts[1]) and self.c.index.find_method(companion.cls, parts[2]) is not None:
            return frozenset({f"{METHOD}{COMPANION}|{parts[2]}"})
        return None

    def extreme(self, which: str, values: list[Val]) -> Val:
        """max()/min() of enum members by their int values (update_status's `max(old, new)`)."""
        d = self.c.domain
        number = {m: v for m, v in zip(d.members, d.values) if v is not None}
        values = [v - MARKERS for v in values]  # `max(status, 0)`: the number is the member's value
        if not all(v and v <= set(number) for v in values):
            return d.universe
        pick = max if which == "max" else min
        results: set[str] = set()
        for combo in _product(values):
            results.add(pick(combo, key=number.__getitem__))
        return frozenset(results)

    def resolve(self, callee: str, frame: Frame) -> tuple[FuncRef | None, ClassInfo | None]:
        index = self.c.index
        me = frame.self_name + "."
        if callee.startswith(me) and callee.count(".") == 1 and frame.cls is not None:
            found = index.find_method(frame.cls, callee[len(me):])
            return found, frame.cls
        if callee.startswith("super().") and callee.count(".") == 1 and frame.func.owner is not None and frame.cls is not None:
            mro = index.mro(frame.cls)
            owner = frame.func.owner
            after = mro[next((i for i, c in enumerate(mro) if c is owner), len(mro)) + 1:]
            for c in after:
                if callee[8:] in c.methods:
                    return c.methods[callee[8:]], frame.cls
            return None, None
        if callee and "." not in callee:
            return index.resolve_function(callee, frame.func.path), None
        return None, None

    def bind_args(self, target: FuncRef, node: cst.Call, values: list[Val], drop_first: bool = False) -> dict[str, Val]:
        params = [a.arg for a in target.node.args.posonlyargs + target.node.args.args]
        if target.owner is not None and params and not _is_static(target):
            params = params[1:]
        args = list(node.args)
        if drop_first:  # `Base.m(self, ...)`: `self` fills the parameter dropped above
            args, values = args[1:], values[1:]
        universe = self.c.domain.universe
        bound: dict[str, Val] = {p: universe for p in params}
        bound.update({a.arg: universe for a in target.node.args.kwonlyargs})
        positional = 0
        for arg, value in zip(args, values):
            if arg.star:
                continue
            if arg.keyword is not None:
                bound[arg.keyword.value] = value
            elif positional < len(params):
                bound[params[positional]] = value
                positional += 1
        return bound


def union_of(parts: Iterable[Val | None]) -> Val | None:
    """The union of the parts' values; None (not constant) as soon as one part is."""
    found: set[str] = set()
    for part in parts:
        if part is None:
            return None
        found |= part
    return frozenset(found)


def ast_constant(value: ast.expr, domain: Domain) -> Val | None:
    """Tokens of an `ast` constant: a member (`KVPoll.X`), an int, None/bools, or a tuple/list/set
    of those; None when the expression is not constant."""
    if isinstance(value, ast.Constant):
        if value.value is None:
            return frozenset({NONE})
        if isinstance(value.value, bool):
            return frozenset({str(value.value)})
        if isinstance(value.value, int):
            member = domain.member_for_int(value.value)
            return frozenset({member, INT}) if member else frozenset({OTHER})
        return frozenset({OTHER})
    named = enum_member(value, domain.enum)
    if named is not None and named in domain.members:
        return frozenset({named})
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return union_of(ast_constant(e, domain) for e in value.elts)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("frozenset", "set", "tuple", "list") \
            and len(value.args) == 1:
        return ast_constant(value.args[0], domain)
    return None


ITEM = "@item"  # value token "@item<i>:<token>": element i of a tuple holds <token>
MAX_TUPLE = 4  # positions tracked for tuples up to this size


def item_of(value: Val, position: int) -> Val | None:
    """Element `position` of a tuple value, if the value says (None: not a tuple kvtrace built)."""
    head = f"{ITEM}{position}:"
    found = frozenset(t[len(head):] for t in value if t.startswith(head))
    return found or None


def function_body(node: cst.FunctionDef) -> list[cst.CSTNode]:
    body = node.body
    if isinstance(body, cst.IndentedBlock):
        return list(body.body)
    return [body]  # `def f(): return x` on one line


def _op(operator: cst.CSTNode) -> str:
    return {
        cst.Equal: "==", cst.NotEqual: "!=", cst.Is: "is", cst.IsNot: "is not", cst.In: "in",
        cst.NotIn: "not in", cst.LessThan: "<", cst.LessThanEqual: "<=", cst.GreaterThan: ">",
        cst.GreaterThanEqual: ">=",
    }.get(type(operator), "?")


# Facts: what a test found on this path (an unknown attribute chain's truth, a comparison
# kvtrace cannot decide, an opaque call's answer), kept in PathState.attrs under a FactKey so
# that a second test agrees with the first until something it reads is assigned.
FACT = "?"  # the text of every fact key starts with it (object attributes' keys never do)

Dependency = tuple[str, str]  # ("local", name) | ("attr", prefix + name) | ("word", word)


class FactKey(str):
    """A fact's key: its text (the identity under which paths hash, sort and merge, as before
    facts had a type) and what it reads. `kind`: "chain" (a local's attribute chain, `req.a`),
    "self-chain" (`self.x.y`), "comparison", "branch" (a sender test frozen by line), "call"
    (an opaque call's answer). `reads`: the assignments that make it stale (mypy's binder:
    assigning X forgets every key that depends on X). `sides`: the chains a test must contain
    to read the fact again (a comparison's sides, a self-chain's chain after the object)."""

    kind: str
    reads: frozenset[Dependency]
    sides: tuple[str, ...]

    def __new__(cls, text: str, kind: str, reads: frozenset[Dependency] = frozenset(),
                sides: tuple[str, ...] = ()) -> "FactKey":
        made = super().__new__(cls, FACT + text)
        made.kind, made.reads, made.sides = kind, reads, sides
        return made

    def __reduce__(self) -> tuple:
        return (_fact_key_of, (str(self)[len(FACT):], self.kind, self.reads, self.sides))

    @property
    def chain(self) -> str:
        """A "chain" fact's attribute chain (`req.a`)."""
        return self[len(FACT_LOCAL):]


def _fact_key_of(text: str, kind: str, reads: frozenset[Dependency], sides: tuple[str, ...] = ()) -> FactKey:
    return FactKey(text, kind, reads, sides)


FACT_LOCAL = FACT + ":"  # the text of a "chain" fact: "?:<chain>"


def chain_fact(chain: str) -> FactKey:
    return FactKey(":" + chain, "chain", frozenset({("local", chain.partition(".")[0])}))


def instance_fact(chain: str) -> FactKey:
    """What class of object the path stored in attribute chain `chain` (`req.finished_reason`),
    as the origin of the class called (Index.origin). Assigning the chain's root or any
    attribute of its last name forgets it."""
    root, _, rest = chain.partition(".")
    return FactKey("new:" + chain, "instance", frozenset({("local", root), ("field", rest.rpartition(".")[2] or root)}),
                   (chain,))


def comparison_fact(text: str, sides: tuple[str, ...] = ()) -> FactKey:
    """A remembered comparison, "?cmp:<prefix><left> <in|==|is> <right>". It reads every word
    of its text (names and attributes, and words inside its literals: conservative)."""
    return FactKey("cmp:" + text, "comparison", frozenset(("word", w) for w in re.findall(r"\w+", text)), sides)


def fact_key(node: cst.CSTNode, frame: Frame) -> str | None:
    """The attrs key of an attribute chain without calls: `prefix+X` for `self.X` (the object's
    attribute itself), a fact key for deeper chains and chains rooted at a local name; None for
    anything else."""
    if not isinstance(node, cst.Attribute):
        return None
    return _chain_key(node, frame.self_name, frame.prefix)


@lru_cache(maxsize=8192)
def _chain_key(node: cst.Attribute, self_name: str, prefix: str) -> str | None:
    # Keyed by the node's identity (kept alive by the cache, so its id is never reused).
    text = dotted(node)
    if not text or "(" in text:
        return None
    root, _, rest = text.partition(".")
    if root == self_name:
        if "." not in rest:
            return prefix + rest
        return FactKey(prefix + rest, "self-chain", frozenset({("attr", prefix + rest.partition(".")[0])}),
                       (rest,) if not prefix else ())
    return chain_fact(text)


def forget(path: PathState, stale: set[Dependency]) -> PathState:
    """The path without the facts that read any of `stale` (something they read was assigned)."""
    attrs = path.attrs
    if not any(isinstance(k, FactKey) and k.reads & stale for k, _ in attrs):
        return path
    kept = tuple(b for b in attrs if not (isinstance(b[0], FactKey) and b[0].reads & stale))
    return _path(path.env, kept, path.events, path.term, path.ret, path)


def _product(values: list[Val]):
    import itertools
    return itertools.product(*[sorted(v) for v in values])


# Options a helper call's run can depend on (the state's value is handled apart; the index is
# the memo's owner). What a run reports (its RunLog) is replayed on a memo hit.
_OPTION_FIELDS = tuple(f.name for f in fields(Options) if f.name not in ("index", "state"))


def _key_part(value: object, alive: list, nested: bool = False) -> object:
    """A memo key's part for one option: a plain value as it is, a dataclass (the Effects, the
    Companion) by its fields, anything else (and a dataclass in those: the pack) by identity,
    kept alive in `alive`. A bound method (a sender runner's attr_values) is new on every
    access: its object counts."""
    if isinstance(value, (str, bool, int, frozenset, type(None))):
        return value
    if not nested and is_dataclass(value) and not isinstance(value, type):
        return (type(value),) + tuple(_key_part(getattr(value, f.name), alive, True) for f in fields(value))
    held = (getattr(value, "__self__", value), getattr(value, "__func__", None))
    alive.append(held)
    return tuple(map(id, held))
_OUTER = cst.Name("_")  # stands for the caller's discarded call during a callee's run


@dataclass(frozen=True)
class _CallRun:
    """A helper call's run, relative to the caller's path: each end's attrs, the events it added,
    how it ended and its value; and what the run did to the exploration besides."""

    ends: tuple[tuple[Bindings, tuple[Event, ...], str | None, Val], ...]
    truncated: tuple[str, ...]
    unparsed: tuple[str, ...]
    clears_discarded: bool
    read_state: bool
    start: Bindings  # the attrs the run started from
    touched: frozenset[str]  # the attribute keys it (or a run inside it) read or wrote
    # The touched keys' values in `start` (None: absent), so that a lookup need not scan `start`.
    touched_at_start: tuple[tuple[str, Val | None], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "touched_at_start", _values_at(self.start, self.touched))

    def serves(self, attrs: Bindings) -> bool:
        """Whether a run from `attrs` (with the same facts, see Explorer.call_function) is this
        run: every key it touched holds the same value there."""
        return all(_lookup(attrs, name) == value for name, value in self.touched_at_start)


@contextmanager
def recording_touched() -> Iterator[set[str]]:
    """The attribute keys read or written inside the block (a run, with the helper runs inside
    it), which are added to the enclosing run's when the block ends."""
    touched: set[str] = set()
    _TOUCHED.runs.append(touched)
    try:
        yield touched
    finally:
        _TOUCHED.runs.pop()
        if _TOUCHED.runs:
            _TOUCHED.runs[-1].update(touched)


def _values_at(start: Bindings, touched: frozenset[str]) -> tuple[tuple[str, Val | None], ...]:
    """Each touched key's value in `start` (None: absent), so that a lookup need not scan `start`."""
    return tuple((name, _lookup(start, name)) for name in sorted(touched))


@dataclass(frozen=True)
class StartedRun:
    """An exploration of a function from a path with attributes `start` alone, as Explorer.call_function
    shares a helper's run: it is the run from any attributes that hold the same facts
    (fact_keys) and the same value (or none) at every key it touched; its ends then carry the
    other keys as the new start holds them."""

    start: Bindings
    touched: frozenset[str]
    ends: tuple[PathState, ...]
    touched_at_start: tuple[tuple[str, Val | None], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "touched_at_start", _values_at(self.start, self.touched))

    def serves(self, held: dict[str, Val]) -> bool:
        """Whether it is the run from attributes `held` (as a dict: one start is asked of many runs)."""
        return all(held.get(name) == value for name, value in self.touched_at_start)

    def ends_from(self, attrs: Bindings) -> list[PathState]:
        rebased = _rebaser(self.start, attrs, self.touched)
        if rebased is _same:
            return list(self.ends)
        return [_path(end.env, rebased(end.attrs), end.events, end.term, end.ret, end) for end in self.ends]


def fact_keys(attrs: Bindings) -> frozenset:
    """The facts of `attrs`, without their values: what a run may drop by key alone, so runs
    that share one (a helper's _CallRun, a StartedRun) must start from the same."""
    return frozenset((k, k.kind, k.reads, k.sides) for k, _ in attrs if isinstance(k, FactKey))


def _rebaser(start: Bindings, now: Bindings, touched: frozenset[str]) -> Callable[[Bindings], Bindings]:
    """How each end of a run that started from `start` reads as the run from `now` ends: the
    keys it touched as they ended, every other key as `now` holds it (untouched, it is kept as it
    was; a fact the run dropped stays dropped)."""
    if now is start or now == start:
        return _same
    before = {key for key, _ in start}
    held = {key: (key, value) for key, value in now}
    carried = [binding for key, binding in held.items() if key not in touched and key not in before]

    def rebased(end: Bindings) -> Bindings:
        out = {}
        for key, value in end:
            if key in touched or key not in before:
                out[key] = (key, value)
            elif key in held:
                out[key] = held[key]
        for binding in carried:
            out[binding[0]] = binding
        return tuple(sorted(out.values(), key=_name_of))
    return rebased


def _same(end: Bindings) -> Bindings:
    return end


@dataclass(frozen=True)
class CallTarget:
    func: FuncRef
    cls: ClassInfo | None
    prefix: str = ""
    self_name: str = "self"
    drop_first: bool = False  # `Base.m(self)`: the first argument is the object itself
    self_param: int | None = None  # a module function given the object as this argument


def _is_static(func: FuncRef) -> bool:
    return any(getattr(d, "id", None) == "staticmethod" for d in func.node.decorator_list)


def _merge_pairs(pairs: list[tuple[PathState, Val]]) -> list[tuple[PathState, Val]]:
    return list(dict.fromkeys(pairs))


# (Explorer, node of the kind, paths or one path, frame) -> paths; each method takes its own node type.
StatementHandler = Callable[..., list[PathState]]
SmallHandler = Callable[..., list[PathState]]

# The statement kinds the explorer runs, found by the node's class (as pyflakes' getNodeHandler):
# a new kind is one entry here and one method. A kind missing from these tables is a gap at run
# time (Explorer.unmodelled) and a failing test (tests/test_engine.py checks libcst's kinds).
_STATEMENT_HANDLERS: dict[type, StatementHandler] = {
    cst.SimpleStatementLine: Explorer.simple_line,
    cst.If: Explorer.if_stmt,
    cst.For: Explorer.loop,
    cst.While: Explorer.loop,
    cst.Try: Explorer.try_stmt,
    cst.TryStar: Explorer.try_stmt,
    cst.With: Explorer.with_stmt,
    cst.Match: Explorer.match_stmt,
    cst.FunctionDef: Explorer.not_run,
    cst.ClassDef: Explorer.not_run,
}
_SMALL_HANDLERS: dict[type, SmallHandler] = {
    cst.Expr: Explorer.expr_stmt,
    cst.Assign: Explorer.assign_stmt,
    cst.AnnAssign: Explorer.assign_stmt,
    cst.AugAssign: Explorer.aug_assign_stmt,
    cst.Return: Explorer.return_stmt,
    cst.Raise: Explorer.raise_stmt,
    cst.Assert: Explorer.assert_stmt,
    cst.Del: Explorer.del_stmt,
    cst.Continue: Explorer.continue_stmt,
    cst.Break: Explorer.break_stmt,
    cst.Pass: Explorer.no_effect,
    cst.Import: Explorer.no_effect,
    cst.ImportFrom: Explorer.no_effect,
    cst.Global: Explorer.no_effect,
    cst.Nonlocal: Explorer.no_effect,
}
# Kinds newer libcst releases have: `type X = ...`, `lazy import x` (bind nothing a path tracks).
for _kind_name in ("TypeAlias", "LazyImport", "LazyImportFrom"):
    if hasattr(cst, _kind_name):
        _SMALL_HANDLERS[getattr(cst, _kind_name)] = Explorer.no_effect

ExpressionHandler = Callable[..., list[tuple[PathState, Val]]]
ConstantHandler = Callable[..., "Val | None"]

# The expression kinds the explorer evaluates, by node class; any other kind is evaluated for
# the effects of the calls inside it (Explorer.eval_children_for_effects) and is unknown.
_EXPRESSION_HANDLERS: dict[type, ExpressionHandler] = {
    cst.Name: Explorer.eval_name,
    cst.Attribute: Explorer.eval_attribute,
    cst.Integer: Explorer.eval_integer,
    cst.Call: Explorer.eval_call,
    cst.Subscript: Explorer.eval_subscript,
    cst.BinaryOperation: Explorer.eval_binary,
    cst.Comparison: Explorer.eval_test,
    cst.BooleanOperation: Explorer.eval_test,
    cst.UnaryOperation: Explorer.eval_unary,
    cst.Tuple: Explorer.eval_sequence,
    cst.List: Explorer.eval_sequence,
    cst.Set: Explorer.eval_sequence,
    cst.Await: Explorer.eval_await,
    cst.IfExp: Explorer.eval_ifexp,
    cst.SimpleString: Explorer.eval_text,
    cst.FormattedString: Explorer.eval_text,
    cst.ConcatenatedString: Explorer.eval_text,
    cst.Float: Explorer.eval_text,
}
# The expressions whose exact values Explorer.constant knows; any other kind is not constant.
_CONSTANT_HANDLERS: dict[type, ConstantHandler] = {
    cst.Attribute: Explorer.constant_attribute,
    cst.Name: Explorer.constant_name,
    cst.Integer: Explorer.constant_integer,
    cst.UnaryOperation: Explorer.constant_unary,
    cst.Tuple: Explorer.constant_sequence,
    cst.List: Explorer.constant_sequence,
    cst.Set: Explorer.constant_sequence,
    cst.SimpleString: Explorer.constant_text,
    cst.Float: Explorer.constant_text,
}


def live_after(function: cst.FunctionDef, stmt: cst.CSTNode, cache: dict) -> frozenset[str] | None:
    """Every name and attribute chain (`req`, `req.a`, `self.x.y`) that appears in `function`
    after `stmt` (nested bodies included), or None when `stmt` is not one of its statements.
    The explorer runs each statement once, in source order (a loop body runs zero or one time),
    so what is not written after a statement is never read after it. `cache` is the index's:
    it lives as long as the trees whose ids its keys hold."""
    key = ("live after", id(function))
    table = cache.get(key)
    if table is None:
        table = cache[key] = _live_after_table(function)
    return table.get(id(stmt))


def _live_after_table(function: cst.FunctionDef) -> dict[int, frozenset[str]]:
    tokens: list[str] = []  # names and chains, in source order
    ends: list[tuple[int, int]] = []  # (statement id, tokens up to its end)
    stack: list[tuple[cst.CSTNode, bool]] = [(function, False)]
    while stack:  # depth first, in source order; a statement's end is noted after its children
        node, finished = stack.pop()
        if finished:
            ends.append((id(node), len(tokens)))
            continue
        if isinstance(node, (cst.BaseExpression, cst.BaseSmallStatement)):
            _tokens_in(node, tokens)
            if isinstance(node, cst.BaseSmallStatement):
                ends.append((id(node), len(tokens)))
            continue
        if isinstance(node, cst.BaseStatement):
            stack.append((node, True))
        if isinstance(node, (cst.SimpleStatementLine, cst.IndentedBlock)):  # the rest is blank lines and comments
            stack.extend((child, False) for child in reversed(node.body))
        else:
            stack.extend((child, False) for child in reversed(node.children))
    table: dict[int, frozenset[str]] = {}
    seen: set[str] = set()
    at = len(tokens)
    for ident, end in sorted(ends, key=lambda e: -e[1]):
        while at > end:
            at -= 1
            seen.add(tokens[at])
        table[ident] = frozenset(seen)
    return table


def _tokens_in(root: cst.BaseExpression | cst.BaseSmallStatement, tokens: list[str]) -> None:
    """Append the names and chains in an expression or a simple statement to `tokens`. Neither
    holds a statement, so the order of its tokens does not matter to the live-after table: its
    nodes are reached through their fields, not libcst's `children`, which rebuilds the node."""
    stack: list[cst.CSTNode] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name):
            tokens.append(node.value)
            continue  # a name holds only its parentheses
        if isinstance(node, cst.Attribute):
            text = dotted(node)
            if text:
                tokens.append(text)
        for name in _node_fields(type(node)):
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(item for item in value if isinstance(item, cst.CSTNode))


@lru_cache(maxsize=None)
def _node_fields(kind: type) -> tuple[str, ...]:
    """The fields of a libcst node class that may hold a name: parentheses and whitespace never do."""
    return tuple(f.name for f in fields(kind)
                 if f.name not in ("lpar", "rpar") and not f.name.startswith("whitespace"))
