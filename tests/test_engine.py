"""The flow engine one construct at a time: an in-memory harness that explores one function from
a source string (as pyflakes' tests check one node type each), and what a run does with a
construct it has no handler for."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import libcst as cst
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtrace import flow
from kvtrace.flow import CallSite, Companion, Explorer, Frame, Options, PathLimit, PathState, RunLog, acting_events
from kvtrace.effects import CallEffect, QueueEffects, SenderEffects
from kvtrace.gaps import Cut
from kvtrace.graph import _removal_index
from kvtrace.index import FuncRef, Index, same_origin
from kvtrace.managers import manager_facts
from kvtrace.model import EventKind, Gap, GapKind, ProblemKind, SourceFile
from kvtrace.packs import load_pack
from kvtrace.parse import CstFunction, parse_module
from kvtrace.report.verdicts import gap_text
from kvtrace.rules.manager_model import manager_methods
from kvtrace.rules.samples import STANDARD_BRANCHES, drain
from kvtrace import scan
from kvtrace.scan import scan_path
from kvtrace.states import INT, OTHER, Domain, Val
from tests.property import _support, gen, oracle
from tests.trees import EXAMPLES, write_tree

DOMAIN = Domain("KVPoll", ("Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"),
                (0, 1, 2, 3, 4), ("Failed", "Success"))
PACK = load_pack("sglang-prefill")
HEADER = "from enum import IntEnum\n\n\nclass KVPoll(IntEnum):\n    Failed = 0\n    Bootstrapping = 1\n" \
         "    WaitingForInput = 2\n    Transferring = 3\n    Success = 4\n\n\n"


def explore(body: str, params: dict[str, Val] | None = None, state: str | None = "Success", module: str = "",
            **config: object) -> tuple[list[PathState], RunLog]:
    """Every path through `def f(<params>):` + `body` (indented 4 spaces), run in drain mode for
    `state` (None: sender mode), from the given parameter values; `module`: more of the module
    (functions f calls), after f."""
    ends, explorer = explore_with(body, params, state, module, **config)
    return ends, explorer.log


def function_f(text: str) -> tuple[Index, FuncRef, CstFunction]:
    """The index of module `text` (as m.py), its function `f`, and f's libcst tree."""
    data = text.encode()
    parsed_module = parse_module(SourceFile("m.py", data, hashlib.sha256(data).hexdigest()))
    assert parsed_module is not None
    index = Index([parsed_module])
    func = index.functions["f"][0]
    parsed = index.cst(func)
    assert parsed is not None
    return index, func, parsed


def explore_with(body: str, params: dict[str, Val] | None = None, state: str | None = "Success", module: str = "",
                 **config: object) -> tuple[list[PathState], Explorer]:
    params = params or {}
    index, func, parsed = function_f(HEADER + f"def f({', '.join(params)}):\n"
                                     + "".join(f"    {line}\n" for line in body.splitlines()) + module)
    # A drain loop's run for a poll state; a sender's run for none.
    effects = config.pop("effects", QueueEffects(PACK, PACK.queue) if state is not None else SenderEffects(PACK))
    options = Options(index, DOMAIN, state=state, effects=effects, **config)  # type: ignore[arg-type]
    explorer = Explorer(options)
    ends, _ = explorer.explore_function(func, parsed, None, [PathState(env=tuple(sorted(params.items())))])
    return ends, explorer


def returns(ends: list[PathState]) -> set[frozenset[str]]:
    return {end.ret for end in ends if end.term == "return" and end.ret is not None}


POLL = frozenset({"WaitingForInput", "Success"})


# --- statements, one kind each ------------------------------------------------------------

def test_if_splits_on_the_poll_value() -> None:
    ends, _ = explore("if p == KVPoll.Success:\n    return 'one'\nreturn 'two'", {"p": POLL})
    assert returns(ends) == {frozenset({OTHER})}
    assert len(ends) == 2


def test_if_elif_else_narrows_each_branch() -> None:
    ends, _ = explore("if p == KVPoll.Success:\n    return p\nelif p is None:\n    return None\nelse:\n    return p",
                      {"p": POLL})
    assert returns(ends) == {frozenset({"Success"}), frozenset({"WaitingForInput"})}


def test_assignment_copies_the_value_and_tuple_unpacking_takes_positions() -> None:
    ends, _ = explore("q = p\na, b = KVPoll.Failed, q\nreturn b", {"p": POLL})
    assert returns(ends) == {POLL}


def test_return_without_a_value_is_none() -> None:
    ends, _ = explore("return")
    assert returns(ends) == {frozenset({"None"})}


def test_raise_and_assert_end_paths_by_raising() -> None:
    ends, _ = explore("assert p == KVPoll.Success\nraise RuntimeError()", {"p": POLL})
    assert {e.term for e in ends} == {"raise"}
    assert [[ev.detail for ev in e.events if ev.kind is EventKind.RAISE] for e in ends] in (
        [["assert"], ["raise"]], [["raise"], ["assert"]])


def test_for_runs_its_body_zero_or_one_time() -> None:
    ends, _ = explore("x = KVPoll.Failed\nfor i in items:\n    x = KVPoll.Success\nreturn x", {"items": frozenset({OTHER})})
    assert returns(ends) == {frozenset({"Failed"}), frozenset({"Success"})}


def test_while_decides_its_test() -> None:
    ends, _ = explore("while p == KVPoll.Success:\n    return 'one'\nreturn p", {"p": POLL})
    assert returns(ends) == {frozenset({OTHER}), frozenset({"WaitingForInput"})}


def test_with_runs_its_body() -> None:
    ends, _ = explore("with lock:\n    return p", {"p": POLL, "lock": frozenset({OTHER})})
    assert returns(ends) == {POLL}


def test_match_value_patterns_split_the_subject() -> None:
    ends, _ = explore("match p:\n    case KVPoll.Success:\n        return 'one'\n    case _:\n        return p", {"p": POLL})
    assert returns(ends) == {frozenset({OTHER}), frozenset({"WaitingForInput"})}


def test_try_handler_runs_after_a_raise_in_the_body() -> None:
    ends, _ = explore("try:\n    raise ValueError()\nexcept ValueError:\n    return 'one'\nreturn 'two'")
    assert returns(ends) == {frozenset({OTHER})} and {e.term for e in ends} == {"return"}


def test_try_star_is_followed_like_try() -> None:
    plain, _ = explore("try:\n    if p == KVPoll.Success:\n        raise ValueError()\n    return p\n"
                       "except ValueError:\n    return 'one'\nfinally:\n    x = 0", {"p": POLL})
    star, log = explore("try:\n    if p == KVPoll.Success:\n        raise ValueError()\n    return p\n"
                             "except* ValueError:\n    return 'one'\nfinally:\n    x = 0", {"p": POLL})
    assert returns(star) == returns(plain) == {frozenset({"WaitingForInput"}), frozenset({OTHER})}
    assert log.truncated == []


