"""Building blocks for rule samples: a drain loop and a sender, in the pack's shapes.

The harness (tests/test_rules.py) adds `base/conn.py` (the enum and the abstract sender) and
`utils.py`, so a sample shows only what it is about.
"""

from __future__ import annotations

SHARED_FILES = {
    "disaggregation/base/conn.py": '''\
from abc import ABC, abstractmethod


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class BaseKVSender(ABC):
    @abstractmethod
    def poll(self) -> KVPoll: ...

    @abstractmethod
    def abort(self): ...
''',
    "disaggregation/utils.py": '''\
def poll_and_all_reduce(pollers, group):
    return [int(p.poll()) for p in pollers]


def prepare_abort(req, message):
    req.finished_reason = message


def release_kv_cache(req, tree_cache):
    tree_cache.cache_finished_req(req)
''',
}


def drain(branches: str, methods: str = "", entering: str = "", producer: str | None = None) -> str:
    """A prefill mixin whose drain loop body is `branches` (indented 12 spaces), followed by
    `methods` (more methods of the mixin, indented 4 spaces); `entering` (12 spaces) runs on
    each `req` before its append into the queue. `producer` (methods, 4 spaces) replaces the
    one that appends (`finish_batch`): the only way into the queue is then the caller's."""
    if producer is None:
        producer = f'''\
    def finish_batch(self, batch):
        for req in batch.reqs:
{entering}            self.disagg_prefill_inflight_queue.append(req)
'''
    return f'''\
from .base.conn import KVPoll
from .utils import poll_and_all_reduce, prepare_abort, release_kv_cache


class PrefillMixin:
{producer}
    def drain_inflight(self):
        polls = poll_and_all_reduce(
            [r.disagg_kv_sender for r in self.disagg_prefill_inflight_queue], self.group
        )
        undone_reqs = []
        done_reqs = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):
{branches}
        for req in done_reqs:
            self.req_to_metadata_buffer_idx_allocator.free(req.metadata_buffer_index)
        self.disagg_prefill_inflight_queue = undone_reqs
        return done_reqs
{methods}'''


# managers/scheduler.py: the class composed of the prefill mixin, binding its queue, built by the
# process (as SGLang's Scheduler is). With it in view, every caller of the drain is in view;
# without it the object is assembled out of view and a drain parameter no caller passes is free.
SCHEDULER = '''\
from ..disaggregation.prefill import PrefillMixin


class Scheduler(PrefillMixin):
    def __init__(self):
        self.disagg_prefill_inflight_queue = []


def run_scheduler_process():
    Scheduler().event_loop()
'''

STANDARD_BRANCHES = '''\
            if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:
                undone_reqs.append(req)
            elif poll == KVPoll.Success:
                release_kv_cache(req, self.tree_cache)
                done_reqs.append(req)
            elif poll == KVPoll.Failed:
                release_kv_cache(req, self.tree_cache)
                prepare_abort(req, "transfer failed")
                done_reqs.append(req)
            else:
                undone_reqs.append(req)'''


def sender(name: str, poll_body: str, extra: str = "", fields: str = "") -> str:
    """A backend sender class `<name>KVSender` whose poll() body is `poll_body` (8 spaces),
    `extra` more methods (4 spaces), `fields` more constructor lines (8 spaces)."""
    return f'''\
import time

from ..base.conn import BaseKVSender, KVPoll


class {name}KVSender(BaseKVSender):
    def __init__(self, mgr, room):
        self.mgr = mgr
        self.room = room
        self.conclude_state = None
        self.started = time.time()
        self.bootstrap_timeout = 300
{fields}
    def poll(self) -> KVPoll:
{poll_body}

    def abort(self):
        self.conclude_state = KVPoll.Failed
{extra}'''


# A sender that reads its abort state, then asks its manager (for the manager rules' samples).
MANAGED_SENDER = sender("Net", '''\
        if self.conclude_state is not None:
            return self.conclude_state
        return self.mgr.check_status(self.room)''')

_LOOKUP_FAILED = "        return self.request_status.get(room, KVPoll.Failed)"
_STORE_ANY = "        self.request_status[room] = status"


def manager(check_body: str = _LOOKUP_FAILED, update_body: str = _STORE_ANY) -> str:
    """`NetKVManager` with a status table; check_status and update_status bodies (8 spaces)."""
    return f'''\
from ..base.conn import KVPoll


class NetKVManager:
    def __init__(self):
        self.request_status = {{}}

    def check_status(self, room):
{check_body}

    def update_status(self, room, status):
{update_body}
'''
