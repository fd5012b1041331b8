"""Red team, round two (issue 18): inputs that must never run code, hang, exhaust memory or end
in a traceback. Items 1 (cache), 3 (diff reads git), 7 (merge), 12 (a scanned tree's config) and
15 (malformed files and names). Every hostile case runs the real command in a child process with
an address-space limit (so a regression cannot take the machine down), a deadline and a check of
its peak memory; git is the real git, on repositories made here."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import resource
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.peak import MeasuredPopen

ROOT = Path(__file__).resolve().parent.parent
NIXL_PIN = ROOT / "examples" / "nixl-pin"
ALL_CLEAR = ROOT / "examples" / "all-clear"

ADDRESS_SPACE = 2 * 1024**3  # the child is killed by its own limit long before the host suffers
PEAK_RSS_MB = 500
DEADLINE = 60.0  # generous: a bounded failure takes well under a second, a hang never ends
LONG = "n" * 300  # a file name part over the 255 bytes Linux allows


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    peak_rss_mb: float

    def one_error_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        assert self.returncode == 2, (self.returncode, self.stderr[-3000:])
        assert len(lines) == 1 and lines[0].startswith("kvtrace: error: "), self.stderr[-3000:]
        assert "Traceback" not in self.stderr and "internal error" not in self.stderr
        return lines[0]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = DEADLINE) -> Run:
    """`python -m kvtrace ARGS` bounded in memory and time; its peak RSS from wait4."""
    proc = MeasuredPopen([sys.executable, "-m", "kvtrace", *args], cwd=cwd, env={**os.environ, **(env or {})},
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=_limits)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill_group()

    timer = threading.Timer(timeout, kill)
    timer.start()
    streams: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda name=name, s=s: streams.__setitem__(name, s.read()))
               for name, s in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    proc.wait()
    timer.cancel()
    for reader in readers:
        reader.join()
    peak = 0.0 if killed.is_set() else proc.peak_mb()
    return Run(proc.returncode, streams["out"].decode(errors="replace"), streams["err"].decode(errors="replace"),
               killed.is_set(), peak)


def bounded(result: Run) -> Run:
    assert not result.timed_out, f"still running after {DEADLINE} s: {result.stderr[-2000:]}"
    assert result.peak_rss_mb < PEAK_RSS_MB, f"peak RSS {result.peak_rss_mb:.0f} MB"
    assert result.returncode >= 0, f"killed by signal {-result.returncode}: {result.stderr[-2000:]}"
    return result


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    target = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, target)
    return target


# --- 1. the cache holds data, never code; a directory others can write is not used ----------

def _key_of(target: Path) -> str:
    """The cache key a scan of `target` uses (computed by the code under test)."""
    from kvtrace.cache import scan_key
    from kvtrace.config import Settings
    from kvtrace.fetch.local import fetch_local
    from kvtrace.packs import load_pack

    return scan_key(fetch_local(target), load_pack(), Settings(), None)


def _entry_names(key: str) -> list[str]:
    # The entry's name in the data-only format and in the pickle format before it: a hostile
    # entry is planted under both, so the test holds whichever format the code reads.
    return [f"{key}.kvtrace-cache", f"{key}.report"]


def _framed(magic: bytes, payload: bytes) -> bytes:
    return magic + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_cache_entry_never_runs_code(tree: Path, tmp_path: Path) -> None:
    """Before: `_thaw` unpickled the payload, so whoever could write an entry ran code as the user."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    marker = tmp_path / "ran"
    payload = pickle.dumps(_RunsCode(str(marker)))
    key = _key_of(tree)
    for name in _entry_names(key):
        for magic in (b"kvtrace-cache 1\n", b"kvtrace-cache 2 json\n"):
            (cache / name).write_bytes(_framed(magic, payload))
            result = bounded(run("scan", str(tree), "--format", "json", env={"KVTRACE_CACHE_DIR": str(cache)}))
            assert not marker.exists(), "an entry's payload ran code"
            assert result.returncode == 1 and json.loads(result.stdout)["reports"][0]["findings"], result.stderr


def _forge_clean(entry: bytes) -> bytes:
    """What an attacker would write: the same entry with every finding removed, re-framed so the
    checksum verifies (it is a checksum, not a signature)."""
    magic, _, rest = entry.partition(b"\n")
    payload = rest.split(b"\n", 1)[1]
    if payload.startswith(b"{"):
        data = json.loads(payload)
        data["report"]["findings"] = []
        forged = json.dumps(data).encode()
    else:
        files, report = pickle.loads(payload)
        forged = pickle.dumps((files, replace(report, findings=[])))
    return _framed(magic + b"\n", forged)


