"""Graph stage for the senders: which poll() each transfer backend really runs (through
inheritance across files), which states it can return, whether it reads the state that abort()
writes, and which timeout checks it passes on the way to returning each state."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import cast

from kvtrace import flow
from kvtrace.effects import SenderEffects
from kvtrace.flow import COMPANION, Companion, Event, Explorer, Options, PathLimit, PathState, StartedRun, fact_keys, recording_touched
from kvtrace.gaps import Cut
from kvtrace.index import ClassInfo, FuncRef, Index, functions_given_self
from kvtrace.managers import (
    ManagerFacts,
    ManagerModel,
    TableMoves,
    backend_folder,
    class_mappings,
    ends_with_attr,
    manager_model,
    narrowed_by_guard,
    pair_manager,
)
from kvtrace.model import Backend, EventKind, Evidence, PollRef, Problem, ProblemKind, StateVerdict, TimeoutCheck, WayOut
from kvtrace.packs import Pack, matches
from kvtrace.parse import parents as _parents
from kvtrace.parse import walk
from kvtrace.syntax import dotted, enum_member, self_attr
from kvtrace.states import ABSENT, NONE, OTHER, Domain, Val
from kvtrace.status_table import TABLE



@dataclass
class SenderAnalysis:
    backend: Backend
    cls: ClassInfo
    poll: FuncRef | None
    raise_sites: list[tuple[str, int, str]] = field(default_factory=list)  # (path, line, function) poll() raises at
    # (path, line, function) where poll() reads the table for an absent room and raises (KeyError)
    absent_raise_sites: list[tuple[str, int, str]] = field(default_factory=list)
    manager: ManagerFacts | None = None  # the manager the sender works with (ScanModel.managers groups them)
    # Of backend.returns_unknown, the stores only another mode of the manager makes (managers.py).
    other_mode_unknown: tuple[str, ...] = ()

    @property
    def unknown_in_mode(self) -> list[str]:
        return [u for u in self.backend.returns_unknown if u not in self.other_mode_unknown]


def is_abstract(func: FuncRef) -> bool:
    if any(ast.unparse(d).endswith("abstractmethod") for d in func.node.decorator_list):
        return True
    body = [s for s in func.node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))]
    if not body:
        return True
    if len(body) == 1:
        only = body[0]
        if isinstance(only, ast.Pass) or (isinstance(only, ast.Expr) and isinstance(only.value, ast.Constant) and only.value.value is Ellipsis):
            return True
        if isinstance(only, ast.Raise) and only.exc is not None and "NotImplementedError" in ast.unparse(only.exc):
            return True
    return False


def analyse_backends(index: Index, pack: Pack, domain: Domain, root: str, problems: list[Problem],
                     take: Callable[[int], bool] | None = None, from_back: bool = False) -> list[SenderAnalysis]:
    """Each backend's sender, in (path, line) order (`from_back`: the last first). `take(i)` says
    whether this process analyses the i-th sender class (kvtrace.scan shares them with a forked
    child); None: all."""
    results = []
    senders = sender_classes(index, pack)
    mappings = class_mappings(index)
    order = list(enumerate(senders))
    for position, cls in reversed(order) if from_back else order:
        if take is not None and not take(position):
            continue
        # An intermediate class that a sender of the same backend builds on is not a backend
        # of its own: the class that extends it is what the backend creates.
        folder = backend_folder(cls.path, root)
        if any(other is not cls and backend_folder(other.path, root) == folder and cls in index.mro(other)[1:]
               for other in senders):
            continue
        try:
            manager = pair_manager(index, pack, domain, cls, root, mappings)
            results.append(analyse_sender(index, pack, domain, cls, root, manager, problems))
        except RecursionError:
            problems.append(Problem(ProblemKind.TOO_DEEP, f"{cls.name}.{pack.poll_method}() is nested too deeply to analyse "
                                    f"({cls.path}:{cls.line})", f"{cls.path}:{cls.line}"))
    return results


def sender_classes(index: Index, pack: Pack) -> list[ClassInfo]:
    """Every class built on the pack's sender base (intermediate ones included), in (path, line) order."""
    return [c for c in index.subclasses_of(pack.sender_base) if not matches(c.name, pack.exclude_classes)]


# --- a sender, executed abstractly ---------------------------------------------------------------


def analyse_sender(index: Index, pack: Pack, domain: Domain, cls: ClassInfo, root: str,
                   manager: ManagerModel | None = None, problems: list[Problem] | None = None) -> SenderAnalysis:
    """The sender's backend: run its poll() from each value the status table can hold for the room,
    then ask of every state it returns whether abort() or the clock ends it. The steps below, in order."""
    name = backend_folder(cls.path, root)
    poll = index.find_method(cls, pack.poll_method)
    abort = index.find_method(cls, pack.abort_method)
    facts = manager.facts if manager else None
    notes: list[str] = []
    if manager is not None and manager.ref.unknown:
        notes.append(f"{manager.ref.table or 'the status table'} may hold other values: " + "; ".join(manager.ref.unknown[:3]))
    if poll is None or is_abstract(poll):
        notes.append(f"no concrete {pack.poll_method}() in {cls.name} or its bases")
        backend = Backend(name, cls.name, cls.path, cls.line, None, [], False, None, [], notes,
                          manager=manager.ref if manager else None)
        return SenderAnalysis(backend, cls, None, manager=facts)
    concrete_abort = abort if abort is not None and not is_abstract(abort) else None
    if concrete_abort is None:
        notes.append(f"no concrete {pack.abort_method}(): an abort cannot reach poll()")
    inherited = poll.owner.name if poll.owner is not None and poll.owner is not cls else None
    ref = PollRef(poll.path, poll.line, inherited)
    runner = _Runner(index, pack, domain, cls, manager)
    runner.poll = poll
    if runner.parse(poll) is None:
        notes.append(f"{pack.poll_method}() could not be parsed")
        if problems is not None:
            problems.append(Problem(ProblemKind.UNPARSED, f"{poll.path}:{poll.line} {poll.qualname}() could not be parsed "
                                    f"with libcst; the {name} backend is not analysed", f"{poll.path}:{poll.line}"))
        return SenderAnalysis(Backend(name, cls.name, cls.path, cls.line, ref, [], False, None, [], notes,
                                      [f"{pack.poll_method}() could not be parsed"],
                                      manager.ref if manager else None), cls, poll, manager=facts)
    abort_writes = _abort_writes(runner, concrete_abort)
    runner.abort_attrs = frozenset(abort_writes)
    configs, reach = _table_configs(runner, index, domain, cls, manager)
    polled = _PolledStates(runner, poll, concrete_abort, abort_writes, configs)
    polled.run()
    if polled.raises:
        notes.append("poll() can raise")
    if runner.truncated:  # read before _left_by_methods runs: its own cuts are problems, not notes
        notes.append("path limit reached in " + ", ".join(sorted(set(runner.truncated))))
    covers = polled.covers()  # before _left_by_methods, whose runs pass timeout checks of their own
    left_by, pinned_after = _left_by_methods(runner, index, pack, cls, poll, concrete_abort, abort_writes, polled.verdicts,
                                             domain, configs)
    past = _past_states(runner, index, pack, cls, poll, polled.verdicts, domain, [h for _, h in configs])
    verdicts = _undecided_if_unparsed(runner, name, polled.verdicts, problems)
    order = {m: i for i, m in enumerate(domain.members)}

    def by_member(state: str) -> int:
        return order.get(state, len(order))

    constructor_only = _constructor_only(runner, index, domain, cls, manager, name, polled, reach, by_member)
    timeouts = [TimeoutCheck(p, line, tuple(sorted(c, key=by_member))) for (p, line), c in sorted(covers.items())]
    unknown = polled.unknown_returns()
    unreadable_stores = [_unreadable(manager, u) for u in manager.ref.unknown] if manager else []
    backend = Backend(
        name=name,
        sender=cls.name,
        path=cls.path,
        line=cls.line,
        poll=ref,
        returns=sorted(polled.returns, key=by_member),
        reads_abort_state=polled.reads_abort,
        abort_state=", ".join(sorted(abort_writes)) or None,
        timeouts=timeouts,
        notes=notes,
        has_abort=concrete_abort is not None,
        abort_writes=tuple(sorted(abort_writes.values(), key=lambda e: (e.path, e.line))),
        returns_unknown=list(dict.fromkeys(unknown + unreadable_stores)),
        manager=manager.ref if manager else None,
        verdicts={s: verdicts[s] for s in sorted(verdicts, key=by_member)},
        constructor_only=constructor_only,
        unborn=runner.unborn,
        left_by=left_by,
        pinned_after=pinned_after,
        past=past,
        from_table=tuple(sorted(polled.returns - polled.untabled, key=by_member)),
    )
    other_mode = tuple(_unreadable(manager, u) for u in sorted(manager.other_mode_unknown)) if manager else ()
    return SenderAnalysis(backend, cls, poll, sorted(polled.raise_sites), sorted(polled.absent_raises), facts,
                          other_mode)