def test_nested_def_and_class_are_not_run() -> None:
    ends, _ = explore("def g():\n    raise ValueError()\nclass C:\n    x = 1\nreturn p", {"p": POLL})
    assert returns(ends) == {POLL}


def test_no_effect_statements_leave_the_path_as_it_was() -> None:
    ends, log = explore("pass\nimport os\nfrom os import path\nglobal G\nreturn p", {"p": POLL})
    assert returns(ends) == {POLL} and log.truncated == []


def test_continue_and_break_end_the_iteration() -> None:
    ends, _ = explore("if p == KVPoll.Success:\n    continue\nbreak", {"p": POLL})
    assert sorted(e.term or "" for e in ends) == ["break", "continue"]


# --- expressions, one kind each -----------------------------------------------------------

UNIVERSE = DOMAIN.universe


@pytest.mark.parametrize(("expression", "expected"), [
    ("None", frozenset({"None"})),  # a name: None, True, False, a parameter, an unknown name
    ("True", frozenset({"True"})),
    ("p", POLL),
    ("unknown_name", UNIVERSE),
    ("KVPoll.Failed", frozenset({"Failed"})),  # an attribute: an enum member, else unknown
    ("p.value", UNIVERSE),
    ("2", frozenset({"WaitingForInput", INT})),  # an integer: the member with that value (a number, no poll value), else other
    ("7", frozenset({OTHER})),
    ("-1", UNIVERSE),  # arithmetic is unknown (its calls still run)
    ("'text'", frozenset({OTHER})),  # strings, f-strings, floats: something else
    ("f'{p}'", frozenset({OTHER})),
    ("1.5", frozenset({OTHER})),
    ("(KVPoll.Failed, p)[1]", POLL),  # a tuple kvtrace built, indexed by position
    ("[KVPoll.Failed, KVPoll.Success]", frozenset({"Failed", "Success"})),
    ("p if p == KVPoll.Success else KVPoll.Failed", frozenset({"Success", "Failed"})),
    ("lambda: p", UNIVERSE),
    ("max(KVPoll.Failed, p)", POLL),  # max/min of members by their values
    ("bool(None)", frozenset({"False"})),
])
def test_expression_values(expression: str, expected: Val) -> None:
    ends, _ = explore(f"return {expression}", {"p": POLL})
    values = returns(ends)
    assert frozenset().union(*values) - {t for t in frozenset().union(*values) if t.startswith("@item")} == expected


@pytest.mark.parametrize(("condition", "truths"), [
    ("p == KVPoll.Success", {"True", "False"}),
    ("p in (KVPoll.Failed,)", {"False"}),  # decided: p is never Failed
    ("not p is None", {"True"}),
    ("p == KVPoll.Success or p == KVPoll.WaitingForInput", {"True"}),
    ("p == KVPoll.Success and p == KVPoll.WaitingForInput", {"False"}),
    ("not x.flag", {"True", "False"}),  # undecided: both ways
])
def test_conditions_as_values(condition: str, truths: set[str]) -> None:
    ends, _ = explore(f"return {condition}", {"p": POLL, "x": frozenset({OTHER})})
    assert frozenset().union(*returns(ends)) == truths


def test_a_call_of_a_module_function_runs_it_with_its_arguments() -> None:
    module = "\n\ndef g(v):\n    if v == KVPoll.Success:\n        return KVPoll.Failed\n    return v\n"
    ends, _ = explore("return g(p)", {"p": POLL}, module=module)
    assert returns(ends) == {frozenset({"Failed"}), frozenset({"WaitingForInput"})}


def test_await_is_its_expression() -> None:
    ends, _ = explore("return await g(p)", {"p": POLL}, module="\n\nasync def g(v):\n    return v\n")
    assert returns(ends) == {POLL}


def test_a_subscript_of_the_poll_list_is_the_state_of_the_run() -> None:
    ends, _ = explore("return polls[i]", {"polls": frozenset({"@polls"}), "i": frozenset({OTHER})}, state="Transferring")
    assert returns(ends) == {frozenset({"Transferring"})}


def test_a_clock_reading_grows_and_a_comparison_with_it_is_a_timeout() -> None:
    ends, _ = explore("if time.time() - start > 30:\n    return KVPoll.Failed\nreturn p", {"p": POLL, "start": frozenset({OTHER})})
    assert returns(ends) == {frozenset({"Failed"}), POLL}
    assert all(any(e.kind is EventKind.TIMEOUT for e in end.events) for end in ends)


# --- a construct the engine has no handler for --------------------------------------------

def _statement_kinds(base: type) -> set[type]:
    found: set[type] = set()
    todo: list[type] = [base]
    while todo:
        subclasses: list[type] = todo.pop().__subclasses__()
        for sub in subclasses:
            todo.append(sub)
            # (libcst's dataclass decorator leaves the undecorated class among the subclasses.)
            if not inspect.isabstract(sub) and getattr(cst, sub.__name__, None) is sub:
                found.add(sub)
    return found


def test_every_libcst_statement_kind_has_a_handler() -> None:
    """A libcst release that adds a statement kind fails here before any scan meets it."""
    compound = _statement_kinds(cst.BaseCompoundStatement) | {cst.SimpleStatementLine}
    small = _statement_kinds(cst.BaseSmallStatement)
    assert compound - set(flow._STATEMENT_HANDLERS) == set()
    assert small - set(flow._SMALL_HANDLERS) == set()


def test_a_statement_kind_without_a_handler_is_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(flow._STATEMENT_HANDLERS, cst.While)
    ends, log = explore("while p:\n    return 'one'\nreturn p", {"p": POLL})
    assert returns(ends) == {POLL}  # the loop is passed over...
    [cut] = log.truncated  # ...and the run says where, and what it could not follow
    assert isinstance(cut, Cut) and cut.kind == "unmodelled" and cut.where == "m.py:13"
    assert str(cut) == "m.py:13 (While statement not modelled)"
    # A run's cuts cross the scan's fork as themselves.
    again = pickle.loads(pickle.dumps(cut))
    assert isinstance(again, Cut) and (again.kind, again.where, again) == (cut.kind, cut.where, cut)


