"""Runs the stages in order for one target; the only module that knows the order.

target -> fetch -> parse -> index -> graph -> checks -> report
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kvtrace.beside import Beside, Claims
from kvtrace.config import Settings
from kvtrace.errors import AmbiguousTarget, InputError
from kvtrace.fetch.local import fetch_local
from kvtrace.fetch.select import Wanted, defining_files, inside as _inside, named_folders, outermost
from kvtrace.model import (
    OUTCOME_ORDER,
    DetectedVersion,
    EventKind,
    FetchLimits,
    FetchResult,
    Filters,
    ModeInfo,
    QueueReport,
    Report,
    SourceFile,
)
from kvtrace.packs import Pack, load_pack

if TYPE_CHECKING:
    from kvtrace.backends import SenderAnalysis
    from kvtrace.graph import ScanModel
    from kvtrace.index import Index
    from kvtrace.states import Domain

# Trees smaller than this are analysed in one process: a fork and its pickles cost ~10 ms, the
# senders of a small tree less. SGLang's disaggregation/ is 0.8-1.5 MB.
PARALLEL_MIN_BYTES = 200_000


def scan_path(path: Path, pack: Pack | None = None, limits: FetchLimits = FetchLimits(),
              settings: Settings = Settings()) -> Report:
    return scan_fetched(fetch_local(path, limits), pack, settings)


def locate_packages(files: list[SourceFile], pack: Pack, target: str) -> list[str]:
    """Every package folder under the target (relative to it, '' for the target itself), sorted.

    A candidate is a folder named like the pack's package_dir (or the target itself when it is
    so named) that defines the poll enum; one inside another candidate is part of it. With no
    such folder, the target itself counts when it defines the enum (a fork that renamed the
    folder). The result depends only on the file paths and contents, never on hash order.
    """
    named = named_folders([f.path for f in files], pack.package_dir, target)
    defining = defining_files(files, Wanted.from_pack(pack))
    found = outermost(named, defining)
    if found:
        return found
    if defining:
        return [""]
    raise InputError(_no_package_message(files, pack, target, sorted(named)))


def _no_package_message(files: list[SourceFile], pack: Pack, target: str, named: list[str]) -> str:
    """Why no package was found, from what was actually read (never a guess about a file)."""
    where = [d for d in named if d] or ([""] if named else [])
    scope = [f for f in files if any(_inside(f.path, d) for d in where)] if where else files
    unread = [f for f in scope if f.status != "ok" or f.text is None]
    if where:
        head = f"{target}: found {', '.join(d + '/' for d in where) if where != [''] else 'the package'}"
    else:
        head = f"{target}: no {pack.package_dir}/ package found"
    if unread:
        counts: dict[str, int] = {}
        for f in unread:
            counts[f.status] = counts.get(f.status, 0) + 1
        tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        first = unread[0]
        return (f"{head} but could not read `class {pack.enum}`: {len(unread)} of {len(scope)} files "
                f"not read ({tally}; e.g. {first.path}: {first.error or first.status})")
    if not scope:
        return f"{head}; it holds no .py files"
    listed = ", ".join(f.path for f in scope[:4]) + (f" and {len(scope) - 4} more" if len(scope) > 4 else "")
    return f"{head}; none of its {len(scope)} .py files ({listed}) defines `class {pack.enum}`"


def _status_reason(f: SourceFile) -> str:
    return f"{f.status}: {f.error}" if f.error else f.status


def locate_package(files: list[SourceFile], pack: Pack, target: str) -> str:
    """The one package folder under the target; several are an error that lists them."""
    found = locate_packages(files, pack, target)
    if len(found) > 1:
        raise AmbiguousTarget(target, found)
    return found[0]


def package_scope(root: str, candidates: list[str]) -> str:
    """The widest folder around `root` that holds no other candidate package: files outside the
    package that mention the queue are taken from there, so two side-by-side trees never mix."""
    parts = root.split("/") if root else []
    scope = root
    for i in range(len(parts) - 1, -1, -1):
        ancestor = "/".join(parts[:i])
        if any(c != root and _inside(c, ancestor) for c in candidates):
            break
        scope = ancestor
    return scope


# `__version__ = "0.5.2"`, `__version__: str = ...`, and setuptools-scm's generated
# `__version__ = version = '0.5.14'` (whose version.py only imports it from _version.py).
_VERSION = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*(?:\w+\s*=\s*)*["']([^"'\n]+)["']""", re.MULTILINE)


