"""A poll() guard on a sender attribute that only a later stage sets (issue 23, the NIXL
`has_sent` raise on the bootstrap queue): generated trees, run, against kvtrace's poll-raises
verdict on the bootstrap queue.

The generated sender's poll() raises once `self.flag` is True, else answers a fixed state
(Bootstrapping: the request stays queued; WaitingForInput: the drain lets it go). One or more of
its methods set the flag, and each method is called from one place: the bootstrap queue's entry
(after it builds the sender, before the append), the drain (on the request it lets go), a later
stage (the scheduler's send, on requests that left the queue), or nowhere in view. The oracle
imports the rendered tree and runs a request through it: entry, then drains, each request that
left handed to the later stage. It records whether poll() raised while the request was queued.

- a raise on the run: kvtrace reports poll-raises on the bootstrap queue;
- no raise: kvtrace reports nothing when every setter is called only by the later stage (the
  shape this tests). A setter run in the reach of the queue may still be reported: in the drain
  the request leaves right after it, and at the entry another call may reset the flag, and
  kvtrace keeps what any of those methods writes, in any order; a setter called nowhere in view
  may have a caller kvtrace cannot see.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from kvtrace.rules.samples import SHARED_FILES

from . import _support, gen

scan_path = _support.kvtrace_scan()
BOOTSTRAP = "disagg_prefill_bootstrap_queue"
PLACES = ("entry", "drain", "later", "nowhere")
METHODS = ("prepare", "init", "send")


@dataclass(frozen=True)
class Shape:
    """Where each sender method is called, which of them set the flag, what poll() answers
    while the flag is unset, and whether the constructor sets it already."""

    calls: tuple[tuple[str, str], ...]  # (method, place)
    setters: tuple[str, ...]
    answer: str  # Bootstrapping | WaitingForInput
    built_set: bool = False


@st.composite
def shapes(draw) -> Shape:
    calls = tuple((m, draw(st.sampled_from(PLACES))) for m in METHODS)
    setters = tuple(m for m in METHODS if draw(st.booleans()))
    return Shape(calls, setters, draw(st.sampled_from(("Bootstrapping", "WaitingForInput"))),
                 draw(st.integers(0, 5)) == 0)


def render_sender(shape: Shape) -> str:
    lines = ["from ..base.conn import BaseKVSender, KVPoll", "", "",
             "class CalmKVSender(BaseKVSender):", "    def __init__(self, mgr, room):",
             f"        self.flag = {shape.built_set}", "        self.room = room", "",
             "    def poll(self) -> KVPoll:", "        if self.flag:",
             '            raise RuntimeError("transfer failed")', f"        return KVPoll.{shape.answer}", "",
             "    def abort(self):", "        pass", ""]
    for method in METHODS:
        lines += [f"    def {method}(self):", f"        self.flag = {method in shape.setters}", ""]
    return "\n".join(lines)


def render_prefill(shape: Shape) -> str:
    def calls_at(place: str, indent: str) -> list[str]:
        return [f"{indent}req.disagg_kv_sender.{m}()" for m, p in shape.calls if p == place]

    lines = ["from .base.conn import KVPoll", "from .utils import poll_and_all_reduce, prepare_abort", "", "",
             "class PrefillBootstrapQueue:", "    def __init__(self, scheduler):", "        self.scheduler = scheduler",
             "        self.queue = []", "", "    def add(self, req, sender_class):",
             "        req.disagg_kv_sender = sender_class(None, req.room)"]
    lines += calls_at("entry", "        ")
    lines += ["        self.queue.append(req)", "", "    def pop_bootstrapped(self):", "        if not self.queue:",
              "            return []", "        polls = poll_and_all_reduce([req.disagg_kv_sender for req in self.queue], None)",
              "        bootstrapped = []", "        still_waiting = []",
              "        for req, poll in zip(self.queue, polls):", "            if poll == KVPoll.Bootstrapping:",
              "                still_waiting.append(req)", "            elif poll == KVPoll.Failed:",
              '                prepare_abort(req, "bootstrap failed")', "            else:"]
    lines += calls_at("drain", "                ")
    lines += ["                bootstrapped.append(req)", "        self.queue = still_waiting", "        return bootstrapped",
              "", "", "class SchedulerDisaggregationPrefillMixin:", "    def init_queues(self):",
              "        self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue(self)", "",
              "    def event_loop_step(self):", "        bootstrapped = self.disagg_prefill_bootstrap_queue.pop_bootstrapped()",
              "        self.send_batch(bootstrapped)", "", "    def send_batch(self, reqs):", "        for req in reqs:",
              "            req.sent = True"]
    lines += calls_at("later", "            ")
    return "\n".join(lines) + "\n"


def write_tree(root: Path, shape: Shape) -> Path:
    files = {**SHARED_FILES, "disaggregation/prefill.py": render_prefill(shape),
             "disaggregation/calm/conn.py": render_sender(shape)}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for folder in ("disaggregation", "disaggregation/base", "disaggregation/calm"):
        (root / folder / "__init__.py").touch()
    return root


def raised_while_queued(root: Path) -> bool:
    """Run one request through the tree: its entry, then drains (each request that left goes
    to the later stage), until it left or enough drains ran. True when poll() raised."""
    name = f"_stage_{abs(hash(root))}"
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

        for sub in ("base", "calm"):
            sub_package = types.ModuleType(f"{name}.{sub}")
            sub_package.__path__ = [str(root / "disaggregation" / sub)]
            sys.modules[f"{name}.{sub}"] = sub_package
        load("base/conn")
        load("utils")
        calm = load("calm/conn")
        prefill = load("prefill")
        scheduler = object.__new__(prefill.SchedulerDisaggregationPrefillMixin)
        scheduler.init_queues()
        req = types.SimpleNamespace(room=7, sent=False)
        scheduler.disagg_prefill_bootstrap_queue.add(req, calm.CalmKVSender)
        for _ in range(3):
            try:
                scheduler.event_loop_step()
            except RuntimeError:
                return True
        return False
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def check(shape: Shape) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = write_tree(Path(d), shape)
        raised = raised_while_queued(root)
        report = scan_path(root)
        queue = next((q for q in report.queues if q.name == BOOTSTRAP), None)
        where = f"\nraised while queued: {raised}\n" + _support.numbered((root / "disaggregation/prefill.py").read_text()) \
            + "\n" + _support.numbered((root / "disaggregation/calm/conn.py").read_text())
        assert queue is not None and queue.drain is not None, "the bootstrap queue is not mapped" + where
        found = [f for f in report.findings if f.rule == "poll-raises" and f.backend == "calm" and f.queue == BOOTSTRAP]
        if raised:
            assert found, "poll() raised while queued, kvtrace reports nothing" + where
            return
        kept = shape.built_set or any(m in shape.setters and p != "later" for m, p in shape.calls)
        if not kept:
            assert not found, "no run raises while queued, kvtrace reports: " + found[0].message + where


@gen.budget(ci=40, slow=400)
@given(shapes())
# The NIXL shape: has_sent set by send(), called only once the request left the queue.
@example(Shape((("prepare", "nowhere"), ("init", "drain"), ("send", "later")), ("send",), "Bootstrapping"))
@example(Shape((("prepare", "entry"), ("init", "drain"), ("send", "later")), ("prepare",), "Bootstrapping"))
@example(Shape((("prepare", "later"), ("init", "later"), ("send", "later")), ("send",), "WaitingForInput"))
@example(Shape((("prepare", "later"), ("init", "later"), ("send", "later")), (), "Bootstrapping", True))
def test_stage_guarded_raise_matches_the_run(shape: Shape) -> None:
    check(shape)
