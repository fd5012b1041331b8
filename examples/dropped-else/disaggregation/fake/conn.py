"""Fake backend for warmup requests, early-release shape (kvtrace fixture "dropped-else").

It pretends the handshake and the transfer are instant: WaitingForInput
until send(), Success after. No abort(), no timeout.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import numpy.typing as npt

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVPoll

logger = logging.getLogger(__name__)


class FakeKVSender(BaseKVSender):
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: int):
        self.has_sent = False

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        logger.debug("fake sender expects %d pages", num_kv_indices)

    def send(self, kv_indices: npt.NDArray[np.int32]):
        self.has_sent = True

    def poll(self) -> KVPoll:  # expect: pinned-state[fake:WaitingForInput] ; expect: abort-ignored[fake:], no-timeout[fake:WaitingForInput]
        if not self.has_sent:
            return KVPoll.WaitingForInput
        return KVPoll.Success

    def failure_exception(self):
        raise RuntimeError("fake sender never fails")
