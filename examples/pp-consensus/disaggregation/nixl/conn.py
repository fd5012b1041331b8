"""NIXL transfer backend (kvtrace fixture "pp-consensus").

poll() ignores conclude_state (set by abort()) and its only timeout is on
WaitingForInput; a room stuck in Bootstrapping, Transferring or Staging stays.
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll
from sglang.srt.environ import envs

logger = logging.getLogger(__name__)


class NixlKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, KVPoll] = {}
        self.waiting_timeout = envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get()

    def check_status(self, bootstrap_room: int) -> KVPoll:
        return self.request_status.get(bootstrap_room, KVPoll.WaitingForInput)  # expect: absent-room-default[:WaitingForInput]

    def update_status(self, bootstrap_room: int, status: KVPoll) -> None:
        if bootstrap_room in self.request_status:  # expect: silent-status-drop[:Failed]
            self.request_status[bootstrap_room] = status


class NixlKVSender(BaseKVSender):
    def __init__(self, mgr: NixlKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.xfer_handles: List[object] = []
        self.wait_start: Optional[float] = None
        self.conclude_state: Optional[KVPoll] = None

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.xfer_handles.extend(self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, self.aux_index))

    def poll(self) -> KVPoll:  # expect: pinned-state[nixl:Bootstrapping], pinned-state[nixl:Staging], pinned-state[nixl:Transferring] ; expect: abort-ignored[nixl:], no-timeout[nixl:Bootstrapping], no-timeout[nixl:Staging], no-timeout[nixl:Transferring]
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status == KVPoll.WaitingForInput:
            if self.wait_start is None:
                self.wait_start = time.perf_counter()
            elif time.perf_counter() - self.wait_start > self.kv_mgr.waiting_timeout:
                self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
                return KVPoll.Failed
            return KVPoll.WaitingForInput
        self.wait_start = None
        return status

    def abort(self) -> None:
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)
        self.conclude_state = KVPoll.Failed

    def failure_exception(self):
        raise RuntimeError(f"NIXL transfer for room {self.bootstrap_room} failed")
