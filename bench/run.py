"""Benchmark: kvtrace's scan of a real SGLang release against baselines measured in the same run.

    python bench/run.py [--version 0.5.23] [--repeat 3]

Each measurement runs in a fresh interpreter (imports and caches do not carry over) and reports
wall time (median of --repeat) and peak RSS. Baselines:
  grep      the investigation kvtrace replaces: `grep -rn` of the background's patterns
  ast       `ast.parse` of every .py file in the tree (a floor for reading the code at all)
  libcst    `libcst.parse_module` of every file (the naive full-libcst approach)
  libcst+pos  the same plus PositionProvider on every module (naive line numbers)
Targets (issue #2): a scan of 0.5.23 under 10 s; kvtrace must beat the naive libcst baselines.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROGRAMS = {
    "ast": """
import ast, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).rglob('*.py')):
    ast.parse(p.read_bytes())
""",
    "libcst": """
import libcst, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).rglob('*.py')):
    libcst.parse_module(p.read_bytes())
""",
    "libcst+pos": """
import libcst, pathlib, sys
from libcst.metadata import MetadataWrapper, PositionProvider
for p in sorted(pathlib.Path(sys.argv[1]).rglob('*.py')):
    MetadataWrapper(libcst.parse_module(p.read_bytes()), unsafe_skip_copy=True).resolve(PositionProvider)
""",
    "kvtrace": """
import pathlib, sys
from kvtrace.scan import scan_path
report = scan_path(pathlib.Path(sys.argv[1]))
assert report.queues[0].drain is not None
""",
}

def run_python(code: str, tree: Path) -> tuple[float, int]:
    wrapper = (
        "import resource, sys, time\n"
        "start = time.perf_counter()\n"
        f"exec(compile({code!r}, 'bench', 'exec'))\n"
        "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", wrapper, str(tree)], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.split()
    return float(out[0]), int(out[1])


def run_grep(tree: Path) -> tuple[float, int]:
    patterns = ["poll_and_all_reduce", "KVPoll\\.", "undone_reqs.append", "done_reqs.append", "release_kv_cache",
                "prepare_abort", "disagg_prefill_inflight_queue", "conclude_state", "timeout"]
    args = ["grep", "-rn", "--include=*.py"]
    for p in patterns:
        args += ["-e", p]
    start = time.perf_counter()
    subprocess.run(args + [str(tree)], capture_output=True, check=False)
    return time.perf_counter() - start, 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="0.5.23")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from tests.sglang_wheels import sglang_tree

    tree = sglang_tree(args.version)
    files = list(tree.rglob("*.py"))
    size = sum(f.stat().st_size for f in files)
    print(f"SGLang {args.version}: {len(files)} files, {size / 1e6:.2f} MB ({tree})")
    results: dict[str, tuple[float, int]] = {}
    for name in ["grep", "ast", "libcst", "libcst+pos", "kvtrace"]:
        runs = [run_grep(tree) if name == "grep" else run_python(PROGRAMS[name], tree) for _ in range(args.repeat)]
        results[name] = (statistics.median(t for t, _ in runs), max(m for _, m in runs))
        seconds, rss = results[name]
        print(f"  {name:11} {seconds:7.2f} s   peak RSS {rss / 1024:7.1f} MB" if rss else f"  {name:11} {seconds:7.2f} s")
    k_time, k_rss = results["kvtrace"]
    print("ratios (kvtrace / baseline; < 1 is faster or smaller):")
    for name in ["ast", "libcst", "libcst+pos"]:
        t, m = results[name]
        print(f"  time vs {name:11} {k_time / t:6.2f}x   memory vs {name:11} {k_rss / m:6.2f}x")
    verdict = "met" if k_time < 10 and k_time < results["libcst"][0] else "NOT met"
    print(f"target (scan < 10 s and faster than a full libcst parse): {verdict}")


if __name__ == "__main__":
    main()