@pytest.mark.parametrize("who", ["another user's folder", "a folder anyone can write"])
def test_a_forged_clean_entry_in_a_folder_others_can_write_is_not_used(tree: Path, tmp_path: Path, who: str) -> None:
    """Before: an entry in a KVTRACE_CACHE_DIR another user pre-created (in a sticky /tmp) was
    read: a forged clean report made a pinned tree exit 0."""
    own = tmp_path / "own"
    assert run("scan", str(tree), "-q", env={"KVTRACE_CACHE_DIR": str(own)}).returncode == 1
    # The report's entry (the other one is its text rendering, kvtrace.cache.rendered).
    [genuine] = [p for p in own.iterdir() if not p.name.startswith(".") and b'"outside": ' not in p.read_bytes()[:300]]
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (hostile / genuine.name).write_bytes(_forge_clean(genuine.read_bytes()))
    if who == "another user's folder":
        os.chown(hostile / genuine.name, 65534, 65534)
        os.chown(hostile, 65534, 65534)
        os.chmod(hostile, 0o755)
    else:
        os.chmod(hostile, 0o777)
    result = bounded(run("scan", str(tree), "--format", "json", env={"KVTRACE_CACHE_DIR": str(hostile)}))
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["reports"][0]["findings"]
    assert "warning: cache directory" in result.stderr and "neither cached nor reused" in result.stderr
    # The cache commands refuse it outright and leave it as it was.
    before = sorted(p.name for p in hostile.iterdir())
    assert "cache directory" in run("cache", "clear", env={"KVTRACE_CACHE_DIR": str(hostile)}).one_error_line()
    assert sorted(p.name for p in hostile.iterdir()) == before


@pytest.mark.parametrize("hazard", ["fifo", "link to /dev/zero", "3 GB sparse file", "folder"])
def test_an_entry_that_is_not_a_small_regular_file_is_a_miss_at_no_cost(tree: Path, tmp_path: Path, hazard: str) -> None:
    """Before: a FIFO entry blocked the scan forever, /dev/zero and a 3 GB sparse entry were read
    whole into memory."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    for name in _entry_names(_key_of(tree)):
        path = cache / name
        if hazard == "fifo":
            os.mkfifo(path)
        elif hazard == "link to /dev/zero":
            path.symlink_to("/dev/zero")
        elif hazard == "folder":
            path.mkdir()
        else:
            with path.open("wb") as handle:
                handle.write(b"kvtrace-cache 1\n")
                handle.truncate(3 * 1024**3)
    result = bounded(run("scan", str(tree), "-q", env={"KVTRACE_CACHE_DIR": str(cache)}))
    assert result.returncode == 1, result.stderr
    assert os.path.lexists(cache / f"{_key_of(tree)}.report")  # not ours to remove


def test_cache_clear_and_eviction_remove_only_what_kvtrace_wrote(tree: Path, tmp_path: Path) -> None:
    """Before: `cache clear` and eviction removed every `*.report` in the folder, a user's own too."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    mine = {"notes.report": b"my own notes", f"{'a' * 64}.report": b"a report of mine, named by its hash",
            f"{'b' * 64}.kvtrace-cache": b"not an entry: no magic line", "kvtrace.json": b"{}"}
    for name, data in mine.items():
        (cache / name).write_bytes(data)
    env = {"KVTRACE_CACHE_DIR": str(cache)}
    # A bound of one byte: every write is followed by an eviction of everything kvtrace wrote.
    assert run("scan", str(tree), "-q", env={**env, "KVTRACE_CACHE_MAX_BYTES": "1"}).returncode == 1
    assert {n: (cache / n).read_bytes() for n in mine} == mine
    assert run("scan", str(tree), "-q", env=env).returncode == 1
    ours = [p.name for p in cache.iterdir() if p.name not in mine]
    assert len(ours) == 2, ours  # the report and its text rendering
    cleared = run("cache", "clear", env=env)
    assert cleared.returncode == 0 and "removed 2 entries" in cleared.stdout, cleared.stdout + cleared.stderr
    assert sorted(p.name for p in cache.iterdir()) == sorted(mine)