def test_options_are_frozen_and_each_run_returns_what_it_learned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(flow._SMALL_HANDLERS, cst.Raise)
    _, explorer = explore_with("raise ValueError()")
    with pytest.raises(dataclasses.FrozenInstanceError):
        explorer.c.max_paths = 1  # type: ignore[misc]
    # The gap is in the run's log, not in its options: a second run on the same options starts clean.
    assert [str(t) for t in explorer.log.truncated] == ["m.py:13 (Raise statement not modelled)"]
    assert not hasattr(explorer.c, "truncated")
    assert Explorer(explorer.c).log == RunLog()


class _Tick(QueueEffects):
    """The drain loop's effects and one more: `tick()` is a metric."""

    def tick(self, run: Explorer, site: CallSite, path: PathState) -> list[tuple[PathState, Val]] | None:
        if site.callee != "tick":
            return None
        return [(path.emit(site.event(EventKind.METRIC, "tick")), frozenset({"None"}))]

    CALLS: ClassVar[tuple[CallEffect, ...]] = QueueEffects.CALLS + (tick,)


def test_an_effect_is_a_callback_the_walker_calls() -> None:
    body = "tick()\nx = sender.poll()\ndone.append(r)\nreturn x"
    params = {"r": frozenset({"@req"}), "done": frozenset({OTHER}), "sender": frozenset({OTHER})}
    ends, _ = explore(body, params, effects=_Tick(PACK))
    [end] = ends
    assert [(e.kind, e.detail) for e in end.events] == [
        (EventKind.METRIC, "tick"), (EventKind.POLL, "sender.poll"), (EventKind.DONE, "done")]
    assert returns(ends) == {frozenset({"Success"})}
    # The sender's effects know no queue and no poll of a state: the same calls are unknown calls.
    ends, _ = explore(body, params, state=None)
    assert all(not e.events for e in ends)


class _Ledger(QueueEffects):
    """The drain loop's effects, with `ledger` a container modelled by key: each kind of access
    answers with its own marker value, so a test sees which callback the walker called."""

    def keyed(self, run: Explorer, node: cst.CSTNode, frame: Frame) -> bool:
        return isinstance(node, cst.Name) and node.value == "ledger"

    def on_key_read(self, run: Explorer, node: cst.Subscript, path: PathState, frame: Frame) -> list[tuple[PathState, Val]]:
        return [(path, frozenset({"Failed"}))]

    def on_key_store(self, run: Explorer, target: cst.Subscript, value: Val, path: PathState, frame: Frame) -> PathState:
        return path.set_attr("@ledger", value)

    def on_key_delete(self, run: Explorer, node: cst.Del, path: PathState, frame: Frame) -> list[PathState]:
        return [path.set_attr("@ledger", frozenset({"None"}))]

    def on_key_method(self, run: Explorer, node: cst.Call, method: str, values: list[Val], path: PathState,
                      frame: Frame) -> list[tuple[PathState, Val]]:
        return [(path, frozenset({"Transferring"}) if method == "get" else frozenset({OTHER}))]

    def on_membership(self, run: Explorer, node: cst.Comparison, is_in: bool, path: PathState,
                      frame: Frame) -> list[tuple[PathState, bool, bool]] | None:
        if not self.keyed(run, node.comparisons[0].comparator, frame):
            return None
        return [(path, is_in, False)]  # the key is always in it


@pytest.mark.parametrize(("body", "returned", "held"), [
    ("return ledger[k]", "Failed", None),
    ("return ledger.get(k)", "Transferring", None),
    ("ledger[k] = KVPoll.Success\nreturn KVPoll.Bootstrapping", "Bootstrapping", frozenset({"Success"})),
    ("del ledger[k]\nreturn KVPoll.Bootstrapping", "Bootstrapping", frozenset({"None"})),
    ("if k not in ledger:\n    return KVPoll.Failed\nreturn KVPoll.Success", "Success", None),
])
def test_a_container_the_effects_model_by_key_is_theirs_to_answer(body: str, returned: str, held: Val | None) -> None:
    """The walker names no table: where its Effects say an expression is a keyed container, a
    read, store, delete, method call and membership test are their answers."""
    ends, _ = explore(body, {"k": frozenset({OTHER})}, effects=_Ledger(PACK))
    assert returns(ends) == {frozenset({returned})}
    assert {end.attr("@ledger") for end in ends} == {held}
    # Without the callbacks the same container is an unknown value, read and written by no one.
    plain, _ = explore(body, {"k": frozenset({OTHER})})
    assert (returns(plain), {end.attr("@ledger") for end in plain}) != (returns(ends), {held})


def test_a_small_statement_kind_without_a_handler_is_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(flow._SMALL_HANDLERS, cst.Raise)
    _, log = explore("raise ValueError()")
    assert [str(t) for t in log.truncated] == ["m.py:13 (Raise statement not modelled)"]


