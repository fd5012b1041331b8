"""Prefill-only scheduling for prefill/decode disaggregation.

kvtrace fixture "dropped-else": the early-release shape. The chain names
WaitingForInput/Transferring, Success and Failed and has no else, so a request
polled as Bootstrapping is in neither list and silently leaves the queue with
its KV cache and metadata slot still held.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, List

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.utils import poll_and_all_reduce, prepare_abort
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import GenerationBatchResult, ScheduleBatch, Scheduler

logger = logging.getLogger(__name__)


class SchedulerDisaggregationPrefillMixin:
    """Methods the scheduler gains when it only runs prefill."""

    def process_batch_result_disagg_prefill(
        self: Scheduler, batch: ScheduleBatch, result: GenerationBatchResult
    ) -> None:
        next_token_ids = result.next_token_ids.tolist()
        for i, req in enumerate(batch.reqs):
            req.output_ids.append(next_token_ids[i])
            self.disagg_prefill_inflight_queue.append(req)  # site: entry
            self.send_kv_chunk(req, token_id=next_token_ids[i])

    def process_disagg_prefill_inflight_queue(self: Scheduler) -> None:
        """Poll the requests whose KV cache is on its way; finish the ones that ended."""
        assert len(self.disagg_prefill_inflight_queue) > 0

        done_reqs = []
        polls = poll_and_all_reduce(  # site: poll
            [req.disagg_kv_sender for req in self.disagg_prefill_inflight_queue],
            self.attn_tp_cpu_group,
        )

        undone_reqs: List[Req] = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):  # fates: Failed=leaves Bootstrapping=dropped WaitingForInput=kept Transferring=kept Success=leaves ; expect: dropped-state[:Bootstrapping]
            if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:  # site: check
                undone_reqs.append(req)  # site: keep ; expect: silent-wait[:Transferring], silent-wait[:WaitingForInput]
            elif poll == KVPoll.Success:  # site: check
                self.tree_cache.cache_finished_req(req)  # site: release
                req.finished_reason = FINISH_LENGTH(length=0)
                done_reqs.append(req)  # site: done
            elif poll == KVPoll.Failed:  # site: check
                message = f"prefill transfer failed for {req.rid} (tp rank {self.tp_rank}, room {req.bootstrap_room})"
                try:
                    req.disagg_kv_sender.failure_exception()
                except Exception as exc:
                    message += f" with {exc}"
                logger.warning(message)
                self.tree_cache.cache_finished_req(req)  # site: release
                prepare_abort(req, message, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)  # site: abort
                done_reqs.append(req)  # site: done

        for req in done_reqs:
            self.disagg_prefill_bootstrap_queue.req_to_metadata_buffer_idx_allocator.free(  # site: release
                req.metadata_buffer_index
            )

        self.stream_output(done_reqs, any(r.return_logprob for r in done_reqs), None)
        self.disagg_prefill_inflight_queue = undone_reqs  # site: reassign
