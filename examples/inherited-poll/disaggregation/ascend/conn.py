"""Ascend transfer backend (kvtrace fixture "inherited-poll").

Built on the Mooncake backend, so its poll() comes from CommonKVSender two
classes up, through a file it never names.
"""

from __future__ import annotations

import logging

from sglang.srt.disaggregation.base.conn import KVArgs
from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager, MooncakeKVSender

logger = logging.getLogger(__name__)


class AscendKVManager(MooncakeKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend=False):
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        self.device_kind = "npu"

    def register_buffer_to_engine(self):
        for ptr, length in zip(self.kv_args.kv_data_ptrs, self.kv_args.kv_data_lens):
            self.engine.register(ptr, length)


class AscendKVSender(MooncakeKVSender):
    """Same protocol as Mooncake; only the memory registration differs."""
