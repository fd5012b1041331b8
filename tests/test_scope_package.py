"""The verdict does not depend on which folder the user scanned (issue 23): the installed package
(`sglang/`) gives the same findings as `sglang/srt`, each at the same file and line, with the same
severity and premise. (`sglang/srt/disaggregation` alone is held in test_release_verdicts.py.)"""

from __future__ import annotations

import pytest

from kvtrace.model import Report
from kvtrace.scan import scan_path
from tests.sglang_wheels import sglang_tree


def _rows(report: Report, prefix: str) -> set[tuple[object, ...]]:
    rows = set()
    for f in report.findings:
        assert f.path.startswith(prefix), f.path
        rows.add((f.rule, f.queue, f.backend, f.state, f.path.removeprefix(prefix), f.line, f.severity, f.premise))
    return rows


@pytest.mark.parametrize("version", ["0.4.8", "0.5.9", "0.5.23"])
def test_package_and_srt_give_the_same_findings(version: str) -> None:
    package = sglang_tree(version) / "sglang"
    whole = scan_path(package)
    srt = scan_path(package / "srt")
    assert whole.findings and srt.findings
    assert _rows(whole, "srt/") == _rows(srt, "")
