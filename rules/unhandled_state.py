from __future__ import annotations

from typing import TYPE_CHECKING

from kvtrace.model import EventKind, Evidence, Finding, Outcome
from kvtrace.rules.base import Rule, Sample, ScanContext, drain_evidence, path_evidence, returned_by
from kvtrace.rules.premise import clause, crash_premise
from kvtrace.rules.reentry_premise import reentry_premise
from kvtrace.rules.samples import STANDARD_BRANCHES, drain
from kvtrace.rules.state_crash import crash_sites

if TYPE_CHECKING:
    from kvtrace.flow import Event

# The standard chain whose catch-all raises instead of keeping: Bootstrapping crashes the loop.
_ELSE_RAISES = STANDARD_BRANCHES.replace(
    "            else:\n                undone_reqs.append(req)",
    '            else:\n                raise ValueError(f"Unexpected poll case: {poll}")')
# A chain that tests only the waiting states and keeps everything else: Failed is kept for ever.
_CATCH_ALL_KEEPS = '''\
            if poll == KVPoll.Success:
                release_kv_cache(req, self.tree_cache)
                done_reqs.append(req)
            else:
                undone_reqs.append(req)'''

# A catch-all taken as "still waiting" that asserts an invariant not about the poll value first:
# the assert fails, if ever, for every state alike, so no state is unhandled there.
_CATCH_ALL_ASSERTS = '''\
            if poll == KVPoll.Success:
                release_kv_cache(req, self.tree_cache)
                done_reqs.append(req)
            elif poll == KVPoll.Failed:
                release_kv_cache(req, self.tree_cache)
                prepare_abort(req, "transfer failed")
                done_reqs.append(req)
            else:
                assert req.metadata_buffer_index is not None
                undone_reqs.append(req)'''

# A catch-all that runs a helper asserting a number, not the poll value: `prefix_len` is an int
# (None made 0, or whatever the request carries), and `== 0` tests that int, not Failed (= 0).
_CATCH_ALL_ASSERTS_A_NUMBER = (_CATCH_ALL_ASSERTS.replace(
    "assert req.metadata_buffer_index is not None", "self.reserve(req, req.prefix_len)"), '''
    def reserve(self, req, prefix_len=None):
        if prefix_len is None:
            prefix_len = 0
        if self.sparse_mode:
            assert prefix_len == 0
        req.reserved_len = prefix_len
''')

# After the chain, every request runs a helper that refuses a configuration: the raise is reached
# by every state alike (Success and Failed on the paths that matched them too), so it is no state
# falling to a catch-all.
_CONFIGURATION_CHECK = (STANDARD_BRANCHES.replace(
    "            else:\n                undone_reqs.append(req)",
    "            else:\n                undone_reqs.append(req)\n            self.reserve(req)"), '''
    def reserve(self, req):
        if self.sparse_mode and self.transfer_backend != "mooncake":
            raise NotImplementedError("sparse mode needs the mooncake backend")
        req.reserved = True
''')


