"""The result cache: hits, misses on any change, damage tolerated, concurrent writers, the size
bound, and the CLI's --no-cache / `cache info|clear`. Every test uses its own cache dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvtrace.cache import Cache, scan_cached, scan_key
from kvtrace.fetch.local import fetch_local
from kvtrace.model import FetchLimits
from kvtrace.packs import load_pack
from kvtrace.scan import scan_fetched

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "nixl-pin"


class CountingScan:
    """The real scan, counting how often the analysis actually ran."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, fetched, pack):
        with self.lock:
            self.calls += 1
        return scan_fetched(fetched, pack)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    target = tmp_path / "tree"
    shutil.copytree(EXAMPLE, target)
    return target


def fetch(path: Path):
    return fetch_local(path, FetchLimits())


def findings(report) -> list[tuple]:
    return [(f.rule, f.path, f.line, f.backend, f.state, f.message) for f in report.findings]


def test_hit_returns_the_same_report_without_analysing(tree: Path, tmp_path: Path) -> None:
    cache, pack, scan = Cache(tmp_path / "c"), load_pack(), CountingScan()
    first, hit1 = scan_cached(fetch(tree), pack, cache, scan=scan)
    second, hit2 = scan_cached(fetch(tree), pack, cache, scan=scan)
    assert (hit1, hit2, scan.calls) == (False, True, 1)
    assert findings(first) == findings(second) and findings(first)
    assert [(f.path, f.status) for f in second.files] == [(f.path, f.status) for f in first.files]
    # Files are re-attached from the fetch, so excerpts still have their text.
    assert all(f.data for f in second.files)
    assert second.queues[0].sites == first.queues[0].sites


def test_a_hit_names_the_package_after_its_own_target(tmp_path: Path) -> None:
    """Before: a package whose version.py is at the top of the target is named by the target's
    folder, and two targets with the same files share an entry: a scan of versions/sglang-0.5.23
    after one of a copy named sglang said `sglang 0.5.23` (a new user's trial)."""
    cache, pack, scan = Cache(tmp_path / "c"), load_pack(), CountingScan()
    targets = []
    for name in ("sglang", "sglang-1.2.3"):
        target = tmp_path / name / name
        shutil.copytree(EXAMPLE, target)
        (target / "version.py").write_text('__version__ = "1.2.3"\n')
        targets.append(target)
    first, hit1 = scan_cached(fetch(targets[0]), pack, cache, scan=scan)
    second, hit2 = scan_cached(fetch(targets[1]), pack, cache, scan=scan)
    assert (hit1, hit2, scan.calls) == (False, True, 1)
    assert first.version is not None and (first.version.package, first.version.version) == ("sglang", "1.2.3")
    assert second.version is not None and (second.version.package, second.version.version) == ("sglang-1.2.3", "1.2.3")
    assert (second.version.path, second.version.line) == (first.version.path, first.version.line) == ("version.py", 1)


def test_a_changed_file_or_pack_is_a_miss(tree: Path, tmp_path: Path) -> None:
    cache, pack, scan = Cache(tmp_path / "c"), load_pack(), CountingScan()
    scan_cached(fetch(tree), pack, cache, scan=scan)
    conn = tree / "disaggregation" / "nixl" / "conn.py"
    conn.write_text(conn.read_text() + "\n# touched\n")
    _, hit = scan_cached(fetch(tree), pack, cache, scan=scan)
    assert not hit and scan.calls == 2
    other_pack = load_pack()
    other_pack = type(other_pack)(**{**other_pack.__dict__, "timeout_names": ("never_matches",)})
    assert scan_key(fetch(tree), other_pack) != scan_key(fetch(tree), pack)
    _, hit = scan_cached(fetch(tree), other_pack, cache, scan=scan)
    assert not hit and scan.calls == 3


