"""Fake backend for warmup requests (kvtrace fixture "healthy").

Nothing is transferred: the scheduler sends before the request is queued, so
poll() only ever answers with a final state. It has no abort() of its own.
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

    def poll(self) -> KVPoll:
        if self.has_sent:
            return KVPoll.Success
        # A warmup request that never sent has nothing left to wait for.
        return KVPoll.Failed

    def failure_exception(self):
        raise RuntimeError("warmup request finished without sending")
