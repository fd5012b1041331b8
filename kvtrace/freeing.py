"""What frees a request a backend keeps in the queue, in this release, for the on-call engineer:
abort() (when poll() reads what abort() writes), a timeout (which environment variable sets it
and its default, read from the scanned code), or nothing short of a restart; each with lines.

abort() frees a request only if something calls it for a request in this queue: the scheduler's
abort path (an abort request from the client, or its disconnect) loops over the queue and calls
the sender's abort(). Such a loop is looked for in every file scanned: a `for` over the queue
whose body calls `abort()` on the loop's request (`req.disagg_kv_sender.abort()`). When none is
in view, abort() cannot free the request, and the report says so.

A timeout's variable is found from the code, not from a list of names: the names compared at
the timeout check (`elapsed < self.kv_mgr.bootstrap_timeout`) are followed to the assignment
that gives them a value, and that value to an environment read: a call with an upper-case name
and a default (`get_int_env_var("SGLANG_..._TIMEOUT", 300)`, `os.environ.get(...)`) or a
registry attribute (`envs.SGLANG_..._TIMEOUT.get()`), whose declaration (`SGLANG_... =
EnvInt(300)`) is read from the module the registry is imported from.
"""

from __future__ import annotations

import ast
import functools
import keyword
import re
from dataclasses import dataclass, field

from kvtrace.model import Backend, Consequence, Evidence, Report, SourceFile, StateVerdict, TimeoutCheck, WayOut

ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class EnvSetting:
    variable: str
    default: str | None
    read_at: Evidence  # the assignment that reads it
    declared_at: Evidence | None = None  # where its default is declared, when apart
    unread: str | None = None  # the module that declares it (srt/environ.py) when outside.module_beside did not find it


@dataclass(frozen=True)
class AbortCall:
    """A call of the sender's abort method on a request taken from a queue: where, in which
    function, on which queue's loop (its evidence line says all three)."""

    path: str
    line: int
    function: str  # qualified name, or "module level"
    call: str  # the call as written
    queue: str
    loop_line: int

    @property
    def evidence(self) -> Evidence:
        return Evidence(self.path, self.line, f"{self.function}() calls {self.call} on a request of {self.queue} "
                                              f"(loop at line {self.loop_line})")


@dataclass
class Freeing:
    state: str
    how: str  # "abort", "timeout", "nothing", "unknown"
    text: str
    evidence: list[Evidence] = field(default_factory=list)


