"""Which files a cold scan's analysis enters, and what parsing the others costs.

    python bench/entered.py [TREE]   (default: SGLang 0.5.23's disaggregation/ from tests/sglang_wheels.py)

Every in-scope file is parsed with `ast` (the index, the whole-module walks and the suppressions
read them all); libcst parses only the functions the analysis walks (kvtrace.index.Index.cst).
This prints, per file, its bytes, its `ast.parse` time and how many of its functions libcst
parsed, then the share of the parse time spent on files whose functions were never entered: the
most a narrower parse could save (such a file still has to be read and its status stay honest,
and a file whose functions are never entered may still define a backend class the index needs).
"""

from __future__ import annotations

import ast
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    if len(sys.argv) > 1:
        tree = Path(sys.argv[1])
    else:
        from sglang_wheels import sglang_tree

        tree = sglang_tree("0.5.23") / "sglang" / "srt" / "disaggregation"
    import kvtrace.index
    from kvtrace.cache import scan_cached
    from kvtrace.fetch.local import fetch_local
    from kvtrace.model import FetchLimits
    from kvtrace.packs import load_pack
    import kvtrace.scan

    kvtrace.scan.PARALLEL_MIN_BYTES = 1 << 62  # one process: every function entered is seen here
    entered: Counter[str] = Counter()
    real_cst = kvtrace.index.Index.cst

    def counted(self: kvtrace.index.Index, func: kvtrace.index.FuncRef) -> object:
        if id(func.node) not in self._cst:
            entered[func.path] += 1
        return real_cst(self, func)

    kvtrace.index.Index.cst = counted  # type: ignore[method-assign]
    report, _ = scan_cached(fetch_local(tree, FetchLimits()), load_pack(), None)
    rows = []
    for source in report.files:
        runs = []
        for _ in range(3):  # the least of three: a shared machine's hiccups only ever add time
            start = time.process_time()
            try:
                ast.parse(source.data)
            except SyntaxError:
                pass
            runs.append(time.process_time() - start)
        rows.append((source.path, len(source.data), min(runs), entered.get(source.path, 0)))
    total = sum(t for _, _, t, _ in rows)
    never = [r for r in rows if not r[3]]
    print(f"{tree}: {len(rows)} files in scope, {sum(1 for r in rows if r[3])} entered by the analysis")
    for path, size, seconds, functions in sorted(rows, key=lambda r: -r[2]):
        print(f"  {path:60} {size:8,} B  ast.parse {seconds * 1000:6.1f} ms  libcst functions {functions}")
    print(f"ast.parse of all: {total * 1000:.0f} ms; of files never entered: {sum(r[2] for r in never) * 1000:.0f} ms "
          f"({sum(r[2] for r in never) / total:.0%}, {len(never)} files, {sum(r[1] for r in never):,} bytes)")


if __name__ == "__main__":
    main()
