"""kvtrace on released SGLang wheels (downloaded at test time, cached outside the repo).

The expected fates below were verified by reading each version's
`sglang/srt/disaggregation/prefill.py` and the senders' `conn.py`; the reasoning is written next
to each expectation. The release-map test compares against an independent grep + ast reading.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvtrace.scan import scan_path
from tests.sglang_wheels import QUEUE, sglang_tree

PREFILL = "sglang/srt/disaggregation/prefill.py"

# The grep patterns of ../shared/background.md, and the site kind each must show up as.
GREP_PATTERNS: list[tuple[str, set[str]]] = [
    (r"polls\s*=\s*poll_and_all_reduce", {"poll"}),
    (r"\bundone_reqs\.append\(", {"keep"}),
    (r"(?<!un)done_reqs\.append\(", {"done"}),
    (r"\brelease_kv_cache\(|\.cache_finished_req\(", {"release"}),
    (r"\bprepare_abort\(", {"abort"}),
    (rf"self\.{QUEUE}\s*=[^=]", {"reassign"}),
    (rf"self\.{QUEUE}\.append\(", {"entry"}),
    (r"KVPoll\.\w+", {"check", "raise"}),
]


@pytest.fixture(scope="module", params=["0.4.6.post5", "0.5.2", "0.5.14", "0.5.23"])
def release(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, sglang_tree(request.param)


def _functions_of_the_queue(tree: ast.Module) -> list[ast.FunctionDef]:
    """The drain method and every method of prefill.py it calls through self, transitively."""
    methods = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    drain = next(
        f for f in methods.values()
        if any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == QUEUE for t in n.targets)
               for n in ast.walk(f))
        and any(isinstance(n, ast.For) and QUEUE in ast.unparse(n.iter) for n in ast.walk(f))
    )
    todo, seen = [drain], {drain.name}
    while todo:
        func = todo.pop()
        for node in ast.walk(func):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" \
                    and node.func.attr in methods and node.func.attr not in seen:
                seen.add(node.func.attr)
                todo.append(methods[node.func.attr])
    return [methods[name] for name in seen]


def _statement_start(tree: ast.Module, line: int) -> int:
    """The first line of the innermost statement containing `line` (multi-line conditions)."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            header_end = node.body[0].lineno - 1 if hasattr(node, "body") and isinstance(node.body, list) and node.body else node.end_lineno
            if line <= (header_end or line) and (best is None or node.lineno >= best.lineno):
                best = node
    return best.lineno if best is not None else line


def test_release_map_has_every_grep_hit(release: tuple[str, Path]) -> None:
    version, root = release
    report = scan_path(root)
    text = (root / PREFILL).read_text()
    tree = ast.parse(text)
    functions = _functions_of_the_queue(tree)
    in_scope = [(f.lineno, f.end_lineno) for f in functions]
    sites = {(s.line, s.kind) for s in report.queues[0].sites if s.path == PREFILL}
    missing = []
    checked = 0
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern, kinds in GREP_PATTERNS:
            if not re.search(pattern, line) or line.lstrip().startswith("#"):
                continue
            anywhere = kinds & {"entry", "reassign"}
            if not anywhere and not any(a <= number <= b for a, b in in_scope):
                continue
            if kinds == {"check", "raise"} and not re.search(r"\b(if|elif|assert|in|==|!=)\b|^\s*KVPoll\.\w+,?\s*$", line):
                continue  # a KVPoll name that is not part of a condition (a return, an argument)
            start = _statement_start(tree, number)
            checked += 1
            if not any((start, kind) in sites or (number, kind) in sites for kind in kinds):
                missing.append(f"{PREFILL}:{number} ({'/'.join(sorted(kinds))}): {line.strip()}")
    print(f"{version}: {checked} grep hits compared")
    assert checked >= 8, f"the grep found too little in {version} to compare"
    assert not missing, "release map misses grep hits:\n" + "\n".join(missing)


