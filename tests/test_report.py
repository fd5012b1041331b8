"""What reaches the person and CI: the answer first at 80 columns, loud gaps in every format,
deterministic package choice, one-line errors before any scan, and CI outputs that place."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from rich.console import Console

from kvtrace.report.text import render
from kvtrace.scan import scan_path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
PATH_LINE = re.compile(r"(?<![\w/.-])(/?[\w.-]+(?:/[\w.-]+)*\.py):(\d+)")


def kvtrace(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def terminal_report(tree: Path, width: int = 80) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system=None, highlight=False)
    render(scan_path(tree), console)
    return buffer.getvalue()


def assert_paths_resolve(text: str, base: Path) -> None:
    """Every `path:line` token is whole and opens from the working directory: the file is one
    below `base` (the scanned tree) and has that line."""
    tokens = PATH_LINE.findall(text)
    assert tokens
    for path, line in tokens:
        file = Path(path)
        assert file.is_file(), f"{path}:{line} does not open from {Path.cwd()} (a folded path?)"
        assert file.resolve().is_relative_to(base.resolve()), f"{path}:{line} is not below {base}"
        assert 1 <= int(line) <= len(file.read_text(encoding="utf-8").splitlines()), f"{path}:{line}"


@pytest.mark.parametrize("example", ["nixl-pin", "dropped-else", "inherited-poll"])
def test_80_columns_answer_first_and_no_broken_token(example: str) -> None:
    text = terminal_report(EXAMPLES / example)
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), max(lines, key=len)
    head = "\n".join(lines[:20])
    # The verdict grid: its title, a header row naming every poll state whole, a row per backend.
    assert "Verdicts for disagg_prefill_inflight_queue" in head
    header = next(line for line in lines[:20] if line.startswith("backend "))
    for state in ("Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"):
        assert re.search(rf"\b{state}\b", header), (state, header)
    report = scan_path(EXAMPLES / example)
    for backend in report.backends:
        assert any(line.split()[:1] == [backend.name] for line in lines[:20]), backend.name
    assert_paths_resolve(text, EXAMPLES / example)


def test_nixl_pin_grid_and_summary_name_what_pins() -> None:
    lines = terminal_report(EXAMPLES / "nixl-pin").splitlines()
    nixl = next(line for line in lines if line.startswith("nixl "))
    mooncake = next(line for line in lines if line.startswith("mooncake "))
    header = next(line for line in lines if line.startswith("backend "))
    cells = dict(zip(header.split()[1:], nixl.split()[1:]))
    assert cells["WaitingForInput"] == cells["Transferring"] in ("PINNED-STATE", "KVT001")
    assert cells["Success"] == "ok"
    assert not {"PINNED-STATE", "KVT001"} & set(mooncake.split()[1:])  # mooncake pins nothing
    assert any(line.startswith("2 errors: nixl pins WaitingForInput, Transferring · ") for line in lines)
    # One excerpt for the backend, not one per state: the nixl sender's poll() line, read from the file.
    source = (EXAMPLES / "nixl-pin" / "disaggregation" / "nixl" / "conn.py").read_text().splitlines()
    poll = next(n for n, text in enumerate(source, 1) if "def poll(self)" in text and "pinned-state[nixl" in text)
    assert sum(1 for line in lines if re.match(rf"\s*❱\s*{poll}\b", line)) == 1


def test_the_header_says_where_the_package_is() -> None:
    """The package below the target is named by its folder; a target that is the package itself
    (the disaggregation folder, or a copy renamed) says so, never `package .`."""
    below = terminal_report(EXAMPLES / "nixl-pin").splitlines()[1]
    assert below.startswith("package disaggregation/ · "), below
    itself = terminal_report(EXAMPLES / "nixl-pin" / "disaggregation").splitlines()[1]
    assert itself.startswith("the target is the package (disaggregation/) · "), itself


def test_piped_text_is_plain_without_trailing_spaces() -> None:
    result = kvtrace("scan", "examples/dropped-else", env={"COLUMNS": "80"})
    assert result.returncode == 1
    assert "\x1b[" not in result.stdout
    lines = result.stdout.splitlines()
    assert not [line for line in lines if line != line.rstrip()]
    assert all(len(line) <= 80 for line in lines)
    assert "Verdicts for" in "\n".join(lines[:20])
    assert_paths_resolve(result.stdout, EXAMPLES / "dropped-else")


@pytest.fixture
def broken_backend(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    conn = tree / "disaggregation" / "nixl" / "conn.py"
    conn.write_text(conn.read_text() + "\ndef oops(:\n    pass\n")
    return tree


def test_syntax_error_in_a_backend_is_loud_everywhere(broken_backend: Path, tmp_path: Path) -> None:
    text = kvtrace("scan", str(broken_backend))
    assert text.returncode == 3
    stderr = text.stderr.splitlines()
    assert any("disaggregation/nixl/conn.py" in line and "syntax error" in line for line in stderr), text.stderr
    assert any("backend nixl not checked" in line for line in stderr), text.stderr
    assert "INCOMPLETE" in text.stdout
    nixl_row = next(line for line in text.stdout.splitlines() if line.startswith("nixl "))
    assert set(nixl_row.split()[1:]) == {"?"}
    # The header counts the backend the grid shows as unchecked, and says so.
    header = " ".join(text.stdout.splitlines()[1:3])
    rows = [line.split()[0] for line in text.stdout.splitlines()[:30] if line.split()[:1] and line.split()[0]
            in ("ascend", "fake", "mooncake", "nixl")]
    assert f"{len(set(rows))} backends (1 not checked)" in header, header
    assert any(line.endswith(" · INCOMPLETE: 1 file not analysed, backend nixl not checked")
               for line in text.stdout.splitlines()), text.stdout

    sarif_file = tmp_path / "k.sarif"
    sarif = kvtrace("scan", str(broken_backend), "--format", "sarif", "-o", str(sarif_file))
    assert sarif.returncode == 3
    doc = json.loads(sarif_file.read_text())
    jsonschema.validate(doc, SARIF_SCHEMA)
    invocation = doc["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False
    messages = [n["message"]["text"] for n in invocation["toolExecutionNotifications"]]
    assert any("nixl/conn.py" in m and "syntax error" in m for m in messages)
    assert any(m.startswith("backend nixl") for m in messages)

    data = json.loads(kvtrace("scan", str(broken_backend), "--format", "json").stdout)["reports"][0]
    assert data["complete"] is False and "INCOMPLETE" in data["summary"]
    assert {"kind": "backend", "subject": "nixl"}.items() <= next(g for g in data["gaps"] if g["kind"] == "backend").items()

    markdown = kvtrace("scan", str(broken_backend), "--format", "markdown").stdout
    assert "**INCOMPLETE**" in markdown and "backend `nixl`" in markdown


def test_all_files_over_the_size_limit_says_so() -> None:
    result = kvtrace("scan", "examples/nixl-pin", "--max-file-bytes", "10")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "too-large" in result.stderr and "over the per-file limit (--max-file-bytes 10)" in result.stderr
    assert "missing" not in result.stderr


@pytest.fixture
def two_versions(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES / "nixl-pin", tmp_path / "v-old")
    shutil.copytree(EXAMPLES / "all-clear", tmp_path / "v-new")
    return tmp_path


def test_several_packages_is_a_clear_error_whatever_the_hash_seed(two_versions: Path) -> None:
    results = [kvtrace("scan", str(two_versions), env={"PYTHONHASHSEED": seed}) for seed in ("0", "1")]
    assert results[0].returncode == results[1].returncode == 2
    assert results[0].stderr == results[1].stderr
    line = results[0].stderr.strip()
    assert "\n" not in line and "v-new/disaggregation/, v-old/disaggregation/" in line and "--all" in line


def test_many_packages_are_counted_not_all_listed(tmp_path: Path) -> None:
    """A tree of fixtures (kvtrace's own clone holds 25 packages) gives one short line: the
    first packages in version order, then how many more."""
    for n in range(1, 9):
        shutil.copytree(EXAMPLES / "all-clear", tmp_path / f"v{n}")
    result = kvtrace("scan", str(tmp_path))
    line = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in line
    assert "8 packages found (v1/disaggregation/, v2/disaggregation/, v3/disaggregation/, v4/disaggregation/, " \
           "v5/disaggregation/ and 3 more); scan one of them, or pass --all" in line
    assert "v6/" not in line


def test_all_scans_each_package_alone_whatever_the_hash_seed(two_versions: Path) -> None:
    outputs = [kvtrace("scan", str(two_versions), "--all", "--format", "json", env={"PYTHONHASHSEED": seed})
               for seed in ("0", "1")]
    assert outputs[0].returncode == outputs[1].returncode == 1
    assert outputs[0].stdout == outputs[1].stdout
    reports = json.loads(outputs[0].stdout)["reports"]
    assert [r["root"] for r in reports] == ["v-new/disaggregation", "v-old/disaggregation"]
    for report in reports:
        version = report["root"].split("/")[0] + "/"
        assert all(f["path"].startswith(version) for f in report["files"]), report["root"]
    assert not reports[0]["findings"]  # all-clear
    assert {(f["backend"], f["state"]) for f in reports[1]["findings"] if f["rule"] == "pinned-state"} == {
        ("nixl", "WaitingForInput"), ("nixl", "Transferring")}


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    return [
        (["scan", "user@:path"], "no host"),
        (["scan", "-"], "reading from stdin is not supported"),
        (["scan", "examples/healthy", "--max-files", "-5"], "--max-files"),
        (["scan", "examples/healthy", "--max-file-bytes", "0"], "--max-file-bytes"),
        (["scan", "examples/healthy", "--connect-timeout", "-1"], "--connect-timeout"),
        (["scan", "examples/healthy", "--read-timeout", "0"], "--read-timeout"),
        (["scan", "examples/healthy", "-o", str(tmp_path / "missing" / "k.sarif")], "does not exist"),
        (["scan", "examples/healthy", "-o", str(tmp_path)], "is a directory"),
        (["scan", "examples/healthy", "--format", "xml"], "--format"),
        (["scan", "examples/healthy", "--no-such-option"], "--no-such-option"),
        (["scan"], "TARGET"),
        (["scan", "examples/healthy", "-v", "-q"], "cannot be used together"),
        (["scan", str(tmp_path / "nope")], "no such file"),
        (["explain", "nope"], "unknown rule"),
    ]


def test_each_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    for args, fragment in _bad_inputs(tmp_path):
        result = kvtrace(*args)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr, args
        assert len(lines) == 1 and lines[0].startswith("kvtrace: error:"), (args, result.stderr)
        assert fragment in lines[0], (args, lines[0])
        assert result.stdout == "", args  # nothing was scanned
    assert not (tmp_path / "missing").exists()


def test_internal_error_exit_4_and_traceback_only_with_v(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import kvtrace.scan
    from kvtrace import cli

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(kvtrace.scan, "scan_fetched", broken)
    for extra, traceback_shown in (([], False), (["-v"], True)):
        with pytest.raises(SystemExit) as exited:
            cli.main(["scan", str(EXAMPLES / "healthy"), "--no-cache", *extra])
        assert exited.value.code == 4
        err = capsys.readouterr().err
        assert ("Traceback" in err) is traceback_shown
        assert err.strip().splitlines()[-1].startswith("kvtrace: internal error on ")


def test_multi_target_json_is_one_document_valid_against_kvtrace_schema() -> None:
    result = kvtrace("scan", "examples/nixl-pin", "examples/healthy", "examples/dropped-else", "--format", "json")
    document = json.loads(result.stdout)
    schema = json.loads(kvtrace("schema").stdout)
    jsonschema.validate(document, schema)
    assert document["schema"] == "kvtrace/2"
    assert [r["target"] for r in document["reports"]] == ["examples/nixl-pin", "examples/healthy",
                                                        "examples/dropped-else"]


@pytest.mark.parametrize("sarif_root", [None, "examples"])
def test_sarif_from_a_subfolder_resolves_from_the_working_directory(tmp_path: Path, sarif_root: str | None) -> None:
    out = tmp_path / "k.sarif"
    extra = ["--sarif-root", sarif_root] if sarif_root else []
    result = kvtrace("scan", "examples/nixl-pin", "examples/dropped-else", "--format", "sarif", "-o", str(out), *extra)
    assert result.returncode == 1, result.stderr
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SARIF_SCHEMA)
    base = ROOT / (sarif_root or "")
    uris = []
    for run in doc["runs"]:
        assert run["invocations"][0]["executionSuccessful"] is True
        for result_ in run["results"]:
            locations = [result_["locations"][0]] + [
                step["location"] for flow in result_.get("codeFlows", []) for thread in flow["threadFlows"]
                for step in thread["locations"]]
            for location in locations:
                physical = location["physicalLocation"]
                uri, line = physical["artifactLocation"]["uri"], physical["region"]["startLine"]
                assert (base / uri).is_file(), uri
                assert line <= len((base / uri).read_text().splitlines())
                uris.append(uri)
    assert uris and all(u.startswith("nixl-pin/" if sarif_root else "examples/") or
                        u.startswith("dropped-else/") for u in uris)
    rules = {r["name"]: r for r in doc["runs"][0]["tool"]["driver"]["rules"]}
    assert rules["pinned-state"]["id"] == "KVT001"
    assert rules["pinned-state"]["helpUri"].startswith("https://")
    assert "### Fix" in rules["pinned-state"]["help"]["markdown"]


def test_version_flag_and_help_habits() -> None:
    from kvtrace import __version__

    for flag in ("-V", "--version"):
        result = kvtrace(flag)
        assert result.returncode == 0 and result.stdout.strip() == f"kvtrace {__version__}"
    help_text = kvtrace("scan", "--help").stdout
    assert "TARGET..." in help_text and "FILE" in help_text and "Examples:" in help_text
    assert "kvtrace scan python/sglang --format sarif" in help_text
    assert "--install-completion" in kvtrace("--help").stdout


def test_detected_version_is_in_the_header(tmp_path: Path) -> None:
    tree = tmp_path / "site-packages" / "sglang" / "srt"
    shutil.copytree(EXAMPLES / "nixl-pin" / "disaggregation", tree / "disaggregation")
    (tmp_path / "site-packages" / "sglang" / "version.py").write_text('__version__ = "9.8.7"\n')
    first = terminal_report(tmp_path / "site-packages").splitlines()[0]
    assert "sglang 9.8.7" in first
    data = json.loads(kvtrace("scan", str(tmp_path / "site-packages"), "--format", "json").stdout)
    assert data["reports"][0]["version"] == {"package": "sglang", "version": "9.8.7",
                                             "path": "sglang/version.py", "line": 1}


def test_version_generated_by_setuptools_scm_is_found(tmp_path: Path) -> None:
    # Newer wheels: version.py only imports it; _version.py is generated with a chained assignment.
    tree = tmp_path / "sglang"
    shutil.copytree(EXAMPLES / "nixl-pin" / "disaggregation", tree / "srt" / "disaggregation")
    (tree / "version.py").write_text("try:\n    from sglang._version import __version__\nexcept ImportError:\n"
                                     "    __version__ = 'unknown'\n")
    (tree / "_version.py").write_text("__version__: str\n\n__version__ = version = '4.5.6'\n")
    data = json.loads(kvtrace("scan", str(tree), "--format", "json").stdout)
    assert data["reports"][0]["version"] == {"package": "sglang", "version": "4.5.6",
                                             "path": "_version.py", "line": 3}


def test_source_text_in_brackets_survives_the_terminal_report() -> None:
    # rich reads `[...]` in a plain str cell as markup and drops it; the report must not.
    text = terminal_report(EXAMPLES / "nixl-pin")
    assert "stores self.request_status[bootstrap_room]" in " ".join(text.split())


@pytest.mark.parametrize("output", ["/proc/kvtrace-report.txt", "/dev/full"])
def test_an_output_that_cannot_be_written_fails_before_the_scan(output: str) -> None:
    """Before: both failed only after the whole scan, with an OSError line."""
    result = kvtrace("scan", "examples/nixl-pin", "-o", output, "-v")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("kvtrace: error")]
    assert len(lines) == 1 and f"--output {output}: cannot" in lines[0]
    assert "fetched" not in result.stderr and "analys" not in result.stderr  # -v logs the scan's steps: none ran


def test_a_gauge_that_cannot_be_read_shows_under_quiet() -> None:
    """Before: with -q the fleet summary, the only place the failure was said, was hidden."""
    import socket

    with socket.socket() as holder:  # a port nothing listens on: bound, never listening
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        result = kvtrace("scan", "examples/nixl-pin", "-q", "--metrics", f"http://127.0.0.1:{port}/metrics",
                         "--metrics-seconds", "0", "-f", "json")
    assert result.returncode == 1
    [line] = [line for line in result.stderr.splitlines() if "metrics" in line]
    # Before: "kvtrace: metrics: examples/nixl-pin: metrics http://..." (metrics said twice).
    assert line.startswith("kvtrace: examples/nixl-pin: metrics http://127.0.0.1:") and "cannot read" in line
    assert line.split("http://")[0].count("metrics") == 1


def test_fleet_summary_names_the_backend_once_per_finding() -> None:
    """Before: `note[no-timeout] no-timeout WaitingForInput` four times, backend dropped, rule doubled."""
    from kvtrace.fleet import verdicts_of

    findings = [{"rule": "no-timeout", "severity": "note", "backend": b, "state": "WaitingForInput",
                 "path": f"srt/disaggregation/{b}/conn.py", "line": 10} for b in ("ascend", "mooncake")]
    findings += [{"rule": "unhandled-state", "severity": "warning", "backend": None, "state": "Success",
                  "path": "srt/disaggregation/prefill.py", "line": 5}] * 2
    # Before: a finding of no backend read "queue" whatever it was about (a manager's check_status()).
    findings += [{"rule": "unhandled-state", "severity": "warning", "backend": None, "state": "Success",
                  "queue": "disagg_prefill_inflight_queue", "path": "srt/disaggregation/prefill.py", "line": 6},
                 {"rule": "absent-room-default", "severity": "warning", "backend": None, "state": "WaitingForInput",
                  "queue": None, "function": "NixlKVManager.check_status", "path": "srt/nixl/conn.py", "line": 7}]
    assert verdicts_of(findings) == [
        "note[no-timeout] ascend WaitingForInput (srt/disaggregation/ascend/conn.py:10)",
        "note[no-timeout] mooncake WaitingForInput (srt/disaggregation/mooncake/conn.py:10)",
        "warning[unhandled-state] Success (srt/disaggregation/prefill.py:5)",
        "warning[unhandled-state] disagg_prefill_inflight_queue Success (srt/disaggregation/prefill.py:6)",
        "warning[absent-room-default] NixlKVManager.check_status() WaitingForInput (srt/nixl/conn.py:7)"]


def test_wording_of_unhandled_state_and_abort_ignored_on_0_5_23() -> None:
    """Before: "Success matches no test of the poll value in the drain loop" though prefill.py tests
    Success (only the pending_bootstrap path raises); "aborting a ascend transfer"."""
    from kvtrace.scan import scan_path
    from tests.sglang_wheels import sglang_tree

    report = scan_path(sglang_tree("0.5.23"))
    success = [f for f in report.findings if f.rule == "unhandled-state" and f.state == "Success"]
    assert success and all("is tested in the drain loop" in f.message and "handle_pending_bootstrap()" in f.message
                           for f in success)
    aborts = [f.message for f in report.findings if f.rule == "abort-ignored"]
    assert not any(" a ascend " in m for m in aborts)
    assert all(re.search(r"aborting (an [aeiou]|a [^aeiou])", m) for m in aborts if "aborting" in m)


def test_at_80_by_50_the_answer_is_on_screen_when_the_scan_ends() -> None:
    """Before: 0.5.14 printed 345 lines at 80 columns and the summary sat at line 206, so the
    screen showed the backends' detail when the command ended."""
    from tests.sglang_wheels import sglang_tree

    out = kvtrace("scan", str(sglang_tree("0.5.14")), env={"COLUMNS": "80"}).stdout.splitlines()
    assert len(out) > 50  # the full report does not fit one screen
    last_screen = "\n".join(_last_screen(out, rows=49, columns=80))  # 50 rows, one for the next prompt
    # Folded at 80 columns: the summary is the last lines after the grid's legend.
    summary = " ".join(last_screen[last_screen.rindex("\n12 warnings"):].split())
    # Two queues judged: the pin names its queue.
    assert summary == ("12 warnings: nixl pins WaitingForInput in disagg_prefill_inflight_queue only if two"
                       " requests share a bootstrap_room · 10 notes")
    # Both queues of the prefill host: each grid on the last screen.
    assert "Verdicts for disagg_prefill_inflight_queue" in last_screen
    assert "Verdicts for disagg_prefill_bootstrap_queue" in last_screen
    assert re.search(r"^nixl +\S+ +\S+ +KVT001~ ", last_screen, re.M)
    assert "~: a warning, it holds only if two requests share a bootstrap_room" in last_screen
    _long_path_lines_are_whole(out, 80, str(sglang_tree("0.5.14")))
    _absolute_paths_whole("\n".join(out), sglang_tree("0.5.14"))  # the release map's modes and fates too


def _last_screen(lines: list[str], rows: int, columns: int) -> list[str]:
    """The lines a terminal of rows x columns shows when the output ends: a line wider than the
    terminal (a whole absolute path) takes as many rows as the terminal wraps it into."""
    shown: list[str] = []
    used = 0
    for line in reversed(lines):
        used += max(1, -(-len(line) // columns))
        if used > rows:
            break
        shown.append(line)
    return shown[::-1]


def test_piped_text_is_folded_to_the_terminal_stderr_is_on(tmp_path: Path) -> None:
    """`kvtrace scan ... | less` from an 80-column terminal: folded to 80, as on screen. A pipe
    with no terminal anywhere (CI, a file) keeps one greppable line per row."""
    import fcntl
    import pty
    import struct
    import termios

    from tests.sglang_wheels import sglang_tree

    master, follower = pty.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        piped = subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(sglang_tree("0.5.14"))], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=follower, env=env, text=True, timeout=300)
    finally:
        os.close(master)
        os.close(follower)
    assert piped.returncode == 0
    _long_path_lines_are_whole(piped.stdout.splitlines(), 80, str(sglang_tree("0.5.14")))
    assert max(len(line) for line in piped.stdout.splitlines() if "/" not in line) <= 80
    unfolded = subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(sglang_tree("0.5.14"))], cwd=ROOT,
                              capture_output=True, env=env, text=True, timeout=300).stdout
    assert max(len(line) for line in unfolded.splitlines()) > 80