def detect_version(files: list[SourceFile], root: str, target: str = "") -> DetectedVersion | None:
    """The `__version__` of the nearest version.py (or setuptools-scm's _version.py) in a
    folder above the package (as in a wheel or a checkout: sglang/version.py above
    sglang/srt/disaggregation)."""
    by_path = {f.path: f for f in files}
    parts = root.split("/") if root else []
    for i in range(len(parts) - 1, -1, -1):
        folder = "/".join(parts[:i])
        for name in ("version.py", "_version.py"):
            path = f"{folder}/{name}" if folder else name
            source = by_path.get(path)
            match = _VERSION.search(source.text or "") if source is not None else None
            if match:
                break
        if source is not None and match:
            line = (source.text or "").count("\n", 0, match.start()) + 1
            # The folder holding it names the package; at the top, the target's own name.
            top = target.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1] or "package"
            package = parts[i - 1] if i > 0 else top
            return DetectedVersion(package, match.group(1), path, line)
    return None


def _in_scope(files: list[SourceFile], pack: Pack, root: str, scope: str) -> list[SourceFile]:
    """The package's files, plus files around it that mention the queue. A file whose content
    could not be read is kept when it may mention the queue, so the report says it was missed."""
    queues = [q.encode() for q in pack.queues or (pack.queue,)]

    def wanted(f: SourceFile) -> bool:
        if _inside(f.path, root):
            return True
        if not _inside(f.path, scope):
            return False
        if f.status in ("too-large", "unreadable", "skipped"):
            return True
        return any(q in f.data for q in queues)

    return [f for f in files if wanted(f)]