def _in_other_mode(func: FuncRef, manager: ManagerModel) -> bool:
    """A thread or method that runs only in a mode of the manager its senders never see."""
    return any(func.qualname == q or func.qualname.startswith(q + ".") for q in manager.other_mode_methods)


def _unreadable(manager: ManagerModel, why: str) -> str:
    return f"{manager.ref.table} stores a value kvtrace cannot read: {why}"


def _abort_writes(runner: "_Runner", abort: FuncRef | None) -> dict[str, Evidence]:
    """What abort() writes on the sender: the attributes poll() would have to read."""
    writes: dict[str, Evidence] = {}
    if abort is None:
        return writes
    for end in runner.run(abort, (), record_writes=True):
        for e in end.events:
            if e.kind == EventKind.ATTR_WRITE and not e.detail.startswith(("@", "?")):
                writes.setdefault(e.detail, Evidence(e.path, e.line, f"{e.function}() writes self.{e.detail}"))
    return writes


_Config = tuple[str, Val | None]  # (what the table holds for the room, said in words; the table's value or None)


def _table_configs(runner: "_Runner", index: Index, domain: Domain, cls: ClassInfo,
                   manager: ManagerModel | None) -> tuple[list[_Config], set[str] | None]:
    """The table contents poll() is run from, and what the table can hold when poll() runs (None:
    not settled). Only states known to be stored: a store kvtrace cannot read is reported, never a
    pin; and only those a run of the code can reach from the room's registration."""
    table = manager.ref.table if manager else None
    if manager is None or table is None:
        return [("", None)], None
    reach = _reachable_table(runner, index, cls, manager)
    configs: list[_Config] = [(f"{table} holds {s} for the room", frozenset({s})) for s in domain.members
                              if s in manager.ref.holds and (reach is None or s in reach)]
    unborn = _room_may_be_missing(runner, index.find_method(cls, "__init__"))
    if (manager.ref.clears or unborn is not None) and (reach is None or ABSENT in reach):
        configs.append((f"the room is absent from {table}", frozenset({ABSENT})))
    if unborn is not None:
        runner.unborn = unborn
    return configs or [("", None)], reach


class _PolledStates:
    """poll() run from each table content: the states it returns, and for each state that is not
    terminal, whether abort() or the clock ends it (its verdict, with the chain of a pin)."""

    def __init__(self, runner: "_Runner", poll: FuncRef, abort: FuncRef | None, abort_writes: dict[str, Evidence],
                 configs: list[_Config]) -> None:
        self.runner, self.poll, self.abort, self.abort_writes, self.configs = runner, poll, abort, abort_writes, configs
        self.returns: set[str] = set()
        self.unknown_sites: dict[str, list[str]] = {}  # where poll() returns a value kvtrace cannot follow -> labels
        self.verdicts: dict[str, StateVerdict] = {}
        self.timeout_covers: dict[tuple[str, int], set[str]] = {}  # timeout check -> states it ends
        self.reads_abort = False
        self.raises = False
        self.raise_sites: set[tuple[str, int, str]] = set()
        self.untabled: set[str] = set()  # states some path returns without reading them from the table
        self.absent_raises: set[tuple[str, int, str]] = set()  # reads of an absent room that raise (KeyError)

    def run(self) -> None:
        for label, held in self.configs:
            attrs = ((TABLE, held),) if held is not None else ()
            for end in self.runner.run(self.poll, attrs):
                self._take(label, held, end)

    def _take(self, label: str, held: Val | None, end: PathState) -> None:
        """One path of poll(): a raise, a value kvtrace cannot follow, or states to judge."""
        domain = self.runner.domain
        if any(e.kind == EventKind.ABORT_READ for e in end.events):
            self.reads_abort = True
        if end.term == "raise":
            self.raises = True
            self.raise_sites.update((e.path, e.line, e.function) for e in end.events if e.kind == EventKind.RAISE)
            self.absent_raises.update((e.path, e.line, e.function) for e in end.events if e.kind == EventKind.TABLE_RAISE)
            return
        value = end.ret if end.ret is not None else frozenset({NONE})
        states = domain.states(value)
        if OTHER in value:
            site = _return_site(self.runner, end)
            where = f"{site.function}() returns it at {site.path}:{site.line}" if site is not None \
                else f"{self.poll.qualname}() at {self.poll.path}:{self.poll.line}"
            self.unknown_sites.setdefault(where, []).append(label)
            return
        self.returns |= states
        from_table = held is not None and any(e.kind == EventKind.TABLE_READ for e in end.events)
        for state in states:
            if not (from_table and held is not None and state in held):
                self.untabled.add(state)
            if state not in domain.terminal:
                self._judge(label, held, end, state)

    def _judge(self, label: str, held: Val | None, end: PathState, state: str) -> None:
        """The state's verdict: the first pin found (with its chain) wins over any way out."""
        found = self.runner.way_out(end, self.abort, self.poll, state)
        for key in found.timeouts:
            self.timeout_covers.setdefault(key, set()).add(state)
        previous = self.verdicts.get(state)
        if found.verdict.pinned:
            if previous is None or not previous.pinned:
                chain = _chain(self.runner, self.runner.cls, self.poll, self.abort, self.abort_writes, self.runner.manager,
                               label, held, end, state, found)
                self.verdicts[state] = StateVerdict(state, WayOut.NONE, found.verdict.how, chain,
                                                    absent_room=held is not None and ABSENT in held)
        elif previous is None:
            self.verdicts[state] = found.verdict

    def unknown_returns(self) -> list[str]:
        """One line per return site of a value kvtrace cannot follow, with the table contents it is seen for."""
        lines = []
        for where, labels in self.unknown_sites.items():
            seen = [label for label in dict.fromkeys(labels) if label]
            lines.append(f"a value kvtrace cannot follow: {where}"
                         + (f" ({'; '.join(seen)})" if seen and len(seen) < len(self.configs) else ""))
        return lines

    def covers(self) -> dict[tuple[str, int], set[str]]:
        """Every timeout check the runs passed, with the states it ends (none for some)."""
        covers = self.timeout_covers
        for key in self.runner.timeout_sites:
            covers.setdefault(key, set())
        return covers


def _undecided_if_unparsed(runner: "_Runner", name: str, verdicts: dict[str, StateVerdict],
                           problems: list[Problem] | None) -> dict[str, StateVerdict]:
    """Code the engine did not follow (a construct, its budget, a function libcst could not parse)
    makes the backend's analysis incomplete. abort() and what it calls may be what could not be
    read: then neither a pin nor a way out through abort() is claimed (a gap); a deadline found with
    the clock alone stands."""
    if problems is not None:
        problems.extend(Problem(ProblemKind.CUT, f"analysis cut short at {t} (the {name} backend's analysis is incomplete)",
                                t.where) for t in sorted(set(runner.truncated)) if isinstance(t, Cut))
        # Paths cut at the limit are paths not followed: a note alone would let the scan look whole.
        problems.extend(Problem(ProblemKind.PATH_LIMIT, f"path limit reached at {t} (the {name} backend's analysis "
                                "is incomplete)", t) for t in sorted(set(runner.truncated)) if not isinstance(t, Cut))
    if not runner.unparsed:
        return verdicts
    if problems is not None:
        problems.extend(Problem(ProblemKind.UNPARSED, f"{u} could not be parsed with libcst (the {name} backend's analysis "
                                "is incomplete)", u.partition(" ")[0]) for u in sorted(runner.unparsed))
    undecided = f"not decided: {', '.join(sorted(runner.unparsed))} could not be parsed with libcst"
    return {s: v if v.way_out is WayOut.TIMEOUT else StateVerdict(s, WayOut.UNKNOWN, undecided, v.chain)
            for s, v in verdicts.items()}


