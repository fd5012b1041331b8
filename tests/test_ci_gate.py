"""What CI needs to adopt kvtrace: baselines, in-code suppressions, [tool.kvtrace] and the
`github` annotation format, run as a workflow would (real processes, exit codes)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from kvtrace.report.schema import JSON_SCHEMA
from kvtrace.scan import scan_path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
MOONCAKE = "disaggregation/mooncake/conn.py"
NIXL = "disaggregation/nixl/conn.py"
ABORT_CHECK = "        if self.conclude_state is not None:\n            return self.conclude_state\n"
ABORT_WRITE = "        self.conclude_state = KVPoll.Failed\n"
ABORT_UPDATE = "        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)\n" + ABORT_WRITE


def kvtrace(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the nixl-pin example: nixl pins two states, mooncake is sound."""
    root = tmp_path / "tree"
    shutil.copytree(EXAMPLES / "nixl-pin", root)
    return root


# The CI machinery is shown on the fate rules and suppressions; the link rules (silent-wait,
# no-timeout, ...) also report on this tree and go through the same baseline and filters.
GATE_RULES = {"pinned-state", "dropped-state", "undrained-queue", "unused-suppression"}


def findings(result: subprocess.CompletedProcess[str]) -> list[dict]:
    data = json.loads(result.stdout)
    jsonschema.validate(data, JSON_SCHEMA)
    return [f for f in data["reports"][0]["findings"] if f["rule"] in GATE_RULES]


def insert_above_every_function(path: Path) -> int:
    """Add two lines above each def (above its decorators) and at the top; return the count."""
    lines = path.read_text().splitlines(keepends=True)
    tree = ast.parse("".join(lines))
    starts = sorted({min([n.lineno, *(d.lineno for d in n.decorator_list)])
                     for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}, reverse=True)
    for start in starts:
        indent = lines[start - 1][: len(lines[start - 1]) - len(lines[start - 1].lstrip())]
        lines[start - 1:start - 1] = [f"{indent}# moved down\n", f"{indent}_ = None  # moved down\n"]
    lines[0:0] = ["# a new header line\n"]
    path.write_text("".join(lines))
    return len(starts)


# --- baseline -----------------------------------------------------------------------------------

