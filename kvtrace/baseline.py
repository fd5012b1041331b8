"""Baselines: fail only on findings a change introduced.

A finding's fingerprint is (rule, backend, state, function) — never a line number, so code added
above a function, or a reformat, leaves every fingerprint as it was. A baseline is any earlier
kvtrace JSON report (kvtrace/1 or kvtrace/2) or SARIF log; `--write-baseline` writes the JSON.
Findings matched in it are marked `unchanged`, shown and counted, but do not fail the scan.
Matching counts: two identical fingerprints in the scan need two in the baseline.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from kvtrace.errors import InputError
from kvtrace.model import Finding
from kvtrace.userfiles import checked, load_json

SARIF_KEY = "kvtrace/v2"  # partialFingerprints key; v1 (rule:backend:state) had no function


@dataclass(frozen=True)
class Fingerprint:
    rule: str
    backend: str | None
    state: str | None
    function: str | None  # None in a baseline written before findings carried it: matches any

    def __str__(self) -> str:
        return "|".join(part or "-" for part in (self.rule, self.backend, self.state, self.function))

    @classmethod
    def parse(cls, text: str) -> "Fingerprint":
        parts = text.split("|")
        if len(parts) != 4 or not parts[0]:
            raise ValueError(text)
        rule, backend, state, function = (None if p == "-" else p for p in parts)
        return cls(rule or "", backend, state, function)

    def loose(self) -> "Fingerprint":
        return Fingerprint(self.rule, self.backend, self.state, None)


def fingerprint(finding: Finding) -> Fingerprint:
    return Fingerprint(finding.rule, finding.backend, finding.state, finding.function)


@dataclass
class BaselineResult:
    unchanged: int
    new: int
    gone: list[Fingerprint]  # in the baseline, not found any more (fixed, or renamed)


_OPTIONAL_TEXT = {"type": ["string", "null"]}
_BASELINE_FINDING = {
    "type": "object",
    "required": ["rule"],
    "properties": {"rule": {"type": "string", "minLength": 1}, "fingerprint": {"type": "string"},
                   "backend": _OPTIONAL_TEXT, "state": _OPTIONAL_TEXT, "function": _OPTIONAL_TEXT,
                   "suppressed": _OPTIONAL_TEXT},
}
_BASELINE_REPORT = {"type": "object", "required": ["findings"],
                    "properties": {"findings": {"type": "array", "items": _BASELINE_FINDING}}}
# What a baseline must hold, by the form it takes (the keys _from_json and _from_sarif read; other
# keys of a report are left to the report's own schema). Tests check these with jsonschema.
BASELINE_SCHEMAS: dict[str, dict[str, Any]] = {
    "kvtrace/2": {"type": "object", "required": ["reports"],
                  "properties": {"reports": {"type": "array", "items": _BASELINE_REPORT}}},
    "kvtrace/1 list": {"type": "array", "items": _BASELINE_REPORT},
    "kvtrace/1": _BASELINE_REPORT,
    "sarif": {"type": "object", "required": ["runs"], "properties": {"runs": {"type": "array", "items": {
        "type": "object",
        "properties": {"results": {"type": "array", "items": {
            "type": "object",
            "required": ["ruleId"],
            "properties": {
                "ruleId": {"type": "string", "minLength": 1},
                "suppressions": {"type": "array"},
                "partialFingerprints": {"type": "object", "additionalProperties": {"type": "string"}},
                "properties": {"type": "object", "properties": {"backend": _OPTIONAL_TEXT, "state": _OPTIONAL_TEXT}},
            },
        }}},
    }}}},
}


def baseline_form(data: Any) -> str | None:
    """Which of BASELINE_SCHEMAS a parsed baseline claims to be (None: none of them)."""
    if isinstance(data, dict) and "runs" in data:
        return "sarif"
    if isinstance(data, dict) and "reports" in data:
        return "kvtrace/2"
    if isinstance(data, list):
        return "kvtrace/1 list"
    if isinstance(data, dict) and "findings" in data:
        return "kvtrace/1"
    return None


def load(path: Path) -> Counter[Fingerprint]:
    """The fingerprints of the unsuppressed findings in a kvtrace JSON report or a SARIF log
    (read bounded, checked against BASELINE_SCHEMAS before any of it is used)."""
    label = f"baseline {path}"
    data = load_json(path, "baseline")
    form = baseline_form(data)
    if form is None:
        raise InputError(f"{label}: not a kvtrace JSON report or SARIF log (no reports, findings or runs)")
    checked(data, BASELINE_SCHEMAS[form], f"{label}: not a kvtrace JSON report or SARIF log")
    try:
        found = list(_from_sarif(data) if form == "sarif" else _from_json(data))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{label}: not a kvtrace JSON report or SARIF log ({type(exc).__name__}: {exc})") from None
    return Counter(found)


def _from_json(data: Any) -> Iterable[Fingerprint]:
    if isinstance(data, dict) and "reports" in data:  # kvtrace/2
        reports = data["reports"]
    elif isinstance(data, list):  # kvtrace/1, several targets
        reports = data
    elif isinstance(data, dict) and "findings" in data:  # kvtrace/1, one target
        reports = [data]
    else:
        raise ValueError("no `reports` or `findings`")
    for report in reports:
        for f in report["findings"]:
            if f.get("suppressed"):
                continue
            if "fingerprint" in f:
                yield Fingerprint.parse(f["fingerprint"])
            else:
                yield Fingerprint(f["rule"], f.get("backend"), f.get("state"), f.get("function"))


def _from_sarif(data: dict[str, Any]) -> Iterable[Fingerprint]:
    for run in data["runs"]:
        for result in run.get("results", []):
            if result.get("suppressions"):
                continue
            prints = result.get("partialFingerprints", {})
            if SARIF_KEY in prints:
                yield Fingerprint.parse(prints[SARIF_KEY])
            else:
                props = result.get("properties", {})
                yield Fingerprint(result["ruleId"], props.get("backend"), props.get("state"), None)


def apply(findings: list[Finding], baseline: Counter[Fingerprint]) -> BaselineResult:
    """Mark each unsuppressed finding `unchanged` (in the baseline) or `new`."""
    exact = Counter({fp: n for fp, n in baseline.items() if fp.function is not None})
    loose = Counter({fp: n for fp, n in baseline.items() if fp.function is None})
    result = BaselineResult(0, 0, [])
    for finding in findings:
        if finding.suppressed:
            continue
        fp = fingerprint(finding)
        for pool, key in ((exact, fp), (loose, fp.loose())):
            if pool[key] > 0:
                pool[key] -= 1
                finding.baseline = "unchanged"
                result.unchanged += 1
                break
        else:
            finding.baseline = "new"
            result.new += 1
    result.gone = sorted((exact + loose).elements(), key=str)
    return result


def counts_against(finding: Finding) -> bool:
    """Whether a finding may fail the scan: not silenced in the code, not in the baseline."""
    return not finding.suppressed and finding.baseline != "unchanged"


def finding_marks(finding: Finding) -> dict[str, Any]:
    """The JSON fields this module adds to a finding (documented in `kvtrace schema`)."""
    marks: dict[str, Any] = {"function": finding.function, "fingerprint": str(fingerprint(finding))}
    if finding.suppressed:
        marks["suppressed"] = finding.suppressed
    if finding.baseline:
        marks["baseline"] = finding.baseline
    return marks


def sarif_marks(finding: Finding) -> dict[str, Any]:
    """SARIF result fields: the fingerprint, `suppressions` (inSource), `baselineState`."""
    path, _, line = (finding.suppressed or "").rpartition(":")
    marks: dict[str, Any] = {}
    if finding.suppressed:
        marks["suppressions"] = [{
            "kind": "inSource", "status": "accepted",
            "location": {"physicalLocation": {"artifactLocation": {"uri": path, "uriBaseId": "SRCROOT"},
                                              "region": {"startLine": int(line)}}},
        }]
    if finding.baseline:
        marks["baselineState"] = finding.baseline
    return marks


def mark(finding: Finding) -> str:
    """A short tag for reports: why this finding does not fail the scan (or that it is new)."""
    if finding.suppressed:
        return f"suppressed at {finding.suppressed}"
    return {"unchanged": "in baseline", "new": "new"}.get(finding.baseline or "", "")


def tally(findings: list[Finding]) -> str:
    """`2 suppressed, 1 in baseline` (empty when neither applies), for summary lines."""
    suppressed = sum(1 for f in findings if f.suppressed)
    unchanged = sum(1 for f in findings if not f.suppressed and f.baseline == "unchanged")
    parts = [f"{suppressed} suppressed"] * bool(suppressed) + [f"{unchanged} in baseline"] * bool(unchanged)
    return ", ".join(parts)
