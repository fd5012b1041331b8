"""Manager and sender code shared by the ZMQ-bootstrapped backends.

kvtrace fixture "inherited-poll": the shared poll() times out a room stuck in
Bootstrapping but never reads conclude_state, which abort() sets. Backends
that inherit it are reported at this def.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Dict, List, Optional

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll
from sglang.srt.environ import envs

logger = logging.getLogger(__name__)


class KVTransferError(Exception):
    def __init__(self, bootstrap_room: int, reason: str):
        super().__init__(f"room {bootstrap_room}, {reason}")
        self.bootstrap_room = bootstrap_room


class CommonKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, int] = {}
        self.failure_records: Dict[int, str] = {}
        self.failure_lock = threading.Lock()
        self.bootstrap_timeout = envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get()

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status[bootstrap_room]

    def register_room(self, bootstrap_room: int) -> None:
        self.request_status.setdefault(bootstrap_room, KVPoll.Bootstrapping)

    def update_status(self, bootstrap_room: int, status: int) -> None:
        if bootstrap_room not in self.request_status:  # expect: silent-status-drop[:Failed]
            return
        if status == KVPoll.Failed:
            self.request_status[bootstrap_room] = KVPoll.Failed
        else:
            self.request_status[bootstrap_room] = max(self.request_status[bootstrap_room], status)  # expect: failed-not-sticky[:Failed]

    def record_failure(self, bootstrap_room: int, reason: str) -> None:
        with self.failure_lock:
            self.failure_records[bootstrap_room] = reason


class CommonKVSender(BaseKVSender):
    def __init__(self, mgr: CommonKVManager, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: Optional[List[int]] = None):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.dest_tp_ranks = dest_tp_ranks or []
        self.aux_index: Optional[int] = None
        self.conclude_state: Optional[int] = None
        self.init_time: Optional[float] = None
        mgr.register_room(bootstrap_room)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index
        self.init_time = time.time()

    def poll(self) -> KVPoll:  # expect: pinned-state[ascend:Transferring], pinned-state[ascend:WaitingForInput], pinned-state[mooncake:Transferring], pinned-state[mooncake:WaitingForInput] ; expect: abort-ignored[ascend:], abort-ignored[mooncake:], no-timeout[ascend:Transferring], no-timeout[ascend:WaitingForInput], no-timeout[mooncake:Transferring], no-timeout[mooncake:WaitingForInput]
        if self.bootstrap_room not in self.kv_mgr.request_status:
            return KVPoll.Failed
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status == KVPoll.Bootstrapping:
            if self._bootstrap_expired():
                self.kv_mgr.record_failure(self.bootstrap_room, "no decode peer within the bootstrap timeout")
                self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
                return KVPoll.Failed
            return KVPoll.Bootstrapping
        return status

    def _bootstrap_expired(self) -> bool:
        if self.init_time is None:
            return False
        return time.time() - self.init_time >= self.kv_mgr.bootstrap_timeout

    def abort(self) -> None:
        self.kv_mgr.record_failure(self.bootstrap_room, "aborted by the client")
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed

    def failure_exception(self):
        with self.kv_mgr.failure_lock:
            reason = self.kv_mgr.failure_records.pop(self.bootstrap_room, None)
        raise KVTransferError(self.bootstrap_room, reason or "unknown failure on another rank")
