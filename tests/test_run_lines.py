"""The lines around a report say which report they are about and stay loud where they must:
--all's per-report lines name the package, the fleet summary names premises, plurals agree,
and a refused cache folder is heard under -q."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def kvtrace(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture
def two_versions(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES / "nixl-pin", tmp_path / "v-old")
    shutil.copytree(EXAMPLES / "all-clear", tmp_path / "v-new")
    return tmp_path


def test_all_names_the_package_of_each_line(two_versions: Path) -> None:
    """Before: `kvtrace: /tmp/x: failed: ...` for one of two packages under /tmp/x, and a
    --metrics/fleet summary with one line for the target (the second package left out)."""
    result = kvtrace("scan", str(two_versions), "--all", "--no-cache", "--metrics", "http://127.0.0.1:9/metrics",
                     "--metrics-seconds", "0", "--connect-timeout", "1")
    assert result.returncode == 1, result.stderr
    failed = [line for line in result.stderr.splitlines() if ": failed: " in line]
    assert failed == [line for line in failed if f"{two_versions} (package v-old/disaggregation): failed: " in line]
    assert failed
    summary = result.stdout[result.stdout.index("Fleet: "):]
    old = next(line for line in summary.splitlines() if "(package v-old/disaggregation)" in line)
    new = next(line for line in summary.splitlines() if "(package v-new/disaggregation)" in line)
    assert "exit 1" in old and "findings" in old
    assert "exit 0" in new and "clean" in new  # each package its own verdict
    assert "Fleet: 2 hosts" in summary


def test_fleet_summary_names_the_premise() -> None:
    from kvtrace.fleet import verdicts_of

    finding = {"rule": "pinned-state", "severity": "warning", "backend": "nixl", "state": "WaitingForInput",
               "path": "srt/disaggregation/nixl/conn.py", "line": 7, "premise": "two requests share a bootstrap_room"}
    assert verdicts_of([finding]) == ["warning[pinned-state] nixl can pin WaitingForInput only if two requests share "
                                      "a bootstrap_room (srt/disaggregation/nixl/conn.py:7)"]
    assert verdicts_of([{**finding, "premise": None, "severity": "error"}]) == [
        "error[pinned-state] nixl can pin WaitingForInput (srt/disaggregation/nixl/conn.py:7)"]


def test_a_refused_cache_folder_is_heard_under_quiet(tmp_path: Path) -> None:
    hostile = tmp_path / "shared-cache"
    hostile.mkdir()
    os.chmod(hostile, 0o777)  # anyone could plant an entry: refused
    result = kvtrace("scan", "examples/nixl-pin", "-q", "-f", "json", env={"KVTRACE_CACHE_DIR": str(hostile)})
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("kvtrace: warning: cache directory") and "neither cached nor reused" in line
    # Without -q, the same one line (said once, not twice), and the verdict line of a failing scan.
    loud = kvtrace("scan", "examples/nixl-pin", "-f", "json", env={"KVTRACE_CACHE_DIR": str(hostile)})
    assert loud.returncode == 1 and loud.stderr.splitlines() == [
        line, "kvtrace: examples/nixl-pin: failed: 2 errors (--fail-on error, the default); also 5 warnings, 7 notes; "
              "exit 1"]


def test_incomplete_under_quiet_agrees_in_number(tmp_path: Path) -> None:
    tree = tmp_path / "srt"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    (tree / "disaggregation" / "broken.py").write_text("def f(:\n")
    result = kvtrace("scan", str(tree), "-q", "--no-cache", "-f", "json")
    assert result.returncode == 3, result.stderr
    assert f"kvtrace: INCOMPLETE: {tree}: 1 thing not analysed (see the report)" in result.stderr.splitlines()