def test_an_excerpt_keeps_the_findings_own_line_at_80_columns(tmp_path: Path) -> None:
    """Before: at 80 columns the excerpt cut every line at the edge, the finding's own too:
    `❱ 44  self.request_status[bootstrap_room] = …`, leaving out the max() the finding is about.
    The line is folded under its code instead, within a few rows (a generated line is not
    printed whole), and its neighbours are still cut."""
    lines = terminal_report(EXAMPLES / "nixl-pin").splitlines()
    at = next(i for i, line in enumerate(lines) if "❱ 44 " in line)
    assert " ".join(part.strip() for part in lines[at:at + 2]).endswith(
        "self.request_status[bootstrap_room] = max(self.request_status[bootstrap_room], status)")
    assert all(len(line) <= 80 for line in lines if "/" not in line)
    tree = tmp_path / "tree"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    conn = tree / "disaggregation" / "mooncake" / "conn.py"
    text = conn.read_text().splitlines()
    text[43] = text[43] + "  # " + "padding " * 2000  # the finding's line, 16,000 characters longer
    conn.write_text("\n".join(text) + "\n")
    lines = terminal_report(tree).splitlines()
    at = next(i for i, line in enumerate(lines) if "❱ 44 " in line)
    after = next(i for i in range(at + 1, len(lines)) if lines[i].lstrip().startswith("45 "))
    assert after - at <= 5  # a few rows, not 200
    assert lines[after - 1].rstrip().endswith("…")  # and it says it was cut