def _constructor_only(runner: "_Runner", index: Index, domain: Domain, cls: ClassInfo, manager: ManagerModel | None,
                      name: str, polled: _PolledStates, reach: set[str] | None,
                      by_member: Callable[[str], int]) -> dict[str, Evidence]:
    """The states poll() returns from the table that only the sender's constructor stores. Settled
    by running the entry points when that could be done, else read from the syntax."""
    init = index.find_method(cls, "__init__")
    if manager is None or manager.ref.table is None or init is None:
        return {}
    table = manager.ref.table
    again = runner.stored_by_entries if reach is not None and runner.stored_by_entries is not None \
        else set(manager.later) | set(manager.unknown_in_mode and domain.members)
    found: dict[str, Evidence] = {}
    for state in sorted(polled.returns - polled.untabled - again - set(domain.terminal), key=by_member):
        if reach is None or state in reach:
            found[state] = Evidence(init.path, init.line, f"only {init.qualname}() stores {state} in {table}: no other "
                                                          f"run of the {name} backend's code puts it back"
                                    + "".join(f"; the value {u.split(' ', 1)[0]} stores is another mode's: {why}"
                                              for u, why in manager.other_mode_unknown.items()))
    return found


def raise_sites_with_history(index: Index, pack: Pack, domain: Domain, analysis: SenderAnalysis,
                             history: frozenset[str]) -> list[tuple[str, int, str]]:
    """The places poll() raises at (of those found for any history) when only the sender's
    methods named in `history` can have run on it: their attribute writes are the only ones
    poll()'s guards can read (a flag only a later stage's send() sets is still at its
    constructor's value)."""
    if analysis.poll is None or not analysis.raise_sites:
        return []
    manager = manager_model(index, pack, domain, analysis.cls, analysis.manager.cls) if analysis.manager else None
    runner = _Runner(index, pack, domain, analysis.cls, manager, history)
    runner.poll = analysis.poll
    found: set[tuple[str, int, str]] = set()
    for end in runner.run(analysis.poll, ()):
        if end.term == "raise":
            found.update((e.path, e.line, e.function) for e in end.events if e.kind == EventKind.RAISE)
    return [site for site in analysis.raise_sites if site in found]


def _left_by_methods(runner: "_Runner", index: Index, pack: Pack, cls: ClassInfo, poll: FuncRef,
                     abort: FuncRef | None, abort_writes: dict[str, Evidence], verdicts: dict[str, StateVerdict],
                     domain: Domain, configs: list[_Config]
                     ) -> tuple[dict[str, dict[str, Evidence]], dict[str, dict[str, tuple[Evidence, ...]]]]:
    """For each pinned state: the sender's methods (other than poll, abort and the constructor)
    after which it is no longer pinned, whatever path the method took: poll() no longer returns
    it (`send()` setting `has_sent`), or abort() or the clock now end it (`init()` starting the
    clock of a waiting timeout). The scheduler may call one before or right after the request
    enters the queue.

    Second, for each state still pinned after a method that changed the sender: the chain of
    that pin when it differs from the one found with nothing run (`init()` set the flag of
    poll()'s first return, and the state comes from a later one): a queue every request enters
    with the method run cites the lines its poll() can reach."""
    pinned = [s for s, v in verdicts.items() if v.pinned]
    if not pinned:
        return {}, {}
    found: dict[str, dict[str, Evidence]] = {}
    chains: dict[str, dict[str, tuple[Evidence, ...]]] = {}
    names = dict.fromkeys(n for c in index.mro(cls) for n in c.methods)
    for name in names:
        if name in (pack.poll_method, pack.abort_method) or name.startswith("__"):
            continue
        func = index.find_method(cls, name)
        if func is None or is_abstract(func) or runner.parse(func) is None:
            continue
        after = _PollAfter(runner, cls, poll, abort, abort_writes, verdicts, domain, pinned)
        if not after.run(func, configs):
            continue
        for state, chain in after.chains.items():
            chains.setdefault(state, {})[name] = chain
        for state in pinned:
            if state not in after.returned:
                found.setdefault(state, {})[name] = Evidence(
                    func.path, func.line, f"once {func.qualname}() has run, {cls.name}.{poll.name}() no longer returns {state}")
            elif state not in after.kept:
                found.setdefault(state, {})[name] = Evidence(
                    func.path, func.line, f"once {func.qualname}() has run, {state} has a way out of {cls.name}.{poll.name}()")
    return found, chains


class _PollAfter:
    """A sender method run from each table content, then poll(): the pinned states poll() still
    returns, those still with no way out, and the chains of those that cite other lines than
    the verdict's."""

    def __init__(self, runner: "_Runner", cls: ClassInfo, poll: FuncRef, abort: FuncRef | None,
                 abort_writes: dict[str, Evidence], verdicts: dict[str, StateVerdict], domain: Domain,
                 pinned: list[str]) -> None:
        self.runner, self.cls, self.poll, self.abort, self.abort_writes = runner, cls, poll, abort, abort_writes
        self.verdicts, self.domain, self.pinned = verdicts, domain, pinned
        self.returned: set[str] = set()
        self.kept: set[str] = set()
        self.chains: dict[str, tuple[Evidence, ...]] = {}

    def run(self, func: FuncRef, configs: list[_Config]) -> bool:
        """False when the method changes nothing on the sender (or always raises)."""
        ran = False
        for label, held in configs:
            start = ((TABLE, held),) if held is not None else ()
            ends = [e for e in self.runner.run(func, start) if e.term != "raise"]
            changed = bool(ends) and any(e.attrs != start for e in ends)
            ran = ran or changed
            for end in ends:
                for after in self.runner.run(self.poll, end.attrs):
                    if after.term != "raise":
                        self._judge(label, held, after, changed)
                if self.kept.issuperset(self.pinned):
                    return ran  # every pinned state stays pinned after it: the method leaves none
        return ran

    def _judge(self, label: str, held: Val | None, after: PathState, changed: bool) -> None:
        value = after.ret if after.ret is not None else frozenset({NONE})
        now = set(self.pinned) if OTHER in value else set(self.domain.states(value)) & set(self.pinned)
        self.returned |= now
        # A state still returned may have a way out now (a timeout from a clock the method
        # started): it is pinned only if abort() and the clock still end nothing.
        for state in sorted(now - self.kept):
            if OTHER in value:
                self.kept.add(state)
                continue
            way = self.runner.way_out(after, self.abort, self.poll, state)
            if not way.verdict.pinned:
                continue
            self.kept.add(state)
            if changed:
                chain = _chain(self.runner, self.cls, self.poll, self.abort, self.abort_writes, self.runner.manager,
                               label, held, after, state, way)
                if chain != self.verdicts[state].chain:
                    self.chains[state] = chain


PAST_RUNS = 160  # runs a never-again closure may take before it is given up (no claim)
PAST_ROUNDS = 4  # rounds of poll() and every method after the first answer