def test_a_syntax_error_status_comes_back_from_the_cache(tree: Path, tmp_path: Path) -> None:
    (tree / "disaggregation" / "broken.py").write_text("def f(:\n")
    cache = Cache(tmp_path / "c")
    cold_fetch, warm_fetch = fetch(tree), fetch(tree)
    first, _ = scan_cached(cold_fetch, load_pack(), cache)
    second, hit = scan_cached(warm_fetch, load_pack(), cache)
    assert hit
    broken = [f for f in second.files if f.path.endswith("broken.py")]
    assert broken and broken[0].status == "syntax-error" and broken[0].error
    assert [(f.path, f.status, f.error) for f in second.files] == [(f.path, f.status, f.error) for f in first.files]
    # Neither the scan nor the cache changed the fetched files: the marks are on the report's copies.
    assert all(f.status == "ok" for f in cold_fetch.files + warm_fetch.files)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_a_corrupt_entry_is_ignored_and_rewritten(tree: Path, tmp_path: Path, damage: str) -> None:
    cache, pack, scan = Cache(tmp_path / "c"), load_pack(), CountingScan()
    good, _ = scan_cached(fetch(tree), pack, cache, scan=scan)
    [entry] = list((tmp_path / "c").glob("*.kvtrace-cache"))
    blob = entry.read_bytes()
    entry.write_bytes({
        "truncate": blob[: len(blob) // 2],
        "flip": blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:],
        "garbage": os.urandom(len(blob)),
        "empty": b"",
    }[damage])
    again, hit = scan_cached(fetch(tree), pack, cache, scan=scan)
    assert not hit and scan.calls == 2 and findings(again) == findings(good)
    _, hit = scan_cached(fetch(tree), pack, cache, scan=scan)
    assert hit and scan.calls == 2  # the rewritten entry is whole again


@pytest.mark.parametrize("payload", [b'{"extra": {}, "report": {}}', b'["not", "a report"]',
                                     b"\x80\x05\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94."])
def test_a_payload_that_verifies_but_is_not_a_report_is_a_miss(tree: Path, tmp_path: Path, payload: bytes) -> None:
    cache, pack, scan = Cache(tmp_path / "c"), load_pack(), CountingScan()
    key = scan_key(fetch(tree), pack)
    cache.put(key, payload)
    _, hit = scan_cached(fetch(tree), pack, cache, scan=scan)
    assert not hit and scan.calls == 1


def test_concurrent_writers_leave_whole_entries(tree: Path, tmp_path: Path) -> None:
    directory = tmp_path / "c"
    pack, scan = load_pack(), CountingScan()
    barrier = threading.Barrier(6)
    results: list = []

    def worker() -> None:
        barrier.wait()
        results.append(scan_cached(fetch(tree), pack, Cache(directory), scan=scan)[0])

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and len({tuple(findings(r)) for r in results}) == 1
    assert [p.name for p in directory.iterdir() if p.name.startswith(".tmp-")] == []
    assert len(list(directory.glob("*.kvtrace-cache"))) == 1
    _, hit = scan_cached(fetch(tree), pack, Cache(directory), scan=scan)
    assert hit


