"""`kvtrace diff`: two released SGLang trees from PyPI, and two git revisions of a checkout.

The expected differences between releases were read from the code of each release (quoted
next to each expectation); kvtrace's own scan of either tree is not the reference.
"""

from __future__ import annotations

import json
import os
import re
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
    # As in a file or a CI log: no COLUMNS (a test runner may export one), so text rows are unfolded.
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


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
        # The bootstrap queue (judged by default since issue 22): 0.5.2's PP assert there
        # (prefill.py:226) also meets Success, a warning resting on a shared room; NIXL's poll()
        # (598) returns check_status() until has_sent, with no clock and no abort(): Bootstrapping
        # pinned. 0.4.6.post5's NixlKVSender.poll() answered WaitingForInput before the send.
        ("state-crash", None, "Success"),
        ("pinned-state", "nixl", "Bootstrapping"),
    }
    assert keys(data["fixed"]) == {
        # 0.4.6.post5 MooncakeKVSender.poll() was `return self.kv_mgr.check_status(...)` with no
        # abort(); 0.5.2 returns self.conclude_state, which abort() sets, first. (Transferring was
        # never pinned: 0.4.6.post5's manager never stores it.)
        ("pinned-state", "mooncake", "WaitingForInput"),
        # 0.5.2 ends the chain with `else: assert False, f"Unexpected polling state {poll=}"`.
        ("dropped-state", None, "Bootstrapping"),
        # The bootstrap queue: 0.4.6.post5's poll() read no clock; 0.5.2's checks the bootstrap
        # timeout while Bootstrapping (sglang#6685).
        ("pinned-state", "mooncake", "Bootstrapping"),
    }
    assert keys(data["unchanged"]) == {
        # FakeKVSender.poll(): `if self.has_sent is False: return KVPoll.WaitingForInput` in both.
        ("pinned-state", "fake", "WaitingForInput"),
        # NixlKVSender.poll() ends `return KVPoll.WaitingForInput` in both, no abort state read.
        ("pinned-state", "nixl", "WaitingForInput"),
    }
    # The lines moved (the nixl poll() is at 450 in 0.4.6.post5, 598 in 0.5.2): matched anyway.
    assert {f["line"] for f in data["unchanged"] if f["backend"] == "nixl"} == {598}
    inflight, bootstrap = data["fates"]["disagg_prefill_inflight_queue"], data["fates"]["disagg_prefill_bootstrap_queue"]
    assert inflight["Bootstrapping"] == {"base": ["dropped"], "head": ["kept", "raises"]}
    # Every judged queue's fates and map rows, not only the first queue's: on the bootstrap queue
    # 0.5.2's PP assert (prefill.py:226) raises Bootstrapping, which 0.4.6.post5 only kept.
    assert bootstrap["Bootstrapping"] == {"base": ["kept"], "head": ["kept", "raises"]}
    assert {s["queue"] for s in data["sites"]} == {"disagg_prefill_inflight_queue", "disagg_prefill_bootstrap_queue"}
    assert any(s["queue"] == "disagg_prefill_bootstrap_queue" and s["kind"] == "raise" and s["head_line"] == 226
               and s["path"].endswith("disaggregation/prefill.py") for s in data["sites"])