def _past_states(runner: "_Runner", index: Index, pack: Pack, cls: ClassInfo, poll: FuncRef,
                 verdicts: dict[str, StateVerdict], domain: Domain,
                 tables: list[Val | None]) -> dict[str, dict[str, Evidence]]:
    """For each pinned state P: the states S such that once poll() has answered S it never
    answers P again, whatever runs on the sender in between (any of its methods, abort()
    included, any number of times, the clock anywhere): poll() run again from the facts of the
    paths that answered S, and every method from there, to a fixpoint. The status table and the
    manager's attributes are taken as holding anything they can (other threads write them); an
    attribute the sender's code narrowed is trusted only if no code outside it stores to it.
    Empty for a state when the closure does not settle within PAST_RUNS runs."""
    pinned = [s for s, v in verdicts.items() if v.pinned]
    if not pinned:
        return {}
    methods: list[FuncRef] = []
    for name in dict.fromkeys(n for c in index.mro(cls) for n in c.methods):
        if name == pack.poll_method or name.startswith("__"):
            continue
        func = index.find_method(cls, name)
        if func is None or is_abstract(func):
            continue
        if runner.parse(func) is None:
            return {}
        methods.append(func)
    held_any: frozenset[str] = frozenset().union(*(h for h in tables if h is not None))
    answered: dict[str, list[PathState]] = {}
    for held in tables:
        start = ((TABLE, held),) if held is not None else ()
        for end in runner.run(poll, start):
            value = end.ret if end.ret is not None else frozenset({NONE})
            if end.term == "raise" or OTHER in value:
                continue
            for state in domain.states(value):
                answered.setdefault(state, []).append(end)
    outside = _stored_outside(index, cls)
    moves = runner.manager.moves if runner.manager is not None else None
    found: dict[str, dict[str, Evidence]] = {}
    for state, ends in answered.items():
        starts = [_facts_between_polls(e.attrs, held_any, moves) for e in ends]
        if any(key in outside for attrs in starts for key, _ in attrs):
            continue
        for gone in pinned:
            if gone == state or not _never_again(runner, poll, methods, starts, gone, domain, held_any, moves):
                continue
            site = next((e for end in ends for e in reversed(end.events) if e.kind == EventKind.RETURN), None)
            where = (site.path, site.line) if site is not None else (poll.path, poll.line)
            found.setdefault(gone, {})[state] = Evidence(
                *where, f"once {cls.name}.{poll.name}() has answered {state}, it never answers {gone} again")
    return found


def _facts_between_polls(attrs: tuple, held_any: frozenset[str], moves: TableMoves | None) -> tuple:
    """What still holds of a sender's state when it is polled again: its own attributes; not
    the path's condition facts, nor the manager's attributes; the table anything it can hold
    (other threads store into it), or, when every store into it is read, what its entry can
    move to from what it holds now (a max() store never lowers it: TableMoves)."""
    kept = [(k, v) for k, v in attrs if not k.startswith(("?", "@"))]
    now = next((v for k, v in attrs if k == TABLE), None)
    if held_any and now is not None:
        later = moves.after(now) if moves is not None else None
        kept.append((TABLE, (later & held_any) or held_any if later is not None else held_any))
    return tuple(sorted(kept))


def _never_again(runner: "_Runner", poll: FuncRef, methods: list[FuncRef], starts: list[tuple], gone: str,
                 domain: Domain, held_any: frozenset[str], moves: TableMoves | None) -> bool:
    seen: set[tuple] = set()
    frontier = list(dict.fromkeys(starts))
    budget = PAST_RUNS
    for _ in range(PAST_ROUNDS):
        following: list[tuple] = []
        for attrs in frontier:
            seen.add(attrs)
            budget -= 2 + len(methods)
            if budget < 0:
                return False
            for clock_far in (False, True):
                for end in runner.run(poll, attrs, clock_far=clock_far):
                    value = end.ret if end.ret is not None else frozenset({NONE})
                    if end.term != "raise" and (OTHER in value or gone in domain.states(value)):
                        return False
                    following.append(_facts_between_polls(end.attrs, held_any, moves))
            for func in methods:
                following.extend(_facts_between_polls(e.attrs, held_any, moves) for e in runner.run(func, attrs))
        frontier = [a for a in dict.fromkeys(following) if a not in seen]
        if not frontier:
            return True
    return False


def _stored_outside(index: Index, cls: ClassInfo) -> set[str]:
    """Attributes that code outside the class and its bases stores on some object
    (`req.sender.flag = ...`): what the sender's own methods say of them is not all."""
    own = {id(f.node) for c in index.mro(cls) for f in c.methods.values()}
    return {attr for attr, storers in _attribute_storers(index).items() if storers - own}


def _attribute_storers(index: Index) -> dict[str, set[int]]:
    """attribute name -> the functions (ids of their nodes) that store it on an object other than
    `self`; once per index."""
    key = ("attribute storers",)
    cached = index.derived.get(key)
    if cached is None:
        cached = {}
        for func in index.all_functions():
            for node in walk(func.node):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                        and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                    cached.setdefault(node.attr, set()).add(id(func.node))
        index.derived[key] = cached
    return cast("dict[str, set[int]]", cached)


def _room_may_be_missing(runner: "_Runner", init: FuncRef | None) -> Evidence | None:
    """Run the sender's __init__ from a table without the room: if some path ends with the room
    still missing, poll() can meet an absent room even if nothing ever clears it."""
    if init is None:
        return Evidence(runner.cls.path, runner.cls.line, f"{runner.cls.name} has no __init__ that stores the room")
    ends = [e for e in runner.run(init, ((TABLE, frozenset({ABSENT})),)) if e.term != "raise"]
    if not ends or any(ABSENT in (e.attr(TABLE) or frozenset()) for e in ends):
        return Evidence(init.path, init.line, f"{init.qualname}() can return without storing the room")
    return None


def _entry_points(index: Index, sender: ClassInfo, manager: ManagerModel, update: str) -> list[tuple[FuncRef, ClassInfo, str]]:
    """What can run between two polls: each method of the manager and of the sender (the one
    their MRO resolves) that no method of theirs calls, except __init__ and the update method
    (whose status comes from its call sites). Threads, public entry points, abort(), clear(),
    poll(). A called method runs inside its callers, with their arguments."""
    classes = [(manager.cls, COMPANION), (sender, "")]
    called: set[str] = set()
    for owner, _ in classes:
        for c in index.mro(owner):
            for func in c.methods.values():
                for node in index.calls_in(func):
                    if isinstance(node.func, ast.Attribute):
                        recv = node.func.value
                        if isinstance(recv, ast.Name) and recv.id == "self" or (
                                isinstance(recv, ast.Attribute) and recv.attr in manager.attrs):
                            called.add(node.func.attr)
    entries = []
    for owner, prefix in classes:
        names = dict.fromkeys(n for c in index.mro(owner) for n in c.methods)
        for name in names:
            if name in called or name in ("__init__", update) or name.startswith("__"):
                continue
            method = index.find_method(owner, name)
            if method is not None and not is_abstract(method):
                entries.append((method, owner, prefix))
        # A function nested in a method (a thread target, a callback) runs when whoever got it
        # calls it, on the enclosing method's `self`: it is an entry point of its own. One the
        # method calls by name is run this way too (the method's run does not enter it).
        for name in names:
            method = index.find_method(owner, name)
            if method is not None and name != update:
                entries.extend((nested, owner, prefix) for nested in nested_functions(method, index))
    return entries


def nested_functions(func: FuncRef, index: Index | None = None) -> list[FuncRef]:
    """The functions defined inside `func` (at any depth, not inside a nested class, whose
    `self` is another object), as functions of the same owner: `Owner.method.inner`. With the
    Index, a function that defines none (most) is told from its kept node lists."""
    if index is not None and len(index.nodes_in(func, _DEFS)) == 1:  # only `func` itself
        return []
    key = ("nested functions", id(func.node), func.name, id(func.owner))
    if index is not None and key in index.derived:  # the entry points ask again for each sender
        return index.derived[key]
    found: list[FuncRef] = []
    todo: list[tuple[ast.AST, str]] = [(stmt, func.name) for stmt in func.node.body]
    while todo:
        node, scope = todo.pop()
        if isinstance(node, ast.ClassDef):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{scope}.{node.name}"
            found.append(FuncRef(name, func.path, node.lineno, node, func.module, func.owner))
            todo.extend((stmt, name) for stmt in node.body)
            continue
        todo.extend((child, scope) for child in ast.iter_child_nodes(node))
    found.sort(key=lambda f: f.line)
    if index is not None:
        index.derived[key] = found
    return found


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _reachable_table(runner: "_Runner", index: Index, sender: ClassInfo, manager: ManagerModel) -> set[str] | None:
    """What the status table can hold for the room (states, ABSENT) when poll() runs: the
    sender's __init__ from an absent room, then any entry point from any value reached so far
    (threads in any interleaving, each run whole; the clock before and past every deadline), to
    a fixpoint. Every value stored on the way counts: a poll can come between two stores. None
    when a function could not be analysed (then every stored state counts)."""
    init = index.find_method(sender, "__init__")
    if init is None:
        return None
    if _stores_out_of_reach(index, sender, manager, runner.pack.update_method):
        return None
    reach = _TableReach(runner, index)
    try:
        reach.run_all(init, sender, "", ABSENT)
        reach.in_entry = True
        entries = [e for e in _entry_points(index, sender, manager, runner.pack.update_method)
                   if _touches_table(index, e[0], e[2], manager, runner.relevant)]
        reach.to_fixpoint(entries)
    except (_Unknown, PathLimit):
        return None
    runner.stored_by_entries = reach.by_entries
    return reach.reached


