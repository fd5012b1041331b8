"""The fixture trees in examples/ carry inline annotations (Semgrep's convention) for what a scan
must find; this test checks every annotation, and that nothing unannotated is found.

    # expect: pinned-state[nixl:WaitingForInput], dropped-state[:Bootstrapping]
    # fates: Failed=leaves Bootstrapping=kept+raises ...      (on the drain loop's `for` line)
    # site: check,keep                                       (rows the release map must have)
    # mode rids_to_check passed: Failed=waits@62+leaves ...   (a mode's fates: where each state
                                                             waits, then what happens to it)

Parts of one comment are separated by ` ; `.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvtrace.scan import scan_path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TREES = sorted(p for p in EXAMPLES.iterdir() if p.is_dir()) if EXAMPLES.is_dir() else []
EXPECT = re.compile(r"([\w-]+)\[([\w-]*):(\w*)\]")


@dataclass
class Annotations:
    findings: set[tuple[str, str, int, str, str]] = field(default_factory=set)
    fates: dict[tuple[str, int], dict[str, list[str]]] = field(default_factory=dict)
    sites: set[tuple[str, int, str]] = field(default_factory=set)
    modes: dict[str, dict[str, list[str]]] = field(default_factory=dict)


def read_annotations(tree: Path) -> Annotations:
    found = Annotations()
    for path in sorted(tree.rglob("*.py")):
        rel = path.relative_to(tree).as_posix()
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        for token in tokens:
            if token.type != tokenize.COMMENT:
                continue
            line = token.start[0]
            for part in token.string.lstrip("#").split(" ; "):
                key, _, value = part.strip().partition(":")
                key, value = key.strip(), value.strip()
                if key == "expect":
                    for rule, backend, state in EXPECT.findall(value):
                        found.findings.add((rule, rel, line, backend, state))
                elif key == "fates":
                    found.fates[(rel, line)] = {
                        state: outcomes.split("+") for state, _, outcomes in (w.partition("=") for w in value.split())
                    }
                elif key.startswith("mode "):
                    found.modes[key[len("mode "):].strip()] = {
                        state: outcomes.split("+") for state, _, outcomes in (w.partition("=") for w in value.split())
                    }
                elif key == "site":
                    for kind in value.split(","):
                        found.sites.add((rel, line, kind.strip()))
    return found


def test_there_are_annotated_trees() -> None:
    assert len(TREES) >= 6, "examples/ should hold the annotated fixture trees"


@pytest.mark.parametrize("tree", TREES, ids=[t.name for t in TREES])
def test_tree_matches_its_annotations(tree: Path) -> None:
    expected = read_annotations(tree)
    report = scan_path(tree)
    assert all(f.status == "ok" for f in report.files), [(f.path, f.error) for f in report.files if f.status != "ok"]

    produced = {(f.rule, f.path, f.line, f.backend or "", f.state or "") for f in report.findings}
    assert produced - expected.findings == set(), "findings without an annotation"
    assert expected.findings - produced == set(), "annotated findings not produced"

    assert expected.fates, f"{tree.name}: annotate the drain loop's `for` line with `# fates: ...`"
    queue = report.queues[0]
    assert queue.drain is not None
    assert set(expected.fates) == {(queue.drain.path, queue.drain.line)}, "fates belong on the drain loop's line"
    fates = {state: fate.fate for state, fate in queue.states.items()}
    assert fates == next(iter(expected.fates.values()))
    if len(queue.modes) > 1:
        assert expected.modes, f"{tree.name}: the drain has modes; annotate each with `# mode <label>: ...`"
    if expected.modes:
        produced_modes: dict[str, dict[str, list[str]]] = {m.label: {} for m in queue.modes}
        for state, fate in queue.states.items():
            for m in fate.modes:
                produced_modes[m.mode][state] = [f"waits@{w.line}" for w in m.waits] + m.then
        assert produced_modes == expected.modes

    sites = {(s.path, s.line, s.kind) for s in queue.sites}
    assert expected.sites - sites == set(), "annotated release-map rows missing"
