"""Files identical across the hosts of one fleet run are parsed once; every host's report is still
the report of its own tree (its own lines), exactly as if it had been scanned alone."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import kvtrace.parse
from kvtrace.fleet import FleetOptions, run_fleet
from kvtrace.packs import load_pack
from kvtrace.report.json import to_json_dict
from kvtrace.scan import scan_path

ROOT = Path(__file__).resolve().parent.parent


def _facts(report) -> dict:
    """The JSON report (every finding, fate, site and line) without what a fleet run adds about
    the host it ran on."""
    document = to_json_dict(report)
    for added in ("host", "sglang_version", "metrics"):
        document.pop(added, None)
    return document


def test_identical_files_across_hosts_are_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(ROOT / "examples" / "nixl-pin", a)
    shutil.copytree(ROOT / "examples" / "nixl-pin", b)
    # One file differs on host b, and by a line at its top, so every line below it moves.
    changed = b / "disaggregation" / "nixl" / "conn.py"
    changed.write_text("# patched on this host\n" + changed.read_text())
    alone = {str(t): _facts(scan_path(t)) for t in (a, b)}
    assert alone[str(a)] != alone[str(b)]  # the moved lines show in the report

    parsed: list[str] = []
    real_parse = ast.parse

    def counting_parse(source, filename="<unknown>", *args, **kwargs):
        parsed.append(filename)
        return real_parse(source, filename, *args, **kwargs)

    monkeypatch.setattr(kvtrace.parse.ast, "parse", counting_parse)
    # The parses counted here are this process's: no analysis server (the server shares parses
    # the same way, as it is forked inside the sharing; tests/test_beside.py checks its reports).
    monkeypatch.setenv("KVTRACE_NO_FORK", "1")
    pack = load_pack()
    results = run_fleet([str(a), str(b)], FleetOptions({str(a): pack, str(b): pack}, {}, jobs=2))
    monkeypatch.undo()

    assert [r.error for r in results] == [None, None]
    for result in results:
        assert _facts(result.report) == alone[result.target]
    in_scope = [f for f in results[0].report.files if f.status == "ok"]
    assert len(in_scope) > 2
    # Every file of host a once, and host b's one changed file: nothing else is parsed again.
    files = [name for name in parsed if name != "<unknown>"]  # not libcst's literal_eval of a number
    assert sorted(files) == sorted([f.path for f in in_scope] + ["disaggregation/nixl/conn.py"])
    assert kvtrace.parse._SHARED == {}  # nothing is kept once the fleet run is over