def test_an_unmodelled_construct_in_the_drain_makes_the_scan_incomplete(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(flow._STATEMENT_HANDLERS, cst.Match)
    source = drain('''\
            match poll:
                case KVPoll.Success:
                    done_reqs.append(req)
                case _:
                    undone_reqs.append(req)''')
    report = scan_path(write_tree(tmp_path, {"disaggregation/prefill.py": source}))
    line = source.splitlines().index("            match poll:") + 1
    assert any(p.kind is ProblemKind.CUT and p.where == f"disaggregation/prefill.py:{line}"
               and f"disaggregation/prefill.py:{line} (Match statement not modelled)" in p.text for p in report.problems), \
        report.problems


def test_a_drain_body_inside_try_except_star_has_its_fates(tmp_path: Path) -> None:
    """Issue 23: the drain's branches inside `try: ... except* E:` were passed over (every state
    'dropped', report complete)."""
    branches = '''\
            try:
                if poll in [KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Bootstrapping]:
                    undone_reqs.append(req)
                else:
                    release_kv_cache(req, self.tree_cache)
                    done_reqs.append(req)
            except* ValueError:
                undone_reqs.append(req)'''
    report = scan_path(write_tree(tmp_path, {"disaggregation/prefill.py": drain(branches)}))
    fates = {state: fate.fate for state, fate in report.queues[0].states.items()}
    # Failed and Success leave, or are kept when the handler runs (after a call in the body failed).
    assert fates == {"Failed": ["kept", "leaves"], "Bootstrapping": ["kept"], "WaitingForInput": ["kept"],
                     "Transferring": ["kept"], "Success": ["kept", "leaves"]}
    assert not [f for f in report.findings if f.rule == "dropped-state"]
    assert not report.problems


# --- what is read no more, and the step budget ----------------------------------------------

def flag_ifs(count: int, indent: str = "", flag: str = "a") -> str:
    """`if req.aN: xN = 1`, `count` times: each splits the path on a flag nobody reads again."""
    return "".join(f"{indent}if req.{flag}{i}:\n{indent}    {flag}x{i} = 1\n" for i in range(count))


def test_locals_and_facts_read_no_more_do_not_keep_paths_apart() -> None:
    ends, explorer = explore_with(flag_ifs(100) + "return p", {"p": POLL, "req": frozenset({"@req"})})
    assert returns(ends) == {POLL}
    assert len(ends) == 1
    # One live path into each `if` and one into its body, not 2**100.
    assert explorer.steps == 2 * 100 + 1


def test_a_fact_read_again_is_kept() -> None:
    body = flag_ifs(30) + "x = 'none'\nif req.a1:\n    x = KVPoll.Success\n" + flag_ifs(30, flag="c") + \
        "if req.a1:\n    return x\nreturn KVPoll.Failed"
    ends, _ = explore(body, {"req": frozenset({"@req"})})
    # `req.a1` answers the same both times: 'none' is never returned.
    assert returns(ends) == {frozenset({"Success"}), frozenset({"Failed"})}


def test_a_local_read_later_is_kept() -> None:
    ends, log = explore("x = KVPoll.Failed\n" + flag_ifs(20) + "if req.b:\n    x = KVPoll.Success\n"
                             + flag_ifs(20, flag="c") + "return x", {"req": frozenset({"@req"})})
    assert returns(ends) == {frozenset({"Failed"}), frozenset({"Success"})}
    assert log.truncated == []


# The decode prealloc loop's shape (issue 22): a request goes through many allocation helpers,
# each of which enters other helpers or not depending on a flag, and does nothing to the request.
IDLE_HELPERS = "\n\ndef budget(r):\n    if r.swa:\n        tail(r)\n    return 1\n\ndef tail(r):\n    return 2\n"
LOGGING_HELPER = "\n\ndef budget(r):\n    if r.swa:\n        logger.warning('tail')\n    return 1\n"


def budget_calls(count: int) -> str:
    return "x = KVPoll.Failed\nif req.b:\n    x = KVPoll.Success\n" + "budget(req)\n" * count + "return x"


def test_helpers_entered_that_did_nothing_do_not_multiply_paths_past_the_limit() -> None:
    ends, log = explore(budget_calls(12), {"req": frozenset({"@req"})}, module=IDLE_HELPERS, max_paths=64)
    # 2 * 2**12 paths differ only in whether each run of budget() entered tail(): one per value of x.
    assert log.truncated == []
    assert returns(ends) == {frozenset({"Failed"}), frozenset({"Success"})}
    assert len(ends) == 2
    # A drain run's paths are read without idle entries, so they are one at every statement,
    # below the limit too; a sender run keeps every path below the limit (its events are the
    # lines of poll()'s answers).
    drain, _ = explore(budget_calls(3), {"req": frozenset({"@req"})}, module=IDLE_HELPERS)
    assert len(drain) == 2
    assert [e for end in drain for e in acting_events(end) if e.kind is EventKind.HELPER] == []
    assert any(e.kind is EventKind.HELPER for end in drain for e in end.events)
    sender, _ = explore(budget_calls(3), {"req": frozenset({"@req"})}, state=None, module=IDLE_HELPERS)
    assert len(sender) == 2 * 2 ** 3


BOX = "class Box:\n    def value(self):\n        self.seen = KVPoll.Success\n        return KVPoll.Failed\n\n" \
      "    def other(self):\n        return KVPoll.Success\n"


@pytest.mark.parametrize("body", ["return self.h.value()", "read = self.h.value\nreturn read()",
                                  "h = Box()\nself.h = h\nreturn h.value()"])
def test_a_companion_is_an_object_the_walker_enters_through_the_attributes_that_hold_it(body: str) -> None:
    """The walker knows the sender's manager only as a Companion: a class, the attributes that
    hold it, the methods worth entering. A call through those attributes (a bound method, a
    local stored into one) runs the companion's method on the companion, whose attributes live
    on the path under their own prefix; a method not worth entering is an unknown value."""
    index, func, parsed = function_f(HEADER + "def f(self):\n" + "".join(f"    {line}\n" for line in body.splitlines())
                                     + "\n\n" + BOX)
    box = index.resolve_class("Box", near=func.path)
    assert box is not None

    def run(companion: Companion | None) -> list[PathState]:
        options = Options(index, DOMAIN, companion=companion, all_facts=True, effects=SenderEffects(PACK))
        ends, _ = Explorer(options).explore_function(func, parsed, None, [PathState()])
        return ends

    [end] = run(Companion(box, frozenset({"h"})))
    assert (end.ret, end.attr(flow.COMPANION + "seen"), end.attr("seen")) == (frozenset({"Failed"}), frozenset({"Success"}), None)
    # No companion, or a method not worth entering: Box.value() never runs, its value is not known.
    value = index.find_method(box, "value")
    assert value is not None
    for ends in (run(None), run(Companion(box, frozenset({"h"}), frozenset()))):
        assert all(end.attr(flow.COMPANION + "seen") is None for end in ends)
        assert {end.ret for end in ends} != {frozenset({"Failed"})}
    assert {end.ret for end in run(Companion(box, frozenset({"h"}), frozenset({id(value.node)})))} == {frozenset({"Failed"})}


REMOVAL_PASS = ("if r.failed:\n    removed.add(i)\nif i in removed:\n    return KVPoll.Failed\n"
                "logger.warning('still queued')\nreturn KVPoll.Success")


def explore_removal(body: str, scoped: bool) -> list[PathState]:
    """`body` as the drain owner's loop over the queue (`i` its index, `removed` the set the queue
    is filtered by), with the set known fresh (`scoped`) or not."""
    index, func, parsed = function_f(HEADER + "def f(r):\n" + "".join(f"    {line}\n" for line in body.splitlines()))
    effects = QueueEffects(PACK, PACK.queue, "removed", func.node if scoped else None, frozenset({"i"}) if scoped else frozenset())
    options = Options(index, DOMAIN, state="Success", effects=effects)
    ends, _ = Explorer(options).explore_function(func, parsed, None, [PathState(env=(("r", frozenset({"@req"})),))])
    return ends


def test_a_request_whose_index_joined_the_removal_set_is_in_it_later_in_the_call() -> None:
    ends = explore_removal(REMOVAL_PASS, scoped=True)
    # Added: `i in removed` holds (Failed); not added: the set, fresh this call, lacks it.
    assert {(any(e.kind is EventKind.DONE for e in end.events), end.ret) for end in ends} == {
        (True, frozenset({"Failed"})), (False, frozenset({"Success"}))}
    # A set kvtrace cannot tell is fresh: the test goes both ways, as before.
    loose = explore_removal(REMOVAL_PASS, scoped=False)
    assert (True, frozenset({"Success"})) in {(any(e.kind is EventKind.DONE for e in end.events), end.ret) for end in loose}
    # Another name than the loop's index is not the request's index.
    other = explore_removal(REMOVAL_PASS.replace("if i in removed", "if j in removed"), scoped=True)
    assert len(other) == 4


ABORTS = ("\n\nclass FINISH_ABORT:\n    pass\n\n\nclass OTHER_REASON:\n    pass\n\n\n"
          "def prepare_abort(req, message):\n    \"\"\"End it.\"\"\"\n    req.finished_reason = FINISH_ABORT()\n"
          "    if req.return_logprob:\n        req.logprob = []\n")
ABORTED_THEN_TESTED = ("prepare_abort(req, 'failed')\n{between}if isinstance(req.finished_reason, {cls}):\n"
                       "    return KVPoll.Failed\nreturn KVPoll.Success")


@pytest.mark.parametrize(("between", "cls", "module", "expected"), [
    # The abort's first statement stores an instance of the class the test names: decided.
    ("", "FINISH_ABORT", ABORTS, {frozenset({"Failed"})}),
    # Another class, the attribute stored again, or a store after an early return: not known.
    ("", "OTHER_REASON", ABORTS, {frozenset({"Failed"}), frozenset({"Success"})}),
    ("req.finished_reason = None\n", "FINISH_ABORT", ABORTS, {frozenset({"Failed"}), frozenset({"Success"})}),
    ("", "FINISH_ABORT", ABORTS.replace("    req.finished_reason = FINISH_ABORT()\n",
                                        "    if message:\n        return\n    req.finished_reason = FINISH_ABORT()\n"),
     {frozenset({"Failed"}), frozenset({"Success"})}),
])
def test_an_abort_stores_its_reason_and_a_later_isinstance_test_reads_it(between: str, cls: str, module: str,
                                                                        expected: set) -> None:
    ends, _ = explore(ABORTED_THEN_TESTED.format(between=between, cls=cls), {"req": frozenset({"@req"})}, module=module)
    assert any(e.kind is EventKind.ABORT for end in ends for e in end.events)
    assert returns(ends) == expected


def test_an_origin_is_where_the_name_is_imported_from_or_defined() -> None:
    index, func, _ = function_f("from .managers.batch import FINISH_ABORT as FA\n\n\nclass Local:\n    pass\n\n\n"
                                "def f():\n    from sglang.srt.other import Thing\n    return FA, Local, Thing\n")
    assert index.origin(func, "FA") == "managers.batch.FINISH_ABORT"  # m.py is at the top of the tree
    assert index.origin(func, "Local") == "m.Local"
    assert index.origin(func, "Thing") == "sglang.srt.other.Thing"
    assert index.origin(func, "Missing") is None
    assert same_origin("managers.batch.FINISH_ABORT", "sglang.srt.managers.batch.FINISH_ABORT")
    assert not same_origin("managers.batch.FINISH_ABORT", "sglang.srt.managers.other_batch.FINISH_ABORT")


@pytest.mark.parametrize(("source", "fresh"), [
    ("def pop(self):\n    s = set()\n    for i, r in enumerate(self.queue):\n        s.add(i)\n", True),
    ("def pop(self, s):\n    for i, r in enumerate(self.queue):\n        s.add(i)\n", False),
    ("def pop(self):\n    s = set(self.stale)\n    for i, r in enumerate(self.queue):\n        s.add(i)\n", False),
    ("def pop(self):\n    s = set()\n    s = self.stale\n    for i, r in enumerate(self.queue):\n        pass\n", False),
    ("def pop(self):\n    s = set()\n    for i, r in enumerate(self.other):\n        s.add(i)\n", False),
])
def test_the_removal_set_is_fresh_only_when_bound_once_to_an_empty_set(source: str, fresh: bool) -> None:
    assert _removal_index(ast.parse(source).body[0], "s", "queue") == (frozenset({"i"}) if fresh else frozenset())


def test_a_helper_that_does_something_keeps_its_paths_apart() -> None:
    body = "budget(req)\n" * 8 + "return p"
    ends, log = explore(body, {"req": frozenset({"@req"}), "p": POLL}, module=LOGGING_HELPER, max_paths=64)
    # Each run logs or not: 2**8 distinct paths that widen() keeps apart. Past the limit fold()
    # makes one of those that read the same to fates, map rows and rules (which log lines ran is
    # not read; whether any did is): a path that logs and one that does not, nothing cut.
    assert not log.truncated
    assert {any(e.kind is EventKind.LOG for e in end.events) for end in ends} == {True, False}
    assert len(ends) <= 64


@pytest.mark.parametrize("test", ["req.rid in s", "self.x.y", "req.a.b == s"])
def test_a_fact_read_no_more_is_forgotten(test: str) -> None:
    """Tested twice (so remembered), then never again: paths that differ only in it are one."""
    body = f"if {test}:\n    a = 1\nif {test}:\n    b = 1\n" + flag_ifs(6) + "return p"
    ends, log = explore(body, {**REQ, "p": POLL})
    assert returns(ends) == {POLL} and log.truncated == []
    assert len(ends) == 1


def test_the_step_budget_ends_the_run_with_a_gap() -> None:
    ends, log = explore("x = KVPoll.Failed\nif req.b:\n    x = KVPoll.Success\n" + flag_ifs(100) + "return x",
                             {"req": frozenset({"@req"})}, max_steps=60)
    [cut] = log.truncated
    assert isinstance(cut, Cut) and cut.kind == "budget"
    # 1 + 1 + 1 steps for the first three statements, then 2 paths (x differs): 4 per `if` (2 for
    # the `if`, 2 for `axN = 1` in its body): the 15th `if` (line 16 + 2 * 14) is past 60.
    assert cut == "m.py:44 (work budget of 60 path steps spent)"
    assert ends and all(end.term is None for end in ends)  # stopped where it was, not returned


def test_the_step_budget_is_a_path_limit_for_a_question_that_gives_up() -> None:
    with pytest.raises(PathLimit):
        explore(flag_ifs(100), {"req": frozenset({"@req"})}, max_steps=60, give_up=True)


def test_a_budget_gap_makes_the_scan_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flow, "MAX_STEPS", 40)
    source = drain(flag_ifs(30, " " * 12) + STANDARD_BRANCHES)
    report = scan_path(write_tree(tmp_path, {"disaggregation/prefill.py": source}))
    assert any(p.kind is ProblemKind.CUT and "work budget of 40 path steps spent" in p.text for p in report.problems), report.problems


