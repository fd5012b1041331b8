"""The verdict oracle: what a fixture tree really does, found by running it.

Drain loops (`drain_verdict`): the tree's `prefill.py` is imported as a package from the tree's
folder, the scheduler method is called with one queued request whose sender polls to each KVPoll
state in turn, and what happens to that request is recorded. Conditions that are not about the
poll value read flags (attributes of the fake `req` or `self` that nothing else defines); every
flag is a free input that answers None or ANY (truthy, equal to everything). The oracle walks
every assignment of the flags actually read, depth first (a run is a path), so a state's fate is
the set of outcomes over all paths. A flag read twice on one path is reported in
`DrainVerdict.correlated` (kvtrace treats two reads as independent, execution does not; the
generator never produces it, the property tests assert it).

Outcomes, per path, as kvtrace defines them (first match wins):
  raises   an exception (raise, failed assert) escaped the iteration, whatever happened before
           it (the queue is never reassigned; see RAISE_WINS);
  kept     the request is in the list assigned back to the queue (`undone_reqs`), or the drain
           method returned inside the loop before reassigning the queue;
  leaves   not kept, and appended to another list (`done_reqs`, `self.<other>`) or a
           release/abort call happened during the loop's iteration (helpers included; calls after
           the loop do not count);
  dropped  none of the above.

Senders (`sender_verdicts`): every concrete `*KVSender` subclass of BaseKVSender in a backend
folder is constructed with a fake manager (whose check_status answers a fixed state and whose
update_status/record_failure change nothing) and a fake clock (injected as the module-level
`time` of every module of the tree). For each manager state and flag assignment the oracle polls
once (the state S the sender is driven to), then either calls abort() or moves the clock past
every timeout, and polls N more times: the sender has a way out for S if some such run reaches
Success or Failed.

`interpret_drain` is a second, independent oracle over the generator's IR (no rendering, no
fakes); the self-check tests compare the two path by path.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import logging
import sys
import textwrap
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import gen
from .gen import DONE_LIST, DRAIN_CLASS, DRAIN_METHOD, KEEP_LIST, OUTCOMES, QUEUE_ATTR, STATES, TERMINAL

# If True, an exception escaping the iteration is `raises` whatever happened before it (what
# kvtrace's graph.outcome_of does: an append or a release before the raise does not count, the
# queue is never reassigned). If False, the outcome list read top-down: `kept`/`leaves` first.
RAISE_WINS = True
MAX_PATHS = 1 << 12
POLLS_AFTER = 3  # polls after abort() / after the clock moved
CLOCK_START = 1000.0
CLOCK_FAR = 1e12
EXPECTED_EXCEPTIONS = (RuntimeError, ValueError, AssertionError)


class OracleError(Exception):
    """The tree did something the oracle cannot judge (a bug in the generator or the oracle)."""


def classify(in_keep: bool, returned_in_loop: bool, in_done: bool, effects, raised) -> str:
    if RAISE_WINS and raised:
        return "raises"
    if in_keep or returned_in_loop:
        return "kept"
    if in_done or effects:
        return "leaves"
    if raised:
        return "raises"
    return "dropped"


def sort_outcomes(outcomes) -> list[str]:
    seen = set(outcomes)
    unknown = seen - set(OUTCOMES)
    if unknown:
        raise OracleError(f"unknown outcomes {sorted(unknown)}")
    return [o for o in OUTCOMES if o in seen]


# ---------------------------------------------------------------------------------------------
# Free flags and the depth-first walk over their values


class _Any:
    """A flag value that is truthy and equal to everything (the other value is None)."""

    def __bool__(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return True

    def __ne__(self, other) -> bool:
        return False

    def __hash__(self) -> int:
        return 1

    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()
FLAG_VALUES = (None, ANY)


class Chooser:
    """Answers flag reads along one path; `prefix` fixes the first choices."""

    def __init__(self, prefix: list[int]) -> None:
        self.prefix = prefix
        self.trace: list[int] = []
        self.names: list[str] = []
        self.values: dict[str, int] = {}
        self.correlated: set[str] = set()
        self._in_call: set[str] = set()

    def new_call(self) -> None:
        """Start of a call (sender polls): a flag read again in a later call keeps its value."""
        self._in_call = set()

    def value(self, key: str):
        if key in self.values:
            if key in self._in_call:
                self.correlated.add(key)
            self._in_call.add(key)
            return FLAG_VALUES[self.values[key]]
        i = len(self.trace)
        c = self.prefix[i] if i < len(self.prefix) else 0
        self.trace.append(c)
        self.names.append(key)
        self.values[key] = c
        self._in_call.add(key)
        return FLAG_VALUES[c]

    def assignment(self) -> tuple[tuple[str, int], ...]:
        return tuple(zip(self.names, self.trace))


def explore(run, max_paths: int = MAX_PATHS):
    """Call run(chooser) once per path; yields (chooser, result)."""
    prefix: list[int] = []
    for _ in range(max_paths):
        ch = Chooser(prefix)
        result = run(ch)
        yield ch, result
        t = ch.trace
        i = len(t) - 1
        while i >= 0 and t[i] == 1:
            i -= 1
        if i < 0:
            return
        prefix = t[:i] + [1]
    raise OracleError(f"more than {max_paths} paths")


# ---------------------------------------------------------------------------------------------
# Loading a tree


_counter = itertools.count()


class LoadedTree:
    def __init__(self, root: Path, pkg: str) -> None:
        self.root = root
        self.pkg = pkg
        self.disagg = root / "disaggregation"

    def module(self, rel: str):
        return importlib.import_module(f"{self.pkg}.{rel}")

    def modules(self):
        return [m for name, m in list(sys.modules.items()) if name == self.pkg or name.startswith(self.pkg + ".")]

    def kvpoll(self):
        return self.module("base.conn").KVPoll

    def state_names(self) -> dict[int, str]:
        kv = self.kvpoll()
        return {getattr(kv, s): s for s in STATES}


@contextmanager
def load_tree(root: Path):
    """Import `<root>/disaggregation` as a fresh package (relative imports work); forget it after."""
    pkg = f"_kvtrace_oracle_{next(_counter)}"
    disagg = Path(root) / "disaggregation"
    if not disagg.is_dir():
        raise OracleError(f"{root}: no disaggregation folder")
    spec = importlib.machinery.ModuleSpec(pkg, None, is_package=True)
    spec.submodule_search_locations = [str(disagg)]
    module = importlib.util.module_from_spec(spec)
    sys.modules[pkg] = module
    # The tree's module loggers are children of this one: keep their warnings off stderr.
    logging.getLogger(pkg).setLevel(logging.CRITICAL + 1)
    old_dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # never leave __pycache__ in a regression fixture
    try:
        yield LoadedTree(Path(root), pkg)
    finally:
        sys.dont_write_bytecode = old_dont_write
        for name in [n for n in sys.modules if n == pkg or n.startswith(pkg + ".")]:
            del sys.modules[name]
        for key in [k for k in sys.path_importer_cache if str(k).startswith(str(disagg))]:
            del sys.path_importer_cache[key]


# ---------------------------------------------------------------------------------------------
# Drain loops


@dataclass(frozen=True)
class PathRecord:
    state: str
    flags: tuple[tuple[str, int], ...]
    outcome: str
    # In the list assigned back to the queue; False (not observed) when the method returned
    # inside the loop, which is `kept` whatever the list holds.
    in_keep: bool
    in_done: bool
    in_other: bool  # appended to another list of self (self.waiting_queue)
    returned_in_loop: bool
    effects: tuple[str, ...]
    raised: str | None
    mode: str = ""  # the drain's mode this path ran in (see drain_modes)


@dataclass
class DrainVerdict:
    fates: dict[str, list[str]]  # every mode together
    paths: dict[str, list[PathRecord]]
    correlated: set[str] = field(default_factory=set)
    modes: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # mode label -> state -> fate

    def summary(self) -> str:
        lines = []
        for state in STATES:
            lines.append(f"{state}: {self.fates[state]}")
            for p in self.paths[state]:
                flags = ", ".join(f"{k}={'ANY' if v else 'None'}" for k, v in p.flags) or "-"
                extra = []
                if p.effects:
                    extra.append("effects=" + "+".join(p.effects))
                if p.raised:
                    extra.append("raised=" + p.raised)
                if p.in_keep:
                    extra.append("in undone_reqs")
                if p.in_done:
                    extra.append("in done_reqs")
                if p.in_other:
                    extra.append("in self.waiting_queue")
                if p.returned_in_loop:
                    extra.append("returned in loop")
                lines.append(f"    [{flags}] -> {p.outcome} {' '.join(extra)}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Modes: how the callers in the tree call the drain (kvtrace's labels, graph.find_modes)


class FakeRids:
    """A `rids_to_check` a caller passes: whether the request's rid is in it is a free flag
    (the same answer every time it is asked on one path)."""

    def __init__(self, chooser: Chooser) -> None:
        self._chooser = chooser

    def __contains__(self, rid) -> bool:
        return self._chooser.value(f"param.{gen.MODE_PARAM}") is ANY

    def __repr__(self) -> str:
        return "FakeRids"


PASSED = "passed"  # a mode value: the caller's rids_to_check (FakeRids)


def drain_modes(param: bool, callers: tuple[str, ...], unseen: bool = False) -> list[tuple[str, tuple]]:
    """(label, the values of rids_to_check to run) per mode, default first. No parameter: one
    mode. No caller passes it: its default only. A caller passes it: that mode runs the passed
    value, and None too when no mode has the default (a value kvtrace cannot read may be None).
    `unseen`: the class that composes the drain's is not in view (the backends' folder scanned
    alone, or a tree without the scheduler), so callers outside are unseen and a parameter no
    caller in view passes is free: a mode runs it passed (issue 23)."""
    if not param:
        return [("default", (None,))]
    modes = []
    default = not callers or "none" in callers
    if default:
        modes.append((f"{gen.MODE_PARAM}=None", (None,)))
    if any(kind != "none" for kind in callers):
        modes.append((f"{gen.MODE_PARAM} passed", (PASSED,) if default else (None, PASSED)))
    elif unseen:
        modes.append((f"{gen.MODE_PARAM} passed (no caller in view)", (PASSED,)))
    return modes


def composed_in_view(root: Path, folder: bool) -> bool:
    """Whether a file the scan reads defines a class deriving from the drain's class or builds
    it: then the object, and so every caller of the drain, is in view."""
    for path in sorted((root / "disaggregation" if folder else root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).split(".")[-1] == DRAIN_CLASS
                                                      for b in node.bases):
                return True
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == DRAIN_CLASS:
                return True
    return False


def tree_modes(source: str, unseen: bool = False) -> list[tuple[str, tuple]]:
    """drain_modes, read from a rendered prefill.py (so regression folders replay without IR)."""
    tree = ast.parse(source)
    drain = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == DRAIN_METHOD)
    param = any(a.arg == gen.MODE_PARAM for a in drain.args.args)
    callers = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == DRAIN_METHOD:
            callers.append("keyword" if node.keywords else "positional" if node.args else "none")
    return drain_modes(param, tuple(callers), unseen)


def _by_mode(paths: dict[str, list[PathRecord]], modes: list[tuple[str, tuple]]) -> dict[str, dict[str, list[str]]]:
    return {label: {state: sort_outcomes(r.outcome for r in paths[state] if r.mode == label) for state in STATES}
            for label, _ in modes}


def _loop_lines(source: str) -> tuple[int, int]:
    """First and last line of the drain loop's body."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == DRAIN_METHOD:
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.For)
                    and isinstance(inner.iter, ast.Call)
                    and QUEUE_ATTR in ast.unparse(inner.iter)
                ):
                    return inner.body[0].lineno, inner.end_lineno or inner.body[-1].lineno
    raise OracleError(f"no `for ... in zip(self.{QUEUE_ATTR}, ...)` in {DRAIN_METHOD}")


