"""`kvtrace diff`: two released SGLang trees from PyPI, and two git revisions of a checkout.

The expected differences between releases were read from the code of each release (quoted
next to each expectation); kvtrace's own scan of either tree is not the reference.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sglang_wheels import sglang_tree

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GIT = ["git", "-c", "user.name=kvtrace tests", "-c", "user.email=tests@kvtrace.invalid",
       "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]


def kvtrace(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def keys(items: list[dict]) -> set[tuple[str, str | None, str | None]]:
    return {(f["rule"], f["backend"], f["state"]) for f in items}


def test_diff_of_two_sglang_releases() -> None:
    # The fate rules, whose verdicts are verified below by reading the code; the link rules have
    # their own real-release tests (tests/test_rules_real.py).
    result = kvtrace("diff", str(sglang_tree("0.4.6.post5")), str(sglang_tree("0.5.2")), "-f", "json",
                     "--select", "pinned-state,dropped-state,state-crash")
    assert result.returncode == 1, result.stderr  # findings were added
    data = json.loads(result.stdout)
    assert keys(data["added"]) == {
        # 0.5.2 ends the chain with `else: assert False, f"Unexpected polling state {poll=}"`
        # (prefill.py:532): with rids_to_check at its default (event_loop_normal_disagg_prefill),
        # every path that tests Bootstrapping fails it. With rids_to_check passed
        # (event_loop_pp_disagg_prefill, prefill.py:795), a rid in rids_to_check meets
        # `assert poll == KVPoll.Success or poll == KVPoll.Failed` (prefill.py:506): Bootstrapping
        # and WaitingForInput (both returned by mooncake's and nixl's poll()) crash there.
        # Transferring too would, but no 0.5.2 backend returns it. (nixl Bootstrapping is no longer
        # a pin: no path that tests it keeps it, in either mode.)
        ("state-crash", None, "Bootstrapping"),
        ("state-crash", None, "WaitingForInput"),
    }
    assert keys(data["fixed"]) == {
        # 0.4.6.post5 MooncakeKVSender.poll() was `return self.kv_mgr.check_status(...)` with no
        # abort(); 0.5.2 returns self.conclude_state, which abort() sets, first. (Transferring was
        # never pinned: 0.4.6.post5's manager never stores it.)
        ("pinned-state", "mooncake", "WaitingForInput"),
        # 0.5.2 ends the chain with `else: assert False, f"Unexpected polling state {poll=}"`.
        ("dropped-state", None, "Bootstrapping"),
    }
    assert keys(data["unchanged"]) == {
        # FakeKVSender.poll(): `if self.has_sent is False: return KVPoll.WaitingForInput` in both.
        ("pinned-state", "fake", "WaitingForInput"),
        # NixlKVSender.poll() ends `return KVPoll.WaitingForInput` in both, no abort state read.
        ("pinned-state", "nixl", "WaitingForInput"),
    }
    # The lines moved (the nixl poll() is at 450 in 0.4.6.post5, 598 in 0.5.2): matched anyway.
    assert {f["line"] for f in data["unchanged"] if f["backend"] == "nixl"} == {598}
    assert data["fates"]["Bootstrapping"] == {"base": ["dropped"], "head": ["kept", "raises"]}


def test_diff_of_releases_that_fix_everything_exits_0() -> None:
    result = kvtrace("diff", str(sglang_tree("0.5.2")), str(sglang_tree("0.5.23")), "--select", "pinned-state,state-crash")
    assert result.returncode == 0, result.stdout + result.stderr
    # 0.5.23: FakeKVSender.poll() returns self.conclude_state first and times out waiting;
    # NixlKVSender is `pass` over CommonKVSender, whose poll() returns self.conclude_state first.
    # 0.5.2's pins were fake WaitingForInput and nixl WaitingForInput; its crashes (the asserts at
    # prefill.py:506 and :532) became a warning-and-keep and a RuntimeError that only some
    # Bootstrapping paths reach (others are kept or requeued by the pending-bootstrap branch).
    assert "fixed (5)" in result.stdout and "added (0)" in result.stdout
    assert "0 added, 5 fixed, 0 unchanged" in result.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git checkout with two commits: the nixl-pin tree, then a change that widens the keep
    branch to Bootstrapping and makes mooncake's poll() ignore its abort state (and its abort()
    leave the manager's table alone)."""
    root = tmp_path / "fork"
    shutil.copytree(EXAMPLES / "nixl-pin", root / "python" / "sglang" / "srt")

    def git(*args: str) -> None:
        subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    srt = root / "python" / "sglang" / "srt" / "disaggregation"
    prefill = srt / "prefill.py"
    old = "if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:"
    assert old in prefill.read_text()
    prefill.write_text(prefill.read_text().replace(
        old, "if poll in [KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring]:"))
    conn = srt / "mooncake" / "conn.py"
    conn.write_text(conn.read_text().replace(
        "        if self.conclude_state is not None:\n            return self.conclude_state\n", "", 1).replace(
        "        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)\n        self.conclude_state", "        self.conclude_state", 1))
    (srt / "README").write_text("moved lines below\n")
    git("add", "-A")
    git("commit", "-qm", "head")
    return root