def scan_fetched(fetched: FetchResult, pack: Pack | None = None, settings: Settings = Settings(),
                 root: str | None = None) -> Report:
    """Analyse one package of the fetched tree: `root` (from locate_packages), or the only one."""
    # The analysis stages (the rules, the index, libcst under them) are imported here, not with the
    # module: a rescan served from the cache only locates the package (locate_packages).
    from kvtrace.backends import analyse_backends, sender_classes
    from kvtrace.gaps import Cut, find_gaps
    from kvtrace.graph import QueueAnalysis, ScanModel, StateGraph, analyse_queue, find_enum, static_sites
    from kvtrace.index import Index
    from kvtrace.parse import parse_modules
    from kvtrace.rules import ALL_RULES, ScanContext
    from kvtrace.rules.unused_suppression import UnusedSuppression
    from kvtrace.suppress import silence
    from kvtrace.baseline import assign_roles

    pack = pack or load_pack()
    files = fetched.files
    if not files:
        raise InputError(f"{fetched.target}: no .py files found")
    candidates = locate_packages(files, pack, fetched.target)
    if root is None:
        if len(candidates) > 1:
            raise AmbiguousTarget(fetched.target, candidates)
        root = candidates[0]
    in_scope = _in_scope(files, pack, root, package_scope(root, candidates))
    modules = parse_modules(in_scope)
    index = Index(modules, root)
    enum = find_enum(index, pack)
    if enum is None:
        raise InputError(_enum_unreadable_message(fetched.target, pack, in_scope))
    domain, enum_evidence = enum
    problems: list[str] = []
    queue_names = pack.queues or (pack.queue,)
    # The senders are analysed beside the queue (kvtrace.beside) when the work is worth a fork:
    # the child takes them in order, the parent the ones it has not started once the queue is done.
    big = sum(len(f.data) for f in in_scope) >= PARALLEL_MIN_BYTES
    before = {f.path: (f.status, f.error) for f in in_scope}
    claims = Claims(len(sender_classes(index, pack)))
    try:
        with Beside(lambda: _senders_out(index, pack, domain, root, in_scope, before, claims.claim), big) as child:
            queues: list[tuple[QueueAnalysis, list[str]]] = []
            for name in queue_names:
                queue_pack = pack.for_queue(name)
                try:
                    queues.append((analyse_queue(index, queue_pack, domain), []))
                except RecursionError:
                    # Pathologically nested code: say so rather than guess (the scan is marked incomplete).
                    queues.append((QueueAnalysis(None, StateGraph(), {}, static_sites(index, queue_pack)),
                                   [f"the drain loop of {name} is nested too deeply to analyse"]))
            sender_problems: list[str] = []
            mine = analyse_backends(index, pack, domain, root, sender_problems, claims.claim) if child.forked else None
            from_child = child.result()
    finally:
        claims.close()
    if mine is not None and from_child is not None:
        senders = _senders_in(from_child, index, pack, in_scope, before, sender_problems) + mine
        order = {id(c): i for i, c in enumerate(sender_classes(index, pack))}
        senders.sort(key=lambda s: order[id(s.cls)])
    else:  # one process (or the child failed: everything is done here)
        sender_problems = []
        senders = analyse_backends(index, pack, domain, root, sender_problems)
    problems.extend(sorted(sender_problems))  # the same order whichever process met them
    findings = []
    queue_reports = []
    rules = [rule for rule in ALL_RULES if settings.wants_rule(rule.name, rule.code)]
    # A pack may name several queues (decode: prealloc and transfer); each is its own graph,
    # the backends are shared. Rules about the backends alone run once.
    for number, (name, (queue, queue_problems)) in enumerate(zip(queue_names, queues)):
        queue_pack = pack.for_queue(name)
        problems.extend(queue_problems)
        entries = [s for s in queue.static_sites if s.kind is EventKind.ENTRY]
        model = ScanModel(queue, senders, domain)
        ctx = ScanContext(queue_pack, domain, index, model, entries)
        for rule in rules:
            if rule.per_queue or number == 0:
                for f in rule().check(ctx):
                    if settings.wants_backend(f.backend):
                        f.queue = name if rule.per_queue else None  # one verdict grid per queue
                        findings.append(f)
        if queue.unparsed:
            # Never a silent skip, nor a confident "undrained": the scan is incomplete (exit 3).
            problems.append(f"could not be parsed with libcst, so the analysis of {name} is incomplete: "
                            + ", ".join(queue.unparsed))
        elif queue.drain is None and not entries and not queue.unseen_callers:
            unread = [f.path for f in in_scope if f.status != "ok"]
            cause = f" (files not analysed: {', '.join(unread[:3])}{' ...' if len(unread) > 3 else ''})" if unread else ""
            problems.append(f"self.{name} is neither filled nor drained in the analysed files{cause}")
        problems.extend(queue.unseen_callers)
        limits = [t for t in queue.truncated if not isinstance(t, Cut)]
        if limits:
            problems.append("path limit reached (results may be incomplete) at " + ", ".join(limits))
        problems.extend(f"analysis cut short (results may be incomplete) at {t}" for t in queue.truncated if isinstance(t, Cut))
        queue_reports.append(_queue_report(queue_pack, model))
    findings = silence(findings, index.modules, report_unused=UnusedSuppression in rules)
    findings.sort(key=lambda f: (f.path, f.line, f.rule, f.backend or "", f.state or ""))
    problems.extend(fetched.notes)
    report = Report(
        target=fetched.target,
        files=in_scope,
        queues=queue_reports,
        backends=[s.backend for s in senders if settings.wants_backend(s.backend.name)],
        findings=findings,
        root=root,
        enum=enum_evidence,
        problems=problems,
        version=detect_version(files, root, fetched.target),
        # Plain lists: reports pickle into the cache and unpickle without the analysis' types.
        graph={**queue.graph.as_data(), "queue": name},  # the last queue's graph, named
    )
    report.gaps = find_gaps(report, enum_evidence.path, index)
    assign_roles(report)  # before caching: the fingerprints' site roles come from the release map
    found = {s.backend.name for s in senders}
    report.filters = Filters(settings.source, settings.select, settings.ignore,
                             tuple(sorted(found & set(settings.ignore_backends))),
                             tuple(sorted(set(settings.ignore_backends) - found)))
    return report