# state -> fate, per version; why, from reading the code:
EXPECTED_FATES = {
    # if poll in [WaitingForInput, Transferring]: keep / elif Success: done / elif Failed: done,
    # no else: Bootstrapping falls through every branch and is dropped from the queue.
    "0.4.6.post5": {
        "Failed": ["leaves"], "Bootstrapping": ["dropped"], "WaitingForInput": ["kept"],
        "Transferring": ["kept"], "Success": ["leaves"],
    },
    # A PP branch keeps any rid not in rids_to_check (so every state can be kept), then asserts
    # the state is Success or Failed (so non-terminal states can raise); the final `else: assert
    # False` makes Bootstrapping raise.
    "0.5.2": {
        "Failed": ["kept", "leaves"], "Bootstrapping": ["kept", "raises"],
        "WaitingForInput": ["kept", "raises"], "Transferring": ["kept", "raises"],
        "Success": ["kept", "leaves"],
    },
    # A PP branch keeps any rid not in rids_to_check and, in consensus, every non-terminal poll
    # (with a warning); then W/T keep, Success/Failed leave, and the final `else` keeps
    # (Bootstrapping) with a warning instead of raising.
    "0.5.14": {
        "Failed": ["kept", "leaves"], "Bootstrapping": ["kept"], "WaitingForInput": ["kept"],
        "Transferring": ["kept"], "Success": ["kept", "leaves"],
    },
    # PP branch keeps everything not yet in consensus; the pending-bootstrap branch calls
    # handle_pending_bootstrap(req, poll): Failed -> handle_bootstrap_failure (release, abort)
    # and leaves; Bootstrapping -> False, then optimistic_release_and_requeue (release, requeue)
    # or kept; WaitingForInput -> an assert on finalize_bootstrap (can raise) or kept;
    # Transferring/Success -> RuntimeError. The main chain ends in `else: raise RuntimeError`
    # (Bootstrapping raises there).
    "0.5.23": {
        "Failed": ["kept", "leaves"], "Bootstrapping": ["kept", "leaves", "raises"],
        "WaitingForInput": ["kept", "raises"], "Transferring": ["kept", "raises"],
        "Success": ["kept", "leaves", "raises"],
    },
}

# (backend, state) pinned-state findings, per version; why (read in each release's conn.py):
EXPECTED_PINS = {
    # No sender has abort() or a timeout. The fake sender returns WaitingForInput until send()
    # was called. NIXL's poll returns WaitingForInput until every transfer handle is DONE.
    # Mooncake's poll returns the manager's request_status[room]; the stores into it are
    # Bootstrapping (sender __init__), WaitingForInput (bootstrap thread), Success/Failed
    # (transfer thread) and, on the decode side only, a value read off the network (reported as
    # unknown, not as a pin): Transferring is never stored ("TODO: Shall we use
    # KVPoll.Transferring state?"), so it cannot pin; WaitingForInput can.
    "0.4.6.post5": {("fake", "WaitingForInput"), ("mooncake", "WaitingForInput"), ("nixl", "WaitingForInput")},
    # Mooncake (and Ascend, which inherits its poll) return conclude_state once abort() set it.
    # NIXL's sender has no abort(); before the last chunk is sent its poll returns
    # kv_mgr.check_status(room) = request_status[room], which only ever holds Bootstrapping
    # (sender __init__) or WaitingForInput (bootstrap thread); after it, WaitingForInput until
    # the handles are DONE: Bootstrapping and WaitingForInput pin, Transferring is never returned.
    # The fake sender has no abort and no timeout.
    # NIXL Bootstrapping is not a pin: no path that tests it keeps it (state-crash below).
    "0.5.2": {("fake", "WaitingForInput"), ("nixl", "WaitingForInput")},
    # MooncakeKVSender.abort() calls super().abort(): CommonKVSender.abort() sets conclude_state
    # = Failed, and MooncakeKVSender.poll() returns conclude_state once set: no pin (Ascend
    # inherits both). NixlKVSender.poll() never reads conclude_state; it returns
    # kv_mgr.check_status(room) = request_status.get(room, WaitingForInput). With the room
    # present, abort()'s update_status(room, Failed) stores Failed and poll() returns it; but
    # CommonKVSender.clear() pops the room, update_status(room, Failed) returns without effect for
    # an absent room, and check_status then answers WaitingForInput forever: WaitingForInput pins.
    "0.5.14": {("nixl", "WaitingForInput")},
    # Every sender reads conclude_state (CommonKVSender._poll_with_status, FakeKVSender.poll).
    "0.5.23": set(),
}


