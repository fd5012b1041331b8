"""Hostile and broken input: nothing crashes, nothing is lost silently, every message is clear.

Each case runs the real CLI in a subprocess (exit code, stdout, stderr as a user sees them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NIXL_PIN = ROOT / "examples" / "nixl-pin"


def kvtrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def scan_json(tree: Path, *extra: str) -> tuple[int, dict]:
    result = kvtrace("scan", str(tree), "--format", "json", *extra)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)["reports"][0]


def pins(data: dict) -> set[tuple[str, str]]:
    return {(f["backend"], f["state"]) for f in data["findings"] if f["rule"] == "pinned-state"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    target = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, target)
    return target


EXPECTED_PINS = {("nixl", "WaitingForInput"), ("nixl", "Transferring")}


def test_bom_and_empty_files_are_fine(tree: Path) -> None:
    prefill = tree / "disaggregation" / "prefill.py"
    prefill.write_bytes(b"\xef\xbb\xbf" + prefill.read_bytes())
    (tree / "disaggregation" / "empty.py").write_bytes(b"")
    (tree / "disaggregation" / "__init__.py").write_bytes(b"")
    code, data = scan_json(tree)
    assert code == 1
    assert all(f["status"] == "ok" for f in data["files"])
    assert pins(data) == EXPECTED_PINS
    # Line numbers are unchanged by the BOM.
    drain = data["queues"][0]["drain"]
    line = prefill.read_text(encoding="utf-8-sig").splitlines()[drain["line"] - 1]
    assert line.lstrip().startswith("for ")


def test_a_50_mb_file_is_reported_not_read(tree: Path) -> None:
    big = tree / "disaggregation" / "generated_tables.py"
    with big.open("w") as handle:
        row = "TABLE_ENTRY = " + "1" * 80 + "\n"
        for _ in range(50 * 1024 * 1024 // len(row) + 1):
            handle.write(row)
    code, data = scan_json(tree)
    assert code == 3  # incomplete: one file was not analysed, and the report says which
    entry = next(f for f in data["files"] if f["path"].endswith("generated_tables.py"))
    assert entry["status"] == "too-large" and "limit" in entry["error"]
    assert pins(data) == EXPECTED_PINS


def test_20000_files(tree: Path) -> None:
    many = tree / "vendor_blobs"
    many.mkdir()
    for i in range(20_000):
        (many / f"m{i:05d}.py").write_text(f"VALUE = {i}\n")
    over = kvtrace("scan", str(tree))
    assert over.returncode == 2 and "Traceback" not in over.stderr
    assert "more than 20000 .py files" in over.stderr and "--max-files" in over.stderr
    code, data = scan_json(tree, "--max-files", "30000")
    assert code == 1 and pins(data) == EXPECTED_PINS
    # Files outside the package that do not mention the queue are not analysed (nor listed).
    assert not any(f["path"].startswith("vendor_blobs/") for f in data["files"])


def test_deep_nesting_in_the_drain_loop(tree: Path) -> None:
    prefill = tree / "disaggregation" / "prefill.py"
    text = prefill.read_text()
    anchor = "        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):"
    assert anchor in text
    depth = 90  # CPython's own parser refuses ~100 nested blocks; stay just under it
    nested = "".join(f"{'    ' * (3 + i)}if req.flag{i}:\n" for i in range(depth))
    nested += f"{'    ' * (3 + depth)}pass\n"
    head, _, tail = text.partition(anchor + "\n")
    prefill.write_text(head + anchor + "\n" + nested + tail)
    code, data = scan_json(tree)
    assert code == 1 and not data["problems"]
    assert data["queues"][0]["drain"] is not None
    assert pins(data) == EXPECTED_PINS  # the flags neither keep nor release anything


def test_nested_too_deep_for_python_is_a_syntax_error(tree: Path) -> None:
    (tree / "disaggregation" / "deep.py").write_text("x = " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    (tree / "disaggregation" / "long.py").write_text("x = " + "+".join(["1"] * 200_000) + "\n")
    code, data = scan_json(tree)
    assert code == 3
    statuses = {f["path"].rsplit("/", 1)[-1]: f for f in data["files"]}
    assert statuses["deep.py"]["status"] == "syntax-error" and statuses["deep.py"]["error"]
    assert statuses["long.py"]["status"] in ("ok", "syntax-error")
    assert pins(data) == EXPECTED_PINS


def test_symlink_loops(tree: Path) -> None:
    pkg = tree / "disaggregation"
    os.symlink(pkg, pkg / "loop")  # a directory that contains itself
    os.symlink("b.py", pkg / "a.py")
    os.symlink("a.py", pkg / "b.py")  # a file loop
    os.symlink("/etc/hostname", pkg / "outside.py")  # leaves the tree: never read
    code, data = scan_json(tree)
    assert code == 1 and pins(data) == EXPECTED_PINS
    paths = {f["path"] for f in data["files"]}
    assert not any(p.startswith("disaggregation/loop/") for p in paths)
    assert "disaggregation/outside.py" not in paths


def test_missing_enum_file(tree: Path) -> None:
    (tree / "disaggregation" / "base" / "conn.py").unlink()
    result = kvtrace("scan", str(tree))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "class KVPoll" in result.stderr and "none of its" in result.stderr  # what was read, not a guess


def test_queue_that_is_never_drained(tree: Path) -> None:
    prefill = tree / "disaggregation" / "prefill.py"
    text = prefill.read_text().replace("self.disagg_prefill_inflight_queue = undone_reqs", "self.leftovers = undone_reqs")
    prefill.write_text(text)
    code, data = scan_json(tree)
    assert code == 1
    # Of the queue-side findings (the backend rules still look at the senders) only this one.
    assert {f["rule"] for f in data["findings"] if f["backend"] is None} == {"undrained-queue"}
    assert all(f["line"] >= 1 for f in data["findings"])


def test_names_that_shadow_sglang_in_unrelated_code(tree: Path) -> None:
    other = tree / "tools" / "replay.py"
    other.parent.mkdir()
    other.write_text('''\
class KVPoll:  # an unrelated enum with the same name
    Idle = 0
    Busy = 1


class BaseKVSender:
    pass


class ReplayKVSender:
    def poll(self):
        return KVPoll.Busy


def poll_and_all_reduce(items, group):
    return items


class Replayer:
    """Keeps its own list under the scheduler's attribute name."""

    def run(self):
        polls = poll_and_all_reduce(self.disagg_prefill_inflight_queue, None)
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):
            print(req, poll)