def test_baseline_survives_moved_lines_and_catches_a_new_pinned_state(tree: Path, tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    first = kvtrace("scan", str(tree), "--write-baseline", str(base), "-f", "json")
    assert first.returncode == 0, first.stderr  # writing a baseline accepts the findings
    assert f"wrote baseline {base}: 14 finding(s) accepted" in first.stderr
    before = findings(first)
    assert {(f["backend"], f["state"]) for f in before} == {("nixl", "WaitingForInput"), ("nixl", "Transferring")}
    # What the finding is about, not the function poll() is written in.
    assert all(f["fingerprint"] == f"pinned-state|disagg_prefill_inflight_queue|nixl|{f['state']}|-" for f in before)

    moved = sum(insert_above_every_function(p) for p in tree.rglob("*.py"))
    assert moved > 20
    second = kvtrace("scan", str(tree), "--baseline", str(base), "-f", "json")
    after = findings(second)
    assert second.returncode == 0, second.stdout
    assert [f["line"] for f in after] != [f["line"] for f in before]  # the lines did move...
    assert sorted(f["fingerprint"] for f in after) == sorted(f["fingerprint"] for f in before)  # ...the prints not
    assert {f["baseline"] for f in after} == {"unchanged"}

    # mooncake's poll() stops reading its abort state, and abort() stops failing the room in the
    # manager's table (which poll() reads): its non-terminal states are newly pinned.
    conn = tree / MOONCAKE
    conn.write_text(conn.read_text().replace(ABORT_CHECK, "", 1).replace(ABORT_UPDATE, ABORT_WRITE, 1))
    third = kvtrace("scan", str(tree), "--baseline", str(base), "-f", "json")
    assert third.returncode == 1
    status = {(f["backend"], f["state"]): f["baseline"] for f in findings(third)}
    assert status[("nixl", "WaitingForInput")] == status[("nixl", "Transferring")] == "unchanged"
    new = {key for key, value in status.items() if value == "new"}
    assert new and all(backend == "mooncake" for backend, _ in new)
    assert ("mooncake", "WaitingForInput") in new


def test_fingerprints_do_not_name_where_the_code_lives(tree: Path) -> None:
    """Renaming the nixl manager's class (its methods and what they do unchanged) changes no
    fingerprint: a manager finding is about update_status/check_status, not the class holding it."""
    def prints() -> list[str]:
        return sorted(f["fingerprint"] for f in json.loads(kvtrace("scan", str(tree), "-f", "json").stdout)
                      ["reports"][0]["findings"])

    before = prints()
    renamed = 0
    for path in tree.rglob("*.py"):
        text = path.read_text()
        if "NixlKVManager" in text:
            path.write_text(text.replace("NixlKVManager", "NixlTransferTable"))
            renamed += 1
    assert renamed and before == prints()
    assert not any("NixlKVManager" in p or "KVSender" in p for p in before)


def test_sarif_is_a_baseline_too(tree: Path, tmp_path: Path) -> None:
    sarif = tmp_path / "base.sarif"
    assert kvtrace("scan", str(tree), "-f", "sarif", "-o", str(sarif)).returncode == 1
    result = kvtrace("scan", str(tree), "--baseline", str(sarif), "-f", "sarif")
    assert result.returncode == 0, result.stderr
    log = json.loads(result.stdout)
    jsonschema.validate(log, SARIF_SCHEMA)
    assert {r["baselineState"] for r in log["runs"][0]["results"]} == {"unchanged"}


def test_baselines_of_the_first_fingerprint_format_still_match(tree: Path, tmp_path: Path) -> None:
    """A SARIF log written before the fingerprint left out the function (key kvtrace/v2,
    rule|backend|state|function): matched on rule, backend and state. A fingerprint of neither
    format is refused in one line naming both."""
    sarif = tmp_path / "v2.sarif"
    assert kvtrace("scan", str(tree), "-f", "sarif", "-o", str(sarif)).returncode == 1
    log = json.loads(sarif.read_text())
    for result in log["runs"][0]["results"]:
        props = result["properties"]
        result["partialFingerprints"] = {"kvtrace/v2": "|".join(
            p or "-" for p in (props["rule"], props["backend"], props["state"], "SomewhereElse.poll"))}
    sarif.write_text(json.dumps(log))
    used = kvtrace("scan", str(tree), "--baseline", str(sarif), "-f", "json", "--fail-on", "note")
    assert used.returncode == 0, used.stderr
    assert {f["baseline"] for f in json.loads(used.stdout)["reports"][0]["findings"]} == {"unchanged"}

    report = json.loads(kvtrace("scan", str(tree), "-f", "json").stdout)
    report["reports"][0]["findings"][0]["fingerprint"] = "pinned-state|nixl"
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(report))
    refused = kvtrace("scan", str(tree), "--baseline", str(odd))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "rule|queue|backend|state|role (kvtrace/v3)" in refused.stderr and "(kvtrace/v2)" in refused.stderr


def test_bad_baseline_is_one_line(tree: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"something": "else"}')
    for path, fragment in ((bad, "not a kvtrace JSON report or SARIF log"), (tmp_path / "missing.json", "baseline")):
        result = kvtrace("scan", str(tree), "--baseline", str(path))
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.startswith("kvtrace: error: baseline") and fragment in result.stderr


# --- suppressions --------------------------------------------------------------------------------

