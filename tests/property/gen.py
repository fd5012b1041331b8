"""Generated fixture trees for the property tests: a small IR, its renderer, hypothesis strategies.

Two kinds of programs are generated, both rendered as files of a `disaggregation/` package:

* drain loops (`DrainProgram`): the body of `for req, poll in zip(self.disagg_prefill_inflight_queue,
  polls):` in `prefill.py`, built from if/elif/else over the poll value (==, !=, is, is not, in,
  not in over tuples, lists and sets, `and`/`or`/`not`, an alias `state = poll`), conditions on
  free flags, continue, break, return, raise, assert, try/except around a call that may fail,
  appends to the kept list, the finished list and another list of self, release and abort calls,
  neutral statements (one named like a release that matches no pattern), and helper methods of
  self (with or without the poll value as a parameter, positional or keyword, returning a bool
  used in a condition or called for their effects); optionally `match` and module-level tuples;
* sender trees (`SenderTree`): `BaseKVSender` in base/conn.py, an optional `CommonKVSender` in
  common/conn.py and one concrete `<Folder>KVSender` per backend folder (optionally through an
  intermediate class), with poll() in the base class, overrides (with and without
  `super().poll()`), abort() writing an abort attribute (a KVPoll member or a bool, directly or in
  a helper), reads of that attribute (direct or through a helper a backend may override), timeout
  checks (inline, inverted, in a helper, on elapsed time or a deadline, any clock) and
  flag-dependent reshaping of the status (holding Success as Transferring, a missing room, ...).

Invariants the oracle relies on (and checks where it can; see oracle.py):

* Every flag is a distinct attribute name (except the repeats of feature `repeat_flags`: the same
  test of a flag of the loop, or its negation, which kvtrace decides once per path), and each
  site that reads one is executed at most once per iteration of the drain loop (each helper is called from exactly one site; there are no inner
  loops; a call that may fail is always the last statement of a try body, see FailCall). So every syntactic path is feasible for some flag assignment, which is what makes the
  oracle's "set of outcomes over all flag assignments" comparable with kvtrace's "both branches of
  a condition that is not about the poll value are possible".
* Sender trees come in two worlds. Without a manager (the oracle fakes one that answers a fixed
  state and ignores updates), abort() assigns one attribute of self. With a real manager
  (`ManagerDef`: `CommonKVManager` with a status table, its check_status/update_status/
  record_failure variants, transfer "threads" that store states or pop the room (methods, or
  closures started with threading.Thread, which the oracle runs inline), and one
  `<Folder>KVManager` per backend, paired by folder, `__init__` annotation or a factory dict),
  the oracle executes the real classes: every table content a run can reach is tried, then
  abort() (through super(), `Base.abort(self)`, a module function, or only the manager) or the
  clock past every deadline, and poll() again. See `ManagerDef` and oracle.sender_verdicts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

# The poll enum of every generated tree, in the order of its values.
STATES: tuple[str, ...] = ("Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success")
TERMINAL: tuple[str, ...] = ("Success", "Failed")
NON_TERMINAL: tuple[str, ...] = tuple(s for s in STATES if s not in TERMINAL)
OUTCOMES: tuple[str, ...] = ("kept", "leaves", "raises", "dropped")

DRAIN_CLASS = "SchedulerDisaggregationPrefillMixin"
DRAIN_METHOD = "process_disagg_prefill_inflight_queue"
QUEUE_ATTR = "disagg_prefill_inflight_queue"
KEEP_LIST = "undone_reqs"
DONE_LIST = "done_reqs"

# ---------------------------------------------------------------------------------------------
# Example budgets and hypothesis settings (applied per test with @settings(parent=...), never
# loaded globally, so other hypothesis tests in the session keep their own settings).

SLOW = os.environ.get("KVTRACE_SLOW", "") not in ("", "0")
# Multiplies every example count (e.g. 1.5 on a fast CI runner, 0.3 for a quick local run).
SCALE = float(os.environ.get("KVTRACE_PROPERTY_SCALE", "1") or 1)


def budget(ci: int, slow: int) -> settings:
    """Settings for one property: `ci` examples by default (derandomized, no database, so a CI
    run is reproducible), `slow` examples with KVTRACE_SLOW=1 (random, with the database).
    Both are scaled by KVTRACE_PROPERTY_SCALE."""
    ci, slow = max(1, round(ci * SCALE)), max(1, round(slow * SCALE))
    common = dict(
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
        print_blob=True,
    )
    if SLOW:
        return settings(max_examples=slow, **common)
    return settings(max_examples=ci, derandomize=True, database=None, **common)


# ---------------------------------------------------------------------------------------------
# Drain-loop IR


@dataclass(frozen=True)
class PollTest:
    """A condition on the poll value; `op` in ==, !=, is, is not, in, not in."""

    op: str
    states: tuple[str, ...]
    container: str = "tuple"  # in / not in: tuple | list | set | const (a module-level tuple)
    reverse: bool = False  # ==, !=: `KVPoll.X == poll`
    var: str | None = None  # compare this alias of the poll value (DrainProgram.alias)


@dataclass(frozen=True)
class FlagTest:
    """A condition on a free flag: an attribute of `req` or `self` nothing else reads.

    The oracle's fakes answer a flag with None or ANY (truthy, equal to everything), so every
    shape below can go both ways."""

    owner: str  # req | self
    name: str
    shape: str  # truthy | not | is None | is not None | eq | ne | poll_eq (`poll == req.<flag>`)


@dataclass(frozen=True)
class CallTest:
    """`self.<helper>(req[, poll])` used as a condition (its return value)."""

    helper: "Helper"
    negate: bool = False


@dataclass(frozen=True)
class ParamTest:
    """A test of the drain's `rids_to_check` parameter (pipeline-parallel consensus):
    set: `rids_to_check is not None`; unset: `rids_to_check is None`; waiting: `rids_to_check is
    not None and req.rid not in rids_to_check`; agreed: `... and req.rid in rids_to_check`;
    rid_not_in / rid_in: the membership alone (only where the parameter is known to be set)."""

    shape: str


@dataclass(frozen=True)
class NotTest:
    operand: "Cond"


@dataclass(frozen=True)
class BoolTest:
    op: str  # and | or
    operands: tuple["Cond", ...]


Cond = Union[PollTest, FlagTest, CallTest, NotTest, BoolTest, ParamTest]


@dataclass(frozen=True)
class Keep:
    """`undone_reqs.append(req)`: the list assigned back to the queue."""


@dataclass(frozen=True)
class Done:
    """`done_reqs.append(req)`."""


@dataclass(frozen=True)
class Release:
    kind: str  # see RELEASE_KINDS


@dataclass(frozen=True)
class Abort:
    kind: str = "plain"  # plain | status


@dataclass(frozen=True)
class Neutral:
    kind: str  # see NEUTRAL_KINDS


@dataclass(frozen=True)
class Continue:
    pass


@dataclass(frozen=True)
class Break:
    pass


@dataclass(frozen=True)
class Return:
    """`return done_reqs` inside the drain loop (the queue is not reassigned)."""


@dataclass(frozen=True)
class Raise:
    kind: str = "runtime"  # runtime | value


@dataclass(frozen=True)
class Assert:
    cond: Cond


@dataclass(frozen=True)
class If:
    cond: Cond
    body: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...] = ()  # a single If here renders as elif


@dataclass(frozen=True)
class Call:
    """`self.<helper>(req[, poll])` as a statement (return value ignored)."""

    helper: "Helper"


@dataclass(frozen=True)
class HReturn:
    """`return <value>` inside a helper: True, False, None (bare return) or a condition."""

    value: Union[bool, None, Cond]


@dataclass(frozen=True)
class Requeue:
    """`self.waiting_queue.append(req)`: another list than the queue (leaves)."""


@dataclass(frozen=True)
class FailCall:
    """`req.disagg_kv_sender.<name>()`, which raises or not (a free flag). Only ever the last
    statement of a try body, whose handler catches it: kvtrace takes an unknown call as not
    raising, and routes a try body's normal exits to its handlers, which is exact exactly then."""

    name: str


@dataclass(frozen=True)
class Try:
    """try: <body> except Exception as exc: <handler>"""

    body: tuple["Stmt", ...]
    handler: tuple["Stmt", ...]


@dataclass(frozen=True)
class Match:
    """match <poll>: case KVPoll.A | KVPoll.B: ... [case _: ...] (optional feature "match")."""

    arms: tuple[tuple[tuple[str, ...], tuple["Stmt", ...]], ...]
    default: tuple["Stmt", ...] | None = None


Stmt = Union[
    Keep, Done, Requeue, Release, Abort, Neutral, Continue, Break, Return, Raise, Assert, If, Call, HReturn, FailCall, Try, Match
]


@dataclass(frozen=True)
class Helper:
    name: str
    poll_param: str | None  # None: (self, req); else the parameter that receives the poll value
    keyword: bool  # the call passes the poll value by keyword
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class DrainProgram:
    body: tuple[Stmt, ...]
    # `for req in done_reqs: maybe_release_metadata_buffer(...)` after the drain loop: releases
    # outside the loop must not count for the loop's iterations.
    post_loop_release: bool = False
    empty_guard: bool = True  # `if len(self.<queue>) == 0: return []` before polling
    alias: str | None = None  # `<alias> = poll` first in the loop; PollTest.var may use it
    # `def <drain>(self, rids_to_check=None)` when True; `callers` are methods of the class that
    # call the drain: "none" (no argument), "keyword" (rids_to_check=...), "positional".
    param: bool = False
    callers: tuple[str, ...] = ()
    # managers/scheduler.py composes the drain's class (SGLang's Scheduler does): the object's
    # class and so every caller is in view. False: it is assembled outside the tree, so code out
    # of view may call the drain with any rids_to_check (a free parameter, issue 23).
    composed: bool = True


RELEASE_KINDS = ("release_kv_cache", "cache_finished_req", "metadata_buffer", "allocator_free")
NEUTRAL_KINDS = ("log", "set_reason", "send_chunk", "release_lock")
FLAG_SHAPES = ("truthy", "not", "is None", "is not None", "eq", "ne")
FAIL_CALLS = ("failure_exception", "raise_if_failed", "check_transfer_error")
POLL_ALIASES = ("state", "status", "poll_state")

REQ_FLAGS = (
    "pending_bootstrap",
    "return_routed_experts",
    "is_retracted",
    "is_chunked",
    "return_logprob",
    "grammar_ready",
    "bootstrap_failed",
    "session_closed",
)
SELF_FLAGS = (
    "enable_overlap",
    "is_last_pp_rank",
    "optimistic_prefill",
    "enable_metrics",
    "defer_release",
    "waiting_queue_full",
)
HELPER_NAMES = (
    "_handle_pending_bootstrap",
    "_handle_transfer_failure",
    "_finish_transfer",
    "_check_consensus",
    "_maybe_requeue",
    "_conclude",
)
POLL_PARAMS = ("poll", "state", "status")
MODE_PARAM = "rids_to_check"
CALLER_KINDS = ("none", "keyword", "positional")
# Shapes of one flag that read the same fact (a repeated test must be one of the same family).
FLAG_FAMILIES = {"truthy": "truth", "not": "truth", "is None": "none", "is not None": "none", "eq": "eq", "ne": "eq"}

TERMINATORS = (Continue, Break, Return, Raise)

# Attributes the oracle's fakes define; flags must never use these names.
RESERVED_REQ_ATTRS = frozenset({"disagg_kv_sender", "rid", "metadata_buffer_index", "finished_reason"})
RESERVED_SELF_ATTRS = frozenset(
    {QUEUE_ATTR, "tree_cache", "group", "req_to_metadata_buffer_idx_allocator", "send_kv_chunk", "release_lock", "waiting_queue"}
)


