"""The verdict grid claims only what the scan established: `?` (with the legend saying where to
look) for what it could not, one grid per queue, each titled with its own queue."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtrace.packs import load_pack
from kvtrace.report import render_plain
from kvtrace.report.text import legend_lines
from kvtrace.report.verdicts import CONDITIONAL, OK, UNKNOWN, verdict_grid, verdict_grids
from kvtrace.scan import scan_path
from tests.sglang_wheels import sglang_tree

ROOT = Path(__file__).resolve().parent.parent
NIXL_PIN = ROOT / "examples" / "nixl-pin"


def test_unreadable_drain_loop_makes_no_cell_ok(tmp_path: Path) -> None:
    """Before: with prefill.py unparsable (no drain loop read), the grid still said `ok` for
    mooncake Bootstrapping and Success."""
    tree = tmp_path / "tree"
    shutil.copytree(NIXL_PIN, tree)
    prefill = tree / "disaggregation" / "prefill.py"
    prefill.write_text(prefill.read_text() + "def x(:\n")
    run = subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(tree), "--no-cache", "--no-map"],
                         capture_output=True, text=True, timeout=300, env={"COLUMNS": "80", "PATH": ""})
    assert run.returncode == 3, run.stderr
    report = scan_path(tree)
    grid = verdict_grid(report)
    assert grid.backends == ["mooncake", "nixl"]
    for backend in grid.backends:
        for state in grid.states:
            assert grid.cells[backend, state][0] == UNKNOWN, (backend, state, grid.cells[backend, state])
    assert "drain loop not analysed (see INCOMPLETE)" in grid.legend
    table = run.stdout.split("Verdicts for")[1].split("\n\n")[0]
    assert " ok " not in f" {table} " and "ok:" not in table


def test_unknown_legend_points_at_the_backends_on_a_complete_scan() -> None:
    """Before: `?: not checked or not decided (see what was not analysed)` on complete scans
    that have no such section; the `?` there comes from the Backends table's `unknown:` lines."""
    # (0.5.14's mori had `?` too until its tuple return was followed: see test_real_sglang.)
    for version, backend in (("0.4.6.post5", "mooncake"),):
        report = scan_path(sglang_tree(version))
        assert not report.gaps
        grid = verdict_grid(report)
        assert UNKNOWN in {grid.cells[backend, s][0] for s in grid.states}
        assert "what was not analysed" not in grid.legend and "INCOMPLETE" not in grid.legend
        assert "see unknown: under Backends" in grid.legend
        text = render_plain([report], width=80, show_map=True)
        assert "  unknown: " in text.split("\nBackends\n")[1]


def test_legend_breaks_only_between_items() -> None:
    items = ["KVT001: pinned-state", "KVT009: no-timeout", "KVT010: silent-status-drop",
             "KVT012: failed-not-sticky", "ok: poll() returns it, it has a way out"]
    lines = legend_lines(items, 80)
    assert all(len(line) <= 80 for line in lines)
    joined = "\n".join(lines)
    for item in items:
        assert item in joined  # never parted between a code and its name
    # nixl-pin at 80 columns needs codes; before, the legend wrapped as "KVT012:\nfailed-not-sticky".
    report = scan_path(NIXL_PIN)
    text = render_plain([report], width=80, show_map=False)
    grid = verdict_grid(report, short=True)
    assert any(item.startswith("KVT") for item in grid.legend_items)
    assert "KVT001" in text.split("Verdicts")[1].split("\n")[3]  # the codes are what the grid shows
    lines = text.splitlines()
    for item in grid.legend_items:
        assert any(item in line for line in lines), item


def test_decode_pack_has_one_grid_per_queue_each_with_its_own_findings() -> None:
    """0.5.2 decode: before, one grid titled disagg_decode_prealloc_queue showed the transfer
    queue's pinned-state cells, and the transfer queue had no grid."""
    report = scan_path(sglang_tree("0.5.2"), pack=load_pack("sglang-decode"))
    grids = {grid.queue: grid for grid in verdict_grids(report)}
    assert list(grids) == ["disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"]
    pinned = {(f.queue, f.backend, f.state) for f in report.findings if f.rule == "pinned-state"}
    assert pinned and all(queue == "disagg_decode_transfer_queue" for queue, _, _ in pinned)
    for _, backend, state in pinned:
        assert grids["disagg_decode_transfer_queue"].cells[backend, state][0] == "PINNED-STATE"
        assert grids["disagg_decode_prealloc_queue"].cells[backend, state][0] != "PINNED-STATE"
    text = render_plain([report], width=100, show_map=False)
    assert "Verdicts for disagg_decode_prealloc_queue" in text and "Verdicts for disagg_decode_transfer_queue" in text
    assert OK in {c for c, _ in grids["disagg_decode_transfer_queue"].cells.values()}
    # The state diagrams say which queue's drain they draw (the one whose graph the report holds).
    from kvtrace.report.diagram import diagrams, drawn_queue
    from kvtrace.report.markdown import render

    drawn = drawn_queue(report)
    assert drawn is not None and drawn.name == report.graph["queue"]
    assert f"State diagram of {drawn.name}: " in render([report], detail="full")
    assert f" in `{drawn.name}`" in render([report]).split("```mermaid")[0]  # the pinning backend's diagram
    for diagram in diagrams(report):
        assert set(diagram.pinned) == {s for q, b, s in pinned if q == drawn.name and b == diagram.backend.name}