def test_diff_text_names_the_queue_and_its_paths_open_from_the_working_directory() -> None:
    """Before: diff text printed `disaggregation/prefill.py:226` (relative to a tree, opening from
    nowhere), did not say which queue a finding was in (the same backend and state in both prefill
    queues read as one finding printed twice), and its map and fates held only the first queue.
    Run from the folder above both trees: BASE's rows open in BASE, HEAD's in HEAD."""
    old, new = sglang_tree("0.4.6.post5"), sglang_tree("0.5.2")
    here = Path(os.path.commonpath([old, new]))
    result = kvtrace("diff", str(old), str(new), "--select", "pinned-state,dropped-state,state-crash", cwd=here)
    assert result.returncode == 1, result.stderr
    text = result.stdout
    rows = re.findall(r"^  ([-+=]) (\w+)\[([\w-]+)\] (.*?)  (\S+\.py):(\d+)$", text, re.M)
    assert rows
    for mark, _, _, where, path, line in rows:
        tree = old if mark == "-" else new  # fixed: BASE's code; added, unchanged: HEAD's
        assert not Path(path).is_absolute() and (here / path).resolve().is_relative_to(tree.resolve()), path
        assert int(line) <= len((here / path).read_text().splitlines())
        assert where.endswith(("in disagg_prefill_inflight_queue", "in disagg_prefill_bootstrap_queue")), where
    # Each evidence and map row opens from here too, none relative to a tree.
    for path, line in re.findall(r"(\S+\.py):(\d+)", text):
        assert (here / path).is_file() and int(line) <= len((here / path).read_text().splitlines()), path
    assert "  - error[pinned-state] mooncake Bootstrapping in disagg_prefill_bootstrap_queue  " \
        f"{next(old.rglob('mooncake/conn.py')).relative_to(here)}:498" in text
    fates = text.split("\nfates\n")[1]
    assert "  disagg_prefill_bootstrap_queue\n    ~ Failed: leaves -> kept, leaves\n" \
        "    ~ Bootstrapping: kept -> kept, raises\n" in fates
    release_map = text.split("\nrelease map: ")[1].split("\nfates\n")[0]
    assert "\n  disagg_prefill_inflight_queue\n" in release_map and "\n  disagg_prefill_bootstrap_queue\n" in release_map
    # The pull-request comment names the queue too, and its paths open from here.
    markdown = kvtrace("diff", str(old), str(new), "--select", "pinned-state,dropped-state,state-crash", "-f",
                       "markdown", cwd=here).stdout
    assert "| severity | rule | backend | state | queue | was at |" in markdown
    assert " Bootstrapping in disagg_prefill_bootstrap_queue — <code>" in markdown
    for path, line in re.findall(r"`(\S+\.py):(\d+)`", markdown):
        assert (here / path).is_file(), path


def test_diff_of_releases_that_fix_everything_exits_0() -> None:
    result = kvtrace("diff", str(sglang_tree("0.5.2")), str(sglang_tree("0.5.23")), "--select", "pinned-state,state-crash")
    assert result.returncode == 0, result.stdout + result.stderr
    # 0.5.23: FakeKVSender.poll() returns self.conclude_state first and times out waiting;
    # NixlKVSender is `pass` over CommonKVSender, whose poll() returns self.conclude_state first.
    # 0.5.2's pins were fake WaitingForInput and nixl WaitingForInput; its crashes (the asserts at
    # prefill.py:506 and :532) became a warning-and-keep and a RuntimeError that only some
    # Bootstrapping paths reach (others are kept or requeued by the pending-bootstrap branch).
    # The bootstrap queue adds 3 fixed (nixl Bootstrapping pinned, the PP assert's Bootstrapping
    # and Success) and 2 added warnings (0.5.23's RuntimeError on Transferring and Success there,
    # which rest on a shared room): no error added.
    assert "fixed (8)" in result.stdout and "added (2)" in result.stdout
    assert "2 added, 8 fixed, 0 moved, 0 unchanged" in result.stdout


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


def test_diff_path_with_a_leading_slash_is_inside_the_tree(repo: Path, tmp_path: Path) -> None:
    """`--path /python/sglang` is the tree's folder (git's own pathspecs read a leading '/' so),
    for revisions and folders alike: never the machine's /python/sglang; a folder the tree does not
    have is named as the user wrote it."""
    plain = kvtrace("diff", "HEAD~1", "HEAD", "--path", "python/sglang", "-f", "json", cwd=repo)
    rooted = kvtrace("diff", "HEAD~1", "HEAD", "--path", "/python/sglang", "-f", "json", cwd=repo)
    assert plain.returncode == rooted.returncode == 1, rooted.stderr
    assert json.loads(rooted.stdout)["added"] == json.loads(plain.stdout)["added"] != []
    missing = kvtrace("diff", "HEAD~1", "HEAD", "--path", "/no/such", cwd=repo)
    assert missing.returncode == 2 and missing.stderr.startswith("kvtrace: error: --path /no/such: no folder")
    # Two folders: the same --path inside each, never the machine's root (here /kvtrace-no-such).
    base, head = tmp_path / "base", tmp_path / "head"
    shutil.copytree(repo, base, ignore=shutil.ignore_patterns(".git"))
    shutil.copytree(repo, head, ignore=shutil.ignore_patterns(".git"))
    folders = kvtrace("diff", str(base), str(head), "--path", "/python/sglang", "-f", "json")
    assert folders.returncode == 0 and json.loads(folders.stdout)["unchanged"], folders.stderr
    outside = kvtrace("diff", str(base), str(head), "--path", "/kvtrace-no-such")
    assert outside.returncode == 2 and "kvtrace-no-such" in outside.stderr and str(base) in outside.stderr
    dotdot = kvtrace("diff", str(base), str(head), "--path", "../x")
    assert dotdot.returncode == 2 and "no '..'" in dotdot.stderr