def _find_drain_class(module):
    for obj in vars(module).values():
        if inspect.isclass(obj) and obj.__module__ == module.__name__ and DRAIN_METHOD in vars(obj):
            return obj
    raise OracleError(f"no class defines {DRAIN_METHOD}")


class _Events:
    """Release/abort calls made while the drain frame is inside its loop body."""

    def __init__(self, code, lo: int, hi: int) -> None:
        self.code, self.lo, self.hi = code, lo, hi
        self.items: list[str] = []

    def recorder(self, kind: str):
        def record(*args, **kwargs):
            f = sys._getframe(1)
            while f is not None:
                if f.f_code is self.code:
                    if self.lo <= f.f_lineno <= self.hi:
                        self.items.append(kind)
                    return None
                f = f.f_back
            return None

        return record


class _Obj:
    """A plain object carrying recorder methods."""

    def __init__(self, **methods) -> None:
        self.__dict__.update(methods)


class FakeReq:
    def __init__(self, chooser: Chooser, sender) -> None:
        self.__dict__["_chooser"] = chooser
        self.disagg_kv_sender = sender
        self.rid = "rid-0"
        self.metadata_buffer_index = 3
        self.finished_reason = None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self.__dict__["_chooser"].value(f"req.{name}")

    def __repr__(self) -> str:
        return "FakeReq(rid-0)"