# The drain's modes: process_disagg_prefill_inflight_queue(self, rids_to_check=None) is called
# with no argument by the normal event loops and with the rids the previous pipeline rank
# finished by the pipeline-parallel one (positionally). Per version: (mode label, line of a
# caller) and, per state and mode, (the outcomes once it no longer waits, the lines of the
# guards it waits on: `if req.rid not in rids_to_check: undone_reqs.append(req); continue`).
_PP = "rids_to_check passed"
_NORMAL = "rids_to_check=None"
EXPECTED_MODES = {
    # No parameter: one mode.
    "0.4.6.post5": [("default", "sglang/srt/disaggregation/prefill.py", 240)],
    # Both event loops are in prefill.py; event_loop_pp_disagg_prefill passes next_release_rids.
    "0.5.2": [(_NORMAL, "sglang/srt/disaggregation/prefill.py", 299), (_PP, "sglang/srt/disaggregation/prefill.py", 795)],
    # The pipeline-parallel loop moved to SchedulerPPMixin (managers/scheduler_pp_mixin.py).
    "0.5.14": [(_NORMAL, "sglang/srt/disaggregation/prefill.py", 494), (_PP, "sglang/srt/managers/scheduler_pp_mixin.py", 316)],
    "0.5.23": [(_NORMAL, "sglang/srt/disaggregation/prefill.py", 720), (_PP, "sglang/srt/managers/scheduler_pp_mixin.py", 345)],
}
EXPECTED_MODE_FATES = {
    "0.4.6.post5": {"default": {
        "Failed": (["leaves"], []), "Bootstrapping": (["dropped"], []), "WaitingForInput": (["kept"], []),
        "Transferring": (["kept"], []), "Success": (["leaves"], [])}},
    # Normal: W/T kept, Success/Failed leave, Bootstrapping meets `else: assert False` (532).
    # PP: every state waits at 502 until its rid is in rids_to_check; then
    # `assert poll == KVPoll.Success or poll == KVPoll.Failed` (506) raises for the others.
    "0.5.2": {
        _NORMAL: {"Failed": (["leaves"], []), "Bootstrapping": (["raises"], []), "WaitingForInput": (["kept"], []),
                  "Transferring": (["kept"], []), "Success": (["leaves"], [])},
        _PP: {"Failed": (["leaves"], [502]), "Bootstrapping": (["raises"], [502]), "WaitingForInput": (["raises"], [502]),
              "Transferring": (["raises"], [502]), "Success": (["leaves"], [502])},
    },
    # Normal: the final `else` keeps Bootstrapping with a warning. PP: waits at 742; in
    # consensus a non-terminal poll is kept with a warning (750-758) instead of asserting.
    "0.5.14": {
        _NORMAL: {"Failed": (["leaves"], []), "Bootstrapping": (["kept"], []), "WaitingForInput": (["kept"], []),
                  "Transferring": (["kept"], []), "Success": (["leaves"], [])},
        _PP: {"Failed": (["leaves"], [742]), "Bootstrapping": (["kept"], [742]), "WaitingForInput": (["kept"], [742]),
              "Transferring": (["kept"], [742]), "Success": (["leaves"], [742])},
    },
    # Normal: the pending-bootstrap branch (handle_pending_bootstrap raises RuntimeError for
    # Transferring/Success, asserts finalize_bootstrap for WaitingForInput, requeues or keeps
    # Bootstrapping) and the main chain (`else: raise RuntimeError` for Bootstrapping). PP: waits
    # at 1173; in consensus non-terminal polls are kept (1181-1189) before any of that, so only
    # Success and Failed reach the rest.
    "0.5.23": {
        _NORMAL: {"Failed": (["leaves"], []), "Bootstrapping": (["kept", "leaves", "raises"], []),
                  "WaitingForInput": (["kept", "raises"], []), "Transferring": (["kept", "raises"], []),
                  "Success": (["leaves", "raises"], [])},
        _PP: {"Failed": (["leaves"], [1173]), "Bootstrapping": (["kept"], [1173]), "WaitingForInput": (["kept"], [1173]),
              "Transferring": (["kept"], [1173]), "Success": (["leaves", "raises"], [1173])},
    },
}
# state-crash: (state, line of the raise), per version. Only 0.5.2: in the normal mode every path
# that tests Bootstrapping reaches `assert False` (532); in the PP mode every path that tests
# Bootstrapping or WaitingForInput (returned by mooncake/nixl) reaches the assert at 506
# (Transferring too, but no 0.5.2 backend returns it). 0.5.14 replaced both asserts by a warning and
# a keep (the upstream fix "Treat non-terminal states as undone instead of crashing"); in 0.5.23
# the raising paths of each state sit next to paths that keep or finish it.
EXPECTED_CRASHES = {
    "0.4.6.post5": set(),
    "0.5.2": {("Bootstrapping", 532), ("Bootstrapping", 506), ("WaitingForInput", 506)},
    "0.5.14": set(),
    "0.5.23": set(),
}


