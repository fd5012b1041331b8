from __future__ import annotations

import ast

from kvtrace.model import Evidence, Finding
from kvtrace.parse import walk
from kvtrace.rules.base import Rule, Sample, ScanContext
from kvtrace.syntax import enum_member
from kvtrace.rules.manager_model import manager_methods, reads_slot, slot_aliases, stores
from kvtrace.rules.samples import MANAGED_SENDER, STANDARD_BRANCHES, drain, manager


_MAX_MERGE = '''\
        if room not in self.request_status:
            self.request_status[room] = status
        elif status == KVPoll.Failed:
            self.request_status[room] = KVPoll.Failed
        else:
            self.request_status[room] = max(self.request_status[room], status)'''
_STICKY = '''\
        if self.request_status.get(room) == KVPoll.Failed:
            return
        self.request_status[room] = status'''


class FailedNotSticky(Rule):
    """A later status update can overwrite Failed in the manager's table.

    What it does:
        Reads each transfer manager's update method: reports a store into the status table that
        merges the old value with `max()` when Failed is the enum's smallest value (so any later
        progress update replaces it), unless the method first compares the stored value with
        Failed.

    Why it matters:
        A transfer thread that reports progress after the failure (a late chunk, a heartbeat)
        turns Failed back into Transferring or WaitingForInput. The failure is forgotten, the
        poll says "still going", and the request waits for a transfer that will never finish.

    Example:
        `self.request_status[room] = max(self.request_status[room], status)` with
        `class KVPoll: Failed = 0; Bootstrapping = 1; ...`.

    Fix:
        Return early when the stored value is Failed (`if current == KVPoll.Failed: return`)
        before merging.
    """

    code = "KVT012"
    name = "failed-not-sticky"
    title = "Failed can be overwritten"
    severity = "warning"
    per_queue = False

    VALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES), "disaggregation/net/conn.py": MANAGED_SENDER,
                     "disaggregation/net/mgr.py": manager(update_body=_STICKY)})]
    INVALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES), "disaggregation/net/conn.py": MANAGED_SENDER,
                       "disaggregation/net/mgr.py": manager(update_body=_MAX_MERGE)}, expect=((None, "Failed"),))]

    def check(self, ctx: ScanContext) -> list[Finding]:
        domain = ctx.domain
        failed = "Failed" if "Failed" in domain.members else None
        values = dict(zip(domain.members, domain.values))
        if failed is None or values.get(failed) is None or \
                any(v is not None and v < values[failed] for v in values.values()):
            return []  # max() keeps Failed only if some member is smaller: not this defect
        findings = []
        for m in manager_methods(ctx.index, ctx.pack.update_method, ctx.model.managers):
            if m.table is None:
                continue
            aliases = slot_aliases(m.func.node, m.table, m.room)
            guarded = any(isinstance(n, ast.Compare) and len(n.ops) == 1
                          and any(reads_slot(side, m.table, m.room, aliases) for side in (n.left, n.comparators[0]))
                          and any(enum_member(side, ctx.pack.enum) == failed for side in (n.left, n.comparators[0]))
                          for n in walk(m.func.node))
            if guarded:
                continue
            for store in stores(m.func.node, m.table, m.room):
                value = store.value
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "max" \
                        and any(reads_slot(a, m.table, m.room, aliases) for a in value.args):
                    message = (f"{m.cls.name}.{m.func.name}() merges with max() and {failed} = {values[failed]} is the "
                               f"smallest {ctx.pack.enum}: a later update replaces {failed} in self.{m.table}")
                    evidence = [Evidence(m.func.path, m.func.line, f"{m.cls.name}.{m.func.name}()"),
                                Evidence(m.func.path, store.lineno, f"max() merge: {failed} is not kept")]
                    findings.append(self.finding(message, m.func.path, store.lineno, None, failed, evidence, backends=m.backends))
                    break
        return findings
