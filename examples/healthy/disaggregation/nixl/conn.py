"""NIXL transfer backend (kvtrace fixture "healthy").

The repaired sender: poll() answers from conclude_state first, so an abort is
seen on the next scheduler tick whatever the manager's status table says.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVArgs, KVPoll

logger = logging.getLogger(__name__)


class NixlKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        from nixl._api import nixl_agent

        self.kv_args = args
        self.agent = nixl_agent(f"prefill-{args.engine_rank}", None)
        self.request_status: Dict[int, int] = {}

    def check_status(self, bootstrap_room: int) -> int:
        # A room nobody knows about is reported as failed, never as waiting.
        return self.request_status.get(bootstrap_room, KVPoll.Failed)

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
        self.conclude_state: Optional[int] = None

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: npt.NDArray[np.int32], index_slice: slice, is_last: bool):
        handles = self.kv_mgr.add_transfer_request(
            self.bootstrap_room, kv_indices, index_slice, is_last, self.chunk_id, self.aux_index
        )
        self.xfer_handles.extend(handles)
        self.chunk_id += 1
        self.has_sent = self.has_sent or is_last

    def poll(self) -> KVPoll:  # expect: no-timeout[nixl:Bootstrapping], no-timeout[nixl:Transferring], no-timeout[nixl:WaitingForInput]
        if self.conclude_state is not None:
            return self.conclude_state
        if not self.has_sent:
            return self.kv_mgr.check_status(self.bootstrap_room)
        states = [self.kv_mgr.agent.check_xfer_state(h) for h in self.xfer_handles]
        if any(s == "ERR" for s in states):
            self.conclude_state = KVPoll.Failed
            return KVPoll.Failed
        if all(s == "DONE" for s in states):
            self.conclude_state = KVPoll.Success
            return KVPoll.Success
        return KVPoll.Transferring

    def abort(self) -> None:
        self.conclude_state = KVPoll.Failed

    def failure_exception(self):
        raise RuntimeError(f"NIXL transfer for room {self.bootstrap_room} failed")