def test_excerpts_leave_out_the_examples_test_annotations() -> None:
    examples = ROOT / "examples"
    annotated = [p for p in examples.rglob("*.py") if "# expect:" in p.read_text() or "; expect:" in p.read_text()]
    assert annotated
    for fmt in ("text", "markdown", "html"):
        out = kvtrace("scan", "examples/nixl-pin", "-f", fmt).stdout
        assert "def poll(self)" in out and "expect:" not in out, fmt


def _long_path_lines_are_whole(lines: list[str], width: int, target: str) -> None:
    """A line wider than the terminal is one whole `path:line` (or the header's target) that
    cannot fit, on a line of its own (its label, if any, on the line before; before, release-map
    and backend rows and the header kept it beside the path): left for the terminal to wrap,
    never cut (`…`) or split over two lines by kvtrace."""
    for line in lines:
        if len(line) <= width:
            continue
        words = line.split()
        assert len(words) == 1 and (PATH_LINE.search(words[0]) or words[0] == target), line
        assert len(line) - len(words[0]) < width // 2, line  # the path is what made it long


def _absolute_paths_whole(out: str, tree: Path) -> None:
    """Every absolute path printed under `tree` is whole: its prefix is always followed by file:line."""
    starts = [m.start() for m in re.finditer(re.escape(str(tree) + "/"), out)]
    assert starts
    for start in starts:
        assert PATH_LINE.match(out, start) is not None, out[start:start + 120]