def what_frees(report: Report, backend: Backend, abort_method: str = "abort") -> list[Freeing]:
    """One entry per non-terminal state the backend's poll() can return. `abort_method`: the
    sender's method that cancels a transfer (the rules pack's `abort_method`)."""
    found = []
    callers = scheduler_aborts(report, abort_method)
    queues = " and ".join(q.name for q in report.queues) or "the queue"
    for state, verdict in backend.verdicts.items():
        timeouts = [t for t in backend.timeouts if state in t.covers]
        parts: list[str] = []
        evidence: list[Evidence] = []
        poll = backend.poll
        abort_frees = verdict.way_out is WayOut.ABORT or (backend.reads_abort_state and verdict.way_out is not WayOut.NONE)
        reads = abort_mechanism(verdict, backend)
        via = list(verdict.abort_via) or ([Evidence(poll.path, poll.line, f"{backend.sender}.poll() reads {backend.abort_state}")]
                                          if poll is not None else [])
        if abort_frees and callers:
            parts.append(f"aborting the request frees it ({reads}); "
                         f"the scheduler does: {_callers_text(callers, abort_method)}")
            evidence += via + [c.evidence for c in callers]
        elif abort_frees:
            parts.append(f"abort() would end it ({reads}), but "
                         f"nothing in the scanned code calls {abort_method}() for a request in {queues}, so abort "
                         f"cannot free it{_scope_hint(report)}")
            evidence += via
        for t in timeouts:
            setting = timeout_setting(report, t)
            if setting is None:
                parts.append(f"a timeout frees it (checked at {t.path}:{t.line}; its setting was not found)")
            else:
                default = f", default {setting.default}" if setting.default is not None else \
                    f", default unknown: it is declared in {setting.unread}, which was not found at, above or " \
                    "just below the scanned folder" if setting.unread else ", default not found"
                parts.append(f"a timeout frees it: {setting.variable}{default} (checked at {t.path}:{t.line})")
                evidence.append(setting.read_at)
                if setting.declared_at is not None:
                    evidence.append(setting.declared_at)
            evidence.append(Evidence(t.path, t.line, f"timeout check covering {state}"))
        if abort_frees and not callers and not timeouts and verdict.way_out is not WayOut.NONE:
            # With the scheduler out of view, an abort there is not ruled out (the grid's note).
            parts.append("no timeout covers it either, so unless code outside the scanned folder aborts it, the request "
                         "stays until the server restarts" if _scope_hint(report) else
                         "no timeout covers it either, so the request stays until the server restarts")
        if verdict.way_out is WayOut.NONE:
            if not callers:
                why = (f"abort() does not end it (nothing in the scanned code calls {abort_method}() for a "
                       f"request in {queues} either)")
            elif backend.has_abort:
                why = f"abort() does not end it ({_callers_text(callers, abort_method)}, to no effect)"
            else:
                why = (f"{backend.sender} has no concrete {abort_method}() ({_callers_text(callers, abort_method)}, "
                       "and none of those calls reaches its poll())")
            stuck = (", so the request stays until the server restarts" if _pinned_anywhere(report, backend, state)
                     else ", but no queue scanned keeps a request in it for good: in each, some path of the drain "
                          "lets it out (its fates under Poll states) or a request enters past it")
            how, text = "nothing", (f"nothing in this release frees it: {why} and "
                                    f"{_unreached_timeouts(report, timeouts, state)}{stuck}")
            # A timeout that ends the state on other runs of poll() is no way out on the run that
            # keeps it: its lines are in the text, its setting is no answer.
            evidence = list(verdict.chain[:3]) + [c.evidence for c in callers[:1]]
        elif verdict.way_out is WayOut.UNKNOWN and not parts:
            how, text = "unknown", f"not decided: {verdict.how}"
        else:
            how = "timeout" if timeouts and verdict.way_out is WayOut.TIMEOUT else "abort" \
                if verdict.way_out is WayOut.ABORT else verdict.way_out.value
            if how == "abort" and not callers:  # abort() would end it, but nothing calls it
                how = "timeout" if timeouts else "nothing"
            text = "; ".join(parts) or verdict.how
        found.append(Freeing(state, how, text, evidence))
    return found


def _pinned_anywhere(report: Report, backend: Backend, state: str) -> bool:
    """Whether a finding says `backend` pins `state` in some queue (an error, or a warning under
    a premise); without one, the backend's poll() never ending the state pins no request (the
    drain lets it out, or no request can be in it there): the grid's verdict, not a restart."""
    from kvtrace.rulemeta import consequence_of  # generated from the rules: read only when a state is pinned

    return any(f.backend == backend.name and f.state == state and consequence_of(f.rule) is Consequence.PINNED
               for f in report.findings)


def _unreached_timeouts(report: Report, timeouts: list[TimeoutCheck], state: str) -> str:
    """Why no timeout frees a pinned state: none covers it, or the checks that end it on other runs
    of poll() are not reached on the run that keeps the request (each named with the condition it
    sits under, read from the code, so the reader sees what that run lacks)."""
    if not timeouts:
        return "no timeout covers it"
    told = []
    for t in timeouts:
        guard = _guard_of(report, t.path, t.line)
        under = f" (it runs only when `{guard[0]}` holds, {t.path}:{guard[1]})" if guard else ""
        told.append(f"the timeout check at {t.path}:{t.line}{under}")
    ends, reached = ("ends", "is") if len(told) == 1 else ("end", "are")
    return f"{' and '.join(told)}, which {ends} {state} on other runs of poll(), {reached} not reached on the run that keeps it"