class KVTransferError(RuntimeError):
    pass


class _FakeSender:
    """The request's sender: poll() answers the state under test; any other method (the
    generator's FailCall sites, one name each) raises KVTransferError or not, a free flag."""

    def __init__(self, value, chooser: Chooser) -> None:
        self.value = value
        self._chooser = chooser

    def poll(self):
        return self.value

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        chooser = self.__dict__["_chooser"]

        def method(*args, **kwargs):
            if chooser.value(f"sender.{name}") is ANY:
                raise KVTransferError(f"{name} failed")

        return method


def _scheduler_class(drain_cls):
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self.__dict__["_chooser"].value(f"self.{name}")

    return type("FakeScheduler", (drain_cls,), {"__getattr__": __getattr__})


def drain_verdict(root: Path, folder: bool = False) -> DrainVerdict:
    """Run the drain loop of the tree at `root` for every state and every flag assignment
    (`folder`: in the modes a scan of the backends' folder alone gives, see drain_modes)."""
    root = Path(root)
    source = (root / "disaggregation" / "prefill.py").read_text(encoding="utf-8")
    lo, hi = _loop_lines(source)
    with load_tree(root) as tree:
        prefill = tree.module("prefill")
        kvpoll = tree.kvpoll()
        drain_cls = _find_drain_class(prefill)
        method = vars(drain_cls)[DRAIN_METHOD]
        code = method.__code__
        sched_cls = _scheduler_class(drain_cls)
        correlated: set[str] = set()
        modes = tree_modes(source, not composed_in_view(root, folder))
        paths: dict[str, list[PathRecord]] = {state: [] for state in STATES}
        for state, label, param_value in [(s, m, v) for s in STATES for m, values in modes for v in values]:
            value = getattr(kvpoll, state)

            def run(ch: Chooser, value=value, state=state, param_value=param_value) -> PathRecord:
                events = _Events(code, lo, hi)
                prefill.poll_and_all_reduce = lambda pollers, group=None, *a, **k: [p.poll() for p in pollers]
                prefill.release_kv_cache = events.recorder("release_kv_cache")
                prefill.maybe_release_metadata_buffer = events.recorder("metadata_buffer")
                prefill.prepare_abort = events.recorder("abort")
                req = FakeReq(ch, _FakeSender(value, ch))
                sched = object.__new__(sched_cls)
                queue = [req]
                sched.__dict__.update(
                    _chooser=ch,
                    group=None,
                    tree_cache=_Obj(cache_finished_req=events.recorder("cache_finished_req")),
                    req_to_metadata_buffer_idx_allocator=_Obj(free=events.recorder("allocator_free")),
                    send_kv_chunk=lambda *a, **k: None,
                    release_lock=lambda *a, **k: None,
                    waiting_queue=[],
                )
                sched.__dict__[QUEUE_ATTR] = queue
                raised = None
                in_keep = in_done = returned = False
                args = (FakeRids(ch),) if param_value == PASSED else ()
                try:
                    result = method(sched, *args)
                except EXPECTED_EXCEPTIONS as exc:
                    if isinstance(exc, RecursionError):
                        raise OracleError("recursion in a generated drain loop") from exc
                    raised = type(exc).__name__
                    loc = _frame_locals(exc, code)
                    in_keep = any(r is req for r in loc.get(KEEP_LIST) or ())
                    in_done = any(r is req for r in loc.get(DONE_LIST) or ())
                except Exception as exc:  # pragma: no cover - a generator or oracle bug
                    raise OracleError(f"{state}: unexpected {type(exc).__name__}: {exc}") from exc
                else:
                    final = sched.__dict__[QUEUE_ATTR]
                    if final is queue:
                        returned = True  # returned inside the loop: the queue was not reassigned
                    else:
                        in_keep = any(r is req for r in final)
                    in_done = any(r is req for r in (result or ()))
                effects = tuple(events.items)
                in_other = any(r is req for r in sched.__dict__["waiting_queue"])
                outcome = classify(in_keep, returned, in_done or in_other, effects, raised)
                return PathRecord(state, (), outcome, in_keep, in_done, in_other, returned, effects, raised)

            for ch, rec in explore(run):
                paths[state].append(dataclasses.replace(_with_flags(rec, ch.assignment()), mode=label))
                correlated |= ch.correlated
        fates = {state: sort_outcomes(r.outcome for r in paths[state]) for state in STATES}
        return DrainVerdict(fates, paths, correlated, _by_mode(paths, modes))