class _TableReach:
    """The fixpoint of _reachable_table: the values reached so far, those not yet run from, and
    what runs other than the sender's constructor store."""

    def __init__(self, runner: "_Runner", index: Index) -> None:
        self.runner, self.index = runner, index
        self.options = runner.options()
        self.reached: set[str] = set()
        self.frontier: list[str] = []
        self.by_entries: set[str] = set()  # what a run other than the sender's constructor stores
        self.in_entry = False  # running entry points (the constructor has run)
        self.other_mode = False  # running a method of a mode the sender's manager is never in
        self.budget = REACH_RUNS

    def to_fixpoint(self, entries: list[tuple[FuncRef, ClassInfo, str]]) -> None:
        everything = set(self.runner.domain.members) | {ABSENT}
        done: set[tuple[int, str]] = set()
        while self.frontier and not everything <= self.reached:
            start = self.frontier.pop()
            for func, cls, prefix in entries:
                if (id(func.node), start) not in done:
                    done.add((id(func.node), start))
                    self.run_all(func, cls, prefix, start)

    def run_all(self, func: FuncRef, cls: ClassInfo, prefix: str, start: str) -> None:
        # What a method of another mode of the manager stores is reached (the table's values stay
        # as they were), but is not a store into a sender's room (constructor_only).
        manager = self.runner.manager
        self.other_mode = manager is not None and _in_other_mode(func, manager)
        self.budget -= 1
        if self.budget < 0:
            raise _Unknown("too many runs")
        ends = self._run(func, cls, prefix, start, False)
        self._note(ends)
        if any(e.kind == EventKind.TIMEOUT for end in ends for e in end.events):  # the clock matters here
            self._note(self._run(func, cls, prefix, start, True))

    def _run(self, func: FuncRef, cls: ClassInfo, prefix: str, start: str, clock_far: bool) -> list[PathState]:
        parsed = self.index.cst(func)
        if parsed is None:
            raise _Unknown(func.qualname)
        attrs = ((TABLE, frozenset({start})),)

        def explore() -> list[PathState] | Exception:
            explorer = Explorer(replace(self.options, clock_far=clock_far, max_paths=REACH_PATHS, give_up=True))
            try:
                ends, log = explorer.explore_function(func, parsed, cls, [PathState(attrs=attrs)], prefix)
            except PathLimit as limit:
                return limit
            return _Unknown(func.qualname) if log.truncated or log.unparsed else ends

        runner = self.runner
        kind = ("reach", self.runner.abort_attrs, clock_far)
        key = ("reach", id(func.node), runner._shared_options(), runner.role(cls) or id(cls.node), prefix, attrs, clock_far)
        outcome = cast("list[PathState] | Exception", runner.shared_run(key, kind, explore))
        if isinstance(outcome, Exception):  # the same question gives up the same way for each runner
            raise type(outcome)(*outcome.args)
        ends = outcome
        if cls is self.runner.cls and prefix == "":  # what runner.run would do for the sender's own method
            self.runner.seed(func, attrs, clock_far, ends)
        return ends

    def _note(self, ends: list[PathState]) -> None:
        for end in ends:
            unknown = next((e for e in end.events if e.kind == EventKind.TABLE_UNKNOWN), None)
            if unknown is not None:
                raise _Unknown(f"{unknown.path}:{unknown.line} {unknown.detail}")
            values = set(end.attr(TABLE) or ())
            for e in end.events:
                if e.kind == EventKind.TABLE_STORE:
                    values.update(v for v in e.detail.split(", ") if v)
                    if self.in_entry and not self.other_mode:
                        self.by_entries.update(v for v in e.detail.split(", ") if v)
            if not self.other_mode and (self.in_entry and ABSENT in values and ABSENT not in (end.attr(TABLE) or ()) or (
                    self.in_entry and any(e.kind == EventKind.TABLE_CLEAR for e in end.events))):
                self.by_entries.add(ABSENT)
            for v in values - self.reached:
                self.reached.add(v)
                self.frontier.append(v)


_HIDING = (ast.Lambda, ast.ClassDef)  # a body no run enters: a callback's, another object's methods


def _stores_out_of_reach(index: Index, sender: ClassInfo, manager: ManagerModel, update: str) -> bool:
    """Whether some method holds a table update that no run enters: one in a lambda (a callback
    body) or in a class defined inside the method (its `self` is another object). Its states
    are never dropped: then every stored state counts."""
    table = manager.ref.table
    for owner in (manager.cls, sender):
        for c in index.mro(owner):
            for func in c.methods.values():
                if not index.nodes_in(func, _HIDING):
                    continue  # nothing in it hides a store (the walk below only looks under these)
                todo: list[tuple[ast.AST, bool]] = [(stmt, False) for stmt in func.node.body]
                while todo:
                    node, hidden = todo.pop()
                    if hidden and _stores_into(node, update, table):
                        return True
                    hidden = hidden or isinstance(node, _HIDING)
                    todo.extend((child, hidden) for child in ast.iter_child_nodes(node))
    return False


