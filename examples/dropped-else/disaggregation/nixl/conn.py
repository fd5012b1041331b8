"""NIXL transfer backend, early-release shape (kvtrace fixture "dropped-else").

poll() only ever answers WaitingForInput or Success (an error raises), so of
the states the loop keeps, only WaitingForInput can pin a request here.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll

logger = logging.getLogger(__name__)


class NixlKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        from nixl._api import nixl_agent

        self.kv_args = args
        self.agent = nixl_agent(f"prefill-{args.engine_rank}", None)

    def add_transfer_request(self, bootstrap_room, kv_indices, index_slice, is_last, chunk_id, aux_index):
        ...


class NixlKVSender(BaseKVSender):
    def __init__(self, mgr: NixlKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.aux_index: Optional[int] = None
        self.xfer_handles: List[object] = []
        self.has_sent = False
        self.chunk_id = 0

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32], index_slice: slice, is_last: bool):
        self.xfer_handles.extend(
            self.kv_mgr.add_transfer_request(
                self.bootstrap_room, kv_indices, index_slice, is_last, self.chunk_id, self.aux_index
            )
        )
        self.chunk_id += 1
        if is_last:
            self.has_sent = True

    def poll(self) -> KVPoll:  # expect: pinned-state[nixl:WaitingForInput] ; expect: abort-ignored[nixl:], no-timeout[nixl:WaitingForInput]
        if not self.has_sent:
            return KVPoll.WaitingForInput
        states = [self.kv_mgr.agent.check_xfer_state(h) for h in self.xfer_handles]
        if all(s == "DONE" for s in states):
            return KVPoll.Success
        if any(s == "ERR" for s in states):
            raise RuntimeError(f"NIXL reported an error for room {self.bootstrap_room}")  # expect: poll-raises[nixl:]
        return KVPoll.WaitingForInput

    def failure_exception(self):
        raise RuntimeError(f"NIXL transfer for room {self.bootstrap_room} failed")
