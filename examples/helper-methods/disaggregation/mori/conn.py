"""MORI transfer backend (kvtrace fixture "helper-methods").

abort() sets a flag poll() never reads. The only timeout is on Transferring,
so a room that stays WaitingForInput is polled forever.
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


class MoriKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, int] = {}
        self.waiting_timeout = envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get()

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status.get(bootstrap_room, KVPoll.WaitingForInput)  # expect: absent-room-default[:WaitingForInput]

    def update_status(self, bootstrap_room: int, status: int) -> None:
        if bootstrap_room in self.request_status:  # expect: silent-status-drop[:Failed]
            self.request_status[bootstrap_room] = status


class MoriKVSender(BaseKVSender):
    def __init__(self, mgr: MoriKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.transfer_start: Optional[float] = None
        self.aborted = False

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32]):
        if self.transfer_start is None:
            self.transfer_start = time.perf_counter()
        self.kv_mgr.submit(self.bootstrap_room, kv_indices, self.aux_index)

    def poll(self) -> KVPoll:  # expect: pinned-state[mori:WaitingForInput] ; expect: abort-ignored[mori:], no-timeout[mori:Bootstrapping], no-timeout[mori:WaitingForInput]
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status == KVPoll.Transferring:
            waited = time.perf_counter() - (self.transfer_start or 0.0)
            if waited > self.kv_mgr.waiting_timeout:
                logger.warning("room %s stuck transferring for %.0fs", self.bootstrap_room, waited)
                self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
                return KVPoll.Failed
            return KVPoll.Transferring
        return status

    def abort(self) -> None:
        self.aborted = True
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)

    def failure_exception(self):
        raise RuntimeError(f"MORI transfer for room {self.bootstrap_room} failed")
