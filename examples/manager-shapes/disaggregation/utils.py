"""Helpers shared by the prefill and decode schedulers.

kvtrace fixture: hand-written, SGLang-shaped.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, List, Optional

import torch
import torch.distributed as dist

from sglang.srt.managers.schedule_batch import FINISH_ABORT

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


def poll_and_all_reduce(pollers, gloo_group: dist.ProcessGroup) -> List[int]:
    """Poll every sender, then keep the least advanced state seen by any rank."""
    states = torch.tensor([int(p.poll()) for p in pollers], dtype=torch.uint8)
    dist.all_reduce(states, op=dist.ReduceOp.MIN, group=gloo_group)
    return states.tolist()


def prepare_abort(req: Req, error_message: str, status_code: Optional[HTTPStatus] = None) -> None:
    """Mark the request finished with an error the client will receive."""
    req.finished_reason = FINISH_ABORT(
        message=error_message,
        status_code=status_code or HTTPStatus.BAD_REQUEST,
        err_type="KVTransferError",
    )
    # Nothing more will be decoded for it, so logprobs are not worth sending.
    req.return_logprob = False


def release_kv_cache(req: Req, tree_cache, is_insert: bool = True) -> None:
    """Unlock the request's radix-tree nodes and hand its KV pages back."""
    tree_cache.cache_finished_req(req, is_insert=is_insert)
    req.kv_released = True


def maybe_release_metadata_buffer(req: Req, allocator) -> None:
    """Give the metadata slot back once, if the request still holds one."""
    index = req.metadata_buffer_index
    if index is None or index < 0:
        return
    allocator.free(index)
    req.metadata_buffer_index = -1