def test_a_hundred_flag_tests_in_the_drain_finish_with_exact_fates(tmp_path: Path) -> None:
    """Issue 18: 20 such ifs took 19 s and 1.2 GB, 100 never finished. Generous bounds: this is
    not a benchmark, it fails only when the paths multiply again."""
    root = write_tree(tmp_path, {"disaggregation/prefill.py": drain(flag_ifs(100, " " * 12) + STANDARD_BRANCHES)})
    script = ("import json, sys\nfrom pathlib import Path\nfrom kvtrace.scan import scan_path\n"
              "report = scan_path(Path(sys.argv[1]))\n"
              # VmHWM is this address space's peak; ru_maxrss would carry pytest's over the exec.
              "peak = next(int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
              "print(json.dumps({'fates': {s: f.fate for s, f in report.queues[0].states.items()},"
              " 'problems': [p.text for p in report.problems], 'rss_mb': peak}))")
    done = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["rss_mb"] < 600
    assert result["problems"] == []
    assert result["fates"] == {"Failed": ["leaves"], "Bootstrapping": ["kept"], "WaitingForInput": ["kept"],
                               "Transferring": ["kept"], "Success": ["leaves"]}


def test_flag_tests_read_no_more_keep_the_oracles_fates(tmp_path: Path) -> None:
    """Executed, every assignment of the flags: the fates kvtrace gives with the paths merged are
    the ones the code has (one flag tested again at the end, so one fact must be kept)."""
    program = gen.DrainProgram(body=(gen.If(gen.PollTest("in", ("WaitingForInput", "Transferring", "Bootstrapping")),
                                            (gen.Keep(),), (gen.Release("release_kv_cache"), gen.Done())),))
    files = gen.render_tree(program)
    loop = "        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):\n"
    source = files["disaggregation/prefill.py"]
    assert loop in source
    flags = flag_ifs(8, " " * 12) + "            if req.a3:\n                undone_reqs.append(req)\n                continue\n"
    files["disaggregation/prefill.py"] = source.replace(loop, loop + flags)
    root = gen.write_files(tmp_path, dict(files))
    verdict = oracle.drain_verdict(root)
    report = scan_path(root)
    assert _support.compare_fates(root, report, verdict) == []
    assert verdict.fates["Success"] == ["kept", "leaves"]  # the check can fail: not every state is kept


