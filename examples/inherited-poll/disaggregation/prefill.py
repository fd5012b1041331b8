"""Prefill-only scheduling for prefill/decode disaggregation.

kvtrace fixture "inherited-poll": the loop names its lists differently, ends
both final states in one branch, and returns early (leaving the whole queue
as it is) while a role switch is under way.
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
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import GenerationBatchResult, ScheduleBatch, Scheduler

logger = logging.getLogger(__name__)


class SchedulerDisaggregationPrefillMixin:
    """Methods the scheduler gains when it only runs prefill."""

    def process_batch_result_disagg_prefill(
        self: Scheduler, batch: ScheduleBatch, result: GenerationBatchResult
    ) -> None:
        for req, next_token_id in zip(batch.reqs, result.next_token_ids.tolist()):
            if req.is_chunked > 0:
                req.is_chunked -= 1
                self.send_kv_chunk(req, last_chunk=False)
            else:
                req.output_ids.append(next_token_id)
                self.disagg_prefill_inflight_queue.append(req)  # site: entry
                self.send_kv_chunk(req, last_chunk=True)

    def process_disagg_prefill_inflight_queue(self: Scheduler) -> List[Req]:
        """Poll the requests whose KV cache is on its way; finish the ones that ended."""
        still_inflight: List[Req] = []
        finished: List[Req] = []
        polls = poll_and_all_reduce(  # site: poll
            [req.disagg_kv_sender for req in self.disagg_prefill_inflight_queue],
            self.attn_tp_cpu_group,
        )

        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):  # fates: Failed=kept+leaves Bootstrapping=kept WaitingForInput=kept Transferring=kept Success=kept+leaves
            if self.disagg_role_switch_in_progress:
                # Memory is being re-registered; look at the whole queue again next tick.
                return finished
            if poll == KVPoll.Success or poll == KVPoll.Failed:  # site: check
                if poll == KVPoll.Failed:  # site: check
                    reason = f"KV transfer of {req.rid} failed on tp rank {self.tp_rank}"
                    try:
                        req.disagg_kv_sender.failure_exception()
                    except Exception as exc:
                        reason += f" ({exc})"
                    logger.warning(reason)
                    prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)  # site: abort
                else:
                    req.finished_reason = FINISH_LENGTH(length=0)
                release_kv_cache(req, self.tree_cache)  # site: release
                maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)  # site: release
                finished.append(req)  # site: done
            else:
                still_inflight.append(req)  # site: keep ; expect: silent-wait[:Bootstrapping], silent-wait[:Transferring], silent-wait[:WaitingForInput]

        self.stream_output(finished, any(r.return_logprob for r in finished), None)
        self.disagg_prefill_inflight_queue = still_inflight  # site: reassign
        return finished