def test_concurrent_processes_share_the_cache(tree: Path, tmp_path: Path) -> None:
    env = {**os.environ, "KVTRACE_CACHE_DIR": str(tmp_path / "c")}
    code = ("import sys, pathlib; from kvtrace.cache import Cache, scan_cached; "
            "from kvtrace.fetch.local import fetch_local; from kvtrace.model import FetchLimits; "
            "from kvtrace.packs import load_pack; "
            "r, hit = scan_cached(fetch_local(pathlib.Path(sys.argv[1]), FetchLimits()), load_pack(), Cache()); "
            "print(len(r.findings))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tree)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and len(set(outputs)) == 1 and outputs[0] != "0"
    assert len(list((tmp_path / "c").glob("*.kvtrace-cache"))) == 1


def test_size_bound_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c", limit=3000)
    for i in range(5):
        cache.put(f"{i:064x}", os.urandom(900))
        os.utime(cache._entry(f"{i:064x}"), (1000 + i, 1000 + i))
    info = cache.info()
    assert info.total_bytes <= 3000 and info.entries == 3  # each entry is 900 bytes + an 86-byte header
    assert [cache.get(f"{i:064x}") is not None for i in range(5)] == [False, False, True, True, True]


def test_an_unwritable_cache_dir_costs_nothing_but_speed(tree: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    report, hit = scan_cached(fetch(tree), load_pack(), Cache(blocker / "c"))
    assert not hit and report.findings


def kvtrace(cache_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVTRACE_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_cache_info_clear_and_no_cache(tree: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    cold = kvtrace(cache_dir, "scan", str(tree), "--format", "json", "-v")
    assert cold.returncode == 1 and "analysed in" in cold.stderr
    warm = kvtrace(cache_dir, "scan", str(tree), "--format", "json", "-v")
    assert warm.returncode == 1 and "cached result" in warm.stderr
    assert json.loads(warm.stdout)["reports"][0]["findings"] == json.loads(cold.stdout)["reports"][0]["findings"]
    info = kvtrace(cache_dir, "cache", "info")  # the report and its JSON rendering
    assert info.returncode == 0 and str(cache_dir) in info.stdout and "entries  2" in info.stdout
    bypass = kvtrace(cache_dir, "scan", str(tree), "--no-cache", "-v")
    assert bypass.returncode == 1 and "analysed in" in bypass.stderr
    cleared = kvtrace(cache_dir, "cache", "clear")
    assert cleared.returncode == 0 and "removed 2 entries" in cleared.stdout
    assert "entries  0" in kvtrace(cache_dir, "cache", "info").stdout


def test_no_cache_writes_nothing(tree: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    assert kvtrace(cache_dir, "scan", str(tree), "--no-cache").returncode == 1
    assert not cache_dir.exists() or not list(cache_dir.iterdir())


def test_the_suite_does_not_use_the_real_user_cache() -> None:
    from platformdirs import user_cache_dir

    assert Cache().dir != Path(user_cache_dir("kvtrace", appauthor=False))
    assert os.environ["KVTRACE_CACHE_DIR"] == str(Cache().dir)


def test_code_files_are_what_rglob_lists(tmp_path: Path) -> None:
    """The code digest's listing (os.scandir, one walk for both suffixes) is sorted(rglob) of
    kvtrace's own folders and of a tree with names whose string order differs from path order
    ("a-b.py" / "a/b.py"), but for __pycache__, which holds no source."""
    import kvtrace
    from kvtrace.cache import _code_files

    for name in ("a-b.py", "a/b.py", "a/c/d.py", "a.py", "b.toml", "a/x.toml", ".hidden/e.py", "A.py",
                 "a/__pycache__/stray.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "loop").symlink_to(tmp_path, target_is_directory=True)  # a link to a folder: not entered
    package = Path(kvtrace.__file__).parent
    for folder in (tmp_path, package):
        for suffix in (".py", ".toml"):
            listed = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*" + suffix))
                      if not any(part in ("loop", "__pycache__") for part in p.relative_to(folder).parts)]
            assert _code_files(str(folder), (".py", ".toml"))[suffix] == listed
    assert _code_files(str(tmp_path), (".py",))[".py"] == [".hidden/e.py", "A.py", "a/b.py", "a/c/d.py", "a-b.py", "a.py"]


def test_the_code_stamp_changes_with_every_write_to_the_code(tmp_path: Path) -> None:
    """The code digest stamps each .py and .toml file by name, size and modification time, as
    Python does before it runs a file's bytecode: an edit of the same size, a new file, a removed
    one and a renamed one each change it; a folder left alone and other files do not."""
    from kvtrace.cache import code_stamp

    for name in ("a.py", "packs/p.toml", "sub/b.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
        os.utime(tmp_path / name, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    first = code_stamp(str(tmp_path))
    assert code_stamp(str(tmp_path)) == first
    (tmp_path / "notes.txt").write_text("not code")
    assert code_stamp(str(tmp_path)) == first
    (tmp_path / "a.py").write_text("x = 2\n")  # the same size: told apart by its modification time
    edited = code_stamp(str(tmp_path))
    assert edited != first
    os.utime(tmp_path / "a.py", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_001))  # 1 ns apart
    assert code_stamp(str(tmp_path)) not in (first, edited)
    (tmp_path / "packs" / "q.toml").write_text("")
    added = code_stamp(str(tmp_path))
    (tmp_path / "packs" / "q.toml").rename(tmp_path / "packs" / "r.toml")
    renamed = code_stamp(str(tmp_path))
    (tmp_path / "packs" / "r.toml").unlink()
    assert len({first, edited, added, renamed, code_stamp(str(tmp_path))}) == 5
