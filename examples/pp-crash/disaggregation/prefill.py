"""Prefill-only scheduling for prefill/decode disaggregation.

kvtrace fixture "pp-crash": the drain asserts instead of keeping. With pipeline
parallelism (the PP loop passes rids_to_check) a rank may see a request the
previous rank already finished while its own poll still says WaitingForInput or
Transferring: the consensus assert fails. Without it (the normal loop passes
nothing), Bootstrapping reaches the final `assert False`. Both are scheduler
crashes, not pins: mooncake has a way out of every state it returns.
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
        for req in batch.reqs:
            self.disagg_prefill_inflight_queue.append(req)  # site: entry
            self.send_kv_chunk(req, last_chunk=True)

    def process_disagg_prefill_inflight_queue(
        self: Scheduler, rids_to_check: Optional[List[str]] = None
    ) -> List[Req]:
        """Poll the requests whose KV cache is on its way; finish the ones that ended."""
        done_reqs: List[Req] = []
        polls = poll_and_all_reduce(  # site: poll
            [req.disagg_kv_sender for req in self.disagg_prefill_inflight_queue],
            self.attn_tp_cpu_group,
        )

        undone_reqs: List[Req] = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):  # fates: Failed=kept+leaves Bootstrapping=kept+raises WaitingForInput=kept+raises Transferring=kept+raises Success=kept+leaves ; mode rids_to_check=None: Failed=leaves Bootstrapping=raises WaitingForInput=kept Transferring=kept Success=leaves ; mode rids_to_check passed: Failed=waits@50+leaves Bootstrapping=waits@50+raises WaitingForInput=waits@50+raises Transferring=waits@50+raises Success=waits@50+leaves
            if rids_to_check is not None:
                if req.rid not in rids_to_check:
                    undone_reqs.append(req)  # site: keep ; the PP consensus wait: it tests no poll value, so no silent-wait
                    continue
                # The previous rank finished it, so this one must have too (it need not).
                assert poll == KVPoll.Success or poll == KVPoll.Failed  # site: raise ; expect: state-crash[:Bootstrapping], state-crash[:Transferring], state-crash[:WaitingForInput]

            if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:  # site: check
                logger.debug("request %s still in flight", req.rid)
                undone_reqs.append(req)  # site: keep
            elif poll == KVPoll.Success:  # site: check
                release_kv_cache(req, self.tree_cache)  # site: release
                req.finished_reason = FINISH_LENGTH(length=0)
                done_reqs.append(req)  # site: done
            elif poll == KVPoll.Failed:  # site: check
                reason = f"KV transfer of {req.rid} failed"
                logger.warning(reason)
                release_kv_cache(req, self.tree_cache, is_insert=False)  # site: release
                prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)  # site: abort ; expect: release-leak[:Failed]
                done_reqs.append(req)  # site: done
            else:
                assert False, f"Unexpected polling state {poll=}"  # site: raise ; expect: state-crash[:Bootstrapping]

        self.disagg_prefill_inflight_queue = undone_reqs  # site: reassign
        return done_reqs

    def event_loop_normal_disagg_prefill(self: Scheduler) -> None:
        while True:
            self.process_disagg_prefill_inflight_queue()

    def event_loop_pp_disagg_prefill(self: Scheduler) -> None:
        while True:
            finished_upstream = self.recv_from_previous_rank()
            self.process_disagg_prefill_inflight_queue(finished_upstream)