def _with_flags(rec: PathRecord, flags) -> PathRecord:
    return dataclasses.replace(rec, flags=flags)


def _frame_locals(exc: BaseException, code) -> dict:
    tb = exc.__traceback__
    found = {}
    while tb is not None:
        if tb.tb_frame.f_code is code:
            found = dict(tb.tb_frame.f_locals)
        tb = tb.tb_next
    return found


# ---------------------------------------------------------------------------------------------
# The IR interpreter (a second oracle, over gen's IR)


class _Stop(Exception):
    """continue / break: the iteration ends."""


class _Ret(Exception):
    """return inside the drain loop."""


class _Raised(Exception):
    def __init__(self, kind: str) -> None:
        self.kind = kind


class _HRet(Exception):
    def __init__(self, value) -> None:
        self.value = value


_RELEASE_EFFECT = {
    "release_kv_cache": "release_kv_cache",
    "cache_finished_req": "cache_finished_req",
    "metadata_buffer": "metadata_buffer",
    "allocator_free": "allocator_free",
}


class _IREnv:
    def __init__(self, state: str, ch: Chooser, param_value=None) -> None:
        self.state = state
        self.ch = ch
        self.param_value = param_value  # None or PASSED
        self.keep = False
        self.done = False
        self.other = False
        self.effects: list[str] = []


def _truth(cond, env: _IREnv, pollvar_bound: bool):
    if isinstance(cond, gen.PollTest):
        assert pollvar_bound
        v = env.state
        if cond.op in ("==", "is"):
            return v == cond.states[0]
        if cond.op in ("!=", "is not"):
            return v != cond.states[0]
        if cond.op == "in":
            return v in cond.states
        if cond.op == "not in":
            return v not in cond.states
        raise AssertionError(cond.op)
    if isinstance(cond, gen.FlagTest):
        val = env.ch.value(f"{cond.owner}.{cond.name}")
        return {
            "truthy": val is ANY,
            "not": val is None,
            "is None": val is None,
            "is not None": val is ANY,
            "eq": val is ANY,
            "ne": val is None,
            "poll_eq": val is ANY,
        }[cond.shape]
    if isinstance(cond, gen.ParamTest):
        is_set = env.param_value is not None

        def contains() -> bool:
            if not is_set:
                raise OracleError("`req.rid in rids_to_check` with rids_to_check None")
            return env.ch.value(f"param.{gen.MODE_PARAM}") is ANY

        return {
            "set": lambda: is_set,
            "unset": lambda: not is_set,
            "waiting": lambda: is_set and not contains(),
            "agreed": lambda: is_set and contains(),
            "rid_not_in": lambda: not contains(),
            "rid_in": contains,
        }[cond.shape]()
    if isinstance(cond, gen.CallTest):
        r = bool(_call(cond.helper, env))
        return (not r) if cond.negate else r
    if isinstance(cond, gen.NotTest):
        return not _truth(cond.operand, env, pollvar_bound)
    if isinstance(cond, gen.BoolTest):
        if cond.op == "and":
            return all(_truth(c, env, pollvar_bound) for c in cond.operands)  # all() short-circuits
        return any(_truth(c, env, pollvar_bound) for c in cond.operands)
    raise TypeError(cond)


