"""Suite-wide settings. The result cache goes to a temp dir for the whole run (subprocesses
inherit the variable), so tests never read or fill the developer's real user cache."""

from __future__ import annotations

import os
import shutil
import tempfile

_CACHE_DIR = tempfile.mkdtemp(prefix="kvtrace-test-cache-")
os.environ["KVTRACE_CACHE_DIR"] = _CACHE_DIR


def pytest_unconfigure(config: object) -> None:
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)
