"""SARIF 2.1.0 for code-scanning UIs: one result per finding, its evidence as a code flow."""

from __future__ import annotations

import json
from typing import Any

from kvtrace import __version__
from kvtrace.baseline import SARIF_KEY, fingerprint, sarif_marks
from kvtrace.rules import ALL_RULES
from kvtrace.model import Evidence, Report

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


def _location(path: str, line: int, message: str | None = None) -> dict[str, Any]:
    location: dict[str, Any] = {
        "physicalLocation": {
            "artifactLocation": {"uri": path, "uriBaseId": "SRCROOT"},
            "region": {"startLine": max(1, line)},
        }
    }
    if message:
        location["message"] = {"text": message}
    return location


def _flow(evidence: list[Evidence]) -> dict[str, Any]:
    return {"threadFlows": [{"locations": [{"location": _location(e.path, e.line, e.note)} for e in evidence]}]}


def to_sarif(reports: list[Report]) -> dict[str, Any]:
    rules = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary()},
            "fullDescription": {"text": rule.docs()},
            "help": {"text": rule.docs()},
            "defaultConfiguration": {"level": rule.severity},
        }
        for rule in ALL_RULES
    ]
    rule_index = {rule.name: i for i, rule in enumerate(ALL_RULES)}
    runs = []
    for report in reports:
        results = []
        for f in report.findings:
            result: dict[str, Any] = {
                "ruleId": f.code,
                "ruleIndex": rule_index[f.rule],
                "level": f.severity,
                "message": {"text": f.message},
                "locations": [_location(f.path, f.line)],
                "partialFingerprints": {"kvtrace/v1": f"{f.rule}:{f.backend or '-'}:{f.state or '-'}",
                                        SARIF_KEY: str(fingerprint(f))},
                "properties": {"rule": f.rule, "backend": f.backend, "state": f.state, "function": f.function},
                **sarif_marks(f),
            }
            if f.evidence:
                result["codeFlows"] = [_flow(f.evidence)]
            results.append(result)
        runs.append({
            "tool": {"driver": {"name": "kvtrace", "version": __version__,
                                "informationUri": "https://pypi.org/project/kvtrace/", "rules": rules}},
            "originalUriBaseIds": {"SRCROOT": {"description": {"text": f"the scanned target {report.target}"}}},
            "results": results,
            "properties": {"target": report.target},
        })
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": runs}


def render(reports: list[Report]) -> str:
    return json.dumps(to_sarif(reports), indent=2) + "\n"