def _stores_into(node: ast.AST, update: str, table: str | None) -> bool:
    """`x.update_status(...)`, `x.<table>[k] = v` / `del`, `x.<table>.pop|setdefault|...(...)`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == update or node.func.attr in ("pop", "setdefault", "update", "clear", "__setitem__") \
            and ends_with_attr(node.func.value, table or "")
    return isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
        and ends_with_attr(node.value, table or "")


REACH_RUNS = 48  # past this many runs (or REACH_PATHS paths at a statement) the table's
REACH_PATHS = 96  # reachable values are not refined: every stored state counts


def _touches_table(index: Index, func: FuncRef, prefix: str, manager: ManagerModel, relevant: frozenset[int] | None) -> bool:
    """Whether running `func` can store into or clear the status table: a manager method that
    reaches it; a sender method that (through its own calls) calls such a manager method or
    names the table."""
    if relevant is None or id(func.node) in relevant:
        if prefix == COMPANION:
            return True
    elif prefix == COMPANION and func.owner is not None and func.owner.methods.get(func.name) is func:
        return False
    names = {f.name for c in index.mro(manager.cls) for f in c.methods.values()
             if relevant is None or id(f.node) in relevant}
    seen: set[int] = set()
    todo = [func]
    while todo:
        f = todo.pop()
        if id(f.node) in seen:
            continue
        seen.add(id(f.node))
        for node in index.nodes_in(f, _ATTRIBUTES_AND_CALLS):
            if isinstance(node, ast.Attribute) and (node.attr == manager.ref.table or node.attr in names
                                                    and isinstance(node.value, ast.Attribute)):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and f.owner is not None:
                recv = node.func.value
                if isinstance(recv, ast.Name) and recv.id == "self":
                    callee = index.find_method(f.owner, node.func.attr)
                    if prefix == COMPANION and callee is not None and (relevant is None or id(callee.node) in relevant):
                        return True  # a function nested in a manager method that updates the table
                    todo.extend([callee] if callee is not None else [])
                elif isinstance(recv, ast.Call) and isinstance(recv.func, ast.Name) and recv.func.id == "super":
                    todo.extend(c.methods[node.func.attr] for c in index.mro(f.owner)[1:] if node.func.attr in c.methods)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                callee = index.resolve_function(node.func.id, f.path)
                if callee is not None:
                    todo.append(callee)
    return False


class _Unknown(Exception):
    """A function the reachability of the table depends on could not be analysed."""


class _RecordingIndex:
    """The Index as a sender runner's explorations see it. The flow engine learns which sender
    and manager it runs only through two questions, a method by name up a class's MRO and the
    MRO itself (for super()); asked of the runner's sender or manager class, each answer is
    written into the runner's dependencies. Everything else is the shared Index's."""

    def __init__(self, index: Index, runner: "_Runner") -> None:
        self._index, self._runner = index, runner

    def __getattr__(self, name: str) -> object:
        # Kept on first use: the engine reads index.derived & co. at every statement. The Index
        # never rebinds what it exposes (its caches are filled in place).
        value = getattr(self._index, name)
        setattr(self, name, value)
        return value

    def find_method(self, cls: ClassInfo, name: str) -> FuncRef | None:
        found = self._index.find_method(cls, name)
        role = self._runner.role(cls)
        if role is not None:
            self._runner.deps[("method", role, name)] = id(found.node) if found is not None else None
        return found

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        found = self._index.mro(cls)
        role = self._runner.role(cls)
        if role is not None:
            self._runner.deps[("mro", role)] = tuple(id(c.node) for c in found)
        return found


class _RecordingSet(frozenset):
    """The manager methods that reach the table, as the explorations ask it: each answer is a
    dependency of the runner's runs (another manager's set may differ)."""

    runner: "_Runner"

    def __new__(cls, items: frozenset[int], runner: "_Runner") -> "_RecordingSet":
        made = super().__new__(cls, items)
        made.runner = runner
        return made

    def __contains__(self, item: object) -> bool:
        found = frozenset.__contains__(self, item)
        self.runner.deps[("reaches", item)] = found
        return found


_ATTRIBUTES_AND_CALLS = (ast.Attribute, ast.Call)


def _table_methods(index: Index, manager: ManagerModel) -> frozenset[int]:
    """The manager's methods that read or write the status table, directly or through the
    methods they call on self: the only ones a sender's poll()/abort() needs to enter."""
    table = manager.ref.table
    methods = {name: f for c in reversed(index.mro(manager.cls)) for name, f in c.methods.items()}
    calls: dict[str, set[str]] = {}
    touches: set[str] = set()
    for name, func in methods.items():
        for node in index.nodes_in(func, _ATTRIBUTES_AND_CALLS):
            if isinstance(node, ast.Attribute) and node.attr == table:
                touches.add(name)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "self" and node.func.attr in methods:
                calls.setdefault(name, set()).add(node.func.attr)
    changed = True
    while changed:
        changed = False
        for name, callees in calls.items():
            if name not in touches and callees & touches:
                touches.add(name)
                changed = True
    relevant = {id(methods[n].node) for n in touches}
    # Overridden definitions up the MRO (super() calls) count as their most-derived name does.
    for c in index.mro(manager.cls):
        for name, f in c.methods.items():
            if name in touches:
                relevant.add(id(f.node))
    return frozenset(relevant)


@dataclass
class _Found:
    verdict: StateVerdict
    timeouts: set[tuple[str, int]]  # timeout checks on the terminal paths, clock past them
    abort_ends: list[PathState]
    far_ends: list[PathState]


