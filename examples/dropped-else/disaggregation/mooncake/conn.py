"""Mooncake transfer backend, early-release shape (kvtrace fixture "dropped-else").

No abort() and no timeout: poll() is whatever the status table says.
"""

from __future__ import annotations

import logging
import threading
from typing import Dict, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll

logger = logging.getLogger(__name__)


class MooncakeKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, int] = {}
        self.transfer_lock = threading.Lock()

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status[bootstrap_room]

    def update_status(self, bootstrap_room: int, status: int) -> None:
        if bootstrap_room not in self.request_status:
            self.request_status[bootstrap_room] = status
        else:
            self.request_status[bootstrap_room] = max(self.request_status[bootstrap_room], status)  # expect: failed-not-sticky[:Failed]


class MooncakeKVSender(BaseKVSender):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)
        self.aux_index: Optional[int] = None

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, self.aux_index)

    def poll(self) -> KVPoll:  # expect: pinned-state[mooncake:Transferring], pinned-state[mooncake:WaitingForInput] ; expect: abort-ignored[mooncake:], no-timeout[mooncake:Bootstrapping], no-timeout[mooncake:Transferring], no-timeout[mooncake:WaitingForInput]
        return self.kv_mgr.check_status(self.bootstrap_room)

    def failure_exception(self):
        raise RuntimeError(f"Mooncake transfer for room {self.bootstrap_room} failed")