def _call(helper: gen.Helper, env: _IREnv):
    try:
        _block(helper.body, env, helper.poll_param is not None)
    except _HRet as r:
        return r.value
    return None


def _block(stmts, env: _IREnv, pollvar_bound: bool) -> None:
    for s in stmts:
        if isinstance(s, gen.Keep):
            env.keep = True
        elif isinstance(s, gen.Done):
            env.done = True
        elif isinstance(s, gen.Requeue):
            env.other = True
        elif isinstance(s, gen.FailCall):
            if env.ch.value(f"sender.{s.name}") is ANY:
                raise _Raised("KVTransferError")
        elif isinstance(s, gen.Try):
            try:
                _block(s.body, env, pollvar_bound)
            except _Raised:
                _block(s.handler, env, pollvar_bound)
        elif isinstance(s, gen.Match):
            for states, block in s.arms:
                if env.state in states:
                    _block(block, env, pollvar_bound)
                    break
            else:
                if s.default is not None:
                    _block(s.default, env, pollvar_bound)
        elif isinstance(s, gen.Release):
            env.effects.append(_RELEASE_EFFECT[s.kind])
        elif isinstance(s, gen.Abort):
            env.effects.append("abort")
        elif isinstance(s, gen.Neutral):
            pass
        elif isinstance(s, (gen.Continue, gen.Break)):
            raise _Stop()
        elif isinstance(s, gen.Return):
            raise _Ret()
        elif isinstance(s, gen.Raise):
            raise _Raised("ValueError" if s.kind == "value" else "RuntimeError")
        elif isinstance(s, gen.Assert):
            if not _truth(s.cond, env, pollvar_bound):
                raise _Raised("AssertionError")
        elif isinstance(s, gen.If):
            if _truth(s.cond, env, pollvar_bound):
                _block(s.body, env, pollvar_bound)
            else:
                _block(s.orelse, env, pollvar_bound)
        elif isinstance(s, gen.Call):
            _call(s.helper, env)
        elif isinstance(s, gen.HReturn):
            if s.value is None or s.value is True or s.value is False:
                raise _HRet(s.value)
            raise _HRet(_truth(s.value, env, pollvar_bound))
        else:
            raise TypeError(s)


def interpret_drain(program: gen.DrainProgram) -> DrainVerdict:
    correlated: set[str] = set()
    modes = drain_modes(program.param, program.callers, not program.composed)
    paths: dict[str, list[PathRecord]] = {state: [] for state in STATES}
    for state, label, param_value in [(s, m, v) for s in STATES for m, values in modes for v in values]:

        def run(ch: Chooser, state=state, param_value=param_value) -> PathRecord:
            env = _IREnv(state, ch, param_value)
            raised = None
            returned = False
            try:
                _block(program.body, env, True)
            except _Stop:
                pass
            except _Ret:
                returned = True
                env.keep = False  # not observable by execution (see PathRecord.in_keep)
            except _Raised as r:
                raised = r.kind
            effects = tuple(env.effects)
            outcome = classify(env.keep, returned, env.done or env.other, effects, raised)
            return PathRecord(state, (), outcome, env.keep, env.done, env.other, returned, effects, raised)

        for ch, rec in explore(run):
            paths[state].append(dataclasses.replace(_with_flags(rec, ch.assignment()), mode=label))
            correlated |= ch.correlated
    fates = {state: sort_outcomes(r.outcome for r in paths[state]) for state in STATES}
    return DrainVerdict(fates, paths, correlated, _by_mode(paths, modes))


# ---------------------------------------------------------------------------------------------
# Senders


class FakeClock:
    """Stands in for the `time` module of every module of a loaded tree."""

    def __init__(self, now: float = CLOCK_START) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    monotonic = perf_counter = time

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeManager:
    """A KV manager whose answer never changes and that ignores updates (assumption A5)."""

    def __init__(self, status, chooser: Chooser) -> None:
        self.__dict__["_status"] = status
        self.__dict__["_chooser"] = chooser

    def check_status(self, room):
        return self.__dict__["_status"]

    def update_status(self, room, status, *a, **k) -> None:
        return None

    def record_failure(self, room, reason, *a, **k) -> None:
        return None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self.__dict__["_chooser"].value(f"kv_mgr.{name}")