def test_the_cache_folder_is_created_private(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "new" / "cache"
    assert run("scan", str(tree), "-q", env={"KVTRACE_CACHE_DIR": str(cache)}).returncode == 1
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in cache.iterdir())


def test_a_cached_report_comes_back_whole_and_without_the_analysis(tree: Path, tmp_path: Path) -> None:
    """The data-only format loses nothing a report shows (every format is byte-identical from the
    cache), and a hit still imports none of the analysis."""
    env = {"KVTRACE_CACHE_DIR": str(tmp_path / "cache")}
    for fmt in ("json", "sarif", "text", "html"):
        cold = run("scan", str(tree), "--format", fmt, "--no-cache")
        warm_first = run("scan", str(tree), "--format", fmt, env=env)
        warm = run("scan", str(tree), "--format", fmt, "-v", env=env)
        assert "cached result" in warm.stderr, warm.stderr
        assert cold.stdout == warm_first.stdout == warm.stdout, fmt
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvtrace", "scan", str(tree), "-q"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert proc.returncode == 1 and "kvtrace.cache" in imported
    assert not {m for m in imported if m.split(".")[0] in ("libcst", "networkx") or m == "kvtrace.flow"}


def test_the_cache_codec_round_trips_a_real_sglang_report_and_refuses_any_change() -> None:
    """Every field of a report of SGLang's own tree (the queue graph's tuples and sets included)
    comes back equal; an entry with one value of the wrong type, an unknown enum value or an
    extra key is refused."""
    from tests.sglang_wheels import sglang_tree

    from kvtrace.cachecodec import decode_report, encode_report
    from kvtrace.fetch.local import fetch_local
    from kvtrace.packs import load_pack
    from kvtrace.scan import scan_fetched

    report = scan_fetched(fetch_local(sglang_tree("0.5.2") / "sglang" / "srt" / "disaggregation"), load_pack())
    assert report.findings and report.graph and report.queues[0].sites
    payload = encode_report({"key": "k"}, report)
    extra, back = decode_report(payload)
    assert extra == {"key": "k"}
    assert replace(back, files=report.files) == report and back.graph == report.graph
    assert [vars(f) for f in back.findings] == [vars(f) for f in report.findings]
    data = json.loads(payload)
    for damage in (lambda d: d["report"]["findings"][0].__setitem__("line", "12"),
                   lambda d: d["report"]["queues"][0]["sites"][0].__setitem__("kind", "no-such-kind"),
                   lambda d: d["report"]["backends"][0]["verdicts"].__setitem__("S", {"state": "S"}),
                   lambda d: d["report"].__setitem__("extra", 1),
                   lambda d: d["report"]["graphs"].__setitem__("dict", [[{"list": []}, 1]])):
        broken = json.loads(json.dumps(data))
        damage(broken)
        with pytest.raises((ValueError, TypeError)):
            decode_report(json.dumps(broken).encode())


def test_an_entry_that_fails_its_checks_changes_nothing_in_the_scan(tree: Path, tmp_path: Path) -> None:
    """An entry whose file list marks every file unreadable but ends in a bad item is a miss, and
    the scan that follows sees every file as it was fetched (no status leaks from the entry)."""
    from kvtrace.cache import MAGIC, Cache, scan_cached, scan_key
    from kvtrace.fetch.local import fetch_local
    from kvtrace.packs import load_pack

    cache, pack = Cache(tmp_path / "c"), load_pack()
    first, _ = scan_cached(fetch_local(tree), pack, cache)
    key = scan_key(fetch_local(tree), pack)
    entry = tmp_path / "c" / f"{key}.kvtrace-cache"
    payload = json.loads(entry.read_bytes().split(b"\n", 2)[2])
    payload["extra"]["files"] = [[p, s, "not-utf8", "forged"] for p, s, _, _ in payload["extra"]["files"]] + [[1]]
    entry.write_bytes(_framed(MAGIC, json.dumps(payload).encode()))
    again, hit = scan_cached(fetch_local(tree), pack, cache)
    assert not hit and [f.status for f in again.files] == [f.status for f in first.files] == ["ok"] * len(first.files)
    assert len(again.findings) == len(first.findings) > 0


# --- 3. diff reads git objects; nothing from the repository runs, no option from user text ---

