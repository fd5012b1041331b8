"""What the producer does about the queued request's sender after (or just before) the append
that puts it in the queue: the attributes the drain polls a request's sender through, and, per way
in, the sender calls each path makes or passes by. The premises (`rules.premise`), the way in
(`rules.way_in`) and the sender's history (`rules.history`) read it."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtrace.model import Evidence
from kvtrace.parse import walk
from kvtrace.rules.base import ScanContext
from kvtrace.syntax import dotted

if TYPE_CHECKING:
    from kvtrace.index import FuncRef


def polled_attributes(ctx: ScanContext) -> set[str]:
    """The attributes the drain's poll statement reads on each request (`r.disagg_kv_sender`):
    a call through one of them acts on a queued request's sender."""
    drain = ctx.queue.drain
    if drain is None:
        return set()
    if drain.poll_line is not None:
        located = [(drain.func, node) for node in walk(drain.func.node) if isinstance(node, ast.stmt)
                   and node.lineno <= drain.poll_line <= (node.end_lineno or node.lineno)
                   and not isinstance(node, (ast.For, ast.While, ast.If, ast.With, ast.Try, ast.FunctionDef))]
    else:
        located = _helper_poll_statements(ctx, drain.func, 0)
    statements = [node for _, node in located] + _pollers_from_helpers(ctx, located)
    found: set[str] = set()
    for node in statements:
        # A request's attribute (`req.x`, `self.queue[i].x`), not the drain's own (`self.queue`).
        found |= {n.attr for n in walk(node) if isinstance(n, ast.Attribute)
                  and (isinstance(n.value, ast.Subscript)
                       or isinstance(n.value, ast.Name) and n.value.id != "self")}
    return found - {ctx.pack.queue}


def _helper_poll_statements(ctx: ScanContext, func: FuncRef, depth: int) -> list[tuple[FuncRef, ast.stmt]]:
    """A drain that reads its poll values from `self.<helper>()` (`polls = self._poll_with_gate()`,
    a helper per transport mode) polls in the helper: its poll call's statement, and the local
    assignments of the names that call passes (`pollers = [r.receiver for r in self.queue]`),
    in every helper the drain may call for it (each with the function it is in)."""
    found: list[tuple[FuncRef, ast.stmt]] = []
    for stmt in walk(func.node):
        if not isinstance(stmt, (ast.Assign, ast.Return, ast.Expr)) or not isinstance(stmt.value, ast.Call):
            continue
        call = stmt.value
        if ctx.pack.is_poll_call(dotted(call.func, calls=True) or ""):
            if depth == 0:
                continue  # the drain's own poll call would have given it a poll line
            passed = {n.id for n in walk(call) if isinstance(n, ast.Name)}
            found.append((func, stmt))
            found += [(func, a) for a in walk(func.node) if isinstance(a, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id in passed for t in a.targets)]
        elif depth < 2 and (depth > 0 or isinstance(stmt, ast.Assign)) and isinstance(call.func, ast.Attribute) \
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "self" and func.owner is not None:
            # The drain's values come from the helper it assigns from (and what that returns).
            helper = ctx.index.find_method(func.owner, call.func.attr)
            if helper is not None and helper is not func:
                found += _helper_poll_statements(ctx, helper, depth + 1)
    return found


def _pollers_from_helpers(ctx: ScanContext, statements: list[tuple[FuncRef, ast.stmt]]) -> list[ast.stmt]:
    """The pollers a poll statement gets from a method of its own (`poll_and_all_reduce(
    self._pollers(), ...)`, whose `return [dr.kv_receiver for dr in self.queue]` names the
    request's receiver): that method's return statements, and theirs for the methods they return from."""
    found: list[ast.stmt] = []
    todo = [(func, node, 0) for func, node in statements]
    seen: set[int] = set()
    while todo:
        func, node, depth = todo.pop()
        if depth >= 2 or func.owner is None:
            continue
        for call in walk(node):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
                continue
            helper = ctx.index.find_method(func.owner, call.func.attr)
            if helper is None or helper is func or id(helper.node) in seen:
                continue
            seen.add(id(helper.node))
            returns = [r for r in walk(helper.node) if isinstance(r, ast.Return) and r.value is not None]
            found += returns
            todo += [(helper, r, depth + 1) for r in returns]
    return found


SEND_SKIPPED = "the send after the request enters the queue is skipped"


# The same, when a call that can be skipped comes before the append (on the request's way in).
SEND_SKIPPED_ON_THE_WAY_IN = "the sender call on the request's way into the queue, or after it, is skipped"


@dataclass(frozen=True)
class SenderCall:
    """A call of a sender method on the request that the producer makes around the append."""

    method: str
    at: Evidence
    before: bool = False  # made before the append, on the request's way in


@dataclass
class SendFlow:
    """What the rest of the producer's path does about the sender, path by path: the calls it
    makes, whether some path leaves early without one (`exited`) or reaches the end without one
    (`open_end`), and the conditions that make such a path."""

    calls: list[SenderCall]
    exited: bool
    open_end: bool
    skips: list[Evidence]

    @property
    def skipped(self) -> bool:
        return self.exited or self.open_end


def sender_flows_after_entry(ctx: ScanContext, methods: set[str]) -> list[SendFlow]:
    """Per entry site: the calls of `methods` on the appended request's sender on the rest of
    the producer's path (its iteration or its function), through `self.<helper>(req, ...)`, and
    whether a path passes them all by (an `if` around them, an early exit before them)."""
    attrs = polled_attributes(ctx)
    if not attrs:
        return []
    found: list[SendFlow] = []
    for site in ctx.entries:
        func = function_at(ctx, site.path, site.line)
        if func is None:
            continue
        located = append_at(func.node, site.line)
        if located is None:
            continue
        name, rest = located
        found.append(sender_flow(ctx, func, rest, name, attrs, methods, 0))
    return found