def test_markdown_lists_findings_errors_first() -> None:
    """Before: sorted by path, 0.5.14's one error was finding 13 of 16. (0.5.14's NIXL pin now
    rests on a shared room, a warning: 0.5.11 has errors among its warnings.)"""
    from kvtrace.report.markdown import render

    report = scan_path(sglang_tree("0.5.11"))
    assert any(f.severity == "error" for f in report.findings)
    answer = render([report]).split("## Environment")[0]  # the evidence folded below lists them again
    listed = re.findall(r"^- \*\*([\w-]+)\*\* \((error|warning|note)\)", answer, re.M)
    assert len(listed) == len(report.findings)
    rank = {"error": 0, "warning": 1, "note": 2}
    assert [rank[s] for _, s in listed] == sorted(rank[s] for _, s in listed)
    assert listed[0] == ("pinned-state", "error")


def test_release_map_reads_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, at 80 columns on 0.5.14 and 0.5.23: state cells cut to "Faile…", "Boots…" beside a
    long path, "(after the loop)]" one word per line, mode lines without a hanging indent."""
    for version in ("0.5.14", "0.5.23"):
        monkeypatch.chdir(sglang_tree(version))  # paths print as they open from here: the sites' own
        report = scan_path(sglang_tree(version))
        text = render_plain([report], width=80, show_map=True)
        assert all(len(line) <= 80 for line in text.splitlines())
        details = text[text.index("\nRelease map: "):text.index("\nBackends\n")]
        assert "…" not in details
        states = list(report.queues[0].states)
        for word in re.findall(r"\b[A-Z]\w+", details):
            assert not any(s.startswith(word) and s != word for s in states), word  # no cut state name
        lines = details.splitlines()
        for line in lines:
            assert line.strip() not in ("(after", "the", "loop)]", "loop)")
        # Every site of the map is shown with its states, each state's name whole.
        for site in report.queues[0].sites:
            at = next(i for i, line in enumerate(lines) if line.split()[:2] == [str(site.kind), f"{site.path}:{site.line}"])
            shown = " ".join(lines[at:at + 3])
            assert all(s in shown for s in site.states), (site, shown)
        # A mode's fate that wraps hangs under its own column, never at the state column.
        start = text.index("\nPoll states\n")  # the first queue's (the bootstrap queue's follows, own modes)
        end = min(i for i in (text.find("\nRelease map: ", start), text.index("\nBackends\n")) if i > 0)
        poll_states = text[start:end].splitlines()
        column = 2 + max(len(s) for s in states) + 2
        for i, line in enumerate(poll_states):
            if "rids_to_check passed:" in line:
                assert line.index("rids_to_check passed:") == column, line
                follow = poll_states[i + 1]
                if not follow.lstrip().startswith(("sglang/", "rids_to_check=None")):
                    assert len(follow) - len(follow.lstrip()) == column, (line, follow)


def test_narrowed_rules_never_call_a_cell_ok() -> None:
    """Before: `--select pinned-state` on 0.5.2 showed `ok` for Bootstrapping on ascend, mooncake
    and nixl, where the full scan shows STATE-CRASH (a rule that was not run)."""
    from kvtrace.config import Settings

    tree = sglang_tree("0.5.2")
    full = verdict_grid(scan_path(tree))
    narrowed_report = scan_path(tree, settings=Settings(select=("pinned-state",)))
    narrowed = verdict_grid(narrowed_report)
    assert narrowed_report.filters.select == ("pinned-state",)
    for backend in ("ascend", "mooncake", "nixl"):
        # A warning (lower case): Bootstrapping crashes only if two requests share a room.
        assert full.cells[backend, "Bootstrapping"][0] == "state-crash" + CONDITIONAL
        assert narrowed.cells[backend, "Bootstrapping"][0] == UNKNOWN
    assert OK not in {text for text, _ in narrowed.cells.values()}
    for key, (text, _) in full.cells.items():
        if text == "PINNED-STATE":
            assert narrowed.cells[key][0] == "PINNED-STATE"  # what the rule run finds is shown
        if text == "-":
            assert narrowed.cells[key][0] == "-"  # poll() never returns it, whatever the rules
    assert "rules that judge it were left out" in narrowed.legend
    text = render_plain([narrowed_report], width=100, show_map=False)
    assert "pinned-state" in text.split("Verdicts for")[0]  # the header says what was run
    from kvtrace.report import html, markdown

    assert "Filters: rules: only pinned-state." in markdown.render([narrowed_report]).split("Verdicts for")[0]
    assert '<p class="meta filters">rules: only pinned-state</p>' in html.render([narrowed_report])
    # Leaving out a rule that judges no cell (unused-suppression) changes no cell.
    quiet = verdict_grid(scan_path(tree, settings=Settings(ignore=("unused-suppression",))))
    assert quiet.cells == full.cells


def test_manager_finding_in_a_shared_base_fills_the_rows_of_the_backends_that_run_it() -> None:
    """Before: 0.5.14's failed-not-sticky in CommonKVManager.update_status (common/conn.py, a
    max() merge) named no backend and lives in no backend's folder, so every Failed cell read
    `ok` under the warning. A backend whose manager's MRO resolves update_status to that method
    runs it; mori overrides it (its own finding, in its own folder)."""
    report = scan_path(sglang_tree("0.5.14"))
    shared = [f for f in report.findings if f.rule == "failed-not-sticky" and "/common/" in f.path]
    assert shared and shared[0].backend is None and shared[0].function == "CommonKVManager.update_status"
    grid = verdict_grid(report)
    runs_it = {b.name for b in report.backends
               if b.manager is not None and f"{shared[0].path}:CommonKVManager.update_status" in b.manager.runs}
    assert {"ascend", "mooncake", "nixl"} <= runs_it and "mori" not in runs_it
    for name in runs_it:
        assert grid.cells[name, "Failed"][0] != OK, name
    assert "failed-not-sticky" not in (grid.cells["mori", "Failed"][0] or "").lower()
    # The JSON report carries the same attribution, for tools that read it (schema-valid).
    from kvtrace.report.json import to_json_dict

    backends = {b["name"]: b for b in to_json_dict(report)["backends"]}
    assert {name for name, b in backends.items()
            if f"{shared[0].path}:CommonKVManager.update_status" in (b["manager"] or {}).get("runs", [])} == runs_it


def test_a_managers_findings_are_told_under_that_manager_not_under_every_backend() -> None:
    """Before: the text report told 0.5.14's failed-not-sticky in CommonKVManager.update_status
    (ascend, mooncake, nixl run it; mori overrides it) under "the queue (every backend)", beside
    the drain loop's own findings, which every backend does meet. It is told under the manager,
    naming the backends whose rows carry it, and the queue's heading keeps the drain's findings."""
    report = scan_path(sglang_tree("0.5.14"))
    text = render_plain([report], width=200)
    sections = re.split(r"\n(?=\S)", text)  # a heading starts at column 0
    shared = [f for f in report.findings if f.rule == "failed-not-sticky" and "/common/" in f.path][0]
    heading = "manager CommonKVManager (backends " + ", ".join(shared.backends[:-1]) + f" and {shared.backends[-1]})"
    assert "mori" not in shared.backends
    manager = next(s for s in sections if s.startswith(heading + "\n"))
    assert re.search(rf"warning\[failed-not-sticky\] at \S*/{re.escape(shared.path)}:{shared.line}\n", manager), manager
    queue = next(s for s in sections if s.startswith("the queue (every backend)\n"))
    assert "failed-not-sticky" not in queue and "[silent-wait]" in queue


def test_backend_option_keeps_only_those_rows() -> None:
    """--backend nixl: the host runs one backend; the grid, findings and exit code are its own."""
    import json as jsonlib
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvtrace", "scan", str(sglang_tree("0.5.14")), *args],
                              capture_output=True, text=True, timeout=300)

    only = run("--backend", "nixl", "-f", "json")
    assert only.returncode == 0, only.stderr  # nixl's pin rests on a shared room: a warning
    [report] = jsonlib.loads(only.stdout)["reports"]
    assert [b["name"] for b in report["backends"]] == ["nixl"]
    assert {f["backend"] for f in report["findings"]} <= {"nixl", None}
    assert report["filters"]["ignored_backends"] == ["ascend", "fake", "mooncake", "mori"]
    # The conditional pin is nixl's: keeping mooncake alone passes a gate on errors; nixl's
    # warning fails a stricter gate.
    assert run("--backend", "mooncake", "--fail-on", "error").returncode == 0
    assert run("--backend", "nixl", "--fail-on", "warning").returncode == 1
    typo = run("--backend", "nixxl")
    assert typo.returncode == 2 and "no such backend in this tree (its backends: ascend, fake, mooncake, mori, nixl)" \
        in typo.stderr and len(typo.stderr.splitlines()) == 1


def test_one_legend_for_several_grids_explains_each_mark_once() -> None:
    """--role all's closing legend: the codes first, each once; two reasons for `?` joined; two
    premises for `~` left to their findings."""
    from kvtrace.report.verdicts import merged_legend

    merged = merged_legend([
        "KVT009: no-timeout", "ok: poll() returns it, it has a way out", "?: backend not checked (see INCOMPLETE)",
        "~: a warning, it holds only if two requests share a bootstrap_room",
        "KVT001: pinned-state", "KVT009: no-timeout", "ok: poll() returns it, it has a way out",
        "?: the drain loop was not read", "~: a warning, it holds only if the send is skipped"])
    assert merged == [
        "KVT001: pinned-state", "KVT009: no-timeout", "ok: poll() returns it, it has a way out",
        "?: backend not checked (see INCOMPLETE); or the drain loop was not read",
        "~: a warning, it holds only under the premise its finding states"]
