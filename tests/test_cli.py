"""The command line as a user (or CI) meets it: real processes, exit codes, one-line errors,
and every output format checked against its schema."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from kvtrace.report.schema import JSON_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())


def kvtrace(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvtrace: error:"), result.stderr
    assert fragment in lines[0]


def test_findings_exit_1_and_text_report() -> None:
    result = kvtrace("scan", "examples/nixl-pin")
    assert result.returncode == 1, result.stderr
    assert "error[pinned-state]" in result.stdout
    assert "disaggregation/nixl/conn.py:" in result.stdout
    assert "\x1b[" not in result.stdout  # piped: no colour codes
    assert "Release map" in result.stdout


def test_clean_tree_exits_0() -> None:
    result = kvtrace("scan", "examples/all-clear")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings" in result.stdout and "INCOMPLETE" not in result.stdout


def test_json_report_matches_its_schema_and_the_findings() -> None:
    result = kvtrace("scan", "examples/nixl-pin", "--format", "json")
    document = json.loads(result.stdout)
    jsonschema.validate(document, JSON_SCHEMA)
    assert document["schema"] == "kvtrace/2" and len(document["reports"]) == 1
    data = document["reports"][0]
    assert data["target"] == "examples/nixl-pin" and data["complete"] is True
    pins = {(f["backend"], f["state"]) for f in data["findings"] if f["rule"] == "pinned-state"}
    assert ("nixl", "WaitingForInput") in pins
    nixl = next(b for b in data["backends"] if b["name"] == "nixl")
    line = (EXAMPLES / "nixl-pin" / nixl["poll"]["path"]).read_text().splitlines()[nixl["poll"]["line"] - 1]
    assert line.strip().startswith("def poll(")
    schema = json.loads(kvtrace("schema").stdout)
    jsonschema.validate(document, schema)


def test_sarif_validates_against_the_oasis_schema(tmp_path: Path) -> None:
    out = tmp_path / "k.sarif"
    result = kvtrace("scan", "examples/nixl-pin", "examples/all-clear", "--format", "sarif", "-o", str(out))
    assert result.returncode == 1
    sarif = json.loads(out.read_text())
    jsonschema.validate(sarif, SARIF_SCHEMA)
    results = sarif["runs"][0]["results"]
    assert results and all(r["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1 for r in results)
    assert results[0]["codeFlows"][0]["threadFlows"][0]["locations"]
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    for r in results:  # ruleId is the code; the rule it indexes has that id and the name
        assert r["ruleId"].startswith("KVT") and rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert rules[r["ruleIndex"]]["name"] == r["properties"]["rule"]
    assert sarif["runs"][1]["results"] == []


def test_markdown_bug_report() -> None:
    result = kvtrace("scan", "examples/dropped-else", "--format", "markdown")
    assert "| kind | path:line | function | states |" in result.stdout
    assert "**dropped-state**" in result.stdout


def test_missing_path_is_one_line_exit_2(tmp_path: Path) -> None:
    assert_one_line_error(kvtrace("scan", str(tmp_path / "nope")), "no such file or directory")


def test_tree_without_the_package_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("print('hello')\n")
    assert_one_line_error(kvtrace("scan", str(tmp_path)), "class KVPoll")


def test_package_without_enum_is_exit_2(tmp_path: Path) -> None:
    tree = tmp_path / "disaggregation"
    shutil.copytree(EXAMPLES / "nixl-pin" / "disaggregation", tree)
    (tree / "base" / "conn.py").unlink()
    assert_one_line_error(kvtrace("scan", str(tmp_path)), "defines `class KVPoll`")


@pytest.mark.parametrize(("name", "content", "status"), [
    ("broken.py", b"def oops(:\n    pass\n", "syntax-error"),
    ("latin1.py", b"# caf\xe9\nx = 1\n", "not-utf8"),
])
def test_bad_file_is_reported_and_scan_goes_on(tmp_path: Path, name: str, content: bytes, status: str) -> None:
    shutil.copytree(EXAMPLES / "nixl-pin", tmp_path / "t")
    (tmp_path / "t" / "disaggregation" / name).write_bytes(content)
    result = kvtrace("scan", str(tmp_path / "t"), "--format", "json")
    assert result.returncode == 3, result.stderr
    data = json.loads(result.stdout)["reports"][0]
    bad = [f for f in data["files"] if f["path"].endswith(name)]
    assert bad and bad[0]["status"] == status and bad[0]["error"]
    assert any(f["rule"] == "pinned-state" for f in data["findings"])  # the rest was still analysed


def test_rules_and_explain() -> None:
    from kvtrace.rules import ALL_RULES

    rows: list[str] = []  # a row wraps under its summary column: rejoin it before comparing
    for line in kvtrace("rules").stdout.splitlines():
        if line.startswith(" ") and rows:
            rows[-1] += " " + line.strip()
        else:
            rows.append(line)
    for rule in ALL_RULES:
        row = " ".join(next(r for r in rows if r.startswith(rule.code + " ")).split())
        assert rule.name in row and rule.severity in row and " ".join(rule.summary().split()) in row
        for key in (rule.code, rule.name) if rule.name == "pinned-state" else (rule.code,):
            explained = kvtrace("explain", key).stdout
            assert explained.startswith(f"{rule.code} {rule.name} ({rule.severity})")
            for section in ("What it does:", "Why it matters:", "Example:", "Fix:"):
                assert section in explained
    assert_one_line_error(kvtrace("explain", "no-such-rule"), "unknown rule")


def test_rules_and_explain_fit_an_80_column_terminal_without_breaking_words() -> None:
    from kvtrace.rules import ALL_RULES

    env = {**os.environ, "COLUMNS": "80"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "kvtrace", *a], cwd=ROOT, env=env,
                                    capture_output=True, text=True, timeout=120).stdout
    for text, words in [(run("rules"), [w for r in ALL_RULES for w in r.summary().split()])] + [
            (run("explain", r.code), r.docs().split()) for r in ALL_RULES]:
        assert text and max(len(line) for line in text.splitlines()) <= 80, text
        assert set(words) <= set(text.split()), set(words) - set(text.split())  # no word cut in two


def test_unknown_rules_pack_is_exit_2() -> None:
    assert_one_line_error(kvtrace("scan", "examples/healthy", "--rules", "nope"), "unknown rules pack")


@pytest.mark.parametrize(("typed", "suggested"), [
    ("--formt", "(Possible options: --format)"),
    ("--no-cach", "(Possible options: --no-cache)"),
    ("--rule", "(Possible options: --role, --rules)"),
    ("--foo", None),  # click alone offers --format (difflib 0.62): nothing like what was typed
])
def test_a_mistyped_option_suggests_only_near_names(typed: str, suggested: str | None) -> None:
    result = kvtrace("scan", "examples/healthy", typed)
    assert_one_line_error(result, f"No such option: {typed}")
    if suggested is None:
        assert "Possible options" not in result.stderr
    else:
        assert suggested in result.stderr


def test_fail_on_threshold() -> None:
    # dropped-else has errors (pinned-state) and a warning (dropped-state).
    assert kvtrace("scan", "examples/dropped-else", "--fail-on", "error").returncode == 1
    assert kvtrace("scan", "examples/dropped-else", "--fail-on", "never").returncode == 0
    # helper-methods has one error only: a warning threshold still fails, "never" does not.
    assert kvtrace("scan", "examples/helper-methods", "--fail-on", "warning").returncode == 1
