"""Mooncake transfer backend (kvtrace fixture "pp-crash"): it has a way out of every state it
returns (conclude_state, read first, and a bootstrap deadline), so nothing here pins."""

from __future__ import annotations

import logging
import time
from typing import Dict, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll
from sglang.srt.environ import envs

logger = logging.getLogger(__name__)


class MooncakeKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, KVPoll] = {}
        self.bootstrap_timeout = envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get()

    def check_status(self, bootstrap_room: int) -> KVPoll:
        return self.request_status[bootstrap_room]

    def transfer_worker(self, bootstrap_room: int) -> None:
        # Bootstrap and transfer threads move the room along.
        self.update_status(bootstrap_room, KVPoll.WaitingForInput)
        self.update_status(bootstrap_room, KVPoll.Transferring)
        self.update_status(bootstrap_room, KVPoll.Success)

    def update_status(self, bootstrap_room: int, status: KVPoll) -> None:
        self.request_status[bootstrap_room] = status


class MooncakeKVSender(BaseKVSender):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.conclude_state: Optional[KVPoll] = None
        self.init_time = time.time()
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, self.aux_index)

    def poll(self) -> KVPoll:  # expect: no-timeout[mooncake:Transferring], no-timeout[mooncake:WaitingForInput]
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status is KVPoll.Bootstrapping and time.time() - self.init_time > self.kv_mgr.bootstrap_timeout:
            self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
            status = KVPoll.Failed
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status

    def abort(self) -> None:
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed

    def failure_exception(self):
        raise RuntimeError(f"Mooncake transfer for room {self.bootstrap_room} failed")