def _guard_of(report: Report, path: str, line: int) -> tuple[str, int] | None:
    """The condition of the innermost `if` whose body holds `line` (not the check's own test),
    with its line; None when the innermost enclosing branch is an `else` (its condition is a
    negation, told wrongly by quoting the test) or the file cannot be read."""
    source = next((f for f in report.files if f.path == path), None)
    return _innermost_guard(source.text, line) if source is not None and source.text else None


@functools.lru_cache(maxsize=64)
def _innermost_guard(text: str, line: int) -> tuple[str, int] | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    best: tuple[int, ast.If | None] = (0, None)
    for node in ast.walk(tree):
        for branch in ("body", "orelse"):
            stmts = getattr(node, branch, None)
            if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                continue
            first, last = stmts[0].lineno, max(s.end_lineno or s.lineno for s in stmts)
            if first <= line <= last and first > best[0]:
                best = (first, node if isinstance(node, ast.If) and branch == "body" else None)
    guard = best[1]
    return (ast.unparse(guard.test), guard.lineno) if guard is not None else None


def abort_mechanism(verdict: StateVerdict, backend: Backend) -> str:
    """How abort() ends `verdict`'s state, as the analysis found it on the path that concluded
    (the write abort() makes that poll() reads, with lines); the same words wherever abort is told."""
    if verdict.abort_via:
        return ", and ".join(f"{e.note} at {e.path}:{e.line}" for e in verdict.abort_via)
    if backend.abort_state and backend.reads_abort_state:
        return f"poll() reads {backend.abort_state}, which abort() writes"
    return "poll() reads what abort() writes"


def abort_ended(backend: Backend) -> list[str]:
    """The states abort() ends (kvtrace found a path from abort() to a terminal poll())."""
    return [state for state, verdict in backend.verdicts.items() if verdict.way_out is WayOut.ABORT]


def abort_ends_text(backend: Backend) -> str:
    """`abort() ends Bootstrapping (… at conn.py:101, and … at conn.py:92)`: for a backend whose
    poll() never reads the sender's own abort state but still sees an abort another way."""
    ended = abort_ended(backend)
    if not ended:
        return ""
    return f"abort() ends {', '.join(ended)} ({abort_mechanism(backend.verdicts[ended[0]], backend)})"


def _callers_text(callers: list[AbortCall], abort_method: str) -> str:
    """`Scheduler.abort_request() calls abort() for it at managers/scheduler.py:3841`; with the
    queue each call is for when the calls loop over different queues (a request in the inflight
    queue is aborted by the inflight loop, not by the bootstrap queue's)."""
    first = callers[0]
    function = f"{first.function}()"
    if len({c.queue for c in callers}) > 1:
        places = [f"at {c.path}:{c.line} for a request in {c.queue}" for c in callers]
        return f"{function} calls {abort_method}() " + (", ".join(places[:-1]) + " and " + places[-1])
    more = f" and {len(callers) - 1} more place{'s' if len(callers) > 2 else ''}" if len(callers) > 1 else ""
    return f"{function} calls {abort_method}() for it at {first.path}:{first.line}{more}"


def _scope_hint(report: Report) -> str:
    """When only the disaggregation folder was scanned, the scheduler's abort path was not in view:
    every file is in the located folder (`root` is empty when the target is that folder itself)."""
    root = report.root.rstrip("/")
    if not root or all(f.path.startswith(root + "/") for f in report.files):
        return " (the scheduler's files were not scanned: scan the whole srt package to see its abort path)"
    return ""


# (path, sha256, queues, method) -> the calls found: a report is rendered once per backend.
_ABORT_CALLS: dict[tuple[str, str, tuple[str, ...], str], list[AbortCall]] = {}


