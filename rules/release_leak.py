from __future__ import annotations

import ast

from kvtrace.model import EventKind, Finding, Outcome
from kvtrace.parse import walk
from kvtrace.rules.base import Rule, Sample, ScanContext, drain_evidence, path_evidence
from kvtrace.rules.samples import STANDARD_BRANCHES, drain

# Failed is answered but its KV cache is never given back.
_ABORT_WITHOUT_RELEASE = STANDARD_BRANCHES.replace(
    "            elif poll == KVPoll.Failed:\n                release_kv_cache(req, self.tree_cache)\n",
    "            elif poll == KVPoll.Failed:\n")
# Failed is released and taken out of the queue, but nobody answers the client.
_RELEASE_WITHOUT_ANSWER = STANDARD_BRANCHES.replace(
    "            elif poll == KVPoll.Failed:\n                release_kv_cache(req, self.tree_cache)\n"
    "                prepare_abort(req, \"transfer failed\")\n                done_reqs.append(req)",
    "            elif poll == KVPoll.Failed:\n                release_kv_cache(req, self.tree_cache)")

# Failed is released after the loop, by a method of the drain's class called in a loop over the
# finished list with its indices (as 0.5.23's decode transfer queue does: `for (i, decode_req, _),
# hold in zip(failed, held): ... self._release_request(decode_req)`).
_RELEASED_BY_A_HELPER_AFTER_THE_LOOP = drain(_ABORT_WITHOUT_RELEASE, '''
    def release_request(self, req):
        release_kv_cache(req, self.tree_cache)
''').replace(
    "        for req in done_reqs:\n            self.req_to_metadata_buffer_idx_allocator.free(req.metadata_buffer_index)\n",
    "        for i, req in enumerate(done_reqs):\n"
    "            self.req_to_metadata_buffer_idx_allocator.free(req.metadata_buffer_index)\n"
    "            self.release_request(req)\n")


class ReleaseLeak(Rule):
    """A request ends in the drain loop without giving back what it holds, or without an answer.

    What it does:
        Follows every path on which a poll state takes the request out of the queue. A path
        that ends the request (it calls an abort such as `prepare_abort`) must release every
        resource the pack names (`[effects] resources`: the KV cache, the metadata buffer; a
        queue's `[queue] holds` entry narrows it to what a request in that queue holds), on the
        path or after the loop for the finished list it joins. Any path out must answer
        the client (an abort, an answer call such as `stream_output`, also after the loop) or
        hand the request on (a finished list the drain returns or another queue). Reports the
        state, at the statement that ends the request, with the resources or the answer missing.

    Why it matters:
        A leaked KV cache or metadata buffer slot is capacity the server never gets back: under
        load, each failed transfer shrinks the pool until new requests wait for memory that is
        held by requests nobody tracks. A client never answered waits until its own timeout.

    Example:
        `elif poll == KVPoll.Failed: prepare_abort(req, ...); done_reqs.append(req)` with no
        `release_kv_cache(req, ...)` on that branch nor in the loop over done_reqs.

    Fix:
        Release every resource on each path that ends a request (the same calls as the Success
        branch), and answer the client (prepare_abort + the finished list that is streamed).
        A request handed to the next stage keeps its resources; the next stage owns them.
    """

    code = "KVT006"
    name = "release-leak"
    title = "Request ends without release or answer"
    severity = "warning"
    title_clause = "{states} end{s} without release or answer{from_backend}"

    VALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES)}),
             Sample({"disaggregation/prefill.py": _RELEASED_BY_A_HELPER_AFTER_THE_LOOP})]
    INVALID = [
        Sample({"disaggregation/prefill.py": drain(_ABORT_WITHOUT_RELEASE)}, expect=((None, "Failed"),)),
        Sample({"disaggregation/prefill.py": drain(_RELEASE_WITHOUT_ANSWER)}, expect=((None, "Failed"),)),
    ]

    def check(self, ctx: ScanContext) -> list[Finding]:
        queue = ctx.queue
        if queue.drain is None:
            return []
        returned = _returned_names((queue.drain.owner or queue.drain.func).node)
        findings = []
        for state in ctx.domain.members:
            # Group the paths out by the statement that takes the request out: a resource missing
            # on one path only is usually a release guarded by "does it hold one?" - it leaks
            # only when no path through that exit gives it back.
            exits: dict[tuple[str, int], list] = {}
            for events in ctx.model.paths(state, Outcome.LEAVES):
                where = next((e for kind in (EventKind.ABORT, EventKind.DONE, EventKind.REQUEUE, EventKind.RELEASE)
                              for e in events if e.kind == kind), events[-1])
                exits.setdefault((where.path, where.line), []).append(events)
            for (path, line), group in exits.items():
                problems = [self._problem(ctx, events, returned) for events in group]
                if any(p is None for p in problems):
                    continue
                events = group[0]
                message = f"{state} leaves {ctx.pack.queue} at line {line} {problems[0]}"
                evidence = drain_evidence(ctx) + path_evidence(
                    events, state, (EventKind.CHECK, EventKind.HELPER, EventKind.RELEASE, EventKind.ABORT, EventKind.DONE,
                                   EventKind.REQUEUE, EventKind.ANSWER))
                findings.append(self.finding(message, path, line, None, state, evidence))
                break  # one finding per state: the first leaking exit
        return findings

    @staticmethod
    def _problem(ctx: ScanContext, events, returned: set[str]) -> str | None:
        kinds = {e.kind for e in events}
        released = {ctx.pack.resource_of(e.detail.removesuffix(" (after the loop)")) for e in events if e.kind == EventKind.RELEASE}
        handed_on = EventKind.REQUEUE in kinds or any(e.kind == EventKind.DONE and e.detail in returned for e in events)
        if EventKind.ABORT in kinds:
            missing = [name for name in ctx.pack.held_in(ctx.pack.queue) if name not in released]
            if missing:
                return (f"ending the request (abort) without releasing {', '.join(missing)}: "
                        f"{' and '.join(missing)} leak{'s' if len(missing) == 1 else ''} for every such request")
            return None
        if EventKind.ANSWER not in kinds and not handed_on:
            return ("without an answer to the client: no abort, no answer call and no finished list "
                    "that is streamed or returned, so the client waits for ever")
        return None


def _returned_names(func: ast.AST) -> set[str]:
    """Names the drain function returns (`return done_reqs`): lists handed to the caller."""
    return {n.id for node in walk(func) if isinstance(node, ast.Return) and node.value is not None
            for n in walk(node.value) if isinstance(n, ast.Name)}