GIT = ["git", "-c", "user.name=kvtrace tests", "-c", "user.email=tests@kvtrace.invalid", "-c", "init.defaultBranch=main"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture()
def hostile_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A checkout whose config and attributes would run commands (each touches a marker file) if
    anything read it through a filter, textconv or fsmonitor, with two commits of nixl-pin."""
    repo, markers = tmp_path / "repo", tmp_path / "markers"
    markers.mkdir()
    shutil.copytree(NIXL_PIN, repo)
    git(repo, "init", "-q")
    for setting, value in (("filter.evil.smudge", f"touch {markers}/smudge; cat"),
                           ("filter.evil.clean", f"touch {markers}/clean; cat"),
                           ("diff.evil.textconv", f"touch {markers}/textconv; cat"),
                           ("core.fsmonitor", f"{markers}/fsmonitor.sh"),
                           ("core.pager", f"touch {markers}/pager; cat"),
                           ("core.hooksPath", f"{markers}/hooks")):
        git(repo, "config", setting, value)
    hook = markers / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {markers}/fsmonitor-ran\n")
    hook.chmod(0o755)
    (repo / ".gitattributes").write_text("*.py filter=evil diff=evil\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base", "--no-verify")
    for marker in markers.iterdir():  # what `git add` itself ran is not what is tested
        if marker.name != "fsmonitor.sh":
            marker.unlink()
    return repo, markers


def test_diff_runs_nothing_from_the_repository(hostile_repo: tuple[Path, Path]) -> None:
    """Before: `git archive` ran the repository's smudge filter on every .py file."""
    repo, markers = hostile_repo
    result = bounded(run("diff", "HEAD", "HEAD", "--repo", str(repo), "--format", "json"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in markers.iterdir()) == ["fsmonitor.sh"]
    assert json.loads(result.stdout)["unchanged"]  # both sides were read and scanned


@pytest.mark.parametrize("path_value", ["--output={out}", "--remote=ssh://127.0.0.1/x", "--exec=touch {out}"])
def test_diff_path_is_never_an_option(hostile_repo: tuple[Path, Path], tmp_path: Path, path_value: str) -> None:
    """Before: `--path=--output=FILE` made `git archive` write a tar there, and `--path=--remote=`
    contacted a remote (here: GIT_SSH_COMMAND would leave a marker)."""
    repo, markers = hostile_repo
    out = tmp_path / "written"
    ssh_marker = tmp_path / "ssh-ran"
    result = bounded(run("diff", "HEAD", "HEAD", "--repo", str(repo), f"--path={path_value.format(out=out)}",
                         env={"GIT_SSH_COMMAND": f"touch {ssh_marker}; false"}))
    assert "no folder of that name" in result.one_error_line()
    assert not out.exists() and not ssh_marker.exists()


def test_diff_links_and_submodules_are_gaps_not_crashes(hostile_repo: tuple[Path, Path]) -> None:
    """Before: a committed absolute symlink crashed the export (exit 4); a submodule vanished."""
    repo, _ = hostile_repo
    folder = repo / "disaggregation"
    (folder / "etc.py").symlink_to("/etc/passwd")
    (folder / "etc_dir").symlink_to("/etc")
    (folder / "up.py").symlink_to("../../../../../../../../etc/hostname")
    (folder / "inside.py").symlink_to("utils.py")
    commit = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{commit},disaggregation/vendored")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "links", "--no-verify")
    result = bounded(run("diff", "HEAD~1", "HEAD", "--repo", str(repo), "--format", "json"))
    assert result.returncode == 3, result.stderr
    assert "internal error" not in result.stderr and "incomplete" in result.stderr


def test_diff_reads_the_commits_own_objects_not_replacements(hostile_repo: tuple[Path, Path]) -> None:
    """`refs/replace/` can make git show other bytes for a blob; the revision is what was committed."""
    repo, _ = hostile_repo
    original = git(repo, "rev-parse", "HEAD:disaggregation/nixl/conn.py").strip()
    broken = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input="def f(:\n", check=True,
                            capture_output=True, text=True).stdout.strip()
    git(repo, "replace", original, broken)
    assert git(repo, "cat-file", "-p", "HEAD:disaggregation/nixl/conn.py") == "def f(:\n"  # git itself shows it
    result = bounded(run("diff", "HEAD", "HEAD", "--repo", str(repo), "--format", "json"))
    assert result.returncode == 0 and "incomplete" not in result.stderr, result.stderr


def test_diff_of_a_partial_clone_never_fetches(tmp_path: Path) -> None:
    """A partial clone lazily fetches a missing blob from its promisor remote; a repository's own
    config can make that remote a command (`ext::`, allowed by protocol.ext.allow). Reading a
    revision must not reach it: a missing blob is one line, exit 2."""
    server, client, marker = tmp_path / "server", tmp_path / "client", tmp_path / "fetched"
    shutil.copytree(NIXL_PIN, server)
    git(server, "init", "-q")
    git(server, "add", "-A")
    git(server, "commit", "-qm", "base")
    git(server, "config", "uploadpack.allowFilter", "true")
    git(tmp_path, "clone", "-q", "--filter=blob:none", "--no-checkout", f"file://{server}", str(client))
    git(client, "config", "protocol.ext.allow", "always")
    git(client, "config", "remote.origin.url", f"ext::sh -c touch% {marker}")
    line = bounded(run("diff", "HEAD", "HEAD", "--repo", str(client))).one_error_line()
    assert not marker.exists(), "reading a revision ran the promisor remote's command"
    assert "git ls-tree" in line and "promisor remote" in line, line


def test_a_revision_too_long_for_a_file_name_is_one_line(hostile_repo: tuple[Path, Path]) -> None:
    repo, _ = hostile_repo
    assert "not a revision" in bounded(run("diff", LONG, "HEAD", "--repo", str(repo))).one_error_line()


# --- 7. merge inputs are checked against the report schema ----------------------------------

@pytest.fixture(scope="module")
def clean_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("clean") / "clean.json"
    assert run("scan", str(ALL_CLEAR), "--format", "json", "-o", str(out), "--no-cache").returncode == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("complete", [0, "false", "False", None, [], 1])
def test_merge_counts_only_a_boolean_complete(clean_report: dict, tmp_path: Path, complete: object) -> None:
    """Before: `"complete": 0` or `"false"` counted as complete: the merge exited 0."""
    document = json.loads(json.dumps(clean_report))
    document["reports"][0]["complete"] = complete
    path = tmp_path / "host.json"
    path.write_text(json.dumps(document))
    line = bounded(run("merge", str(path))).one_error_line()
    assert "complete" in line and "true or false" in line and str(path) in line


def test_merge_of_a_well_formed_report_still_passes(clean_report: dict, tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(clean_report))
    result = bounded(run("merge", str(path)))
    assert result.returncode == 0 and "Fleet: 1 host, exit 0" in result.stdout, result.stderr


# --- 12. a scanned tree's config names no file outside its own folder ------------------------

def _config(tree: Path, body: str) -> Path:
    path = tree / "pyproject.toml"
    path.write_text(f"[tool.kvtrace]\n{body}\n")
    return path


@pytest.mark.parametrize("body", ['pack = "/dev/zero"', 'baseline = "/dev/zero"', 'baseline = "../outside.json"',
                                  'pack = "zero-link.toml"', 'baseline = "fifo.json"'])
def test_a_scanned_trees_config_cannot_make_kvtrace_read_elsewhere(tree: Path, tmp_path: Path, body: str) -> None:
    """Before: `pack = "/dev/zero"` was read until the OOM killer came (23.8 GB); `baseline =
    "/dev/zero"` never ended."""
    (tmp_path / "outside.json").write_text('{"reports": []}')
    (tree / "zero-link.toml").symlink_to("/dev/zero")
    os.mkfifo(tree / "fifo.json")
    path = _config(tree, body)
    line = bounded(run("scan", str(tree), cwd=tmp_path)).one_error_line()
    assert str(path) in line or "fifo.json" in line, line


@pytest.mark.parametrize("hazard", ["fifo", "link to /dev/zero"])
def test_a_scanned_trees_package_metadata_is_read_bounded(tmp_path: Path, hazard: str) -> None:
    """The installed package's METADATA (for the SGLang version in the header) is the scanned
    tree's file too: before, a FIFO there blocked the scan, /dev/zero filled memory."""
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "examples" / "installed-layout", site)
    dist = site / "sglang-9.9.9.dist-info"
    dist.mkdir()
    if hazard == "fifo":
        os.mkfifo(dist / "METADATA")
    else:
        (dist / "METADATA").symlink_to("/dev/zero")
    result = bounded(run("scan", str(site / "sglang"), "--format", "json", "--no-cache"))
    # The scan's own verdict line ("failed: 2 errors ...") may be on stderr; no error about the file.
    assert result.returncode in (0, 1, 3) and "kvtrace: error" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "METADATA" not in result.stderr, result.stderr
    assert json.loads(result.stdout)["reports"][0].get("sglang_version") is None


