"""Mooncake backend (kvtrace fixture "manager-shapes"): a deadline in a helper that narrows
its parameter. `_expired(status)` only gives Bootstrapping a deadline, so once the helper
returns, WaitingForInput and Transferring have none; abort() sets a flag poll() never reads.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from sglang.srt.disaggregation.base.conn import BaseKVSender, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager

logger = logging.getLogger(__name__)


class MooncakeKVManager(CommonKVManager):
    pass


class MooncakeKVSender(BaseKVSender):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.aborted = False
        self.init_time = time.time()
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices

    def send(self, kv_indices):
        self.kv_mgr.transfer_worker(self.bootstrap_room, True)

    def poll(self) -> KVPoll:  # expect: pinned-state[mooncake:WaitingForInput], pinned-state[mooncake:Transferring] ; expect: abort-ignored[mooncake:], no-timeout[mooncake:WaitingForInput], no-timeout[mooncake:Transferring]
        status = self.kv_mgr.check_status(self.bootstrap_room)
        expired = self._expired(status)
        if expired is not None:
            return expired
        return status

    def _expired(self, status: int) -> Optional[int]:
        # Only a handshake that never finishes has a deadline.
        if status == KVPoll.Bootstrapping and time.time() - self.init_time > self.kv_mgr.bootstrap_timeout:
            return KVPoll.Failed
        return None

    def abort(self) -> None:
        self.aborted = True

    def failure_exception(self):
        raise RuntimeError(f"mooncake transfer of room {self.bootstrap_room} failed")
