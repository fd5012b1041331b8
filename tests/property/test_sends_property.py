"""A send on the request's way into the queue or right after the append (issue 23, "a send that
may not happen"; issue 22, one flow over the whole producer path): generated producers, run,
against kvtrace's verdict on the fake backend's WaitingForInput.

The fake sender's poll() answers WaitingForInput until send() ran, and nothing else frees it.
The producer (maybe) reaches `req.disagg_kv_sender.send(...)` before the append, appends the
request to the inflight queue, then (maybe) reaches it after, directly or through a helper, past
generated conditions (`if req.<flag>: continue`, which before the append means the request
never enters; a helper's `if len(pages) == 0: return`; the send inside an `if`; an if/else that
sends on both sides; statements that skip nothing). The oracle imports the rendered prefill.py
and runs the producer under every assignment of the flags it reads; over the runs on which the
request entered the queue:

- no send on any run: the pin needs no premise (an error);
- a send on some runs only: the pin is true only if the send is skipped (a warning whose
  premise says so and whose message names the line that skips it);
- a send on every run: poll() has left WaitingForInput before any drain: no pin.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from kvtrace.rules.send_flow import SEND_SKIPPED, SEND_SKIPPED_ON_THE_WAY_IN
from kvtrace.rules.samples import SHARED_FILES, STANDARD_BRANCHES, drain

from . import _support, gen

scan_path = _support.kvtrace_scan()

FAKE = '''\
from ..base.conn import BaseKVSender, KVPoll


class FakeKVSender(BaseKVSender):
    def __init__(self, mgr, room):
        self.has_sent = False

    def poll(self) -> KVPoll:
        if self.has_sent is False:
            return KVPoll.WaitingForInput
        return KVPoll.Success

    def send(self, pages):
        self.has_sent = True

    def abort(self):
        pass
'''
FLAGS = ("is_retracted", "skip_send", "chunked", "has_pages", "prefix_hit", "grammar_ready", "dp_rank_known")


@dataclass(frozen=True)
class Step:
    """One statement of the producer before or after the append (in the loop) or of the send helper.
    kind: send | call (the helper, which sends) | exit (`if <test>: continue/return`) |
    guarded (the send or the call under `if <test>:`) | both (`if <test>: send else: send`) |
    log (`if <test>: logger...`: skips nothing)."""

    kind: str
    flag: str = ""
    negate: bool = False
    inner: str = "send"  # guarded / both: send | call


Shape = tuple[tuple[Step, ...], tuple[Step, ...], tuple[Step, ...]]


@st.composite
def producers(draw) -> Shape:
    """(the producer's steps before the append, after it, the helper's steps before its send)."""
    flags = iter(draw(st.permutations(FLAGS)))

    def step(where: str) -> Step:
        kind = draw(st.sampled_from(("exit", "log", "guarded", "both") if where == "loop" else ("exit", "log", "guarded")))
        return Step(kind, next(flags), draw(st.booleans()), draw(st.sampled_from(("send", "call"))) if where == "loop" else "send")

    def steps(most: int, send_odds: int) -> list[Step]:
        found = [step("loop") for _ in range(draw(st.integers(0, most)))]
        if draw(st.integers(0, 4)) < send_odds:  # an unconditional send (or helper call) somewhere among them
            found.insert(draw(st.integers(0, len(found))), Step(draw(st.sampled_from(("send", "call")))))
        return found

    before = steps(2, 1)
    loop = steps(2, 4)
    helper = [step("helper") for _ in range(draw(st.integers(0, 2)))]
    return tuple(before), tuple(loop), tuple(helper)


def _test(s: Step) -> str:
    return f"{'not ' if s.negate else ''}req.{s.flag}" if s.flag != "has_pages" else \
        f"len(pages) {'!=' if s.negate else '=='} 0"


def render(before: tuple[Step, ...], loop: tuple[Step, ...], helper: tuple[Step, ...]) -> str:
    def action(inner: str) -> str:
        return "req.disagg_kv_sender.send(pages)" if inner == "send" else "self.send_chunk(req, last=True)"

    def statements(steps: tuple[Step, ...]) -> list[str]:
        lines = []
        for s in steps:
            if s.kind in ("send", "call"):
                lines.append(f"            {action(s.kind)}")
            elif s.kind == "exit":
                lines += [f"            if {_test(s)}:", "                continue"]
            elif s.kind == "log":
                lines += [f"            if {_test(s)}:", '                self.log("room %s", req)']
            elif s.kind == "guarded":
                lines += [f"            if {_test(s)}:", f"                {action(s.inner)}"]
            else:
                lines += [f"            if {_test(s)}:", f"                {action(s.inner)}", "            else:",
                          f"                {action(s.inner)}"]
        return lines

    lines = ["", "    def process_result(self, batch):", "        for req in batch.reqs:", "            pages = req.pages",
             *statements(before), "            self.disagg_prefill_inflight_queue.append(req)", *statements(loop)]
    lines += ["", "    def log(self, *args):", "        pass", "",
              "    def send_chunk(self, req, last=False):", "        pages = req.pages"]
    for s in helper:
        if s.kind == "exit":
            lines += [f"        if {_test(s)}:", "            return"]
        elif s.kind == "log":
            lines += [f"        if {_test(s)}:", '            self.log("room %s", req)']
        else:
            lines += [f"        if {_test(s)}:", "            req.disagg_kv_sender.send(pages)"]
    if not any(s.kind == "guarded" for s in helper):
        lines.append("        req.disagg_kv_sender.send(pages)")
    return "\n".join(lines) + "\n"


def write_tree(root: Path, shape: Shape) -> Path:
    files = {**SHARED_FILES, "disaggregation/prefill.py": drain(STANDARD_BRANCHES, producer=render(*shape)),
             "disaggregation/fake/conn.py": FAKE}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for folder in ("disaggregation", "disaggregation/base", "disaggregation/fake"):
        (root / folder / "__init__.py").touch()
    return root


def sent_on_runs(root: Path) -> set[bool]:
    """Run the producer for one request under every assignment of the flags: on each run on
    which the request entered the queue, whether its sender was sent to."""
    name = f"_sends_{abs(hash(root))}"
    package = types.ModuleType(name)
    package.__path__ = [str(root / "disaggregation")]
    sys.modules[name] = package
    try:
        def load(rel: str):
            module_name = f"{name}.{rel.replace('/', '.')}"
            spec = importlib.util.spec_from_file_location(module_name, root / "disaggregation" / f"{rel}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            return module

        for sub in ("base", "fake"):
            sub_package = types.ModuleType(f"{name}.{sub}")
            sub_package.__path__ = [str(root / "disaggregation" / sub)]
            sys.modules[f"{name}.{sub}"] = sub_package
        load("base/conn")
        load("utils")
        fake = load("fake/conn")
        prefill = load("prefill")
        outcomes = set()
        for values in itertools.product((False, True), repeat=len(FLAGS)):
            req = types.SimpleNamespace(**dict(zip(FLAGS, values)), pages=[1] if values[FLAGS.index("has_pages")] else [],
                                        disagg_kv_sender=fake.FakeKVSender(None, 1))
            scheduler = object.__new__(prefill.PrefillMixin)
            scheduler.disagg_prefill_inflight_queue = []
            scheduler.process_result(types.SimpleNamespace(reqs=[req]))
            if scheduler.disagg_prefill_inflight_queue == [req]:
                outcomes.add(req.disagg_kv_sender.has_sent)
        assert outcomes, "no run lets the request in: the generator must leave it a way"
        return outcomes
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def check(shape: Shape) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = write_tree(Path(d), shape)
        runs = sent_on_runs(root)
        pins = [f for f in scan_path(root).findings if f.rule == "pinned-state" and f.backend == "fake"]
        source = (root / "disaggregation" / "prefill.py").read_text()
        where = f"\nsent on runs: {runs}\n{_support.numbered(source)}"
        if runs == {True}:
            assert pins == [], "every run sends, kvtrace pins: " + pins[0].message + where
            return
        [pin] = pins if pins else [None]
        assert pin is not None, "some run never sends, kvtrace finds no pin" + where
        assert pin.state == "WaitingForInput", pin.message + where
        if runs == {False}:
            assert (pin.premise, pin.severity) == (None, "error"), pin.message + where
        else:
            # The premise names where the call that can be skipped is: after the append only, or also on the way in.
            premise = SEND_SKIPPED_ON_THE_WAY_IN if _sends_before(shape) else SEND_SKIPPED
            assert (pin.premise, pin.severity) == (premise, "warning"), pin.message + where
            assert "leaves before the send" in pin.message or "skips it when" in pin.message, pin.message


def _sends_before(shape: Shape) -> bool:
    """A step before the append can reach a send (directly or through the helper)."""
    return any(s.kind in ("send", "call", "guarded", "both") for s in shape[0])


@gen.budget(ci=60, slow=600)
@given(producers())
@example(((), (Step("send"),), ()))  # 0.5.21 and later: the last chunk is always sent
@example(((), (Step("call"),), (Step("exit", "has_pages", False),)))  # 0.5.10.post1: no pages, no send
@example(((), (Step("both", "chunked"),), ()))  # sent on either side of an if
@example(((), (), ()))  # nothing sends
@example(((Step("send"),), (), ()))  # sent on the way in (the decode side's send_metadata() before the append)
@example(((Step("guarded", "chunked"),), (), ()))  # sent on the way in on some paths only
@example(((Step("exit", "skip_send"),), (Step("send"),), ()))  # a request that leaves early never enters
@example(((Step("call"),), (), (Step("exit", "has_pages", False),)))  # a helper on the way in that may return early
def test_send_around_the_append_matches_the_run(shape: Shape) -> None:
    check(shape)