class UnhandledState(Rule):
    """A poll state no branch of the drain loop handles: it crashes the scheduler or is kept for ever.

    What it does:
        Follows every path of the drain loop for each poll state S and keeps the paths on which
        no test of the poll value was true for S (S reached a catch-all, or no branch at all).
        Reports S when such a path raises (an `else: raise`, an `assert False`: the exception
        leaves the scheduler's event loop) and `state-crash` does not already report it there
        (a backend returns S and every path that tests it raises), or when S is terminal and the catch-all keeps it (a
        finished transfer that never leaves). A catch-all that drops S is `dropped-state`'s. A raise
        every state reaches alike (a configuration the code refuses, an assert on something else than
        the poll value) tests no state: it is not reported per state. A raise a state reaches only
        through a room another receiver moved there says so (the premise, as for `state-crash`).

    Why it matters:
        A state the author did not expect is exactly the one a new backend or a timeout starts
        returning. An `else` that raises turns it into a scheduler crash that takes every
        request on the server down; a catch-all that keeps a terminal state pins it silently.

    Example:
        `if poll in [WaitingForInput, Transferring]: keep / elif Success / elif Failed / else:
        raise ValueError(...)`: Bootstrapping, returned by a sender whose handshake is not yet
        done, raises out of the drain loop.

    Fix:
        Give every state a branch: keep the non-terminal ones (with a deadline), and fail the
        request (release, prepare_abort, finished list) for anything unexpected instead of raising.
    """

    code = "KVT004"
    name = "unhandled-state"
    title = "Poll state no branch handles"
    severity = "warning"
    title_clause = "{states} reach{es} no branch of the drain{from_backend}"

    VALID = [Sample({"disaggregation/prefill.py": drain(STANDARD_BRANCHES)}),
             Sample({"disaggregation/prefill.py": drain(_CATCH_ALL_ASSERTS)}),
             Sample({"disaggregation/prefill.py": drain(*_CATCH_ALL_ASSERTS_A_NUMBER)}),
             Sample({"disaggregation/prefill.py": drain(*_CONFIGURATION_CHECK)})]
    INVALID = [
        Sample({"disaggregation/prefill.py": drain(_ELSE_RAISES)}, expect=((None, "Bootstrapping"),)),
        Sample({"disaggregation/prefill.py": drain(_CATCH_ALL_KEEPS)}, expect=((None, "Failed"),)),
    ]

    def check(self, ctx: ScanContext) -> list[Finding]:
        queue = ctx.queue
        if queue.drain is None:
            return []
        findings = []
        alike = _raised_by_every_state(queue.paths, ctx.domain.members)
        for state in ctx.domain.members:
            # Paths on which the poll value was tested and no test matched: S fell to a catch-all.
            # A path that keeps S without testing it at all (a mode: "not my turn yet") is not one.
            unmatched = _unmatched(queue.paths.get(state, []))
            crashes: dict[tuple[str, int], list] = {}
            certain = crash_sites(ctx, state)  # state-crash's (an error): not repeated here
            for events, outcome in unmatched:
                raise_event = next((e for e in reversed(events) if e.kind == EventKind.RAISE), None)
                if outcome == Outcome.RAISES and raise_event is not None \
                        and (raise_event.path, raise_event.line) not in certain \
                        and (raise_event.path, raise_event.line) not in alike \
                        and not _assert_not_about_poll(raise_event, events):
                    crashes.setdefault((raise_event.path, raise_event.line), events)
            # A terminal state that a catch-all keeps on one path and lets out on another of the same
            # mode (a `break` while a buffer is full, then the hand-over) waits; one kept in a mode
            # where no path lets it out (the way out is another mode's) is pinned.
            kept = _kept_for_ever(ctx, state) if state in ctx.domain.terminal else []
            by = returned_by(ctx, state)
            who = f" (returned by: {', '.join(by)})" if by else " (no backend's poll() is seen returning it)"
            # Where the drain does test S (on other paths), the crash is the path's, not the loop's.
            tested = sorted({e.line for events, _ in queue.paths.get(state, []) for e in events
                             if e.kind == EventKind.CHECK and e.detail == "T"})
            # What the state reaching the raise rests on, as for state-crash (a state the poll
            # answers only for a room another receiver or sender moved there).
            premise = (crash_premise(ctx, state) or reentry_premise(ctx, state)) if crashes else None
            for (path, line), events in crashes.items():
                raise_event = next(e for e in reversed(events) if e.kind == EventKind.RAISE)
                helper = raise_event.function != queue.drain.func.qualname
                unmatched_where = (f"is tested in the drain loop of {ctx.pack.queue} (line {tested[0]}), but on "
                                   + (f"the path through {raise_event.function}()" if helper else "another path")
                                   + " it matches no test of the poll value it meets"
                                   if tested else f"matches no test of the poll value in the drain loop of {ctx.pack.queue}")
                message = (f"{state}{who} {unmatched_where} "
                           f"and reaches {'an' if raise_event.detail == 'assert' else 'a'} {raise_event.detail} at "
                           f"line {line} ({raise_event.function}): the exception leaves the drain loop (a scheduler crash)")
                evidence = drain_evidence(ctx) + path_evidence(events, state) + [
                    Evidence(path, line, f"raise: {state} not expected here")]
                if premise is not None:
                    message += "; " + clause(premise)
                    evidence += [e for e in premise.why if e not in evidence]
                findings.append(self.finding(message, path, line, None, state, evidence,
                                             premise))
            for events in kept[:1]:
                keep = next((e for e in events if e.kind == EventKind.KEEP), None)
                if keep is not None:
                    where, how = keep, f"the catch-all at line {keep.line} keeps it"
                else:  # kept because the loop returns before the queue is reassigned
                    where = [e for e in events if e.kind == EventKind.CHECK][-1]
                    how = f"after the test at line {where.line} the drain returns before reassigning the queue"
                message = (f"{state} is terminal but matches no test of the poll value in the drain loop of "
                           f"{ctx.pack.queue}: {how}, and it never changes again, so the request stays in the "
                           f"queue for ever")
                evidence = drain_evidence(ctx) + path_evidence(events, state) + [
                    Evidence(where.path, where.line, f"{state} stays in the queue")]
                findings.append(self.finding(message, where.path, where.line, None, state, evidence))
        return findings


def _assert_not_about_poll(raise_event: Event, events: list[Event]) -> bool:
    """An `assert` whose test is not about the poll value (`assert req.metadata_buffer_index is not
    None` after the allocator check) fails, if ever, for every state alike: it is no state falling
    to a catch-all. An assert on the poll value records its test at the same line."""
    return raise_event.detail == "assert" and not any(
        e.kind == EventKind.CHECK and (e.path, e.line) == (raise_event.path, raise_event.line) for e in events)


def _raised_by_every_state(paths: dict, states: tuple[str, ...]) -> set[tuple[str, int]]:
    """The raise sites every poll state reaches (on any of its paths, matched or not): a check of
    something else than the poll value (a configuration the code refuses, an invariant), which
    raises whatever the state, when its own condition holds. A crash at configuration, if that
    configuration is used, not a state the drain forgot: no state is unhandled there."""
    reached: list[set[tuple[str, int]]] = []
    for state in states:
        sites = set()
        for events, outcome in paths.get(state, []):
            raise_event = next((e for e in reversed(events) if e.kind == EventKind.RAISE), None)
            if outcome == Outcome.RAISES and raise_event is not None:
                sites.add((raise_event.path, raise_event.line))
        reached.append(sites)
    return set.intersection(*reached) if reached else set()


def _unmatched(paths: list) -> list:
    """The paths on which the poll value was tested and no test matched (S fell to a catch-all)."""
    return [(events, outcome) for events, outcome in paths
            if any(e.kind == EventKind.CHECK for e in events)
            and not any(e.kind == EventKind.CHECK and e.detail == "T" for e in events)]


def _kept_for_ever(ctx: ScanContext, state: str) -> list[list]:
    """The catch-all paths that keep `state`, in the modes of the drain where no catch-all path
    lets it out: a mode's request never runs another mode's paths."""
    per_mode = [every for _, _, every in ctx.model.deciding(state)] or [ctx.queue.paths.get(state, [])]
    kept: list[list] = []
    for paths in per_mode:
        unmatched = _unmatched(paths)
        if not any(outcome == Outcome.LEAVES for _, outcome in unmatched):
            kept += [events for events, outcome in unmatched if outcome == Outcome.KEPT]
    return kept
