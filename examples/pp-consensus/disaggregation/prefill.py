"""Prefill-only scheduling for prefill/decode disaggregation.

kvtrace fixture "pp-consensus": with pipeline parallelism, ranks after the
first only finish what the previous rank already finished (rids_to_check);
everything else stays. The main chain is written with != and `is`. Two callers:
the PP loop passes rids_to_check, the normal loop does not, so kvtrace gives
the fates per mode: with rids_to_check=None the PP branch is dead; with it
passed every state first waits at `req.rid not in rids_to_check`.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, List, Optional

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.utils import poll_and_all_reduce, prepare_abort, release_kv_cache
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
                continue
            req.output_ids.append(next_token_id)
            self.disagg_prefill_inflight_queue.append(req)  # site: entry
            self.send_kv_chunk(req, last_chunk=True)

    def process_disagg_prefill_inflight_queue(
        self: Scheduler, rids_to_check: Optional[List[str]] = None
    ) -> List[Req]:
        """Poll the requests whose KV cache is on its way; finish the ones that ended.

        rids_to_check is given on PP ranks after the first, with the rids the
        previous rank has finished.
        """
        if len(self.disagg_prefill_inflight_queue) == 0:
            return []

        done_reqs: List[Req] = []
        undone_reqs: List[Req] = []
        polls = poll_and_all_reduce(  # site: poll
            [req.disagg_kv_sender for req in self.disagg_prefill_inflight_queue],
            self.attn_tp_cpu_group,
        )

        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):  # fates: Failed=kept+leaves Bootstrapping=kept WaitingForInput=kept Transferring=kept Staging=kept Success=kept+leaves ; mode rids_to_check=None: Failed=leaves Bootstrapping=kept WaitingForInput=kept Transferring=kept Staging=kept Success=leaves ; mode rids_to_check passed: Failed=waits@62+leaves Bootstrapping=waits@62+kept WaitingForInput=waits@62+kept Transferring=waits@62+kept Staging=waits@62+kept Success=waits@62+leaves
            if rids_to_check is not None:
                if req.rid not in rids_to_check:
                    undone_reqs.append(req)  # site: keep
                    continue
                if poll not in (KVPoll.Success, KVPoll.Failed):  # site: check
                    # The previous rank got further than this one; try again next tick.
                    logger.warning("pp rank %d polled %s for %s after consensus", self.pp_rank, poll, req.rid)
                    undone_reqs.append(req)  # site: keep
                    continue

            if poll != KVPoll.Success and poll != KVPoll.Failed:  # site: check
                undone_reqs.append(req)  # site: keep ; expect: silent-wait[:Bootstrapping], silent-wait[:Staging], silent-wait[:Transferring], silent-wait[:WaitingForInput]
            elif poll is KVPoll.Success:  # site: check
                self.tree_cache.cache_finished_req(req)  # site: release
                req.finished_reason = FINISH_LENGTH(length=0)
                done_reqs.append(req)  # site: done
            else:
                reason = f"KV transfer of {req.rid} failed on pp rank {self.pp_rank}"
                try:
                    req.disagg_kv_sender.failure_exception()
                except Exception as exc:
                    reason += f" ({exc})"
                release_kv_cache(req, self.tree_cache, is_insert=False)  # site: release
                prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)  # site: abort
                done_reqs.append(req)  # site: done

        for req in done_reqs:
            self.req_to_metadata_buffer_idx_allocator.free(req.metadata_buffer_index)  # site: release

        self.stream_output(done_reqs, any(r.return_logprob for r in done_reqs), None)
        self.disagg_prefill_inflight_queue = undone_reqs  # site: reassign
        return done_reqs

    def process_inflight_queue_pp(self: Scheduler, prev_rank_done: Optional[List[str]]) -> List[str]:
        """On PP ranks after the first, finish only what the previous rank finished."""
        done_reqs = self.process_disagg_prefill_inflight_queue(rids_to_check=prev_rank_done)
        return [req.rid for req in done_reqs]

    def event_loop_normal_disagg_prefill(self: Scheduler) -> None:
        """Without pipeline parallelism: rids_to_check stays None, the PP branch never runs."""
        while True:
            self.process_disagg_prefill_inflight_queue()