@dataclass
class SenderVerdict:
    backend: str  # the folder
    sender: str  # the class name
    returns: set[str]  # every state poll() returned in any run
    driven: set[str]  # states the first poll of a fresh sender returned
    abort_ok: dict[str, bool]  # S -> some run polled S, then after abort() a terminal state
    timeout_ok: dict[str, bool]  # S -> some run polled S, then after the clock moved a terminal state
    correlated: set[str] = field(default_factory=set)
    # S -> {(manager answer, flags read by the first poll): some continuation ends} — a state
    # has a way out only if every way poll() gets to it has one (a configuration that pins it
    # pins it, whatever other configurations do).
    groups: dict[str, dict[tuple, bool]] = field(default_factory=dict)
    configs: list[str] = field(default_factory=list)  # real manager: what the table held (or <absent>)
    # Real manager: states some run other than the sender's __init__ stores for the room (an
    # entry point, from any table contents reached). A state only __init__ stores comes back,
    # once the table moved past it, only with a second sender built for the same room.
    stored_later: set[str] = field(default_factory=set)

    def add(self, ch: Chooser, first: str, later: list[str], mode: str, config: str) -> None:
        """One run: `first` polled from `config`, then `later` after abort() or the clock moved
        ("raise" when a poll raised: no state, and no way out on that run)."""
        self.correlated |= ch.correlated
        self.driven.add(first)
        self.returns.add(first)
        self.returns.update(s for s in later if s != "raise")
        ok = any(s in TERMINAL for s in later)
        table = self.abort_ok if mode == "abort" else self.timeout_ok
        table[first] = table.get(first, False) or ok
        key = (config, tuple(ch.trace[: ch.first_poll]))
        group = self.groups.setdefault(first, {})
        group[key] = group.get(key, False) or ok

    def way_out(self, state: str) -> bool:
        if state in self.groups:
            return all(self.groups[state].values())
        return self.abort_ok.get(state, False) or self.timeout_ok.get(state, False)

    def summary(self) -> str:
        rows = [f"{self.backend} ({self.sender}): returns {sorted(self.returns)}"]
        for s in sorted(self.driven - set(TERMINAL)):
            rows.append(f"    {s}: after abort -> {self.abort_ok.get(s)}, after timeout -> {self.timeout_ok.get(s)}")
        return "\n".join(rows)


def find_senders(tree: LoadedTree) -> list[tuple[str, type]]:
    """(folder, class) of every concrete sender, the way kvtrace's pack defines backends."""
    base = tree.module("base.conn").BaseKVSender
    found = []
    for folder in sorted(p.name for p in tree.disagg.iterdir() if p.is_dir() and (p / "conn.py").is_file()):
        if folder == "base":
            continue
        module = tree.module(f"{folder}.conn")
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and obj.__module__ == module.__name__
                and issubclass(obj, base)
                and obj.__name__.endswith("KVSender")
                and not obj.__name__.startswith(("Base", "Common"))
                and not inspect.isabstract(obj)
            ):
                found.append((folder, obj))
    return found


# --- senders with their real manager -----------------------------------------------------------

ABSENT = "<absent>"  # a configuration: the room is not in the status table
ROOM = 7
ROOM_PARAMS = ("room", "bootstrap_room")


