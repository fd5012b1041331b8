"""Fleets: several real sshd servers on 127.0.0.1 (one failing, one serving a metrics page behind
it through direct-tcpip), --hosts files, one analysis per tree, the summary, `kvtrace merge`.

The trees are a real SGLang release (0.5.23, from its wheel) laid out as a site-packages install
with the wheel's own dist-info, so the version comes from real package metadata.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ is not a package

from sglang_wheels import sglang_tree, wheel  # noqa: E402
from sshd_server import SshdServer, generate_key, require_sshd  # noqa: E402

from kvtrace.fleet import read_hosts_file, render_summary, summaries_from_json, worst_exit  # noqa: E402
from kvtrace.metrics import MetricsSample, parse_metrics_url, queue_gauges, sample, tcp_opener  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.5.23"
GAUGE = "sglang:num_prefill_inflight_queue_reqs"


def kvtrace(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def site_packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site-packages/{sglang/..., sglang-0.5.23.dist-info/METADATA} from the released wheel."""
    site = tmp_path_factory.mktemp("site-packages")
    shutil.copytree(sglang_tree(VERSION) / "sglang", site / "sglang")
    with zipfile.ZipFile(wheel(VERSION)) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        (site / Path(metadata).parent.name).mkdir()
        (site / metadata).write_bytes(archive.read(metadata))
    return site


class MetricsPage:
    """A real HTTP server on 127.0.0.1 serving a Prometheus text page; the gauge is settable."""

    def __init__(self) -> None:
        self.value = 1
        self.requests = 0
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                page.requests += 1
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = (
                    f"# HELP {GAUGE} The number of requests in the prefill inflight queue.\n"
                    f"# TYPE {GAUGE} gauge\n"
                    f'{GAUGE}{{engine_type="unified",model_name="m",tp_rank="0"}} {page.value}\n'
                    "# HELP sglang:num_running_reqs running\n# TYPE sglang:num_running_reqs gauge\n"
                    'sglang:num_running_reqs{model_name="m"} 0\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture()
def metrics_page() -> Iterator[MetricsPage]:
    page = MetricsPage()
    yield page
    page.close()


class Fleet:
    """Three real sshd servers sharing one client key: `good` (forwarding allowed), `noforward`
    (AllowTcpForwarding no) and `unknown` (its host key is not in known_hosts: it must fail)."""

    def __init__(self, base: Path) -> None:
        self.good = SshdServer.start()
        self.noforward = SshdServer.start(extra_config=["AllowTcpForwarding no"])
        self.unknown = SshdServer.start()
        self.key = base / "client_ed25519"
        public = generate_key(self.key)
        for server in (self.good, self.noforward, self.unknown):
            server.authorize(public)
        self.known_hosts = base / "known_hosts"
        self.known_hosts.write_text(self.good.known_hosts_entry() + self.noforward.known_hosts_entry())
        self.ssh_config = base / "ssh_config"
        self.ssh_config.write_text("")

    def target(self, server: SshdServer, path: Path) -> str:
        return f"ssh://{server.user}@127.0.0.1:{server.port}{path}"

    def args(self) -> list[str]:
        return ["-i", str(self.key), "--known-hosts", str(self.known_hosts), "--ssh-config", str(self.ssh_config),
                "--connect-timeout", "20", "--read-timeout", "60"]

    def stop(self) -> None:
        for server in (self.good, self.noforward, self.unknown):
            server.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_sshd()
    servers = Fleet(tmp_path_factory.mktemp("fleet"))
    yield servers
    servers.stop()


def test_fleet_over_real_sshd_one_failing_one_with_metrics(fleet: Fleet, site_packages: Path,
                                                         metrics_page: MetricsPage, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(
        "# prefill hosts\n"
        f"{fleet.target(fleet.good, site_packages / 'sglang')}   # forwards: gauge read\n"
        "\n"
        f"{fleet.target(fleet.noforward, site_packages / 'sglang')}\n"
        f"{fleet.target(fleet.unknown, site_packages / 'sglang')}\n"
    )
    result = kvtrace("scan", "--hosts", str(hosts), *fleet.args(), "--format", "json", "--no-cache", "-v",
                     "--metrics", metrics_page.url, "--metrics-seconds", "1", "--jobs", "3")
    # The unknown host fails (exit 2, the worst), with one line; the other two are still scanned.
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("kvtrace: error:")]
    assert len(errors) == 1 and f"127.0.0.1:{fleet.unknown.port}" in errors[0] and "unknown host key" in errors[0]
    reports = json.loads(result.stdout)
    reports = reports["reports"] if isinstance(reports, dict) else reports
    assert len(reports) == 2
    good, noforward = reports
    assert good["host"] == fleet.target(fleet.good, site_packages / "sglang")
    assert good["sglang_version"] == VERSION and noforward["sglang_version"] == VERSION
    # The page behind the first sshd, read through its connection, sampled twice over a second.
    assert good["metrics"]["error"] is None and good["metrics"]["samples"] == 2
    [(name, values)] = [(k, v) for k, v in good["metrics"]["gauges"].items() if k.startswith(GAUGE)]
    assert values == [1, 1] and 'model_name="m"' in name
    # The second sshd refuses forwarding: the same URL cannot be read through it, and says so.
    assert noforward["metrics"]["error"] and noforward["metrics"]["gauges"] == {}
    # Identical trees on two hosts: analysed once (the second is this run's memo).
    assert result.stderr.count("analysed in") == 1 and result.stderr.count("cached result") == 1
    # Connection set-up is timed in -v.
    assert "authenticated as" in result.stderr and "tcp connect" in result.stderr
    # The summary (stderr for JSON output) groups the two identical trees and shows the gauge.
    # Read unfolded: the summary folds to the terminal's width (80 when there is none).
    summary = " ".join(result.stderr[result.stderr.index("Fleet: 3 hosts"):].split())
    assert "exit 2 (worst host)" in summary and f"sglang {VERSION}" in summary
    # The time shown is the one measured from the first sample to the last (a busy machine
    # makes it longer than the 1 s interval asked for, never shorter).
    shown = re.search(rf"{GAUGE}\S* 1 for (\d+\.\d) s \(2 samples\)", summary)
    assert shown is not None, summary
    assert abs(float(shown.group(1)) - good["metrics"]["seconds"]) <= 0.051 and good["metrics"]["seconds"] >= 0.95
    assert "Identical trees: 1 distinct" in summary and "(2 hosts)" in summary
    assert "FAILED (exit 2)" in summary


def test_gauge_changes_are_shown_as_a_series(metrics_page: MetricsPage) -> None:
    url = parse_metrics_url(metrics_page.url)
    flips = threading.Timer(0.5, lambda: setattr(metrics_page, "value", 0))
    flips.start()
    try:
        taken = sample(tcp_opener, url, seconds=1.0, interval=1.0)
    finally:
        flips.cancel()
    assert taken.error is None and taken.samples == 2
    key = next(k for k in taken.gauges if k.startswith(GAUGE))
    assert taken.gauges[key] == [1, 0]
    assert any("1 -> 0" in line for line in taken.summary())
    assert not any(k.startswith("sglang:num_running_reqs") for k in taken.gauges)  # not a queue gauge


def test_metrics_errors_are_reported_not_raised(metrics_page: MetricsPage) -> None:
    missing = parse_metrics_url(metrics_page.url.replace("/metrics", "/nope"))
    assert "HTTP 404" in (sample(tcp_opener, missing, seconds=0).error or "")
    metrics_page.close()
    refused = sample(tcp_opener, parse_metrics_url(metrics_page.url), seconds=0)
    assert refused.error and refused.samples == 0
    metrics_page.server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)  # for the fixture's close
    metrics_page.thread = threading.Thread(target=metrics_page.server.serve_forever, daemon=True)
    metrics_page.thread.start()


