"""Mooncake transfer backend (kvtrace fixture "installed-layout", same as "nixl-pin").

This one is sound: poll() answers from conclude_state once abort() or an
earlier poll has settled it, and a room stuck in Bootstrapping times out.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Dict, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll

logger = logging.getLogger(__name__)


class MooncakeKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, int] = {}
        self.failure_records: Dict[int, str] = {}
        self.failure_lock = threading.Lock()
        self.bootstrap_timeout = int(os.getenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "300"))

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status[bootstrap_room]

    def update_status(self, bootstrap_room: int, status: int) -> None:
        if status == KVPoll.Failed or bootstrap_room not in self.request_status:
            self.request_status[bootstrap_room] = status
        else:
            self.request_status[bootstrap_room] = max(self.request_status[bootstrap_room], status)  # expect: failed-not-sticky[:Failed]

    def record_failure(self, bootstrap_room: int, reason: str) -> None:
        with self.failure_lock:
            self.failure_records[bootstrap_room] = reason


class MooncakeKVSender(BaseKVSender):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.aux_index: Optional[int] = None
        self.conclude_state: Optional[int] = None
        self.init_time = time.time()
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, self.aux_index)

    def poll(self) -> KVPoll:  # expect: no-timeout[mooncake:Transferring], no-timeout[mooncake:WaitingForInput]
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status == KVPoll.Bootstrapping:
            expired = self._check_bootstrap_timeout()
            if expired is not None:
                status = expired
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status

    def _check_bootstrap_timeout(self) -> Optional[int]:
        waited = time.time() - self.init_time
        if waited < self.kv_mgr.bootstrap_timeout:
            return None
        logger.warning("room %s still bootstrapping after %.0fs, failing it", self.bootstrap_room, waited)
        self.kv_mgr.record_failure(self.bootstrap_room, f"bootstrap took longer than {waited:.0f}s")
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        return KVPoll.Failed

    def abort(self) -> None:
        self.kv_mgr.record_failure(self.bootstrap_room, "aborted by the client")
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed

    def failure_exception(self):
        self.conclude_state = KVPoll.Failed
        with self.kv_mgr.failure_lock:
            reason = self.kv_mgr.failure_records.pop(self.bootstrap_room, "no reason recorded")
        raise RuntimeError(f"Mooncake transfer for room {self.bootstrap_room} failed, {reason}")
