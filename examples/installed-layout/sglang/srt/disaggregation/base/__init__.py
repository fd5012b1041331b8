from sglang.srt.disaggregation.base.conn import (
    BaseKVManager,
    BaseKVReceiver,
    BaseKVSender,
    KVArgs,
    KVPoll,
)

__all__ = ["BaseKVManager", "BaseKVReceiver", "BaseKVSender", "KVArgs", "KVPoll"]