''')
    code, data = scan_json(tree)
    assert code == 1
    assert data["enum"]["path"] == "disaggregation/base/conn.py"
    assert list(data["queues"][0]["states"]) == ["Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"]
    assert data["queues"][0]["drain"]["path"] == "disaggregation/prefill.py"
    assert pins(data) == EXPECTED_PINS
    assert {b["name"] for b in data["backends"]} == {"mooncake", "nixl"}


def test_non_utf8_source_and_name(tree: Path) -> None:
    (tree / "disaggregation" / "legacy.py").write_bytes(b"NAME = 'caf\xe9'\n")
    (tree / "disaggregation" / "declared.py").write_bytes(b"# -*- coding: latin-1 -*-\nNAME = 'caf\xe9'\n")
    os.close(os.open(os.fsencode(tree / "disaggregation") + b"/caf\xe9.py", os.O_CREAT | os.O_WRONLY, 0o644))
    code, data = scan_json(tree)
    assert code == 3
    legacy = next(f for f in data["files"] if f["path"].endswith("legacy.py"))
    assert legacy["status"] == "not-utf8" and "UTF-8" in legacy["error"]
    declared = next(f for f in data["files"] if f["path"].endswith("declared.py"))
    assert declared["status"] == "ok"  # a PEP 263 coding cookie is honoured, as Python does
    assert any("not UTF-8" in p for p in data["problems"])  # the odd file name is reported, not lost
    assert pins(data) == EXPECTED_PINS