def test_suppression_on_def_line_counted_and_unused_one_reported(tree: Path) -> None:
    conn = tree / NIXL
    text = conn.read_text()
    text = text.replace("    def poll(self) -> KVPoll:", "    def poll(self) -> KVPoll:  # kvtrace: ignore[pinned-state]", 1)
    conn.write_text(text)
    mooncake = tree / MOONCAKE
    mooncake.write_text(mooncake.read_text().replace(
        "    def poll(self) -> KVPoll:", "    def poll(self) -> KVPoll:  # kvtrace: ignore[pinned-state]", 1))
    result = kvtrace("scan", str(tree), "-f", "json")
    found = findings(result)
    pinned = [f for f in found if f["rule"] == "pinned-state"]
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "kvtrace: ignore" in l)
    assert len(pinned) == 2 and all(f["suppressed"] == f"{NIXL}:{line}" for f in pinned)
    unused = [f for f in found if f["rule"] == "unused-suppression"]
    assert len(unused) == 1 and unused[0]["path"] == MOONCAKE and unused[0]["severity"] == "warning"
    assert result.returncode == 0  # pinned-state (the only error) no longer fails, by default...
    # ...and the stale comment is itself a finding, a warning that a stricter gate fails on.
    stricter = kvtrace("scan", str(tree), "--fail-on", "warning", "--select", "pinned-state,unused-suppression",
                       "-f", "concise")
    assert stricter.returncode == 1
    assert stricter.stdout.splitlines()[-1].endswith("failed: 1 warning (--fail-on warning)"), stricter.stdout

    text_report = kvtrace("scan", str(tree), "--no-map").stdout
    assert "2 suppressed" in text_report
    sarif = json.loads(kvtrace("scan", str(tree), "-f", "sarif").stdout)
    jsonschema.validate(sarif, SARIF_SCHEMA)
    suppressed = [r for r in sarif["runs"][0]["results"] if r.get("suppressions")]
    assert len(suppressed) == 2
    assert suppressed[0]["suppressions"][0]["location"]["physicalLocation"]["region"]["startLine"] == line


def test_suppression_by_reported_line_code_and_not_in_strings(tree: Path) -> None:
    """A finding's own line, a multi-name comment, and the text inside a string never counts."""
    conn = tree / NIXL
    text = conn.read_text().replace(
        "    def poll(self) -> KVPoll:",
        '    NOTE = "# kvtrace: ignore[pinned-state]"\n\n'
        "    def poll(self) -> KVPoll:  # kvtrace: ignore[dropped-state, pinned-state]", 1)
    conn.write_text(text)
    found = findings(kvtrace("scan", str(tree), "-f", "json"))
    assert all(f.get("suppressed") for f in found if f["rule"] == "pinned-state")
    unused = [f for f in found if f["rule"] == "unused-suppression"]
    assert [u["message"] for u in unused] == ["unused suppression: `dropped-state` silences no finding on this line"]


# --- configuration ------------------------------------------------------------------------------

def pyproject(folder: Path, body: str) -> Path:
    path = folder / "pyproject.toml"
    path.write_text(f"[project]\nname = 'x'\n\n[tool.kvtrace]\n{body}\n")
    return path