def test_a_config_may_still_name_its_own_files(tree: Path, tmp_path: Path) -> None:
    assert run("scan", str(tree), "--write-baseline", str(tree / "ci" / "base.json")).returncode == 2  # no folder
    (tree / "ci").mkdir()
    assert run("scan", str(tree), "--write-baseline", str(tree / "ci" / "base.json")).returncode in (0, 1)
    assert run("scan", str(tree), cwd=tmp_path).returncode == 1  # the tree's findings, without a baseline
    _config(tree, 'baseline = "ci/base.json"')
    assert bounded(run("scan", str(tree), cwd=tmp_path)).returncode == 0


# --- 15. malformed files and names: one line, exit 2, never an internal error ----------------

DEEP_JSON = "[" * 200_000 + "]" * 200_000
DEEP_TOML = "x = " + "[" * 200_000 + "]" * 200_000 + "\n"
NOT_UTF8 = b'{"reports": [\xff\xfe]}'


@pytest.mark.parametrize(("name", "content"), [
    ("deep", DEEP_JSON), ("not utf-8", NOT_UTF8), ("reports not a list", '{"reports": 3}'),
    ("rule a number", '{"reports": [{"findings": [{"rule": 3}]}]}'),
    ("backend a list", '{"reports": [{"findings": [{"rule": "pinned-state", "backend": []}]}]}'),
    ("finding a string", '{"reports": [{"findings": ["x"]}]}'),
    ("sarif ruleId a number", '{"runs": [{"results": [{"ruleId": 3}]}]}'),
    ("a number", "3"), ("huge integer", "1" * 5000),
])
def test_a_malformed_baseline_is_one_line(tree: Path, tmp_path: Path, name: str, content: str | bytes) -> None:
    path = tmp_path / "baseline.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert "baseline" in bounded(run("scan", str(tree), "--baseline", str(path))).one_error_line()


