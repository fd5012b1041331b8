"""Ascend backend (kvtrace fixture "manager-shapes"): a deadline whose name says nothing of a
timeout (`bootstrap_time_out` on the manager, `max_wait_s` here). Every state the table can
give has one, so nothing is pinned even though abort() changes nothing poll() reads.
"""

from __future__ import annotations

import time
from typing import Optional

from sglang.srt.disaggregation.base.conn import BaseKVSender, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager


class AscendKVManager(CommonKVManager):
    pass


class AscendKVSender(BaseKVSender):
    def __init__(self, mgr: AscendKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.started_at = time.monotonic()
        self.max_wait_s = 600.0
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices

    def send(self, kv_indices):
        self.kv_mgr.transfer_worker(self.bootstrap_room, True)

    def poll(self) -> KVPoll:  # expect: abort-ignored[ascend:]
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            return status
        if time.monotonic() - self.started_at > self.max_wait_s:
            return KVPoll.Failed
        return status

    def abort(self) -> None:
        self.kv_mgr.record_failure(self.bootstrap_room, "Aborted by AbortReq.")

    def failure_exception(self):
        raise RuntimeError(f"ascend transfer of room {self.bootstrap_room} failed")
