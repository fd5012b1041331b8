"""The oracle checked on its own (no kvtrace needed): hand-written drain loops and senders with
known verdicts, the executing oracle against the IR interpreter on generated programs, sanity of
generated sender trees, and the regression fixtures still meaning what they recorded."""

from __future__ import annotations

import ast
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import example, given

from . import _support, gen, oracle

F, B, W, T, S = gen.STATES

# ---------------------------------------------------------------------------------------------
# Hand-written drain loops

PREFILL = """\
import logging

from .base.conn import KVPoll
from .utils import maybe_release_metadata_buffer, poll_and_all_reduce, prepare_abort, release_kv_cache

logger = logging.getLogger(__name__)


class Scheduler:
    def process_disagg_prefill_inflight_queue(self):
        done_reqs = []
        polls = poll_and_all_reduce([req.disagg_kv_sender for req in self.disagg_prefill_inflight_queue], self.group)
        undone_reqs = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):
{body}
{post}
        self.disagg_prefill_inflight_queue = undone_reqs
        return done_reqs
{helpers}
"""


def drain_tree(root: Path, body: str, helpers: str = "", post: str = "") -> Path:
    gen.write_tree(root)
    src = PREFILL.format(
        body=textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 12),
        post=textwrap.indent(textwrap.dedent(post).strip("\n"), " " * 8),
        helpers=textwrap.indent(textwrap.dedent(helpers).strip("\n"), " " * 4),
    )
    (root / "disaggregation" / "prefill.py").write_text(src)
    return root


def fates(**by_state) -> dict[str, list[str]]:
    return {s: gen_sorted(by_state[s]) for s in gen.STATES}


def gen_sorted(outcomes) -> list[str]:
    return oracle.sort_outcomes(outcomes)


def _raise_or(other: str) -> str:
    return "raises" if oracle.RAISE_WINS else other