def test_exposition_is_parsed_by_prometheus_client() -> None:
    text = (f"# TYPE {GAUGE} gauge\n{GAUGE}{{tp_rank=\"0\"}} 1\n{GAUGE}{{tp_rank=\"1\"}} 0.0\n"
            "# TYPE other_total counter\nother_total 5\n")
    assert queue_gauges(text) == {f'{GAUGE}{{tp_rank="0"}}': 1.0, f'{GAUGE}{{tp_rank="1"}}': 0.0}
    with pytest.raises(ValueError):
        queue_gauges(f"{GAUGE} not-a-number\n")


def test_bad_metrics_url_is_a_usage_error(tmp_path: Path) -> None:
    result = kvtrace("scan", "examples/nixl-pin", "--metrics", "ftp://x/metrics")
    assert result.returncode == 2 and result.stderr.strip().startswith("kvtrace: error: --metrics")


def test_local_fleet_identical_trees_and_worst_exit(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(ROOT / "examples" / "nixl-pin", a)
    shutil.copytree(ROOT / "examples" / "nixl-pin", b)
    result = kvtrace("scan", str(a), str(b), "examples/all-clear", "--no-map", "--no-cache", "-v")
    assert result.returncode == 1, result.stderr  # findings on two hosts, none failed
    assert result.stderr.count("analysed in") == 2 and result.stderr.count("cached result") == 1
    assert "Fleet: 3 hosts, exit 1 (worst host)" in result.stdout
    assert f"(2 hosts): {a}, {b}" in " ".join(result.stdout.split())  # folded to the terminal's width
    assert "\x1b[" not in result.stdout + result.stderr  # piped: no progress display, no colour
    quiet = kvtrace("scan", str(a), str(b), "--quiet", "--format", "json")
    assert quiet.returncode == 1 and quiet.stderr == ""


def test_hosts_file_comments_and_errors(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# fleet\nprefill-1:/srv/sglang  # rack 1\n\n  ssh://ops@prefill-2:2222/srv/#x\n")
    assert read_hosts_file(hosts) == ["prefill-1:/srv/sglang", "ssh://ops@prefill-2:2222/srv/#x"]
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    for path in (empty, tmp_path / "missing"):
        result = kvtrace("scan", "--hosts", str(path))
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--hosts" in result.stderr


def test_merge_json_reports_from_each_host(tmp_path: Path, site_packages: Path) -> None:
    made = []
    for name, target in [("h1", ROOT / "examples" / "nixl-pin"), ("h2", ROOT / "examples" / "nixl-pin"),
                         ("h3", ROOT / "examples" / "all-clear"), ("h4", site_packages / "sglang")]:
        out = tmp_path / name / "kvtrace.json"
        out.parent.mkdir()
        kvtrace("scan", str(target), "--format", "json", "-o", str(out))
        data = json.loads(out.read_text())
        data["reports"][0]["host"] = name  # as each host would name itself
        out.write_text(json.dumps(data))
        made.append(out)
    result = kvtrace("merge", *map(str, made))
    assert result.returncode == 1, result.stderr
    assert "Fleet: 4 hosts, exit 1 (worst host)" in result.stdout
    assert "(2 hosts): h1, h2" in result.stdout and f"h4  sglang {VERSION}" in result.stdout
    assert "nixl can pin WaitingForInput" in result.stdout
    as_json = json.loads(kvtrace("merge", *map(str, made), "--format", "json").stdout)
    assert as_json["exit_code"] == 1 and [h["target"] for h in as_json["hosts"]] == ["h1", "h2", "h3", "h4"]
    # The merge of live results and of their JSON is the same summary.
    live = summaries_from_json([json.loads(p.read_text()) for p in made], "x")
    # (word for word: piped with a terminal to look at, the command folds to its width)
    assert render_summary(live).split() == result.stdout.split()
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    for path in (bad, tmp_path / "missing.json"):
        failed = kvtrace("merge", str(made[0]), str(path))
        assert failed.returncode == 2 and failed.stderr.startswith("kvtrace: error:") \
            and failed.stderr.count("\n") == 1


def test_worst_exit_order() -> None:
    assert worst_exit([0, 1, 3]) == 3 and worst_exit([3, 2, 1]) == 2 and worst_exit([0, 0]) == 0
    assert worst_exit([]) == 0


def test_summary_lines_for_a_sample() -> None:
    stuck = MetricsSample("u", seconds=30.0, samples=31, gauges={GAUGE: [1.0] * 31})
    assert stuck.summary() == [f"{GAUGE} 1 for 30.0 s (31 samples)"]
    assert MetricsSample("u", error="cannot read: refused").summary() == ["metrics u: cannot read: refused"]



def test_progress_shows_on_a_terminal_only(tmp_path: Path) -> None:
    """On a terminal (a real pty) stderr gets the per-host progress display; piped it gets none."""
    import pty

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(ROOT / "examples" / "nixl-pin", a)
    shutil.copytree(ROOT / "examples" / "healthy", b)
    controller, terminal = pty.openpty()
    out = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "kvtrace", "scan", str(a), str(b), "--no-cache", "-f", "json",
                             "-o", str(out)], cwd=ROOT, stdin=terminal, stdout=terminal, stderr=terminal,
                            env={**os.environ, "TERM": "xterm", "COLUMNS": "120"})
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the pty closes (EIO) when the process exits
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert proc.wait(timeout=120) == 1
    text = shown.decode("utf-8", "replace")
    assert f"{a}: " in text and "\x1b[" in text  # the live display, drawn with terminal codes
    assert "Fleet: 2 hosts" in text and len(json.loads(out.read_text())["reports"]) == 2