def test_diff_of_two_git_revisions(repo: Path) -> None:
    before = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    result = kvtrace("diff", "HEAD~1", "HEAD", "--path", "python/sglang", "-f", "json", "--select", "pinned-state",
                     cwd=repo)
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    added = keys(data["added"])
    # mooncake's abort() no longer reaches poll() (neither its own field nor the manager's table).
    assert ("pinned-state", "mooncake", "WaitingForInput") in added
    # Bootstrapping is now kept, not left; nixl's abort() still fails a present room in the table
    # that its poll() reads, so it is not pinned there.
    assert ("pinned-state", "nixl", "Bootstrapping") not in added
    assert all(backend in ("mooncake", "nixl", None) for _, backend, _ in added)
    assert {k for k in keys(data["unchanged"]) if k[0] == "pinned-state"} == {
        ("pinned-state", "nixl", "WaitingForInput"), ("pinned-state", "nixl", "Transferring")}
    moved = {(s["kind"], tuple(s["base"]), tuple(s["head"])) for s in data["sites"]
             if s["base"] is not None and s["head"] is not None}
    assert ("keep", ("WaitingForInput", "Transferring"), ("Bootstrapping", "WaitingForInput", "Transferring")) in moved
    # Bootstrapping used to fall through to the else branch that aborts and finishes it.
    assert ("abort", ("Failed", "Bootstrapping"), ("Failed",)) in moved
    # The edited condition is another statement: one row gone, one row new.
    checks = [(s["base"], s["head"]) for s in data["sites"] if s["kind"] == "check"
              and (s["base"] is None or s["head"] is None)]
    assert sorted(checks, key=str) == [(None, ["Bootstrapping", "WaitingForInput", "Transferring"]),
                                       (["WaitingForInput", "Transferring"], None)]
    # The checkout was read through git archive, never touched.
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == before

    # The other way round only fixes: exit 0.
    reverse = kvtrace("diff", "HEAD", "HEAD~1", "--path", "python/sglang", cwd=repo)
    assert reverse.returncode == 0, reverse.stdout + reverse.stderr
    assert "\nadded (0)\n" in reverse.stdout


def test_diff_bad_revision_is_one_line(repo: Path, tmp_path: Path) -> None:
    result = kvtrace("diff", "no-such-rev", "HEAD", cwd=repo)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "kvtrace: error: no-such-rev: not a revision of the git repository at ."
    outside = kvtrace("diff", "HEAD~1", "HEAD", cwd=tmp_path)
    assert outside.returncode == 2 and "is not a git checkout" in outside.stderr
