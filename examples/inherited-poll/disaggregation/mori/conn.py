"""MORI transfer backend (kvtrace fixture "inherited-poll").

Overrides poll() correctly: a settled conclude_state is answered first, and
only then does it defer to the shared implementation.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVSender

logger = logging.getLogger(__name__)


class MoriKVManager(CommonKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        self.pending: List[tuple] = []

    def submit(self, bootstrap_room, kv_indices, aux_index):
        self.pending.append((bootstrap_room, kv_indices, aux_index))


class MoriKVSender(CommonKVSender):
    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.kv_mgr.submit(self.bootstrap_room, kv_indices, self.aux_index)

    def poll(self) -> KVPoll:  # expect: no-timeout[mori:Transferring], no-timeout[mori:WaitingForInput]
        if self.conclude_state is not None:
            return self.conclude_state
        status = super().poll()
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status
