"""Paths a person reads open from where they stand: text, markdown, github and concise show each
path:line relative to the working directory when the file is under it, else absolute, and a
remote file as host:path; JSON and SARIF keep their own paths and the fingerprints do not move.

Before: scanning ~/x/sglang/srt printed `disaggregation/prefill.py:812`, which does not open from
the working directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from kvtrace.model import Report
from kvtrace.report.places import Places
from kvtrace.scan import scan_path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# A path:line token: relative or absolute, or host:path (the host part is checked separately).
PATH_LINE = re.compile(r"(?<![\w/.:-])((?:[\w.@-]+:)?/?[\w.-]+(?:/[\w.-]+)*\.py):(\d+)")


def kvtrace(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    return subprocess.run([sys.executable, "-m", "kvtrace", *args, "--no-cache"], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """nixl-pin two folders below a project folder: `project/vendor/srt`."""
    target = tmp_path / "project" / "vendor" / "srt"
    shutil.copytree(EXAMPLES / "nixl-pin", target)
    return target


def _tokens(text: str) -> list[tuple[str, int]]:
    found = [(path, int(line)) for path, line in PATH_LINE.findall(text)]
    assert found
    return found


def _line(path: Path, line: int) -> str:
    return path.read_text(encoding="utf-8").splitlines()[line - 1]


def _assert_opens(text: str, cwd: Path, tree: Path) -> None:
    """Every path:line opens from `cwd` and is a line of a file of the scanned tree."""
    for path, line in _tokens(text):
        file = cwd / path
        assert file.is_file(), f"{path}:{line} does not open from {cwd}"
        assert file.resolve().is_relative_to(tree.resolve()), f"{path}:{line} is not in the scanned tree"
        assert 1 <= line <= len(file.read_text(encoding="utf-8").splitlines()), f"{path}:{line}"


@pytest.mark.parametrize("where", ["above", "outside", "inside"])
def test_text_paths_open_from_the_working_directory(tree: Path, tmp_path: Path, where: str) -> None:
    """Scanned from the project folder (paths `vendor/srt/...`), from a folder beside it (absolute
    paths) and from the tree itself (the report's own paths)."""
    cwd = {"above": tree.parent.parent, "outside": tmp_path / "elsewhere", "inside": tree}[where]
    cwd.mkdir(exist_ok=True)
    result = kvtrace("scan", str(tree), cwd=cwd)
    assert result.returncode == 1, result.stderr  # nixl-pin pins: the gate fails
    _assert_opens(result.stdout, cwd, tree)
    prefix = {"above": "vendor/srt/", "outside": f"{tree.resolve()}/", "inside": ""}[where]
    report = scan_path(tree)
    for finding in report.findings:
        # The finding's head names the line that says what the finding claims: the same line the
        # report (target-relative) points at.
        head = f"[{finding.rule}] at {prefix}{finding.path}:{finding.line}"
        assert head in result.stdout, head
        # Every path the message embeds is shown so too.
        for path, line in re.findall(r"(disaggregation/[\w/]+\.py):(\d+)", finding.message):
            assert f"{prefix}{path}:{line}" in result.stdout
            if prefix:
                assert not re.search(rf"(?<![\w/]){re.escape(path)}:{line}", result.stdout), path


def test_what_the_lines_say(tree: Path, tmp_path: Path) -> None:
    """Open each printed place of the pinned-state finding and read the claim there: the poll()
    that returns the state and the branch of the drain that keeps it."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    text = kvtrace("scan", str(tree), cwd=cwd).stdout
    report = scan_path(tree)
    pin = next(f for f in report.findings if f.rule == "pinned-state" and f.backend == "nixl")
    shown = Places(report, cwd).path(pin.path)
    assert f"at {shown}:{pin.line}" in text
    assert _line(cwd / shown, pin.line) == _line(tree / pin.path, pin.line)
    assert "def poll" in _line(cwd / shown, pin.line) or "poll" in pin.message
    keeps = [e for e in pin.evidence if e.note.startswith("keep")]
    assert keeps
    for e in keeps:
        assert f"{Places(report, cwd).path(e.path)}:{e.line}" in text
        assert "append" in _line(cwd / Places(report, cwd).path(e.path), e.line)


def test_markdown_github_and_concise_open_from_the_working_directory(tree: Path) -> None:
    cwd = tree.parent.parent
    for fmt in ("markdown", "concise", "github"):
        result = kvtrace("scan", str(tree), "-f", fmt, cwd=cwd)
        assert result.returncode == 1, (fmt, result.stderr)
        body = result.stdout
        if fmt == "github":  # file= is the runner's (relative to the workspace); the message's paths open too
            body = "\n".join(line.split("::", 2)[-1] for line in body.splitlines())
        # A diagram's node names its file by name only (`prefill.py:57 check`), to fit the drawing.
        body = re.sub(r"```mermaid\n.*?```", "", body, flags=re.S)
        _assert_opens(body, cwd, tree)
        assert "vendor/srt/disaggregation/" in body, fmt


def test_json_sarif_and_fingerprints_do_not_depend_on_the_working_directory(tree: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    inside = kvtrace("scan", str(tree), "-f", "json", cwd=tree)
    outside = kvtrace("scan", str(tree), "-f", "json", cwd=elsewhere)
    assert inside.stdout == outside.stdout
    assert '"path": "disaggregation/' in inside.stdout
    prints = []
    for cwd in (tree, elsewhere):
        sarif = json.loads(kvtrace("scan", str(tree), "-f", "sarif", "--sarif-root", str(tree), cwd=cwd).stdout)
        run = sarif["runs"][0]
        assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == tree.resolve().as_uri() + "/"
        prints.append([(r["partialFingerprints"], r["locations"], r["message"]) for r in run["results"]])
    assert prints[0] == prints[1]


def test_sarif_of_a_target_outside_the_root_is_relative_to_the_target(tree: Path, tmp_path: Path) -> None:
    """Run from a folder the target is not under: the locations never climb out with `../`;
    SRCROOT names the target folder and every location opens from it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = json.loads(kvtrace("scan", str(tree), "-f", "sarif", cwd=elsewhere).stdout)["runs"][0]
    base = run["originalUriBaseIds"]["SRCROOT"]["uri"]
    assert base == tree.resolve().as_uri() + "/"
    uris = [loc["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"] for loc in r["locations"]]
    assert uris and not any(uri.startswith("../") for uri in uris)
    assert all((tree / unquote(uri)).is_file() for uri in uris)


def _remote(report: Report, target: str) -> Report:
    report.target = target
    return report


@pytest.mark.parametrize("target, shown", [
    ("alice@127.0.0.1:2222:/srv/sglang/srt", "alice@127.0.0.1:2222:/srv/sglang/srt/"),
    ("127.0.0.1:sglang/srt/", "127.0.0.1:sglang/srt/"),
    ("ssh://[::1]:2200/opt/srt", "[::1]:2200:/opt/srt/"),
    ("127.0.0.1:.", "127.0.0.1:"),
])
def test_a_remote_scan_shows_host_and_path(target: str, shown: str) -> None:
    from kvtrace.report import render_plain

    report = _remote(scan_path(EXAMPLES / "nixl-pin"), target)
    places = Places(report)
    pin = next(f for f in report.findings if f.rule == "pinned-state")
    assert places.path(pin.path) == shown + pin.path
    text = render_plain([report])
    assert f"at {shown}{pin.path}:{pin.line}" in text
    assert not re.search(r"(?<![\w/:])disaggregation/\w+/conn\.py:\d+", text)  # no bare target-relative path


def test_only_the_scans_own_paths_are_rewritten() -> None:
    report = scan_path(EXAMPLES / "nixl-pin")
    places = Places(report, EXAMPLES)
    assert places.text("at disaggregation/nixl/conn.py:12, then disaggregation/prefill.py") == \
        "at nixl-pin/disaggregation/nixl/conn.py:12, then nixl-pin/disaggregation/prefill.py"
    # Not a path of the scan, or a longer path that ends with one: left as written.
    for text in ("other/disaggregation/nixl/conn.py:3", "disaggregation/nixl/conn.pyc", "xdisaggregation/prefill.py",
                 "disaggregation/nixl/conn.py/more"):
        assert places.text(text) == text