def test_diff_bad_revision_is_one_line(repo: Path, tmp_path: Path) -> None:
    result = kvtrace("diff", "no-such-rev", "HEAD", cwd=repo)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "kvtrace: error: no-such-rev: not a revision of the git repository at ."
    outside = kvtrace("diff", "HEAD~1", "HEAD", cwd=tmp_path)
    assert outside.returncode == 2 and "is not a git checkout" in outside.stderr


# --- moved, evidence, --fail-on, --baseline, formats --------------------------------------------

def by_key(items: list[dict]) -> dict[tuple[str, str | None, str | None], dict]:
    return {(f["rule"], f["backend"], f["state"]): f for f in items}


def test_poll_moved_into_a_base_class_reads_as_moved() -> None:
    """0.5.23 deleted MooncakeKVSender.poll, MoriKVSender.poll and NixlKVSender.poll; the senders
    inherit CommonKVSender.poll (common/conn.py), which returns self.conclude_state first and
    otherwise the manager's status. What each backend's poll() can return without a deadline is
    the same finding, now in another function: moved, not fixed and added."""
    result = kvtrace("diff", str(sglang_tree("0.5.22")), str(sglang_tree("0.5.23")), "-f", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["added"] == []
    moved = {(m["head"]["rule"], m["head"]["backend"], m["head"]["state"]): m for m in data["moved"]}
    assert set(moved) == {("no-timeout", backend, state) for backend in ("ascend", "mooncake", "mori", "nixl")
                          for state in ("WaitingForInput", "Transferring")}
    for m in moved.values():
        assert m["base"]["fingerprint"] == m["head"]["fingerprint"]
        assert m["head"]["function"] == "CommonKVSender.poll" and m["head"]["path"].endswith("common/conn.py")
        assert m["base"]["function"] != m["head"]["function"]
    # Fixed for real: 0.5.22's NixlKVSender.poll() never read conclude_state (abort() wrote it);
    # CommonKVSender.poll() reads it first. And 0.5.23's _poll_with_status calls the
    # check_status it is passed only `if self.bootstrap_room in self.kv_mgr.request_status`
    # (else Failed): the KeyError of an absent room (sglang#40125) is gone from the senders' poll.
    assert keys(data["fixed"]) == {("pinned-state", "nixl", "WaitingForInput"), ("abort-ignored", "nixl", None),
                                   ("poll-raises", "ascend", None), ("poll-raises", "mooncake", None),
                                   *KNOWN_MISS_0_5_23}
    text = kvtrace("diff", str(sglang_tree("0.5.22")), str(sglang_tree("0.5.23")))
    assert "\nmoved (8)\n" in text.stdout
    assert "(NixlKVSender.poll -> CommonKVSender.poll)" in text.stdout
    # The bootstrap queue's copies of the guarded KeyError are fixed too (6), and its premise
    # warnings unchanged (10; the release-leak both had on its Failed branch was false: that
    # branch hands the request to the scheduler's handle_bootstrap_failure, now followed).
    assert text.stdout.rstrip().endswith("0 added, 6 fixed, 8 moved, 10 unchanged; "
                                         "passed: no error added (--fail-on error, the default)")


# Findings a diff reads as fixed that kvtrace only lost (none). 0.5.22 -> 0.5.23 poll-raises on
# ascend/mooncake was listed here: it is a true fix (the room is tested before check_status
# reads it; tests/test_premises.py removes that test from 0.5.23 and the KeyError is back).
KNOWN_MISS_0_5_23: set[tuple[str, str, None]] = set()


def test_baseline_of_one_release_used_on_the_next_reports_only_what_changed(tmp_path: Path) -> None:
    """A baseline written on 0.5.22 and used on 0.5.23 (where poll() moved into CommonKVSender):
    nothing is new; the two nixl findings 0.5.23 fixed are gone. The same holds for a baseline
    in the first fingerprint format (rule|backend|state|function)."""
    baseline = tmp_path / "kvtrace-baseline.json"
    wrote = kvtrace("scan", str(sglang_tree("0.5.22")), "--write-baseline", str(baseline), "-f", "json")
    assert wrote.returncode == 0, wrote.stderr  # 0.5.22 has an error; writing the baseline accepts it
    used = kvtrace("scan", str(sglang_tree("0.5.23")), "--baseline", str(baseline), "-f", "json", "--fail-on", "note",
                   "-v")
    assert used.returncode == 0, used.stderr
    findings = json.loads(used.stdout)["reports"][0]["findings"]
    assert findings and {f["baseline"] for f in findings} == {"unchanged"}
    # nixl's two fixes, and the guarded KeyError on ascend and mooncake in both prefill queues
    gone = 6 + 2 * len(KNOWN_MISS_0_5_23)
    assert f"baseline: {len(findings)} unchanged, 0 new, {gone} no longer found" in used.stderr

    old = json.loads(baseline.read_text())
    for f in old["reports"][0]["findings"]:  # as kvtrace wrote them before the function left the print
        f["fingerprint"] = "|".join(p or "-" for p in (f["rule"], f["backend"], f["state"], f["function"]))
    legacy = tmp_path / "legacy-baseline.json"
    legacy.write_text(json.dumps(old))
    again = kvtrace("scan", str(sglang_tree("0.5.23")), "--baseline", str(legacy), "-f", "json", "--fail-on", "note")
    assert again.returncode == 0, again.stderr
    assert {f["baseline"] for f in json.loads(again.stdout)["reports"][0]["findings"]} == {"unchanged"}

    # Where something was added (0.5.15.post1 -> 0.5.16), the baseline's new findings are the
    # diff's added ones, and they fail a --fail-on note gate.
    wrote = kvtrace("scan", str(sglang_tree("0.5.15.post1")), "--write-baseline", str(baseline), "-f", "json")
    assert wrote.returncode == 0, wrote.stderr
    used = kvtrace("scan", str(sglang_tree("0.5.16")), "--baseline", str(baseline), "-f", "json", "--fail-on", "note")
    new = sorted(f["fingerprint"] for f in json.loads(used.stdout)["reports"][0]["findings"] if f["baseline"] == "new")
    diff = json.loads(kvtrace("diff", str(sglang_tree("0.5.15.post1")), str(sglang_tree("0.5.16")), "-f", "json").stdout)
    assert new and new == sorted(f["fingerprint"] for f in diff["added"])
    assert used.returncode == 1


def test_diff_fail_on_baseline_and_evidence(repo: Path, tmp_path: Path) -> None:
    args = ("diff", "HEAD~1", "HEAD", "--path", "python/sglang", "--select", "pinned-state,no-timeout")
    text = kvtrace(*args, cwd=repo)
    assert text.returncode == 1, text.stderr
    # The added pin is shown with its evidence chain, each link a path:line.
    block = text.stdout.split("\nadded (")[1].split("\nfixed (")[0]
    entry = block.split("  + error[pinned-state] mooncake WaitingForInput")[1].split("\n  + ")[0]
    chain = [line.strip() for line in entry.splitlines()[2:] if line.strip()]
    assert chain and all(re.match(r"\S+\.py:\d+  \S", line) for line in chain), entry
    assert text.stdout.rstrip().endswith("(--fail-on error, the default)")
    assert "failed: " in text.stdout.splitlines()[-1]

    assert kvtrace(*args, "--fail-on", "never", cwd=repo).returncode == 0
    # A baseline holding HEAD's findings: the added ones are marked and fail nothing.
    head_tree = tmp_path / "head"
    shutil.copytree(repo / "python" / "sglang", head_tree)
    baseline = tmp_path / "baseline.json"
    assert kvtrace("scan", str(head_tree), "--write-baseline", str(baseline), "-q", "-f", "json").returncode == 0
    accepted = kvtrace(*args, "--baseline", str(baseline), "-f", "json", cwd=repo)
    assert accepted.returncode == 0, accepted.stdout
    data = json.loads(accepted.stdout)
    assert data["added"] and {f["baseline"] for f in data["added"]} == {"unchanged"}
    assert data["verdict"] == "passed: no error added (--fail-on error, the default)"
    assert all(f["evidence"] for f in data["added"])
    stricter = kvtrace(*args, "--fail-on", "note", "-f", "json", cwd=repo)
    assert stricter.returncode == 1 and json.loads(stricter.stdout)["fail_on"] == "note"


def test_diff_github_annotations_point_at_head_files(repo: Path) -> None:
    result = kvtrace("diff", "HEAD~1", "HEAD", "--path", "python/sglang", "--select", "pinned-state", "-f", "github",
                     cwd=repo)
    assert result.returncode == 1
    annotations = [line for line in result.stdout.splitlines() if line.startswith("::")]
    assert annotations and all(line.startswith("::error file=python/sglang/srt/disaggregation/") for line in annotations)
    for line in annotations:
        assert (repo / re.search(r"file=([^,]+),", line).group(1)).is_file()
    assert result.stdout.splitlines()[-1].startswith("kvtrace diff: ") and "failed: " in result.stdout


def test_diff_markdown_is_a_pr_comment_under_the_limit() -> None:
    from kvtrace import diff as diffs

    base, head = sglang_tree("0.4.6.post5"), sglang_tree("0.5.23")
    result = kvtrace("diff", str(base), str(head), "-f", "markdown")
    text = result.stdout
    assert result.returncode == 0, result.stderr
    title = text.splitlines()[0]
    assert title.startswith("### ") and " → " in title and re.search(r"\d+ added, \d+ fixed, \d+ moved, \d+ unchanged", title)
    assert "#### Fixed (" in text and "#### Added (" in text and len(text) < 65_536
    assert text.count("<details>") == text.count("</details>")

    # Squeezed: whole items are left out, counted, and the comment stays under the limit.
    from kvtrace.config import Settings
    from kvtrace.fetch.local import fetch_local
    from kvtrace.packs import load_pack
    from kvtrace.scan import scan_fetched

    pack = load_pack(None)
    reports = [scan_fetched(fetch_local(tree), pack, Settings()) for tree in (base, head)]
    compared = diffs.compare(*reports)
    small = diffs.render_markdown(compared, "a", "b", "passed", limit=3000)
    assert len(small) < 3000 and "item(s) left out to fit a comment" in small
    assert small.count("<details>") == small.count("</details>")


def test_diff_bad_baseline_is_one_line_before_any_scan(repo: Path, tmp_path: Path) -> None:
    result = kvtrace("diff", "HEAD~1", "HEAD", "--path", "python/sglang", "--baseline", str(tmp_path / "none.json"),
                     cwd=repo)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"kvtrace: error: baseline {tmp_path / 'none.json'}: ")


