"""Runs the stages in order for one target; the only module that knows the order.

target -> fetch -> parse -> index -> graph -> checks -> report
"""

from __future__ import annotations

import re
from pathlib import Path

from kvtrace.backends import analyse_backends
from kvtrace.config import Settings
from kvtrace.rules import ALL_RULES, ScanContext
from kvtrace.errors import InputError
from kvtrace.fetch.local import fetch_local
from kvtrace.flow import NOT_SITES
from kvtrace.graph import QueueAnalysis, StateGraph, analyse_queue, find_enum, static_sites
from kvtrace.index import Index
from kvtrace.model import (
    OUTCOME_ORDER,
    Evidence,
    FetchLimits,
    FetchResult,
    QueueReport,
    Report,
    Site,
    SourceFile,
    StateFate,
)
from kvtrace.packs import Pack, load_pack
from kvtrace.parse import parse_modules
from kvtrace.rules.unused_suppression import UnusedSuppression
from kvtrace.suppress import silence


def scan_path(path: Path, pack: Pack | None = None, limits: FetchLimits = FetchLimits(),
              settings: Settings = Settings()) -> Report:
    return scan_fetched(fetch_local(path, limits), pack, settings)


def locate_package(files: list[SourceFile], pack: Pack, target: str) -> str:
    """The folder (relative to the target, '' for the target itself) that holds the package.

    Candidates are folders named like the pack's package_dir, or the target itself; the one that
    defines the poll enum wins, preferring one that also mentions the queue, then the shallowest.
    """
    enum_def = re.compile(rf"^\s*class\s+{re.escape(pack.enum)}\b", re.MULTILINE)
    dirs: set[str] = {""}
    for f in files:
        parts = f.path.split("/")[:-1]
        for i, part in enumerate(parts):
            if part == pack.package_dir:
                dirs.add("/".join(parts[: i + 1]))

    def inside(f: SourceFile, d: str) -> bool:
        return d == "" or f.path.startswith(d + "/")

    def score(d: str) -> tuple[int, int, int, int]:
        members = [f for f in files if inside(f, d)]
        has_enum = any(enum_def.search(f.text or "") for f in members)
        has_queue = any(q in (f.text or "") for f in members for q in pack.queues)
        named = d.rsplit("/", 1)[-1] == pack.package_dir or (d == "" and Path(target).name == pack.package_dir)
        return (has_enum, has_queue, named, -d.count("/") if d else 0)

    ranked = sorted(dirs, key=score, reverse=True)
    best = ranked[0]
    if not score(best)[0]:
        found = next((d for d in sorted(dirs) if d), None)
        if found is not None:
            raise InputError(f"{target}: found {found}/ but no `class {pack.enum}` in it (is base/conn.py missing?)")
        raise InputError(f"{target}: no {pack.package_dir}/ package with a `class {pack.enum}` found here")
    return best


def scan_fetched(fetched: FetchResult, pack: Pack | None = None, settings: Settings = Settings()) -> Report:
    pack = pack or load_pack()
    files = fetched.files
    if not files:
        raise InputError(f"{fetched.target}: no .py files found")
    root = locate_package(files, pack, fetched.target)
    in_scope = [f for f in files if (root == "" or f.path.startswith(root + "/"))
                or any(q in (f.text or "") for q in pack.queues)]
    modules = parse_modules(in_scope)
    index = Index(modules, root)
    enum = find_enum(index, pack)
    if enum is None:
        raise InputError(f"{fetched.target}: `class {pack.enum}` was found but could not be read (see file errors)")
    domain, enum_evidence = enum
    problems: list[str] = []
    senders = analyse_backends(index, pack, domain, root, problems)
    findings = []
    queue_reports = []
    rules = [rule for rule in ALL_RULES if settings.wants_rule(rule.name, rule.code)]
    # A pack may name several queues (decode: prealloc and transfer); each is its own graph,
    # the backends are shared. Rules about the backends alone run once.
    for number, name in enumerate(pack.queues or (pack.queue,)):
        queue_pack = pack.for_queue(name)
        try:
            queue = analyse_queue(index, queue_pack, domain)
        except RecursionError:
            # Pathologically nested code: say so rather than guess (the scan is marked incomplete).
            problems.append(f"the drain loop of {name} is nested too deeply to analyse")
            queue = QueueAnalysis(None, StateGraph(), {}, static_sites(index, queue_pack))
        entries = [s for s in queue.static_sites if s.kind == "entry"]
        ctx = ScanContext(queue_pack, domain, index, queue, senders, entries)
        findings += [f for rule in rules if rule.per_queue or number == 0 for f in rule().check(ctx)
                     if settings.wants_backend(f.backend)]
        if queue.drain is None and not entries:
            problems.append(f"self.{name} is neither filled nor drained in this tree")
        if queue.truncated:
            problems.append("path limit reached (results may be incomplete) at " + ", ".join(queue.truncated))
        queue_reports.append(_queue_report(queue_pack, domain.members, queue))
    findings = silence(findings, index.modules, report_unused=UnusedSuppression in rules)
    findings.sort(key=lambda f: (f.path, f.line, f.rule, f.backend or "", f.state or ""))
    problems.extend(fetched.notes)
    return Report(
        target=fetched.target,
        files=in_scope,
        queues=queue_reports,
        backends=[s.backend for s in senders if settings.wants_backend(s.backend.name)],
        findings=findings,
        root=root,
        enum=enum_evidence,
        problems=problems,
        # Plain lists: reports pickle into the cache and unpickle without the analysis' types.
        graph={"nodes": list(queue.graph.nodes.items()),
               "edges": [(a, b, data) for (a, b), data in queue.graph.edges.items()]},
    )


