"""mypy and ruff (both in the test extras) on the modules whose configuration says they are clean (pyproject.toml's
[tool.mypy] `files`, and the engine's modules for ruff): a type or lint error there fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The modules kept lint-clean (the flow engine, what it is built on, the pipeline and the manager model, and tests).
RUFF_CLEAN = ["kvtrace/flow.py", "kvtrace/states.py", "kvtrace/syntax.py", "kvtrace/gaps.py", "kvtrace/effects.py",
              "kvtrace/managers.py", "kvtrace/pipeline.py", "kvtrace/scan.py", "kvtrace/model.py", "kvtrace/index.py",
              "kvtrace/graph.py", "kvtrace/backends.py", "kvtrace/cachecodec.py", "kvtrace/config.py", "kvtrace/errors.py",
              "kvtrace/narrow.py", "kvtrace/suppress.py", "kvtrace/baseline.py", "rules/manager_model.py", "tests/test_engine.py",
              "tests/test_typecheck.py", "tests/test_file_records.py"]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_mypy_passes_on_the_configured_modules() -> None:
    done = _run("mypy")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_passes_on_the_engine() -> None:
    done = _run("ruff", "check", "--no-cache", *RUFF_CLEAN)
    assert done.returncode == 0, done.stdout + done.stderr
