"""Red team, round two, on what kvtrace prints and what it trusts (issue 18 items 4, 6, 8, 11,
13; issue 20's suppression item): names and source text reaching the terminal, suppressions
failing open, a hostile --metrics page, a hostile known_hosts, the remote version look-up.

Every case runs the real thing: the CLI in a subprocess, a real HTTP page on 127.0.0.1, a real
OpenSSH sshd (tests/sshd_server.py) or a paramiko SFTP server for the look-up. Time and memory
bounds are generous (a busy 2-core machine), far below what the unbounded code needed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ is not a package

from sshd_server import SshdServer, generate_key, require_sshd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NIXL_PIN = ROOT / "examples" / "nixl-pin"
GAUGE = "sglang:num_prefill_inflight_queue_reqs"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colours on a terminal; nothing else may reach it


def kvtrace(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
            cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def no_control(text: str) -> bool:
    """Nothing but printable text, newlines and tabs, once rich's colour codes are taken out."""
    return all(c in "\n\t" or c.isprintable() for c in SGR.sub("", text))


@pytest.fixture(scope="module")
def sshd() -> Iterator[SshdServer]:
    require_sshd()
    with SshdServer.start() as server:
        yield server


def ssh_flags(server: SshdServer, known_hosts: Path | None = None) -> list[str]:
    return ["--ssh-config", str(server.ssh_config), "--known-hosts", str(known_hosts or server.known_hosts),
            "-i", str(server.client_key), "--no-cache"]


def remote(server: SshdServer, path: Path) -> str:
    return f"{server.user}@{server.host}:{server.port}:{path}"


# --- item 4: names and source text are text, never markup or terminal control -----------------

FORGED = "kvtrace: 0 findings, scan complete"


@pytest.fixture
def markup_tree(tmp_path: Path) -> Path:
    """The NIXL example with its backend in a folder named `[/x]` (a folder `[` holding `x]`)."""
    tree = tmp_path / "markup"
    shutil.copytree(NIXL_PIN, tree)
    odd = tree / "disaggregation" / "[" / "x]"
    odd.mkdir(parents=True)
    (tree / "disaggregation" / "nixl" / "conn.py").rename(odd / "conn.py")
    (tree / "disaggregation" / "nixl").rmdir()
    return tree


@pytest.fixture
def hostile_tree(tmp_path: Path) -> Path:
    """Escape sequences in a backend folder's name and in a comment on a reported line, and a
    file whose name carries a newline and a forged summary line."""
    tree = tmp_path / "hostile"
    shutil.copytree(NIXL_PIN, tree)
    disagg = tree / "disaggregation"
    conn = disagg / "nixl" / "conn.py"
    text = conn.read_text()
    # Title set, screen cleared, an OSC 8 link, a bidi override: on the poll() line the report quotes.
    text = text.replace("    def poll(self) -> KVPoll:",
                        "    def poll(self) -> KVPoll:  # \x1b]0;pwned\x07\x1b[2J\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ \u202e",
                        1)
    conn.write_text(text)
    (disagg / "nixl").rename(disagg / "ni\x1b[31mxl\x1b]0;title\x07")
    (disagg / "base" / "conn.py").rename(disagg / "base" / f"conn\n{FORGED}\n.py")
    return tree


def test_markup_in_a_folder_name_is_shown_as_written(markup_tree: Path) -> None:
    """Before: MarkupError, exit 4, no report."""
    for env in ({}, {"FORCE_COLOR": "1", "COLUMNS": "120"}):  # piped, and as on a terminal
        result = kvtrace("scan", str(markup_tree), "--no-cache", env=env)
        assert result.returncode == 1, result.stderr
        assert "disaggregation/[/x]/conn.py:" in SGR.sub("", result.stdout)
        assert "internal error" not in result.stderr


def test_markup_in_a_remote_folder_name_is_shown_as_written(sshd: SshdServer, markup_tree: Path) -> None:
    result = kvtrace("scan", remote(sshd, markup_tree), *ssh_flags(sshd))
    assert result.returncode == 1, result.stderr
    assert "disaggregation/[/x]/conn.py:" in result.stdout


