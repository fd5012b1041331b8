"""Every sentence about abort() states the mechanism the analysis found: the write abort() makes
that poll() reads, with its lines. nixl-pin's abort() sets conclude_state (never read) and
stores Failed in the manager's table through update_status(), which poll() reads through
check_status() while the room is bootstrapping: "what frees", the abort-ignored finding, the
backends section, the markdown table and the diagram's box must all say so, never that poll()
reads conclude_state."""

from __future__ import annotations

import shutil
from pathlib import Path

import networkx as nx

from kvtrace.freeing import AbortCall, _callers_text, abort_ended, what_frees
from kvtrace.model import WayOut
from kvtrace.report import markdown
from kvtrace.report.diagram import _way_out
from kvtrace.scan import scan_path
from tests.trees import EXAMPLES

CONN = "disaggregation/nixl/conn.py"


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def _report(tmp_path: Path):
    tree = tmp_path / "nixl-pin"
    shutil.copytree(EXAMPLES / "nixl-pin", tree)
    return tree, scan_path(tree)


def test_what_frees_names_the_table_write_abort_makes(tmp_path: Path) -> None:
    tree, report = _report(tmp_path)
    source = (tree / CONN).read_text()
    store = _line_of(source, "self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)")
    read = _line_of(source, "return self.kv_mgr.check_status(self.bootstrap_room)")
    nixl = next(b for b in report.backends if b.name == "nixl")
    assert nixl.verdicts["Bootstrapping"].way_out is WayOut.ABORT
    assert [(e.path, e.line) for e in nixl.verdicts["Bootstrapping"].abort_via] == [(CONN, store), (CONN, read)]
    frees = {f.state: f for f in what_frees(report, nixl)}
    boot = frees["Bootstrapping"].text
    assert "reads conclude_state" not in boot
    assert (f"NixlKVSender.abort() stores Failed in request_status through NixlKVManager.update_status() at "
            f"{CONN}:{store}, and NixlKVSender.poll() reads it through NixlKVManager.check_status() at {CONN}:{read}") in boot
    assert (CONN, store) in [(e.path, e.line) for e in frees["Bootstrapping"].evidence]
    # mooncake's poll() does read conclude_state: its sentence says so, at the line that reads it.
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    moon = (tree / "disaggregation/mooncake/conn.py").read_text()
    check = _line_of(moon, "if self.conclude_state is not None:")
    moon_boot = next(f for f in what_frees(report, mooncake) if f.state == "Bootstrapping").text
    assert ("MooncakeKVSender.poll() reads conclude_state, which MooncakeKVSender.abort() writes, at "
            f"disaggregation/mooncake/conn.py:{check}") in moon_boot


def test_abort_ignored_and_backends_section_agree(tmp_path: Path) -> None:
    _, report = _report(tmp_path)
    nixl = next(b for b in report.backends if b.name == "nixl")
    assert abort_ended(nixl) == ["Bootstrapping"]
    finding = next(f for f in report.findings if f.rule == "abort-ignored" and f.backend == "nixl")
    assert "abort() ends Bootstrapping (NixlKVSender.abort() stores Failed in request_status" in finding.message
    assert finding.message.endswith("but not WaitingForInput, Transferring")
    assert "does not change what the queue polls" not in finding.message
    text = markdown.render([report], detail="full")
    row = next(line for line in text.splitlines() if line.startswith("| nixl | `NixlKVSender`"))
    assert "| no; abort() ends Bootstrapping (" in row


def test_diagram_box_covers_only_the_states_abort_ends(tmp_path: Path) -> None:
    _, report = _report(tmp_path)
    nixl = next(b for b in report.backends if b.name == "nixl")
    # A drain that keeps all three non-terminal states (SGLang 0.5.14's inflight loop does): the
    # abort box draws its arrow for the one state abort() ends, and is labelled so.
    graph = nx.DiGraph()
    kept_states = ["Bootstrapping", "WaitingForInput", "Transferring"]
    graph.add_node(("check", 1), kind="check")
    graph.add_node(("outcome", "kept"), kind="outcome")
    graph.add_edge(("check", 1), ("outcome", "kept"), states=kept_states)
    _way_out(graph, nixl, kept_states, nixl.returns)
    box = graph.nodes[("wayout", "abort")]
    assert box["label"] == "abort: ends Bootstrapping"
    assert box["css"] == ["wayout", "partial"]
    assert (box["path"], box["line"]) == (nixl.verdicts["Bootstrapping"].abort_via[0].path,
                                          nixl.verdicts["Bootstrapping"].abort_via[0].line)
    assert graph.edges[("outcome", "kept"), ("wayout", "abort")]["states"] == ["Bootstrapping"]
    # mooncake reads conclude_state: every kept state reaches the box, as before.
    mooncake = next(b for b in report.backends if b.name == "mooncake")
    graph.remove_node(("wayout", "abort"))
    _way_out(graph, mooncake, kept_states, mooncake.returns)
    assert graph.nodes[("wayout", "abort")]["label"] == "abort: poll() reads conclude_state"
    assert graph.edges[("outcome", "kept"), ("wayout", "abort")]["states"] == kept_states


def test_callers_name_their_queue_when_loops_differ() -> None:
    callers = [AbortCall("managers/scheduler.py", 3834, "Scheduler.abort_request", "req.disagg_kv_sender.abort()",
                         "disagg_prefill_bootstrap_queue", 3830),
               AbortCall("managers/scheduler.py", 3841, "Scheduler.abort_request", "req.disagg_kv_sender.abort()",
                         "disagg_prefill_inflight_queue", 3837)]
    assert callers[0].evidence.note == ("Scheduler.abort_request() calls req.disagg_kv_sender.abort() on a request of "
                                        "disagg_prefill_bootstrap_queue (loop at line 3830)")
    assert _callers_text(callers, "abort") == (
        "Scheduler.abort_request() calls abort() at managers/scheduler.py:3834 for a request in "
        "disagg_prefill_bootstrap_queue and at managers/scheduler.py:3841 for a request in disagg_prefill_inflight_queue")
    assert _callers_text(callers[1:], "abort") == \
        "Scheduler.abort_request() calls abort() for it at managers/scheduler.py:3841"


def test_abort_that_ends_every_state_through_the_table_is_not_ignored(tmp_path: Path) -> None:
    """healthy's mori: abort() stores Failed through update_status() and poll() returns what
    check_status() gives back for every state it waits in; abort is seen, so no abort-ignored."""
    tree = tmp_path / "healthy"
    shutil.copytree(EXAMPLES / "healthy", tree)
    report = scan_path(tree)
    mori = next(b for b in report.backends if b.name == "mori")
    assert mori.verdicts and abort_ended(mori) == list(mori.verdicts)
    assert all(v.abort_via for v in mori.verdicts.values())
    assert not [f for f in report.findings if f.rule == "abort-ignored" and f.backend == "mori"]


def test_abort_mechanism_without_a_found_write_still_says_how(tmp_path: Path) -> None:
    """A way out by abort with no table write found (inherited-poll's Bootstrapping) is told in
    words, never as `(None)`."""
    tree = tmp_path / "inherited-poll"
    shutil.copytree(EXAMPLES / "inherited-poll", tree)
    report = scan_path(tree)
    texts = [f.message for f in report.findings if f.rule == "abort-ignored"]
    texts += [fr.text for b in report.backends for fr in what_frees(report, b)]
    assert texts and not [t for t in texts if "(None)" in t]
