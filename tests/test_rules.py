"""Every rule's VALID and INVALID samples (Fixit's convention), run through a real scan."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace.rules import ALL_RULES, rule_by_id
from kvtrace.rules.base import Rule, Sample
from kvtrace.rules.samples import SHARED_FILES
from kvtrace.scan import scan_path

CASES = [
    pytest.param(rule, sample, kind, id=f"{rule.id}-{kind}-{i}")
    for rule in ALL_RULES
    for kind, samples in (("valid", rule.VALID), ("invalid", rule.INVALID))
    for i, sample in enumerate(samples)
]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {**SHARED_FILES, **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(("rule", "sample", "kind"), CASES)
def test_rule_samples(rule: type[Rule], sample: Sample, kind: str, tmp_path: Path) -> None:
    report = scan_path(write_tree(tmp_path, sample.files))
    assert all(f.status == "ok" for f in report.files), [(f.path, f.error) for f in report.files]
    found = {(f.backend, f.state) for f in report.findings if f.rule == rule.id}
    assert found == set(sample.expect)
    if kind == "valid":
        assert not sample.expect


def test_every_rule_is_documented_and_has_samples() -> None:
    for rule in ALL_RULES:
        docs = rule.docs()
        for section in ("What it does:", "Why it matters:", "Example:", "Fix:"):
            assert section in docs, f"{rule.id} docs lack {section!r}"
        assert rule.VALID and rule.INVALID, f"{rule.id} needs VALID and INVALID samples"
        assert rule.severity in ("error", "warning", "note")
        assert rule_by_id(rule.id) is rule