def test_state_fates_and_findings(release: tuple[str, Path]) -> None:
    version, root = release
    report = scan_path(root)
    fates = {state: fate.fate for state, fate in report.queues[0].states.items()}
    assert fates == EXPECTED_FATES[version]
    modes = [(m.label, m.callers[0].path, m.callers[0].line) for m in report.queues[0].modes]
    assert modes == EXPECTED_MODES[version]
    by_mode = {m.label: {} for m in report.queues[0].modes}
    for state, fate in report.queues[0].states.items():
        for mode_fate in fate.modes:
            by_mode[mode_fate.mode][state] = (mode_fate.then, [w.line for w in mode_fate.waits])
    assert by_mode == EXPECTED_MODE_FATES[version]
    # The inflight queue's findings (the bootstrap queue's are held in test_bootstrap_queue.py).
    findings = [f for f in report.findings if f.queue in (None, report.queues[0].name)]
    pins = {(f.backend, f.state) for f in findings if f.rule == "pinned-state"}
    assert pins == EXPECTED_PINS[version]
    crashes = {(f.state, f.line) for f in findings if f.rule == "state-crash"}
    assert crashes == EXPECTED_CRASHES[version]
    dropped = {f.state for f in findings if f.rule == "dropped-state"}
    assert dropped == ({"Bootstrapping"} if version == "0.4.6.post5" else set())
    assert all(f.status == "ok" for f in report.files)


def test_backends_resolve_inherited_poll() -> None:
    report = scan_path(sglang_tree("0.5.23"))
    backends = {b.name: b for b in report.backends}
    assert {"ascend", "fake", "mooncake", "mori", "nixl"} <= set(backends)
    nixl = backends["nixl"]
    # NixlKVSender does not define poll(): it runs CommonKVSender.poll in common/conn.py.
    assert nixl.poll is not None and nixl.poll.inherited_from == "CommonKVSender"
    assert nixl.poll.path == "sglang/srt/disaggregation/common/conn.py"
    source = (sglang_tree("0.5.23") / nixl.poll.path).read_text().splitlines()
    assert source[nixl.poll.line - 1].strip().startswith("def poll(")
    assert nixl.reads_abort_state and nixl.abort_state == "conclude_state"
    # _check_bootstrap_timeout is only called under `if status == KVPoll.Bootstrapping`.
    assert [t.covers for t in nixl.timeouts] == [("Bootstrapping",)]
    # The fake sender checks its waiting timeout while nothing was sent (WaitingForInput).
    assert [t.covers for t in backends["fake"].timeouts] == [("WaitingForInput",)]


