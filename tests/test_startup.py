"""What a scan costs before and after the analysis: the modules it imports and how the process
ends. Both are measured on the real command in a fresh interpreter, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# Installed with kvtrace, but a local scan to text or JSON has no use for them: the HTML and graph
# exports (networkx), SSH (paramiko), the live gauge (prometheus_client). pydantic comes with
# typer >= 0.29, which pyproject.toml keeps out: importing it cost every run 0.12 s.
NOT_FOR_A_LOCAL_SCAN = {"pydantic", "pydantic_core", "networkx", "paramiko", "prometheus_client", "cryptography"}


def imported_by(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvtrace", *args],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    top = {line.rsplit("|", 1)[1].strip().split(".")[0]
           for line in result.stderr.splitlines() if line.startswith("import time:") and "|" in line}
    return result, top - {"module"}  # the header row: "import time: self [us] | cumulative | imported package"


def test_a_local_scan_imports_only_what_it_uses() -> None:
    result, modules = imported_by("scan", str(EXAMPLES / "nixl-pin"), "--no-cache", "--format", "json")
    assert result.returncode == 1, result.stderr[-2000:]
    assert {"kvtrace", "libcst", "typer", "rich"} <= modules  # the measurement saw the imports
    assert not modules & NOT_FOR_A_LOCAL_SCAN, sorted(modules & NOT_FOR_A_LOCAL_SCAN)


def test_the_process_ends_with_the_verdict_and_all_its_output() -> None:
    """run() ends the process with os._exit once the streams are flushed: the exit code is the
    scan's and a large piped report arrives whole (nothing left in a buffer)."""
    for example, code in (("nixl-pin", 1), ("all-clear", 0)):
        result = subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(EXAMPLES / example), "--no-cache",
                                 "--format", "json"], capture_output=True, text=True, timeout=120)
        assert result.returncode == code, (example, result.stderr[-2000:])
        report = json.loads(result.stdout)  # complete: a truncated document does not parse
        assert report["reports"][0]["files"], example
    # A usage error and a missing target keep their own codes through run().
    usage = subprocess.run([sys.executable, "-m", "kvtrace", "scan", "--format", "pdf", "x"],
                           capture_output=True, text=True, timeout=120)
    missing = subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(ROOT / "no-such-folder")],
                             capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and usage.stderr.startswith("kvtrace: error: --format pdf: not one of")
    assert missing.returncode == 2 and "no such file or directory" in missing.stderr


def test_several_scans_in_one_process_still_free_their_garbage() -> None:
    """The cyclic collector is switched off only for a single scan that ends the process; --all and
    fleets scan many trees in one process and keep it on (memory stays one scan's worth)."""
    probe = ("import gc, sys; from kvtrace import cli; cli._process_ends_with_command = True\n"
             "try: cli.main(sys.argv[1:])\nexcept SystemExit: pass\n"
             "print(gc.isenabled())")
    one = subprocess.run([sys.executable, "-c", probe, "scan", str(EXAMPLES / "healthy"), "--no-cache", "-q"],
                         capture_output=True, text=True, timeout=120)
    two = subprocess.run([sys.executable, "-c", probe, "scan", str(EXAMPLES / "healthy"), str(EXAMPLES / "nixl-pin"),
                          "--no-cache", "-q"], capture_output=True, text=True, timeout=120)
    every = subprocess.run([sys.executable, "-c", probe, "scan", str(EXAMPLES / "healthy"), "--all", "--no-cache", "-q"],
                           capture_output=True, text=True, timeout=120)
    assert one.stdout.splitlines()[-1] == "False", one.stderr[-2000:]
    assert two.stdout.splitlines()[-1] == "True", two.stderr[-2000:]
    assert every.stdout.splitlines()[-1] == "True", every.stderr[-2000:]