class RecordingDict(dict):
    """A dict that remembers which values were stored under a key, whether a key was removed,
    and whether it was read (to find the table check_status reads)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.stored: list = []  # (key, value) in order
        self.changed: list = []  # the same, for the stores that changed the key's value (or created it)
        self.removed: set = set()
        self.read = False

    def __setitem__(self, key, value) -> None:
        self.stored.append((key, value))
        if not dict.__contains__(self, key) or dict.__getitem__(self, key) != value:
            self.changed.append((key, value))
        super().__setitem__(key, value)

    def setdefault(self, key, default=None):
        if key not in self:
            self.stored.append((key, default))
            self.changed.append((key, default))
        return super().setdefault(key, default)

    def __delitem__(self, key) -> None:
        super().__delitem__(key)
        self.removed.add(key)

    def pop(self, key, *default):
        if key in self:
            self.removed.add(key)
        return super().pop(key, *default)

    def __getitem__(self, key):
        self.read = True
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read = True
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.read = True
        return super().__contains__(key)


def _harness(manager_cls: type) -> type:
    """The real manager class, with attributes nothing assigns answering as free flags (a thread's
    `if self.chunk_ready:`, a poll's `self.kv_mgr.staging_outstanding`)."""

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self.__dict__["_chooser"].value(f"mgr.{name}")

    return type(manager_cls.__name__, (manager_cls,), {"__getattr__": __getattr__})


def find_manager(tree: LoadedTree, folder: str, sender_cls: type) -> type | None:
    """The manager a backend really runs with: the factory's dict, else its folder's class."""
    base = getattr(tree.module("base.conn"), "BaseKVManager", None)
    if base is None:
        return None
    if (tree.disagg / "factory.py").is_file():
        for row in tree.module("factory").KV_CLASSES.values():
            if row.get("sender") is sender_cls:
                return row["manager"]
    module = tree.module(f"{folder}.conn")
    local = [o for o in vars(module).values() if inspect.isclass(o) and issubclass(o, base) and o.__module__ == module.__name__]
    return local[0] if len(local) == 1 else None


class _InlineThread:
    """threading.Thread whose start() runs the target at once, in this thread: a thread started
    by an entry point (a closure over `self` and the room) is run whole, like every entry point."""

    def __init__(self, target=None, args=(), kwargs=None, daemon=None, name=None) -> None:
        self.target, self.args, self.kwargs = target, args, kwargs or {}

    def start(self) -> None:
        if self.target is not None:
            self.target(*self.args, **self.kwargs)


class _InlineThreading:
    Thread = _InlineThread
    Lock = threading.Lock


class _World:
    """One backend, built fresh for every run: the real manager (harnessed) and the sender."""

    def __init__(self, sender_cls: type, manager_cls: type, clock: "FakeClock", folder: str) -> None:
        self.sender_cls, self.manager_cls, self.clock, self.folder = sender_cls, _harness(manager_cls), clock, folder
        for cls in manager_cls.__mro__ + sender_cls.__mro__:
            module = sys.modules.get(cls.__module__)
            if module is not None and getattr(module, "threading", None) is threading:
                module.threading = _InlineThreading
        self.table_attr = self._find_table()

    def manager(self, ch: Chooser):
        mgr = self.manager_cls.__new__(self.manager_cls)
        mgr.__dict__["_chooser"] = ch
        mgr.__init__()
        for name, value in list(vars(mgr).items()):
            if type(value) is dict:
                setattr(mgr, name, RecordingDict(value))
        return mgr

    def _find_table(self) -> str | None:
        mgr = self.manager(Chooser([]))
        try:
            mgr.check_status(ROOM)
        except Exception:
            pass
        return next((n for n, v in vars(mgr).items() if isinstance(v, RecordingDict) and v.read), None)

    def build(self, ch: Chooser):
        """(manager, sender, table) after the sender's __init__ ran (clock at the start)."""
        mgr = self.manager(ch)
        self.clock.now = CLOCK_START
        sender = self.sender_cls(mgr, ROOM)
        table = getattr(mgr, self.table_attr) if self.table_attr else None
        if table is not None:
            table.stored.clear()
            table.changed.clear()
            table.removed.clear()
        return mgr, sender, table


def _called_names(classes) -> set[str]:
    """Method names the classes' own code calls on `self` or on the manager (`self.kv_mgr.x()`)."""
    names: set[str] = set()
    for cls in classes:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                recv = node.func.value
                if isinstance(recv, ast.Name) and recv.id == "self" or isinstance(recv, ast.Attribute) and recv.attr == "kv_mgr":
                    names.add(node.func.attr)
    return names


def _entry_points(world: _World) -> list[tuple[str, str, tuple]]:
    """("mgr"|"sender", method, args): what can run between polls — every method of the manager
    and of the sender that their own code never calls (threads, public entry points such as
    record_failure, abort(), clear(), poll()), except __init__ and update_status, whose status
    comes from its callers. A called method runs inside its callers, with their arguments.
    Manager methods get the room (and a reason); sender methods take nothing."""
    tree_classes = [c for c in world.manager_cls.__mro__[1:] + world.sender_cls.__mro__ if c.__module__.startswith("_kvtrace_oracle_")]
    called = _called_names(tree_classes)
    found = []
    for owner, cls in (("mgr", world.manager_cls), ("sender", world.sender_cls)):
        for name in dir(cls):
            if name.startswith("__") or name in called or name == "update_status":
                continue
            fn = getattr(cls, name, None)
            if not inspect.isfunction(fn) or getattr(fn, "__isabstractmethod__", False):
                continue
            params = list(inspect.signature(fn).parameters)[1:]
            if owner == "mgr" and params and params[0] in ROOM_PARAMS and all(p.endswith("reason") for p in params[1:]):
                found.append((owner, name, (ROOM,) + ("reason",) * (len(params) - 1)))
            elif owner == "sender" and not params:
                found.append((owner, name, ()))
            else:
                raise OracleError(f"{cls.__name__}.{name}{tuple(params)}: an entry point the oracle cannot call")
    return found


def _room_of(table) -> object:
    return dict.get(table, ROOM, ABSENT) if dict.__contains__(table, ROOM) else ABSENT


def reachable_configs(world: _World, name_of) -> tuple[set, dict]:
    """What the table can hold for the room when poll() runs: the sender's __init__ (every flag
    setting), then any entry point run from any state reached so far, to a fixpoint (threads in
    any interleaving, each run whole). Every value stored on the way counts (a poll can come
    between two stores of one thread). Returns (configs, {config: how it was reached})."""
    how: dict = {}
    frontier: list = []

    def note(value, why: str) -> None:
        key = ABSENT if value is ABSENT else name_of(value)
        if key not in how:
            how[key] = why
            frontier.append(key)

    def init_run(ch: Chooser):
        mgr = world.manager(ch)
        table = getattr(mgr, world.table_attr)
        world.clock.now = CLOCK_START
        try:
            world.sender_cls(mgr, ROOM)
        except Exception:
            return [], ABSENT
        return [v for k, v in table.stored if k == ROOM], _room_of(table)

    for _, (stored, end) in explore(init_run):
        for v in stored:
            note(v, "__init__")
        note(end, "__init__")
    entries = _entry_points(world)
    while frontier:
        start = frontier.pop()
        for owner, method, args in entries:
            for clock_far in (False, True):

                def run(ch: Chooser, start=start, owner=owner, method=method, args=args, clock_far=clock_far):
                    try:
                        mgr, sender, table = world.build(ch)
                    except Exception:
                        return [], [], None
                    _force(table, start, world)
                    world.clock.now = CLOCK_FAR if clock_far else CLOCK_START + 1
                    try:
                        getattr(mgr if owner == "mgr" else sender, method)(*args)
                    except Exception:
                        pass  # the thread dies; what it stored stays
                    return [v for k, v in table.stored if k == ROOM], [v for k, v in table.changed if k == ROOM], \
                        _room_of(table)

                for _, (stored, changed, end) in explore(run):
                    for v in stored:
                        note(v, f"{owner}.{method}")
                    # A state stored later is one a store brings the entry to: max(entry, x) writing
                    # back the entry's own value brings nothing back.
                    world.stored_later.update(name_of(v) for v in changed if v is not ABSENT)
                    if end is not None:
                        note(end, f"{owner}.{method}")
    return set(how), how


def _force(table, config, world: _World) -> None:
    """Put the room in `config` (a state name or ABSENT) without recording it."""
    if table is None:
        return
    if config is ABSENT:
        dict.pop(table, ROOM, None)
    else:
        dict.__setitem__(table, ROOM, getattr(world.kvpoll, config))
    table.stored.clear()
    table.changed.clear()
    table.removed.clear()


def _manager_verdict(folder: str, cls: type, manager_cls: type, clock: "FakeClock", kvpoll, name_of) -> "SenderVerdict":
    world = _World(cls, manager_cls, clock, folder)
    world.kvpoll = kvpoll
    configs: list = [None]
    world.stored_later = set()
    if world.table_attr is not None:
        found, _ = reachable_configs(world, name_of)
        configs = sorted(found, key=lambda c: (c is ABSENT, str(c)))
    verdict = SenderVerdict(folder, cls.__name__, set(), set(), {}, {}, configs=[str(c) for c in configs],
                            stored_later=set(world.stored_later))
    for config in configs:
        for mode in ("abort", "timeout"):

            def run(ch: Chooser, config=config, mode=mode):
                try:
                    mgr, sender, table = world.build(ch)
                except Exception as exc:
                    raise OracleError(f"{folder}: __init__: {type(exc).__name__}: {exc}") from exc
                _force(table, config, world)
                clock.now = CLOCK_START + 1
                ch.new_call()
                try:
                    first = name_of(sender.poll())
                except OracleError:
                    raise
                except Exception:
                    return None, []  # the first poll raises: no state to judge
                ch.first_poll = len(ch.trace)
                later = []
                try:
                    if mode == "abort":
                        sender.abort()
                    else:
                        clock.now = CLOCK_FAR
                    for _ in range(POLLS_AFTER):
                        ch.new_call()
                        later.append(name_of(sender.poll()))
                except OracleError:
                    raise
                except Exception:
                    later.append("raise")  # the scheduler sees an exception: no terminal state
                return first, later

            for ch, (first, later) in explore(run):
                if first is not None:
                    verdict.add(ch, first, later, mode, str(config))
    return verdict


def sender_verdicts(root: Path) -> dict[str, SenderVerdict]:
    out: dict[str, SenderVerdict] = {}
    with load_tree(Path(root)) as tree:
        kvpoll = tree.kvpoll()
        names = tree.state_names()
        clock = FakeClock()
        senders = find_senders(tree)  # imports every backend module
        for module in tree.modules():
            if getattr(module, "time", None) is not None and getattr(module.time, "__name__", "") == "time":
                module.time = clock

        def name_of(value) -> str:
            try:
                return names[value]
            except (KeyError, TypeError):
                raise OracleError(f"poll() returned {value!r}, not a KVPoll member") from None

        for folder, cls in senders:
            manager_cls = find_manager(tree, folder, cls)
            if manager_cls is not None:
                out[folder] = _manager_verdict(folder, cls, manager_cls, clock, kvpoll, name_of)
                continue
            verdict = SenderVerdict(folder, cls.__name__, set(), set(), {}, {})
            for mode in ("abort", "timeout"):
                for state in STATES:
                    status = getattr(kvpoll, state)

                    def run(ch: Chooser, status=status, mode=mode):
                        try:
                            clock.now = CLOCK_START
                            sender = cls(FakeManager(status, ch), 7)
                            clock.now = CLOCK_START + 1
                            ch.new_call()
                            first = name_of(sender.poll())
                            ch.first_poll = len(ch.trace)  # flags the first poll read fix its path
                            if mode == "abort":
                                sender.abort()
                            else:
                                clock.now = CLOCK_FAR
                            later = []
                            for _ in range(POLLS_AFTER):
                                ch.new_call()
                                later.append(name_of(sender.poll()))
                        except OracleError:
                            raise
                        except Exception as exc:
                            raise OracleError(f"{folder}: {type(exc).__name__}: {exc}") from exc
                        return first, later

                    for ch, (first, later) in explore(run):
                        verdict.add(ch, first, later, mode, state)
            out[folder] = verdict
    return out


# ---------------------------------------------------------------------------------------------
# kvtrace's side, in the oracle's terms


def kvtrace_fates(report) -> dict[str, list[str]]:
    queue = report.queues[0]
    return {state: list(queue.states[state].fate) for state in STATES if state in queue.states}


def kvtrace_mode_fates(report) -> dict[str, dict[str, list[str]]]:
    """mode label -> state -> fate, as kvtrace gives them per mode of the drain."""
    queue = report.queues[0]
    out: dict[str, dict[str, list[str]]] = {m.label: {} for m in queue.modes}
    for state in STATES:
        for mode in queue.states[state].modes if state in queue.states else []:
            out.setdefault(mode.mode, {})[state] = [str(o) for o in mode.fate]
    return out


def kvtrace_way_out(backend, state: str) -> bool:
    """kvtrace's verdict: no StateVerdict (poll() cannot return the state) or a way out."""
    verdict = backend.way_out(state)
    return verdict is None or not verdict.pinned


def kvtrace_timeout_covers(backend, state: str) -> bool:
    return any(state in t.covers for t in backend.timeouts)
