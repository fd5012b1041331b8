"""The stages of one scan, in the order `kvtrace.scan.scan_fetched` calls them, each a function
with a typed result:

    target -> fetch -> parse -> index -> graph -> checks -> report

- target: what the user named, resolved by `kvtrace.target` (a folder, an installed package, a
  host:path).
- fetch: `kvtrace.fetch` reads the files (local, or a fixed read-only fetch over SSH) into a
  `FetchResult`; nothing after it touches the file system or the network.
- parse (`parse`): the package folder is located and its files chosen and parsed (`kvtrace.parse`).
- index (`index`): classes, functions and calls (`kvtrace.index.Index`) and the poll enum.
- graph (`graph`): the queue analysis (`kvtrace.graph`: the drain loop explored per poll state by
  the flow engine, `kvtrace.flow` with the queue's `kvtrace.effects`) and the sender analysis
  (`kvtrace.backends`, with each manager's `kvtrace.managers.ManagerFacts`), beside each other.
- checks (`checks`): the rules (`rules/`) read one `ScanModel` per queue and give findings.
- report (`report`): the `Report` every writer in `kvtrace.report` reads, with its gaps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtrace.backends import SenderAnalysis, analyse_backends, sender_classes
from kvtrace.beside import Beside, Claims
from kvtrace.cachecodec import decode_record, encode_record
from kvtrace.config import Settings
from kvtrace.errors import AmbiguousTarget, InputError
from kvtrace.gaps import Cut, find_gaps
from kvtrace.flow import Event
from kvtrace.graph import (Explored, QueueAnalysis, QueuePath, ScanModel, StateGraph, analyse_queue, explore_queue,
                           find_enum, static_sites)
from kvtrace.index import Index
from kvtrace.managers import manager_facts
from kvtrace.model import (
    Consequence,
    CutRecord,
    EventKind,
    EventRecord,
    Evidence,
    FetchResult,
    FileMark,
    Filters,
    Finding,
    ModeInfo,
    PathRecord,
    Problem,
    ProblemKind,
    QueueRecord,
    QueueReport,
    Report,
    SenderRecord,
    SendersResult,
    SourceFile,
    with_marks,
)
from kvtrace.rulemeta import consequence_of
from kvtrace.packs import Pack
from kvtrace.parse import ParsedModule, parse_modules
from kvtrace.states import Domain


@dataclass
class Parsed:
    """The located package (`root`), the files in scope (a file that did not parse marked so, on a
    copy) and their modules."""

    root: str
    files: list[SourceFile]
    modules: list[ParsedModule]


@dataclass
class Indexed:
    index: Index
    domain: Domain
    enum: Evidence  # where the poll enum is defined


@dataclass
class Analysed:
    """Each queue's analysis (with what could not be analysed in it), the senders, and the files in
    scope as the analysis left them (a file libcst was not handed is marked not analysed)."""

    queues: list[tuple[QueueAnalysis, list[Problem]]]
    senders: list[SenderAnalysis]
    problems: list[Problem]
    files: list[SourceFile]
    marks: list[FileMark] = field(default_factory=list)  # what `files` were marked with (both processes')
    marks_here: int = 0  # how many of this process's index.marks were found by the end of the graph stage


@dataclass
class Checked:
    findings: list[Finding]
    queue_reports: list[QueueReport]
    problems: list[Problem]
    graphs: dict[str, dict[str, list]]  # each judged queue's graph, as plain data
    drawn: str | None  # the queue the diagrams show: the first (in the pack's order) with a pinned state


def parse(fetched: FetchResult, pack: Pack, root: str | None) -> Parsed:
    from kvtrace.scan import _in_scope, locate_packages, package_scope

    files = fetched.files
    if not files:
        raise InputError(f"{fetched.target}: no .py files found")
    candidates = locate_packages(files, pack, fetched.target)
    if root is None:
        if len(candidates) > 1:
            raise AmbiguousTarget(fetched.target, candidates)
        root = candidates[0]
    in_scope = _in_scope(files, pack, root, package_scope(root, candidates))
    parsing = parse_modules(in_scope)
    return Parsed(root, with_marks(in_scope, parsing.marks), parsing.modules)


def index(parsed: Parsed, pack: Pack, target: str) -> Indexed:
    from kvtrace.scan import _enum_unreadable_message

    index = Index(parsed.modules, parsed.root)
    enum = find_enum(index, pack)
    if enum is None:
        raise InputError(_enum_unreadable_message(target, pack, parsed.files))
    domain, enum_evidence = enum
    return Indexed(index, domain, enum_evidence)


def graph(parsed: Parsed, indexed: Indexed, pack: Pack, beside: type[Beside] = Beside,
          parallel_min_bytes: int = 0) -> Analysed:
    """The queues' and the senders' analyses; the senders, and a queue the parent has not started
    by the time they are done, in a forked child (`beside`) when the files in scope hold at least
    `parallel_min_bytes`."""
    index, domain, root, in_scope = indexed.index, indexed.domain, parsed.root, parsed.files
    queue_names = pack.queues or (pack.queue,)
    # The senders are analysed beside the queues (kvtrace.beside) when the work is worth a fork.
    # Work items: the senders (0..n-1), then the queues. The child takes the senders in order,
    # then any queue not yet taken; the parent the queues in order, then the senders not taken,
    # from the last: the two meet once instead of taking turns, so fewer senders pay in both
    # processes for the runs of the code they share (each process fills its own run memo). The
    # last sender left is the child's: it has those runs made, where the parent would start cold.
    big = sum(len(f.data) for f in in_scope) >= parallel_min_bytes
    first_queue = len(sender_classes(index, pack))
    claims = Claims(first_queue + len(queue_names))

    def take_queue(position: int) -> bool:
        return claims.claim(first_queue + position)

    try:
        with beside(lambda: _senders_out(index, pack, domain, root, claims.claim, take_queue), big) as child:
            queues: list[tuple[QueueAnalysis, list[Problem]] | None] = [
                _queue(index, pack.for_queue(name), domain) if take_queue(position) else None
                for position, name in enumerate(queue_names)]
            sender_problems: list[Problem] = []
            senders_left = functools.partial(claims.claim_unless_last, among=range(first_queue))
            mine = analyse_backends(index, pack, domain, root, sender_problems, senders_left, from_back=True) if child.forked else None
            from_child = child.result()
    finally:
        claims.close()
    marks: list[FileMark] = []
    explored: dict[int, QueueRecord] = {}
    if mine is not None and from_child is not None:
        childs = decode_record(from_child, SendersResult)
        senders = _senders_in(childs, index, pack) + mine
        sender_problems.extend(childs.problems)
        marks = childs.marks
        explored = {record.position: record for record in childs.queues}
        order = {id(c): i for i, c in enumerate(sender_classes(index, pack))}
        senders.sort(key=lambda s: order[id(s.cls)])
    else:  # one process (or the child failed: everything is done here)
        sender_problems = []
        senders = analyse_backends(index, pack, domain, root, sender_problems)
    # A queue the child took is assembled here from its exploration (or analysed here, when the
    # child did not send it).
    done = [found if found is not None else
            _queue(index, pack.for_queue(name), domain, _explored(explored[position]) if position in explored else None)
            for position, (name, found) in enumerate(zip(queue_names, queues))]
    marks = marks + index.marks
    # The problems in the same order whichever process met them.
    return Analysed(done, senders, sorted(sender_problems, key=lambda p: p.text), with_marks(in_scope, marks), marks,
                    len(index.marks))


def _queue(index: Index, queue_pack: Pack, domain: Domain,
           explored: Explored | None = None) -> tuple[QueueAnalysis, list[Problem]]:
    try:
        return analyse_queue(index, queue_pack, domain, explored), []
    except RecursionError:
        # Pathologically nested code: say so rather than guess (the scan is marked incomplete).
        return (QueueAnalysis(None, StateGraph(), {}, static_sites(index, queue_pack)),
                [Problem(ProblemKind.TOO_DEEP, f"the drain loop of {queue_pack.queue} is nested too deeply to analyse")])


def _judged(pack: Pack, names: tuple[str, ...], queues: list[tuple[QueueAnalysis, list[Problem]]],
            in_scope: list[SourceFile]) -> list[tuple[str, tuple[QueueAnalysis, list[Problem]]]]:
    """The queues to judge: the ones named with --queue; else the pack's, but one this code neither
    fills nor drains, that no file kvtrace read (parsed or not) names, with no caller out of view,
    is not in it (a tree that models only some of a role's queues): nothing to judge and nothing
    left unread. One is always kept, so a tree with none still says its queue is neither filled
    nor drained."""
    pairs = list(zip(names, queues))
    if pack.only:
        return [pair for pair in pairs if pair[0] in pack.only]
    if any(f.status in ("too-large", "unreadable", "skipped") for f in in_scope):
        return pairs  # a file whose bytes were not read may hold it
    unanalysed = [f.data for f in in_scope if f.status != "ok"]

    def present(name: str, queue: QueueAnalysis, problems: list[Problem]) -> bool:
        return bool(queue.drain is not None or queue.unparsed or queue.unseen_callers or problems
                    or any(s.kind is EventKind.ENTRY for s in queue.static_sites)
                    or any(name.encode() in data for data in unanalysed))
    return [pair for pair in pairs if present(pair[0], *pair[1])] or pairs[:1]


def checks(parsed: Parsed, indexed: Indexed, analysed: Analysed, pack: Pack, settings: Settings) -> Checked:
    from kvtrace.rules import ALL_RULES, ScanContext
    from kvtrace.rules.unused_suppression import UnusedSuppression
    from kvtrace.suppress import silence

    index, domain, senders, in_scope = indexed.index, indexed.domain, analysed.senders, analysed.files
    queue_names = pack.queues or (pack.queue,)
    problems: list[Problem] = []
    findings = []
    queue_reports = []
    graphs = []
    rules = [rule for rule in ALL_RULES if settings.wants_rule(rule.name, rule.code)]
    # A pack may name several queues (decode: prealloc and transfer); each is its own graph,
    # the backends are shared. Rules about the backends alone run once.
    unread = [f.path for f in in_scope if f.status != "ok"]
    for number, (name, (queue, queue_problems)) in enumerate(_judged(pack, queue_names, analysed.queues, in_scope)):
        queue_pack = pack.for_queue(name)
        problems.extend(queue_problems)
        entries = [s for s in queue.static_sites if s.kind is EventKind.ENTRY]
        model = ScanModel(queue, senders, domain)
        ctx = ScanContext(queue_pack, domain, index, model, entries,
                          [other for other, _ in analysed.queues if other is not queue], unread)
        for rule in rules:
            if rule.per_queue or number == 0:
                for f in rule().check(ctx):
                    if settings.wants_backend(f.backend):
                        f.queue = name if rule.per_queue else None  # one verdict grid per queue
                        findings.append(f)
        if queue.unparsed:
            # Never a silent skip, nor a confident "undrained": the scan is incomplete (exit 3).
            problems.append(Problem(ProblemKind.UNPARSED, f"could not be parsed with libcst, so the analysis of {name} is "
                                    "incomplete: " + ", ".join(queue.unparsed)))
        elif queue.drain is None and not queue.unseen_callers and (not entries or unread):
            cause = f" (files not analysed: {', '.join(unread[:3])}{' ...' if len(unread) > 3 else ''})" if unread else ""
            done = "filled but not drained" if entries else "neither filled nor drained"
            problems.append(Problem(ProblemKind.UNDRAINED, f"self.{name} is {done} in the analysed files{cause}"))
        problems.extend(Problem(ProblemKind.OUT_OF_VIEW, unseen) for unseen in queue.unseen_callers)
        limits = [t for t in queue.truncated if not isinstance(t, Cut)]
        if limits:
            problems.append(Problem(ProblemKind.PATH_LIMIT, "path limit reached (results may be incomplete) at " + ", ".join(limits),
                                    limits[0] if len(limits) == 1 else None))
        problems.extend(Problem(ProblemKind.CUT, f"analysis cut short (results may be incomplete) at {t}", t.where)
                        for t in queue.truncated if isinstance(t, Cut))
        queue_reports.append(_queue_report(queue_pack, model))
        graphs.append((name, queue))
    findings = silence(findings, index.modules, report_unused=UnusedSuppression in rules)
    findings.sort(key=lambda f: (f.path, f.line, f.rule, f.backend or "", f.state or ""))
    # Plain lists: reports go into the cache as JSON, without the analysis' types.
    # The diagrams show one queue: the first (in the pack's order) where a state is pinned, else
    # the first, so the pictures show the answer.
    pinned = {f.queue for f in findings if consequence_of(f.rule) is Consequence.PINNED}
    drawn = next((n for n, _ in graphs if n in pinned), graphs[0][0] if graphs else None)
    return Checked(findings, queue_reports, problems, {n: q.graph.as_data() for n, q in graphs}, drawn)


def report(fetched: FetchResult, parsed: Parsed, indexed: Indexed, analysed: Analysed, checked: Checked,
           settings: Settings) -> Report:
    from kvtrace.baseline import assign_roles
    from kvtrace.scan import detect_version

    senders = analysed.senders
    report = Report(
        target=fetched.target,
        # The graph stage's marks and any found after it, applied together (see with_marks).
        files=with_marks(parsed.files, analysed.marks + indexed.index.marks[analysed.marks_here:]),
        queues=checked.queue_reports,
        backends=[s.backend for s in senders if settings.wants_backend(s.backend.name)],
        findings=checked.findings,
        root=parsed.root,
        enum=indexed.enum,
        problems=analysed.problems + checked.problems + [Problem(ProblemKind.FETCH, note) for note in fetched.notes],
        version=detect_version(fetched.files, parsed.root, fetched.target),
        graphs=checked.graphs,
        drawn=checked.drawn,
    )
    report.gaps = find_gaps(report, indexed.enum.path, indexed.index)
    assign_roles(report)  # before caching: the fingerprints' site roles come from the release map
    found = {s.backend.name for s in senders}
    report.filters = Filters(settings.source, settings.select, settings.ignore,
                             tuple(sorted(found & set(settings.ignore_backends))),
                             tuple(sorted(set(settings.ignore_backends) - found)))
    return report


def _senders_out(index: Index, pack: Pack, domain: Domain, root: str, take: Callable[[int], bool],
                 take_queue: Callable[[int], bool]) -> bytes:
    """In the child: analyse the senders it claims, then explore the queues it claims; send the
    reports, the explorations, the problems met and the files found not analysable (a function
    too deep for libcst), as JSON data, never the trees."""

    problems: list[Problem] = []
    senders = analyse_backends(index, pack, domain, root, problems, take)
    queues = []
    for position, name in enumerate(pack.queues or (pack.queue,)):
        if take_queue(position):
            try:
                explored = explore_queue(index, pack.for_queue(name), domain)
            except RecursionError:
                continue  # the parent analyses it, and says why it could not
            if explored is not None:
                queues.append(_queue_record(position, explored))
    records = [SenderRecord((s.cls.path, s.cls.line), s.backend, (s.poll.path, s.poll.line) if s.poll else None,
                            list(s.raise_sites), list(s.absent_raise_sites),
                            (s.manager.cls.path, s.manager.cls.line) if s.manager else None,
                            s.other_mode_unknown) for s in senders]
    return encode_record(SendersResult(records, problems, index.marks, queues))


def _queue_record(position: int, explored: Explored) -> QueueRecord:
    mode_paths, truncated, unparsed = explored
    return QueueRecord(position, [
        {state: [PathRecord([EventRecord(e.kind, e.path, e.line, e.function, e.detail, e.after_loop) for e in path.events],
                            path.outcome) for path in paths] for state, paths in mode.items()}
        for mode in mode_paths], [CutRecord(t, t.kind, t.where, t.what) if isinstance(t, Cut) else CutRecord(t) for t in truncated],
        unparsed)


def _explored(record: QueueRecord) -> Explored:
    return ([{state: [QueuePath([Event(e.kind, e.path, e.line, e.function, e.detail, e.after_loop) for e in path.events],
                                path.outcome) for path in paths] for state, paths in mode.items()}
             for mode in record.modes], [Cut(t.kind, t.where, t.what) if t.kind else t.text for t in record.truncated],
            record.unparsed)


def _senders_in(result: SendersResult, index: Index, pack: Pack) -> list[SenderAnalysis]:
    """In the parent: the child's senders on the parent's own classes and functions (their
    managers' facts read again from the parent's index)."""

    classes = {(c.path, c.line): c for infos in index.classes.values() for c in infos}
    methods = {(f.path, f.line): f for c in classes.values() for f in c.methods.values()}
    return [SenderAnalysis(r.backend, classes[r.cls], methods[r.poll] if r.poll else None, r.raise_sites,
                           r.absent_raise_sites,
                           manager_facts(index, classes[r.manager], pack.check_method, pack.update_method) if r.manager
                           else None, r.other_mode_unknown)
            for r in result.senders]


def _queue_report(pack: Pack, model: ScanModel) -> QueueReport:
    modes = [ModeInfo(m.label, m.passed, m.callers) for m in model.queue.modes]
    return QueueReport(pack.queue, model.queue.drain_ref(), model.release_map(), model.state_fates(), modes)