def test_config_in_tree_then_cwd_and_command_line_wins(tree: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    pyproject(cwd, 'ignore-backends = ["nixl"]')
    # The working directory's file applies when the tree has none.
    assert findings(kvtrace("scan", str(tree), "-f", "json", cwd=cwd)) == []
    # The tree's own file wins over the working directory's.
    pyproject(tree, 'ignore = ["dropped-state"]\nfail-on = "never"')
    result = kvtrace("scan", str(tree), "-f", "json", cwd=cwd)
    assert {f["backend"] for f in findings(result)} == {"nixl"} and result.returncode == 0
    # The command line wins over the file, option by option.
    result = kvtrace("scan", str(tree), "-f", "json", "--fail-on", "error", "--ignore-backend", "mooncake", cwd=cwd)
    assert {f["backend"] for f in findings(result)} == {"nixl"} and result.returncode == 1
    result = kvtrace("scan", str(tree), "-f", "json", "--ignore-backend", "nixl,mooncake", cwd=cwd)
    assert findings(result) == [] and result.returncode == 0
    result = kvtrace("scan", str(tree), "-f", "json", "--select", "dropped-state", cwd=cwd)
    assert findings(result) == []
    backends = json.loads(kvtrace("scan", str(tree), "-f", "json", "--ignore-backend", "nixl", cwd=cwd).stdout)
    assert [b["name"] for b in backends["reports"][0]["backends"]] == ["mooncake"]


def test_config_baseline_path_is_relative_to_the_file(tree: Path, tmp_path: Path) -> None:
    assert kvtrace("scan", str(tree), "--write-baseline", str(tree / "kvtrace-baseline.json")).returncode == 0
    pyproject(tree, 'baseline = "kvtrace-baseline.json"')
    assert kvtrace("scan", str(tree), cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(("body", "fragment"), [
    ('selcet = ["pinned-state"]', "unknown key 'selcet'"),
    ('select = "pinned-state"', "select must be a list of strings"),
    ('ignore = ["pined-state"]', "unknown rule 'pined-state'"),
    ('fail-on = "sometimes"', "fail-on must be one of"),
    ("select = [", "not valid TOML"),
])
def test_bad_config_is_one_line_with_file_and_key(tree: Path, body: str, fragment: str) -> None:
    path = pyproject(tree, body)
    result = kvtrace("scan", str(tree))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and fragment in lines[0], lines


def test_unknown_rule_on_the_command_line(tree: Path) -> None:
    result = kvtrace("scan", str(tree), "--select", "nope")
    assert result.returncode == 2 and result.stderr.startswith("kvtrace: error: --select nope: unknown rule 'nope'")


# --- github annotations -------------------------------------------------------------------------

def test_github_annotations_relative_to_cwd(tree: Path, tmp_path: Path) -> None:
    result = kvtrace("scan", "tree", "-f", "github", "--select", ",".join(sorted(GATE_RULES)), cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    errors = [l for l in lines if l.startswith("::error ")]
    assert len(errors) == 2
    for line in errors:
        props, message = line[len("::error "):].split("::", 1)
        fields = dict(p.split("=", 1) for p in props.split(","))
        assert (tmp_path / fields["file"]).is_file() and fields["file"] == f"tree/{NIXL}"
        assert "def poll" in (tmp_path / fields["file"]).read_text().splitlines()[int(fields["line"]) - 1]
        assert "%0A" not in message and "can pin" in message
    assert lines[-1].startswith("kvtrace tree: 2 finding(s)")


def test_github_annotations_outside_the_working_directory_are_absolute(tree: Path, tmp_path: Path) -> None:
    """Before: `file=../../tmp/...`, a climb out of the working directory, where every other
    format (and the README) gives a file outside it by its absolute path."""
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    result = kvtrace("scan", str(tree), "-f", "github", cwd=elsewhere)
    assert result.returncode == 1, result.stderr
    files = [dict(p.split("=", 1) for p in line.split("::")[1].split(" ", 1)[1].split(",") if "=" in p)["file"]
             for line in result.stdout.splitlines() if line.startswith("::") and "file=" in line]
    assert files and all(f.startswith(str(tree.resolve()) + "/") and Path(f).is_file() for f in files), files


def test_github_annotation_titles_name_the_queue(tree: Path, tmp_path: Path) -> None:
    """A prefill host has two queues (bootstrap, inflight) and their findings share rule, backend
    and state: before, the title (`kvtrace pinned-state (nixl / WaitingForInput)`) did not say
    which queue's drain the annotation is about."""
    result = kvtrace("scan", "tree", "-f", "github", cwd=tmp_path)
    report = scan_path(tmp_path / "tree")
    queued = {(f.rule, f.path.rpartition("/")[2], f.line): f.queue for f in report.findings if f.queue}
    assert queued
    titles = 0
    for line in result.stdout.splitlines():
        if not line.startswith("::") or "file=" not in line:
            continue
        fields = dict(p.split("=", 1) for p in line.split("::")[1].split(" ", 1)[1].split(","))
        title = fields["title"].replace("%3A", ":").replace("%2C", ",")
        rule = title.split()[1]
        queue = queued.get((rule, fields["file"].rpartition("/")[2], int(fields["line"])))
        if queue:
            assert title.endswith(f" in {queue}") or f" in {queue} " in title, title
            titles += 1
    assert titles


# --- the default gate on real releases -----------------------------------------------------------

RELEASES = (ROOT / "tests" / "data" / "sglang-releases.txt").read_text().split()
# The first and last release and three in between (a cold scan of one release is seconds; all 33
# take minutes): every release with KVTRACE_SLOW=1.
SAMPLED = ["0.4.6.post5", "0.5.2", "0.5.9", "0.5.14", "0.5.23"]
EVERY_RELEASE = os.environ.get("KVTRACE_SLOW", "") not in ("", "0")


@pytest.mark.parametrize("version", RELEASES if EVERY_RELEASE else SAMPLED)
def test_default_scan_fails_only_on_errors(version: str) -> None:
    from tests.sglang_wheels import sglang_tree

    result = kvtrace("scan", str(sglang_tree(version)), "-f", "json")
    report = json.loads(result.stdout)["reports"][0]
    assert report["complete"], report["gaps"]
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert result.returncode == (1 if errors else 0), (version, result.stderr)


def test_sampled_releases_span_the_list() -> None:
    assert SAMPLED[0] == RELEASES[0] and SAMPLED[-1] == RELEASES[-1] and set(SAMPLED) <= set(RELEASES)


def test_fail_on_from_config_and_stricter_levels(tmp_path: Path) -> None:
    """0.5.23 reports warnings and notes but no error (7 warnings since the bootstrap queue's Failed
    is followed into the scheduler that answers it): the default passes, and says so; a
    [tool.kvtrace] fail-on = "warning" fails, naming the file; --fail-on note on the command line wins."""
    from tests.sglang_wheels import sglang_tree

    tree = str(sglang_tree("0.5.23"))
    default = kvtrace("scan", tree, "-f", "concise", cwd=tmp_path)
    assert default.returncode == 0, default.stdout
    assert default.stdout.splitlines()[-1].endswith(
        "passed: no error to fail on (--fail-on error, the default); 7 warnings, 11 notes reported")
    config = pyproject(tmp_path, 'fail-on = "warning"\n')
    strict = kvtrace("scan", tree, "-f", "concise", cwd=tmp_path)
    assert strict.returncode == 1
    assert strict.stdout.splitlines()[-1].endswith(f'failed: 7 warnings (fail-on = "warning" in {config})')
    notes = kvtrace("scan", tree, "-f", "concise", "--fail-on", "note", cwd=tmp_path)
    assert notes.returncode == 1 and notes.stdout.splitlines()[-1].endswith(
        "failed: 7 warnings, 11 notes (--fail-on note)")
    text = kvtrace("scan", tree, "--fail-on", "note", "--no-map", cwd=tmp_path)
    assert text.returncode == 1 and f"kvtrace: {tree}: failed: 7 warnings, 11 notes (--fail-on note)" in text.stderr


def test_write_baseline_exits_0_or_3_when_incomplete(tree: Path, tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    ok = kvtrace("scan", str(tree), "--write-baseline", str(base), "-f", "concise")
    assert ok.returncode == 0 and base.is_file()
    assert ok.stdout.splitlines()[-1].endswith(f"passed (--write-baseline {base} accepts them): "
                                               "2 errors, 5 warnings, 7 notes reported")
    conn = tree / NIXL
    conn.write_text(conn.read_text() + "\ndef broken(:\n")
    partial = kvtrace("scan", str(tree), "--write-baseline", str(base), "-f", "concise")
    assert partial.returncode == 3, partial.stderr
    assert "INCOMPLETE" in partial.stdout.splitlines()[-1]
    assert f"wrote baseline {base}" in partial.stderr and "INCOMPLETE scan (exit 3)" in partial.stderr


def test_concise_is_one_line_per_finding(tree: Path) -> None:
    result = kvtrace("scan", str(tree), "--output-format", "concise", "--fail-on", "never", cwd=tree)  # ruff's name
    data = json.loads(kvtrace("scan", str(tree), "-f", "json").stdout)["reports"][0]["findings"]
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and len(lines) == len(data) + 1
    for line, finding in zip(lines, data):
        assert line.startswith(f"{finding['path']}:{finding['line']}:1: {finding['id']} [{finding['severity']}] ")
    assert lines[-1].startswith(f"kvtrace {tree}: {len(data)} findings (") and "passed (--fail-on never)" in lines[-1]


def test_backend_filter_keeps_the_default_gate() -> None:
    """Before: `--backend` fell back to failing on notes, so a backend with no error exited 1
    while the summary said `--fail-on error, the default`."""
    kept = kvtrace("scan", str(EXAMPLES / "nixl-pin"), "--backend", "mooncake", "--format", "concise")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "passed" in kept.stdout.splitlines()[-1]
    pinned = kvtrace("scan", str(EXAMPLES / "nixl-pin"), "--backend", "nixl", "--format", "concise")
    assert pinned.returncode == 1 and "failed: 2 errors" in pinned.stdout.splitlines()[-1]