def test_80_columns_absolute_paths_are_whole_and_open(tmp_path: Path) -> None:
    """Before: `COLUMNS=80 kvtrace scan /abs/path/to/a/release` cut paths to
    `/root/.cache/.../disaggregat…` and split others over two lines (`.../common/con` + `n.py:214`):
    neither could be copied and opened."""
    tree = tmp_path / "a-folder-with-a-long-name-as-a-wheel-cache-has" / "sglang-0.0.0" / "sglang" / "srt"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    result = kvtrace("scan", str(tree), cwd=ROOT, env={"COLUMNS": "80"})
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert len(PATH_LINE.findall(out)) > 20
    _absolute_paths_whole(out, tree)
    assert_paths_resolve(out, tree)
    assert "…" not in "\n".join(line for line in out.splitlines() if str(tree)[:20] in line)
    _long_path_lines_are_whole(out.splitlines(), 80, str(tree))


def test_all_names_each_package_in_its_short_answer(tmp_path: Path) -> None:
    """Before: `scan versions --all` ended with one "In short (as at the top): versions" per
    package, the same heading for each: the last screen gave no way to tell the answers apart."""
    for name in ("sglang-0.5.9", "sglang-0.5.23"):
        shutil.copytree(ROOT / "examples" / "nixl-pin", tmp_path / "versions" / name)
    result = subprocess.run([sys.executable, "-m", "kvtrace", "scan", "versions", "--all", "--no-cache"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 1, result.stderr
    headings = [line for line in result.stdout.splitlines() if line.startswith("In short")]
    # In version order, as a person lists releases (before: as strings, 0.5.23 first).
    assert headings == ["In short (as at the top): versions (package sglang-0.5.9/disaggregation)",
                        "In short (as at the top): versions (package sglang-0.5.23/disaggregation)"], headings


def test_role_all_at_80_by_50_both_roles_answers_are_on_the_end_screen() -> None:
    """Before: `--role all` printed the prefill report, then the decode report, each with its own
    "In short" at its end: the end screen showed the decode side's only, and the prefill side's
    pinned nixl was hundreds of lines up."""
    from tests.sglang_wheels import sglang_tree

    # Two full scans (one per role): more time than the one-scan helper allows on a loaded machine.
    result = subprocess.run([sys.executable, "-m", "kvtrace", "scan", "--role", "all", str(sglang_tree("0.5.14"))],
                            cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    last_screen = "\n".join(_last_screen(out, rows=49, columns=80))
    assert "In short (as at the top): role prefill" in last_screen
    assert "In short (as at the top): role decode" in last_screen
    for queue in ("disagg_prefill_inflight_queue", "disagg_prefill_bootstrap_queue",
                  "disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"):
        assert f"Verdicts for {queue}" in last_screen, queue
    assert re.search(r"^nixl +\S+ +\S+ +KVT001~ ", last_screen, re.M)  # the prefill side's pin
    flat = " ".join(last_screen.split())
    assert ("12 warnings: nixl pins WaitingForInput in disagg_prefill_inflight_queue only if two requests share a"
            " bootstrap_room · 10 notes") in flat
    # the decode side's summary, last before the legend (21 before the HiSparse `assert prefix_len
    # == 0` stopped being read as a test of the poll state, five false unhandled-state warnings)
    summary, _, legend = flat.partition("16 warnings · 8 notes ")
    assert summary and legend
    assert sum(line.startswith("In short") for line in out) == 2  # each once, not once per report and again
    # One legend under all four grids, each code in them explained once (each grid's own legend
    # is in its report, at the top).
    codes = set(re.findall(r"\bKVT\d{3}\b", summary.rpartition("In short (as at the top): role prefill")[2]))
    assert codes and all(len(re.findall(rf"\b{code}: [a-z-]+", legend)) == 1 for code in codes), legend
    assert legend.count("~: ") == 1 and legend.count("ok: ") == 1


def test_the_no_timeout_box_cites_poll_and_names_its_file(tmp_path: Path) -> None:
    """Before: where abort() ends a state through the manager's table, the "no timeout" box took
    the abort box's place, abort()'s write (0.5.14: `no timeout: ... · conn.py:925`, the
    `update_status(room, KVPoll.Failed)` line), and mermaid named a bare `conn.py`."""
    import networkx as nx

    from kvtrace.report.diagram import Diagram, _way_out, mermaid
    from kvtrace.report.places import Places

    tree = tmp_path / "nixl-pin"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    report = scan_path(tree)
    nixl = next(b for b in report.backends if b.name == "nixl")
    kept_states = ["Bootstrapping", "WaitingForInput", "Transferring"]
    graph = nx.DiGraph()
    graph.add_node(("check", 1), kind="check")
    graph.add_node(("outcome", "kept"), kind="outcome", label="kept", path="", line=0, css=[])
    graph.add_edge(("check", 1), ("outcome", "kept"), states=kept_states)
    _way_out(graph, nixl, kept_states, nixl.returns)
    abort, no_timeout = graph.nodes[("wayout", "abort")], graph.nodes[("wayout", "no-timeout")]
    assert nixl.poll is not None and (abort["path"], abort["line"]) != (nixl.poll.path, nixl.poll.line)
    assert (no_timeout["path"], no_timeout["line"]) == (nixl.poll.path, nixl.poll.line)
    graph.remove_node(("check", 1))
    for edge in graph.edges:
        graph.edges[edge].setdefault("css", [])
    text = mermaid(Diagram(nixl, graph, []), Places(report, cwd=tmp_path).path)
    [box] = [line for line in text.splitlines() if "n_wayout_no_timeout[" in line]
    assert box.endswith(f' · nixl-pin/{nixl.poll.path}:{nixl.poll.line}"]'), box
    assert f"· nixl-pin/{abort['path']}:{abort['line']}\"" in text


def test_a_deadline_not_reached_on_the_pinning_run_is_told_so_on_0_4_8() -> None:
    """Before: 0.4.8 mooncake Bootstrapping read "no timeout covers it ... until the server
    restarts" citing the timeout check (conn.py:728), while the note beside said "this backend has
    a deadline for Bootstrapping" and the diagram drew "L728 timeout: Bootstrapping". The check
    ends Bootstrapping only on runs of poll() that reach it; the report says which condition it
    sits under, read from the code, and the diagram's box says it is not reached for the pin."""
    from kvtrace.freeing import what_frees
    from kvtrace.report.diagram import diagrams
    from tests.sglang_wheels import sglang_tree

    tree = sglang_tree("0.4.8")
    report = scan_path(tree)
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    [check] = [t for t in mooncake.timeouts if "Bootstrapping" in t.covers]
    assert mooncake.verdicts["Bootstrapping"].pinned  # what the case is about
    [freeing] = [f for f in what_frees(report, mooncake) if f.state == "Bootstrapping"]
    assert "no timeout covers it" not in freeing.text
    guard = re.search(rf"the timeout check at {re.escape(check.path)}:{check.line} \(it runs only when `([^`]+)` holds, "
                      rf"{re.escape(check.path)}:(\d+)\), which ends Bootstrapping on other runs of poll\(\), is not "
                      r"reached on the run that keeps it, so the request stays until the server restarts", freeing.text)
    assert guard, freeing.text
    source = (tree / check.path).read_text().splitlines()
    assert source[int(guard.group(2)) - 1].strip() == f"if {guard.group(1)}:" and int(guard.group(2)) < check.line
    assert "timeout" not in " ".join(e.note for e in freeing.evidence if (e.path, e.line) == (check.path, check.line))
    box = next(d for d in diagrams(report) if d.backend.name == "mooncake").graph.nodes[("wayout", "timeout", 0)]
    assert box["label"] == f"L{check.line} timeout, not reached for pinned Bootstrapping"


@pytest.mark.parametrize(("code", "guard"), [
    ("def f(x):\n    if x.a is not None:\n        y = 1\n        pass\n        if y > 2:\n            return 3\n", ("x.a is not None", 2)),
    ("def f(x):\n    if x:\n        pass\n    else:\n        if y > 2:\n            return 3\n", None),
    ("def f(x):\n    if x:\n        pass\n    elif x.b:\n        if y > 2:\n            return 3\n", ("x.b", 4)),
])
def test_the_condition_a_timeout_check_sits_under(code: str, guard: tuple[str, int] | None) -> None:
    """The innermost `if` whose body holds the check; an `else` names none (its condition is a negation)."""
    from kvtrace.freeing import _innermost_guard

    assert _innermost_guard(code, 5) == guard


def test_fleet_and_merge_summaries_fold_to_the_terminal_and_paths_open_from_here(tmp_path: Path) -> None:
    """Before: the fleet summary of a scan named each finding's file relative to its target
    (`disaggregation/nixl/conn.py:89`, which does not open from the working directory), and
    neither it nor `kvtrace merge` was folded to the terminal's width (COLUMNS=60 here)."""
    scan = kvtrace("scan", "examples/nixl-pin", "examples/healthy", env={"COLUMNS": "60"})
    assert scan.returncode == 1, scan.stderr
    summary = scan.stdout[scan.stdout.index("Fleet: 2 hosts"):]
    lines = summary.splitlines()
    assert len(lines) > 10 and all(len(line) <= 60 or " " not in line.strip() for line in lines), lines
    assert "examples/nixl-pin/disaggregation/nixl/conn.py:89)" in summary
    assert_paths_resolve(summary, ROOT)
    # Unfolded with no terminal width to follow: one greppable line per verdict.
    wide = kvtrace("scan", "examples/nixl-pin", "examples/healthy", "-f", "json", "-o", str(tmp_path / "r.json"))
    made = tmp_path / "r.json"
    assert wide.returncode == 1 and made.exists()
    merged = kvtrace("merge", str(made), env={"COLUMNS": "60"}).stdout
    assert merged.startswith("Fleet: 2 hosts") and all(len(line) <= 60 or " " not in line.strip()
                                                      for line in merged.splitlines())
    assert "warning[absent-room-default] NixlKVManager.check_status() WaitingForInput" in " ".join(merged.split())


def test_the_diagram_reads_after_the_loop_from_the_graph_not_from_the_note() -> None:
    """Before: diagram.py found "(after the loop)" in the node's note text (issue 17: evidence
    kinds recovered from prose). It reads the node's `after_loop` now, which the engine sets on
    the events it records after the drain loop: a note that says the words changes no label."""
    import copy
    import dataclasses

    from kvtrace.report.diagram import diagrams
    from kvtrace.scan import scan_path

    report = scan_path(Path(__file__).parent.parent / "examples" / "nixl-pin")

    def labels(r) -> dict[int, str]:
        graph = diagrams(r)[0].graph
        return {data["line"]: data["label"] for _, data in graph.nodes(data=True) if data.get("kind") == "release"}

    assert labels(report)[80] == "L80 release (after the loop)"
    assert report.drawn is not None
    flipped = copy.deepcopy(report.graphs[report.drawn])
    for node, data in flipped["nodes"]:
        if data.get("after_loop"):
            del data["after_loop"]  # its note still says "(after the loop)"
            assert any("(after the loop)" in d for d in data["details"])
        elif node[0] == "release":
            data["after_loop"] = True
    relabelled = labels(dataclasses.replace(report, graphs={**report.graphs, report.drawn: flipped}))
    assert relabelled[80] == "L80 release"
    assert [line for line, label in relabelled.items() if label.endswith("(after the loop)")] == \
        [line for line in labels(report) if line != 80]


def test_an_analysis_problem_is_labelled_as_one_in_text_and_markdown() -> None:
    """The label column of INCOMPLETE names what kind of gap a row is: a problem of the analysis
    reads `analysis <reason>`, never `scan <reason>` (read as an order to scan something)."""
    folder = "examples/dropped-else/disaggregation"  # the queue objects are bound outside it
    text = kvtrace("scan", folder, "--no-map", env={"COLUMNS": "80"})
    assert text.returncode == 3, text.stderr
    lines = text.stdout.splitlines()
    at = lines.index("INCOMPLETE: 1 analysis problem")
    assert lines[at + 1].startswith("  analysis self.disagg_prefill_bootstrap_queue is bound outside"), lines[at + 1]
    assert not any(line.startswith("  scan ") for line in lines), text.stdout
    markdown = kvtrace("scan", folder, "--format", "markdown").stdout
    assert "- analysis: self.disagg_prefill_bootstrap_queue is bound outside" in markdown, markdown


def test_an_incomplete_reason_beside_its_subject_never_cuts_a_word() -> None:
    """Before: beside a long subject the reason's column was 27 characters at 80 columns, and
    `self.disagg_prefill_inflight_queue` came out as `..._infligh` / `t_queue`."""
    from kvtrace.model import Gap, GapKind
    from kvtrace.report.text import _gaps

    word = "self.disagg_prefill_inflight_queue"
    gaps = [Gap(GapKind.BACKEND, "a_backend_with_a_rather_long_folder_name", f"{word} is neither filled nor drained here"),
            Gap(GapKind.BACKEND, "nixl", "not checked")]
    buffer = io.StringIO()
    _gaps(gaps, Console(file=buffer, width=80, force_terminal=False, color_system=None), 0)
    text = buffer.getvalue()
    assert word in text and all(len(line) <= 80 for line in text.splitlines()), text


def _grid_layouts(text: str) -> list[tuple[str, bool]]:
    """Per verdict grid of a plain report: what its header starts with (`backend`: states as
    columns, `state`: backends as columns) and whether its cells hold rule codes."""
    layouts = []
    for block in text.split("Verdicts for")[1:]:
        rows = block.split("\n\n")[0].splitlines()
        header = next(i for i, row in enumerate(rows) if row.split()[:1] in (["backend"], ["state"]))
        layouts.append((rows[header].split()[0], any(re.search(r"\bKVT\d{3}\b", row) for row in rows[header + 1:])))
    return layouts


@pytest.mark.parametrize("example", ["installed-layout", "healthy", "inherited-poll"])
def test_every_grid_of_a_report_is_laid_out_alike_at_any_width(example: str) -> None:
    """A report with several queues never shows rule names in one grid and codes (or the other
    orientation) in the next: they are laid out the first way that fits all of them."""
    from kvtrace.report import render_plain

    report = scan_path(EXAMPLES / example)
    kinds = set()
    for width in range(48, 164, 4):
        layouts = _grid_layouts(render_plain([report], width))
        assert len(layouts) >= 2 and len(set(layouts)) == 1, (width, layouts)
        kinds.add(layouts[0])
    assert len(kinds) >= 2  # the widths tried do change the layout


def test_summary_names_the_backends_a_queue_error_reaches() -> None:
    """A queue rule's error (state-crash: the drain raises on the state) names the backends whose
    poll() returns that state, the rows its grid marks: fake never returns Bootstrapping."""
    from kvtrace.report.verdicts import summary_line, verdict_grid

    report = scan_path(ROOT / "examples" / "healthy")
    line = summary_line(report)
    assert "queue state-crash Bootstrapping (mooncake, mori, nixl)" in line, line
    grid = verdict_grid(report)
    marked = [b for b in grid.backends if grid.cells[b, "Bootstrapping"][1] == "error"]
    assert marked == ["mooncake", "mori", "nixl"]


def test_summary_names_states_together_only_where_they_reach_the_same_backends() -> None:
    """SGLang 0.5.9's drain raises on WaitingForInput (every backend returns it) and on
    Transferring (mori alone does): the summary said "state-crash WaitingForInput, Transferring
    (ascend, fake, mooncake, mori, nixl)", naming four backends that never return Transferring."""
    from kvtrace.model import Finding, Severity
    from kvtrace.report.verdicts import _named

    reaches = {"WaitingForInput": ["ascend", "mori"], "Transferring": ["mori"], "Bootstrapping": ["ascend", "mori"]}

    def crash(state: str) -> Finding:
        return Finding("state-crash", Severity("error"), "", "prefill.py", 1, None, state, [])

    named = _named([crash("WaitingForInput"), crash("Transferring"), crash("Bootstrapping")],
                   reached=lambda f: reaches[f.state or ""])
    assert named == ("queue state-crash WaitingForInput, Bootstrapping (ascend, mori); "
                     "queue state-crash Transferring (mori)"), named
