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

from tests.peak import MeasuredPopen

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
    # 200,000 terms are ~600,000 syntax nodes: over the parse budget, left out before parsing.
    assert statuses["long.py"]["status"] in ("ok", "syntax-error", "too-large")
    assert pins(data) == EXPECTED_PINS


def test_symlink_loops(tree: Path) -> None:
    """Before: the file loop and the link out of the tree were dropped without a word (exit 1,
    "complete": true). Every link not followed is a gap saying why: INCOMPLETE, exit 3."""
    pkg = tree / "disaggregation"
    os.symlink(pkg, pkg / "loop")  # a folder that contains itself: inside, read once, no gap
    os.symlink("b.py", pkg / "a.py")
    os.symlink("a.py", pkg / "b.py")  # a file loop
    os.symlink("/etc/hostname", pkg / "outside.py")  # leaves the tree: never read
    code, data = scan_json(tree)
    assert code == 3 and pins(data) == EXPECTED_PINS and data["complete"] is False
    paths = {f["path"] for f in data["files"]}
    assert not any(p.startswith("disaggregation/loop/") for p in paths)
    gaps = {g["subject"]: g["reason"] for g in data["gaps"] if g["kind"] == "file"}
    assert gaps == {
        "disaggregation/a.py": "skipped: symlink to 'b.py' is a loop; not followed",
        "disaggregation/b.py": "skipped: symlink to 'a.py' is a loop; not followed",
        "disaggregation/outside.py": "skipped: symlink to '/etc/hostname' leads outside the target; not followed",
    }


def _move_out(tree: Path, rel: str, outside: Path) -> None:
    """Move tree/rel to `outside` and leave a symlink to it in its place."""
    shutil.move(str(tree / rel), str(outside))
    os.symlink(outside, tree / rel)


def test_a_backend_folder_linked_from_outside_is_a_gap_not_a_missing_backend(tree: Path, tmp_path: Path) -> None:
    """Before: `5 of 5 files analysed · 1 backend`, exit 1, "complete": true, "gaps": [] -- the
    nixl backend and its pin silently gone."""
    _move_out(tree, "disaggregation/nixl", tmp_path / "outside")
    result = kvtrace("scan", str(tree), "--no-map")
    assert result.returncode == 3, result.stderr
    assert "disaggregation/nixl/ not analysed (skipped: symlink to a folder outside the target" in result.stderr
    assert "backend nixl not checked" in result.stderr
    assert "INCOMPLETE" in result.stdout and "5 of 6 files analysed" in result.stdout
    code, data = scan_json(tree)
    assert code == 3 and data["complete"] is False
    # The pack's second queue is named nowhere in what was read, and an unread file may hold it.
    assert {(g["kind"], g["subject"]) for g in data["gaps"]} == {("file", "disaggregation/nixl/"), ("backend", "nixl"),
                                                                  ("analysis", "scan")}
    assert str(tmp_path / "outside") in data["gaps"][0]["reason"]


def test_a_file_linked_from_outside_is_a_gap(tree: Path, tmp_path: Path) -> None:
    _move_out(tree, "disaggregation/nixl/conn.py", tmp_path / "conn.py")
    code, data = scan_json(tree, "-v")
    assert code == 3
    assert {(g["kind"], g["subject"]) for g in data["gaps"]} == {("file", "disaggregation/nixl/conn.py"),
                                                                  ("backend", "nixl"), ("analysis", "scan")}


def test_links_inside_the_tree(tree: Path) -> None:
    """Documented choice (README, fetch limits): a folder link inside the target is not entered
    (its files are read once, under their own names); a .py link to a file inside is read
    under its name too, as Python would import it. Neither is a gap."""
    (tree / "extra").mkdir()
    os.symlink("../disaggregation", tree / "extra" / "again")
    os.symlink("../disaggregation/prefill.py", tree / "extra" / "prefill_alias.py")
    code, data = scan_json(tree)
    assert code == 1 and data["complete"] is True and pins(data) == EXPECTED_PINS
    paths = [f["path"] for f in data["files"]]
    assert not any(p.startswith("extra/again") for p in paths)
    assert "extra/prefill_alias.py" in paths