# --- facts, and what forgets them --------------------------------------------------------

REQ = {"req": frozenset({"@req"}), "s": frozenset({OTHER}), "other": frozenset({OTHER})}
TWICE = "r = 'none'\nif {test}:\n    r = KVPoll.Success\n{between}if {test}:\n    return r\nreturn KVPoll.Failed"
EXACT = {frozenset({"Success"}), frozenset({"Failed"})}
STALE = EXACT | {frozenset({OTHER})}  # the second test goes its own way: 'none' can be returned


@pytest.mark.parametrize(("test", "between", "expected"), [
    ("req.a.b", "", EXACT),
    ("req.a.b", "req = other\n", STALE),  # the chain's root is assigned
    ("req.a.b", "x = other\n", EXACT),  # something else is
    ("self.x.y", "", EXACT),
    ("self.x.y", "self.x = other\n", STALE),  # the chain's first attribute is written
    ("self.x.y", "self.z = other\n", EXACT),
    ("req.rid in s", "", EXACT),
    ("req.rid not in s", "s = other\n", STALE),  # a name the comparison reads is assigned
    ("req.rid != s", "req = other\n", STALE),
    ("req.rid == s", "t = other\n", EXACT),
])
def test_a_fact_holds_until_something_it_reads_is_assigned(test: str, between: str, expected: set[Val]) -> None:
    ends, _ = explore(TWICE.format(test=test, between=between), REQ)
    assert returns(ends) == expected


def test_a_fact_key_reads_its_dependencies() -> None:
    chain = flow.chain_fact("req.a.b")
    assert chain == "?:req.a.b" and chain.kind == "chain" and chain.reads == {("local", "req")}
    compared = flow.comparison_fact("req.rid in rids")
    assert compared.kind == "comparison" and compared.reads == {("word", "req"), ("word", "rid"), ("word", "in"),
                                                                ("word", "rids")}
    again = pickle.loads(pickle.dumps(chain))
    assert again == chain and isinstance(again, flow.FactKey) and again.reads == chain.reads


