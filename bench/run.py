"""Benchmark: kvtrace on a real SGLang release against baselines measured in the same run.

    python bench/run.py [--version 0.5.23] [--repeat 5] [--quick] [--skip-semgrep] [--skip-ssh] [--copies] [--decode]

--quick: 3 pairs a ratio and one whole-package run (a few minutes; every row is still measured,
in this run). A row that is skipped (--skip-*, or no sshd) is printed as "not measured".

The tree is the `disaggregation/` package of a released wheel (plus the srt files that mention
the queue), from tests/sglang_wheels.py; the whole-package rows use the wheel's whole sglang/
package as pip installs it. Every measurement is a whole process as a user runs it (an
in-process figure is printed beside some for reference), with bytecode caches written as an
installed package has them; times are medians of --repeat, memory is peak RSS (the process plus
its forked child, kvtrace.beside). Each row of issue 21's table is printed as a ratio of two
numbers measured here, in this run, with its verdict; the two sides of a time ratio are run
alternately and the ratio is the median of the pairs':

  cold     `kvtrace scan --no-cache` vs Semgrep running the equivalent release-map + sender
           rules (bench/semgrep-equivalent.yml)                                         <= 0.25
  floor    the same vs a process that only `ast.parse`s every file                        <= 1.5
  warm     a rescan served from the result cache vs `python -c "import typer, rich.console"`
           (the floor of any typer CLI), in each of -f json, text (the default) and sarif  <= 1.5
  fleet    16 loopback SSH targets scanned cold (fetch + analysis, one process) vs 16 OpenSSH
           clients only fetching the same trees (`ssh host tar -C ... -cf - .`, in parallel)  <= 0.8
           (beside it, for reference: 16 `ssh host true`, the sessions alone, and the CPU the
           whole machine spent on each, the loopback server's included)
  bytes    bytes the server sends for a remote scan of the whole installed package (counted by
           a relay in front of sshd) vs the bytes analysed                                 <= 3
  memory   peak RSS of a cold scan of the whole installed package                    <= 300 MB
  copies   (--copies) 1x, 4x, 16x copies of the tree side by side: time and memory per copy
  decode   (--decode) the decode pack (`--rules sglang-decode`, both decode queues) on the release's
           srt/ (the decode queues are bound in managers/), against the rows above that a scan's
           own work decides (issue 22 asks for decode scans within these targets): cold vs
           Semgrep running the equivalent decode rules (bench/semgrep-equivalent-decode.yml)
           <= 0.25, cold vs `ast.parse` of every file of that folder <= 1.5, warm -f json vs
           the typer import <= 1.5, peak RSS on the whole installed package <= 300 MB; beside
           them, for reference, the prefill pack on the same folder

Semgrep is installed from PyPI into the bench's own environment (~/.cache/kvtrace-bench), never
into the project's. sshd comes from .ci/install-sshd.sh, as for the tests.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
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
SEMGREP_DECODE_RULES = ROOT / "bench" / "semgrep-equivalent-decode.yml"

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
    "kvtrace-cli": """
