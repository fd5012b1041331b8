"""What a fresh-clone trial found still in the way of the report's readers (issue 19): one fact
said one way everywhere, backend-wide errors in the grid, stderr paths that open from the
working directory, and a verdict on stderr when stdout goes to a file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtrace.freeing import scheduler_aborts
from kvtrace.report.verdicts import ABORT_UNCALLED, BACKEND_WIDE, verdict_grids
from kvtrace.scan import scan_path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def kvtrace(*args: str, cwd: Path = ROOT, columns: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "kvtrace", *args, "--no-cache"], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def test_way_out_and_what_frees_agree_when_nothing_calls_abort() -> None:
    """Before: on nixl-pin the backends block said "Bootstrapping: abort() then poll() ends it"
    while "what frees Bootstrapping" said nothing in view calls abort(), so abort cannot free it.
    Both were true, but read as a contradiction. The tree has no scheduler: nothing calls abort()."""
    assert scheduler_aborts(scan_path(EXAMPLES / "nixl-pin")) == []
    for fmt in ("text", "markdown"):
        result = kvtrace("scan", "examples/nixl-pin", "-f", fmt)
        assert result.returncode == 1, result.stderr
        assert "abort() then poll() ends it" not in result.stdout, fmt
        assert "what frees" not in result.stdout or "nothing in the scanned code calls abort()" in result.stdout
    text = " ".join(kvtrace("scan", "examples/nixl-pin").stdout.split())
    assert f"way out Bootstrapping: {ABORT_UNCALLED}" in text
    assert "so abort cannot free it" in text  # what frees says the same thing


def test_way_out_says_abort_ends_it_when_the_scheduler_calls_abort(tmp_path: Path) -> None:
    """The same tree with a scheduler loop that aborts the queue's requests: abort() ends it."""
    tree = tmp_path / "srt"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    (tree / "scheduler.py").write_text(
        "class Scheduler:\n"
        "    def abort_request(self, rid):\n"
        "        for req in self.disagg_prefill_inflight_queue:\n"
        "            if req.rid == rid:\n"
        "                req.disagg_kv_sender.abort()\n")
    assert scheduler_aborts(scan_path(tree))
    text = " ".join(kvtrace("scan", str(tree)).stdout.split())
    assert "way out Bootstrapping: abort() then poll() ends it" in text
    assert ABORT_UNCALLED not in text


def test_a_backend_wide_error_has_a_cell() -> None:
    """Before: dropped-else's nixl poll() raises (an error about no one state): the summary named
    it ("nixl: poll-raises") and the grid had no cell for it. Now a last column holds each
    backend's worst finding about no one state, present only when one of them is an error."""
    report = scan_path(EXAMPLES / "dropped-else")
    grid = verdict_grids(report)[0]
    assert grid.states[-1] == BACKEND_WIDE
    assert grid.cells["nixl", BACKEND_WIDE] == ("POLL-RAISES", "error")
    assert grid.cells["mooncake", BACKEND_WIDE] == ("abort-ignored", "warning")
    text = kvtrace("scan", "examples/dropped-else", columns="80").stdout
    row = next(line for line in text.splitlines() if line.startswith("nixl "))
    assert row.split()[-1] == "KVT007" and "KVT007: poll-raises" in text
    assert "any: a finding about the backend whatever the state (the worst)" in text
    # At 80 columns the grid keeps backends as rows (rule codes in the cells, named in the legend).
    assert re.search(r"^backend +Failed +Bootstrapping +WaitingForInput +Transferring +Success +any$", text, re.M)
    markdown = kvtrace("scan", "examples/dropped-else", "-f", "markdown").stdout
    assert f"| {BACKEND_WIDE} |" in markdown and "POLL-RAISES" in markdown
    # No backend-wide error (nixl-pin has only abort-ignored warnings of that kind): no column.
    assert BACKEND_WIDE not in verdict_grids(scan_path(EXAMPLES / "nixl-pin"))[0].states


def test_incomplete_lines_on_stderr_open_from_the_working_directory(tmp_path: Path) -> None:
    """Before: `kvtrace: incomplete: proj/srt: disaggregation/nixl/extra.py not analysed` (relative
    to the target, opening from nowhere). Now the path opens from where the command ran."""
    tree = tmp_path / "proj" / "srt"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    (tree / "disaggregation" / "nixl" / "extra.py").write_text("def broken(:\n")
    result = kvtrace("scan", "proj/srt", "-f", "json", cwd=tmp_path)
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.startswith("kvtrace: incomplete: ")]
    assert lines and all("proj/srt/disaggregation/nixl/extra.py" in line for line in lines), result.stderr
    shown, line = re.search(r"(\S+\.py):(\d+) not analysed", lines[0]).groups()  # the syntax error's line
    assert (tmp_path / shown).is_file() and line == "1"


