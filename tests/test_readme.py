"""The README as a user runs it: its sample output is what kvtrace prints, and its CI snippet's
commands work in the order a workflow runs them (the upload step is reached, the job then fails)."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())


def test_sample_output_is_what_kvtrace_prints() -> None:
    marker = re.search(r"<!-- sample: COLUMNS=(\d+) kvtrace (.*?) \(first (\d+) lines.*?-->\n```text\n(.*?)```",
                       README, re.S)
    assert marker, "the README's sample block and its marker"
    columns, args, count, block = marker.group(1), marker.group(2).split(), int(marker.group(3)), marker.group(4)
    result = subprocess.run([sys.executable, "-m", "kvtrace", *args, "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "COLUMNS": columns})
    assert result.returncode == 1, result.stderr
    assert block.splitlines() == result.stdout.splitlines()[:count]


def _ci_steps() -> list[str]:
    section = README[README.index("### In CI"):README.index("## Rules")]
    yaml = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return [line.split("run: ", 1)[1] for line in yaml.splitlines() if line.startswith("- run: ")]


def test_ci_snippet_runs_as_written(tmp_path: Path) -> None:
    steps = _ci_steps()
    # The install from the git URL is run as written by tests/test_github_files.py; here the
    # kvtrace installed for the suite stands in for it.
    assert steps[0] == 'pip install "git+https://github.com/<owner>/kvtrace@<tag>"'
    shutil.copytree(ROOT / "examples" / "nixl-pin", tmp_path / "python" / "sglang")
    github_env = tmp_path / "github_env"
    github_env.write_text("")
    env = {**os.environ, "GITHUB_ENV": str(github_env),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    codes = []
    for step in steps[1:]:
        # As GitHub runs `run:` steps: bash -eo pipefail, with what earlier steps put in GITHUB_ENV.
        for line in github_env.read_text().splitlines():
            key, _, value = line.partition("=")
            env[key] = value
        codes.append(subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step],
                                    cwd=tmp_path, env=env, timeout=300, capture_output=True, text=True).returncode)
    assert codes[0] == 0  # the scan step never stops the job before the upload
    sarif = json.loads((tmp_path / "kvtrace.sarif").read_text())
    jsonschema.validate(sarif, SARIF_SCHEMA)
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in sarif["runs"][0]["results"]}
    assert uris and all((tmp_path / uri).is_file() and uri.startswith("python/sglang/") for uri in uris)
    assert codes[-1] == 1  # ...and the last step fails the job on the findings


def test_local_sshd_block_runs_as_written() -> None:
    """The README's "Trying it without a remote host" block, as a user pastes it into bash (on a
    free port instead of 2222, which another process may hold): a real sshd, a remote scan of
    the bundled example that answers as the local scan does, and nothing left running."""
    from tests.sshd_server import free_port, require_sshd

    require_sshd()
    block = re.search(r"<!-- local sshd:.*?-->\n```sh\n(.*?)```", README, re.S).group(1)
    port = str(free_port())
    script = block.replace("2222", port)
    kvtrace = ROOT / ".venv" / "bin" / "kvtrace"
    if not kvtrace.exists():  # the suite's own kvtrace stands in for the README's venv
        script = script.replace(".venv/bin/kvtrace", str(Path(sys.executable).parent / "kvtrace"))
    run = subprocess.Popen(["bash", "--noprofile", "--norc", "-c", script], cwd=ROOT, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = run.communicate(timeout=120)
        left = _session_alive(run.pid, wait=10)  # `kill $!` stopped the sshd (it may take a moment)
    finally:
        try:
            os.killpg(run.pid, 9)  # sshd too, should the block not have stopped it
        except ProcessLookupError:
            pass
    local = subprocess.run([sys.executable, "-m", "kvtrace", "scan", "examples/nixl-pin", "--no-map"], cwd=ROOT,
                           capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert f"127.0.0.1:{port}:{ROOT}/examples/nixl-pin" in out, (out, err)
    assert "2 errors: nixl pins WaitingForInput, Transferring" in out, (out, err)
    assert local.stdout.splitlines()[-1] == out.splitlines()[-1]  # the same answer as the local scan
    assert not left


def _session_alive(group: int, wait: float) -> bool:
    """Whether a live process of the group (not a zombie waiting for its reaper) is still there
    after up to `wait` seconds."""
    import time

    deadline = time.monotonic() + wait
    while True:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[2]) == group and fields[0] != "Z":
                alive = True
                break
        if not alive:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)


def test_summary_line_quoted_is_what_kvtrace_prints() -> None:
    quoted = re.search(r"on `examples/nixl-pin`:\s+`([^`]+)`", README)
    assert quoted, "the summary-line example and the example it comes from"
    result = subprocess.run([sys.executable, "-m", "kvtrace", "scan", "examples/nixl-pin", "--no-cache", "--no-map"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert " ".join(quoted.group(1).split()) in result.stdout.splitlines()


class _StuckGauge(http.server.BaseHTTPRequestHandler):
    """A Prometheus page whose prefill inflight gauge stays at 1 (the symptom kvtrace explains)."""

    PAGE = (b"# TYPE sglang:num_prefill_inflight_queue_reqs gauge\n"
            b'sglang:num_prefill_inflight_queue_reqs{engine_type="unified",model_name="m",tp_rank="0"} 1.0\n')

    def do_GET(self) -> None:  # noqa: N802 -- the http.server hook's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.PAGE)

    def log_message(self, *args: object) -> None:
        pass


def test_fleet_sample_is_what_kvtrace_prints(tmp_path: Path) -> None:
    """The Fleets sample, run as written against a local page with a stuck gauge (on a free port
    instead of 30000) on the SGLang 0.5.2 wheel's tree."""
    from tests.sglang_wheels import sglang_tree

    section = README[README.index("### Fleets"):README.index("### Speed")]
    block = re.search(r"```text\n\$ (kvtrace scan .*?)\n(.*?)```", section, re.S)
    assert block, "the Fleets sample"
    command, expected = block.group(1), block.group(2)
    server = http.server.HTTPServer(("127.0.0.1", 0), _StuckGauge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        tree = sglang_tree("0.5.2") / "sglang"
        shown = "~/.cache/kvtrace-tests/trees/0.5.2/sglang"
        args = command.split()[1:]
        args = [str(tree) if a == shown else a.replace(":30000/", f":{server.server_port}/") for a in args]
        # As written in a file: no COLUMNS (a test runner may export one), so the summary is unfolded.
        result = subprocess.run([sys.executable, "-m", "kvtrace", *args, "--no-cache"], cwd=tmp_path,
                                capture_output=True, text=True, timeout=300,
                                env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    finally:
        server.shutdown()
        thread.join()
    assert result.returncode == 1, result.stderr
    assert (tmp_path / "report.json").is_file()

    def normal(text: str) -> list[str]:
        # The same tree wherever the cache is; the sampled span is whatever the clock gave (3.0 s).
        text = re.sub(r"\S*/kvtrace-tests/trees/0\.5\.2/sglang", "TREE", text.replace(str(tree), "TREE"))
        return re.sub(r" for \d+\.\d s ", " for N s ", text).splitlines()

    assert normal(expected) == normal(result.stderr)


def test_rules_table_lists_every_rule_with_its_code_and_severity() -> None:
    """The README's Rules table is the list a user reads: one row per rule in ALL_RULES, with its
    code, name and default severity, and no row for a rule that does not exist."""
    from kvtrace.rules import ALL_RULES

    rows = set(re.findall(r"^\| (KVT\d{3}) \| `([a-z-]+)` \| (error|warning|note) \|", README, re.MULTILINE))
    assert rows == {(r.code, r.name, r.severity) for r in ALL_RULES}