@pytest.mark.parametrize(("name", "content"), [
    ("deep", DEEP_JSON), ("not utf-8", NOT_UTF8), ("a string", '"x"'),
    ("files not a list", '{"schema": "kvtrace/1", "target": "t", "files": "x", "findings": []}'),
    ("file path a number", '{"schema": "kvtrace/1", "target": "t", "files": [{"path": 1, "sha256": "", "status": "ok"}], "findings": []}'),
    ("severity unknown", '{"schema": "kvtrace/1", "target": "t", "files": [], "findings": [{"severity": "fatal"}]}'),
    ("document reports a dict", '{"schema": "kvtrace/2", "kvtrace": "0", "reports": {}}'),
])
def test_a_malformed_merge_input_is_one_line(tmp_path: Path, name: str, content: str | bytes) -> None:
    path = tmp_path / "host.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert str(path) in bounded(run("merge", str(path))).one_error_line()


@pytest.mark.parametrize(("name", "content"), [
    ("deep", DEEP_TOML), ("not utf-8", b"[tool.kvtrace]\nselect = [\"\xff\"]\n"), ("tool a number", "tool = 3\n"),
    ("kvtrace a number", "[tool]\nkvtrace = 3\n"), ("fail-on a number", "[tool.kvtrace]\nfail-on = 3\n"),
    ("3 GB sparse", None),
])
def test_a_malformed_pyproject_is_one_line(tree: Path, name: str, content: str | bytes | None) -> None:
    path = tree / "pyproject.toml"
    if content is None:
        with path.open("wb") as handle:
            handle.write(b"[tool.kvtrace]\n")
            handle.truncate(3 * 1024**3)
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert str(path) in bounded(run("scan", str(tree))).one_error_line()


@pytest.mark.parametrize(("name", "content"), [
    ("deep", DEEP_TOML), ("not utf-8", b"[pack]\nname = \"\xff\"\n"), ("queue a number", "queue = 3\n"),
    ("poll_calls a number", '[pack]\nname = "p"\npackage_dir = "d"\n[queue]\nname = "q"\npoll_calls = 3\n'),
])
def test_a_malformed_rules_pack_is_one_line(tree: Path, tmp_path: Path, name: str, content: str | bytes) -> None:
    path = tmp_path / "pack.toml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert "rules pack" in bounded(run("scan", str(tree), "--rules", str(path))).one_error_line()