def _senders_out(index: Index, pack: Pack, domain: Domain, root: str, files: list[SourceFile],
                 before: dict[str, tuple[str, str | None]], take: Callable[[int], bool]) -> bytes:
    """In the child: analyse the senders it claims; send the reports, the problems met and the
    files whose status changed (a function too deep for libcst marks its file), never the trees."""
    from kvtrace.backends import analyse_backends

    problems: list[str] = []
    senders = analyse_backends(index, pack, domain, root, problems, take)
    found = [((s.cls.path, s.cls.line), s.backend, (s.poll.path, s.poll.line) if s.poll else None, s.raise_sites,
              s.absent_raise_sites, (s.manager.cls.path, s.manager.cls.line) if s.manager else None) for s in senders]
    changed = {f.path: (f.status, f.error) for f in files if (f.status, f.error) != before[f.path]}
    import pickle

    return pickle.dumps((found, problems, changed), protocol=pickle.HIGHEST_PROTOCOL)


def _senders_in(data: bytes, index: Index, pack: Pack, files: list[SourceFile],
                before: dict[str, tuple[str, str | None]], problems: list[str]) -> list[SenderAnalysis]:
    """In the parent: the child's senders on the parent's own classes and functions (their
    managers' facts read again from the parent's index), with everything else as one process
    would have left it (senders first, then the queue)."""
    from kvtrace.backends import SenderAnalysis
    from kvtrace.managers import manager_facts

    import pickle

    found, child_problems, changed = pickle.loads(data)
    mine = {f.path: (f.status, f.error) for f in files if (f.status, f.error) != before[f.path]}
    by_path = {f.path: f for f in files}
    for path, (status, error) in {**changed, **mine}.items():
        by_path[path].status, by_path[path].error = status, error
    problems.extend(child_problems)
    classes = {(c.path, c.line): c for infos in index.classes.values() for c in infos}
    methods = {(f.path, f.line): f for c in classes.values() for f in c.methods.values()}
    return [SenderAnalysis(backend, classes[cls], methods[poll] if poll else None, raise_sites, absent,
                           manager_facts(index, classes[manager], pack.check_method, pack.update_method) if manager else None)
            for cls, backend, poll, raise_sites, absent, manager in found]


def _enum_unreadable_message(target: str, pack: Pack, files: list[SourceFile]) -> str:
    enum_def = re.compile(rf"^\s*class\s+{re.escape(pack.enum)}\b", re.MULTILINE)
    where = [f for f in files if enum_def.search(f.text or "")]
    detail = "; ".join(f"{f.path}: {_status_reason(f)}" for f in where if f.status != "ok")
    return f"{target}: `class {pack.enum}` could not be read" + (f" ({detail})" if detail else " (it has no members)")


def _queue_report(pack: Pack, model: ScanModel) -> QueueReport:
    modes = [ModeInfo(m.label, m.passed, m.callers) for m in model.queue.modes]
    return QueueReport(pack.queue, model.queue.drain_ref(), model.release_map(), model.state_fates(), modes)


__all__ = ["scan_path", "scan_fetched", "locate_package", "locate_packages", "OUTCOME_ORDER"]