def scheduler_aborts(report: Report, abort_method: str = "abort") -> list[AbortCall]:
    """Each call of `abort_method()` on the sender of a request taken from one of the report's
    queues, in any file scanned: `for req in self.<queue>: ... req.<sender>.abort()`, with the
    function it is in. The sender is what the request holds itself (`req.<attr>`), not
    something further down (`req.time_stats.trace_ctx.abort(...)` in the drain is a trace's)."""
    queues = tuple(q.name for q in report.queues)
    found: list[AbortCall] = []
    if not queues:
        return found
    for source in report.files:
        text = source.text if source.status == "ok" else None
        if not text or f".{abort_method}(" not in text or not any(q in text for q in queues):
            continue
        key = (source.path, source.sha256, queues, abort_method)
        if key not in _ABORT_CALLS:
            _ABORT_CALLS[key] = _abort_calls(source, text, queues, abort_method)
        found += _ABORT_CALLS[key]
    return found


def _abort_calls(source: SourceFile, text: str, queues: tuple[str, ...], abort_method: str) -> list[AbortCall]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []  # the scan reports the file that does not parse
    found: list[AbortCall] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            if isinstance(child, (ast.For, ast.AsyncFor)):
                queue = _iterated_queue(child.iter, queues)
                names = {n.id for n in ast.walk(child.target) if isinstance(n, ast.Name)}  # `i, req` too
                if queue is not None:
                    for call in _calls_on(child.body, names, abort_method):
                        found.append(AbortCall(source.path, call.lineno, ".".join(scope) or "module level",
                                               ast.unparse(call), queue, child.lineno))
            visit(child, scope)

    visit(tree, [])
    return found


def _iterated_queue(node: ast.expr, queues: tuple[str, ...]) -> str | None:
    """The queue a loop iterates: `self.<queue>` or `self.<queue>.queue` (a queue object's list),
    also through a call that passes it on (`enumerate(self.<queue>)`, `list(...)`)."""
    while isinstance(node, ast.Call) and node.args:
        node = node.args[0]
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return next((q for q in queues if q in names[:2]), None)


def _calls_on(body: list[ast.stmt], names: set[str], method: str) -> list[ast.Call]:
    """Calls `<name>.<attr>.<method>()` in `body`: the method of what the request holds."""
    calls = []
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
                holder = node.func.value
                if isinstance(holder, ast.Attribute) and isinstance(holder.value, ast.Name) and holder.value.id in names:
                    calls.append(node)
    return calls


def _source_lines(report: Report, path: str) -> list[str]:
    source = next((f for f in report.files if f.path == path), None)
    return source.lines if source is not None else []


def timeout_setting(report: Report, check: TimeoutCheck) -> EnvSetting | None:
    lines = _source_lines(report, check.path)
    if not 0 < check.line <= len(lines):
        return None
    names = [n for n in dict.fromkeys(NAME.findall(lines[check.line - 1].split("#")[0]))
             if not keyword.iskeyword(n) and n != "self"]
    # The timeout's own file first, then the backend's folder, then every file scanned.
    folder = check.path.rpartition("/")[0]
    files = sorted(report.files, key=lambda f: (f.path != check.path, not f.path.startswith(folder + "/"), f.path))
    for name in reversed(names):  # the compared value is usually last: `elapsed < self.x.timeout`
        assigned = re.compile(rf"^\s*(?:[\w.]+\.)?{re.escape(name)}\s*(?::[^=]*)?=(?!=)\s*(.+)$")
        for source in files:
            if name not in (source.text or ""):  # the pattern holds the name: no line of this file can match
                continue
            for number, text in enumerate(source.lines, 1):
                match = assigned.match(text)
                if not match:
                    continue
                expression = _expression(source.lines, number - 1, match.group(1))
                found = _env_read(report, source.path, number, expression) if expression is not None else None
                if found is not None:
                    return found
    return None