def test_text_header_names_the_installed_version_of_a_folder_scanned(site_packages: Path) -> None:
    """Before: scanning site-packages/sglang/srt/disaggregation put the version (read from the
    dist-info above it) in JSON and markdown but not in the text report's first line."""
    result = subprocess.run([sys.executable, "-m", "kvtrace", "scan", "--no-cache",
                             str(site_packages / "sglang" / "srt" / "disaggregation")],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    first, second = result.stdout.splitlines()[:2]
    assert f"· sglang {VERSION} ·" in first, first
    assert "version from the installed package's metadata" in second, second


def test_merge_names_each_finding_file_on_the_host_it_was_read_on(tmp_path: Path) -> None:
    """Before: `kvtrace merge` printed the JSON's target-relative paths
    (`disaggregation/nixl/conn.py:84`), which name no file on the machine reading the merge nor
    say which host's it is. Now `host:target/path:line`: the host a local scan named itself
    with, or the SSH target's own `user@host:folder`."""
    out = tmp_path / "local.json"
    kvtrace("scan", "examples/nixl-pin", "--format", "json", "-o", str(out))
    data = json.loads(out.read_text())
    report = data["reports"][0]
    pin = next(f for f in report["findings"] if f["rule"] == "pinned-state")
    report["host"] = "prefill-7"
    out.write_text(json.dumps(data))
    over_ssh = tmp_path / "ssh.json"
    report["target"], report["host"] = "ops@prefill-8:/srv/sglang", "prefill-8"
    over_ssh.write_text(json.dumps(data))
    text = kvtrace("merge", str(out), str(over_ssh)).stdout
    assert f"(prefill-7:examples/nixl-pin/{pin['path']}:{pin['line']})" in text, text
    assert f"(ops@prefill-8:/srv/sglang/{pin['path']}:{pin['line']})" in text, text
    assert f"({pin['path']}:" not in text
