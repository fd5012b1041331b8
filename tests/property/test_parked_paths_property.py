"""Setting ended paths aside while a block runs on (flow.run_block, PARK_ENDED) changes nothing
a report says: the same generated trees, and a real release's decode drains (thousands of paths
ended by a helper's raise), scanned with and without it give the same JSON, byte for byte."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given

from kvtrace import flow
from kvtrace.packs import load_pack
from kvtrace.report.json import render
from kvtrace.scan import scan_path
from tests.sglang_wheels import sglang_tree

from . import gen


def _both_ways(root: Path, pack: str | None = None) -> tuple[str, str]:
    loaded = load_pack(pack) if pack else None
    parked = render([scan_path(root, loaded)])
    flow.PARK_ENDED = False
    try:
        reference = render([scan_path(root, loaded)])
    finally:
        flow.PARK_ENDED = True
    return parked, reference


@gen.budget(ci=60, slow=600)
@given(gen.drain_programs(gen.ALL_FEATURES))
def test_parked_paths_change_no_report(program) -> None:
    files = gen.render_tree(drain=program)
    with tempfile.TemporaryDirectory() as d:
        parked, reference = _both_ways(gen.write_files(Path(d), files))
    assert parked == reference


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_parked_paths_change_no_report_on_a_real_decode_drain(version: str) -> None:
    parked, reference = _both_ways(sglang_tree(version) / "sglang" / "srt", "sglang-decode")
    assert '"rule": "' in parked  # a report with findings, not an empty one
    assert parked == reference
