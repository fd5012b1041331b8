"""The rules' metadata table (kvtrace/rulemeta.py) that the report reads instead of the rules:
it must say what the rules say, and a rescan served from the cache must then import no rule
code in any format that prints rule metadata (the grid, SARIF's rule list)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtrace import rulemeta
from kvtrace.rulemeta_gen import from_rules, render

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def test_the_table_says_what_the_rules_say() -> None:
    assert rulemeta.RULES == from_rules(), "the rules changed: run `python -m kvtrace.rulemeta_gen`"
    assert render(rulemeta.RULES) in (ROOT / "kvtrace" / "rulemeta.py").read_text(encoding="utf-8")


def test_the_table_knows_a_backend_rule_and_the_rules_that_fill_cells() -> None:
    from kvtrace.rules import ALL_RULES, find_rule

    assert [m.code for m in rulemeta.RULES] == [r.code for r in ALL_RULES]
    backend_rules = {r.name for r in ALL_RULES if not r.per_queue}
    assert backend_rules  # a rule about the backends alone exists, so per_queue is really compared
    for meta in rulemeta.RULES:
        rule = find_rule(meta.code)
        assert rule is not None and rulemeta.find_rule_meta(meta.name) == rulemeta.find_rule_meta(meta.code.lower()) == meta
        assert meta.per_queue == (meta.name not in backend_rules)
    assert any(m.marks_cells for m in rulemeta.RULES) and not all(m.marks_cells for m in rulemeta.RULES)
    assert rulemeta.find_rule_meta("no-such-rule") is None


def test_the_report_names_no_rule_it_reads_what_a_rule_says_from_the_table() -> None:
    """A writer that tells findings apart by a rule's name breaks when a rule is renamed or one
    that pins is added; it reads the consequence and the title clause from the table instead."""
    import ast

    names = {m.name for m in rulemeta.RULES}
    writers = sorted((ROOT / "kvtrace" / "report").glob("*.py")) + [ROOT / "kvtrace" / "fleet.py", ROOT / "kvtrace" / "pipeline.py"]
    named = []
    for path in writers:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            # A rule's name compared with, or used as a key of a table: a writer deciding by name.
            # (A diagram node that happens to be called "no-timeout" is not a rule's name in use.)
            told = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value in names] \
                if isinstance(node, ast.Compare) else \
                [k for k in node.keys if isinstance(k, ast.Constant) and k.value in names] if isinstance(node, ast.Dict) else []
            named += [f"{path.name}:{c.lineno} {c.value}" for c in told]
    assert not named, named
    pins = [m.name for m in rulemeta.RULES if m.consequence is not None]
    assert pins and len(pins) < len(rulemeta.RULES)  # the table says which rules name the request's fate
    assert rulemeta.consequence_of("no-such-rule") is None
    # Every clause formats with the fields the markdown title gives it (a typo is a KeyError here).
    fields = dict.fromkeys(("subject", "owner", "states", "s", "es", "from_backend", "on_states"), "x")
    assert all(m.title_clause.format(**fields) for m in rulemeta.RULES if m.title_clause)


def _imports(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvtrace", *argv], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, env=env)
    names = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    return result, names


@pytest.mark.parametrize("output_format", ["text", "sarif", "markdown"])
def test_a_cached_rescan_reads_rule_metadata_without_the_rules(tmp_path: Path, output_format: str) -> None:
    env = {**os.environ, "KVTRACE_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "100"}
    # --select leaves rules that fill cells out: the grid asks which (rules_left_out); a backend-wide
    # finding asks whether its rule is per queue (_concerns).
    argv = ["scan", str(EXAMPLES / "nixl-pin"), "--format", output_format, "--ignore", "silent-wait"]
    first, first_names = _imports(argv, env)
    again, names = _imports(argv, env)
    assert first.returncode == again.returncode == 1, again.stderr[-2000:]
    assert again.stdout == first.stdout
    if output_format == "sarif":
        rules = json.loads(again.stdout)["runs"][0]["tool"]["driver"]["rules"]
        assert [r["id"] for r in rules] == [m.code for m in rulemeta.RULES]
    assert "kvtrace.rules" in first_names and "kvtrace.cache" in names  # the measurement saw the imports
    rule_code = {n for n in names if n == "kvtrace.rules" or n.startswith("kvtrace.rules.")}
    assert not rule_code, sorted(rule_code)
