"""kvtrace's fate of every KVPoll state in a drain loop equals the executing oracle's.

Generated loops (gen.drain_programs) are written as fixture trees, scanned with
kvtrace.scan.scan_path and run by oracle.drain_verdict. A failing example is shrunk by hypothesis
and saved under regressions/ (see _support.py), where test_regression_fates replays it.
~300 examples by default (derandomized), 3000 with KVTRACE_SLOW=1.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given

from . import _support, gen, oracle

scan_path = _support.kvtrace_scan()
DRAIN_FEATURES = gen.features_from_env(gen.ALL_FEATURES)


def check_tree(root: Path, ir=None, files=None, folder: bool = False) -> None:
    # A flag (or `req.rid in rids_to_check`) may be read twice on a path (verdict.correlated):
    # the same side-effect-free test, which kvtrace must decide once per path.
    verdict = oracle.drain_verdict(root, folder)
    report = scan_path(root / "disaggregation" if folder else root)
    statuses = {f.path: f.status for f in report.files}
    assert all(s == "ok" for s in statuses.values()), f"generated files not analysed: {statuses}"
    problems = _support.compare_fates(root, report, verdict)
    if problems:
        saved = None
        if files is not None:
            saved = _support.save_regression(
                "fates",
                files,
                _support.drain_json(verdict),
                {"fates": oracle.kvtrace_fates(report) if report.queues else None,
                 "modes": oracle.kvtrace_mode_fates(report) if report.queues else None},
                ir=ir,
                note="\n".join(problems),
            )
        pytest.fail(_support.fates_message(root, report, verdict, problems, saved), pytrace=False)
    # A crash the oracle sees only in the unseen mode (the backends' folder alone, or a tree whose
    # scheduler is not in view) rests on that caller: never an error.
    in_view = [fates for label, fates in verdict.modes.items() if "no caller in view" not in label]
    for f in report.findings:
        if f.rule == "state-crash" and f.premise is None:
            assert any("raises" in fates[f.state] for fates in in_view), (f.message, verdict.modes)
        if f.premise and "outside the scanned folder" in f.premise:
            assert len(in_view) < len(verdict.modes), f.message


@gen.budget(ci=300, slow=3000)
@given(gen.drain_programs(DRAIN_FEATURES))
@example(gen.SHAPE_CLASSIC)
@example(gen.SHAPE_PENDING)
def test_fates_match_oracle(program):
    files = gen.render_tree(drain=program)
    with tempfile.TemporaryDirectory() as d:
        check_tree(gen.write_files(Path(d), files), ir=program, files=files)


@gen.budget(ci=60, slow=600)
@given(gen.drain_programs(DRAIN_FEATURES | {"pp_param"}))
@example(gen.SHAPE_PP_NO_CALLER)
def test_fates_from_the_backends_folder_alone_match_oracle(program):
    """Scanning disaggregation/ alone: a rids_to_check no caller in view passes is free, a mode
    of its own ("passed (no caller in view)"), whose fates the oracle runs too (issue 23)."""
    files = gen.render_tree(drain=program)
    with tempfile.TemporaryDirectory() as d:
        check_tree(gen.write_files(Path(d), files), folder=True)


@pytest.mark.parametrize("folder", _support.regression_params("fates"))
def test_regression_fates(folder):
    check_tree(folder)
