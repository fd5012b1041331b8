"""kvtrace maps libcst nodes to lines with its own line-counting codegen pass
(parse.start_lines); it must give exactly the start lines of libcst's PositionProvider."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from kvtrace.model import SourceFile, source_lines
from kvtrace.parse import ParsedModule, parse_function_cst, start_lines
from tests.sglang_wheels import sglang_tree

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def provider_lines(module: cst.Module) -> dict:
    return {node: r.start.line for node, r in MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider).items()}


def functions_checked(files: list[Path]) -> int:
    checked = 0
    for file in files:
        text = file.read_text(encoding="utf-8")
        source = SourceFile(path=str(file), data=text.encode(), sha256="")
        module = ParsedModule(source, ast.parse(text), source_lines(text))
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                parsed = parse_function_cst(module, node)
                assert parsed is not None
                assert start_lines(parsed._module) == provider_lines(parsed._module), f"{file}: {node.name}"
                checked += 1
    return checked


@pytest.mark.parametrize("source", [
    "def f():\r\n    x = 1\r\n    if x:\r\n        return '''a\rb\r\nc'''\r\n    y(1,\r\n  2)\n",
    "def f(): return 1\n",
    "@d\r# c\r\rdef f(\r a):\r  pass\r",
    "def f(a,\n      b=(1,\n         2)):\n    '''doc\n    '''\n    with a as b, \\\n         c:\n        [x for x in\n         y]\n",
])
def test_same_start_lines_as_position_provider(source: str) -> None:
    module = cst.parse_module(source)
    assert start_lines(module) == provider_lines(module)


def test_same_start_lines_on_examples_and_real_sglang() -> None:
    real = sglang_tree("0.5.23") / "sglang/srt/disaggregation"
    files = sorted(EXAMPLES.rglob("*.py")) + [real / name for name in ("prefill.py", "mooncake/conn.py", "nixl/conn.py")]
    assert functions_checked(files) > 300