def test_escape_sequences_and_newlines_never_reach_the_terminal(hostile_tree: Path) -> None:
    """Before: the ESC sequences went through (title, clear screen, link) and the file name's
    newline printed a forged summary line."""
    for env in ({}, {"FORCE_COLOR": "1", "COLUMNS": "160"}):
        result = kvtrace("scan", str(hostile_tree), "--no-cache", env=env)
        assert result.returncode in (1, 3), result.stderr
        out = SGR.sub("", result.stdout)
        assert no_control(result.stdout) and no_control(result.stderr), repr(result.stdout[:2000])
        assert not any(line.strip() == FORGED for line in (out + result.stderr).splitlines())
        assert "ni\\x1b[31mxl\\x1b]0;title\\x07" in out  # shown, escaped, so the reader sees it
        assert "\\x1b[2J" in out and "\\u202e" in out  # the excerpt of the poll() line, escaped
    for fmt in ("github",):
        result = kvtrace("scan", str(hostile_tree), "--no-cache", "--format", fmt)
        assert no_control(result.stdout), repr(result.stdout[:2000])
    # JSON stays exact: a data format, its own escaping is safe.
    data = json.loads(kvtrace("scan", str(hostile_tree), "--no-cache", "--format", "json").stdout)
    assert any(b["name"] == "ni\x1b[31mxl\x1b]0;title\x07" for b in data["reports"][0]["backends"])


def test_fleet_progress_display_shows_markup_names_as_text(markup_tree: Path, tmp_path: Path) -> None:
    """Before: the per-host progress line on a terminal parsed the target as markup (exit 4)."""
    import pty

    other = tmp_path / "[" / "x]"  # the target itself reads `.../[/x]`: a closing tag with no opening one
    shutil.copytree(NIXL_PIN, other)
    controller, terminal = pty.openpty()
    out = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "kvtrace", "scan", str(markup_tree), str(other), "--no-cache",
                             "-f", "json", "-o", str(out)], cwd=ROOT, stdin=terminal, stdout=terminal,
                            stderr=terminal, env={**os.environ, "TERM": "xterm", "COLUMNS": "200"})
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO once the process has exited
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert proc.wait(timeout=120) == 1, shown.decode(errors="replace")[-2000:]
    text = shown.decode("utf-8", "replace")
    assert "internal error" not in text and "Fleet: 2 hosts" in text
    assert len(json.loads(out.read_text())["reports"]) == 2


def _report_json(tmp_path: Path, host: str, path_prefix: str) -> Path:
    made = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"
    result = kvtrace("scan", str(NIXL_PIN), "--no-cache", "--format", "json", "-o", str(made))
    assert result.returncode == 1, result.stderr
    data = json.loads(made.read_text())
    report = data["reports"][0]
    report["host"] = host
    report["sglang_version"] = "0.5\x1b]0;v\x07"
    for finding in report["findings"]:
        finding["path"] = path_prefix + finding["path"]
    made.write_text(json.dumps(data))
    return made


def test_merge_and_fleet_summary_escape_hosts_paths_versions(tmp_path: Path) -> None:
    """Before: host names, versions and paths from JSON files went to the terminal raw."""
    evil_host = f"h1\x1b]0;owned\x07\n  {FORGED}"
    files = [_report_json(tmp_path, evil_host, "[/x]\x1b[2J/"), _report_json(tmp_path, "h2", "")]
    result = kvtrace("merge", *map(str, files))
    assert result.returncode == 1, result.stderr
    assert no_control(result.stdout), repr(result.stdout)
    assert not any(line.strip() == FORGED for line in result.stdout.splitlines())
    assert "h1\\x1b]0;owned\\x07\\n" in result.stdout and "[/x]\\x1b[2J/" in result.stdout
    # Every host block is its own lines: the forged text sits inside the host's line.
    assert result.stdout.count("\n  h1") == 1
    as_json = json.loads(kvtrace("merge", *map(str, files), "--format", "json").stdout)
    assert as_json["hosts"][0]["target"] == evil_host  # JSON keeps the exact text


