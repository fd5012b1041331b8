"""A fresh-clone user trial's findings: nothing partial may look clean, no gate that cannot
fail, no silently ignored option. Each test runs the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NIXL_PIN = ROOT / "examples" / "nixl-pin"


def kvtrace(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtrace: error: "), result.stderr
    return lines[0]


@pytest.fixture
def incomplete_tree(tmp_path: Path) -> Path:
    """The NIXL pin with one unparsable file: exit 3 when unpiped."""
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    (tree / "disaggregation" / "broken.py").write_text("def f(:\n")
    return tree


# --- 3. a closed stdout does not change the verdict ------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("stderr_too", [False, True])
def test_a_reader_that_goes_away_keeps_the_exit_code(incomplete_tree: Path, fmt: str, stderr_too: bool) -> None:
    """Before: `kvtrace scan TREE 2>&1 | head -16` exited 1 (or 0) where the scan itself gives 3.
    The read end is closed before kvtrace writes a byte, so every write meets EPIPE."""
    assert kvtrace("scan", str(incomplete_tree)).returncode == 3
    proc = subprocess.Popen([sys.executable, "-m", "kvtrace", "scan", str(incomplete_tree), "--format", fmt],
                            cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 3
    if not stderr_too:
        assert b"Traceback" not in err and b"Exception ignored" not in err and b"BrokenPipe" not in err, err
