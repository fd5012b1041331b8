"""Helpers shared by the prefill and decode schedulers.

kvtrace fixture "helper-methods": the poll is reduced over the attention CP and
TP groups, as in newer releases.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, List, Optional

import torch
import torch.distributed as dist

from sglang.srt.managers.schedule_batch import FINISH_ABORT

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


def _min_over_group(states: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(states, op=dist.ReduceOp.MIN, group=group)
    return states


def poll_and_all_reduce_attn_cp_tp_group(pollers, attn_cp_cpu_group, attn_tp_cpu_group) -> List[int]:
    """Poll every sender; a state counts only once every CP and TP rank reached it."""
    states = torch.tensor([int(p.poll()) for p in pollers], dtype=torch.uint8)
    states = _min_over_group(states, attn_cp_cpu_group)
    states = _min_over_group(states, attn_tp_cpu_group)
    return states.tolist()


def prepare_abort(req: Req, error_message: str, status_code: Optional[HTTPStatus] = None) -> None:
    """Mark the request finished with an error the client will receive."""
    req.finished_reason = FINISH_ABORT(
        message=error_message,
        status_code=status_code or HTTPStatus.BAD_REQUEST,
        err_type="KVTransferError",
    )
    req.return_logprob = False


def release_kv_cache(req: Req, tree_cache, is_insert: bool = True) -> None:
    """Unlock the request's radix-tree nodes and hand its KV pages back."""
    tree_cache.cache_finished_req(req, is_insert=is_insert)


def maybe_release_metadata_buffer(req: Req, allocator) -> None:
    """Give the metadata slot back once, if the request still holds one."""
    if req.metadata_buffer_index is not None and req.metadata_buffer_index >= 0:
        allocator.free(req.metadata_buffer_index)
        req.metadata_buffer_index = -1