def _helpers_with_effects(site_states: dict[tuple[str, str, int], tuple[str, set[str], str]]) -> set[str]:
    """Functions that (directly or through the helpers they call) act on the request."""
    effectful = {function for (kind, _, _), (function, _, _) in site_states.items() if kind != "helper"}
    calls = [(function, detail) for (kind, _, _), (function, _, detail) in site_states.items() if kind == "helper"]
    changed = True
    while changed:
        changed = False
        for caller, callee in calls:
            if callee in effectful and caller not in effectful:
                effectful.add(caller)
                changed = True
    return effectful


def _queue_report(pack: Pack, members: tuple[str, ...], queue) -> QueueReport:
    order = {m: i for i, m in enumerate(members)}
    site_states: dict[tuple[str, str, int], tuple[str, set[str], str]] = {}
    states: dict[str, StateFate] = {}
    for state in members:
        evidence: dict[tuple[str, int], str] = {}
        for events, outcome in queue.paths.get(state, []):
            for e in events:
                if e.kind in NOT_SITES:
                    continue
                key = (e.kind, e.path, e.line)
                entry = site_states.setdefault(key, (e.function, set(), e.detail))
                if e.kind != "check" or e.detail == "T":
                    entry[1].add(state)
                note = {"T": "check: true", "F": "check: false"}.get(e.detail, f"{e.kind}: {e.detail}") \
                    if e.kind == "check" else f"{e.kind}: {e.detail}" if e.detail else e.kind
                evidence.setdefault((e.path, e.line), note)
            if queue.drain is not None and outcome == "dropped":
                # Nothing marks where a dropped request goes: point at the loop it falls out of.
                loop = (queue.drain.func.path, queue.drain.body.line(queue.drain.loop))
                evidence[loop] = "dropped: no keep, done, release or abort on this path"
        fate = queue.fate(state) if queue.drain is not None else []
        states[state] = StateFate(fate, [Evidence(p, l, n) for (p, l), n in sorted(evidence.items())])
    sites: list[Site] = list(queue.static_sites)
    drain = queue.drain
    if drain is not None and drain.poll_line is not None:
        sites.append(Site("poll", drain.func.path, drain.poll_line, drain.func.qualname))
    relevant = _helpers_with_effects(site_states)
    for (kind, path, line), (function, reached, detail) in site_states.items():
        if kind == "helper" and detail not in relevant:
            continue  # a helper that does nothing to the request is not part of the map
        note = detail if kind not in ("check",) else ""
        sites.append(Site(kind, path, line, function, tuple(sorted(reached, key=order.get)), note))
    unique = {(s.kind, s.path, s.line): s for s in sites}
    ordered = sorted(unique.values(), key=lambda s: (s.path, s.line, s.kind))
    drain_ref = Evidence(drain.func.path, drain.body.line(drain.loop), drain.func.qualname) if drain else None
    return QueueReport(pack.queue, drain_ref, ordered, states)


__all__ = ["scan_path", "scan_fetched", "locate_package", "OUTCOME_ORDER"]
