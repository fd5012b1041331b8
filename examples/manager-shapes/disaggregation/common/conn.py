"""The manager every backend of this tree builds on: one status table per rank.

kvtrace fixture "manager-shapes": hand-written in the shape of SGLang's common/conn.py.
"""

from __future__ import annotations

import threading
from typing import Dict

from sglang.srt.disaggregation.base.conn import BaseKVManager, KVArgs, KVPoll


class CommonKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        self.kv_args = args
        self.request_status: Dict[int, int] = {}
        self.failure_records: Dict[int, str] = {}
        self.failure_lock = threading.Lock()
        self.bootstrap_timeout = 300.0

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status[bootstrap_room]

    def update_status(self, bootstrap_room: int, status: int) -> None:
        if bootstrap_room not in self.request_status:  # expect: silent-status-drop[:Failed]
            # A room that was cleared is not brought back by a late Failed.
            if status == KVPoll.Failed:
                return
            self.request_status[bootstrap_room] = status
        elif status == KVPoll.Failed:
            self.request_status[bootstrap_room] = KVPoll.Failed
        else:
            self.request_status[bootstrap_room] = max(self.request_status[bootstrap_room], status)  # expect: failed-not-sticky[:Failed]

    def record_failure(self, bootstrap_room: int, failure_reason: str) -> None:
        with self.failure_lock:
            self.failure_records[bootstrap_room] = failure_reason

    def transfer_worker(self, bootstrap_room: int, is_last: bool) -> None:
        # The transfer thread: the room moves along while its chunks go out.
        self.update_status(bootstrap_room, KVPoll.WaitingForInput)
        self.update_status(bootstrap_room, KVPoll.Transferring)
        if is_last:
            self.update_status(bootstrap_room, KVPoll.Success)
