"""The parse budget is a real bound on the syntax nodes held (issue 18 item 10).

Before: a guess of 0.35 nodes a byte decided which files to parse, and the first file was never
checked; `a` lines are 1.5 nodes a byte, so four 1 MiB files at default limits cost 1.35 GB.
"""

from __future__ import annotations

import ast
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.peak import MeasuredPopen

from kvtrace.fetch.local import make_source_file
from kvtrace.parse import count_nodes, node_bound, parse_modules

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# The densest shapes we know (nodes per byte near the bound) and ordinary ones.
SNIPPETS = [
    "a\n" * 50, "~" * 200 + "a\n", "a+" * 300 + "a\n", "-" * 100 + "1\n", "not not a\n" * 20, "a,\n" * 30,
    "a[::],\n" * 20, "x=[*a,*b]\n" * 20, "f(*a,**b)\n" * 20, "a<b<c<d\n" * 20, "lambda:0\n" * 20,
    "def f():pass\n" * 20, "(a,)\n" * 20, "a.b.c\n" * 20, "a[b][c]\n" * 20, "{**a}\n" * 20,
    "[a for a in b if c]\n" * 20, "import a.b as c\n" * 20, "from . import (a, b)\n" * 20,
    "a if b else c\n" * 20, "with a as b, c: pass\n" * 20, "try:\n pass\nexcept: pass\n" * 20,
    "match a:\n case [1, *_] | {'k': v} if v: pass\n" * 20, "f'{a!r:>{w}}'\n" * 20, "f'{a} {b}'\n" * 20,
    "''\n" * 20, "a @= b\n" * 20, "x: int = 1\n" * 20, "async def f():\n await a\n async for x in y: pass\n" * 5,
    "del a, b[c], d.e\n" * 20, "a = b = c\n" * 20, "1j\n" * 20, "...\n" * 20, "a;b;c\n" * 20, "a\ra\ra\r",
    "@a\n@b.c()\nclass C(D, metaclass=E): pass\n" * 10, "-1 if ~a else +b\n" * 20, "a**-b\n" * 20,
    "caf\u00e9 = '\u2603'\n" * 20, "[[],[],[]]\n" * 20, "{(),(),()}\n" * 20, "",
]


def test_node_bound_is_an_upper_bound() -> None:
    for text in SNIPPETS:
        data = text.encode()
        assert count_nodes(ast.parse(data)) <= node_bound(data), text[:40]
    for path in sorted((EXAMPLES / "nixl-pin").rglob("*.py")):
        data = path.read_bytes()
        assert count_nodes(ast.parse(data)) <= node_bound(data) <= 4 * count_nodes(ast.parse(data)), path


def test_budget_holds_from_the_first_file_on() -> None:
    dense = make_source_file("dense.py", b"a\n" * 2000)  # 6,001 nodes
    small = [make_source_file(f"s{i}.py", b"x = 1\n" * 100) for i in range(5)]  # 401 each
    alone = parse_modules([make_source_file("only.py", b"a\n" * 2000)], max_nodes=5_000)
    assert alone.modules == []  # before: the first file was always kept, whatever its size
    files = [dense, *small]
    parsing = parse_modules(files, max_nodes=1_500)
    kept = parsing.modules
    assert sum(count_nodes(m.tree) for m in kept) <= 1_500
    assert [m.source.path for m in kept] == ["s0.py", "s1.py", "s2.py"]
    marks = {m.path: m for m in parsing.marks}
    assert marks["dense.py"].status == "too-large" and "parse budget" in marks["dense.py"].error
    assert sorted(marks) == ["dense.py", "s3.py", "s4.py"] and all(m.status == "too-large" for m in marks.values())
    assert all(f.status == "ok" for f in files)  # the files stay as read: the marks are applied to copies


def test_four_dense_one_mib_files_stay_within_memory(tmp_path: Path) -> None:
    """A whole process, peak RSS asserted generously: the files are named as not analysed and
    the scan is INCOMPLETE (exit 3), without parsing them (which alone held 0.9 GB each)."""
    tree = tmp_path / "tree"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    for i in range(4):
        (tree / "disaggregation" / f"flat{i}.py").write_bytes(b"a\n" * (1 << 19))  # exactly 1 MiB
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = MeasuredPopen([sys.executable, "-m", "kvtrace", "scan", str(tree), "--format", "json", "--no-cache"],
                             cwd=ROOT, stdout=out, stderr=err)
        code = proc.wait()
        peak = proc.peak_mb()
        err.seek(0)
        stderr = err.read().decode()
        out.seek(0)
        import json

        report = json.loads(out.read())["reports"][0]
    assert code == 3 and "Traceback" not in stderr, stderr
    assert peak < 300, f"peak RSS {peak:.0f} MB"
    flat = [f for f in report["files"] if "/flat" in f["path"]]
    assert len(flat) == 4 and all(f["status"] == "too-large" and "parse budget" in f["error"] for f in flat), flat


@pytest.mark.e2e  # parses files of up to 120,000 lines at the real budget: half a minute, not for the inner loop
@pytest.mark.parametrize("lines", [60_000, 120_000])
def test_files_that_fit_alone_but_not_together_are_counted(lines: int) -> None:
    """Each file is parsed only when its bound fits the budget on its own; its real count then
    decides: what is held never passes the budget."""
    files = [make_source_file(f"f{i}.py", b"a\n" * lines + b"b" * i) for i in range(4)]
    kept = parse_modules(files, max_nodes=400_000).modules
    held = sum(count_nodes(m.tree) for m in kept)
    assert 0 < held <= 400_000
    assert len(kept) == 400_000 // (3 * lines + 1)


def _ast_walk_order(tree: ast.AST) -> list[ast.AST]:
    return list(ast.walk(tree))


def test_walk_is_ast_walk_in_the_same_order() -> None:
    """kvtrace.parse.walk (read from each class's ASDL fields) visits what `ast.walk` visits, the
    same objects in the same order: every snippet, every example and a real release's package."""
    from kvtrace.parse import walk

    from tests.sglang_wheels import sglang_tree

    texts = [s for s in SNIPPETS if s] + ["{**a, 'b': c, **d}\n", "match x:\n case C(a, b=1, *_): pass\n"
                                         "global g\nnonlocal_ = 1\n", "x = f(*a, k=1, **b)[1:2, ::3]\n"]
    texts += [p.read_text() for p in sorted(EXAMPLES.rglob("*.py"))]
    release = sglang_tree("0.5.23") / "sglang" / "srt" / "disaggregation"
    texts += [p.read_text() for p in sorted(release.rglob("*.py"))]
    nodes = 0
    for text in texts:
        try:
            tree = ast.parse(text)
        except SyntaxError:  # the bound's snippets include code ast refuses
            continue
        expected = _ast_walk_order(tree)
        got = walk(tree)
        assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected)), text[:80]
        nodes += len(got)
    assert nodes > 100_000  # the release was walked, not only the snippets
    # A hand-built tree (fields missing or not nodes) is walked as ast.walk walks it.
    odd = ast.Module(body=[ast.Expr(value=ast.Name(id="a"))])
    assert [type(n) for n in walk(odd)] == [type(n) for n in ast.walk(odd)]