class _Runner:
    """Runs a sender's methods on abstract state: its attributes, the manager's, the table."""

    POLLS_AFTER = 2  # polls after abort() / after the clock moved (a cached state needs two)

    def __init__(self, index: Index, pack: Pack, domain: Domain, cls: ClassInfo, manager: ManagerModel | None,
                 history: frozenset[str] | None = None):
        self.index, self.pack, self.domain, self.cls, self.manager = index, pack, domain, cls, manager
        self.history = history  # the sender's methods that can have run (None: any of them)
        self._attr_values: dict[str, Val] = {}  # attr_values' answers: the class and history are fixed
        self.abort_attrs: frozenset[str] = frozenset()
        self.truncated: list[str] = []
        self.unparsed: set[str] = set()
        self.timeout_sites: set[tuple[str, int]] = set()
        self._memo: dict[tuple, list[PathState]] = {}
        self._seeded: dict[tuple, list[PathState]] = {}  # see seed()
        self._started: dict[tuple, list[tuple[StartedRun, tuple[str, ...], frozenset[str]]]] = {}  # see _run
        self.unborn: Evidence | None = None  # why the room can be missing before any clear
        # What the table can be given by a run other than the sender's __init__ (None: not settled).
        self.stored_by_entries: set[str] | None = None
        self.poll: FuncRef | None = None
        self.relevant = _table_methods(index, manager) if manager is not None and manager.ref.table else None
        # Every answer this runner's explorations got that depends on which sender and manager
        # it runs (see _RecordingIndex), per kind of run (see shared_run). A run may reuse the
        # calls an earlier run of this runner made with the same Options (the flow engine's call
        # memo is keyed by them, the runner's attr_values among them): its answers count too.
        self.deps_by_kind: dict[tuple, dict[tuple, object]] = {}
        self.deps: dict[tuple, object] = {}  # those of the kind of run in progress
        self._frozen: dict[tuple, tuple[int, tuple[tuple[tuple, object], ...]]] = {}  # see _frozen_deps
        self._index_seen = cast(Index, _RecordingIndex(index, self))
        self._relevant_seen = _RecordingSet(self.relevant, self) if self.relevant is not None else None

    def role(self, cls: ClassInfo | None) -> str | None:
        """The sender's or its manager's class as a dependency names it; None for any other
        (whose answers do not depend on the runner: the Index is shared)."""
        if cls is self.cls:
            return "sender"
        if self.manager is not None and cls is self.manager.cls:
            return COMPANION
        return None

    def answer(self, query: tuple) -> object:
        """What this runner's explorations would get for a recorded query (see _RecordingIndex)."""
        kind = query[0]
        if kind == "attr":
            return self.attr_values(query[1])
        if kind == "reaches":
            return self.relevant is not None and query[1] in self.relevant
        cls = self.cls if query[1] == "sender" else self.manager.cls if self.manager is not None else None
        if cls is None:
            return None
        if kind == "method":
            found = self.index.find_method(cls, query[2])
            return id(found.node) if found is not None else None
        return tuple(id(c.node) for c in self.index.mro(cls))

    def shared_run(self, key: tuple, kind: tuple, compute: Callable[[], object]) -> object:
        """The outcome of the exploration `key` names (its function, start and options, never
        the runner), shared between the runners of one scan: another runner's outcome is taken
        when every answer that runner's explorations depended on is the same here (backends
        built on a common base run the same __init__, poll() and abort()). `kind`: the Options
        of the run, but for the runner (runs of two kinds never share the engine's call memo)."""
        done: list[tuple[tuple[tuple[tuple, object], ...], object]] = self.index.derived.setdefault(("sender runs", key), [])
        self.deps = self.deps_by_kind.setdefault(kind, {})
        for deps, outcome in done:
            if all(self.answer(query) == answer for query, answer in deps):
                self.deps.update(deps)
                return outcome
        outcome = compute()
        done.append((self._frozen_deps(kind), outcome))
        return outcome

    def _frozen_deps(self, kind: tuple) -> tuple[tuple[tuple, object], ...]:
        """The kind's answers as stored with a run: one tuple while no new question was asked
        (a question always gets the same answer from one runner, so the count says it all)."""
        count, frozen = self._frozen.get(kind, (-1, ()))
        if count != len(self.deps):
            frozen = tuple(self.deps.items())
            self._frozen[kind] = (len(self.deps), frozen)
        return frozen

    def _shared_options(self) -> tuple:
        """The options every run of this runner has, as the shared memo keys them."""
        return (self.pack, self.domain, self.abort_attrs, self.relevant is None,
                self.manager.ref.table if self.manager else None, self.manager.attrs if self.manager else None)

    def parse(self, func: FuncRef):
        return self.index.cst(func)

    def attr_values(self, key: str) -> Val:
        found = self._attr_values.get(key)
        if found is None:
            found = self._attr_values[key] = self._values_of(key)
        return found

    def _values_of(self, key: str) -> Val:
        if key.startswith(COMPANION):
            if self.manager is None:
                return self.domain.universe
            return _attribute_values(self.index, self.domain, self.manager.cls, key[len(COMPANION):], self.pack)
        return _attribute_values(self.index, self.domain, self.cls, key, self.pack, self.history)

    def attr_values_seen(self, key: str) -> Val:
        """attr_values, as the explorations ask it: the answer is a dependency of the run."""
        found = self.deps[("attr", key)] = self.attr_values(key)
        return found

    def run(self, func: FuncRef, attrs, clock_far: bool = False, record_writes: bool = False) -> list[PathState]:
        key = (id(func.node), tuple(attrs), clock_far, record_writes, self.abort_attrs)
        if key not in self._memo:
            # A seeded run marks no return statements: never poll()'s (see _run).
            seeded = self._seeded.pop(key, None) if func is not self.poll else None
            if seeded is not None:
                self._memo[key] = seeded
                self._note_timeouts(seeded)
            else:
                self._memo[key] = self._run(func, attrs, clock_far, record_writes)
        return self._memo[key]

    def seed(self, func: FuncRef, attrs, clock_far: bool, ends: list[PathState]) -> None:
        """The ends of a run of the sender's `func` that _reachable_table made with this
        runner's config but fewer paths allowed (REACH_PATHS, giving up past them): as it never
        reached that bound, a run allowed more paths goes the same way, and run() takes it."""
        key = (id(func.node), tuple(attrs), clock_far, False, self.abort_attrs)
        if key not in self._memo:
            self._seeded.setdefault(key, ends)

    def _note_timeouts(self, ends: list[PathState]) -> None:
        for end in ends:
            for e in end.events:
                if e.kind == EventKind.TIMEOUT:
                    self.timeout_sites.add((e.path, e.line))

    def options(self, clock_far: bool = False, record_writes: bool = False, record_returns: bool = False) -> Options:
        manager = self.manager
        return Options(self._index_seen, self.domain, attr_values=self.attr_values_seen,
                       companion=Companion(manager.cls, manager.attrs, self._relevant_seen) if manager else None,
                       clock_far=clock_far, all_facts=True, record_returns=record_returns,
                       effects=SenderEffects(self.pack, manager.facts.table if manager else None, self.abort_attrs, record_writes))

    def _run(self, func: FuncRef, attrs, clock_far: bool, record_writes: bool) -> list[PathState]:
        parsed = self.index.cst(func)
        if parsed is None:
            self.unparsed.add(f"{func.path}:{func.line} {func.qualname}()")
            return []
        # poll() runs mark their return statements: the chain cites the line a state comes from.
        record_returns = func is self.poll

        # A method runs from many attribute sets that differ only in keys it never reads or
        # writes (poll() after each of send()'s ends): one run serves them all (StartedRun).
        start = tuple(sorted(attrs))
        share = (id(func.node), self.abort_attrs, clock_far, record_writes, record_returns, fact_keys(start))
        held = dict(start)
        for done, truncated, unparsed in self._started.get(share, ()) if flow.SHARE_STARTED else ():
            if done.serves(held):
                ends = done.ends_from(start)
                break
        else:
            def explore() -> tuple[tuple[PathState, ...], tuple[str, ...], frozenset[str], frozenset[str]]:
                explorer = Explorer(self.options(clock_far, record_writes, record_returns=record_returns))
                with recording_touched() as touched:
                    ends, log = explorer.explore_function(func, parsed, self.cls, [PathState(attrs=start)])
                return tuple(ends), tuple(log.truncated), frozenset(log.unparsed), frozenset(touched)

            kind = ("run", self.abort_attrs, clock_far, record_writes, record_returns)
            key = ("run", id(func.node), self._shared_options(), start, clock_far, record_writes, record_returns)
            found, truncated, unparsed, touched = cast(
                tuple[tuple[PathState, ...], tuple[str, ...], frozenset[str], frozenset[str]], self.shared_run(key, kind, explore))
            self._started.setdefault(share, []).append((StartedRun(start, touched, found), truncated, unparsed))
            ends = list(found)
        self.truncated.extend(truncated)
        self.unparsed |= unparsed
        self._note_timeouts(ends)
        return ends

    def _terminal(self, end: PathState) -> bool:
        return end.term != "raise" and bool(set(self.domain.states(end.ret or frozenset({NONE}))) & set(self.domain.terminal)
                                             or OTHER in (end.ret or frozenset()))

    def _polls(self, poll: FuncRef, starts: list[PathState], clock_far: bool) -> tuple[bool, list[PathState], set]:
        """Poll up to POLLS_AFTER times from each start; (a terminal state came, the ends, timeouts on it)."""
        frontier = starts
        seen: list[PathState] = []
        for _ in range(self.POLLS_AFTER):
            nxt = []
            for start in frontier:
                for end in self.run(poll, start.attrs, clock_far=clock_far):
                    seen.append(end)
                    if self._terminal(end):
                        return True, seen, {(e.path, e.line) for e in end.events if e.kind == EventKind.TIMEOUT}
                    if end.term != "raise":
                        nxt.append(end)
            frontier = nxt
            if not frontier:
                break
        return False, seen, set()

    def _abort_via(self, abort: FuncRef, poll: FuncRef, abort_ends: list[PathState],
                   concluded: PathState) -> tuple[Evidence, ...]:
        """How abort() reached the poll() path that concluded: an attribute of the sender poll()
        reads, or the room's status that abort() stores in the manager's table and poll() reads."""
        attr_reads = [e for e in concluded.events if e.kind == EventKind.ABORT_READ]
        if attr_reads:
            first = attr_reads[0]
            attrs = ", ".join(dict.fromkeys(e.detail for e in attr_reads))
            return (Evidence(first.path, first.line, f"{poll.qualname}() reads {attrs}, which {abort.qualname}() writes,"),)
        table_read = next((e for e in concluded.events if e.kind == EventKind.TABLE_READ), None)
        store = next((e for a in abort_ends for e in a.events if e.kind == EventKind.TABLE_STORE), None)
        if table_read is None or store is None:
            return ()
        ends = next(a for a in abort_ends if any(e is store for e in a.events))
        # The sender's own line: the call into the manager method that stores / reads the table.
        call = next((e for e in ends.events if e.kind == EventKind.HELPER and e.detail == store.function), store)
        via = next((e for e in concluded.events if e.kind == EventKind.HELPER and e.detail == table_read.function),
                   table_read)
        table = self.manager.ref.table if self.manager is not None and self.manager.ref.table else "the status table"
        return (Evidence(call.path, call.line, f"{abort.qualname}() stores {store.detail} in {table} through {store.function}()"),
                Evidence(via.path, via.line, f"{poll.qualname}() reads it through {table_read.function}()"))

    def way_out(self, end: PathState, abort: FuncRef | None, poll: FuncRef, state: str) -> _Found:
        abort_ends: list[PathState] = []
        ok, far, timeouts = self._polls(poll, [end], clock_far=True)
        if abort is not None:
            abort_ends = [a for a in self.run(abort, end.attrs) if a.term != "raise"]
            aborted, after, _ = self._polls(poll, abort_ends, clock_far=False)
            if aborted:
                return _Found(StateVerdict(state, WayOut.ABORT, f"{abort.qualname}() and then {poll.qualname}() returns a terminal state",
                                           abort_via=self._abort_via(abort, poll, abort_ends, after[-1])),
                              timeouts if ok else set(), abort_ends, far)
        if ok and timeouts:
            where = ", ".join(f"{path}:{line}" for path, line in sorted(timeouts))
            return _Found(StateVerdict(state, WayOut.TIMEOUT, f"the timeout check at {where} returns a terminal state"),
                          timeouts, abort_ends, far)
        if ok:  # the state is left on its own once more time passes (a value kvtrace cannot follow)
            return _Found(StateVerdict(state, WayOut.TIMEOUT, f"{poll.qualname}() can return a terminal state later"),
                          set(), abort_ends, far)
        return _Found(StateVerdict(state, WayOut.NONE, "no way out"), set(), abort_ends, far)


