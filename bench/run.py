"""Benchmark: kvtrace on a real SGLang release against baselines measured in the same run.

    python bench/run.py [--version 0.5.23] [--repeat 5] [--skip-semgrep] [--skip-ssh]

The tree is the `disaggregation/` package of a released wheel (plus the srt files that mention
the queue), from tests/sglang_wheels.py. Every measurement runs in a fresh interpreter, so imports
and caches never carry over; times are medians of --repeat, memory is peak RSS (the process plus
its forked child, kvtrace.beside). Each target of issue 11 is printed as a ratio of two numbers
measured here, in this run, with its verdict; the two sides of the time ratios are run
alternately and the ratio is the median of the pairs':

  cold         kvtrace with no cache, whole process (`kvtrace scan --no-cache`), vs Semgrep running
               the equivalent release-map + sender rules (bench/semgrep-equivalent.yml)  <= 0.30
  cold/floor   the same scan in-process vs `ast.parse` of every file in-process          <= 2
  warm         a rescan of the unchanged tree from the result cache vs cold              <= 0.15
  remote       scan over loopback SSH vs (SSH tar fetch alone + local scan)              <= 1.2
  memory       peak RSS of a cold scan                                                   <= 300 MB
  copies       1x, 4x, 16x copies of the tree side by side: time and memory per copy do not grow
  fleet        16 loopback SSH targets vs one                                            <= 3

Semgrep is installed from PyPI into the bench's own environment (~/.cache/kvtrace-bench), never
into the project's. sshd comes from .ci/install-sshd.sh, as for the tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

BENCH_HOME = Path(os.environ.get("KVTRACE_BENCH_HOME", Path.home() / ".cache" / "kvtrace-bench"))
SEMGREP_RULES = ROOT / "bench" / "semgrep-equivalent.yml"

# In-process programs: timed from before their first import to the end; argv[1] is the tree.
PROGRAMS = {
    "ast": """
import ast, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).rglob('*.py')):
    ast.parse(p.read_bytes())
""",
    "kvtrace-cold": """
import pathlib, sys
from kvtrace.cache import scan_cached
from kvtrace.fetch.local import fetch_local
from kvtrace.model import FetchLimits
from kvtrace.packs import load_pack
report, hit = scan_cached(fetch_local(pathlib.Path(sys.argv[1]), FetchLimits()), load_pack(), None)
assert not hit and report.queues[0].drain is not None
""",
    "kvtrace-warm": """
import pathlib, sys
from kvtrace.cache import Cache, scan_cached
from kvtrace.fetch.local import fetch_local
from kvtrace.model import FetchLimits
from kvtrace.packs import load_pack
report, hit = scan_cached(fetch_local(pathlib.Path(sys.argv[1]), FetchLimits()), load_pack(), Cache())
assert hit and report.queues[0].drain is not None, 'the cache was not warm'
""",
    "kvtrace-unbounded": """
import functools, pathlib, sys
import kvtrace.parse
from kvtrace.cache import scan_cached
from kvtrace.fetch.local import fetch_local
from kvtrace.model import FetchLimits
from kvtrace.packs import load_pack
# Lift the parse budget (which bounds memory by leaving files out) so every copy is analysed.
kvtrace.parse.parse_modules = functools.partial(kvtrace.parse.parse_modules, max_nodes=10**9)
report, hit = scan_cached(fetch_local(pathlib.Path(sys.argv[1]), FetchLimits()), load_pack(), None)
assert not hit and report.queues[0].drain is not None
assert all(f.status == 'ok' for f in report.files), [f.error for f in report.files if f.status != 'ok'][:3]
""",
    "kvtrace-fill": """
import pathlib, sys
from kvtrace.cache import Cache, scan_cached
from kvtrace.fetch.local import fetch_local
from kvtrace.model import FetchLimits
from kvtrace.packs import load_pack
scan_cached(fetch_local(pathlib.Path(sys.argv[1]), FetchLimits()), load_pack(), Cache())
""",
    "ssh-fetch": """
import sys
from kvtrace.fetch import fetch_target
from kvtrace.model import FetchLimits
fetched = fetch_target(sys.argv[1], FetchLimits(), eval(sys.argv[2]))
assert fetched.files
""",
    "kvtrace-remote": """
import sys
from kvtrace.cache import scan_cached
from kvtrace.fetch import fetch_target
from kvtrace.model import FetchLimits
from kvtrace.packs import load_pack
report, hit = scan_cached(fetch_target(sys.argv[1], FetchLimits(), eval(sys.argv[2])), load_pack(), None)
assert not hit and report.queues[0].drain is not None
""",
    "fleet": """