import sys
from kvtrace.cli import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    assert done.code in (0, 1, 3), done.code
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
    if done.returncode not in (0, 1, 3):  # 3: INCOMPLETE (a release's folder alone has unseen callers)
        raise SystemExit(f"{argv[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed


def children_cpu(run) -> float:
    """CPU seconds (user + system) of the processes `run` starts and waits for."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def machine_cpu(run) -> float:
    """CPU seconds the whole machine spent (every process, a local server's too) while `run` ran."""
    def busy() -> float:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait

    before = busy()
    run()
    return busy() - before


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


def against_semgrep(cli: list[str], rules: Path, tree: Path, env: dict[str, str], repeat: int, which: str) -> float:
    """kvtrace's cold scan (`cli`) / Semgrep running `rules` on the same tree: the median of pairs."""
    semgrep = [str(semgrep_bin()), "scan", "--config", str(rules), "--metrics", "off",
               "--disable-version-check", "--quiet", "--json", str(tree)]
    run_process(semgrep, env)
    (_, _), (semgrep_t, _), ratio = paired(
        lambda: run_process(cli + ["--no-cache"], env), lambda: run_process(semgrep, env), repeat)
    line(f"semgrep, equivalent {which}rules (process)", semgrep_t)
    return ratio


@functools.cache  # once per run: the version is printed with the first row that uses it
def semgrep_bin() -> Path:
    venv = BENCH_HOME / "semgrep-venv"
    binary = venv / "bin" / "semgrep"
    if not binary.exists():
        print(f"installing semgrep from PyPI into {venv} (the bench's own environment) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "semgrep"], check=True)
    # The baseline is whatever PyPI's newest Semgrep was when this bench installed it: say which.
    found = subprocess.run([str(binary), "--version", "--disable-version-check"], capture_output=True, text=True)
    print(f"  semgrep {found.stdout.strip() or '(version not printed)'} ({binary})", flush=True)
    return binary


def line(label: str, seconds: float, rss_kb: int = 0) -> None:
    print(f"  {label:34} {seconds:7.3f} s" + (f"   peak RSS {rss_kb / 1024:6.1f} MB" if rss_kb else ""), flush=True)


def verdict(label: str, value: float, limit: float, unit: str = "x") -> bool:
    held = value <= limit
    print(f"  {label:44} {value:6.2f}{unit}  (target <= {limit:g}{unit})  {'met' if held else 'NOT met'}", flush=True)
    return held


def not_measured(label: str, why: str) -> None:
    print(f"  {label:44} not measured ({why})", flush=True)


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
    parser.add_argument("--repeat", type=int, default=None, help="pairs a ratio (default 5, --quick 3)")
    parser.add_argument("--quick", action="store_true", help="3 pairs a ratio, one whole-package run")
    parser.add_argument("--skip-semgrep", action="store_true")
    parser.add_argument("--skip-ssh", action="store_true")
    parser.add_argument("--copies", action="store_true", help="also the copies-side-by-side table")
    parser.add_argument("--decode", action="store_true", help="also the decode pack on the release's srt/")
    args = parser.parse_args()
    if args.repeat is None:
        args.repeat = 3 if args.quick else 5

    from sglang_wheels import sglang_tree

    release = sglang_tree(args.version)
    work = Path(tempfile.mkdtemp(prefix="kvtrace-bench-"))
    # Never the user's real cache; bytecode caches written, as an installed package has them.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["KVTRACE_CACHE_DIR"] = str(work / "cache")
    try:
        tree = release / "sglang" / "srt" / "disaggregation"
        files = list(tree.rglob("*.py"))
        size = sum(f.stat().st_size for f in files) / 1e6
        lines = sum(f.read_bytes().count(b"\n") for f in files)
        print(f"SGLang {args.version} disaggregation/: {len(files)} files, {size:.2f} MB, {lines} lines "
              f"({tree}); median of {args.repeat}; {_load()}")
        print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
              f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        results: list[bool] = []
        r = args.repeat
        cli = [sys.executable, "-m", "kvtrace", "scan", str(tree), "-f", "json", "-o", os.devnull]
        floor = [sys.executable, "-c", PROGRAMS["ast"], str(tree)]
        typer_floor = [sys.executable, "-c", "import typer, rich.console"]
        warm_formats = ("json", "text", "sarif")
        warm_cli = {fmt: cli[:cli.index("-f") + 1] + [fmt] + cli[cli.index("-f") + 2:] for fmt in warm_formats}
        for argv in (cli, floor, typer_floor, *warm_cli.values()):  # bytecode caches written, the cache filled
            run_process(argv, env)

        print("times (each ratio below is the median of its pairs, run alternately)", flush=True)
        (cli_cold, _), (floor_t, _), floor_ratio = paired(
            lambda: run_process(cli + ["--no-cache"], env), lambda: run_process(floor, env), r)
        line("ast.parse of every file (process)", floor_t)
        line("kvtrace cold (process)", cli_cold)
        warm_ratios: dict[str, float] = {}
        for fmt, argv in warm_cli.items():
            (cli_warm, _), (typer_t, _), warm_ratios[fmt] = paired(
                lambda argv=argv: run_process(argv, env), lambda: run_process(typer_floor, env), r)
            line("import typer, rich.console (process)", typer_t)
            line(f"kvtrace warm, cached, -f {fmt}", cli_warm)
        # The `kvtrace` command pip installs (pyproject's entry point) starts as `python -m kvtrace` does.
        console = Path(sys.executable).parent / "kvtrace"
        console_ratio = None
        if console.exists():
            console_cli = [str(console)] + warm_cli["json"][3:]
            run_process(console_cli, env)
            (console_t, _), (_, _), console_ratio = paired(
                lambda: run_process(console_cli, env), lambda: run_process(typer_floor, env), r)
            line("kvtrace warm, -f json, console script", console_t)
        (cold_t, cold_m), (ast_t, _), inprocess_ratio = paired(
            lambda: run_python("kvtrace-cold", str(tree), env=env), lambda: run_python("ast", str(tree), env=env), r)
        line("kvtrace cold (in-process, reference)", cold_t, cold_m)
        line("ast.parse (in-process, reference)", ast_t)
        semgrep_ratio = None if args.skip_semgrep else against_semgrep(cli, SEMGREP_RULES, tree, env, r, "")

        package = installed_package(args.version, work)
        whole_t, whole_m = median(lambda: run_python(
            "kvtrace-cli", "scan", str(package), "--no-cache", "-f", "json", "-o", os.devnull, env=env),
            1 if args.quick else max(1, r // 2))
        line("kvtrace cold, whole installed package", whole_t, whole_m)

        ssh_rows: dict[str, float] = {}
        ssh_skipped = "--skip-ssh" if args.skip_ssh else None
        if not args.skip_ssh:
            ssh_rows = bench_ssh(tree, package, work, env, r)
            if not ssh_rows:
                ssh_skipped = "no sshd"

        print("targets (issue 21; ratios of numbers measured above, in this run)", flush=True)
        if semgrep_ratio is not None:
            results.append(verdict("cold: kvtrace / semgrep (processes)", semgrep_ratio, 0.25))
        else:
            not_measured("cold: kvtrace / semgrep (processes)", "--skip-semgrep")
        results.append(verdict("cold: kvtrace / ast.parse only (processes)", floor_ratio, 1.5))
        print(f"  {'  (in-process, reference)':44} {inprocess_ratio:6.2f}x")
        for fmt, ratio in warm_ratios.items():
            results.append(verdict(f"warm -f {fmt}: kvtrace / typer+rich import", ratio, 1.5))
        if console_ratio is not None:
            print(f"  {'  (-f json, the kvtrace console script)':44} {console_ratio:6.2f}x")
        else:
            not_measured("  (-f json, the kvtrace console script)", f"no {console}")
        if "fleet" in ssh_rows:
            results.append(verdict("fleet of 16, cold: kvtrace / 16 ssh tar", ssh_rows["fleet"], 0.8))
        else:
            not_measured("fleet of 16, cold: kvtrace / 16 ssh tar", ssh_skipped or "")
        if "bytes" in ssh_rows:
            results.append(verdict("remote whole package: bytes sent / analysed", ssh_rows["bytes"], 3.0))
        else:
            not_measured("remote whole package: bytes sent / analysed", ssh_skipped or "")
        results.append(verdict("peak RSS, whole installed package", whole_m / 1024, 300, " MB"))

        if args.copies:
            bench_copies(tree, work, env, r)
        rows = 5 + len(warm_formats)
        print(f"all targets met: {'yes' if all(results) and len(results) == rows else 'NO'} ({sum(results)}/{rows} met, "
              f"{rows - len(results)} not measured); {_load()}")
        if args.decode:
            met, measured = bench_decode(release / "sglang" / "srt", package, env, r, args.quick, args.skip_semgrep)
            print(f"decode targets met: {'yes' if met == measured == 4 else 'NO'} ({met}/4 met, "
                  f"{4 - measured} not measured); {_load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def installed_package(version: str, work: Path) -> Path:
    """The wheel's whole sglang/ package (every .py file) and its dist-info, as pip installs it."""
    import zipfile

    from sglang_wheels import wheel

    site = work / "site-packages"
    with zipfile.ZipFile(wheel(version)) as archive:
        members = [n for n in archive.namelist() if n.startswith("sglang/") and n.endswith(".py")
                   or n.endswith(".dist-info/METADATA")]
        archive.extractall(site, members)
    package = site / "sglang"
    files = list(package.rglob("*.py"))
    print(f"SGLang {version} installed package: {len(files)} .py files, "
          f"{sum(f.stat().st_size for f in files) / 1e6:.1f} MB ({package})", flush=True)
    return package


def bench_decode(srt: Path, package: Path, env: dict[str, str], repeat: int, quick: bool,
                 skip_semgrep: bool) -> tuple[int, int]:
    """The decode pack (`--rules sglang-decode`) against the table's rows that a scan's own work
    decides, on the release's srt/ (the decode queues are bound in managers/, so a scan of
    disaggregation/ alone cannot map them): (rows met, rows measured)."""
    decode = ["--rules", "sglang-decode"]
    cli = [sys.executable, "-m", "kvtrace", "scan", str(srt), *decode, "-f", "json", "-o", os.devnull]
    floor = [sys.executable, "-c", PROGRAMS["ast"], str(srt)]
    typer_floor = [sys.executable, "-c", "import typer, rich.console"]
    files = list(srt.rglob("*.py"))
    print(f"decode pack on {srt}: {len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.2f} MB "
          f"(cold, whole processes; median of {repeat}); {_load()}", flush=True)
    for argv in (cli, floor):  # bytecode caches written, the cache filled
        run_process(argv, env)
    (cold_t, _), (floor_t, _), floor_ratio = paired(
        lambda: run_process(cli + ["--no-cache"], env), lambda: run_process(floor, env), repeat)
    line("ast.parse of every file (process)", floor_t)
    line("kvtrace cold, --rules sglang-decode", cold_t)
    (warm_t, _), (typer_t, _), warm_ratio = paired(
        lambda: run_process(cli, env), lambda: run_process(typer_floor, env), repeat)
    line("import typer, rich.console (process)", typer_t)
    line("kvtrace warm, cached, -f json", warm_t)
    semgrep_ratio = None if skip_semgrep else against_semgrep(cli, SEMGREP_DECODE_RULES, srt, env, repeat, "decode ")

    def scan(*pack: str) -> tuple[float, int]:
        return run_python("kvtrace-cli", "scan", str(srt), *pack, "--no-cache", "-f", "json", "-o", os.devnull, env=env)

    (decode_t, decode_m), (prefill_t, prefill_m), pack_ratio = paired(lambda: scan(*decode), scan, repeat)
    line("kvtrace cold, --rules sglang-decode (in-process)", decode_t, decode_m)
    line("kvtrace cold, prefill pack (in-process)", prefill_t, prefill_m)
    whole_t, whole_m = median(lambda: run_python(
        "kvtrace-cli", "scan", str(package), *decode, "--no-cache", "-f", "json", "-o", os.devnull, env=env),
        1 if quick else max(1, repeat // 2))
    line("kvtrace cold, decode, whole installed package", whole_t, whole_m)

    print("decode targets (issue 22: the decode pack within issue 21's targets; same folder, this run)", flush=True)
    results = []
    if semgrep_ratio is not None:
        results.append(verdict("decode cold: kvtrace / semgrep (processes)", semgrep_ratio, 0.25))
    else:
        not_measured("decode cold: kvtrace / semgrep (processes)", "--skip-semgrep")
    results.append(verdict("decode cold: kvtrace / ast.parse only", floor_ratio, 1.5))
    results.append(verdict("decode warm -f json: kvtrace / typer+rich", warm_ratio, 1.5))
    results.append(verdict("decode peak RSS, whole installed package", whole_m / 1024, 300, " MB"))
    print(f"  {'decode / prefill pack, same folder':44} {pack_ratio:6.2f}x  (reference, no target)")
    print("  (remote bytes and the fleet fetch the same files for either pack: measured above)")
    return sum(results), len(results)


def bench_copies(tree: Path, work: Path, env: dict[str, str], r: int) -> None:
    print("copies side by side (cold, in-process, parse budget lifted so every copy is analysed)", flush=True)
    base_t = base_m = 0.0
    for count in (1, 4, 16):
        folder = make_copies(tree, count, work)
        t, m = median(lambda: run_python("kvtrace-unbounded", str(folder), env=env), max(1, r // 2 or 1))
        if count == 1:
            base_t, base_m = t, m
        print(f"  {count:2d}x  {t:7.3f} s  ({t / base_t:5.2f}x time of 1x, {t / count:6.3f} s per copy)"
              f"   peak RSS {m / 1024:6.1f} MB  ({m / base_m:5.2f}x)", flush=True)


def bench_ssh(tree: Path, package: Path, work: Path, env: dict[str, str], r: int) -> dict[str, float]:
    """The fleet and remote-bytes rows, against a private loopback sshd."""
    from byte_relay import ByteRelay
    from sshd_server import SshdServer, sshd_missing_reason

    if sshd_missing_reason():
        print(f"ssh: skipped ({sshd_missing_reason()})")
        return {}
    rows: dict[str, float] = {}
    # 16 OpenSSH clients connect at once: more than sshd's default MaxStartups lets through.
    with SshdServer.start(extra_config=["MaxStartups 100"]) as server:
        flags = ["-i", str(server.client_key), "--known-hosts", str(server.known_hosts),
                 "--ssh-config", str(server.ssh_config)]
        print("remote whole installed package over loopback sshd (bytes counted by a relay in front of it)",
              flush=True)
        with ByteRelay(server.port) as relay:
            known = work / "known_hosts.relay"
            known.write_text(f"[{server.host}]:{relay.port} {server.host_key_line}\n")
            target = f"{server.user}@127.0.0.1:{relay.port}:{package}"
            report = work / "remote.json"
            verbose = subprocess.run([sys.executable, "-m", "kvtrace", "scan", target, "--no-cache", "-v", "-f", "json",
                                      "-o", str(report), "-i", str(server.client_key), "--known-hosts", str(known),
                                      "--ssh-config", str(server.ssh_config)],
                                     cwd=ROOT, env=env, capture_output=True, text=True)
            relay.wait_idle()
            sent = relay.server_to_client
        import json

        analysed = sum(len((package / f["path"]).read_bytes())
                       for f in json.loads(report.read_text())["reports"][0]["files"] if f["status"] == "ok")
        for shown in verbose.stderr.splitlines():
            if "exec fetch" in shown or "bytes received" in shown:
                print("  -v: " + shown.split(": ssh: ", 1)[-1])
        print(f"  server sent {sent / 1e6:.2f} MB (relay) for {analysed / 1e6:.2f} MB analysed", flush=True)
        rows["bytes"] = sent / analysed

        copies = make_copies(tree, 16, work / "fleet")
        targets = [f"{server.user}@127.0.0.1:{server.port}:{copies / f'copy{i:02d}'}" for i in range(16)]
        fleet = [sys.executable, "-m", "kvtrace", "scan", *targets, "--no-cache", "-q", "-f", "json",
                 "-o", os.devnull, *flags]
        ssh = ["ssh", "-F", str(server.ssh_config), "-i", str(server.client_key), "-o", "BatchMode=yes",
               "-o", f"UserKnownHostsFile={server.known_hosts}", "-p", str(server.port), f"{server.user}@127.0.0.1"]

        def openssh_16(command=lambda i: ["tar", "-C", str(copies / f"copy{i:02d}"), "-cf", "-", "."]) -> float:
            start = time.perf_counter()
            procs = [subprocess.Popen(ssh + command(i), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for i in range(16)]
            codes = [p.wait() for p in procs]
            if any(codes):
                raise SystemExit(f"ssh {command(0)[0]} failed: {codes}")
            return time.perf_counter() - start

        def sessions_16() -> float:
            return openssh_16(lambda i: ["true"])

        print("fleet of 16 over loopback sshd (cold: --no-cache; identical trees analysed once)", flush=True)
        run_process(fleet, env)
        # Where the time goes: CPU of the kvtrace process (16 fetches + one analysis) against the
        # 16 OpenSSH clients' and one cold scan of a local copy (the analysis alone, start-up included).
        one = [sys.executable, "-m", "kvtrace", "scan", str(copies / "copy00"), "--no-cache", "-q", "-f", "json",
               "-o", os.devnull]
        fleet_cpu, openssh_cpu, one_cpu = (children_cpu(run) for run in (
            lambda: run_process(fleet, env), openssh_16, lambda: run_process(one, env)))
        print(f"  CPU: kvtrace 16 targets {fleet_cpu:.2f} s, of which one local cold scan is {one_cpu:.2f} s; "
              f"16 ssh clients {openssh_cpu:.2f} s (sshd's own CPU is in neither)", flush=True)
        # The server shares these cores: what the whole machine spent, sshd and its login shells
        # included. 16 sessions that run `true` are the part no client can avoid over exec.
        busy = {name: machine_cpu(run) for name, run in (
            ("kvtrace", lambda: run_process(fleet, env)), ("tar", openssh_16), ("true", sessions_16))}
        print(f"  CPU of the machine (server included): kvtrace 16 targets {busy['kvtrace']:.2f} s; "
              f"16 x ssh tar {busy['tar']:.2f} s; 16 x ssh true {busy['true']:.2f} s", flush=True)
        (fleet_t, _), (openssh_t, _), fleet_ratio = paired(lambda: run_process(fleet, env), openssh_16, r)
        line("kvtrace, 16 targets (process)", fleet_t)
        line("16 x ssh host tar -cf - (parallel)", openssh_t)
        sessions_t, _ = median(sessions_16, r)
        line("16 x ssh host true (parallel)", sessions_t)
        rows["fleet"] = fleet_ratio
    return rows


if __name__ == "__main__":
    main()
