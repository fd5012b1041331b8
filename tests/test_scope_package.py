"""The verdict does not depend on which folder the user scanned (issue 23): the installed package
(`sglang/`) gives the same findings as `sglang/srt`, each at the same file and line, with the same
severity and premise. (`sglang/srt/disaggregation` alone is held in test_release_verdicts.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace.model import Report
from kvtrace.scan import scan_path
from tests.sglang_wheels import sglang_package, sglang_tree

RELEASES = (Path(__file__).parent / "data" / "sglang-releases.txt").read_text().split()


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


@pytest.mark.parametrize("version", RELEASES)
def test_the_whole_installed_package_and_its_srt_give_the_same_findings(version: str) -> None:
    """Every .py file of the release, as pip installs it (4,700 files on 0.5.23): the rest of the
    package (entrypoints, models, layers, ...) adds no finding and moves none, and neither scan says
    it could not see something the other saw."""
    package = sglang_package(version)
    whole = scan_path(package)
    srt = scan_path(package / "srt")
    assert whole.findings and srt.findings
    assert _rows(whole, "srt/") == _rows(srt, "")
    assert not whole.incomplete and not srt.incomplete, (whole.problems, srt.problems)


@pytest.mark.parametrize("version", ["0.4.8", "0.5.14"])
def test_a_folder_holding_only_the_backends_folder_sees_as_little_as_the_folder_itself(
        version: str, tmp_path: Path) -> None:
    """Before: a copy of a release's `disaggregation/` inside another folder was scanned as if the
    scheduler were in view: no INCOMPLETE line, the bootstrap queue silently not judged and the
    PP-mode crash of the drain's rids_to_check missed (0.4.8: two Bootstrapping pins gone, exit 1;
    0.5.14: exit 0), while the same files scanned as `disaggregation/` said what they could not see."""
    import shutil

    copy = tmp_path / "holder" / "disaggregation"
    shutil.copytree(sglang_tree(version) / "sglang" / "srt" / "disaggregation", copy)
    outer, inner = scan_path(copy.parent), scan_path(copy)
    assert _rows(outer, "disaggregation/") == _rows(inner, "")
    assert outer.incomplete and inner.incomplete
    told = [p.text for p in outer.problems]
    assert told == [p.text.replace("(prefill.py:", "(disaggregation/prefill.py:") for p in inner.problems]
    assert any("disagg_prefill_bootstrap_queue is bound outside the scanned folder" in t for t in told)