DRAIN_CASES = {
    "classic": (
        """
        if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:
            undone_reqs.append(req)
        elif poll == KVPoll.Success:
            release_kv_cache(req, self.tree_cache)
            done_reqs.append(req)
        elif poll == KVPoll.Failed:
            prepare_abort(req, "failed")
            done_reqs.append(req)
        else:
            raise RuntimeError(poll)
        """,
        "",
        "",
        fates(Failed=["leaves"], Bootstrapping=["raises"], WaitingForInput=["kept"], Transferring=["kept"], Success=["leaves"]),
    ),
    "not_in_and_is": (
        """
        if poll not in (KVPoll.Success, KVPoll.Failed):
            undone_reqs.append(req)
            continue
        if poll is KVPoll.Success:
            done_reqs.append(req)
        """,
        "",
        "",
        fates(Failed=["dropped"], Bootstrapping=["kept"], WaitingForInput=["kept"], Transferring=["kept"], Success=["leaves"]),
    ),
    "flag_early_exit": (
        """
        if req.is_retracted:
            undone_reqs.append(req)
            continue
        if KVPoll.Success == poll:
            self.tree_cache.cache_finished_req(req)
        """,
        "",
        "",
        fates(
            Failed=["kept", "dropped"],
            Bootstrapping=["kept", "dropped"],
            WaitingForInput=["kept", "dropped"],
            Transferring=["kept", "dropped"],
            Success=["kept", "leaves"],
        ),
    ),
    "break_and_return": (
        """
        if poll == KVPoll.Failed:
            done_reqs.append(req)
            break
        if poll == KVPoll.Bootstrapping:
            break
        if poll == KVPoll.Transferring:
            return done_reqs
        if KVPoll.Success != poll:
            undone_reqs.append(req)
        """,
        "",
        "",
        fates(Failed=["leaves"], Bootstrapping=["dropped"], WaitingForInput=["kept"], Transferring=["kept"], Success=["dropped"]),
    ),
    "assert_and_precedence": (
        """
        if poll == KVPoll.WaitingForInput:
            undone_reqs.append(req)
            raise RuntimeError("kept, then raised")
        if poll == KVPoll.Transferring:
            release_kv_cache(req, self.tree_cache)
            assert False, "released, then raised"
        assert poll != KVPoll.Failed
        done_reqs.append(req)
        if poll == KVPoll.Success:
            undone_reqs.append(req)
        """,
        "",
        "",
        fates(
            Failed=["raises"],
            Bootstrapping=["leaves"],
            WaitingForInput=[_raise_or("kept")],
            Transferring=[_raise_or("leaves")],
            Success=["kept"],
        ),
    ),
    "helper_with_poll_keyword": (
        """
        if self._is_done(req, state=poll):
            done_reqs.append(req)
        elif poll != KVPoll.Failed:
            undone_reqs.append(req)
        """,
        """
        def _is_done(self, req, state):
            if state == KVPoll.Failed:
                prepare_abort(req, "failed")
                return False
            if state in {KVPoll.Success}:
                return True
            if state == KVPoll.Bootstrapping:
                return req.bootstrap_done
        """,
        "",
        fates(
            Failed=["leaves"],
            Bootstrapping=["kept", "leaves"],
            WaitingForInput=["kept"],
            Transferring=["kept"],
            Success=["leaves"],
        ),
    ),
    "calls_outside_the_loop_and_neutral_calls": (
        """
        if poll == KVPoll.Success:
            done_reqs.append(req)
        self.release_lock(req)
        logger.debug("polled %s", poll)
        """,
        "",
        """
        for req in done_reqs:
            maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)
        for req in self.disagg_prefill_inflight_queue:
            release_kv_cache(req, self.tree_cache)
        """,
        fates(Failed=["dropped"], Bootstrapping=["dropped"], WaitingForInput=["dropped"], Transferring=["dropped"], Success=["leaves"]),
    ),
    "flag_shapes_go_both_ways": (
        """
        if self.policy == "prefill_complete":
            undone_reqs.append(req)
        elif req.owner is None:
            self.req_to_metadata_buffer_idx_allocator.free(req.metadata_buffer_index)
        """,
        "",
        "",
        fates(**{s: ["kept", "leaves", "dropped"] for s in gen.STATES}),
    ),
    "short_circuit": (
        """
        if poll == KVPoll.Bootstrapping and req.ready:
            undone_reqs.append(req)
        elif poll in () or not req.ready_2:
            maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)
        """,
        "",
        "",
        fates(
            Failed=["leaves", "dropped"],
            Bootstrapping=["kept", "leaves", "dropped"],
            WaitingForInput=["leaves", "dropped"],
            Transferring=["leaves", "dropped"],
            Success=["leaves", "dropped"],
        ),
    ),
    "helper_without_poll_raises": (
        """
        if poll in (KVPoll.Failed,):
            self._fail(req)
        undone_reqs.append(req)
        """,
        """
        def _fail(self, req):
            release_kv_cache(req, self.tree_cache)
            raise ValueError("transfer failed")
        """,
        "",
        fates(
            Failed=[_raise_or("leaves")],
            Bootstrapping=["kept"],
            WaitingForInput=["kept"],
            Transferring=["kept"],
            Success=["kept"],
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(DRAIN_CASES))
def test_hand_written_drain_loops(name, tmp_path):
    body, helpers, post, expected = DRAIN_CASES[name]
    root = drain_tree(tmp_path, body, helpers, post)
    verdict = oracle.drain_verdict(root)
    assert verdict.fates == expected, verdict.summary()
    assert not verdict.correlated


def test_a_flag_read_twice_is_reported(tmp_path):
    root = drain_tree(
        tmp_path,
        """
        if req.flag:
            undone_reqs.append(req)
        if req.flag:
            done_reqs.append(req)
        """,
    )
    verdict = oracle.drain_verdict(root)
    assert verdict.correlated == {"req.flag"}
    # Execution keeps the two reads equal: kept (both appends) or dropped, never leaves alone.
    assert verdict.fates == fates(**{s: ["kept", "dropped"] for s in gen.STATES})


def test_release_recorded_through_a_helper_and_the_real_utils(tmp_path):
    root = drain_tree(
        tmp_path,
        """
        if poll == KVPoll.Success:
            self._release(req)
        """,
        """
        def _release(self, req):
            release_kv_cache(req, self.tree_cache)
        """,
    )
    verdict = oracle.drain_verdict(root)
    assert verdict.fates[S] == ["leaves"]
    (path,) = verdict.paths[S]
    assert path.effects == ("release_kv_cache",)  # patched: the real utils would add cache_finished_req


@pytest.mark.parametrize("program", [gen.SHAPE_CLASSIC, gen.SHAPE_PENDING], ids=["classic", "pending"])
def test_sglang_shapes(program, tmp_path):
    gen.write_tree(tmp_path, drain=program)
    verdict = oracle.drain_verdict(tmp_path)
    assert verdict.fates == oracle.interpret_drain(program).fates
    if program is gen.SHAPE_PENDING:
        assert verdict.fates == fates(
            Failed=["kept", "leaves"],
            Bootstrapping=["kept", "leaves", "raises"],
            WaitingForInput=["kept"],
            Transferring=["kept", "raises"],
            Success=["kept", "leaves", "raises"],
        ), verdict.summary()


# ---------------------------------------------------------------------------------------------
# Generated drain loops: execution == IR interpretation, path by path


@gen.budget(ci=100, slow=3000)
@given(gen.drain_programs(gen.ALL_FEATURES | gen.OPTIONAL_FEATURES))
@example(gen.SHAPE_CLASSIC)
@example(gen.SHAPE_PENDING)
def test_execution_matches_ir(program):
    files = gen.render_tree(drain=program)
    for rel, text in files.items():
        ast.parse(text, filename=rel)
    with tempfile.TemporaryDirectory() as d:
        root = gen.write_files(Path(d), files)
        executed = oracle.drain_verdict(root)
    interpreted = oracle.interpret_drain(program)
    assert executed.correlated == interpreted.correlated  # repeated tests (repeat_flags, pp_param) read alike
    assert executed.paths == interpreted.paths, (
        "execution:\n" + executed.summary() + "\n\nIR:\n" + interpreted.summary() + "\n\n" + _support.numbered(files["disaggregation/prefill.py"])
    )


def test_generator_can_leave_out_effects_before_raise():
    features = gen.ALL_FEATURES - {"effects_before_raise"}

    @gen.budget(ci=30, slow=300)
    @given(gen.drain_programs(features))
    def check(program):
        for paths in oracle.interpret_drain(program).paths.values():
            for p in paths:
                assert not (p.raised and (p.in_keep or p.in_done or p.in_other or p.effects))

    check()


# ---------------------------------------------------------------------------------------------
# Hand-written senders

CONN_HEAD = """\
import logging
import time

from ..base.conn import BaseKVSender, KVPoll
{extra}
logger = logging.getLogger(__name__)


"""


def sender_tree(root: Path, backends: dict[str, str], common: str | None = None) -> Path:
    gen.write_tree(root)
    shutil.rmtree(root / "disaggregation" / "mock")
    if common is not None:
        (root / "disaggregation" / "common").mkdir()
        (root / "disaggregation" / "common" / "conn.py").write_text(CONN_HEAD.format(extra="") + textwrap.dedent(common))
    for folder, body in backends.items():
        (root / "disaggregation" / folder).mkdir()
        extra = "from ..common.conn import CommonKVSender\n" if common is not None else ""
        (root / "disaggregation" / folder / "conn.py").write_text(CONN_HEAD.format(extra=extra) + textwrap.dedent(body))
    return root


INIT = """
    def __init__(self, mgr, bootstrap_room):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.conclude_state = None
        self.aborted = False
        self.init_time = time.time()
        self.bootstrap_timeout = 30
        self.deadline = time.monotonic() + 60
"""

SENDER_CASES = {
    # name: (backends, common, {backend: {state: (after abort, after timeout)}})
    "nixl_like": (
        {
            "nixl": "class NixlKVSender(BaseKVSender):"
            + INIT
            + """
    def poll(self):
        return self.kv_mgr.check_status(self.bootstrap_room)

    def abort(self):
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed
"""
        },
        None,
        {"nixl": {B: (False, False), W: (False, False), T: (False, False)}},
    ),
    "mooncake_like": (
        {
            "mooncake": "class MooncakeKVSender(BaseKVSender):"
            + INIT
            + """
    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status == KVPoll.Bootstrapping:
            if time.time() - self.init_time > self.bootstrap_timeout:
                return KVPoll.Failed
        return status

    def abort(self):
        self.conclude_state = KVPoll.Failed
"""
        },
        None,
        {"mooncake": {B: (True, True), W: (True, False), T: (True, False)}},
    ),
    "super_with_deadline_and_wrong_attribute": (
        {
            "tcp": """
class TcpKVSender(CommonKVSender):
    def poll(self):
        status = super().poll()
        if status in [KVPoll.WaitingForInput, KVPoll.Transferring] and time.monotonic() > self.deadline:
            return KVPoll.Failed
        return status

    def abort(self):
        self.aborted = True
"""
        },
        "class CommonKVSender(BaseKVSender):"
        + INIT
        + """
    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        return self.kv_mgr.check_status(self.bootstrap_room)

    def abort(self):
        self.conclude_state = KVPoll.Failed
""",
        {"tcp": {B: (False, False), W: (False, True), T: (False, True)}},
    ),
    "helper_overridden_away": (
        {
            "mori": """
class MoriKVSender(CommonKVSender):
    def _timed_out(self):
        return False
""",
            "ascend": """
class AscendKVSender(CommonKVSender):
    pass
""",
        },
        "class CommonKVSender(BaseKVSender):"
        + INIT
        + """
    def poll(self):
        if self._timed_out():
            return KVPoll.Failed
        return self.kv_mgr.check_status(self.bootstrap_room)

    def _timed_out(self):
        return self.bootstrap_timeout <= time.perf_counter() - self.init_time

    def abort(self):
        self.aborted = True
""",
        {
            "mori": {B: (False, False), W: (False, False), T: (False, False)},
            "ascend": {B: (False, True), W: (False, True), T: (False, True)},
        },
    ),
    "hold_success_as_transferring": (
        {
            "mock": "class MockKVSender(BaseKVSender):"
            + INIT
            + """
    def poll(self):
        if self.aborted:
            return KVPoll.Failed
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status == KVPoll.Transferring and time.time() - self.init_time >= self.bootstrap_timeout:
            return KVPoll.Failed
        if status == KVPoll.Success and self.kv_mgr.staging_outstanding:
            return KVPoll.Transferring
        return status

    def abort(self):
        self.aborted = True
"""
        },
        None,
        # Transferring is reached two ways; the timeout covers one of them, which is a way out.
        {"mock": {B: (True, False), W: (True, False), T: (True, True)}},
    ),
}


@pytest.mark.parametrize("name", sorted(SENDER_CASES))
def test_hand_written_senders(name, tmp_path):
    backends, common, expected = SENDER_CASES[name]
    root = sender_tree(tmp_path, backends, common)
    verdicts = oracle.sender_verdicts(root)
    assert set(verdicts) == set(expected)
    for folder, by_state in expected.items():
        v = verdicts[folder]
        assert v.driven == set(gen.STATES), v.summary()
        got = {s: (v.abort_ok[s], v.timeout_ok[s]) for s in gen.NON_TERMINAL}
        assert got == by_state, v.summary()
        assert not v.correlated


def test_shared_bases_and_abstract_senders_are_not_backends(tmp_path):
    root = sender_tree(
        tmp_path,
        {
            "mooncake": "class BaseMooncakeKVSender(BaseKVSender):\n    pass\n\n\n"
            "class CommonThingKVSender(BaseKVSender):\n    pass\n"
        },
    )
    assert oracle.sender_verdicts(root) == {}


def test_sglang_sender_shapes(tmp_path):
    gen.write_tree(tmp_path, senders=gen.SHAPE_SENDERS)
    verdicts = oracle.sender_verdicts(tmp_path)
    assert {s: verdicts["mooncake"].way_out(s) for s in gen.NON_TERMINAL} == {B: True, W: True, T: True}
    assert verdicts["mooncake"].timeout_ok == {**verdicts["mooncake"].timeout_ok, B: True, W: False, T: False}
    assert {s: verdicts["nixl"].way_out(s) for s in gen.NON_TERMINAL} == {B: False, W: False, T: False}


# ---------------------------------------------------------------------------------------------
# Generated sender trees: the oracle runs, and abort's way out is what the IR says


def _method(tree: gen.SenderTree, cls: gen.SenderClass, attr: str):
    chain = [cls] + ([tree.common] if cls.parent == "CommonKVSender" and tree.common else [])
    for c in chain:
        value = getattr(c, attr)
        if value is not None:
            return value
    return None


def _helper(tree: gen.SenderTree, cls: gen.SenderClass, name: str):
    chain = [cls] + ([tree.common] if cls.parent == "CommonKVSender" and tree.common else [])
    for c in chain:
        for h in c.helpers:
            if h.name == name:
                return h
    raise AssertionError(f"no helper {name}")


def expected_abort_way_out(tree: gen.SenderTree, cls: gen.SenderClass) -> bool:
    """From the IR: does the effective poll() (or what it calls) read what abort() writes?"""
    abort = _method(tree, cls, "abort")
    poll = _method(tree, cls, "poll")
    polls = [poll] + ([tree.common.poll] if poll.source == "super" else [])
    read = set()
    for p in polls:
        if p.read is None:
            continue
        if p.read.via_helper is None:
            read.add(p.read.attr)
        else:
            h = _helper(tree, cls, p.read.via_helper)
            if not h.disabled:
                read.add(h.attr)
    return abort.attr in read


# The IR reading below knows the fake manager's world (abort() writes one attribute, the
# manager ignores it); trees with a real manager are checked by hand-written cases below.
FAKE_MANAGER_FEATURES = (gen.SENDER_FEATURES | gen.SENDER_OPTIONAL_FEATURES) - {"manager", "abort_forms", "log_only"}


@gen.budget(ci=60, slow=2000)
@given(gen.sender_trees(FAKE_MANAGER_FEATURES))
@example(gen.SHAPE_SENDERS)
def test_generated_senders(tree):
    files = gen.render_tree(senders=tree)
    for rel, text in files.items():
        ast.parse(text, filename=rel)
    with tempfile.TemporaryDirectory() as d:
        verdicts = oracle.sender_verdicts(gen.write_files(Path(d), files))
    assert set(verdicts) == {folder for folder, _ in tree.backends}
    for folder, cls in tree.backends:
        v = verdicts[folder]
        assert not v.correlated
        assert v.driven, v.summary()
        want = expected_abort_way_out(tree, cls)
        for state in v.driven - set(gen.TERMINAL):
            assert v.abort_ok[state] == want, v.summary()


# ---------------------------------------------------------------------------------------------
# Senders with a real manager: hand-built trees whose verdicts are read off the code


def _mgr_tree(poll: gen.PollDef, abort: gen.AbortDef, manager: gen.ManagerDef, helpers=()) -> gen.SenderTree:
    cls = gen.SenderClass("NixlKVSender", "BaseKVSender", True, poll, abort, tuple(helpers))
    return gen.SenderTree(None, (("nixl", cls),), manager)


THREADS_BWTS = (
    gen.ThreadDef("transfer_worker", (("WaitingForInput", "update", ""), ("Transferring", "update", ""), ("Success", "update", ""))),
)


def test_manager_helper_timeout_on_parameter(tmp_path):
    """Issue 7, item 3: `_expired(status)` gives Bootstrapping a deadline, nothing else; abort()
    writes an attribute poll() never reads. WaitingForInput and Transferring never end."""
    helper = gen.HelperDef("_expired", "param", timeout=gen.Timeout("elapsed_gt", "time", "bootstrap_timeout", on_mgr=True),
                           guard=("Bootstrapping",))
    tree = _mgr_tree(gen.PollDef("check_status", None, (gen.SStep("param_helper", helper="_expired"),)),
                     gen.AbortDef("aborted", False, False),
                     gen.ManagerDef("subscript", "WaitingForInput", "sglang", "plain", THREADS_BWTS, "update", False),
                     (helper,))
    v = oracle.sender_verdicts(gen.write_tree(tmp_path, senders=tree))["nixl"]
    assert set(v.configs) == {"Bootstrapping", "WaitingForInput", "Transferring", "Success"}
    assert {s: v.way_out(s) for s in gen.NON_TERMINAL} == {B: True, W: False, T: False}


def test_manager_absent_room_chain(tmp_path):
    """The background's chain: abort() only tells the manager Failed; that works while the room
    is in the table, but a thread pops it after the last chunk, update_status() ignores Failed
    for an absent room and check_status() reads an absent room as WaitingForInput."""
    threads = THREADS_BWTS + (gen.ThreadDef("_handle_last_chunk", (), clear="pop"),)
    tree = _mgr_tree(gen.PollDef("check_status", None, ()), gen.AbortDef("", False, True, None, "mgr"),
                     gen.ManagerDef("get", "WaitingForInput", "sglang", "plain", threads, "update", False))
    v = oracle.sender_verdicts(gen.write_tree(tmp_path, senders=tree))["nixl"]
    assert oracle.ABSENT in v.configs
    assert {s: v.way_out(s) for s in gen.NON_TERMINAL} == {B: True, W: False, T: True}


def test_manager_noop_update_never_creates_the_room(tmp_path):
    """update_status() ignores an absent room and nothing else creates it: the table never holds
    the room, every poll reads the default."""
    tree = _mgr_tree(gen.PollDef("check_status", None, ()), gen.AbortDef("", False, True, None, "mgr"),
                     gen.ManagerDef("get", "WaitingForInput", "noop_absent", "plain", THREADS_BWTS, "update", False))
    v = oracle.sender_verdicts(gen.write_tree(tmp_path, senders=tree))["nixl"]
    assert v.configs == [oracle.ABSENT]
    assert v.returns == {W} and not v.way_out(W)


# ---------------------------------------------------------------------------------------------
# Regression fixtures still mean what they recorded


@pytest.mark.parametrize("folder", _support.regression_params("fates", mark_known=False))
def test_regression_fates_oracle_is_stable(folder):
    expected = _support.load_expected(folder)["oracle"]
    got = _support.drain_json(oracle.drain_verdict(folder))
    assert {key: got[key] for key in expected} == expected  # fixtures older than modes record fates only


@pytest.mark.parametrize("folder", _support.regression_params("senders", mark_known=False))
def test_regression_senders_oracle_is_stable(folder):
    expected = _support.load_expected(folder)["oracle"]
    assert _support.senders_json(oracle.sender_verdicts(folder)) == expected
