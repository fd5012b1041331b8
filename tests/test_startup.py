"""What a scan costs before and after the analysis: the modules it imports and how the process
ends. Both are measured on the real command in a fresh interpreter, as a user runs it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert {"kvtrace", "libcst", "typer"} <= modules  # the measurement saw the imports
    assert not modules & NOT_FOR_A_LOCAL_SCAN, sorted(modules & NOT_FOR_A_LOCAL_SCAN)


def test_a_cached_rescan_imports_no_analysis(tmp_path: Path) -> None:
    """A rescan served from the cache locates the package and reads the stored report: the
    rules, the analysis stages and libcst (~0.15 s of imports) are never loaded, nor typer's
    evaluation of string annotations needed (cli.py keeps real ones)."""
    import os

    env = {**os.environ, "KVTRACE_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-X", "importtime", "-m", "kvtrace", "scan", str(EXAMPLES / "nixl-pin"), "--format", "json"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert first.returncode == again.returncode == 1, again.stderr[-2000:]
    assert json.loads(again.stdout) and json.loads(again.stdout)["reports"] == json.loads(first.stdout)["reports"]
    names = {line.rsplit("|", 1)[1].strip() for line in again.stderr.splitlines() if line.startswith("import time:")}
    assert "kvtrace.cache" in names and "kvtrace.scan" in names  # the measurement saw the imports
    analysis = {"kvtrace.rules", "kvtrace.index", "kvtrace.parse", "kvtrace.flow", "kvtrace.graph", "kvtrace.backends",
                "libcst"}
    assert not names & analysis, sorted(names & analysis)
    # Nor what only a fleet or a cache write uses: the fleet's threads, importlib.resources' zip
    # support, the temp names of a write.
    unused = {"concurrent.futures", "importlib.resources", "zipfile", "secrets"}
    assert not names & unused, sorted(names & unused)
    # Nor rich: a kept JSON rendering is written as it is, nothing is laid out.
    assert not {name for name in names if name.split(".")[0] == "rich"}
    first_names = {line.rsplit("|", 1)[1].strip() for line in first.stderr.splitlines() if line.startswith("import time:")}
    assert analysis <= first_names  # the cold scan did import them


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


def test_python_m_kvtrace_imports_with_the_collector_off_and_run_turns_it_back_on() -> None:
    """`python -m kvtrace` imports with the cyclic collector off (its passes over modules and
    classes find nothing); run() freezes what the imports built and turns it back on, so a fleet,
    which keeps it on, frees its garbage as before."""
    probe = ("import gc, runpy\n"
             "from kvtrace import cli\n"
             "real_run = cli.run\n"
             "cli.run = lambda: (print('run', gc.isenabled(), flush=True), real_run())\n"
             "cli.main = lambda: print('main', gc.isenabled(), gc.get_freeze_count() > 0, flush=True)\n"
             "runpy.run_module('kvtrace', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.splitlines() == ["run False", "main True True"], done.stdout + done.stderr


def test_the_console_script_starts_as_python_m_kvtrace_does() -> None:
    """The `kvtrace` command pip installs runs `from <module> import <function>; sys.exit(<function>())`
    for pyproject.toml's entry point: that function imports the CLI with the collector off, as
    `python -m kvtrace` does, and hands over to run()."""
    import tomllib

    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kvtrace"]
    module, function = entry.split(":")
    probe = ("import gc, sys\n"
             "from kvtrace import cli\n"
             "real_run = cli.run\n"
             "cli.run = lambda: (print('run', gc.isenabled(), flush=True), real_run())\n"
             "cli.main = lambda: print('main', gc.isenabled(), gc.get_freeze_count() > 0, flush=True)\n"
             f"from {module} import {function}\n"
             f"sys.exit({function}())\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.splitlines() == ["run False", "main True True"], done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
    # And the real thing, through that entry point: a scan's verdict is the process's exit code.
    scan = subprocess.run([sys.executable, "-c", f"import sys; from {module} import {function}; sys.exit({function}())",
                           "scan", str(EXAMPLES / "nixl-pin"), "--no-cache", "--format", "json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert scan.returncode == 1 and json.loads(scan.stdout)["reports"][0]["findings"], scan.stderr[-2000:]


def test_logging_is_imported_only_when_a_line_is_shown() -> None:
    """kvtrace.LazyLog: a scan that says nothing on stderr but its verdict never imports `logging`;
    -v still shows the fetch and analysis steps, one `kvtrace:` line each."""
    quiet, modules = imported_by("scan", str(EXAMPLES / "nixl-pin"), "--no-cache", "--format", "json")
    assert quiet.returncode == 1 and "kvtrace" in modules, quiet.stderr[-2000:]
    assert "logging" not in modules
    verbose = subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(EXAMPLES / "nixl-pin"), "--no-cache", "-v",
                              "--format", "json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    steps = [line for line in verbose.stderr.splitlines() if "fetched" in line and "analysed in" in line]
    assert verbose.returncode == 1 and len(steps) == 1 and steps[0].startswith("kvtrace: "), verbose.stderr[-2000:]


def test_a_line_said_after_the_stderr_of_setup_was_closed_goes_to_the_stderr_of_the_moment(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A process that runs several commands (a test session, a tool embedding the CLI) may close
    the stderr that was current when `-v` set logging up; the first line said afterwards used to
    raise "I/O operation on closed file" from inside the fetch that said it."""
    from kvtrace import log
    from kvtrace.cli import setup_logging

    saved, gone = sys.stderr, io.StringIO()
    sys.stderr = gone
    try:
        setup_logging(verbose=True, quiet=False)
    finally:
        sys.stderr = saved
    gone.close()
    try:
        log.debug("read %s after the old stderr closed", "a line")
        assert "kvtrace: read a line after the old stderr closed" in capsys.readouterr().err
    finally:
        setup_logging(verbose=False, quiet=False)
