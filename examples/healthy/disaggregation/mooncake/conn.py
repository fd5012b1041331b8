"""Mooncake transfer backend (kvtrace fixture "healthy").

poll() hands the work to a helper; the helper is what reads conclude_state
(set by abort()) and runs the bootstrap timeout.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Dict, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll

logger = logging.getLogger(__name__)


class MooncakeKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, int] = {}
        self.failure_records: Dict[int, str] = {}
        self.bootstrap_timeout = float(os.getenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "300"))

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status[bootstrap_room]

    def update_status(self, bootstrap_room: int, status: int) -> None:
        previous = self.request_status.get(bootstrap_room, KVPoll.Bootstrapping)
        self.request_status[bootstrap_room] = status if status == KVPoll.Failed else max(previous, status)

    def record_failure(self, bootstrap_room: int, reason: str) -> None:
        self.failure_records[bootstrap_room] = reason


class MooncakeKVSender(BaseKVSender):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.conclude_state: Optional[int] = None
        self.init_time = time.time()
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, self.aux_index)

    def poll(self) -> KVPoll:  # expect: no-timeout[mooncake:Transferring], no-timeout[mooncake:WaitingForInput]
        return self._poll_with_status(self.kv_mgr.check_status)

    def _poll_with_status(self, check_status: Callable[[int], int]) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        status = check_status(self.bootstrap_room)
        if status == KVPoll.Bootstrapping and time.time() - self.init_time >= self.kv_mgr.bootstrap_timeout:
            self.kv_mgr.record_failure(self.bootstrap_room, "bootstrap timed out")
            self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
            status = KVPoll.Failed
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status

    def abort(self) -> None:
        self.kv_mgr.record_failure(self.bootstrap_room, "aborted by the client")
        self.conclude_state = KVPoll.Failed

    def failure_exception(self):
        reason = self.kv_mgr.failure_records.pop(self.bootstrap_room, "no reason recorded")
        raise RuntimeError(f"Mooncake transfer for room {self.bootstrap_room} failed, {reason}")
