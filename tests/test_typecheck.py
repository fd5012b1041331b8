"""mypy and ruff (both in the test extras) on all of kvtrace/ and rules/ (pyproject.toml's [tool.mypy] `files`
and RUFF_CLEAN below, with the complexity check): a type or lint error anywhere there fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Every module of the package and the rules, and the tests that build the engine's inputs by hand.
RUFF_CLEAN = ["kvtrace", "rules", "tests/test_engine.py", "tests/test_typecheck.py", "tests/test_file_records.py",
              "tests/conftest.py", "tests/test_inner_loop.py"]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_mypy_passes_on_kvtrace_and_the_rules() -> None:
    done = _run("mypy")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_passes_on_kvtrace_and_the_rules() -> None:
    done = _run("ruff", "check", "--no-cache", *RUFF_CLEAN)
    assert done.returncode == 0, done.stdout + done.stderr


def test_both_checks_cover_every_module() -> None:
    """Neither check narrows back to a list of modules: a new module is checked the day it is added."""
    import tomllib

    configured = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["files"]
    assert {"kvtrace", "rules"} <= set(configured) and {"kvtrace", "rules"} <= set(RUFF_CLEAN)