@pytest.mark.parametrize("fmt", ["json", "sarif", "text"])
def test_a_failing_scan_says_so_on_stderr_in_one_line(fmt: str, tmp_path: Path) -> None:
    """Before: `kvtrace scan x -f json > out.json` that failed printed nothing on stderr: the person
    saw no verdict. Now one line: what failed, what else was reported, the exit code."""
    out = tmp_path / "out"
    result = kvtrace("scan", "examples/nixl-pin", "-f", fmt, "-o", str(out))
    assert result.returncode == 1
    assert result.stderr == ("kvtrace: examples/nixl-pin: failed: 2 errors (--fail-on error, the default); "
                             "also 5 warnings, 7 notes; exit 1\n")
    if fmt == "json":
        assert json.loads(out.read_text())["reports"][0]["findings"]
    # -q asks for errors and the INCOMPLETE line only; a passing scan says nothing.
    assert kvtrace("scan", "examples/nixl-pin", "-f", fmt, "-o", str(out), "-q").stderr == ""
    clean = kvtrace("scan", "examples/all-clear", "-f", fmt, "-o", str(out))
    assert clean.returncode == 0 and clean.stderr == ""


def test_an_error_is_never_told_under_a_warning_heading_on_0_5_9() -> None:
    """Before: on 0.5.9 the PP assert at prefill.py:576 gives two state-crash errors (WaitingForInput,
    Transferring) and a Bootstrapping warning that rests on a shared room; the text report grouped the
    three by site and printed them under `warning[state-crash]`, the first one's severity, while the
    summary counted the errors. A group now holds findings of one severity."""
    from kvtrace.report.verdicts import finding_groups
    from tests.sglang_wheels import sglang_tree

    report = scan_path(sglang_tree("0.5.9") / "sglang" / "srt")
    groups = [g for per_backend in finding_groups(report).values() for g in per_backend]
    assert all(f.severity == g.severity for g in groups for f in g.findings)
    at_576 = sorted((g.severity.value, tuple(g.states)) for g in groups
                    if g.rule == "state-crash" and g.path.endswith("prefill.py") and g.line == 576)
    assert at_576 == [("error", ("WaitingForInput", "Transferring")), ("warning", ("Bootstrapping",))]


def test_abort_ignored_cites_the_line_that_writes_the_abort_state() -> None:
    """Before (a new user's trial): `nixl/conn.py:100  abort() writes conclude_state`, the line of
    `def abort`; the write is two lines down. Each write is cited at its own line, which holds it."""
    report = scan_path(EXAMPLES / "nixl-pin")
    ignored = [f for f in report.findings if f.rule == "abort-ignored"]
    assert ignored
    for finding in ignored:
        writes = [e for e in finding.evidence if " writes self." in e.note]
        assert writes, finding.evidence
        for e in writes:
            attr = e.note.rsplit("self.", 1)[1]
            code = (EXAMPLES / "nixl-pin" / e.path).read_text().splitlines()[e.line - 1]
            assert re.match(rf"\s*self\.{attr}\s*=", code), (e, code)
    nixl = next(f for f in ignored if f.backend == "nixl")
    assert ("disaggregation/nixl/conn.py", 102) in [(e.path, e.line) for e in nixl.evidence]


def test_a_syntax_error_is_cited_at_its_line_in_every_format(tmp_path: Path) -> None:
    """Before: a file that does not parse was named without its line (`extra.py syntax error: line 2:
    ...` in text, `startLine` 1 in SARIF, no `line=` in a GitHub annotation): a reader had to search
    for it. Now `path:line` everywhere a person or a code-scanning UI opens it."""
    tree = tmp_path / "srt"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    (tree / "disaggregation" / "nixl" / "extra.py").write_text("x = 1\ndef broken(:\n")
    place = "srt/disaggregation/nixl/extra.py:2"
    text = kvtrace("scan", "srt", "--no-map", cwd=tmp_path, columns="200")
    assert text.returncode == 3 and f"{place} syntax error: invalid syntax" in text.stdout, text.stdout
    assert f"kvtrace: incomplete: srt: {place} not analysed (syntax error: invalid syntax)" in text.stderr
    sarif = json.loads(kvtrace("scan", "srt", "-f", "sarif", cwd=tmp_path).stdout)
    notes = [n for inv in sarif["runs"][0]["invocations"] for n in inv["toolExecutionNotifications"]
             if n["descriptor"]["id"] == "kvtrace/incomplete/file"]
    assert [n["locations"][0]["physicalLocation"]["region"]["startLine"] for n in notes] == [2]
    github = kvtrace("scan", "srt", "-f", "github", cwd=tmp_path).stdout
    assert "::warning file=srt/disaggregation/nixl/extra.py,line=2,title=kvtrace could not analyse::syntax error: " \
           "invalid syntax" in github, github
    for fmt in ("markdown", "concise", "html"):
        assert "extra.py:2" in kvtrace("scan", "srt", "-f", fmt, cwd=tmp_path).stdout, fmt
    # JSON keeps the file as its subject and the reason whole, and gives the line as a number.
    gaps = json.loads(kvtrace("scan", "srt", "-f", "json", cwd=tmp_path).stdout)["reports"][0]["gaps"]
    assert {"kind": "file", "subject": "disaggregation/nixl/extra.py", "reason": "syntax error: line 2: invalid syntax",
            "line": 2} in gaps
    assert f"file {place[4:]}: syntax error: invalid syntax" in [n["message"]["text"] for n in notes]
