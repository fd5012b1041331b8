"""The CLI against a hostile SSH server (tests/hostile_ssh_server.py): each misbehaviour ends
within the whole-fetch deadline, in bounded memory, with one line on stderr (or a normal report
when the data is fine and only the noise around it is hostile)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.peak import MeasuredPopen

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ is not a package

from hostile_ssh_server import HostileServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 4.0  # --timeout given to kvtrace
STARTUP = 8.0  # interpreter start, imports and teardown on a busy 2-core machine
MAX_RSS_MB = 300


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    seconds: float
    rss_mb: float


def scan(server: HostileServer, *extra: str) -> Run:
    args = [sys.executable, "-m", "kvtrace", "scan", server.target(), "--timeout", str(TIMEOUT),
            "--read-timeout", "30", "--connect-timeout", "5", "-i", str(server.client_key),
            "--known-hosts", str(server.known_hosts), "--ssh-config", os.devnull, *extra]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = MeasuredPopen(args, cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        code = proc.wait()
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        return Run(code, out.read().decode(), err.read().decode(), seconds, proc.peak_mb())


def one_line_error(run: Run) -> str:
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr[-2000:]
    assert lines[0].startswith("kvtrace: error: ") and "Traceback" not in run.stderr
    assert "\x1b" not in lines[0]
    assert run.code == 2, run
    return lines[0]


def bounded(run: Run) -> None:
    assert run.seconds < TIMEOUT + STARTUP, f"took {run.seconds:.1f} s"
    assert run.rss_mb < MAX_RSS_MB, f"peak RSS {run.rss_mb:.0f} MB"


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ("drip", "the --timeout for the whole fetch"),
        ("stall-before-marker", "the --timeout for the whole fetch"),
        ("stall-after-marker", "the --timeout for the whole fetch"),
        ("huge-size", "--max-total-bytes"),
        ("pax-huge", "pax record of 400000 bytes"),
        ("longname-huge", "long-name record of 209715200 bytes"),
        ("endless-records", "--max-files"),
        ("sftp-endless-depth", "--max-files|the --timeout for the whole fetch"),
    ],
)
def test_hostile_shape_ends_in_time_with_one_line(shape: str, words: str) -> None:
    with HostileServer(shape) as server:
        run = scan(server)
    bounded(run)
    line = one_line_error(run)
    assert any(w in line for w in words.split("|")), line
    print(f"{shape}: {run.seconds:.1f} s, peak RSS {run.rss_mb:.0f} MB: {line}")
    assert f"127.0.0.1:{server.port}" in line or "kvt@127.0.0.1" in line, line


def test_every_command_is_the_constant_one() -> None:
    from kvtrace.fetch.ssh.script import COMMAND

    with HostileServer("stall-after-marker") as server:
        scan(server)
    assert server.commands == [COMMAND.encode()]


@pytest.mark.parametrize("shape", ["stderr-flood-after-exit", "endless-after-archive"])
def test_noise_around_a_complete_archive_is_ignored(shape: str) -> None:
    with HostileServer(shape) as server:
        run = scan(server, "--format", "json")
    bounded(run)
    # Exactly the one line a JSON scan that fails prints (stdout is in a file or a pipe: this
    # line is what the person running it sees), and none of the server's noise.
    assert re.fullmatch(r"kvtrace: \S+: failed: 2 errors \(--fail-on error, the default\); also [\w, ]+; exit 1\n",
                        run.stderr) and run.code == 1, run.stderr[-2000:]
    data = json.loads(run.stdout)["reports"][0]
    assert {(f["backend"], f["state"]) for f in data["findings"] if f["rule"] == "pinned-state"} == {
        ("nixl", "WaitingForInput"), ("nixl", "Transferring")}


def test_sftp_drops_dotdot_and_absolute_names() -> None:
    with HostileServer("sftp-evil-names") as server:
        run = scan(server, "--format", "json", "-v")
    bounded(run)
    assert run.code == 3, run.stderr[-2000:]  # complete for the real files, loud about the rest
    data = json.loads(run.stdout)["reports"][0]
    assert sum("not a plain file name" in p for p in data["problems"]) == 3, data["problems"]
    paths = [f["path"] for f in data["files"]]
    assert paths and not any(".." in p.split("/") or p.startswith("/") or "evil" in p or "passwd" in p for p in paths), paths
    assert server.evil_opened == []  # never even opened
    assert "not a plain file name" in run.stderr
