"""Baselines: fail only on findings a change introduced.

A finding's fingerprint is what the finding is about, never where the code happens to live:
`rule|queue|backend|state|role`. For a finding about a backend's poll() (pinned-state,
no-timeout...) the backend and the state say it all, so moving poll() into a base class (as
SGLang 0.5.23 did) changes no fingerprint. For a finding about a site of the drain (silent-wait,
unhandled-state, release-leak...) the role is the release-map site at its line: its kind and
what it keeps into, raises, releases or calls (`keep:undone_reqs`, `raise:assert`,
`release:release_kv_cache`); for one about a manager method, the method's name
(`update_status`), never its class. No line number either: code added above changes nothing.

A baseline is any earlier kvtrace JSON report (kvtrace/1 or kvtrace/2) or SARIF log;
`--write-baseline` writes the JSON. Findings matched in it are marked `unchanged`, shown and
counted, but do not fail the scan. Matching counts: two identical fingerprints in the scan need
two in the baseline. Baselines written before this format (`rule|backend|state|function`, SARIF
key kvtrace/v2) still work: they are matched on rule, backend and state.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from kvtrace.errors import InputError
from kvtrace.model import Finding, Report, Site
from kvtrace.userfiles import checked, load_json

SARIF_KEY = "kvtrace/v3"  # partialFingerprints key of rule|queue|backend|state|role
LEGACY_SARIF_KEYS = ("kvtrace/v2",)  # rule|backend|state|function: matched on rule, backend, state


@dataclass(frozen=True)
class Fingerprint:
    rule: str
    queue: str | None
    backend: str | None
    state: str | None
    role: str | None
    legacy: bool = False  # from a baseline of the first format: only rule, backend and state are known

    def __str__(self) -> str:
        if self.legacy:
            return "|".join(part or "-" for part in (self.rule, self.backend, self.state, "*"))
        return "|".join(part or "-" for part in (self.rule, self.queue, self.backend, self.state, self.role))

    @classmethod
    def parse(cls, text: str) -> "Fingerprint":
        """The current five-part form, or the first format's four parts (its function ignored)."""
        parts = [None if p == "-" else p for p in text.split("|")]
        if not parts[0] or len(parts) not in (4, 5):
            raise ValueError(f"fingerprint {text!r}: neither rule|queue|backend|state|role (kvtrace/v3) "
                             "nor rule|backend|state|function (kvtrace/v2)")
        if len(parts) == 4:
            return cls.legacy_print(parts[0] or "", parts[1], parts[2])
        rule, queue, backend, state, role = parts
        return cls(rule or "", queue, backend, state, role)

    @classmethod
    def legacy_print(cls, rule: str, backend: str | None, state: str | None) -> "Fingerprint":
        return cls(rule, None, backend, state, None, legacy=True)

    def loose(self) -> "Fingerprint":
        """What a first-format baseline can match: rule, backend and state."""
        return Fingerprint.legacy_print(self.rule, self.backend, self.state)


def fingerprint(finding: Finding) -> Fingerprint:
    return Fingerprint(finding.rule, finding.queue, finding.backend, finding.state, finding.role)


_CLASS_PREFIX = re.compile(r"^[A-Z]\w*\.(?=\w)")


def _unqualified(name: str) -> str:
    """`CommonKVManager.update_status` -> `update_status`: the method, not the class it is in."""
    return _CLASS_PREFIX.sub("", name).replace("|", "/")


def site_role(site: Site) -> str:
    kind = getattr(site.kind, "value", str(site.kind))
    return f"{kind}:{_unqualified(site.note)}" if site.note else kind


def assign_roles(report: Report) -> None:
    """Fill `role` on each finding not about a backend's poll(): the kinds of the release-map
    sites at its line (in its queue's map), else the unqualified name of the function it is in."""
    sites: dict[tuple[str | None, str, int], list[Site]] = {}
    for queue in report.queues:
        for site in queue.sites:
            sites.setdefault((queue.name, site.path, site.line), []).append(site)
            sites.setdefault((None, site.path, site.line), []).append(site)
    for finding in report.findings:
        if finding.backend is not None:
            finding.role = None
            continue
        here = sites.get((finding.queue, finding.path, finding.line), [])
        if here:
            finding.role = "+".join(sorted({site_role(s) for s in here}))
        else:
            finding.role = _unqualified(finding.function.rsplit(".", 1)[-1]) if finding.function else None


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
                "properties": {"type": "object", "properties": {"rule": _OPTIONAL_TEXT, "backend": _OPTIONAL_TEXT,
                                                              "state": _OPTIONAL_TEXT}},
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
                yield Fingerprint.legacy_print(f["rule"], f.get("backend"), f.get("state"))


def _from_sarif(data: dict[str, Any]) -> Iterable[Fingerprint]:
    for run in data["runs"]:
        for result in run.get("results", []):
            if result.get("suppressions"):
                continue
            prints = result.get("partialFingerprints", {})
            if SARIF_KEY in prints:
                yield Fingerprint.parse(prints[SARIF_KEY])
            else:  # a log of an earlier kvtrace: its properties say rule, backend and state
                props = result.get("properties", {})
                yield Fingerprint.legacy_print(props.get("rule") or result["ruleId"], props.get("backend"),
                                               props.get("state"))


def apply(findings: list[Finding], baseline: Counter[Fingerprint]) -> BaselineResult:
    """Mark each unsuppressed finding `unchanged` (in the baseline) or `new`."""
    exact = Counter({fp: n for fp, n in baseline.items() if not fp.legacy})
    loose = Counter({fp: n for fp, n in baseline.items() if fp.legacy})
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
