"""NIXL transfer backend (kvtrace fixture "inherited-poll").

Overrides poll() badly: it drops the shared bootstrap timeout and, like the
shared one, ignores conclude_state. An unknown room reads as WaitingForInput.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVSender

logger = logging.getLogger(__name__)


class NixlKVManager(CommonKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        from nixl._api import nixl_agent

        self.agent = nixl_agent(f"prefill-{args.engine_rank}", None)

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status.get(bootstrap_room, KVPoll.WaitingForInput)  # expect: absent-room-default[:WaitingForInput]

    def add_transfer_request(self, bootstrap_room, kv_indices, index_slice, is_last, chunk_id, aux_index):
        ...


class NixlKVSender(CommonKVSender):
    def __init__(self, mgr: NixlKVManager, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: Optional[List[int]] = None):
        super().__init__(mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks)
        self.xfer_handles: List[object] = []
        self.has_sent = False
        self.chunk_id = 0

    def send(self, kv_indices: npt.NDArray[np.int32], index_slice: slice, is_last: bool):
        handles = self.kv_mgr.add_transfer_request(
            self.bootstrap_room, kv_indices, index_slice, is_last, self.chunk_id, self.aux_index
        )
        self.xfer_handles.extend(handles)
        self.chunk_id += 1
        if is_last:
            self.has_sent = True

    def poll(self) -> KVPoll:  # expect: pinned-state[nixl:Bootstrapping], pinned-state[nixl:Transferring], pinned-state[nixl:WaitingForInput] ; expect: abort-ignored[nixl:], no-timeout[nixl:Bootstrapping], no-timeout[nixl:Transferring], no-timeout[nixl:WaitingForInput]
        if not self.has_sent:
            return self.kv_mgr.check_status(self.bootstrap_room)
        states = [self.kv_mgr.agent.check_xfer_state(h) for h in self.xfer_handles]
        if any(s == "ERR" for s in states):
            return KVPoll.Failed
        if all(s == "DONE" for s in states):
            return KVPoll.Success
        return KVPoll.Transferring
