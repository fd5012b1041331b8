"""The engine's shortcuts change nothing a report says: the same generated trees, and real
releases' drains, scanned with and without each give the same JSON, byte for byte.

- PARK_ENDED: ended paths are set aside while a block runs on (flow.run_block); a decode drain
  ends thousands of paths by a helper's raise.
- SHARE_RUNS: a helper's run serves every path that agrees with it on the attribute keys it
  touched, the rest of the caller's attributes taken as they are (Explorer.call_function).
- SHARE_STARTED: a sender method's run serves every start that agrees with it on the keys it
  touched (flow.StartedRun, backends._Runner._run): poll() after each of send()'s ends."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given

from tests.sglang_wheels import sglang_tree

from . import gen
from ._support import reports_with_and_without

SHORTCUTS = ("PARK_ENDED", "SHARE_RUNS")


@pytest.mark.parametrize("shortcut", SHORTCUTS)
@gen.budget(ci=60, slow=600)
@given(program=gen.drain_programs(gen.ALL_FEATURES))
def test_a_shortcut_changes_no_report(shortcut: str, program) -> None:
    files = gen.render_tree(drain=program)
    with tempfile.TemporaryDirectory() as d:
        fast, reference = reports_with_and_without(shortcut, gen.write_files(Path(d), files))
    assert fast == reference


@gen.budget(ci=60, slow=600)
@given(program=gen.flag_around_helper_programs(gen.ALL_FEATURES))
def test_a_shared_run_keeps_each_callers_facts(program) -> None:
    """The shape a wrong shared run shows (a flag, a helper, the flag again), drawn on purpose."""
    files = gen.render_tree(drain=program)
    with tempfile.TemporaryDirectory() as d:
        fast, reference = reports_with_and_without("SHARE_RUNS", gen.write_files(Path(d), files))
    assert fast == reference


@gen.budget(ci=60, slow=600)
@given(tree=gen.sender_trees(gen.SENDER_FEATURES))
def test_a_shared_sender_run_changes_no_report(tree) -> None:
    with tempfile.TemporaryDirectory() as d:
        fast, reference = reports_with_and_without("SHARE_STARTED", gen.write_files(Path(d), gen.render_tree(senders=tree)))
    assert fast == reference


@pytest.mark.parametrize(("shortcut", "version", "pack"), [
    ("PARK_ENDED", "0.5.14", "sglang-decode"), ("PARK_ENDED", "0.5.23", "sglang-decode"),
    ("SHARE_RUNS", "0.5.2", "sglang-decode"), ("SHARE_RUNS", "0.5.23", "sglang-decode"),
    ("SHARE_RUNS", "0.5.23", "sglang-prefill"),
    # 0.5.21's Nixl sender: poll() after each of send()'s 869 ends, most served by one run.
    ("SHARE_STARTED", "0.5.21", "sglang-prefill"), ("SHARE_STARTED", "0.5.23", "sglang-decode"),
])
def test_a_shortcut_changes_no_report_on_a_real_release(shortcut: str, version: str, pack: str) -> None:
    fast, reference = reports_with_and_without(shortcut, sglang_tree(version) / "sglang" / "srt", pack)
    assert '"rule": "' in fast  # a report with findings, not an empty one
    assert fast == reference


def test_a_shared_run_takes_the_callers_untouched_facts() -> None:
    """A flag tested before a helper that never reads it and again after it: the path where it
    was false must not leave the helper holding the true path's fact (a shared run's result
    takes every key it did not touch from the caller; the first path's attrs would lose the
    kept Success). The generated trees seldom have this shape."""
    flag = gen.FlagTest("req", "flag", "truthy")
    helper = gen.Helper("_note", None, False, (gen.Neutral("log"),))
    program = gen.DrainProgram(body=(
        gen.If(flag, (gen.Neutral("log"),)),
        gen.Call(helper),
        gen.If(gen.PollTest("==", ("Success",)),
               (gen.If(flag, (gen.Release("release_kv_cache"), gen.Done()), (gen.Keep(),)),),
               (gen.Keep(),)),
    ))
    with tempfile.TemporaryDirectory() as d:
        tree = gen.write_files(Path(d), gen.render_tree(drain=program))
        fast, reference = reports_with_and_without("SHARE_RUNS", tree)
    assert '"kept"' in reference and '"leaves"' in reference  # both fates of Success are there
    assert fast == reference
