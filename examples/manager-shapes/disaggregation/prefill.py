"""Prefill-only scheduling for prefill/decode disaggregation.

kvtrace fixture "manager-shapes": the drain loop of "all-clear" (every state has a branch, a
waiting request leaves a debug line, a failed one gives everything back); the backends and
their managers in the other folders are the point of this tree.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, List

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.utils import (
    maybe_release_metadata_buffer,
    poll_and_all_reduce,
    prepare_abort,
    release_kv_cache,
)
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import GenerationBatchResult, ScheduleBatch, Scheduler

logger = logging.getLogger(__name__)


class SchedulerDisaggregationPrefillMixin:
    """Methods the scheduler gains when it only runs prefill."""

    def process_batch_result_disagg_prefill(
        self: Scheduler, batch: ScheduleBatch, result: GenerationBatchResult
    ) -> None:
        """Queue each request whose whole prompt has run and send its last KV chunk."""
        for i, req in enumerate(batch.reqs):
            if req.is_chunked > 0:
                req.is_chunked -= 1
                self.send_kv_chunk(req, last_chunk=False)
                continue
            req.output_ids.append(result.next_token_ids[i].item())
            self.disagg_prefill_inflight_queue.append(req)  # site: entry
            self.send_kv_chunk(req, last_chunk=True)

    def process_disagg_prefill_inflight_queue(self: Scheduler) -> List[Req]:
        """Poll the requests whose KV cache is on its way; finish the ones that ended."""
        if len(self.disagg_prefill_inflight_queue) == 0:
            return []

        done_reqs: List[Req] = []
        polls = poll_and_all_reduce(  # site: poll
            [req.disagg_kv_sender for req in self.disagg_prefill_inflight_queue],
            self.attn_tp_cpu_group,
        )

        undone_reqs: List[Req] = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):  # fates: Failed=leaves Bootstrapping=kept WaitingForInput=kept Transferring=kept Success=leaves
            if poll == KVPoll.Bootstrapping:  # site: check
                # Still handshaking (raising here would crash the scheduler): wait like the others.
                logger.debug("request %s is still bootstrapping", req.rid)
            if not (poll == KVPoll.Success or poll == KVPoll.Failed):  # site: check
                logger.debug("request %s still in flight (%s)", req.rid, poll)
                undone_reqs.append(req)  # site: keep
                continue

            if poll == KVPoll.Failed:  # site: check
                reason = f"KV transfer of {req.rid} failed on tp rank {self.tp_rank}"
                try:
                    req.disagg_kv_sender.failure_exception()
                except Exception as exc:
                    reason += f" ({exc})"
                logger.warning(reason)
                release_kv_cache(req, self.tree_cache, is_insert=False)  # site: release
                if not isinstance(req.finished_reason, FINISH_ABORT):
                    prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)  # site: abort
            else:
                release_kv_cache(req, self.tree_cache)  # site: release
                req.finished_reason = FINISH_LENGTH(length=0)
                req.disagg_kv_sender.clear()
            maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)  # site: release
            done_reqs.append(req)  # site: done

        self.stream_output(done_reqs, any(r.return_logprob for r in done_reqs), None)
        self.disagg_prefill_inflight_queue = undone_reqs  # site: reassign
        return done_reqs
