"""Mooncake transfer backend (kvtrace fixture "inherited-poll").

The sender adds chunked sending and inherits poll() and abort() unchanged.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import KVArgs
from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVSender

logger = logging.getLogger(__name__)


class MooncakeKVManager(CommonKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        self.transfer_queues: List[object] = []

    def add_transfer_request(self, bootstrap_room, kv_indices, index_slice, is_last, aux_index=None):
        shard = self.transfer_queues[bootstrap_room % len(self.transfer_queues)]
        shard.put((bootstrap_room, kv_indices, index_slice, is_last, aux_index))


class MooncakeKVSender(CommonKVSender):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: Optional[List[int]] = None):
        super().__init__(mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks)
        self.curr_idx = 0

    def send(self, kv_indices: npt.NDArray[np.int32]):
        index_slice = slice(self.curr_idx, self.curr_idx + len(kv_indices))
        self.curr_idx += len(kv_indices)
        is_last = self.curr_idx == self.num_kv_indices
        self.kv_mgr.add_transfer_request(
            self.bootstrap_room,
            kv_indices,
            index_slice,
            is_last,
            aux_index=self.aux_index if is_last else None,
        )