def test_an_unmodelled_construct_in_a_sender_makes_the_scan_incomplete(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(flow._STATEMENT_HANDLERS, cst.With)
    sender = '''\
from ..base.conn import BaseKVSender, KVPoll


class OkKVSender(BaseKVSender):
    def poll(self):
        with self.lock:
            return self.mgr.status()

    def abort(self):
        self.conclude_state = KVPoll.Failed
'''
    source = drain(STANDARD_BRANCHES)
    report = scan_path(write_tree(tmp_path, {"disaggregation/prefill.py": source, "disaggregation/ok/conn.py": sender}))
    assert any(p.kind is ProblemKind.CUT and p.where == "disaggregation/ok/conn.py:6"
               and "disaggregation/ok/conn.py:6 (With statement not modelled)" in p.text and "ok backend" in p.text
               for p in report.problems), report.problems


# --- one model of the manager --------------------------------------------------------------

@pytest.mark.parametrize("fork", [False, True])
def test_manager_rules_name_the_backends_whose_manager_runs_the_method(fork: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manager rule's finding carries the backends from the one ManagerFacts model (the report
    places it by them, not by folder): a method in the shared base belongs to every backend whose
    manager inherits it, one in a backend's own manager to that backend only. The same when the
    senders are analysed in a forked child (their managers' facts cross back)."""
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0 if fork else 10**12)
    report = scan_path(Path(__file__).resolve().parent.parent / "examples" / "manager-shapes")
    rows = {(f.rule, f.path): f.backends for f in report.findings if f.backend is None and f.queue is None}
    everyone = ("ascend", "mooncake", "mori", "nixl")
    assert rows == {("silent-status-drop", "disaggregation/common/conn.py"): everyone,
                    ("failed-not-sticky", "disaggregation/common/conn.py"): everyone,
                    ("absent-room-default", "disaggregation/nixl/conn.py"): ("nixl",)}


def test_the_status_table_has_one_definition() -> None:
    """The engine's table (Options.table, from the sender analysis) and the rules' table are the
    same reading of the check method: `self.X` indexed by its room parameter, not the first
    subscript it meets."""
    source = ("class M:\n    def check_status(self, room):\n        seen = self.history[0]\n"
              "        return self.request_status.get(room, None)\n")
    data = source.encode()
    module = parse_module(SourceFile("m.py", data, hashlib.sha256(data).hexdigest()))
    assert module is not None
    index = Index([module])
    [cls] = index.classes["M"]
    facts = manager_facts(index, cls, "check_status", "update_status")
    assert (facts.room, facts.table, facts.update) == ("room", "request_status", None)
    [method] = manager_methods(index, "check_status", [facts])
    assert method.table == facts.table and method.backends == ()


# --- problems as records ---------------------------------------------------------------------

def test_the_report_tells_gaps_apart_by_their_fields_not_their_prose() -> None:
    """A backend checked without one of its files and one not checked at all differ in
    `Gap.partial`; the summary reads that, whatever the reason's words."""
    gaps = [Gap(GapKind.BACKEND, "nixl", "checked without nixl/conn.py (not analysed)", partial=True),
            Gap(GapKind.BACKEND, "mori", "mori/conn.py could not be analysed"),
            Gap(GapKind.FILE, "nixl/conn.py", "syntax error"), Gap(GapKind.ANALYSIS, "scan", "path limit reached")]
    assert gap_text(gaps) == ("1 file not analysed, backend mori not checked, backend nixl checked in part, "
                              "1 analysis problem")
    assert json.loads(json.dumps([g.kind for g in gaps])) == ["backend", "backend", "file", "analysis"]
    assert f"{gaps[0].kind}" == "backend"


def test_find_gaps_marks_a_backend_checked_without_a_file_as_partial(tmp_path: Path) -> None:
    write_tree(tmp_path, {"disaggregation/prefill.py": drain(STANDARD_BRANCHES)})
    (tmp_path / "disaggregation" / "nixl").mkdir()
    (tmp_path / "disaggregation" / "nixl" / "broken.py").write_text("def f(:\n")
    report = scan_path(tmp_path)
    [gap] = [g for g in report.gaps if g.kind is GapKind.BACKEND]
    assert (gap.subject, gap.partial) == ("nixl", False)


def test_locals_are_joined_past_the_limit_rather_than_cut() -> None:
    """Ten locals each set one of two ways and all read at the end: 2**10 paths that differ only
    in values holding no role or poll state. Past the limit they are one path whose locals hold
    both values (a join): the last test goes both ways, nothing is cut."""
    body = "".join(f"if req.f{i}:\n    a{i} = 1\nelse:\n    a{i} = None\n" for i in range(10))
    body += "if " + " and ".join(f"a{i}" for i in range(10)) + ":\n    p = KVPoll.Failed\nreturn p"
    ends, log = explore(body, {**REQ, "p": POLL}, max_paths=64)
    assert not log.truncated
    assert returns(ends) == {POLL, frozenset({"Failed"})}


def test_a_sender_run_past_the_limit_joins_its_paths_rather_than_cut_them() -> None:
    """A sender's run (poll(), __init__) keeps its facts below the limit (poll() runs again after
    abort() on them); past it, paths that differ only in facts and plain locals are joined, as a
    drain's are, rather than cut: 2**10 paths that only logged differently are one. Paths whose
    object attributes differ stay apart (the sender's state), and past the limit they are cut."""
    facts_only = "".join(f"if self.kv_mgr.f{i}:\n    x{i} = 1\nelse:\n    x{i} = 2\n" for i in range(10)) + "return p"
    ends, log = explore(facts_only, {"self": frozenset({OTHER}), "p": POLL}, state=None, max_paths=64)
    assert not log.truncated
    assert returns(ends) == {POLL}
    stores = "".join(f"if self.kv_mgr.f{i}:\n    self.a{i} = 1\nelse:\n    self.a{i} = 2\n" for i in range(10)) + "return p"
    _, log = explore(stores, {"self": frozenset({OTHER}), "p": POLL}, state=None, max_paths=64)
    assert log.truncated


def test_a_sender_run_cut_at_the_path_limit_makes_the_scan_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend whose poll() splits into more paths than the limit, each keeping a different
    object state: the paths past it are not followed, so the scan says it is incomplete (a
    path-limit problem naming the line and the backend), never only a note under the backend.
    The limit is lowered to 64 for the senders' runs, so that passing it is quick."""
    import functools
    import shutil

    from kvtrace import backends

    monkeypatch.setattr(backends, "Options", functools.partial(Options, max_paths=64))
    shutil.copytree(EXAMPLES / "nixl-pin", tmp_path / "tree")
    conn = tmp_path / "tree" / "disaggregation" / "nixl" / "conn.py"
    lines = conn.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("def poll(")) + 1
    splits = 8  # 2**8 object states: past the limit
    lines[at:at] = [text for i in range(splits) for text in (
        f"        if self.kv_mgr.f{i}:", f"            self.a{i} = 1", "        else:", f"            self.a{i} = 2")]
    conn.write_text("\n".join(lines) + "\n")
    report = scan_path(tmp_path / "tree")
    limits = [p for p in report.problems if p.kind is ProblemKind.PATH_LIMIT]
    assert limits and all("the nixl backend's analysis is incomplete" in p.text for p in limits), report.problems
    assert any(p.where and p.where.startswith("disaggregation/nixl/conn.py:") for p in limits)
    assert report.incomplete


