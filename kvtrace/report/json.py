"""The kvtrace/2 JSON contract: one document for any number of targets,
`{"schema": "kvtrace/2", "kvtrace": VERSION, "reports": [REPORT, ...]}`. Field names and meanings
are documented in README.md and in `kvtrace schema`; additions are backwards compatible, renames
bump the schema version. (kvtrace/1, before: a bare REPORT for one target, a list for several.)"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from kvtrace import __version__
from kvtrace.baseline import finding_marks
from kvtrace.model import Evidence, ManagerRef, Report
from kvtrace.report.verdicts import summary_line

SCHEMA = "kvtrace/2"


def _evidence(items: list[Evidence]) -> list[dict[str, Any]]:
    return [{"path": e.path, "line": e.line, "note": e.note} for e in items]


def _manager(m: ManagerRef | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {"name": m.name, "path": m.path, "line": m.line, "found_by": m.found_by, "table": m.table,
            "holds": list(m.holds), "unknown": list(m.unknown), "clears": _evidence(list(m.clears)),
            "runs": list(m.runs)}


def to_json_dict(report: Report) -> dict[str, Any]:
    """One report (one package of one target)."""
    return {
        "schema": SCHEMA,
        "target": report.target,
        "root": report.root,
        "version": asdict(report.version) if report.version else None,
        "complete": not report.incomplete,
        "summary": summary_line(report),
        "gaps": [{"kind": g.kind, "subject": g.subject, "reason": g.reason, **({"line": g.line} if g.line else {})}
                 for g in report.gaps],
        "enum": _evidence([report.enum])[0] if report.enum else None,
        "files": [
            {"path": f.path, "sha256": f.sha256, "status": f.status, "error": f.error} for f in report.files
        ],
        "queues": [
            {
                "name": q.name,
                "drain": _evidence([q.drain])[0] if q.drain else None,
                "sites": [
                    {"kind": s.kind, "path": s.path, "line": s.line, "function": s.function,
                     "states": list(s.states), **({"note": s.note} if s.note else {}),
                     **({"mode": s.mode} if s.mode else {})}
                    for s in q.sites
                ],
                "states": {
                    name: {"fate": fate.fate, "evidence": _evidence(fate.evidence),
                           "modes": [{"mode": m.mode, "fate": m.fate, "then": m.then, "waits": _evidence(m.waits)}
                                     for m in fate.modes]}
                    for name, fate in q.states.items()
                },
                "modes": [{"label": m.label, "passed": list(m.passed), "callers": _evidence(list(m.callers))}
                          for m in q.modes],
            }
            for q in report.queues
        ],
        "backends": [
            {
                "name": b.name,
                "sender": b.sender,
                "path": b.path,
                "line": b.line,
                "poll": asdict(b.poll) if b.poll else None,
                "returns": b.returns,
                "reads_abort_state": b.reads_abort_state,
                "abort_state": b.abort_state,
                "has_abort": b.has_abort,
                "timeouts": [{"path": t.path, "line": t.line, "covers": list(t.covers)} for t in b.timeouts],
                "notes": b.notes,
                "returns_unknown": list(dict.fromkeys(b.returns_unknown)),
                "manager": _manager(b.manager),
                "verdicts": {
                    state: {"way_out": v.way_out.value, "how": v.how, "chain": _evidence(list(v.chain))}
                    for state, v in b.verdicts.items()
                },
            }
            for b in report.backends
        ],
        "findings": [
            {
                "rule": f.rule,
                "id": f.code,
                "severity": f.severity,
                "message": f.message,
                "path": f.path,
                "line": f.line,
                "backend": f.backend,
                "state": f.state,
                "queue": f.queue,
                "evidence": _evidence(f.evidence),
                "premise": f.premise,
                "premise_kinds": [kind.value for kind in f.premise_kinds],
                **finding_marks(f),
            }
            for f in report.findings
        ],
        "problems": [problem.text for problem in report.problems],
        "filters": {"config": report.filters.config, "select": list(report.filters.select),
                    "ignore": list(report.filters.ignore),
                    "ignored_backends": list(report.filters.ignored_backends),
                    "unknown_backends": list(report.filters.unknown_backends)},
        **report.host_facts,  # host, sglang_version, metrics (kvtrace.fleet)
    }


def to_document(reports: list[Report]) -> dict[str, Any]:
    return {"schema": SCHEMA, "kvtrace": __version__, "reports": [to_json_dict(r) for r in reports]}


def render(reports: list[Report]) -> str:
    """One document whatever the number of targets (each package scanned is one report)."""
    return json.dumps(to_document(reports), indent=2) + "\n"