def test_a_target_that_is_a_symlink_loop_is_one_line_exit_2(tmp_path: Path) -> None:
    """Before: exit 4, "internal error: RuntimeError: Symlink loop ..."."""
    os.symlink("selfloop", tmp_path / "selfloop")
    for target in (tmp_path / "selfloop", tmp_path / "selfloop" / "sub"):
        result = kvtrace("scan", str(target))
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"kvtrace: error: {target}: a symlink loop (too many levels of symbolic links)\n"
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    result = kvtrace("scan", str(tmp_path / "dangling"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "does not exist" in result.stderr


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
    # Of the queue-side findings (the backend and manager rules still look at the senders) only this one.
    from kvtrace.rules import ALL_RULES

    queue_rules = {rule.name for rule in ALL_RULES if rule.per_queue}
    assert {f["rule"] for f in data["findings"] if f["rule"] in queue_rules} == {"undrained-queue"}
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


# --- hostile local trees: permissions, depth, size of expressions ----------------------------

# Root ignores file modes; these runs drop the two capabilities that let it, as a normal user is.
NO_OVERRIDE = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"]


def as_unprivileged(*args: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0:
        command = [sys.executable, "-m", "kvtrace", *args]
    else:
        assert shutil.which("setpriv"), "setpriv (util-linux) is needed to drop root's override capabilities"
        command = [*NO_OVERRIDE, sys.executable, "-m", "kvtrace", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_unreadable_and_unenterable_folders_are_listed_and_the_scan_goes_on(tree: Path) -> None:
    """Before: a folder with read but no execute permission (`chmod -R 644`) ended the scan with
    'internal error: PermissionError'."""
    pkg = tree / "disaggregation"
    for name, mode in (("listable_only", 0o644), ("closed", 0o000)):
        folder = pkg / name
        folder.mkdir()
        (folder / "inner.py").write_text("x = 1\n")
        folder.chmod(mode)
    try:
        result = as_unprivileged("scan", str(tree), "--format", "json")
    finally:
        for name in ("listable_only", "closed"):
            (pkg / name).chmod(0o755)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.returncode == 3, result.stderr
    data = json.loads(result.stdout)["reports"][0]
    assert pins(data) == EXPECTED_PINS
    inner = {f["path"]: f for f in data["files"]}
    assert inner["disaggregation/listable_only/inner.py"]["status"] == "unreadable"
    assert any("closed" in p and "Permission denied" in p for p in data["problems"]), data["problems"]


def test_1100_nested_folders(tree: Path) -> None:
    """Before: 'internal error: RecursionError' (os.walk recurses in Python 3.11)."""
    levels = [tree / "disaggregation" / "d"]
    for _ in range(1099):
        levels.append(levels[-1] / "d")
    try:
        for level in levels:  # one at a time: Path.mkdir(parents=True) recurses too
            level.mkdir()
        (levels[-1] / "bottom.py").write_text("BOTTOM = 1\n")
        code, data = scan_json(tree)
        assert code == 1 and pins(data) == EXPECTED_PINS
        assert any(f["path"].endswith("/d/bottom.py") and f["status"] == "ok" for f in data["files"])
    finally:  # bottom-up by hand: shutil.rmtree (and so pytest's tmp cleanup) recurses
        (levels[-1] / "bottom.py").unlink(missing_ok=True)
        for level in reversed(levels):
            if level.exists():
                level.rmdir()


def test_10000_operand_and_in_the_drain_loop_is_not_analysed_not_a_crash(tree: Path) -> None:
    """Before: SIGSEGV inside libcst's native parser."""
    prefill = tree / "disaggregation" / "prefill.py"
    text = prefill.read_text()
    anchor = "        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):"
    assert anchor in text
    chain = " and ".join(f"req.f{i}" for i in range(10_000))
    start = text.index(anchor)
    end = text.index("\n", start) + 1  # after the loop header line (it carries a comment)
    prefill.write_text(text[:end] + f"            if {chain}:\n                pass\n" + text[end:])
    assert "req.f9999" in prefill.read_text()
    result = kvtrace("scan", str(tree), "--format", "json")
    assert result.returncode == 3, (result.returncode, result.stderr[-500:])  # not -11 (SIGSEGV)
    data = json.loads(result.stdout)["reports"][0]
    entry = next(f for f in data["files"] if f["path"] == "disaggregation/prefill.py")
    assert entry["status"] == "skipped" and "levels deep" in entry["error"] and "not analysed" in entry["error"]


def test_markup_and_escapes_in_names_are_printed_as_written(tree: Path, tmp_path: Path) -> None:
    """Before: `[bold]` in a path was eaten by rich markup, with -v a `[/x]` raised
    MarkupError, and escape sequences reached the terminal raw."""
    odd = tmp_path / "a[bold][" / "oops]\x1b[2J"  # the path reads ".../a[bold][/oops]ESC[2J"
    odd.parent.mkdir()
    shutil.copytree(tree, odd)
    result = kvtrace("scan", str(odd), "-v", "--format", "json")
    assert "Traceback" not in result.stderr and "MarkupError" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    unwrapped = result.stderr.replace("\n", "")  # -v lines may wrap at the terminal width
    assert "\x1b" not in result.stderr and "a[bold][/oops]\\x1b[2J" in unwrapped, result.stderr
    missing = kvtrace("scan", str(tmp_path / "no[bold]such\x1b[31m"))
    assert missing.returncode == 2 and "no[bold]such\\x1b[31m" in missing.stderr, missing.stderr
    assert missing.stderr.count("\n") == 1


def test_ctrl_c_during_a_scan_is_one_line_and_exit_130() -> None:
    """Before: exit 130 with no message (the handler never ran), or with typer 0.12.5
    'Aborted!' and exit 1. The scan here waits on a server that never answers."""
    import signal
    import time

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hostile_ssh_server import HostileServer

    with HostileServer("stall-after-marker") as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvtrace", "scan", server.target(), "-i", str(server.client_key),
             "--known-hosts", str(server.known_hosts), "--ssh-config", os.devnull, "--timeout", "120"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + 60
        while not server.commands and time.monotonic() < deadline:  # the fetch is running
            time.sleep(0.05)
        assert server.commands, "the scan never reached the server"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err == "kvtrace: interrupted\n", err
    assert out == ""


def test_memory_stays_bounded_with_huge_generated_files(tree: Path) -> None:
    """Before: four 8 MiB files inside the default limits peaked at 3.8 GB RSS. Now files over
    1 MiB are not read, and the parse budget leaves out (and names) what would not fit."""
    import tempfile

    pkg = tree / "disaggregation"
    for i in range(4):  # over the per-file limit: listed, not read
        with (pkg / f"huge{i}.py").open("w") as handle:
            handle.write("".join(f"H{i}_{j} = [1, 2, 3]\n" for j in range(8 * 1024 * 1024 // 16)))
    for i in range(6):  # just under it, dense: ~340,000 syntax nodes each
        rows, size = [], 0
        while size < 1_000_000:
            rows.append(f"V{i}_{len(rows)} = [1, 2, 3]\n")
            size += len(rows[-1])
        (pkg / f"dense{i}.py").write_text("".join(rows[:-1]))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = MeasuredPopen([sys.executable, "-m", "kvtrace", "scan", str(tree), "--format", "json", "--no-cache"],
                             cwd=ROOT, stdout=out, stderr=err)
        proc.wait()
        peak = proc.peak_mb()
        out.seek(0)
        err.seek(0)
        data, stderr = json.loads(out.read())["reports"][0], err.read().decode()
    assert "Traceback" not in stderr and proc.returncode == 3, stderr
    assert peak < 500, f"peak RSS {peak:.0f} MB"
    files = {f["path"].rsplit("/", 1)[-1]: f for f in data["files"]}
    assert all(files[f"huge{i}.py"]["status"] == "too-large" for i in range(4))
    assert "huge0.py not analysed (too large: 11423226 bytes, over the per-file limit (--max-file-bytes 1048576))" \
        in stderr, stderr
    budget = [n for n in files if n.startswith("dense") and "parse budget" in (files[n]["error"] or "")]
    assert len(budget) >= 4, {n: files[n]["error"] for n in files if n.startswith("dense")}
    # Before: "not analysed (too large: not analysed: ...)".
    assert "too large: not analysed" not in stderr, stderr
    assert pins(data) == EXPECTED_PINS  # the real package is still analysed


@pytest.mark.parametrize("broken", ["mooncake/conn.py", "common/conn.py"])
def test_a_backend_built_on_an_unread_file_is_named_not_dropped(tmp_path: Path, broken: str) -> None:
    """Before: with mooncake/conn.py unreadable, SGLang 0.5.23's ascend backend (whose sender and
    manager build on mooncake's) vanished from every format without a word: its classes were no
    longer recognised as a sender's and nothing said so."""
    from tests.sglang_wheels import sglang_tree

    root = tmp_path / "sglang"
    shutil.copytree(sglang_tree("0.5.23") / "sglang", root)
    package = root / "srt" / "disaggregation"
    (package / broken).write_bytes(b'x = "\xff\xfe"\n')
    code, report = scan_json(package)
    assert code == 3
    checked = {b["name"] for b in report["backends"]}
    gaps = {g["subject"]: g["reason"] for g in report["gaps"] if g["kind"] == "backend"}
    for backend in ("ascend", "mooncake", "mori", "nixl", "fake"):
        # Every backend folder is either checked or named as not checked: none is simply absent.
        assert (backend in checked) != (backend in gaps and gaps[backend].startswith("not checked")), backend
    assert "ascend" not in checked
    assert f"from {broken}, which could not be analysed" in gaps["ascend"], gaps
    # Where the unread file is no base of theirs, backends are still checked (nixl builds on common only).
    assert ("nixl" in checked) == (broken == "mooncake/conn.py")


@pytest.mark.parametrize("broken", [b"def (:\n", b'x = "\xe9"\n'])
def test_a_queue_whose_drain_file_cannot_be_read_is_a_gap_not_an_error(tmp_path: Path, broken: bytes) -> None:
    """Before: with SGLang 0.5.2's disaggregation/prefill.py unparsable (or not UTF-8), the bootstrap
    queue, filled in managers/scheduler.py and drained in the unread file, was reported as an
    undrained-queue error. A drain absent from the analysis may be in a file not analysed."""
    from tests.sglang_wheels import sglang_tree

    root = tmp_path / "sglang"
    shutil.copytree(sglang_tree("0.5.2") / "sglang", root)
    prefill = root / "srt" / "disaggregation" / "prefill.py"
    prefill.write_bytes(broken + prefill.read_bytes())
    result = kvtrace("scan", str(root / "srt"), "--format", "json")
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout)["reports"][0]
    assert not [f for f in report["findings"] if f["rule"] == "undrained-queue"], report["findings"]
    assert "error" not in {f["severity"] for f in report["findings"]}
    assert "self.disagg_prefill_bootstrap_queue is filled but not drained in the analysed files (files not " \
           "analysed:" in result.stderr, result.stderr
    # At the line a syntax error is at (which a person opens), the file alone when not UTF-8.
    at = ":1" if broken.startswith(b"def") else ""
    assert f"disaggregation/prefill.py{at} not analysed" in result.stderr, result.stderr


def test_an_incomplete_scan_with_errors_says_both_on_stderr(tree: Path, tmp_path: Path) -> None:
    """Before: with a report written to a file, an incomplete scan (exit 3) that also found errors
    said only what was not analysed; the errors were in the file alone."""
    (tree / "disaggregation" / "broken.py").write_text("def (:\n")
    out = tmp_path / "out.json"
    result = kvtrace("scan", str(tree), "-f", "json", "-o", str(out))
    assert result.returncode == 3, result.stderr
    assert "broken.py:1 not analysed (syntax error: invalid syntax)" in result.stderr, result.stderr
    assert f"kvtrace: {tree}: failed: 2 errors (--fail-on error, the default); also 5 warnings, 7 notes; " \
           "exit 3 (INCOMPLETE)" in result.stderr, result.stderr
    assert json.loads(out.read_text())["reports"][0]["complete"] is False


def test_enum_in_a_latin1_file_is_still_found(tree: Path) -> None:
    """locate_packages looks for the enum's name in the raw bytes before decoding: an ASCII name
    has the same bytes in a file that declares latin-1, so such a file still defines it."""
    defining = next(p for p in (tree / "disaggregation").rglob("*.py") if b"class KVPoll" in p.read_bytes())
    defining.write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + defining.read_bytes())
    code, data = scan_json(tree)
    assert code == 1 and all(f["status"] == "ok" for f in data["files"])
    assert data["enum"]["path"] == defining.relative_to(tree).as_posix()
    assert pins(data) == EXPECTED_PINS


def test_an_empty_folder_is_one_plain_error(tmp_path: Path) -> None:
    """Before: "none of its 0 .py files () defines `class KVPoll`"."""
    result = kvtrace("scan", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"kvtrace: error: {tmp_path}: no disaggregation/ package found; it holds no .py files"
