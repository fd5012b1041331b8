from __future__ import annotations

import ast

from kvtrace.model import Evidence, Finding
from kvtrace.parse import walk
from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.syntax import self_attr
from kvtrace.syntax import enum_member
from kvtrace.rules.manager_model import manager_methods
from kvtrace.rules.samples import MANAGED_SENDER, STANDARD_BRANCHES, drain, manager


class AbsentRoomDefault(Rule):
    """check_status answers a non-terminal state for a room the manager does not know.

    What it does:
        Reads each transfer manager's check method (the pack's `check_method`): reports the
        return that gives a non-terminal poll state for a room absent from the status table,
        `self.request_status.get(room, KVPoll.WaitingForInput)` or `if room not in ...: return
        KVPoll.Bootstrapping`.

    Why it matters:
        A room leaves the table when a request concludes or is cleared, and an update for an
        absent room may be dropped. From then on the sender's poll() answers "still waiting"
        for ever: the default turns a forgotten room into a pinned request.

    Example:
        `return self.request_status.get(bootstrap_room, KVPoll.WaitingForInput)`.

    Fix:
        Answer Failed for a room the manager does not know (and record why), or raise so the
        caller fails the request.
    """

    code = "KVT011"
    name = "absent-room-default"
    title = "Unknown room reads as waiting"
    severity = "warning"
    per_queue = False

    VALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES), "disaggregation/net/conn.py": MANAGED_SENDER,
                     "disaggregation/net/mgr.py": manager()})]
    INVALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES), "disaggregation/net/conn.py": MANAGED_SENDER,
                       "disaggregation/net/mgr.py": manager(
                           check_body="        return self.request_status.get(room, KVPoll.WaitingForInput)")},
                      expect=((None, "WaitingForInput"),))]

    def check(self, ctx: ScanContext) -> list[Finding]:
        findings = []
        enum, waiting = ctx.pack.enum, set(ctx.domain.non_terminal)
        for m in manager_methods(ctx.index, ctx.pack.check_method, ctx.model.managers):
            for node in walk(m.func.node):
                state = line = None
                if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) \
                        and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "get" \
                        and self_attr(node.value.func.value) is not None and len(node.value.args) == 2:
                    state, line = enum_member(node.value.args[1], enum), node.lineno
                elif isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                        and isinstance(node.test.ops[0], ast.NotIn) and isinstance(node.test.left, ast.Name) \
                        and node.test.left.id == m.room and node.body and isinstance(node.body[0], ast.Return) \
                        and node.body[0].value is not None:
                    state, line = enum_member(node.body[0].value, enum), node.body[0].lineno
                if state in waiting and line is not None:
                    message = (f"{m.cls.name}.{m.func.name}() answers {state} for a room it does not know: a room "
                               f"that was cleared (or whose update was dropped) reads as waiting for ever")
                    evidence = [Evidence(m.func.path, m.func.line, f"{m.cls.name}.{m.func.name}()"),
                                Evidence(m.func.path, line, f"absent room -> {state}")]
                    findings.append(self.finding(message, m.func.path, line, None, state, evidence, backends=m.backends))
        return findings
