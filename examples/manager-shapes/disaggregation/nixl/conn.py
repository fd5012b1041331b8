"""NIXL backend (kvtrace fixture "manager-shapes"): abort() hands the sender to a module
function that tells the manager Failed. That works while the room is in the table; once the
last chunk's thread has popped it, update_status() returns without effect for an absent room
and check_status() reads it as WaitingForInput, so the request waits for ever.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.disaggregation.base.conn import BaseKVSender, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager


class NixlKVManager(CommonKVManager):
    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status.get(bootstrap_room, KVPoll.WaitingForInput)  # expect: absent-room-default[:WaitingForInput]

    def on_last_chunk(self, bootstrap_room: int) -> None:
        # The room is done with once its last chunk went out.
        self.request_status.pop(bootstrap_room, None)


def conclude_failed(sender: "NixlKVSender") -> None:
    sender.kv_mgr.update_status(sender.bootstrap_room, KVPoll.Failed)


class NixlKVSender(BaseKVSender):
    def __init__(self, mgr: NixlKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices

    def send(self, kv_indices):
        self.kv_mgr.transfer_worker(self.bootstrap_room, True)

    def poll(self) -> KVPoll:  # expect: pinned-state[nixl:WaitingForInput] ; expect: abort-ignored[nixl:], no-timeout[nixl:Bootstrapping], no-timeout[nixl:WaitingForInput], no-timeout[nixl:Transferring]
        return self.kv_mgr.check_status(self.bootstrap_room)

    def abort(self) -> None:
        conclude_failed(self)

    def failure_exception(self):
        raise RuntimeError(f"nixl transfer of room {self.bootstrap_room} failed")