def test_gauge_and_entry_sites_outside_the_package() -> None:
    report = scan_path(sglang_tree("0.5.23"))
    gauges = [s for s in report.queues[0].sites if s.kind == "gauge"]
    assert gauges, "the metrics reporter's QueueCount.from_reqs / len() of the queue was not found"
    for site in gauges:
        line = (sglang_tree("0.5.23") / site.path).read_text().splitlines()[site.line - 1]
        assert QUEUE in line or "from_reqs" in line or "len(" in line


def test_map_has_the_sites_grep_misses() -> None:
    """Sites no grep for the background's patterns finds: requeues and raises inside helpers,
    releases through other helper names, and the helper calls that lead there."""
    root = sglang_tree("0.5.23")
    report = scan_path(root)
    lines = (root / PREFILL).read_text().splitlines()
    by_function: dict[tuple[str, str], list[int]] = {}
    for s in report.queues[0].sites:
        if s.path == PREFILL:
            by_function.setdefault((s.kind, s.function.rsplit(".", 1)[-1]), []).append(s.line)

    def text(kind: str, function: str) -> list[str]:
        found = by_function.get((kind, function), [])
        assert found, f"no {kind} site in {function}"
        return [lines[n - 1] for n in found]

    # Bootstrapping can give its slot back: the request goes to other queues, not the done list.
    assert all("req" in t and any(m in t for m in (".append(", ".insert(", ".extend(", ".appendleft("))
               for t in text("requeue", "optimistic_release_and_requeue"))
    # The pending-bootstrap helper raises for Transferring/Success and asserts for WaitingForInput.
    raises = text("raise", "handle_pending_bootstrap")
    assert any("assert" in t for t in raises) and any("raise" in t for t in raises)
    # Failure handling moved into helpers, found through the calls that reach them.
    assert any("prepare_abort" in t for t in text("abort", "handle_inflight_transfer_failure"))
    assert any("release_kv_cache" in t for t in text("release", "handle_bootstrap_failure"))
    assert any("handle_pending_bootstrap" in t for t in text("helper", "process_disagg_prefill_inflight_queue"))
    # Metadata buffers are freed after the loop, through a helper whose name no grep pattern has.
    assert any("maybe_release_metadata_buffer" in t for t in text("release", "process_disagg_prefill_inflight_queue"))


def test_nixl_pin_names_its_chain() -> None:
    """0.5.14's NIXL pin, link by link, each at a line whose text says what the link says."""
    root = sglang_tree("0.5.14")
    report = scan_path(root)
    finding = next(f for f in report.findings if f.rule == "pinned-state" and f.backend == "nixl")
    assert finding.state == "WaitingForInput"

    def line(evidence) -> str:
        return (root / evidence.path).read_text().splitlines()[evidence.line - 1]

    chain = {e.note: e for e in finding.evidence}

    def link(words: str):
        found = [e for note, e in chain.items() if words in note]
        assert found, f"no link saying {words!r} in {list(chain)}"
        return found[0]

    assert "WaitingForInput" in line(link("returns WaitingForInput for a room absent")) \
        and ".get(" in line(link("returns WaitingForInput for a room absent"))
    assert "conclude_state = KVPoll.Failed" in line(link("never reads"))
    assert "not in self.request_status" in line(link("returns without effect when the room is absent"))
    assert "request_status.pop(" in line(link("pops the room"))
    assert "def poll(" in line(link("no timeout check is reached for WaitingForInput"))
    for note in ("absent", "never reads", "without effect", "pops the room", "no timeout"):
        assert note in finding.message


