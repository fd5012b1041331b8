from __future__ import annotations

import ast

from kvtrace.model import Evidence, Finding
from kvtrace.parse import walk
from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.syntax import self_attr
from kvtrace.syntax import enum_member
from kvtrace.rules.manager_model import ManagerMethod, manager_methods, slot_aliases
from kvtrace.rules.samples import MANAGED_SENDER, STANDARD_BRANCHES, drain, manager


_OPENING_ONLY = '''\
        current = self.request_status.get(room)
        if current is None:
            if status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput):
                self.request_status[room] = status
            return
        self.request_status[room] = status'''
_FAILED_RETURNS = '''\
        if room not in self.request_status:
            if status == KVPoll.Failed:
                return
            self.request_status[room] = status
            return
        self.request_status[room] = status'''
_ANY_STATUS = '''\
        if room not in self.request_status:
            self.request_status[room] = status
            return
        self.request_status[room] = status'''


class SilentStatusDrop(Rule):
    """update_status(room, Failed) returns without effect when the room is not in the table.

    What it does:
        Reads each transfer manager's update method (the pack's `update_method`): finds the
        branch taken when the room is absent from the status table (`room not in
        self.request_status`, `current is None` after `.get(room)`, or the missing `else` of
        `if room in ...`) and follows it with status = Failed. Reports the branch when no store
        into the table is reached. Callers that only call it when `room in request_status` are
        added as evidence: their abort never reaches the table either.

    Why it matters:
        A room is absent after the sender cleared it or before the first update arrived. An
        abort or a transfer failure recorded then is silently lost: check_status keeps
        answering the old (or default) state, and the request waits for ever.

    Example:
        `if current is None: if status in (Bootstrapping, WaitingForInput): store; return`.

    Fix:
        Store Failed whatever the room's presence (Failed must always land), or return a value
        the caller checks and fails the request itself.
    """

    code = "KVT010"
    name = "silent-status-drop"
    title = "Failed update dropped for an absent room"
    severity = "warning"
    per_queue = False

    VALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES), "disaggregation/net/conn.py": MANAGED_SENDER,
                     "disaggregation/net/mgr.py": manager(update_body=_ANY_STATUS)})]
    INVALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES), "disaggregation/net/conn.py": MANAGED_SENDER,
                       "disaggregation/net/mgr.py": manager(update_body=_OPENING_ONLY)}, expect=((None, "Failed"),)),
               # An `if` whose taken branch returns ends the path: the store after it is not reached.
               Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES), "disaggregation/net/conn.py": MANAGED_SENDER,
                       "disaggregation/net/mgr.py": manager(update_body=_FAILED_RETURNS)}, expect=((None, "Failed"),))]

    def check(self, ctx: ScanContext) -> list[Finding]:
        findings = []
        failed = next((t for t in ctx.domain.terminal if t == "Failed"), None) or (ctx.domain.terminal or (None,))[0]
        if failed is None:
            return []
        for m in manager_methods(ctx.index, ctx.pack.update_method, ctx.model.managers):
            if m.table is None:
                continue
            args = [a.arg for a in m.func.node.args.args]
            status = args[2] if len(args) > 2 else None
            aliases = slot_aliases(m.func.node, m.table, m.room)
            for node in walk(m.func.node):
                if not isinstance(node, ast.If):
                    continue
                absent = _absent_branch(node, m, aliases)
                if absent is None or _reaches_store(absent, m, status, failed, ctx.pack.enum):
                    continue
                guards = _guarded_callers(ctx, m, failed)
                message = (f"{m.cls.name}.{m.func.name}({m.room}, {failed}) returns without effect when {m.room} is "
                           f"not in self.{m.table} (the branch at line {node.lineno}): the failure is lost and "
                           f"{ctx.pack.check_method} keeps answering the old state")
                if guards:
                    message += f"; {len(guards)} caller(s) also skip it unless the room is present"
                evidence = [Evidence(m.func.path, m.func.line, f"{m.cls.name}.{m.func.name}()"),
                            Evidence(m.func.path, node.lineno, f"absent room: no store of {failed}")]
                evidence += [Evidence(p, line, f"note: abort guarded by `if room in ...{m.table}`") for p, line in guards]
                findings.append(self.finding(message, m.func.path, node.lineno, None, failed, evidence,
                                             backends=m.backends))
                break
        return findings


def _absent_branch(node: ast.If, m: ManagerMethod, aliases: set[str]) -> list[ast.stmt] | None:
    test = node.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) \
            and test.left.id == m.room and self_attr(test.comparators[0]) == m.table:
        if isinstance(test.ops[0], ast.NotIn):
            return node.body
        if isinstance(test.ops[0], ast.In):
            return node.orelse
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) \
            and test.left.id in aliases and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value is None:
        return node.body if isinstance(test.ops[0], ast.Is) else node.orelse if isinstance(test.ops[0], ast.IsNot) else None
    return None


def _decide(test: ast.expr, status: str | None, value: str, enum: str) -> bool | None:
    """The test's truth with `status` == value, or None when it does not depend on it alone."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) and test.left.id == status:
        op, right = test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) and enum_member(right, enum):
            same = enum_member(right, enum) == value
            return same if isinstance(op, (ast.Eq, ast.Is)) else not same
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            names = [enum_member(e, enum) for e in right.elts]
            if all(names):
                return (value in names) == isinstance(op, ast.In)
    return None


def _reaches_store(stmts: list[ast.stmt], m: ManagerMethod, status: str | None, value: str, enum: str) -> bool:
    return _flow(stmts, m, status, value, enum)[0]


def _flow(stmts: list[ast.stmt], m: ManagerMethod, status: str | None, value: str, enum: str) -> tuple[bool, bool]:
    """(some path stores into the table, some path falls off the end of `stmts`), with
    `status` == value. An `if` whose every taken branch returns ends the block: the statements
    after it are not reached (`if status == Failed: return` before the store)."""
    for stmt in stmts:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Subscript) and self_attr(t.value) == m.table
                                                for t in stmt.targets):
            return True, False
        if isinstance(stmt, (ast.Return, ast.Raise)):
            return False, False
        if isinstance(stmt, ast.If):
            truth = _decide(stmt.test, status, value, enum)
            branches = ([stmt.body] if truth is not False else []) + ([stmt.orelse] if truth is not True else [])
            results = [_flow(b, m, status, value, enum) for b in branches]
            if any(stored for stored, _ in results):
                return True, False
            if not any(falls for _, falls in results):
                return False, False
    return False, True


def _guarded_callers(ctx: ScanContext, m: ManagerMethod, failed: str) -> list[tuple[str, int]]:
    found = []
    for module in ctx.index.modules.values():
        if not (ctx.index.may_name(module, m.table) and ctx.index.may_name(module, m.func.name)):
            continue
        for node in walk(module.tree):
            if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.ops[0], ast.In) \
                    and isinstance(node.test.comparators[0], ast.Attribute) and node.test.comparators[0].attr == m.table:
                for inner in (n for stmt in node.body for n in walk(stmt)):
                    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) \
                            and inner.func.attr == m.func.name \
                            and any(enum_member(a, ctx.pack.enum) == failed for a in inner.args):
                        found.append((module.source.path, node.lineno))
    return sorted(set(found))