def _chain(runner: _Runner, cls: ClassInfo, poll: FuncRef, abort: FuncRef | None, abort_writes: dict[str, Evidence],
           manager: ManagerModel | None, label: str, held: Val | None, end: PathState, state: str,
           found: _Found) -> tuple[Evidence, ...]:
    """Why `state` has no way out: each link with its line."""
    links: list[Evidence] = [_returned_at(runner, cls, poll, end, label, held, state)]
    for e in end.events:
        if e.kind == EventKind.TABLE_DEFAULT:
            links.append(Evidence(e.path, e.line, f"{e.function}() returns {e.detail} for a room absent from the table"))
        elif e.kind == EventKind.TABLE_READ:
            links.append(Evidence(e.path, e.line, f"{e.function}() reads {state} from the status table"))
    if abort is None:
        links.append(Evidence(cls.path, cls.line, f"{cls.name} has no concrete abort()"))
    else:
        read = {e.detail for e in end.events if e.kind == EventKind.ABORT_READ}
        for attr, where in abort_writes.items():
            if attr not in read:
                links.append(Evidence(where.path, where.line, f"{where.note}, which {poll.qualname}() never reads"))
        for a in found.abort_ends:
            for e in a.events:
                if e.kind == EventKind.TABLE_ABSENT:
                    links.append(Evidence(e.path, e.line, f"{e.function}() returns without effect when the room is absent "
                                                          f"({e.detail})"))
    if held is not None and ABSENT in held and manager is not None:
        links.extend(manager.ref.clears)
        if runner.unborn is not None:
            links.append(runner.unborn)
    timeouts = {(e.path, e.line) for f in found.far_ends for e in f.events if e.kind == EventKind.TIMEOUT}
    if timeouts:
        links.extend(Evidence(path, line, f"this timeout check does not end {state}") for path, line in sorted(timeouts))
    else:
        links.append(Evidence(poll.path, poll.line, f"no timeout check is reached for {state}"))
    return tuple(dict.fromkeys(links))


def _return_site(runner: _Runner, end: PathState) -> Event | None:
    """The return statement a poll() path's value comes from: of the returns that end the path
    one inside the other (`return self._x()`), the innermost one outside the manager (whose
    table read is a link of its own)."""
    returns: list[Event] = []
    for e in reversed(end.events):
        if e.kind != EventKind.RETURN:
            break
        returns.append(e)
    manager = {c.name for c in runner.index.mro(runner.manager.cls)} if runner.manager is not None else set()
    return next((e for e in reversed(returns) if e.function.split(".")[0] not in manager), None)


def _returned_at(runner: _Runner, cls: ClassInfo, poll: FuncRef, end: PathState, label: str, held: Val | None,
                 state: str) -> Evidence:
    """The return statement that yields `state` on this path: poll()'s own, or the one of the
    sender helper (`return self._x()`, `return super().poll()`) it hands back directly. The
    table's value is named only when the path read it: as the condition when it is the value
    returned, else as what was read before another value was returned."""
    origin = _return_site(runner, end)
    path, line = (origin.path, origin.line) if origin is not None else (poll.path, poll.line)
    where = f"line {line}" if path == poll.path else f"{path}:{line}"
    note = f"{cls.name}.{poll.name}() returns {state} at {where}"
    read = any(e.kind in (EventKind.TABLE_READ, EventKind.TABLE_DEFAULT) for e in end.events)
    if label and held is not None and read:
        if state in held or ABSENT in held:
            note += f" when {label}"
        else:
            table = runner.manager.ref.table if runner.manager is not None else "the status table"
            note += f" after reading {', '.join(sorted(held))} from {table}"
    elif label and held is None:
        note += f" when {label}"
    return Evidence(path, line, note)


_ASSIGNS = (ast.Assign, ast.AnnAssign)


def _assigned_in_class(index: Index, cls: ClassInfo, domain: Domain, pack: Pack | None = None) -> dict[str, set[str]]:
    """self.<attr> -> the values the class's own methods assign to it (one walk per class and Index)."""
    key = ("assigned", id(cls.node), domain, pack.clock_calls if pack is not None else None)
    if key not in index.derived:
        table: dict[str, set[str]] = {}
        for assigned in _assigned_by_method(index, cls, domain, pack).values():
            for attr, values in assigned.items():
                table.setdefault(attr, set()).update(values)
        index.derived[key] = table
    return index.derived[key]


def _assigned_by_method(index: Index, cls: ClassInfo, domain: Domain,
                        pack: Pack | None = None) -> dict[str, dict[str, set[str]]]:
    """method name -> self.<attr> -> the values that method of the class assigns to it."""
    key = ("assigned by method", id(cls.node), domain, pack.clock_calls if pack is not None else None)
    if key not in index.derived:
        by_method: dict[str, dict[str, set[str]]] = {}
        for name, func in cls.methods.items():
            table = by_method.setdefault(name, {})
            parents: dict[int, ast.AST] | None = None
            for node in index.nodes_in(func, _ASSIGNS):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Name) \
                        and node.value.id not in ("None", "True", "False"):
                    # `if status in (Success, Failed): self.conclude_state = status`
                    parents = parents if parents is not None else _parents(func.node)
                    narrowed = narrowed_by_guard(node.value.id, node, parents, domain.members)
                    if narrowed is not None:
                        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                            attr = self_attr(t)
                            if attr is not None:
                                table.setdefault(attr, set()).update(narrowed)
                        continue
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets = [node.target]
                else:
                    continue
                for t in targets:
                    attr = self_attr(t)
                    if attr is not None:
                        table.setdefault(attr, set()).update(_constant_tokens(node.value, domain, pack))
        index.derived[key] = by_method
    return index.derived[key]


def _attribute_values(index: Index, domain: Domain, cls: ClassInfo, attr: str, pack: Pack | None = None,
                      history: frozenset[str] | None = None) -> Val:
    """Every value any method of the class (and its bases) assigns to self.<attr>, itself or
    through a module function it hands `self` to. With a `history` (the names of the methods
    that can have run on this object), only what those methods assign; an attribute none of
    them assigns keeps every value (it may be set where kvtrace does not look)."""
    values: set[str] = set()
    found = False
    for c in index.mro(cls):
        for assigned in (_assigned_in_class(index, c, domain, pack).get(attr), _assigned_by_functions(index, c, domain, pack).get(attr)):
            if assigned is not None:
                found = True
                values |= assigned
    if history is not None and found:
        ran: set[str] = set()
        for c in index.mro(cls):
            for name, writes in _assigned_by_method(index, c, domain, pack).items():
                if name in history and attr in writes:
                    ran |= writes[attr]
            ran |= _assigned_by_functions(index, c, domain, pack).get(attr, set())
        if ran:
            return frozenset(ran)
    return frozenset(values) if found else domain.universe


def _assigned_by_functions(index: Index, cls: ClassInfo, domain: Domain, pack: Pack | None) -> dict[str, set[str]]:
    """<attr> -> values that module functions called with `self` (`_conclude(self)`) assign to
    the parameter's attribute (`sender.conclude_state = ...`)."""
    key = ("assigned by functions", id(cls.node), domain, pack.clock_calls if pack is not None else None)
    if key in index.derived:
        return index.derived[key]
    table: dict[str, set[str]] = {}
    index.derived[key] = table
    for func, param in functions_given_self(index, [cls]):
        for inner in index.nodes_in(func, _ASSIGNS):
            if isinstance(inner, (ast.Assign, ast.AnnAssign)) and inner.value is not None:
                for t in inner.targets if isinstance(inner, ast.Assign) else [inner.target]:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == param:
                        table.setdefault(t.attr, set()).update(_constant_tokens(inner.value, domain, pack))
    return table


def _constant_tokens(value: ast.AST, domain: Domain, pack: Pack | None = None) -> set[str]:
    # A clock reading, or arithmetic on one (`time.monotonic() + 900`), is a number: never None.
    if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Add, ast.Sub)):
        return {OTHER} if _is_clock(value.left, pack) or _is_clock(value.right, pack) else set(domain.universe)
    if _is_clock(value, pack):
        return {OTHER}
    if isinstance(value, ast.Constant):
        if value.value is None:
            return {NONE}
        if isinstance(value.value, bool):
            return {str(value.value)}
        if isinstance(value.value, int):
            member = domain.member_for_int(value.value)
            return {member} if member else {OTHER}
        return {OTHER}
    named = enum_member(value, domain.enum)
    if named is not None and named in domain.members:
        return {named}
    return set(domain.universe)


def _is_clock(node: ast.AST, pack: Pack | None) -> bool:
    return pack is not None and isinstance(node, ast.Call) and pack.is_clock_call(dotted(node.func))