def test_the_forked_childs_problems_come_back_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender analysis runs beside the queue's, in a forked child, when the tree is big enough
    (here always): what either process could not do comes back as `Problem` records (kind, text,
    path:line) through the cache's JSON codec, not as prose. Both backends' abort() are refused."""
    from kvtrace import pipeline
    from kvtrace.beside import Beside
    from kvtrace.fetch.local import fetch_local
    from kvtrace.model import Problem

    real = cst.parse_module

    def no_abort(source: str, *args: object, **kwargs: object) -> cst.Module:
        if source.lstrip().startswith("def abort("):
            raise cst.ParserSyntaxError("simulated", lines=[source], raw_line=1, raw_column=0)
        return real(source)

    monkeypatch.setattr(cst, "parse_module", no_abort)
    example = Path(__file__).resolve().parent.parent / "examples" / "nixl-pin"
    pack = load_pack()
    fetched = fetch_local(example)
    parsed = pipeline.parse(fetched, pack, None)
    analysed = pipeline.graph(parsed, pipeline.index(parsed, pack, fetched.target), pack, Beside, parallel_min_bytes=0)
    aborts = set()
    for backend in ("mooncake", "nixl"):
        lines = (example / "disaggregation" / backend / "conn.py").read_text().splitlines()
        aborts.add(f"disaggregation/{backend}/conn.py:{next(n for n, t in enumerate(lines, 1) if t.lstrip().startswith('def abort('))}")
    assert all(isinstance(p, Problem) and p.kind is ProblemKind.UNPARSED for p in analysed.problems), analysed.problems
    assert {p.where for p in analysed.problems} == aborts, analysed.problems


def _stripped_whole(events: tuple[flow.Event, ...]) -> tuple[flow.Event, ...]:
    """The reference for widen()'s stripping, written as its definition reads: rebuild the calls
    from the events, then drop the entry of every call in which nothing but entering other helpers
    happened (a call does something when an event other than an entry is seen inside it or inside
    a call it made)."""
    calls: list[tuple[str, int]] = []  # (callee, index of its entry) of the open calls
    busy: set[int] = set()  # entries of calls that did something
    closed: list[int] = []
    for i, event in enumerate(events):
        names = [name for name, _ in calls]
        keep = len(calls) if not calls or names[-1] == event.function else (
            max(n for n, name in enumerate(names, 1) if name == event.function) if event.function in names else 0)
        closed += [at for _, at in calls[keep:]]
        del calls[keep:]
        if event.kind is EventKind.HELPER:
            calls.append((event.detail, i))
        else:
            busy.update(at for _, at in calls)
    closed += [at for _, at in calls]
    idle = set(closed) - busy
    return tuple(e for i, e in enumerate(events) if i not in idle)


@st.composite
def _helper_event_runs(draw: st.DrawFn) -> tuple[flow.Event, ...]:
    """Event sequences shaped as a drain's are: events of the function running, a helper entry (an
    event of the caller naming the callee, which then runs), returns to any caller up the stack
    (the next event is the caller's), recursion (a callee already on the stack) and events of a
    function not on the stack (a run resumed at the drain loop)."""
    names = ["drain", "poll", "check", "release", "log"]
    stack = ["drain"]
    events: list[flow.Event] = []
    for step in draw(st.lists(st.sampled_from(["event", "enter", "return", "elsewhere"]), max_size=40)):
        if step == "enter":
            callee = draw(st.sampled_from(names))
            events.append(flow.Event(EventKind.HELPER, "f.py", len(events) + 1, stack[-1], callee))
            stack.append(callee)
        elif step == "return" and len(stack) > 1:
            del stack[draw(st.integers(1, len(stack) - 1)):]
        elif step == "elsewhere":
            stack = [draw(st.sampled_from(names))]
        else:
            events.append(flow.Event(draw(st.sampled_from([EventKind.CHECK, EventKind.LOG, EventKind.RELEASE])),
                                     "f.py", len(events) + 1, stack[-1], "T"))
    return tuple(events)


@given(_helper_event_runs(), st.lists(st.integers(0, 40), max_size=4))
def test_idle_helper_stripping_carried_forward_equals_stripping_the_whole_sequence(
        events: tuple[flow.Event, ...], cuts: list[int]) -> None:
    """widen() strips a sequence in the events appended to the one it was made from
    (flow._Stripping, carried by _extended): stripped in pieces cut anywhere, it is the whole
    sequence stripped, and the key of equal content is equal (merges read it)."""
    expected = _stripped_whole(events)
    whole = flow._Stripping.EMPTY.advanced(events)
    assert whole.kept.value == expected
    pieces = flow._Stripping.EMPTY
    start = 0
    for cut in sorted(c for c in cuts if c <= len(events)) + [len(events)]:
        pieces = pieces.advanced(events[start:cut])
        start = cut
    assert pieces.kept.value == expected
    assert pieces.kept == whole.kept and hash(pieces.kept) == hash(whole.kept)
    raw = flow._Keyed(events[:len(events) // 2], flow._sequence_hash(events[:len(events) // 2]))
    raw.stripping = flow._Stripping.EMPTY.advanced(raw.value)  # type: ignore[arg-type]
    assert flow._extended(raw, events[len(events) // 2:]).stripping.kept.value == expected  # type: ignore[union-attr]


def test_a_name_is_searched_for_as_the_parser_reads_it() -> None:
    """Index.may_name and Index._mentions answer for identifiers as Python normalizes them
    (NFKC): a file that spells a name with a fullwidth letter names it, and a file outside ASCII
    that does not spell it in any form does not (it used to "may" name everything)."""
    source = ("class Q:\n"
              "    def drain(self):  # a dash — outside ASCII\n"
              "        self.\uff44isagg_queue.append(1)\n"
              "    def other(self):\n"
              "        return 0\n")
    data = source.encode()
    module = parse_module(SourceFile("m.py", data, hashlib.sha256(data).hexdigest()))
    assert module is not None
    index = Index([module])
    assert any(isinstance(n, ast.Attribute) and n.attr == "disagg_queue" for n in ast.walk(module.tree))
    assert index.may_name(module, "disagg_queue")
    assert not index.may_name(module, "prefill_queue")
    drain, other = index.classes["Q"][0].methods["drain"], index.classes["Q"][0].methods["other"]
    assert index._mentions(drain, "disagg_queue")
    assert not index._mentions(other, "disagg_queue")
    assert not index._mentions(drain, "prefill_queue")


def test_a_run_records_only_its_own_threads_attribute_reads() -> None:
    """What a run touched decides which other starts it serves (StartedRun, the helper-run
    memo): a read made meanwhile by another thread's scan must not count for it, nor its
    bookkeeping pop another thread's run."""
    import threading

    path = PathState(attrs=(("mine", frozenset({"x"})), ("theirs", frozenset({"y"}))))
    inside, read = threading.Event(), threading.Event()
    other_touched: list[frozenset[str]] = []

    def other_thread() -> None:
        inside.wait()
        with flow.recording_touched() as touched:
            path.attr("theirs")
        other_touched.append(frozenset(touched))
        read.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with flow.recording_touched() as touched:
        inside.set()
        assert read.wait(10)
        value = path.attr("mine")
    thread.join()
    assert value == frozenset({"x"})
    assert touched == frozenset({"mine"})
    assert other_touched == [frozenset({"theirs"})]


def test_a_started_run_serves_a_start_that_differs_only_in_untouched_keys() -> None:
    start = (("a", frozenset({"1"})), ("b", frozenset({"2"})))
    end = PathState(attrs=(("a", frozenset({"3"})), ("b", frozenset({"2"}))), term="return", ret=frozenset({"Success"}))
    run = flow.StartedRun(start, frozenset({"a"}), (end,))
    other = (("a", frozenset({"1"})), ("b", frozenset({"9"})), ("c", frozenset({"4"})))
    assert run.serves(dict(other))
    assert not run.serves(dict((("a", frozenset({"5"})), ("b", frozenset({"2"})))))
    assert not run.serves({"b": frozenset({"2"})})  # `a` absent: another start
    [moved] = run.ends_from(other)
    assert moved.attrs == (("a", frozenset({"3"})), ("b", frozenset({"9"})), ("c", frozenset({"4"})))
    assert (moved.term, moved.ret, moved.events) == (end.term, end.ret, end.events)