def _expression(lines: list[str], index: int, first: str) -> ast.expr | None:
    text = first
    for extra in range(6):  # a value written over a few lines
        try:
            return ast.parse(text.strip(), mode="eval").body
        except SyntaxError:
            if index + extra + 1 >= len(lines):
                return None
            text += "\n" + lines[index + extra + 1]
    return None


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)) and not isinstance(node.value, bool):
        return str(node.value)
    return None


def _env_read(report: Report, path: str, line: int, expression: ast.expr) -> EnvSetting | None:
    for node in ast.walk(expression):
        if isinstance(node, ast.Call):
            args = list(node.args)
            for i, arg in enumerate(args):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and ENV_NAME.match(arg.value):
                    default = _literal(args[i + 1]) if i + 1 < len(args) else next(
                        (_literal(k.value) for k in node.keywords if k.arg == "default"), None)
                    return EnvSetting(arg.value, default, Evidence(path, line, f"reads {arg.value}"))
        if isinstance(node, ast.Attribute) and ENV_NAME.match(node.attr) and isinstance(node.value, ast.Name):
            registry = node.value.id
            declared = _declaration(report, path, registry, node.attr)
            default, where = declared if declared is not None else (None, None)
            module = _registry_module(report, path, registry) if declared is None else None
            unread = _as_file(module) if module and _module_on_disk(report, module) is None else None
            return EnvSetting(node.attr, default, Evidence(path, line, f"reads {registry}.{node.attr}"), where, unread)
    return None


def _declaration(report: Report, path: str, registry: str, variable: str) -> tuple[str | None, Evidence] | None:
    """`VARIABLE = EnvInt(300)` in the module `registry` is imported from (or any scanned file)."""
    declared = re.compile(rf"^\s*{re.escape(variable)}\s*(?::[^=]*)?=\s*(.+)$")
    # Only files that hold the name can declare it (splitting every file into lines was most of a
    # cached text report's time).
    candidates: list[tuple[str, list[str]]] = [(f.path, f.lines) for f in report.files if variable in (f.text or "")]
    module = _registry_module(report, path, registry)
    if module is not None:
        on_disk = _module_on_disk(report, module)
        if on_disk is not None:
            candidates.insert(0, on_disk)
    for where, lines in candidates:
        for number, text in enumerate(lines, 1):
            match = declared.match(text)
            if not match:
                continue
            expression = _expression(lines, number - 1, match.group(1))
            if isinstance(expression, ast.Call) and expression.args:
                default = _literal(expression.args[0])
                return default, Evidence(where, number, f"declares {variable}" + (f", default {default}" if default else ""))
    return None


def _registry_module(report: Report, path: str, registry: str) -> str | None:
    """The module the file at `path` imports `registry` from: dotted, or the file a relative
    import names (see _absolute)."""
    module = _imported_from(_source_lines(report, path), registry)
    return _absolute(module, path) if module is not None else None


def _absolute(module: str, importer: str) -> str | None:
    """A relative import's module as the path (relative to the target) of the file it names,
    from the importing file's path (`..envs` in a/b/c.py is a/envs.py); a dotted name as it is;
    None when the dots climb above the target."""
    if not module.startswith("."):
        return module
    rest = module.lstrip(".")
    folder = importer.split("/")[:-1]
    up = len(module) - len(rest) - 1
    if up > len(folder) or not rest:
        return None
    return "/".join(folder[: len(folder) - up] + rest.split(".")) + ".py"


def _as_file(module: str) -> str:
    return module if module.endswith(".py") else module.replace(".", "/") + ".py"


def _imported_from(lines: list[str], name: str) -> str | None:
    pattern = re.compile(rf"^\s*from\s+([\w.]+)\s+import\s+.*\b{re.escape(name)}\b")
    return next((m.group(1) for m in map(pattern.match, lines) if m), None)


def _module_on_disk(report: Report, module: str) -> tuple[str, list[str]] | None:
    from kvtrace.outside import module_beside

    return module_beside(report.target, report.root, module)
