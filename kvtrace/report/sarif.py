"""SARIF 2.1.0 for code-scanning UIs: one run per report, one result per finding with its
evidence as a code flow, and an invocation that says whether the scan was complete.

File locations are relative to `root` (the current directory, or --sarif-root), because code
scanning places a result by its path from the repository root: `kvtrace scan python/sglang`
run at the top of a checkout writes `python/sglang/srt/...`. A target outside `root` has no
place in it: its locations are relative to the target folder (SRCROOT names it), never `../`. A remote target has no local
path: its locations stay relative to the remote folder, under the uriBaseId TARGET."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

from kvtrace import __version__
from kvtrace.baseline import SARIF_KEY, fingerprint, sarif_marks
from kvtrace.model import Evidence, Report
from kvtrace.report.verdicts import summary_line
from kvtrace.rulemeta import RULES, RuleMeta

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://pypi.org/project/kvtrace/"


def help_uri(rule_id: str) -> str:
    """The rule's section of the README (the project page on PyPI shows it)."""
    return f"{INFORMATION_URI}{__version__}/#rules"


def _rules() -> list[dict[str, Any]]:
    return [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": rule.docs},
            "helpUri": help_uri(rule.name),
            "help": {"text": rule.docs, "markdown": _markdown_help(rule)},
            "defaultConfiguration": {"level": rule.severity},
            "properties": {"tags": ["kvtrace", "reliability"]},
        }
        for rule in RULES
    ]


def _markdown_help(rule: RuleMeta) -> str:
    """The docstring's sections as Markdown: `What it does:` becomes a heading, indented
    paragraphs become text."""
    lines = []
    for raw in rule.docs.splitlines():
        stripped = raw.strip()
        if stripped.endswith(":") and not raw.startswith(" ") and len(stripped) < 40:
            lines.append(f"### {stripped[:-1]}")
        else:
            lines.append(stripped)
    return f"**{rule.code} {rule.name}** ({rule.severity}): {rule.title}\n\n" + "\n".join(lines)


class _Locator:
    """Turns a report path (relative to the scanned target) into a SARIF artifact location."""

    def __init__(self, report: Report, root: Path) -> None:
        from kvtrace.target import LocalTarget, parse_target

        self.prefix: str | None = None
        self.base: Path | None = None  # the folder SRCROOT names (root, or the target outside it)
        try:
            target = parse_target(report.target)
        except Exception:  # a label that no longer parses: keep target-relative paths
            target = None
        if isinstance(target, LocalTarget):
            base = target.path.parent if target.path.is_file() else target.path
            rel = os.path.relpath(base.resolve(), root.resolve())
            if rel == ".." or rel.startswith(".." + os.sep):
                # Outside the root no path from it is a place in the repository: the locations
                # are relative to the target itself, never climbing out of the root with `../`.
                self.base, self.prefix = base.resolve(), ""
            else:
                self.base = root.resolve()
                self.prefix = "" if rel == "." else PurePosixPath(Path(rel).as_posix()).as_posix() + "/"

    def __call__(self, path: str, line: int, message: str | None = None) -> dict[str, Any]:
        # SARIF requires a valid URI reference (RFC 3986): a space, '#', '%' or a non-ASCII
        # letter in a path is percent-encoded (UTF-8), '/' kept.
        if self.prefix is not None:
            artifact: dict[str, Any] = {"uri": quote(self.prefix + path, safe="/"), "uriBaseId": "SRCROOT"}
        else:
            artifact = {"uri": quote(path, safe="/"), "uriBaseId": "TARGET"}
        location: dict[str, Any] = {
            "physicalLocation": {"artifactLocation": artifact, "region": {"startLine": max(1, line)}}
        }
        if message:
            location["message"] = {"text": message}
        return location


def _located_marks(finding: Any, locate: _Locator) -> dict[str, Any]:
    """sarif_marks with the suppression comment's location made like every other one
    (relative to the SARIF root, percent-encoded)."""
    marks = sarif_marks(finding)
    for suppression in marks.get("suppressions", []):
        physical = suppression["location"]["physicalLocation"]
        suppression["location"] = {"physicalLocation": locate(
            physical["artifactLocation"]["uri"], physical["region"]["startLine"])["physicalLocation"]}
    return marks


def _flow(evidence: list[Evidence], locate: _Locator) -> dict[str, Any]:
    return {"threadFlows": [{"locations": [{"location": locate(e.path, e.line, e.note)} for e in evidence]}]}


def _invocation(report: Report, locate: _Locator) -> dict[str, Any]:
    notifications = []
    for gap in report.gaps:
        note: dict[str, Any] = {
            "level": "error",
            "message": {"text": f"{gap.kind} {gap.place}: {gap.why}" if gap.kind != "analysis" else gap.reason},
            "descriptor": {"id": f"kvtrace/incomplete/{gap.kind}"},
        }
        if gap.kind == "file":
            note["locations"] = [{"physicalLocation": locate(gap.subject, gap.line or 1)["physicalLocation"]}]
        notifications.append(note)
    return {
        "executionSuccessful": not report.incomplete,
        "toolExecutionNotifications": notifications,
        "properties": {"summary": summary_line(report),
                       **({"filters": report.filters.describe()} if report.filters.active else {})},
    }


def to_sarif(reports: list[Report], root: Path | None = None) -> dict[str, Any]:
    root = root or Path.cwd()
    rules = _rules()
    rule_index = {rule.name: i for i, rule in enumerate(RULES)}
    runs = []
    for report in reports:
        locate = _Locator(report, root)
        results = []
        for f in report.findings:
            result: dict[str, Any] = {
                "ruleId": f.code,
                "ruleIndex": rule_index[f.rule],
                "level": f.severity,
                "message": {"text": f.message},
                "locations": [locate(f.path, f.line)],
                "partialFingerprints": {"kvtrace/v1": f"{f.rule}:{f.backend or '-'}:{f.state or '-'}",
                                        SARIF_KEY: str(fingerprint(f))},
                "properties": {"rule": f.rule, "backend": f.backend, "state": f.state, "queue": f.queue, "function": f.function,
                               "premise": f.premise, "premise_kinds": [kind.value for kind in f.premise_kinds]},
                **_located_marks(f, locate),
            }
            if f.evidence:
                result["codeFlows"] = [_flow(f.evidence, locate)]
            results.append(result)
        base_ids: dict[str, Any] = {}
        if locate.base is not None:
            what = "(--sarif-root)" if locate.base == root.resolve() else "(the scanned folder, outside --sarif-root)"
            base_ids["SRCROOT"] = {"uri": locate.base.as_uri() + "/",
                                   "description": {"text": f"the folder locations are relative to {what}"}}
        else:
            base_ids["TARGET"] = {"description": {"text": f"the scanned remote folder {report.target}"}}
        runs.append({
            "tool": {"driver": {"name": "kvtrace", "version": __version__, "semanticVersion": __version__,
                                "informationUri": INFORMATION_URI, "rules": rules}},
            "invocations": [_invocation(report, locate)],
            "originalUriBaseIds": base_ids,
            "results": results,
            "properties": {"target": report.target, "package": report.root,
                           **({"version": f"{report.version.package} {report.version.version}"}
                              if report.version else {})},
        })
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": runs}


def render(reports: list[Report], root: Path | None = None) -> str:
    return json.dumps(to_sarif(reports, root), indent=2) + "\n"