import sys
from kvtrace.fleet import FleetOptions, run_fleet
from kvtrace.packs import load_pack
targets = sys.argv[1].split(',')
pack = load_pack()
results = run_fleet(targets, FleetOptions({t: pack for t in targets}, {}, ssh=eval(sys.argv[2]), jobs=8))
assert all(r.report is not None for r in results), [r.error for r in results]
""",
}


def run_python(name: str, *args: str, env: dict[str, str] | None = None) -> tuple[float, int]:
    """(seconds, peak RSS in KB of the process plus its largest child) of one program in a fresh interpreter."""
    wrapper = (
        "import resource, sys, time\n"
        "start = time.perf_counter()\n"
        f"exec(compile({PROGRAMS[name]!r}, {name!r}, 'exec'))\n"
        # The senders may be analysed in a forked child (kvtrace.beside): its peak counts too, as
        # if both peaks were held at once.
        "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"
        " + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = subprocess.run([sys.executable, "-c", wrapper, *args], capture_output=True, text=True, cwd=ROOT,
                          env=env or os.environ.copy())
    if done.returncode != 0:
        raise SystemExit(f"bench program {name} failed:\n{done.stderr[-3000:]}")
    out = done.stdout.split()
    return float(out[-2]), int(out[-1])


def run_process(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Wall time of a whole process (start-up included), as a user would wait for it."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env or os.environ.copy())
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed


def median(fn, repeat: int) -> tuple[float, int]:
    runs = [fn() for _ in range(repeat)]
    times = [r[0] if isinstance(r, tuple) else r for r in runs]
    memory = [r[1] for r in runs if isinstance(r, tuple)]
    return statistics.median(times), max(memory, default=0)


def paired(fn_a, fn_b, repeat: int) -> tuple[tuple[float, int], tuple[float, int], float]:
    """Run a and b alternately `repeat` times: (median a, median b, median of the ratios a/b of
    each pair). A shared machine's speed drifts by 20-30% over a minute; measured side by side,
    the drift moves both halves of a ratio together instead of only one."""
    pairs = [(fn_a(), fn_b()) for _ in range(repeat)]

    def parts(r):
        return (r[0], r[1]) if isinstance(r, tuple) else (r, 0)

    a = [parts(x) for x, _ in pairs]
    b = [parts(y) for _, y in pairs]
    ratio = statistics.median(x[0] / y[0] for x, y in zip(a, b))
    return ((statistics.median(t for t, _ in a), max(m for _, m in a)),
            (statistics.median(t for t, _ in b), max(m for _, m in b)), ratio)


def semgrep_bin() -> Path:
    venv = BENCH_HOME / "semgrep-venv"
    binary = venv / "bin" / "semgrep"
    if not binary.exists():
        print(f"installing semgrep from PyPI into {venv} (the bench's own environment) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "semgrep"], check=True)
    return binary


def line(label: str, seconds: float, rss_kb: int = 0) -> None:
    print(f"  {label:34} {seconds:7.3f} s" + (f"   peak RSS {rss_kb / 1024:6.1f} MB" if rss_kb else ""), flush=True)


def verdict(label: str, value: float, limit: float, unit: str = "x") -> bool:
    held = value <= limit
    print(f"  {label:44} {value:6.2f}{unit}  (target <= {limit:g}{unit})  {'met' if held else 'NOT met'}", flush=True)
    return held


def _load() -> str:
    """The machine's load beside the figures: other work on a shared machine moves every ratio."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def make_copies(tree: Path, count: int, where: Path) -> Path:
    """`count` copies of the tree side by side under one folder."""
    folder = where / f"copies-{count}"
    for i in range(count):
        shutil.copytree(tree, folder / f"copy{i:02d}")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="0.5.23")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-semgrep", action="store_true")
    parser.add_argument("--skip-ssh", action="store_true")
    args = parser.parse_args()

    from sglang_wheels import sglang_tree

    release = sglang_tree(args.version)
    work = Path(tempfile.mkdtemp(prefix="kvtrace-bench-"))
    env = {**os.environ, "KVTRACE_CACHE_DIR": str(work / "cache")}  # never the user's real cache
    try:
        tree = release / "sglang" / "srt" / "disaggregation"
        files = list(tree.rglob("*.py"))
        size = sum(f.stat().st_size for f in files) / 1e6
        lines = sum(f.read_bytes().count(b"\n") for f in files)
        print(f"SGLang {args.version} disaggregation/: {len(files)} files, {size:.2f} MB, {lines} lines "
              f"({tree}); median of {args.repeat}; {_load()}")
        results: list[bool] = []
        r = args.repeat

        print("times (each ratio below is the median of its pairs, run alternately)", flush=True)
        (cold_t, cold_m), (ast_t, ast_m), floor_ratio = paired(
            lambda: run_python("kvtrace-cold", str(tree), env=env), lambda: run_python("ast", str(tree)), r)
        line("ast.parse floor (in-process)", ast_t, ast_m)
        line("kvtrace cold (in-process)", cold_t, cold_m)
        run_python("kvtrace-fill", str(tree), env=env)  # one scan that writes the cache
        warm_t, warm_m = median(lambda: run_python("kvtrace-warm", str(tree), env=env), r)
        line("kvtrace warm (in-process, cached)", warm_t, warm_m)
        cli = [sys.executable, "-m", "kvtrace", "scan", str(tree), "-f", "json", "-o", os.devnull]
        semgrep_ratio = None
        if not args.skip_semgrep:
            semgrep = [str(semgrep_bin()), "scan", "--config", str(SEMGREP_RULES), "--metrics", "off",
                       "--disable-version-check", "--quiet", "--json", str(tree)]
            (cli_cold, _), (semgrep_t, _), semgrep_ratio = paired(
                lambda: run_process(cli + ["--no-cache"], env), lambda: run_process(semgrep, env), r)
        else:
            cli_cold, _ = median(lambda: run_process(cli + ["--no-cache"], env), r)
        line("kvtrace cold (whole process)", cli_cold)
        cli_warm, _ = median(lambda: run_process(cli, env), r)
        line("kvtrace warm (whole process)", cli_warm)
        if semgrep_ratio is not None:
            line("semgrep, equivalent rules (process)", semgrep_t)

        print("targets (ratios of numbers measured above)", flush=True)
        if semgrep_ratio is not None:
            results.append(verdict("cold: kvtrace process / semgrep process", semgrep_ratio, 0.30))
        results.append(verdict("cold: kvtrace / ast.parse floor (in-process)", floor_ratio, 2.0))
        results.append(verdict("warm / cold (in-process)", warm_t / cold_t, 0.15))
        print(f"  {'warm / cold (whole process, for reference)':44} {cli_warm / cli_cold:6.2f}x")
        results.append(verdict("peak RSS of a cold scan", cold_m / 1024, 300, " MB"))

        print("copies side by side (cold, in-process, parse budget lifted so every copy is analysed)", flush=True)
        base_t = base_m = 0.0
        for count in (1, 4, 16):
            folder = make_copies(tree, count, work)
            t, m = median(lambda: run_python("kvtrace-unbounded", str(folder), env=env), max(1, r // 2 or 1))
            if count == 1:
                base_t, base_m = t, m
            print(f"  {count:2d}x  {t:7.3f} s  ({t / base_t:5.2f}x time of 1x, {t / count:6.3f} s per copy)"
                  f"   peak RSS {m / 1024:6.1f} MB  ({m / base_m:5.2f}x)", flush=True)
            if count == 16:
                results.append(verdict("16 copies: time / (16 x one copy)", t / (16 * base_t), 1.0))
                results.append(verdict("16 copies: RSS / (16 x one copy)", m / (16 * base_m), 1.0))

        if not args.skip_ssh:
            results.extend(bench_ssh(tree, work, env, r))
        print(f"all targets met: {'yes' if all(results) else 'NO'} ({sum(results)}/{len(results)}); {_load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_ssh(tree: Path, work: Path, env: dict[str, str], r: int) -> list[bool]:
    from sshd_server import SshdServer, sshd_missing_reason

    if sshd_missing_reason():
        print(f"ssh: skipped ({sshd_missing_reason()})")
        return [False]
    results = []
    with SshdServer.start() as server:
        ssh = repr(dict(identity_files=[str(server.client_key)], known_hosts=str(server.known_hosts),
                        ssh_config=str(server.ssh_config)))
        target = f"{server.user}@127.0.0.1:{server.port}:{tree}"
        print("remote over loopback sshd", flush=True)
        fetch_t, _ = median(lambda: run_python("ssh-fetch", target, ssh, env=env), r)
        line("SSH tar fetch alone (fresh process)", fetch_t)
        local_t, _ = median(lambda: run_python("kvtrace-cold", str(tree), env=env), r)
        line("local cold scan", local_t)
        remote_t, _ = median(lambda: run_python("kvtrace-remote", target, ssh, env=env), r)
        line("remote cold scan", remote_t)
        verbose = subprocess.run([sys.executable, "-m", "kvtrace", "scan", target, "--no-cache", "-v", "-f", "json",
                                  "-o", os.devnull, "-i", str(server.client_key), "--known-hosts",
                                  str(server.known_hosts), "--ssh-config", str(server.ssh_config)],
                                 cwd=ROOT, env=env, capture_output=True, text=True)
        for shown in verbose.stderr.splitlines():
            if "tcp connect" in shown or "authenticated" in shown:
                print("  -v: " + shown.split(": ssh: ", 1)[-1])
        results.append(verdict("remote / (fetch alone + local scan)", remote_t / (fetch_t + local_t), 1.2))

        copies = make_copies(tree, 16, work / "fleet")
        one = f"{server.user}@127.0.0.1:{server.port}:{copies / 'copy00'}"
        sixteen = ",".join(f"{server.user}@127.0.0.1:{server.port}:{copies / f'copy{i:02d}'}" for i in range(16))
        print("fleet over loopback sshd (--no-cache; identical trees analysed once)", flush=True)
        one_t, _ = median(lambda: run_python("fleet", one, ssh, env=env), r)
        line("1 target", one_t)
        many_t, many_m = median(lambda: run_python("fleet", sixteen, ssh, env=env), r)
        line("16 targets (--jobs 8)", many_t, many_m)
        results.append(verdict("16 targets / 1 target", many_t / one_t, 3.0))
    return results


if __name__ == "__main__":
    main()
