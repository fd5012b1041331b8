"""Mori backend (kvtrace fixture "manager-shapes"): a comparison of elapsed time whose true
side only logs, and an abort flag poll() reads only to log it. Neither can end a state.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from sglang.srt.disaggregation.base.conn import BaseKVSender, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager

logger = logging.getLogger(__name__)


class MoriKVManager(CommonKVManager):
    pass


class MoriKVSender(BaseKVSender):
    def __init__(self, mgr: MoriKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.abort_requested = False
        self.init_time = time.time()
        self.deadline_s = 120.0
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices

    def send(self, kv_indices):
        self.kv_mgr.transfer_worker(self.bootstrap_room, True)

    def poll(self) -> KVPoll:  # expect: pinned-state[mori:Bootstrapping], pinned-state[mori:WaitingForInput], pinned-state[mori:Transferring] ; expect: no-timeout[mori:Bootstrapping], no-timeout[mori:WaitingForInput], no-timeout[mori:Transferring]
        if self.abort_requested:
            logger.info("room %s: abort requested", self.bootstrap_room)
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if time.time() - self.init_time > self.deadline_s:
            logger.warning("room %s is slow (%s)", self.bootstrap_room, status)
        return status

    def abort(self) -> None:
        self.abort_requested = True

    def failure_exception(self):
        raise RuntimeError(f"mori transfer of room {self.bootstrap_room} failed")