@pytest.mark.parametrize("option", ["-o", "--write-baseline", "--graph", "--baseline", "--rules", "TARGET", "merge"])
def test_a_name_over_255_bytes_is_one_line(tree: Path, tmp_path: Path, option: str) -> None:
    """Before: OSError (ENAMETOOLONG) from a stat deep inside, exit 4."""
    long_file = str(tmp_path / f"{LONG}.json")
    args = {"TARGET": ["scan", str(tmp_path / LONG)], "merge": ["merge", long_file]}.get(
        option, ["scan", str(tree), option, long_file if option != "--graph" else str(tmp_path / f"{LONG}.dot")])
    bounded(run(*args)).one_error_line()


def test_graph_to_a_missing_folder_is_refused_before_the_scan(tree: Path, tmp_path: Path) -> None:
    """Before: the whole scan ran, then writing the graph failed."""
    result = bounded(run("scan", str(tree), "--graph", str(tmp_path / "missing" / "g.dot"), "-v", "--no-cache"))
    assert "does not exist" in result.stderr and "analysed" not in result.stderr and "fetched" not in result.stderr
    assert result.returncode == 2


@pytest.mark.parametrize("what", ["--baseline", "--rules", "--hosts", "merge"])
def test_user_files_that_are_fifos_or_devices_are_refused_at_once(tree: Path, tmp_path: Path, what: str) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for source in (str(fifo), "/dev/zero"):
        args = ["merge", source] if what == "merge" else ["scan", str(tree), what, source]
        assert "not a regular file" in bounded(run(*args, timeout=30)).one_error_line()


def test_config_and_baseline_schemas_are_json_schema_and_agree_with_the_validator() -> None:
    """The hand-rolled validator enforces what a JSON Schema validator would, on the schemas kvtrace ships."""
    jsonschema = pytest.importorskip("jsonschema")
    from kvtrace.baseline import BASELINE_SCHEMAS
    from kvtrace.config import CONFIG_SCHEMA
    from kvtrace.report.schema import JSON_SCHEMA
    from kvtrace.userfiles import SchemaError, validate

    samples = [
        (CONFIG_SCHEMA, {"select": ["a"], "fail-on": "error"}), (CONFIG_SCHEMA, {"fail-on": "sometimes"}),
        (CONFIG_SCHEMA, {"select": "a"}), (CONFIG_SCHEMA, {"typo": 1}), (CONFIG_SCHEMA, {"pack": 3}),
        (BASELINE_SCHEMAS["kvtrace/2"], {"reports": [{"findings": [{"rule": "r", "backend": None}]}]}),
        (BASELINE_SCHEMAS["kvtrace/2"], {"reports": [{"findings": [{"rule": 3}]}]}),
        (BASELINE_SCHEMAS["kvtrace/2"], {"reports": [{"findings": [{"rule": ""}]}]}),
        (BASELINE_SCHEMAS["sarif"], {"runs": [{"results": [{"ruleId": "r", "partialFingerprints": {"k": 1}}]}]}),
        (BASELINE_SCHEMAS["sarif"], {"runs": [{"results": [{"ruleId": "r", "properties": {"state": "S"}}]}]}),
        (JSON_SCHEMA, {"schema": "kvtrace/2", "kvtrace": "0", "reports": []}),
        (JSON_SCHEMA, {"schema": "kvtrace/2", "kvtrace": "0", "reports": [], "extra": 1}),
        (JSON_SCHEMA, {"schema": "kvtrace/2", "kvtrace": 0, "reports": []}),
        (JSON_SCHEMA, {"schema": "kvtrace/3", "kvtrace": "0", "reports": []}),
        (JSON_SCHEMA, {"schema": "kvtrace/2", "kvtrace": "0", "reports": [{"complete": True}]}),
    ]
    verdicts = []
    for schema, value in samples:
        jsonschema.Draft202012Validator.check_schema(schema)
        expected = jsonschema.Draft202012Validator(schema).is_valid(value)
        try:
            validate(value, schema)
            got = True
        except SchemaError:
            got = False
        assert got == expected, (value, expected)
        verdicts.append(got)
    assert True in verdicts and False in verdicts