def test_a_state_returned_in_a_tuple_is_followed_and_the_rest_is_named() -> None:
    """0.5.14's mori poll() returns the first element of what `_finalize_failure()` hands back
    (`sent_status, _ = ...`, a tuple built from Failed): Failed is followed. What stays unknown
    (an attribute copied from a parameter) names the return it comes from, at a line that is a
    `return`; a state behind it is `?` in the grid, never `-`."""
    from kvtrace.report.verdicts import NOT_RETURNED, UNKNOWN, verdict_grid

    root = sglang_tree("0.5.14")
    report = scan_path(root)
    mori = next(b for b in report.backends if b.name == "mori")
    source = (root / "sglang/srt/disaggregation/mori/conn.py").read_text()
    tree = ast.parse(source)
    poll = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "MoriKVSender"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "poll")
    unpacked = [n for n in ast.walk(poll) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Tuple)]
    assert unpacked  # the premise: poll() unpacks a tuple...
    assert not any(isinstance(n, ast.Return) and isinstance(n.value, ast.Attribute) and n.value.attr == "Failed"
                   for n in ast.walk(poll))  # ...and never returns Failed literally
    assert "Failed" in mori.returns
    lines = source.splitlines()
    assert mori.returns_unknown
    for why in mori.returns_unknown:
        found = re.search(r"(\w+\.\w+)\(\) returns it at (\S+):(\d+)", why)
        assert found, why
        assert found[2] == "sglang/srt/disaggregation/mori/conn.py"
        assert lines[int(found[3]) - 1].strip().startswith("return "), why
    grid = verdict_grid(report)
    for state in grid.states:
        if state not in mori.returns:
            assert grid.cells["mori", state][0] == UNKNOWN
    for b in report.backends:  # a backend whose returns are all known keeps its `-` cells
        if not b.returns_unknown:
            for state in grid.states:
                if state not in b.returns and grid.cells[b.name, state][0] != NOT_RETURNED:
                    assert any(f.backend == b.name and f.state == state for f in report.findings)


def _store_lines(root: Path, rel: str, state: str) -> list[int]:
    """Lines of `rel` that store `state` through update_status (read independently, with ast)."""
    tree = ast.parse((root / rel).read_text())
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "update_status" and any(isinstance(a, ast.Attribute) and a.attr == state
                                                       for a in ast.walk(n))]


def _nested_def_lines(root: Path, rel: str) -> list[tuple[int, int]]:
    """(first, last) lines of the functions defined inside a method of `rel`."""
    tree = ast.parse((root / rel).read_text())
    spans = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for method in (m for m in cls.body if isinstance(m, ast.FunctionDef)):
            spans += [(d.lineno, d.end_lineno) for d in ast.walk(method)
                      if isinstance(d, ast.FunctionDef) and d is not method]
    return spans


@pytest.mark.parametrize(("version", "backend", "states"), [
    # mori's bootstrap_worker closure hands each message to _handle_transfer_message, which
    # stores WaitingForInput; the closure is only started as a thread.
    ("0.5.9", "mori", {"WaitingForInput"}),
    # mooncake's transfer_thread closure stores Failed and Success (its bootstrap_thread closure
    # WaitingForInput), both started with threading.Thread(target=...).
    ("0.4.6.post5", "mooncake", {"Failed", "Success"}),
])
def test_states_stored_by_thread_closures_are_returned(version: str, backend: str, states: set[str]) -> None:
    root = sglang_tree(version)
    rel = f"sglang/srt/disaggregation/{backend}/conn.py"
    spans = _nested_def_lines(root, rel)
    for state in states:  # the premise, read from the release: the only update is in a closure...
        calls = _store_lines(root, rel, state)
        assert calls, state
    report = scan_path(root)
    found = next(b for b in report.backends if b.name == backend)
    assert states <= set(found.returns), found.returns  # ...and kvtrace follows it
    if version == "0.4.6.post5":  # no method of this manager stores them outside a closure
        assert all(any(a <= line <= b for a, b in spans) for s in states for line in _store_lines(root, rel, s))


def test_a_pinned_state_cites_the_return_that_yields_it(release: tuple[str, Path]) -> None:
    """The first link of every pin's chain is a `return` statement of the release (read with
    ast), not the `def poll` line; a table value is named only as the value returned."""
    version, root = release
    report = scan_path(root)
    chains = [(b, state, v.chain) for b in report.backends for state, v in b.verdicts.items() if v.pinned]
    assert chains or version == "0.5.23"
    for backend, state, chain in chains:
        first = chain[0]
        tree = ast.parse((root / first.path).read_text())
        returns = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Return)}
        assert first.line in returns, (version, backend.name, state, first)
        assert f"returns {state} at " in first.note
        if " holds " in first.note:
            assert first.note.endswith(f"holds {state} for the room"), first.note