# --- a Prometheus page we control ------------------------------------------------------------


class Page:
    """A raw HTTP server on 127.0.0.1 that answers every request with `respond(conn)`."""

    def __init__(self, respond) -> None:  # type: ignore[no-untyped-def]
        self.respond = respond
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            conn.recv(65536)
            self.respond(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def headers(extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{extra}\r\n".encode()


def _sample_in_child(url: str, timeout: float = 3.0, seconds: float = 0.0) -> dict:
    """metrics.sample in a fresh interpreter: its peak memory and wall time are its own."""
    code = (
        "import json, sys, time\n"
        # VmHWM belongs to this address space: ru_maxrss would carry the forking pytest's peak
        # over exec (540 MB late in a full run) and measure the test runner, not the sampler.
        "def peak_mb():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            return int(line.split()[1]) / 1024\n"
        "from kvtrace.metrics import parse_metrics_url, sample, tcp_opener\n"
        "t = time.monotonic()\n"
        f"s = sample(tcp_opener, parse_metrics_url({url!r}), seconds={seconds}, interval=1.0, timeout={timeout})\n"
        "print(json.dumps({'error': s.error, 'gauges': len(s.gauges), 'summary': s.summary(), "
        "'seconds': time.monotonic() - t, 'rss_mb': peak_mb()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_endless_metrics_page_is_cut_at_a_byte_cap() -> None:
    """Before: 5.7 GB in 12 s, never ending."""
    def endless(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(headers())
        line = f"# HELP filler_total {'x' * 4000}\n".encode() * 16
        while not stop.is_set():
            conn.sendall(line)

    page = Page(endless)
    try:
        got = _sample_in_child(page.url, timeout=30.0)
    finally:
        page.close()
    assert "larger than" in got["error"] and "gauges unknown" in got["error"], got
    assert got["rss_mb"] < 250, got


def test_dripping_metrics_page_ends_at_the_deadline_and_says_cut_off() -> None:
    """Before: one byte every few seconds kept the read going forever (each wait was short)."""
    def drip(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(headers() + f"{GAUGE} 1\n".encode())
        while not stop.is_set():
            conn.sendall(b"#")
            stop.wait(0.3)

    page = Page(drip)
    try:
        got = _sample_in_child(page.url, timeout=2.0)
    finally:
        page.close()
    assert got["error"].startswith("page cut off: not read within 2.0 s"), got
    assert "no queue gauges" not in " ".join(got["summary"])
    assert got["seconds"] < 20, got


def test_a_million_queue_series_are_capped_in_memory_and_in_the_summary() -> None:
    """Before: every series kept and printed (a million stderr lines, 1.1 GB)."""
    count = 250_000  # as many as fit under the page cap
    body = "".join(f'q_queue{{i="{i}"}} 1\n' for i in range(count)).encode()

    def many(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(headers(f"Content-Length: {len(body)}\r\n") + body)

    page = Page(many)
    try:
        # A deadline far past what the read needs: the cap on series is what this test is about,
        # not how fast a busy machine moves 5 MB.
        got = _sample_in_child(page.url, timeout=60.0)
    finally:
        page.close()
    assert got["gauges"] == 1000 and f"has {count} queue series" in got["error"], got
    assert len(got["summary"]) <= 25 and "more queue series" in got["summary"][-1], got["summary"]
    assert got["rss_mb"] < 250, got


def test_prometheus_label_values_cannot_forge_summary_lines(tmp_path: Path) -> None:
    """A label value carrying a newline and escape sequences: one escaped line per gauge."""
    body = (f'{GAUGE}{{model_name="m\\n{FORGED}\x1b]0;t\x07"}} 1\n').encode()

    def page_with_labels(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(headers(f"Content-Length: {len(body)}\r\n") + body)

    page = Page(page_with_labels)
    try:
        result = kvtrace("scan", str(NIXL_PIN), "--no-cache", "--no-map", "--metrics", page.url,
                         "--metrics-seconds", "0")
    finally:
        page.close()
    assert result.returncode == 1, result.stderr
    assert no_control(result.stdout), repr(result.stdout[-1500:])
    assert not any(line.strip() == FORGED or line.startswith(FORGED) for line in result.stdout.splitlines())
    gauge_lines = [line for line in result.stdout.splitlines() if "gauge:" in line]
    assert len(gauge_lines) == 1 and f'model_name="m\\n{FORGED}\\x1b]0;t\\x07"' in gauge_lines[0], gauge_lines


def test_metrics_page_cut_off_by_the_ssh_deadline_is_not_no_gauges(sshd: SshdServer, tmp_path: Path) -> None:
    """Before: the page read when --timeout closed the SSH connection was parsed as it stood
    and reported as 'no queue gauges on the page'."""
    def stalls(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(headers() + b"# HELP other_total filler\n")
        stop.wait(30)

    page = Page(stalls)
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    try:
        started = time.monotonic()
        result = kvtrace("scan", remote(sshd, tree), *ssh_flags(sshd), "--metrics", page.url,
                         "--metrics-seconds", "0", "--timeout", "4")
        took = time.monotonic() - started
    finally:
        page.close()
    summary = result.stdout[result.stdout.find("Fleet:"):]
    assert "cut off" in summary and "no queue gauges" not in summary, summary
    assert took < 60, took


# --- item 6 and issue 20: suppressions fail closed, and are found anywhere in the comment ------

POLL_DEF = "    def poll(self) -> KVPoll:"


def _scan_with_comment(tmp_path: Path, comment: str) -> list[dict]:
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    conn = tree / "disaggregation" / "nixl" / "conn.py"
    text = conn.read_text()
    assert text.count(POLL_DEF) >= 1
    conn.write_text(text.replace(POLL_DEF, f"{POLL_DEF}  {comment}", 1))
    result = kvtrace("scan", str(tree), "--no-cache", "--format", "json")
    assert result.stdout, result.stderr
    return json.loads(result.stdout)["reports"][0]["findings"]


@pytest.mark.parametrize("comment", [
    "# kvtrace: ignore[pinned-state",  # unclosed
    "# kvtrace: ignore-next-line",
    "# kvtrace: ignore: pinned-state",
    "# kvtrace: ignore[]",
    "# kvtrace: ignore",  # no blanket ignore: it would hide errors too
    "# kvtrace ignore[pinned-state]",  # colon forgotten
])
def test_malformed_suppression_silences_nothing_and_is_reported(tmp_path: Path, comment: str) -> None:
    """Before: the first three silenced every rule on the line (errors included); `ignore[]`
    and a colon-less one did nothing and were not reported."""
    findings = _scan_with_comment(tmp_path, comment)
    on_line = [f for f in findings if f["path"] == "disaggregation/nixl/conn.py" and f["rule"] != "unused-suppression"]
    assert on_line and not any(f.get("suppressed") for f in findings), findings
    assert any(f["severity"] == "error" for f in on_line)
    reported = [f for f in findings if f["rule"] == "unused-suppression"]
    assert len(reported) == 1 and "is not a kvtrace directive" in reported[0]["message"], reported
    assert comment.split("  ")[0].strip() in reported[0]["message"]


@pytest.mark.parametrize("comment", [
    "# KVTRACE: IGNORE[PINNED-STATE]",  # the keyword and names are case-insensitive, as ruff's noqa
    "# type: ignore[override]  # kvtrace: ignore[pinned-state]",  # issue 20: after another comment
    "# kvtrace: ignore[KVT001]  -- accepted: see #1234",  # a code, and a reason after it
])
def test_well_formed_suppressions_silence_only_what_they_name(tmp_path: Path, comment: str) -> None:
    findings = _scan_with_comment(tmp_path, comment)
    pinned = [f for f in findings if f["rule"] == "pinned-state" and f["backend"] == "nixl"]
    assert pinned and all(f.get("suppressed") for f in pinned), pinned
    others = [f for f in findings if f["rule"] not in ("pinned-state", "unused-suppression")
              and f["path"] == "disaggregation/nixl/conn.py"]
    assert others and not any(f.get("suppressed") for f in others)
    assert not [f for f in findings if f["rule"] == "unused-suppression"]


# --- item 11 and 13: known_hosts read linearly, within bounds, as OpenSSH matches it -----------


def _openssh_accepts(server: SshdServer, known: Path) -> bool | None:
    """The reference: does OpenSSH's own client connect with this known_hosts?"""
    if shutil.which("ssh") is None:
        return None
    done = subprocess.run(
        ["ssh", "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null", "-o",
         "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-i", str(server.client_key), "-F", os.devnull,
         "-p", str(server.port), f"{server.user}@{server.host}", "true"],
        capture_output=True, text=True, timeout=60)
    return done.returncode == 0


def test_large_known_hosts_is_read_in_linear_time(sshd: SshdServer, tmp_path: Path) -> None:
    """Before: 10,000 lines took 19 s (paramiko's HostKeys.add scans every entry per line), past
    --timeout; 200,000 never finished."""
    import base64
    import hashlib
    import hmac

    other = generate_key(tmp_path / "other", "other").split()[1]
    lines = []
    for i in range(100_000):
        salt = hashlib.sha1(str(i).encode()).digest()
        name = hmac.new(salt, f"host-{i}.example".encode(), hashlib.sha1).digest()
        lines.append(f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(name).decode()} ssh-ed25519 {other}\n")
    known = tmp_path / "known_hosts"
    known.write_text("".join(lines) + sshd.known_hosts_entry())
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    started = time.monotonic()
    result = kvtrace("scan", remote(sshd, tree), *ssh_flags(sshd, known), "--timeout", "30", timeout=240)
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert took < 60, took  # ~2 s here; the quadratic loader needs hours for 100,000 lines


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_known_hosts_that_is_not_a_regular_file_is_refused_without_reading(
        sshd: SshdServer, tmp_path: Path, kind: str) -> None:
    """Before: /dev/zero was read until 6.4 GB; a FIFO blocked forever."""
    if kind == "fifo":
        known = tmp_path / "known_hosts"
        os.mkfifo(known)
    else:
        known = Path("/dev/zero")
    started = time.monotonic()
    result = kvtrace("scan", remote(sshd, tmp_path), *ssh_flags(sshd, known), "--timeout", "20", timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "unknown host key" in result.stderr and "not a regular file, not used" in result.stderr
    assert time.monotonic() - started < 60


def test_negated_known_hosts_pattern_is_no_match(sshd: SshdServer, tmp_path: Path) -> None:
    """Before: `!name,name KEY` was accepted; OpenSSH refuses it (a negated match anywhere in the
    list means the line does not apply)."""
    known = tmp_path / "known_hosts"
    name = sshd.known_hosts_name
    known.write_text(f"!{name},{name} {sshd.host_key_line}\n")
    assert _openssh_accepts(sshd, known) in (False, None)
    result = kvtrace("scan", remote(sshd, tmp_path), *ssh_flags(sshd, known))
    assert result.returncode == 2 and "unknown host key" in result.stderr, result.stderr


@pytest.mark.parametrize("pattern", ["[127.0.0.*]:{port}", "[127.0.0.?]:{port}", "[127.0.0.1]:*",
                                     "other.example,[127.0.0.1]:{port}", "|hashed|"])
def test_wildcard_and_hashed_known_hosts_patterns_match_as_openssh(
        sshd: SshdServer, tmp_path: Path, pattern: str) -> None:
    """Before: `*` and `?` were compared literally, so a wildcard entry OpenSSH accepts did not match."""
    if pattern == "|hashed|":
        import paramiko

        field = paramiko.HostKeys.hash_host(sshd.known_hosts_name)
    else:
        field = pattern.format(port=sshd.port)
    known = tmp_path / "known_hosts"
    known.write_text(f"{field} {sshd.host_key_line}\n")
    assert _openssh_accepts(sshd, known) in (True, None)
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    result = kvtrace("scan", remote(sshd, tree), *ssh_flags(sshd, known))
    assert result.returncode == 1, result.stderr


def test_wildcard_entry_with_another_key_is_a_changed_key(sshd: SshdServer, tmp_path: Path) -> None:
    other = " ".join(generate_key(tmp_path / "other", "other").split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.*]:* {other}\n")
    result = kvtrace("scan", remote(sshd, tmp_path), *ssh_flags(sshd, known), "--accept-new-host-key")
    assert result.returncode == 2 and "HOST KEY CHANGED" in result.stderr, result.stderr
    assert known.read_text() == f"[127.0.0.*]:* {other}\n"


def test_several_keys_of_one_type_for_a_host_any_matches(sshd: SshdServer, tmp_path: Path) -> None:
    """OpenSSH accepts the server's key when any line for the host names it; before, paramiko
    kept the last key of the type only and called the real one a changed key."""
    other = " ".join(generate_key(tmp_path / "other", "other").split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_entry() + sshd.known_hosts_entry(other))
    assert _openssh_accepts(sshd, known) in (True, None)
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    result = kvtrace("scan", remote(sshd, tree), *ssh_flags(sshd, known))
    assert result.returncode == 1, result.stderr
    # Neither of two listed keys: changed, whatever accept-new says.
    known.write_text(sshd.known_hosts_entry(other) + sshd.known_hosts_entry(
        " ".join(generate_key(tmp_path / "third", "third").split()[:2])))
    refused = kvtrace("scan", remote(sshd, tree), *ssh_flags(sshd, known), "--accept-new-host-key")
    assert refused.returncode == 2 and "HOST KEY CHANGED" in refused.stderr, refused.stderr


def test_accept_new_writes_through_a_symlinked_known_hosts(sshd: SshdServer, tmp_path: Path) -> None:
    """Before: the link was replaced by a regular file; the dotfiles copy it pointed to never
    learned the key."""
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "known_hosts"
    real.write_text("# kept\nother.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    real.chmod(0o640)
    link = tmp_path / "ssh" / "known_hosts"
    link.parent.mkdir()
    link.symlink_to(real)
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    result = kvtrace("scan", remote(sshd, tree), *ssh_flags(sshd, link), "--accept-new-host-key")
    assert result.returncode == 1, result.stderr
    assert link.is_symlink() and link.resolve() == real.resolve()
    lines = real.read_text().splitlines()
    assert lines[0] == "# kept" and len(lines) == 3 and lines[2].startswith("|1|")
    assert real.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in dotfiles.iterdir()) == ["known_hosts"]  # no temp file left
    again = kvtrace("scan", remote(sshd, tree), *ssh_flags(sshd, link))
    assert again.returncode == 1, again.stderr


# --- item 11: the remote SGLang-version look-up over SFTP is bounded ---------------------------


class _VersionSftpServer:
    """A paramiko SFTP server whose site-packages lists `entries` names (the dist-info last), or
    stalls on every listing; it counts the entries it sent."""

    def __init__(self, tmp_path: Path, entries: int, stall: bool = False) -> None:
        import paramiko

        self.entries, self.stall, self.sent = entries, stall, 0
        generate_key(tmp_path / "sftp_host", "host")
        self.host_key = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "sftp_host"))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.released = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        import paramiko

        owner = self

        class Attr(paramiko.SFTPAttributes):
            def _pack(self, msg):  # type: ignore[no-untyped-def]
                owner.sent += 1
                return super()._pack(msg)

        class Sftp(paramiko.SFTPServerInterface):
            def list_folder(self, path: str):  # type: ignore[no-untyped-def]
                if owner.stall:
                    owner.released.wait(60)
                    return paramiko.SFTP_FAILURE
                names = [f"pkg_{i:06d}" for i in range(owner.entries)] + ["sglang-0.5.9.dist-info"]
                out = []
                for name in names:
                    attr = Attr()
                    attr.filename, attr.st_mode, attr.st_size = name, 0o40755, 0
                    out.append(attr)
                return out

        class Auth(paramiko.ServerInterface):
            def get_allowed_auths(self, username: str) -> str:
                return "none"

            def check_auth_none(self, username: str) -> int:
                return paramiko.AUTH_SUCCESSFUL

            def check_channel_request(self, kind: str, chanid: int) -> int:
                return paramiko.OPEN_SUCCEEDED

        conn, _ = self.sock.accept()
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        transport.set_subsystem_handler("sftp", paramiko.SFTPServer, Sftp)
        transport.start_server(server=Auth())
        self.transport = transport

    def close(self) -> None:
        self.released.set()
        self.sock.close()


def _none_auth_connect(server: _VersionSftpServer):  # type: ignore[no-untyped-def]
    import paramiko

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    transport = paramiko.Transport(sock)
    transport.start_client(timeout=10)
    transport.auth_none("u")

    class Client:  # what the look-up uses of paramiko.SSHClient
        def get_transport(self):  # type: ignore[no-untyped-def]
            return transport

        def open_sftp(self):  # type: ignore[no-untyped-def]
            return paramiko.SFTPClient.from_transport(transport)

    return Client(), transport


def test_version_lookup_lists_a_bounded_number_of_entries(tmp_path: Path) -> None:
    """Before: every entry of the folder was listed and kept (a hostile folder: 2 GB)."""
    from kvtrace import fleet
    from kvtrace.fleet import metadata_dirs, remote_sglang_version

    bound = getattr(fleet, "MAX_LISTED", 20_000)
    server = _VersionSftpServer(tmp_path, entries=3 * bound)
    try:
        client, transport = _none_auth_connect(server)
        try:
            found = remote_sglang_version(client, "/venv/site-packages/sglang", "")
        finally:
            transport.close()
    finally:
        server.close()
    assert found is None  # the dist-info sits past the bound: the version is unknown, never guessed
    # Both folders that could hold the dist-info are listed, each to the bound (and a batch past it).
    folders = len(metadata_dirs("/venv/site-packages/sglang", ""))
    assert folders == 2 and server.sent <= folders * (bound + 200), server.sent


def test_version_lookup_ends_within_the_read_timeout(tmp_path: Path) -> None:
    """Before: a server that never answers the listing held the look-up until the whole --timeout."""
    from kvtrace.fleet import remote_sglang_version

    server = _VersionSftpServer(tmp_path, entries=1, stall=True)
    try:
        client, transport = _none_auth_connect(server)
        try:
            started = time.monotonic()
            found = remote_sglang_version(client, "/venv/site-packages/sglang", "", read_timeout=1.0)
            took = time.monotonic() - started
        finally:
            transport.close()
    finally:
        server.close()
    assert found is None and took < 20, took


def test_diff_text_shows_hostile_names_escaped(hostile_tree: Path) -> None:
    """`kvtrace diff` prints the names and notes of two trees: no control character of theirs
    reaches the terminal and no newline in a file name forges a line."""
    result = kvtrace("diff", str(ROOT / "examples" / "healthy"), str(hostile_tree), "--fail-on", "never",
                     env={"FORCE_COLOR": "1"})
    assert result.returncode in (0, 3), result.stderr
    assert "ni\\x1b[31mxl\\x1b]0;title\\x07" in result.stdout  # an added finding's path, escaped
    assert no_control(result.stdout) and no_control(result.stderr), repr(result.stdout[:2000])
    assert not any(line.strip() == FORGED for line in (result.stdout + result.stderr).splitlines())
