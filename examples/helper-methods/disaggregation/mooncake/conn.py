"""Mooncake transfer backend (kvtrace fixture "helper-methods").

Sound: a settled conclude_state (from abort() or an earlier poll) is answered
before the manager is asked anything.
"""

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
        self.request_status: Dict[int, int] = {}
        self.bootstrap_timeout = envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get()

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status[bootstrap_room]

    def update_status(self, bootstrap_room: int, status: int) -> None:
        self.request_status[bootstrap_room] = status


class MooncakeKVSender(BaseKVSender):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.conclude_state: Optional[int] = None
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, self.aux_index)

    def poll(self) -> KVPoll:  # expect: no-timeout[mooncake:Bootstrapping], no-timeout[mooncake:Transferring], no-timeout[mooncake:WaitingForInput]
        if self.conclude_state in (KVPoll.Success, KVPoll.Failed):
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status

    def abort(self) -> None:
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed

    def failure_exception(self):
        raise RuntimeError(f"Mooncake transfer for room {self.bootstrap_room} failed")
