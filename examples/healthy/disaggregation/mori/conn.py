"""MORI transfer backend (kvtrace fixture "healthy").

abort() only tells the manager, so poll() cannot see it through the sender;
instead every non-final answer passes a per-request deadline first.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Dict, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll

logger = logging.getLogger(__name__)


class MoriKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, int] = {}
        self.transfer_budget_s = float(os.getenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300"))

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status.get(bootstrap_room, KVPoll.Bootstrapping)  # expect: absent-room-default[:Bootstrapping]

    def update_status(self, bootstrap_room: int, status: int) -> None:
        self.request_status[bootstrap_room] = status


class MoriKVSender(BaseKVSender):
    def __init__(self, mgr: MoriKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.deadline = time.monotonic() + mgr.transfer_budget_s

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.kv_mgr.submit(self.bootstrap_room, kv_indices, self.aux_index)

    def poll(self) -> KVPoll:
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            return status
        if time.monotonic() >= self.deadline:
            logger.warning("room %s gave up in state %s", self.bootstrap_room, status)
            self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
            return KVPoll.Failed
        return status

    def abort(self) -> None:
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)

    def failure_exception(self):
        raise RuntimeError(f"MORI transfer for room {self.bootstrap_room} failed")