def function_at(ctx: ScanContext, path: str, line: int):
    best = None
    for func in ctx.index.all_functions():
        if func.path == path and func.node.lineno <= line <= (func.node.end_lineno or func.node.lineno):
            if best is None or func.node.lineno > best.node.lineno:
                best = func
    return best


def append_at(func: ast.AST, line: int) -> tuple[str, list[ast.stmt]] | None:
    """The name appended at `line` and the statements that follow it on the same path, up to
    the end of the enclosing loop body (the request's iteration) or of the function."""
    def search(body: list[ast.stmt], outer: list[ast.stmt]) -> tuple[str, list[ast.stmt]] | None:
        for i, stmt in enumerate(body):
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.lineno == line \
                        and stmt.value.args and isinstance(stmt.value.args[0], ast.Name):
                    return stmt.value.args[0].id, body[i + 1:] + outer
                loop = isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
                after = [] if loop else body[i + 1:] + outer
                for child in blocks_of(stmt):
                    hit = search(child, after)
                    if hit is not None:
                        return hit
        return None
    return search(getattr(func, "body", []), [])


def blocks_of(stmt: ast.stmt) -> list[list[ast.stmt]]:
    blocks = [getattr(stmt, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(stmt, f, None), list)]
    blocks += [h.body for h in getattr(stmt, "handlers", [])]
    blocks += [c.body for c in getattr(stmt, "cases", [])]
    return blocks


def sender_flow(ctx: ScanContext, func, stmts: list[ast.stmt], name: str, attrs: set[str], methods: set[str],
          depth: int, before: bool = False) -> SendFlow:
    """The paths through `stmts`: a call of one of `methods` on `name`'s sender closes a path;
    an `if` splits it; a return/continue/break ends it unsent. Loops and try bodies may not
    run: their calls close nothing (a path past them stays open). `before`: the statements come
    before the append, where a path that leaves the producer never enters the queue (it skips
    nothing; a helper that returns early still skips its send)."""
    entering = before and depth == 0
    flow = SendFlow([], False, True, [])
    for stmt in stmts:
        if not flow.open_end:
            break
        if isinstance(stmt, ast.If):
            cond = ast.unparse(stmt.test)[:80]
            body = sender_flow(ctx, func, stmt.body, name, attrs, methods, depth, before)
            orelse = sender_flow(ctx, func, stmt.orelse, name, attrs, methods, depth, before)
            flow.calls += body.calls + orelse.calls
            flow.skips += body.skips + orelse.skips
            flow.skips += [Evidence(func.path, stmt.lineno, note) for holds, note in (
                (body.exited and not body.calls and not entering, f"`{cond}` leaves before the send"),
                (orelse.exited and not orelse.calls and not entering, f"`not ({cond})` leaves before the send"),
                (body.calls and orelse.open_end and not orelse.calls, f"skips it when `{cond}` is false"),
                (orelse.calls and body.open_end and not body.calls, f"skips it when `{cond}` holds")) if holds]
            flow.exited |= body.exited or orelse.exited
            flow.open_end = body.open_end or orelse.open_end
            continue
        if isinstance(stmt, (ast.Return, ast.Continue, ast.Break)):
            flow.exited, flow.open_end = True, False
            break
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            inner = sender_flow(ctx, func, stmt.body, name, attrs, methods, depth, before)
            flow.calls += inner.calls
            flow.skips += inner.skips
            flow.exited |= inner.exited
            flow.open_end = inner.open_end
            continue
        blocks = blocks_of(stmt)
        if blocks:  # a loop, a try, a match: what it calls may not run, an exit in it may be its own
            for block in blocks:
                inner = sender_flow(ctx, func, block, name, attrs, methods, depth, before)
                flow.calls += inner.calls
                flow.skips += inner.skips
            continue
        for node in walk(stmt):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            recv = node.func.value
            if isinstance(recv, ast.Attribute) and recv.attr in attrs and isinstance(recv.value, ast.Name) \
                    and recv.value.id == name:
                if node.func.attr in methods:
                    where = "before the append" if before else "after the append"
                    flow.calls.append(SenderCall(node.func.attr, Evidence(func.path, node.lineno,
                                                                          f"{ast.unparse(node.func)}() {where}"), before))
                    flow.open_end = False
            elif isinstance(recv, ast.Name) and recv.id == "self" and depth < 2 and func.owner is not None:
                helper = ctx.index.find_method(func.owner, node.func.attr)
                param = bound_param(helper, node, name) if helper is not None else None
                if param is not None:
                    inner = sender_flow(ctx, helper, helper.node.body, param, attrs, methods, depth + 1, before)
                    flow.calls += inner.calls
                    flow.skips += inner.skips
                    if inner.calls and not inner.skipped:
                        flow.open_end = False  # the helper sends on every path
    return flow


def bound_param(helper, call: ast.Call, name: str) -> str | None:
    params = [a.arg for a in helper.node.args.posonlyargs + helper.node.args.args][1:]
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id == name and i < len(params):
            return params[i]
    for kw in call.keywords:
        if isinstance(kw.value, ast.Name) and kw.value.id == name and kw.arg is not None:
            return kw.arg
    return None