# ---------------------------------------------------------------------------------------------
# Rendering


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def emit(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _state_ref(state: str) -> str:
    return f"KVPoll.{state}"


def render_cond(cond: Cond, pollvar: str | None) -> str:
    """Render a condition; the result is always safe to embed as an operand (parenthesised)."""
    if isinstance(cond, PollTest):
        assert pollvar is not None, "poll test without a poll variable in scope"
        pollvar = cond.var or pollvar
        if cond.op in ("in", "not in"):
            items = ", ".join(_state_ref(s) for s in cond.states)
            if cond.container == "const":
                coll = const_name(cond.states)
            elif cond.container == "list":
                coll = f"[{items}]"
            elif cond.container == "set" and cond.states:
                coll = "{" + items + "}"
            elif len(cond.states) == 1:
                coll = f"({items},)"
            else:
                coll = f"({items})"
            return f"{pollvar} {cond.op} {coll}"
        (state,) = cond.states
        if cond.reverse:
            return f"{_state_ref(state)} {cond.op} {pollvar}"
        return f"{pollvar} {cond.op} {_state_ref(state)}"
    if isinstance(cond, FlagTest):
        ref = f"{cond.owner}.{cond.name}"
        return {
            "truthy": ref,
            "not": f"not {ref}",
            "is None": f"{ref} is None",
            "is not None": f"{ref} is not None",
            "eq": f'{ref} == "prefill_complete"',
            "ne": f'{ref} != "prefill_complete"',
            "poll_eq": f"{pollvar} == {ref}",
        }[cond.shape]
    if isinstance(cond, ParamTest):
        return {
            "set": f"{MODE_PARAM} is not None",
            "unset": f"{MODE_PARAM} is None",
            "waiting": f"{MODE_PARAM} is not None and req.rid not in {MODE_PARAM}",
            "agreed": f"{MODE_PARAM} is not None and req.rid in {MODE_PARAM}",
            "rid_not_in": f"req.rid not in {MODE_PARAM}",
            "rid_in": f"req.rid in {MODE_PARAM}",
        }[cond.shape]
    if isinstance(cond, CallTest):
        call = render_call(cond.helper, pollvar)
        return f"not {call}" if cond.negate else call
    if isinstance(cond, NotTest):
        return f"not ({render_cond(cond.operand, pollvar)})"
    if isinstance(cond, BoolTest):
        return f" {cond.op} ".join(f"({render_cond(c, pollvar)})" for c in cond.operands)
    raise TypeError(cond)


def const_name(states: tuple[str, ...]) -> str:
    return "_POLL_SET_" + ("_".join(s.upper() for s in states) or "EMPTY")


def render_call(helper: Helper, pollvar: str | None) -> str:
    if helper.poll_param is None:
        return f"self.{helper.name}(req)"
    assert pollvar is not None
    if helper.keyword:
        return f"self.{helper.name}(req, {helper.poll_param}={pollvar})"
    return f"self.{helper.name}(req, {pollvar})"


def _render_block(out: _Out, stmts: tuple[Stmt, ...], indent: int, pollvar: str | None) -> None:
    if not stmts:
        out.emit(indent, "pass")
        return
    for stmt in stmts:
        _render_stmt(out, stmt, indent, pollvar)


def _render_stmt(out: _Out, s: Stmt, indent: int, pollvar: str | None) -> None:
    if isinstance(s, Keep):
        out.emit(indent, f"{KEEP_LIST}.append(req)")
    elif isinstance(s, Done):
        out.emit(indent, f"{DONE_LIST}.append(req)")
    elif isinstance(s, Requeue):
        out.emit(indent, "self.waiting_queue.append(req)")
    elif isinstance(s, FailCall):
        out.emit(indent, f"req.disagg_kv_sender.{s.name}()")
    elif isinstance(s, Try):
        out.emit(indent, "try:")
        _render_block(out, s.body, indent + 1, pollvar)
        out.emit(indent, "except Exception as exc:")
        out.emit(indent + 1, 'logger.debug("transfer error: %s", exc)')
        _render_block(out, s.handler, indent + 1, pollvar)
    elif isinstance(s, Match):
        out.emit(indent, f"match {pollvar}:")
        for states, block in s.arms:
            out.emit(indent + 1, "case " + " | ".join(_state_ref(x) for x in states) + ":")
            _render_block(out, block, indent + 2, pollvar)
        if s.default is not None:
            out.emit(indent + 1, "case _:")
            _render_block(out, s.default, indent + 2, pollvar)
    elif isinstance(s, Release):
        out.emit(
            indent,
            {
                "release_kv_cache": "release_kv_cache(req, self.tree_cache)",
                "cache_finished_req": "self.tree_cache.cache_finished_req(req)",
                "metadata_buffer": "maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)",
                "allocator_free": "self.req_to_metadata_buffer_idx_allocator.free(req.metadata_buffer_index)",
            }[s.kind],
        )
    elif isinstance(s, Abort):
        if s.kind == "status":
            out.emit(indent, 'prepare_abort(req, "KV transfer failed", status_code=500)')
        else:
            out.emit(indent, 'prepare_abort(req, "KV transfer failed")')
    elif isinstance(s, Neutral):
        out.emit(
            indent,
            {
                "log": 'logger.debug("request %s polled", req.rid)',
                "set_reason": "req.finished_reason = None",
                "send_chunk": "self.send_kv_chunk(req, last_chunk=True)",
                # Named like a release but matching none of the pack's release patterns.
                "release_lock": "self.release_lock(req)",
            }[s.kind],
        )
    elif isinstance(s, Continue):
        out.emit(indent, "continue")
    elif isinstance(s, Break):
        out.emit(indent, "break")
    elif isinstance(s, Return):
        out.emit(indent, f"return {DONE_LIST}")
    elif isinstance(s, Raise):
        if s.kind == "value":
            out.emit(indent, 'raise ValueError("inconsistent transfer state")')
        else:
            shown = "{" + pollvar + "}" if pollvar else "?"
            out.emit(indent, f'raise RuntimeError(f"Unexpected poll state {shown} for req {{req.rid}}")')
    elif isinstance(s, Assert):
        out.emit(indent, f"assert {render_cond(s.cond, pollvar)}")
    elif isinstance(s, If):
        out.emit(indent, f"if {render_cond(s.cond, pollvar)}:")
        _render_block(out, s.body, indent + 1, pollvar)
        orelse = s.orelse
        while len(orelse) == 1 and isinstance(orelse[0], If):
            inner = orelse[0]
            out.emit(indent, f"elif {render_cond(inner.cond, pollvar)}:")
            _render_block(out, inner.body, indent + 1, pollvar)
            orelse = inner.orelse
        if orelse:
            out.emit(indent, "else:")
            _render_block(out, orelse, indent + 1, pollvar)
    elif isinstance(s, Call):
        out.emit(indent, render_call(s.helper, pollvar))
    elif isinstance(s, HReturn):
        if s.value is None:
            out.emit(indent, "return")
        elif s.value is True or s.value is False:
            out.emit(indent, f"return {s.value}")
        else:
            out.emit(indent, f"return {render_cond(s.value, pollvar)}")
    else:
        raise TypeError(s)


def iter_helpers(stmts: tuple[Stmt, ...]):
    """Every helper reachable from `stmts`, depth first, in source order (each exactly once:
    helpers are never shared between call sites)."""
    for s in stmts:
        yield from _helpers_of_stmt(s)


def _helpers_of_cond(c: Cond):
    if isinstance(c, CallTest):
        yield c.helper
        yield from iter_helpers(c.helper.body)
    elif isinstance(c, NotTest):
        yield from _helpers_of_cond(c.operand)
    elif isinstance(c, BoolTest):
        for o in c.operands:
            yield from _helpers_of_cond(o)


def child_blocks(s: Stmt) -> list[tuple[Stmt, ...]]:
    if isinstance(s, If):
        return [s.body, s.orelse]
    if isinstance(s, Try):
        return [s.body, s.handler]
    if isinstance(s, Match):
        return [b for _, b in s.arms] + ([s.default] if s.default is not None else [])
    return []


def _helpers_of_stmt(s: Stmt):
    if isinstance(s, If):
        yield from _helpers_of_cond(s.cond)
    for block in child_blocks(s):
        yield from iter_helpers(block)
    if isinstance(s, Assert):
        yield from _helpers_of_cond(s.cond)
    elif isinstance(s, HReturn) and s.value not in (None, True, False):
        yield from _helpers_of_cond(s.value)
    elif isinstance(s, Call):
        yield s.helper
        yield from iter_helpers(s.helper.body)


def _walk_stmts(stmts: tuple[Stmt, ...]):
    """Statements of a body, nested blocks included (not helpers' bodies)."""
    for s in stmts:
        yield s
        for block in child_blocks(s):
            yield from _walk_stmts(block)


def iter_conds(stmts: tuple[Stmt, ...]):
    """Every condition (and sub-condition) in `stmts` and the helpers they call."""
    for s in _walk_stmts(stmts):
        top = []
        if isinstance(s, (If, Assert)):
            top.append(s.cond)
        elif isinstance(s, HReturn) and s.value not in (None, True, False):
            top.append(s.value)
        elif isinstance(s, Call):
            yield from iter_conds(s.helper.body)
        for c in top:
            yield from _sub_conds(c)


def _sub_conds(c: Cond):
    yield c
    if isinstance(c, CallTest):
        yield from iter_conds(c.helper.body)
    elif isinstance(c, NotTest):
        yield from _sub_conds(c.operand)
    elif isinstance(c, BoolTest):
        for o in c.operands:
            yield from _sub_conds(o)


def render_prefill(program: DrainProgram) -> str:
    out = _Out()
    out.lines += [
        '"""Prefill side of PD disaggregation (generated by kvtrace\'s property tests)."""',
        "",
        "from __future__ import annotations",
        "",
        "import logging",
        "from typing import List",
        "",
        "from .base.conn import KVPoll",
        "from .utils import (",
        "    maybe_release_metadata_buffer,",
        "    poll_and_all_reduce,",
        "    prepare_abort,",
        "    release_kv_cache,",
        ")",
        "",
        "logger = logging.getLogger(__name__)",
        "",
    ]
    consts = {}
    for c in iter_conds(program.body):
        if isinstance(c, PollTest) and c.container == "const":
            consts[const_name(c.states)] = c.states
    for name, states in consts.items():
        items = ", ".join(_state_ref(x) for x in states)
        out.lines.append(f"{name} = ({items}{',' if len(states) == 1 else ''})")
    out.lines += [
        "",
        "",
        f"class {DRAIN_CLASS}:",
        f"    def {DRAIN_METHOD}(self{f', {MODE_PARAM}=None' if program.param else ''}) -> List:",
    ]
    if program.empty_guard:
        out.emit(2, f"if len(self.{QUEUE_ATTR}) == 0:")
        out.emit(3, "return []")
        out.emit(0, "")
    out.emit(2, f"{DONE_LIST} = []")
    out.emit(2, "polls = poll_and_all_reduce(")
    out.emit(3, f"[req.disagg_kv_sender for req in self.{QUEUE_ATTR}],")
    out.emit(3, "self.group,")
    out.emit(2, ")")
    out.emit(2, f"{KEEP_LIST}: List = []")
    out.emit(2, f"for req, poll in zip(self.{QUEUE_ATTR}, polls):")
    if program.alias:
        out.emit(3, f"{program.alias} = poll")
    _render_block(out, program.body, 3, "poll")
    out.emit(0, "")
    if program.post_loop_release:
        out.emit(2, f"for req in {DONE_LIST}:")
        out.emit(3, "maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)")
        out.emit(0, "")
    out.emit(2, f"self.{QUEUE_ATTR} = {KEEP_LIST}")
    out.emit(2, f"return {DONE_LIST}")
    for i, kind in enumerate(program.callers):
        out.emit(0, "")
        out.emit(1, f"def event_loop_{i}(self):")
        argument = {"none": "", "keyword": f"{MODE_PARAM}=self.prev_rank_rids", "positional": "self.prev_rank_rids"}[kind]
        out.emit(2, f"self.{DRAIN_METHOD}({argument})")
    for helper in iter_helpers(program.body):
        out.emit(0, "")
        params = "self, req" if helper.poll_param is None else f"self, req, {helper.poll_param}: KVPoll"
        returns_value = any(isinstance(s, HReturn) and s.value is not None for s in _walk_stmts(helper.body))
        out.emit(1, f"def {helper.name}({params}){' -> bool' if returns_value else ''}:")
        _render_block(out, helper.body, 2, helper.poll_param)
    return out.text()


BASE_CONN = '''\
"""Base classes of the KV transfer (generated by kvtrace's property tests)."""

from abc import ABC, abstractmethod


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class BaseKVManager(ABC):
    """The transfer manager behind every sender (its status table says where each room is)."""


class BaseKVSender(ABC):
    @abstractmethod
    def poll(self) -> KVPoll:
        ...

    @abstractmethod
    def abort(self):
        ...
'''

UTILS = '''\
"""Helpers of the disaggregation package (generated by kvtrace's property tests)."""


def poll_and_all_reduce(pollers, group):
    # A single rank: the all-reduce (minimum over the group) is the identity.
    return [poller.poll() for poller in pollers]


def release_kv_cache(req, tree_cache):
    tree_cache.cache_finished_req(req)


def maybe_release_metadata_buffer(req, allocator):
    if req.metadata_buffer_index is not None:
        allocator.free(req.metadata_buffer_index)


def prepare_abort(req, error_message, status_code=None):
    req.finished_reason = (error_message, status_code)
'''


# ---------------------------------------------------------------------------------------------
# Sender IR
#
# What the generator keeps to (the oracle relies on it): a flag is read at most once per poll();
# a cached Success is never read back past a "hold" that turned it into Transferring (the cache
# comes after the hold); manager threads take only a room (the oracle runs them as threads), and
# a method taking a status is only run by its callers. Without a manager, the fake one answers a
# fixed state and ignores update_status (the "room already cleared" case of the background).

STATE_ATTRS = ("conclude_state", "_final_state")  # None until concluded; abort sets Failed
BOOL_ATTRS = ("aborted", "_abort_requested")  # False until abort sets True
TIMEOUT_FORMS = ("elapsed_ge", "elapsed_gt", "rev_lt", "rev_le", "deadline", "deadline_rev", "elapsed_var")
CLOCKS = ("time", "monotonic", "perf_counter")
TIMEOUT_ATTRS = ("bootstrap_timeout", "waiting_timeout")
# Bounds named like nothing a name match would find (issue 7, item 4).
ODD_TIMEOUT_ATTRS = ("bootstrap_time_out", "deadline_s", "max_wait")
MGR_FLAGS = (
    "staging_outstanding",
    "defer_decode_allocation",
    "room_missing",
    "reports_transfer_latency",
    "is_dummy_cp_rank",
    "use_staging",
)
BACKEND_FOLDERS = ("mooncake", "nixl", "ascend", "mori", "mock", "tcp")
READ_HELPERS = ("_concluded", "_is_aborted")
TIMEOUT_HELPERS = ("_check_bootstrap_timeout", "_check_waiting_timeout")


@dataclass(frozen=True)
class Timeout:
    form: str  # TIMEOUT_FORMS; "inverted" comparisons are chosen by `inverted`
    clock: str
    attr: str
    inverted: bool = False  # `if <not expired>: return status` then `return KVPoll.Failed`
    on_mgr: bool = False  # the bound is the manager's (`self.kv_mgr.<attr>`), as in SGLang


@dataclass(frozen=True)
class AbortRead:
    attr: str
    via_helper: str | None = None
    position: str = "top"  # top | after_source
    log_only: bool = False  # `if self.<attr>: logger.info(...)`: read, but no terminal state from it


@dataclass(frozen=True)
class SStep:
    """One statement group of poll() after the status is known."""

    kind: str  # timeout | timeout_helper | param_helper | timeout_log | hold | missing | neutral | cache
    guard: tuple[str, ...] = ()  # timeout: only when status is one of these (() = always)
    guard_form: str = "eq"  # eq | in | list
    timeout: Timeout | None = None
    helper: str | None = None  # timeout_helper / param_helper: the method called
    flag: str = ""
    attr: str = ""  # cache: the state attribute; timeout: also set this attr to Failed ("" = no)
    record: bool = False  # timeout: call kv_mgr.record_failure first
    # timeout with a guard: where the status test sits. "outer": `if <guard>:` around the
    # deadline; "and": `if <deadline> and <guard>:`; "inner": `if <deadline>:` then `if <guard>:`
    # (a deadline that covers only the guarded states, issue 23).
    guard_place: str = "outer"


@dataclass(frozen=True)
class PollDef:
    source: str  # check_status | super
    read: AbortRead | None
    steps: tuple[SStep, ...]


@dataclass(frozen=True)
class AbortDef:
    attr: str  # "" = abort() writes no attribute of the sender (form "mgr")
    record: bool = True
    update: bool = False
    via: str | None = None  # abort() calls self.<via>(), which assigns the attribute
    # How the work is reached: "direct" (abort's own body), "super" (`super().abort()` then the
    # rest), "base" (`CommonKVSender.abort(self)`), "module" (a module function given `self`),
    # "mgr" (only the manager hears of it: update_status / record_failure, no attribute).
    form: str = "direct"


@dataclass(frozen=True)
class HelperDef:
    name: str
    role: str  # read | timeout | param (`_expired(self, status)`: a deadline for the states in `guard`)
    attr: str = ""  # read: the attribute read
    guard: tuple[str, ...] = ()  # param: the states of the parameter the deadline applies to
    timeout: Timeout | None = None
    disabled: bool = False  # read: `return False`; timeout: `return None`


@dataclass(frozen=True)
class SenderClass:
    name: str
    parent: str  # BaseKVSender | CommonKVSender
    has_init: bool
    poll: PollDef | None
    abort: AbortDef | None
    helpers: tuple[HelperDef, ...] = ()
    # The body lives in an intermediate class of the backend file, the backend only inherits:
    # "" (none), "Base" (`Base<Folder>Sender`, excluded by the pack) or "_" (`_<Folder>Base`).
    intermediate: str = ""


@dataclass(frozen=True)
class ThreadDef:
    """A method of the manager with a room as its only parameter: a transfer or bootstrap thread
    (any interleaving), modelled by what it stores in the status table."""

    name: str
    # (state, how, guard flag): how in update (`self.update_status(room, X)`), direct
    # (`self.request_status[room] = X`), helper (`self._store(room, X)`, a method whose
    # parameter is bound at its call sites), setdefault; a guard flag "" = always.
    stores: tuple[tuple[str, str, str], ...]
    clear: str = ""  # "" | pop | del: the room leaves the table at the end (after the last chunk)
    clear_flag: str = ""
    # A closure: `start_<name>(self, room)` defines `<name>()`, which reads `self` and `room`
    # from the enclosing scope, and starts it with threading.Thread(target=<name>).
    closure: bool = False


@dataclass(frozen=True)
class ManagerDef:
    """`CommonKVManager` in common/conn.py, one `<Folder>KVManager` per backend."""

    check: str  # subscript | get | in_check  (`table[room]`, `.get(room, D)`, `room not in table: return D`)
    default: str  # the state D an absent room reads as (get / in_check)
    update: str  # plain | sglang | noop_absent | max | no_overwrite_failed
    record: str  # plain | fails (record_failure also stores Failed)
    threads: tuple[ThreadDef, ...]
    register: str  # how the sender's __init__ registers the room: update | direct | none | dummy
    sender_clear: bool  # the sender's clear() pops the room
    # A backend's manager with its own check_status: (folder, check, default).
    overrides: tuple[tuple[str, str, str], ...] = ()
    pairing: str = "folder"  # folder | annotation | mapping: how kvtrace can tell the pair
    shared: tuple[str, ...] = ()  # mapping: backends that use CommonKVManager itself (no class of their own)


@dataclass(frozen=True)
class SenderTree:
    common: SenderClass | None
    backends: tuple[tuple[str, SenderClass], ...]
    manager: ManagerDef | None = None


def _cmp(timeout: Timeout, subject: str = "self") -> tuple[list[str], str]:
    """(statements before, comparison) that is true when the timeout has expired, or not
    expired when `timeout.inverted`."""
    now = f"time.{timeout.clock}()"
    elapsed = f"{now} - {subject}.init_time"
    a = f"{subject}.kv_mgr.{timeout.attr}" if timeout.on_mgr else f"{subject}.{timeout.attr}"
    inv = timeout.inverted
    form = timeout.form
    if form == "elapsed_ge":
        return [], f"{elapsed} {'<' if inv else '>='} {a}"
    if form == "elapsed_gt":
        return [], f"{elapsed} {'<=' if inv else '>'} {a}"
    if form == "rev_lt":
        return [], f"{a} {'>=' if inv else '<'} {elapsed}"
    if form == "rev_le":
        return [], f"{a} {'>' if inv else '<='} {elapsed}"
    if form == "deadline":
        return [], f"{now} {'<=' if inv else '>'} {subject}.transfer_deadline"
    if form == "deadline_rev":
        return [], f"{subject}.transfer_deadline {'>' if inv else '<='} {now}"
    if form == "elapsed_var":
        return [f"elapsed = {elapsed}"], f"elapsed {'<' if inv else '>='} {a}"
    raise ValueError(form)


def _guard(step: SStep | HelperDef, var: str = "status") -> str:
    guard = step.guard
    form = getattr(step, "guard_form", "eq")
    if len(guard) == 1 and form == "eq":
        return f"{var} == {_state_ref(guard[0])}"
    items = ", ".join(_state_ref(s) for s in guard)
    if form == "list":
        return f"{var} in [{items}]"
    return f"{var} in ({items},)" if len(guard) == 1 else f"{var} in ({items})"


def _render_read(out: _Out, read: AbortRead, indent: int) -> None:
    if read.via_helper:
        # Always Failed: a backend may override the helper to look at another attribute.
        out.emit(indent, f"if self.{read.via_helper}():")
        out.emit(indent + 1, "return KVPoll.Failed")
    elif read.log_only:
        test = f"self.{read.attr} is not None" if read.attr in STATE_ATTRS else f"self.{read.attr}"
        out.emit(indent, f"if {test}:")
        out.emit(indent + 1, 'logger.info("room %s: abort requested", self.bootstrap_room)')
    elif read.attr in STATE_ATTRS:
        out.emit(indent, f"if self.{read.attr} is not None:")
        out.emit(indent + 1, f"return self.{read.attr}")
    else:
        out.emit(indent, f"if self.{read.attr}:")
        out.emit(indent + 1, "return KVPoll.Failed")


def _render_step(out: _Out, step: SStep, indent: int) -> None:
    if step.kind in ("timeout", "timeout_log"):
        assert step.timeout is not None
        i = indent
        place = step.guard_place if step.guard and not step.timeout.inverted else "outer"
        if step.guard and place == "outer":
            out.emit(i, f"if {_guard(step)}:")
            i += 1
        pre, cmp = _cmp(step.timeout)
        for line in pre:
            out.emit(i, line)
        out.emit(i, f"if {cmp} and {_guard(step)}:" if place == "and" else f"if {cmp}:")
        if place == "inner":
            i += 1
            out.emit(i, f"if {_guard(step)}:")
        if step.kind == "timeout_log":
            # The true side only logs: the comparison covers nothing.
            out.emit(i + 1, 'logger.warning("room %s is slow: %s", self.bootstrap_room, status)')
            return
        if step.timeout.inverted:
            out.emit(i + 1, "return status")
            fail_indent = i
        else:
            fail_indent = i + 1
        if step.record:
            out.emit(fail_indent, 'self.kv_mgr.record_failure(self.bootstrap_room, "timed out")')
        if step.attr:
            out.emit(fail_indent, f"self.{step.attr} = KVPoll.Failed")
        out.emit(fail_indent, "return KVPoll.Failed")
    elif step.kind == "timeout_helper":
        i = indent
        if step.guard:
            out.emit(i, f"if {_guard(step)}:")
            i += 1
        out.emit(i, f"timeout_status = self.{step.helper}()")
        out.emit(i, "if timeout_status is not None:")
        out.emit(i + 1, "return timeout_status")
    elif step.kind == "param_helper":
        # The helper narrows its own parameter (issue 7, item 3).
        out.emit(indent, f"expired = self.{step.helper}(status)")
        out.emit(indent, "if expired is not None:")
        out.emit(indent + 1, "return expired")
    elif step.kind == "hold":
        out.emit(indent, f"if status == KVPoll.Success and self.kv_mgr.{step.flag}:")
        out.emit(indent + 1, "return KVPoll.Transferring")
    elif step.kind == "missing":
        out.emit(indent, f"if self.kv_mgr.{step.flag}:")
        out.emit(indent + 1, "status = KVPoll.Failed")
    elif step.kind == "neutral":
        out.emit(indent, f"if self.kv_mgr.{step.flag}:")
        out.emit(indent + 1, 'logger.debug("room %s: %s", self.bootstrap_room, status)')
    elif step.kind == "cache":
        out.emit(indent, "if status in (KVPoll.Success, KVPoll.Failed):")
        out.emit(indent + 1, f"self.{step.attr} = status")
    else:
        raise ValueError(step.kind)


def _render_helper(out: _Out, h: HelperDef) -> None:
    out.emit(0, "")
    if h.role == "read":
        out.emit(1, f"def {h.name}(self) -> bool:")
        if h.disabled:
            out.emit(2, "return False")
        elif h.attr in STATE_ATTRS:
            out.emit(2, f"return self.{h.attr} is not None")
        else:
            out.emit(2, f"return bool(self.{h.attr})")
        return
    out.emit(1, f"def {h.name}(self, status):" if h.role == "param" else f"def {h.name}(self):")
    if h.disabled or h.timeout is None:
        out.emit(2, "return None")
        return
    pre, cmp = _cmp(h.timeout)
    for line in pre:
        out.emit(2, line)
    if h.role == "param":  # a deadline for the states of its parameter in `guard`
        out.emit(2, f"if {_guard(h)} and {cmp}:" if h.guard else f"if {cmp}:")
        out.emit(3, "return KVPoll.Failed")
        out.emit(2, "return None")
        return
    out.emit(2, f"if {cmp}:")
    if h.timeout.inverted:
        out.emit(3, "return None")
        out.emit(2, 'logger.warning("room %s timed out", self.bootstrap_room)')
        out.emit(2, "return KVPoll.Failed")
    else:
        out.emit(3, 'logger.warning("room %s timed out", self.bootstrap_room)')
        out.emit(3, "return KVPoll.Failed")
        out.emit(2, "return None")


TIMEOUT_VALUES = {"bootstrap_timeout": 300, "waiting_timeout": 600, "bootstrap_time_out": 300, "deadline_s": 450,
                  "max_wait": 900}
MODULE_ABORT = "_abort_transfer"  # the module function a "module" abort() gives `self` to


def _render_register(out: _Out, mgr: ManagerDef, indent: int) -> None:
    room = "self.bootstrap_room"
    if mgr.register == "none":
        return
    if mgr.register == "direct":
        out.emit(indent, f"self.kv_mgr.request_status[{room}] = KVPoll.Bootstrapping")
        return
    if mgr.register == "dummy":
        out.emit(indent, "if self.kv_mgr.is_dummy_rank:")
        out.emit(indent + 1, f"self.kv_mgr.update_status({room}, KVPoll.WaitingForInput)")
        out.emit(indent + 1, "return")
    out.emit(indent, f"self.kv_mgr.update_status({room}, KVPoll.Bootstrapping)")


def _abort_effects(out: _Out, a: AbortDef, indent: int, subject: str) -> None:
    """The manager calls of an abort, then its attribute write."""
    if a.record:
        out.emit(indent, f'{subject}.kv_mgr.record_failure({subject}.bootstrap_room, "Aborted by AbortReq.")')
    if a.update:
        out.emit(indent, f"{subject}.kv_mgr.update_status({subject}.bootstrap_room, KVPoll.Failed)")
    if a.attr:
        value = "KVPoll.Failed" if a.attr in STATE_ATTRS else "True"
        out.emit(indent, f"{subject}.{a.attr} = {value}")
    if not (a.record or a.update or a.attr):
        out.emit(indent, f'logger.info("room %s aborted", {subject}.bootstrap_room)')


def render_sender_class(cls: SenderClass, mgr: ManagerDef | None = None, folder: str = "") -> list[str]:
    out = _Out()
    out.emit(0, f"class {cls.name}({cls.parent}):")
    typed = mgr is not None and mgr.pairing == "annotation"
    mgr_type = "CommonKVManager" if cls.name == "CommonKVSender" else f"{folder.capitalize()}KVManager"
    param = f"mgr: {mgr_type}" if typed else "mgr"
    wrote = False
    if cls.has_init:
        out.emit(1, f"def __init__(self, {param}, bootstrap_room):")
        out.emit(2, "self.kv_mgr = mgr")
        out.emit(2, "self.bootstrap_room = bootstrap_room")
        for a in STATE_ATTRS:
            out.emit(2, f"self.{a} = None")
        for a in BOOL_ATTRS:
            out.emit(2, f"self.{a} = False")
        out.emit(2, "self.init_time = time.time()")
        for a in TIMEOUT_ATTRS + ODD_TIMEOUT_ATTRS:
            out.emit(2, f"self.{a} = {TIMEOUT_VALUES[a]}")
        out.emit(2, "self.transfer_deadline = time.monotonic() + 900")
        if mgr is not None:
            _render_register(out, mgr, 2)
        wrote = True
    elif typed and cls.parent == "CommonKVSender":
        # The manager's type is only in this signature; super().__init__ passes it on.
        out.emit(1, f"def __init__(self, {param}, bootstrap_room):")
        out.emit(2, "super().__init__(mgr, bootstrap_room)")
        wrote = True
    if cls.poll is not None:
        p = cls.poll
        if wrote:
            out.emit(0, "")
        out.emit(1, "def poll(self) -> KVPoll:")
        if p.read and p.read.position == "top":
            _render_read(out, p.read, 2)
        if p.source == "super":
            out.emit(2, "status = super().poll()")
        else:
            out.emit(2, "status = self.kv_mgr.check_status(self.bootstrap_room)")
        if p.read and p.read.position == "after_source":
            _render_read(out, p.read, 2)
        for step in p.steps:
            _render_step(out, step, 2)
        out.emit(2, "return status")
        wrote = True
    if cls.abort is not None:
        a = cls.abort
        if wrote:
            out.emit(0, "")
        out.emit(1, "def abort(self):")
        if a.form == "super":
            out.emit(2, "super().abort()")
            if a.attr:
                _abort_effects(out, AbortDef(a.attr, False, False), 2, "self")
            out.emit(2, 'logger.debug("room %s: abort traced", self.bootstrap_room)')
        elif a.form == "base":
            out.emit(2, f"{cls.parent}.abort(self)")
            if a.attr:
                _abort_effects(out, AbortDef(a.attr, False, False), 2, "self")
        elif a.form == "module":
            out.emit(2, f"{MODULE_ABORT}(self)")
        elif a.via:
            if a.record or a.update:
                _abort_effects(out, dataclasses.replace(a, attr=""), 2, "self")
            out.emit(2, f"self.{a.via}()")
            out.emit(0, "")
            out.emit(1, f"def {a.via}(self):")
            _abort_effects(out, AbortDef(a.attr, False, False), 2, "self")
        else:
            _abort_effects(out, a, 2, "self")
        wrote = True
    if mgr is not None and mgr.sender_clear and cls.has_init:  # clear() next to the attributes it owns
        if wrote:
            out.emit(0, "")
        out.emit(1, "def clear(self) -> None:")
        out.emit(2, "self.kv_mgr.request_status.pop(self.bootstrap_room, None)")
        wrote = True
    for h in cls.helpers:
        _render_helper(out, h)
        wrote = True
    if not wrote:
        out.emit(1, "pass")
    lines = out.lines
    if cls.abort is not None and cls.abort.form == "module":
        lines += ["", "", f"def {MODULE_ABORT}(sender) -> None:",
                  '    """Conclude a sender as failed (abort() hands itself over)."""']
        body = _Out()
        _abort_effects(body, dataclasses.replace(cls.abort, form="direct"), 1, "sender")
        lines += body.lines
    return lines


# --- the manager ---------------------------------------------------------------------------

THREAD_NAMES = ("transfer_worker", "bootstrap_thread", "_handle_last_chunk", "heartbeat_checker")
THREAD_FLAGS = ("chunk_ready", "peer_alive", "last_chunk_sent", "transfer_ok", "decode_ready", "aux_sent")


def _render_check(out: _Out, check: str, default: str) -> None:
    out.emit(1, "def check_status(self, bootstrap_room):")
    if check == "subscript":
        out.emit(2, "return self.request_status[bootstrap_room]")
    elif check == "get":
        out.emit(2, f"return self.request_status.get(bootstrap_room, {_state_ref(default)})")
    elif check == "in_check":
        out.emit(2, "if bootstrap_room not in self.request_status:")
        out.emit(3, f"return {_state_ref(default)}")
        out.emit(2, "return self.request_status[bootstrap_room]")
    else:
        raise ValueError(check)


def _render_update(out: _Out, update: str) -> None:
    out.emit(1, "def update_status(self, bootstrap_room, status):")
    table = "self.request_status"
    if update == "plain":
        out.emit(2, f"{table}[bootstrap_room] = status")
    elif update == "sglang":
        out.emit(2, f"if bootstrap_room not in {table}:")
        out.emit(3, "# A cleared room is not brought back by a late Failed.")
        out.emit(3, "if status == KVPoll.Failed:")
        out.emit(4, "return")
        out.emit(3, f"{table}[bootstrap_room] = status")
        out.emit(2, "else:")
        out.emit(3, "if status == KVPoll.Failed:")
        out.emit(4, f"{table}[bootstrap_room] = KVPoll.Failed")
        out.emit(3, "else:")
        out.emit(4, f"{table}[bootstrap_room] = max({table}[bootstrap_room], status)")
    elif update == "noop_absent":
        out.emit(2, f"if bootstrap_room not in {table}:")
        out.emit(3, "return")
        out.emit(2, f"{table}[bootstrap_room] = status")
    elif update == "max":
        out.emit(2, f"{table}[bootstrap_room] = max({table}.get(bootstrap_room, status), status)")
    elif update == "no_overwrite_failed":
        out.emit(2, f"if {table}.get(bootstrap_room) == KVPoll.Failed:")
        out.emit(3, "return")
        out.emit(2, f"{table}[bootstrap_room] = status")
    else:
        raise ValueError(update)


def _render_thread(out: _Out, t: ThreadDef) -> None:
    base = 2
    if t.closure:
        out.emit(1, f"def start_{t.name.lstrip('_')}(self, room):")
        out.emit(2, f"def {t.name}():")
        base = 3
    else:
        out.emit(1, f"def {t.name}(self, room):")
    _render_thread_body(out, t, base)
    if t.closure:
        out.emit(0, "")
        out.emit(2, f"threading.Thread(target={t.name}, daemon=True).start()")


def _render_thread_body(out: _Out, t: ThreadDef, base: int) -> None:
    for state, how, flag in t.stores:
        i = base
        if flag:
            out.emit(i, f"if self.{flag}:")
            i += 1
        ref = _state_ref(state)
        out.emit(i, {
            "update": f"self.update_status(room, {ref})",
            "direct": f"self.request_status[room] = {ref}",
            "helper": f"self._store(room, {ref})",
            "setdefault": f"self.request_status.setdefault(room, {ref})",
        }[how])
    if t.clear:
        i = base
        if t.clear_flag:
            out.emit(i, f"if self.{t.clear_flag}:")
            i += 1
        if t.clear == "pop":
            out.emit(i, "self.request_status.pop(room, None)")
        else:
            out.emit(i, "if room in self.request_status:")
            out.emit(i + 1, "del self.request_status[room]")
    if not t.stores and not t.clear:
        out.emit(base, "pass")


def render_common_manager(mgr: ManagerDef) -> list[str]:
    out = _Out()
    out.emit(0, "class CommonKVManager(BaseKVManager):")
    out.emit(1, "def __init__(self):")
    out.emit(2, "self.request_status = {}")
    out.emit(2, "self.failure_records = {}")
    for a in TIMEOUT_ATTRS + ODD_TIMEOUT_ATTRS:
        out.emit(2, f"self.{a} = {TIMEOUT_VALUES[a]}")
    out.emit(0, "")
    _render_check(out, mgr.check, mgr.default)
    out.emit(0, "")
    _render_update(out, mgr.update)
    out.emit(0, "")
    out.emit(1, "def record_failure(self, bootstrap_room, failure_reason):")
    out.emit(2, "self.failure_records[bootstrap_room] = failure_reason")
    if mgr.record == "fails":
        out.emit(2, "self.update_status(bootstrap_room, KVPoll.Failed)")
    if any(how == "helper" for t in mgr.threads for _, how, _ in t.stores):
        out.emit(0, "")
        out.emit(1, "def _store(self, room, status):")
        out.emit(2, "self.update_status(room, status)")
    for t in mgr.threads:
        out.emit(0, "")
        _render_thread(out, t)
    return out.lines


def render_backend_manager(folder: str, mgr: ManagerDef) -> list[str]:
    out = _Out()
    out.emit(0, f"class {folder.capitalize()}KVManager(CommonKVManager):")
    override = next((o for o in mgr.overrides if o[0] == folder), None)
    if override is None:
        out.emit(1, "pass")
    else:
        _render_check(out, override[1], override[2])
    return out.lines


def manager_folders(tree: SenderTree) -> tuple[str, ...]:
    """The backend folders with a manager class of their own (a mapping may point elsewhere)."""
    mgr = tree.manager
    if mgr is None:
        return ()
    return tuple(f for f, _ in tree.backends if not (mgr.pairing == "mapping" and f in mgr.shared))


def render_common(cls: SenderClass | None, mgr: ManagerDef | None = None) -> str:
    head = [
        '"""Shared sender code of the transfer backends (generated by kvtrace\'s property tests)."""',
        "",
        "import logging",
        "import threading",
        "import time",
        "",
        "from ..base.conn import BaseKVManager, BaseKVSender, KVPoll",
        "",
        "logger = logging.getLogger(__name__)",
        "",
        "",
    ]
    body: list[str] = []
    if mgr is not None:
        body += render_common_manager(mgr)
    if cls is not None:
        if body:
            body += ["", ""]
        body += render_sender_class(cls, mgr)
    return "\n".join(head + body) + "\n"


def render_backend(folder: str, cls: SenderClass, mgr: ManagerDef | None = None, own_manager: bool = True) -> str:
    head = [
        f'"""The {folder} transfer backend (generated by kvtrace\'s property tests)."""',
        "",
        "import logging",
        "import time",
        "",
        "from ..base.conn import BaseKVSender, KVPoll",
    ]
    if cls.parent == "CommonKVSender" and mgr is not None:
        head.append("from ..common.conn import CommonKVManager, CommonKVSender")
    elif cls.parent == "CommonKVSender":
        head.append("from ..common.conn import CommonKVSender")
    elif mgr is not None:
        head.append("from ..common.conn import CommonKVManager")
    head += ["", "logger = logging.getLogger(__name__)", "", ""]
    if mgr is not None and own_manager:
        head += render_backend_manager(folder, mgr) + ["", ""]
    if cls.intermediate:
        base = intermediate_name(folder, cls.intermediate)
        body = render_sender_class(dataclasses.replace(cls, name=base), mgr, folder)
        tail = ["", "", f"class {cls.name}({base}):", "    pass"]
        return "\n".join(head + body + tail) + "\n"
    return "\n".join(head + render_sender_class(cls, mgr, folder)) + "\n"


def render_factory(tree: SenderTree) -> str:
    """SGLang's backend -> classes mapping (a dict literal per backend)."""
    own = manager_folders(tree)
    lines = ['"""Which classes each transfer backend uses (generated by kvtrace\'s property tests)."""', ""]
    if any(f not in own for f, _ in tree.backends):
        lines.append("from .common.conn import CommonKVManager")
    for folder, cls in tree.backends:
        names = [cls.name] + ([f"{folder.capitalize()}KVManager"] if folder in own else [])
        lines.append(f"from .{folder}.conn import {', '.join(names)}")
    lines += ["", "", "KV_CLASSES = {"]
    for folder, cls in tree.backends:
        manager = f"{folder.capitalize()}KVManager" if folder in own else "CommonKVManager"
        lines.append(f'    "{folder}": {{"manager": {manager}, "sender": {cls.name}}},')
    lines.append("}")
    return "\n".join(lines) + "\n"


def intermediate_name(folder: str, kind: str) -> str:
    return f"Base{folder.capitalize()}Sender" if kind == "Base" else f"_{folder.capitalize()}Base"


# ---------------------------------------------------------------------------------------------
# Default halves of a tree (so a drain tree has a backend and a sender tree has a drain loop)

DEFAULT_DRAIN = DrainProgram(
    body=(
        If(
            PollTest("in", ("WaitingForInput", "Transferring"), container="list"),
            (Keep(),),
            (
                If(
                    PollTest("==", ("Success",)),
                    (Release("release_kv_cache"), Done()),
                    (
                        If(
                            PollTest("==", ("Failed",)),
                            (Release("release_kv_cache"), Abort(), Done()),
                            (Raise(),),
                        ),
                    ),
                ),
            ),
        ),
    )
)

DEFAULT_SENDERS = SenderTree(
    common=None,
    backends=(
        (
            "mock",
            SenderClass(
                name="MockKVSender",
                parent="BaseKVSender",
                has_init=True,
                poll=PollDef("check_status", AbortRead("conclude_state"), ()),
                abort=AbortDef("conclude_state"),
            ),
        ),
    ),
)


def class_name_for(folder: str) -> str:
    return folder.capitalize() + "KVSender"


SCHEDULER_METRICS = f'''"""The scheduler's queue gauge (generated by kvtrace's property tests)."""


class SchedulerMetricsMixin:
    def queue_gauge(self) -> int:
        return len(self.{QUEUE_ATTR})
'''


SCHEDULER = f'''"""The scheduler (generated by kvtrace's property tests): the class composed of the mixins."""

from ..disaggregation.prefill import {DRAIN_CLASS}
from .scheduler_metrics import SchedulerMetricsMixin


class Scheduler(SchedulerMetricsMixin, {DRAIN_CLASS}):
    def __init__(self) -> None:
        self.{QUEUE_ATTR} = []


def run_scheduler_process() -> None:
    Scheduler().event_loop()
'''


def render_tree(drain: DrainProgram | None = None, senders: SenderTree | None = None) -> dict[str, str]:
    """The files of a fixture tree, relative to its root."""
    drain = drain if drain is not None else DEFAULT_DRAIN
    senders = senders if senders is not None else DEFAULT_SENDERS
    files = {
        # The scheduler's side, as in a real tree: the queue's gauge beside the backends' folder.
        "managers/scheduler_metrics.py": SCHEDULER_METRICS,
        "disaggregation/__init__.py": "",
        "disaggregation/base/__init__.py": "",
        "disaggregation/base/conn.py": BASE_CONN,
        "disaggregation/utils.py": UTILS,
        "disaggregation/prefill.py": render_prefill(drain),
    }
    if drain.composed:
        files["managers/scheduler.py"] = SCHEDULER
    mgr = senders.manager
    if senders.common is not None or mgr is not None:
        files["disaggregation/common/__init__.py"] = ""
        files["disaggregation/common/conn.py"] = render_common(senders.common, mgr)
    own = manager_folders(senders)
    for folder, cls in senders.backends:
        files[f"disaggregation/{folder}/__init__.py"] = ""
        files[f"disaggregation/{folder}/conn.py"] = render_backend(folder, cls, mgr, folder in own)
    if mgr is not None and mgr.pairing == "mapping":
        files["disaggregation/factory.py"] = render_factory(senders)
    return files


def write_files(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def write_tree(root: Path, drain: DrainProgram | None = None, senders: SenderTree | None = None) -> Path:
    return write_files(root, render_tree(drain, senders))


def tree_digest(files: dict[str, str | bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        content = files[rel]
        h.update(rel.encode())
        h.update(b"\0")
        h.update(content if isinstance(content, bytes) else content.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Strategies: drain loops

MAX_DEPTH = 3
MAX_FLAGS = 9
MAX_HELPERS = 4
MAX_HELPER_NESTING = 2


@dataclass
class _Budget:
    flags: int = 0
    helpers: int = 0
    used_names: set = field(default_factory=set)
    loop_flags: list = field(default_factory=list)  # (owner, name, family) drawn in the loop's own body


@dataclass(frozen=True)
class _Ctx:
    kind: str  # loop | helper
    pollvar: str | None
    depth: int
    nesting: int  # helper nesting level (0 = drain loop)
    features: frozenset
    alias: str | None = None  # another name of the poll value in this scope


ALL_FEATURES = frozenset(
    {
        "flags",  # conditions on free flags
        "helpers",  # helper methods of self
        "boolops",  # and / or / not
        "break",
        "return",
        "assert",
        "neutral",
        "post_loop",
        "effects_before_raise",  # a release/append can precede a raise on the same path
        "requeue",  # self.waiting_queue.append(req)
        "try",  # try: ...; req.disagg_kv_sender.<fails>() except Exception: ...
        "alias",  # state = poll, then conditions on state
        "poll_eq_flag",  # poll == req.<flag>: a comparison with the poll value that is not about it
        "module_const",  # `poll in _POLL_SET_X` with a module-level tuple
        "match",  # `match poll: case KVPoll.A | KVPoll.B: ...`
        "pp_param",  # `def drain(self, rids_to_check=None)`, PP consensus guards, callers that pass it or not
        "repeat_flags",  # a flag of the loop tested again (same test or its negation)
    }
)
# Shapes within the brief's definitions that kvtrace answers otherwise (so far), on only when
# asked for (KVTRACE_FEATURES=+name). Empty today: module_const, match (drain loops) and
# private_intermediate (senders) were here until kvtrace 04b138b; see README.md.
OPTIONAL_FEATURES: frozenset = frozenset()


def features_from_env(default: frozenset = ALL_FEATURES, env: str = "KVTRACE_FEATURES") -> frozenset:
    """KVTRACE_FEATURES="+match,-try" adds/removes generator features for a run."""
    features = set(default)
    for item in filter(None, (x.strip() for x in os.environ.get(env, "").split(","))):
        name = item.lstrip("+-")
        if name not in ALL_FEATURES | OPTIONAL_FEATURES | SENDER_FEATURES | SENDER_OPTIONAL_FEATURES:
            raise ValueError(f"{env}: unknown feature {name!r}")
        (features.discard if item.startswith("-") else features.add)(name)
    return frozenset(features)


def _pick(draw, options: list[tuple[int, object]]):
    """Weighted choice that shrinks towards the first option."""
    options = [(w, o) for w, o in options if w > 0]
    total = sum(w for w, _ in options)
    n = draw(st.integers(0, total - 1))
    for w, o in options:
        if n < w:
            return o
        n -= w
    raise AssertionError


def _unique(budget_: _Budget, base: str) -> str:
    name, n = base, 2
    while name in budget_.used_names:
        name = f"{base}_{n}"
        n += 1
    budget_.used_names.add(name)
    return name


def _draw_flag(draw, ctx: _Ctx, b: _Budget) -> FlagTest:
    in_loop = ctx.kind == "loop" and ctx.nesting == 0
    if in_loop and b.loop_flags and "repeat_flags" in ctx.features and draw(st.integers(0, 2)) == 0:
        # The same side-effect-free test again (or its negation): decided once per path.
        owner, name, family = draw(st.sampled_from(b.loop_flags))
        shape = draw(st.sampled_from([k for k, f in FLAG_FAMILIES.items() if f == family]))
        return FlagTest(owner, name, shape)
    flag = _draw_new_flag(draw, ctx, b)
    if in_loop and flag.shape in FLAG_FAMILIES:
        b.loop_flags.append((flag.owner, flag.name, FLAG_FAMILIES[flag.shape]))
    return flag


def _draw_new_flag(draw, ctx: _Ctx, b: _Budget) -> FlagTest:
    owner = draw(st.sampled_from(("req", "self")))
    pool = REQ_FLAGS if owner == "req" else SELF_FLAGS
    name = _unique(b, draw(st.sampled_from(pool)))
    b.flags += 1
    shapes = FLAG_SHAPES + (("poll_eq",) if ctx.pollvar is not None and "poll_eq_flag" in ctx.features else ())
    shape = draw(st.sampled_from(shapes))
    return FlagTest(owner, name, shape)


def poll_test_for(draw, states: frozenset, ctx: _Ctx | None = None) -> Cond:
    """Some rendering of "the poll value is one of `states`"."""
    cond = _poll_test_for(draw, states, ctx)
    if ctx is not None and ctx.alias and draw(st.booleans()):
        cond = _with_var(cond, ctx.alias)
    return cond


def _with_var(cond: Cond, var: str) -> Cond:
    if isinstance(cond, PollTest):
        return dataclasses.replace(cond, var=var)
    if isinstance(cond, BoolTest):
        return BoolTest(cond.op, tuple(_with_var(c, var) for c in cond.operands))
    return cond


def _poll_test_for(draw, states: frozenset, ctx: _Ctx | None) -> Cond:
    inside = tuple(s for s in STATES if s in states)
    outside = tuple(s for s in STATES if s not in states)
    order = draw(st.permutations(inside)) if inside else ()
    out_order = draw(st.permutations(outside)) if outside else ()
    forms = [(3, "in")]
    if len(inside) == 1:
        forms += [(4, "=="), (1, "is"), (1, "rev")]
    if len(outside) == 1:
        forms += [(2, "!="), (1, "is not")]
    if outside:
        forms += [(2, "not in")]
    if len(inside) == 2:
        forms += [(1, "or")]
    if len(outside) == 2:
        forms += [(1, "and")]
    form = _pick(draw, forms)
    containers = ("tuple", "list", "set") + (("const",) if ctx is not None and "module_const" in ctx.features else ())
    container = draw(st.sampled_from(containers))
    if form == "in":
        return PollTest("in", tuple(order), container)
    if form == "==":
        return PollTest("==", inside)
    if form == "is":
        return PollTest("is", inside)
    if form == "rev":
        return PollTest("==", inside, reverse=True)
    if form == "!=":
        return PollTest("!=", outside, reverse=draw(st.booleans()))
    if form == "is not":
        return PollTest("is not", outside)
    if form == "not in":
        return PollTest("not in", tuple(out_order), container)
    if form == "or":
        return BoolTest("or", tuple(PollTest("==", (s,)) for s in order))
    if form == "and":
        return BoolTest("and", tuple(PollTest("!=", (s,)) for s in out_order))
    raise AssertionError(form)


def _draw_poll_test(draw, ctx: _Ctx | None = None) -> Cond:
    k = draw(st.integers(0, 5))
    chosen = draw(st.permutations(STATES))[:k]
    if k == 0 and draw(st.booleans()):
        # `poll in ()` / `poll not in ()`: legal, and always False / True.
        return PollTest(draw(st.sampled_from(("in", "not in"))), (), "tuple")
    if k == 0:
        chosen = draw(st.permutations(STATES))[:1]
    return poll_test_for(draw, frozenset(chosen), ctx)


def _can_flag(ctx: _Ctx, b: _Budget) -> bool:
    return "flags" in ctx.features and b.flags < MAX_FLAGS


def _can_helper(ctx: _Ctx, b: _Budget) -> bool:
    return "helpers" in ctx.features and b.helpers < MAX_HELPERS and ctx.nesting < MAX_HELPER_NESTING


def _can_cond(ctx: _Ctx, b: _Budget) -> bool:
    return ctx.pollvar is not None or _can_flag(ctx, b) or _can_helper(ctx, b)


def _draw_cond(draw, ctx: _Ctx, b: _Budget, allow_bool: bool = True) -> Cond:
    options = []
    if ctx.pollvar is not None:
        options.append((6, "poll"))
    if _can_flag(ctx, b):
        options.append((3, "flag"))
    if _can_helper(ctx, b):
        options.append((2, "helper"))
    if allow_bool and "boolops" in ctx.features and ctx.depth < MAX_DEPTH and (
        ctx.pollvar is not None or MAX_FLAGS - b.flags >= 3
    ):
        options.append((1, "not"))
        options.append((2, "bool"))
    if not options:
        # Out of flags inside a helper without the poll value: one flag over the (soft) budget.
        options.append((1, "flag"))
    kind = _pick(draw, options)
    if kind == "poll":
        return _draw_poll_test(draw, ctx)
    if kind == "flag":
        return _draw_flag(draw, ctx, b)
    if kind == "helper":
        return CallTest(_draw_helper(draw, ctx, b, returns_bool=True), negate=draw(st.booleans()))
    inner = dataclasses.replace(ctx, depth=ctx.depth + 1)
    if kind == "not":
        return NotTest(_draw_cond(draw, inner, b, allow_bool=False))
    op = draw(st.sampled_from(("and", "or")))
    n = draw(st.integers(2, 3))
    return BoolTest(op, tuple(_draw_cond(draw, inner, b, allow_bool=False) for _ in range(n)))


def _draw_helper(draw, ctx: _Ctx, b: _Budget, returns_bool: bool) -> Helper:
    b.helpers += 1
    name = _unique(b, draw(st.sampled_from(HELPER_NAMES)))
    takes_poll = ctx.pollvar is not None and draw(st.integers(0, 3)) > 0
    param = draw(st.sampled_from(POLL_PARAMS)) if takes_poll else None
    keyword = takes_poll and draw(st.integers(0, 3)) == 0
    hctx = _Ctx("helper", param, 0, ctx.nesting + 1, ctx.features, None)
    if param is not None and draw(st.booleans()):
        body = _draw_dispatch(draw, hctx, b, returns_bool)
    else:
        body = _draw_block(draw, hctx, b, 1, 3, returns_bool=returns_bool)
    return Helper(name, param, keyword, body)


def _draw_simple(draw, ctx: _Ctx, b: _Budget, returns_bool: bool) -> Stmt:
    """A statement without nested blocks."""
    f = ctx.features
    options: list[tuple[int, object]] = []
    if ctx.kind == "loop":
        options += [(6, "keep"), (4, "done"), (3, "continue")]
        if "break" in f:
            options.append((1, "break"))
        if "return" in f:
            options.append((1, "return"))
    else:
        options += [(5 if returns_bool else 2, "hreturn")]
    options += [(4, "release"), (2, "abort"), (2, "raise")]
    if "requeue" in f:
        options.append((1, "requeue"))
    if "assert" in f and _can_cond(ctx, b):
        options.append((1, "assert"))
    if "neutral" in f:
        options.append((1, "neutral"))
    if _can_helper(ctx, b):
        options.append((2 if ctx.nesting == 0 else 1, "call"))
    kind = _pick(draw, options)
    if kind == "keep":
        return Keep()
    if kind == "done":
        return Done()
    if kind == "requeue":
        return Requeue()
    if kind == "continue":
        return Continue()
    if kind == "break":
        return Break()
    if kind == "return":
        return Return()
    if kind == "release":
        return Release(draw(st.sampled_from(RELEASE_KINDS)))
    if kind == "abort":
        return Abort(draw(st.sampled_from(("plain", "status"))))
    if kind == "raise":
        return Raise(draw(st.sampled_from(("runtime", "value"))))
    if kind == "assert":
        return Assert(_draw_cond(draw, ctx, b))
    if kind == "neutral":
        return Neutral(draw(st.sampled_from(NEUTRAL_KINDS)))
    if kind == "call":
        return Call(_draw_helper(draw, ctx, b, returns_bool=False))
    if kind == "hreturn":
        return _draw_hreturn(draw, ctx, b, returns_bool)
    raise AssertionError(kind)


def _draw_hreturn(draw, ctx: _Ctx, b: _Budget, returns_bool: bool) -> HReturn:
    if not returns_bool:
        return HReturn(None)
    options = [(3, True), (3, False), (1, None)]
    if ctx.pollvar is not None:
        options.append((2, "poll"))
    if _can_flag(ctx, b):
        options.append((2, "flag"))
    v = _pick(draw, options)
    if v == "poll":
        return HReturn(_draw_poll_test(draw, ctx))
    if v == "flag":
        return HReturn(_draw_flag(draw, ctx, b))
    return HReturn(v)


def _draw_block(draw, ctx: _Ctx, b: _Budget, lo: int, hi: int, returns_bool: bool = False) -> tuple[Stmt, ...]:
    n = draw(st.integers(lo, hi))
    out: list[Stmt] = []
    for _ in range(n):
        compound = ctx.depth < MAX_DEPTH and draw(st.integers(0, 2 + 2 * ctx.depth + 2 * ctx.nesting)) == 0
        kinds = []
        if compound and _can_cond(ctx, b):
            kinds.append((6, "if"))
        if compound and "try" in ctx.features and _can_flag(ctx, b):
            kinds.append((1, "try"))
        if compound and "match" in ctx.features and ctx.pollvar is not None:
            kinds.append((2, "match"))
        kind = _pick(draw, kinds) if kinds else "simple"
        if kind == "if":
            s: Stmt = _draw_if(draw, ctx, b, returns_bool)
        elif kind == "try":
            s = _draw_try(draw, ctx, b, returns_bool)
        elif kind == "match":
            s = _draw_match(draw, ctx, b, returns_bool)
        else:
            s = _draw_simple(draw, ctx, b, returns_bool)
        out.append(s)
        if isinstance(s, TERMINATORS) or isinstance(s, HReturn):
            break
    return tuple(out)


def _draw_if(draw, ctx: _Ctx, b: _Budget, returns_bool: bool) -> If:
    cond = _draw_cond(draw, ctx, b)
    inner = dataclasses.replace(ctx, depth=ctx.depth + 1)
    body = _draw_block(draw, inner, b, 1, 3, returns_bool)
    shape = draw(st.integers(0, 2))
    if shape == 0:
        orelse: tuple[Stmt, ...] = ()
    elif shape == 1 or not _can_cond(ctx, b):
        orelse = _draw_block(draw, inner, b, 1, 3, returns_bool)
    else:
        orelse = (_draw_if(draw, inner, b, returns_bool),)
    return If(cond, body, orelse)


def _draw_try(draw, ctx: _Ctx, b: _Budget, returns_bool: bool) -> Try:
    inner = dataclasses.replace(ctx, depth=ctx.depth + 1)
    body = list(_draw_block(draw, inner, b, 0, 2, returns_bool))
    if not body or not isinstance(body[-1], TERMINATORS + (HReturn,)):
        # Every normal exit of the body goes through a call that may raise (see FailCall).
        b.flags += 1
        body.append(FailCall(_unique(b, draw(st.sampled_from(FAIL_CALLS)))))
    handler = _draw_block(draw, inner, b, 1, 2, returns_bool)
    return Try(tuple(body), handler)


def _draw_match(draw, ctx: _Ctx, b: _Budget, returns_bool: bool) -> Match:
    n_arms = draw(st.integers(1, 3))
    assignment = [draw(st.integers(0, n_arms)) for _ in STATES]
    arms = []
    for i in range(n_arms):
        states = tuple(s for s, a in zip(STATES, assignment) if a == i)
        if states:
            arms.append((tuple(draw(st.permutations(states))), _arm_block(draw, ctx, b, returns_bool)))
    default = _arm_block(draw, ctx, b, returns_bool) if draw(st.booleans()) or not arms else None
    return Match(tuple(arms), default)


def _arm_block(draw, ctx: _Ctx, b: _Budget, returns_bool: bool) -> tuple[Stmt, ...]:
    return _draw_block(draw, dataclasses.replace(ctx, depth=ctx.depth + 1), b, 1, 3, returns_bool)


def _draw_dispatch(draw, ctx: _Ctx, b: _Budget, returns_bool: bool) -> tuple[Stmt, ...]:
    """An if/elif/.../else chain that splits the poll values into arms (SGLang's main shape)."""
    n_arms = draw(st.integers(1, 4))
    assignment = [draw(st.integers(0, n_arms)) for _ in STATES]
    arms = []
    for i in range(n_arms):
        states = frozenset(s for s, a in zip(STATES, assignment) if a == i)
        if states:
            arms.append(states)
    rest_states = frozenset(s for s, a in zip(STATES, assignment) if a == n_arms)
    if not arms:
        arms = [rest_states]
        rest_states = frozenset()
    tail: tuple[Stmt, ...]
    if rest_states or draw(st.booleans()):
        # The else arm: SGLang raises on an unexpected state; generated code does anything.
        if draw(st.integers(0, 2)) == 0:
            tail = (Raise(),)
        else:
            tail = _arm_block(draw, ctx, b, returns_bool)
    else:
        tail = ()
    chain: tuple[Stmt, ...] = tail
    for states in reversed(arms):
        cond = poll_test_for(draw, states, ctx)
        chain = (If(cond, _arm_block(draw, ctx, b, returns_bool), chain),)
    return chain


def _draw_early_exit(draw, ctx: _Ctx, b: _Budget) -> If:
    """`if <flag>: ...; continue` before the dispatch (PP consensus, pending bootstrap, ...)."""
    cond = _draw_flag(draw, ctx, b) if _can_flag(ctx, b) else _draw_cond(draw, ctx, b)
    inner = dataclasses.replace(ctx, depth=ctx.depth + 1)
    body = list(_draw_block(draw, inner, b, 1, 3))
    if not body or not isinstance(body[-1], TERMINATORS):
        body.append(Continue())
    return If(cond, tuple(body), ())


def _draw_pp_prefix(draw, ctx: _Ctx, b: _Budget) -> list[Stmt]:
    """SGLang's consensus branch: a rid the previous rank has not finished stays; in consensus a
    non-terminal poll is kept (0.5.14), asserted away (0.5.2), or anything else."""
    inner = dataclasses.replace(ctx, depth=ctx.depth + 1)
    variant = _pick(draw, [(2, "flat"), (3, "nested"), (1, "free")])
    if variant == "flat":
        return [If(ParamTest("waiting"), (Keep(), Continue()), ())]
    then: list[Stmt] = []
    lagging = PollTest("not in", ("Success", "Failed"), container=draw(st.sampled_from(("tuple", "list"))))
    follow = _pick(draw, [(2, "keep"), (2, "assert"), (1, "raise"), (1, "free")])
    if follow == "keep":
        then.append(If(lagging, (Neutral("log"), Keep(), Continue()), ()))
    elif follow == "assert":
        then.append(Assert(PollTest("in", ("Success", "Failed"))))
    elif follow == "raise":
        then.append(If(lagging, (Raise(),), ()))
    else:
        then += _draw_block(draw, inner, b, 1, 2)
    first = ParamTest("rid_not_in") if variant == "nested" else ParamTest(draw(st.sampled_from(("rid_not_in", "rid_in"))))
    body = (If(first, (Keep(), Continue()), ()),) + tuple(then)
    return [If(ParamTest("set"), body, ())]


@st.composite
def drain_programs(draw, features: frozenset = ALL_FEATURES) -> DrainProgram:
    b = _Budget()
    alias = draw(st.sampled_from(POLL_ALIASES)) if "alias" in features and draw(st.integers(0, 3)) == 0 else None
    ctx = _Ctx("loop", "poll", 0, 0, features, alias)
    shape = _pick(draw, [(4, "dispatch"), (3, "free"), (2, "prefixed")])
    body: list[Stmt] = []
    if shape == "free":
        body += _draw_block(draw, ctx, b, 1, 5)
    else:
        if shape == "prefixed":
            for _ in range(draw(st.integers(1, 2))):
                body.append(_draw_early_exit(draw, ctx, b))
        body += _draw_dispatch(draw, ctx, b, returns_bool=False)
        if draw(st.integers(0, 3)) == 0:
            body += _draw_block(draw, ctx, b, 1, 2)
    param, callers = False, ()
    if "pp_param" in features and draw(st.integers(0, 2)) == 0:
        param = True
        callers = tuple(draw(st.lists(st.sampled_from(CALLER_KINDS), min_size=0, max_size=3)))
        body = _draw_pp_prefix(draw, ctx, b) + body
        if draw(st.integers(0, 3)) == 0:
            # A later test of the same membership: decided as the guard decided it.
            body.append(If(ParamTest(draw(st.sampled_from(("agreed", "waiting")))),
                           tuple(_draw_block(draw, dataclasses.replace(ctx, depth=ctx.depth + 1), b, 1, 2)), ()))
    post = "post_loop" in features and draw(st.integers(0, 3)) == 0
    composed = draw(st.integers(0, 3)) > 0
    program = DrainProgram(tuple(body), post_loop_release=post, empty_guard=draw(st.integers(0, 4)) > 0, alias=alias,
                           param=param, callers=callers, composed=composed)
    if "effects_before_raise" not in features:
        from .oracle import interpret_drain  # the IR interpreter; oracle.py imports this module

        verdict = interpret_drain(program)
        assume(
            not any(
                p.raised and (p.in_keep or p.in_done or p.in_other or p.effects)
                for paths in verdict.paths.values()
                for p in paths
            )
        )
    return program


@st.composite
def flag_around_helper_programs(draw, features: frozenset = ALL_FEATURES) -> DrainProgram:
    """A drawn drain with one flag tested, a helper called, and the same flag tested again
    around the rest: paths that differ in the flag reach the helper, and what the flag decides
    after it tells whether each path kept its own. drain_programs rarely draws this (a flag of
    the loop, then a helper call, then a repeat of that flag: about 10 drains in 400)."""
    program = draw(drain_programs(features))
    owner = draw(st.sampled_from(("req", "self")))
    family = draw(st.sampled_from(sorted(set(FLAG_FAMILIES.values()))))
    shapes = [k for k, f in FLAG_FAMILIES.items() if f == family]
    first = FlagTest(owner, "tested_around", draw(st.sampled_from(shapes)))
    again = FlagTest(owner, "tested_around", draw(st.sampled_from(shapes)))
    # What the helper does: nothing the flag is about, a test of a flag of its own, or a test of
    # the same flag (a run from one side of it must not serve the other).
    helper_body = _pick(draw, [
        (2, (Neutral(draw(st.sampled_from(NEUTRAL_KINDS))),)),
        (2, (If(FlagTest("req", "helper_own", draw(st.sampled_from(FLAG_SHAPES))), (Neutral("log"),)),)),
        (2, (If(FlagTest(owner, "tested_around", draw(st.sampled_from(shapes))), (Neutral("log"),)),)),
        (1, (HReturn(None),)),
    ])
    helper = Helper("_between_tests", draw(st.sampled_from((None,) + POLL_PARAMS)), draw(st.booleans()), helper_body)
    first_side = draw(st.sampled_from(((Neutral("log"),), (Neutral("set_reason"), Neutral("log")))))
    split = draw(st.integers(0, len(program.body)))
    other = _pick(draw, [(2, (Keep(),)), (1, (Release("release_kv_cache"), Done())), (1, (Continue(),))])
    body = (If(first, first_side), *program.body[:split], Call(helper), If(again, program.body[split:] or (Keep(),), other))
    return dataclasses.replace(program, body=body)


# ---------------------------------------------------------------------------------------------
# Strategies: senders


@dataclass
class _SCtx:
    """What the sender strategies may use: features, and whether a real manager is behind."""

    features: frozenset
    abort_attrs: tuple[str, ...]
    manager: bool = False
    used_flags: set = field(default_factory=set)

    def on(self, feature: str) -> bool:
        return feature in self.features


def _draw_abort(draw, ctx: _SCtx, above: bool = False) -> AbortDef:
    """abort(): `above` says the parent class has a concrete abort() to call."""
    forms = ["direct"] * 4
    if ctx.on("abort_forms"):
        forms += ["module"] + (["super", "base"] if above else []) + (["mgr"] if ctx.manager else [])
    form = draw(st.sampled_from(forms))
    if form == "mgr":
        # Only the manager hears of it (update_status / record_failure); no attribute.
        record, update = draw(st.sampled_from(((True, False), (False, True), (True, True))))
        return AbortDef("", record, update, None, form)
    if form in ("super", "base"):
        attr = draw(st.sampled_from(("",) + ctx.abort_attrs)) if draw(st.booleans()) else ""
        return AbortDef(attr, False, False, None, form)
    via = None
    if form == "direct" and ctx.on("abort_helper") and draw(st.integers(0, 3)) == 0:
        via = draw(st.sampled_from(("_mark_aborted", "_set_failed")))
    return AbortDef(draw(st.sampled_from(ctx.abort_attrs)), draw(st.booleans()), draw(st.booleans()), via, form)


def _draw_timeout(draw, inverted_ok: bool, ctx: _SCtx | None = None) -> Timeout:
    form = draw(st.sampled_from(TIMEOUT_FORMS))
    attrs = TIMEOUT_ATTRS + (ODD_TIMEOUT_ATTRS if ctx is not None and ctx.on("odd_timeouts") else ())
    return Timeout(
        form=form,
        clock=draw(st.sampled_from(CLOCKS)),
        attr=draw(st.sampled_from(attrs)),
        inverted=inverted_ok and draw(st.integers(0, 2)) == 0,
        on_mgr=ctx is not None and ctx.manager and draw(st.integers(0, 2)) == 0,
    )


def _draw_guard(draw) -> tuple[tuple[str, ...], str]:
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return (), "eq"
    if choice <= 2:
        return ("Bootstrapping",), draw(st.sampled_from(("eq", "in", "list")))
    k = draw(st.integers(1, 3))
    states = tuple(draw(st.permutations(NON_TERMINAL))[:k])
    return states, draw(st.sampled_from(("in", "list")))


def _fresh_flag(draw, names: tuple[str, ...], used: set) -> str:
    base = draw(st.sampled_from(names))
    name, n = base, 2
    while name in used:
        name, n = f"{base}_{n}", n + 1
    used.add(name)
    return name


def _draw_poll_def(draw, source: str, helpers: dict, ctx: _SCtx, no_hold: bool = False) -> PollDef:
    read = None
    if draw(st.integers(0, 3)) > 0:
        attr = draw(st.sampled_from(ctx.abort_attrs))
        via = None
        log_only = ctx.on("log_only") and draw(st.integers(0, 4)) == 0
        if not log_only and draw(st.integers(0, 2)) == 0:
            via = draw(st.sampled_from(READ_HELPERS))
            helpers[via] = HelperDef(via, "read", attr=attr)
        read = AbortRead(attr, via, draw(st.sampled_from(("top", "after_source"))), log_only)
    steps: list[SStep] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = _pick(
            draw,
            [(4, "timeout"), (2, "timeout_helper"), (2 if ctx.on("param_helper") else 0, "param_helper"),
             (1 if ctx.on("log_only") else 0, "timeout_log"), (0 if no_hold else 2, "hold"), (1, "missing"),
             (1, "neutral"), (1, "cache")],
        )
        if kind in ("hold", "missing", "neutral"):
            steps.append(SStep(kind, flag=_fresh_flag(draw, MGR_FLAGS, ctx.used_flags)))
        elif kind == "cache":
            steps.append(SStep("cache", attr=draw(st.sampled_from(STATE_ATTRS))))
        elif kind in ("timeout", "timeout_log"):
            guard, gform = _draw_guard(draw)
            t = _draw_timeout(draw, inverted_ok=bool(guard) and kind == "timeout", ctx=ctx)
            fail_attr = draw(st.sampled_from(("",) + STATE_ATTRS)) if not t.inverted and kind == "timeout" else ""
            place = draw(st.sampled_from(("outer", "and", "inner"))) if guard and not t.inverted else "outer"
            steps.append(SStep(kind, guard, gform, t, attr=fail_attr, record=kind == "timeout" and draw(st.booleans()),
                               guard_place=place))
        elif kind == "param_helper":
            name = draw(st.sampled_from(PARAM_HELPERS))
            if name not in helpers:
                guard, gform = _draw_guard(draw)
                helpers[name] = HelperDef(name, "param", timeout=_draw_timeout(draw, inverted_ok=False, ctx=ctx), guard=guard)
            if any(s.helper == name for s in steps):
                continue  # one call per poll: a second would read the same flags twice
            steps.append(SStep("param_helper", helper=name))
        else:
            guard, gform = _draw_guard(draw)
            name = draw(st.sampled_from(TIMEOUT_HELPERS))
            if name not in helpers:
                helpers[name] = HelperDef(name, "timeout", timeout=_draw_timeout(draw, inverted_ok=True, ctx=ctx))
            steps.append(SStep("timeout_helper", guard, gform, helper=name))
    # A cached Success read back at the top of a later poll would bypass a "hold" that turned it
    # into Transferring: a transient Transferring kvtrace cannot tell from a pinned one. So the
    # cache comes after every hold of the same poll (SGLang's order), see also sender_trees.
    steps.sort(key=lambda step: step.kind == "cache")
    return PollDef(source, read, tuple(steps))


PARAM_HELPERS = ("_expired", "_deadline_status")

SENDER_FEATURES = frozenset(
    {
        "abort_helper",  # abort() calls a self method that assigns the abort attribute
        "intermediate",  # the backend's body sits in a `Base<Folder>Sender` class of its file
        "bool_abort",  # abort() sets `self.aborted = True` (not a KVPoll member); poll() reads it
        "private_intermediate",  # ... or in `_<Folder>Base`, which is not a backend either
        "manager",  # a real CommonKVManager + <Folder>KVManager with a status table and threads
        "abort_forms",  # abort() through super(), Base.abort(self), a module function, only the manager
        "param_helper",  # `self._expired(status)`: a deadline helper narrowing its parameter
        "odd_timeouts",  # bounds named bootstrap_time_out, deadline_s, max_wait (or the manager's)
        "log_only",  # a comparison / an abort read whose true side only logs
        "thread_closures",  # a manager thread written as a closure started with threading.Thread
    }
)
SENDER_OPTIONAL_FEATURES: frozenset = frozenset()  # see OPTIONAL_FEATURES


def _draw_manager(draw, folders: list[str], used_flags: set, features: frozenset = frozenset()) -> ManagerDef:
    threads = []
    names = list(draw(st.permutations(THREAD_NAMES)))
    for name in names[: draw(st.integers(0, 3))]:
        stores = []
        for _ in range(draw(st.integers(1, 3))):
            state = _pick(draw, [(3, "Bootstrapping"), (3, "WaitingForInput"), (3, "Transferring"), (2, "Success"), (2, "Failed")])
            how = _pick(draw, [(4, "update"), (2, "direct"), (2, "helper"), (1, "setdefault")])
            flag = _fresh_flag(draw, THREAD_FLAGS, used_flags) if draw(st.booleans()) else ""
            stores.append((state, how, flag))
        clear, clear_flag = "", ""
        if draw(st.integers(0, 3)) == 0:
            clear = draw(st.sampled_from(("pop", "del")))
            clear_flag = _fresh_flag(draw, THREAD_FLAGS, used_flags) if draw(st.booleans()) else ""
        closure = "thread_closures" in features and draw(st.integers(0, 2)) == 0
        threads.append(ThreadDef(name, tuple(stores), clear, clear_flag, closure))
    overrides = []
    for folder in folders:
        if draw(st.integers(0, 3)) == 0:
            overrides.append((folder, draw(st.sampled_from(("subscript", "get", "in_check"))), draw(st.sampled_from(STATES))))
    pairing = draw(st.sampled_from(("folder", "annotation", "mapping")))
    shared: tuple[str, ...] = ()
    if pairing == "mapping":
        shared = tuple(f for f in folders if draw(st.integers(0, 2)) == 0)
        overrides = [o for o in overrides if o[0] not in shared]
    return ManagerDef(
        check=draw(st.sampled_from(("subscript", "get", "in_check"))),
        default=_pick(draw, [(3, "WaitingForInput"), (1, "Bootstrapping"), (1, "Transferring"), (2, "Failed"), (1, "Success")]),
        update=draw(st.sampled_from(("plain", "sglang", "noop_absent", "max", "no_overwrite_failed"))),
        record=draw(st.sampled_from(("plain", "fails"))),
        threads=tuple(threads),
        register=_pick(draw, [(3, "update"), (1, "direct"), (1, "none"), (1, "dummy")]),
        sender_clear=draw(st.integers(0, 2)) == 0,
        overrides=tuple(overrides),
        pairing=pairing,
        shared=shared,
    )


@st.composite
def sender_trees(draw, features: frozenset = SENDER_FEATURES) -> SenderTree:
    attrs = STATE_ATTRS + (BOOL_ATTRS if "bool_abort" in features else ())
    tree = _sender_tree(draw, attrs, features)
    return tree


def _sender_tree(draw, abort_attrs: tuple[str, ...], features: frozenset = frozenset()) -> SenderTree:
    ctx = _SCtx(features, abort_attrs, manager="manager" in features and draw(st.integers(0, 3)) > 0)
    common = None
    common_helpers: dict = {}
    if draw(st.integers(0, 2)) > 0:
        poll = _draw_poll_def(draw, "check_status", common_helpers, ctx) if draw(st.integers(0, 3)) > 0 else None
        abort = _draw_abort(draw, ctx) if draw(st.integers(0, 3)) > 0 else None
        common = SenderClass("CommonKVSender", "BaseKVSender", True, poll, abort, tuple(common_helpers.values()))
    folders = draw(st.lists(st.sampled_from(BACKEND_FOLDERS), min_size=1, max_size=3, unique=True))
    backends = []
    for folder in folders:
        helpers: dict = {}
        on_common = common is not None and draw(st.integers(0, 3)) > 0
        parent = "CommonKVSender" if on_common else "BaseKVSender"
        has_poll_above = on_common and common.poll is not None
        has_abort_above = on_common and common.abort is not None
        poll = None
        if not has_poll_above or draw(st.booleans()):
            source = "super" if has_poll_above and draw(st.booleans()) else "check_status"
            common_caches = has_poll_above and any(step.kind == "cache" for step in common.poll.steps)
            poll = _draw_poll_def(draw, source, helpers, ctx, no_hold=source == "super" and common_caches)
        abort = None
        if not has_abort_above or draw(st.integers(0, 2)) == 0:
            abort = _draw_abort(draw, ctx, above=has_abort_above)
        if on_common:
            # Override some helpers of the common class (dynamic dispatch through self).
            for h in common_helpers.values():
                if h.name not in helpers and draw(st.integers(0, 3)) == 0:
                    if h.role == "read":
                        alt = draw(st.sampled_from(("disabled",) + abort_attrs))
                        helpers[h.name] = HelperDef(h.name, "read", attr="" if alt == "disabled" else alt, disabled=alt == "disabled")
                    elif draw(st.booleans()):
                        helpers[h.name] = HelperDef(h.name, h.role, disabled=True)
                    elif h.role == "param":
                        guard, _ = _draw_guard(draw)
                        helpers[h.name] = HelperDef(h.name, "param", timeout=_draw_timeout(draw, False, ctx), guard=guard)
                    else:
                        helpers[h.name] = HelperDef(h.name, "timeout", timeout=_draw_timeout(draw, inverted_ok=True, ctx=ctx))
        kinds = [""] + (["Base"] if "intermediate" in features else []) + (["_"] if "private_intermediate" in features else [])
        intermediate = draw(st.sampled_from(kinds)) if draw(st.integers(0, 3)) == 0 else ""
        backends.append(
            (
                folder,
                SenderClass(class_name_for(folder), parent, not on_common, poll, abort, tuple(helpers.values()), intermediate),
            )
        )
    manager = _draw_manager(draw, folders, ctx.used_flags, features) if ctx.manager else None
    return SenderTree(common, tuple(backends), manager)


# ---------------------------------------------------------------------------------------------
# IR <-> JSON (regression fixtures keep the IR next to the rendered tree, for reading)


def to_jsonable(obj):
    if dataclasses.is_dataclass(obj):
        d = {"_": type(obj).__name__}
        for f in dataclasses.fields(obj):
            d[f.name] = to_jsonable(getattr(obj, f.name))
        return d
    if isinstance(obj, (tuple, list)):
        return [to_jsonable(x) for x in obj]
    if isinstance(obj, frozenset):
        return sorted(obj)
    return obj


def ir_json(obj) -> str:
    return json.dumps(to_jsonable(obj), indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Hand-built programs in SGLang's shapes (written for kvtrace, not copied from SGLang); the
# property tests run them as @examples before the generated ones.

SHAPE_CLASSIC = DEFAULT_DRAIN  # keep W/T, release+done on Success, release+abort+done on Failed, raise otherwise

# SGLang 0.5.4.post3 … 0.5.9 seen from disaggregation/ alone: the PP branch asserts a concluded
# poll, and its caller (the PP event loop) is in managers/: no caller in view passes it.
SHAPE_PP_NO_CALLER = dataclasses.replace(DEFAULT_DRAIN, param=True, callers=("none",), body=(
    If(ParamTest("set"), (If(ParamTest("rid_not_in"), (Keep(), Continue()), ()),
                          Assert(PollTest("in", ("Success", "Failed")))), ()),) + DEFAULT_DRAIN.body)

SHAPE_PENDING = DrainProgram(
    body=(
        If(
            FlagTest("self", "check_consensus", "is not None"),
            (
                If(FlagTest("req", "consensus_missing", "truthy"), (Keep(), Continue())),
                If(PollTest("not in", ("Success", "Failed")), (Keep(), Continue())),
            ),
        ),
        If(
            FlagTest("req", "pending_bootstrap", "truthy"),
            (
                If(
                    CallTest(
                        Helper(
                            "_handle_pending_bootstrap",
                            "poll",
                            False,
                            (
                                If(
                                    PollTest("==", ("Failed",)),
                                    (Release("release_kv_cache"), Abort(), HReturn(False)),
                                    (
                                        If(
                                            PollTest("==", ("Bootstrapping",)),
                                            (HReturn(False),),
                                            (
                                                If(
                                                    PollTest("==", ("WaitingForInput",)),
                                                    (
                                                        If(FlagTest("req", "force_retry", "truthy"), (HReturn(False),)),
                                                        HReturn(True),
                                                    ),
                                                    (Raise(),),
                                                ),
                                            ),
                                        ),
                                    ),
                                ),
                            ),
                        )
                    ),
                    (Neutral("send_chunk"), Keep()),
                    (
                        If(
                            BoolTest("and", (PollTest("==", ("Bootstrapping",)), FlagTest("self", "waiting_queue_full", "truthy"))),
                            (Release("release_kv_cache"), Release("allocator_free")),
                            (If(PollTest("!=", ("Failed",)), (Keep(),)),),
                        ),
                    ),
                ),
                Continue(),
            ),
        ),
        If(
            PollTest("in", ("WaitingForInput", "Transferring"), container="list"),
            (Keep(),),
            (
                If(
                    PollTest("==", ("Success",)),
                    (Neutral("set_reason"), Release("release_kv_cache"), Done()),
                    (
                        If(
                            PollTest("==", ("Failed",)),
                            (
                                Call(Helper("_handle_transfer_failure", None, False, (Release("release_kv_cache"), Abort()))),
                                Done(),
                            ),
                            (Raise(),),
                        ),
                    ),
                ),
            ),
        ),
    ),
    post_loop_release=True,
)

# A NIXL-like sender (never reads what abort() writes, no timeout) next to a Mooncake-like one
# (reads it first, and a bootstrap timeout in a helper of the shared base class).
SHAPE_SENDERS = SenderTree(
    common=SenderClass(
        "CommonKVSender",
        "BaseKVSender",
        True,
        PollDef(
            "check_status",
            AbortRead("conclude_state"),
            (
                SStep("hold", flag="staging_outstanding"),
                SStep("timeout_helper", ("Bootstrapping",), "eq", helper="_check_bootstrap_timeout"),
                SStep("cache", attr="conclude_state"),
            ),
        ),
        AbortDef("conclude_state", record=True, update=True),
        (HelperDef("_check_bootstrap_timeout", "timeout", timeout=Timeout("elapsed_var", "time", "bootstrap_timeout", inverted=True)),),
    ),
    backends=(
        ("mooncake", SenderClass("MooncakeKVSender", "CommonKVSender", False, None, None)),
        (
            "nixl",
            SenderClass(
                "NixlKVSender",
                "CommonKVSender",
                False,
                PollDef("check_status", None, (SStep("missing", flag="room_missing"),)),
                None,
            ),
        ),
    ),
)