def test_diff_text_folds_to_the_terminal_width(repo: Path) -> None:
    """Before: `kvtrace diff` text was never folded (rows of 200 characters at 80 columns), while
    scan's text folds to the terminal's width. Folded at spaces: every path:line stays whole."""
    from kvtrace.diff import fold

    def run(columns: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
        return subprocess.run([sys.executable, "-m", "kvtrace", "diff", "HEAD~1", "HEAD", "--path", "python/sglang"],
                              cwd=repo, capture_output=True, text=True, timeout=300, env=env)

    wide = run(None)  # a file or a CI log: one greppable row each
    narrow = run("80")
    assert wide.returncode == narrow.returncode == 1, narrow.stderr
    assert max(len(row) for row in wide.stdout.splitlines()) > 80
    rows = narrow.stdout.splitlines()
    # A word that fits the line is never past it: under its indent, or indented less (a qualified
    # name of 74 characters, 84 with its indent, was past it before).
    assert all(len(row) <= 80 for row in rows), [row for row in rows if len(row) > 80]
    # The same words in the same order: each path:line of the wide text is whole in the narrow one.
    assert narrow.stdout.split() == wide.stdout.split()
    # Paths open from the checkout's root, where the command ran (the revisions' files are there).
    places = [word for word in narrow.stdout.split() if re.match(r"python/sglang/srt/disaggregation/\S+\.py:\d+", word)]
    assert places and all((repo / word.split(":")[0]).is_file() for word in places)
    # A continuation hangs under its row; a word wider than the line is kept whole.
    assert fold("  + a b c", 5) == "  + a\n    b\n    c"
    assert fold("x " + "p" * 12 + " y", 6) == "x\n" + "p" * 12 + "\n  y"
    # A word that fits the line only indented less is indented less, as far as it then fits.
    assert fold("    a " + "q" * 9, 12) == "    a\n   " + "q" * 9
