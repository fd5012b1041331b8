"""Prefill-only scheduling for prefill/decode disaggregation.

kvtrace fixture "helper-methods": the inflight loop delegates. Failure and
success handling live in methods of the mixin, and a request parked before its
bootstrap finished goes through a helper that takes the poll value and returns
a bool the loop branches on.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, List

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.utils import (
    maybe_release_metadata_buffer,
    poll_and_all_reduce_attn_cp_tp_group,
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
        for req, next_token_id in zip(batch.reqs, result.next_token_ids.tolist()):
            if req.is_chunked > 0:
                req.is_chunked -= 1
                self.send_kv_chunk(req, last_chunk=False)
                continue
            req.output_ids.append(next_token_id)
            self.disagg_prefill_inflight_queue.append(req)  # site: entry
            if not req.pending_bootstrap:
                self.send_kv_chunk(req, last_chunk=True)

    def process_disagg_prefill_inflight_queue(self: Scheduler) -> List[Req]:
        """Poll the requests whose KV cache is on its way; finish the ones that ended."""
        if len(self.disagg_prefill_inflight_queue) == 0:
            return []

        done_reqs: List[Req] = []
        polls = poll_and_all_reduce_attn_cp_tp_group(  # site: poll
            [req.disagg_kv_sender for req in self.disagg_prefill_inflight_queue],
            self.attn_cp_cpu_group,
            self.attn_tp_cpu_group,
        )

        undone_reqs: List[Req] = []
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):  # fates: Failed=leaves Bootstrapping=kept+leaves+raises WaitingForInput=kept Transferring=kept+raises Success=leaves+raises
            if req.pending_bootstrap:
                # Prefill ran before decode finished the handshake.
                if self.handle_pending_bootstrap(req, poll):  # site: helper
                    self.send_kv_chunk(req, last_chunk=True)
                    undone_reqs.append(req)  # site: keep ; expect: silent-wait[:WaitingForInput]
                elif poll == KVPoll.Bootstrapping and self.yield_slot_when_full and (  # site: check
                    self.req_to_token_pool.available_size() == 0
                ):
                    # Decode may have admitted other requests; give this slot to them.
                    self.release_and_requeue(req)  # site: helper
                elif poll != KVPoll.Failed:  # site: check
                    undone_reqs.append(req)  # site: keep ; expect: silent-wait[:Bootstrapping]
                continue

            if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:  # site: check
                undone_reqs.append(req)  # site: keep ; expect: silent-wait[:Transferring]
            elif poll == KVPoll.Success:  # site: check
                self.finish_inflight_success(req)  # site: helper
                done_reqs.append(req)  # site: done
            elif poll == KVPoll.Failed:  # site: check
                self.handle_inflight_transfer_failure(req)  # site: helper
                done_reqs.append(req)  # site: done
            else:
                raise RuntimeError(f"request {req.rid} is inflight with unexpected poll state {poll}")  # site: raise ; expect: unhandled-state[:Bootstrapping]

        self.stream_output(done_reqs, any(r.return_logprob for r in done_reqs), None)
        self.disagg_prefill_inflight_queue = undone_reqs  # site: reassign
        return done_reqs

    def handle_pending_bootstrap(self: Scheduler, req: Req, state: int) -> bool:
        """True once the handshake is through and the last chunk may be sent."""
        if state == KVPoll.Failed:  # site: check
            self.handle_bootstrap_failure(req)  # site: helper
            return False
        if state == KVPoll.Bootstrapping:  # site: check
            return False
        if state == KVPoll.WaitingForInput:  # site: check
            assert self.disagg_prefill_bootstrap_queue.finalize_bootstrap(req)  # an assert the poll value cannot make fail: taken to hold
            req.pending_bootstrap = False
            return True
        raise RuntimeError(f"request {req.rid} waits for bootstrap but polled {state}")  # site: raise ; expect: unhandled-state[:Success], unhandled-state[:Transferring]

    def handle_bootstrap_failure(self: Scheduler, req: Req) -> None:
        reason = f"bootstrap of request {req.rid} failed"
        try:
            req.disagg_kv_sender.failure_exception()
        except Exception as exc:
            reason += f" ({exc})"
        logger.warning(reason)
        release_kv_cache(req, self.tree_cache, is_insert=False)  # site: release
        maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)  # site: release
        prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)  # site: abort

    def release_and_requeue(self: Scheduler, req: Req) -> None:
        """Hand the KV slot back and prefill the request again later."""
        release_kv_cache(req, self.tree_cache, is_insert=False)  # site: release
        maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)  # site: release
        req.reset_for_retract()
        self.waiting_queue.append(req)

    def finish_inflight_success(self: Scheduler, req: Req) -> None:
        if not isinstance(req.finished_reason, FINISH_ABORT):
            req.finished_reason = FINISH_LENGTH(length=0)
        release_kv_cache(req, self.tree_cache)  # site: release
        req.disagg_kv_sender.clear()
        maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)  # site: release

    def handle_inflight_transfer_failure(self: Scheduler, req: Req) -> None:
        reason = f"KV transfer of {req.rid} failed on tp rank {self.tp_rank}"
        try:
            req.disagg_kv_sender.failure_exception()
        except Exception as exc:
            reason += f" ({exc})"
        logger.warning(reason)
        if req.finished_reason is None:
            req.finished_reason = FINISH_LENGTH(length=0)
        release_kv_cache(req, self.tree_cache, is_insert=False)  # site: release
        maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)  # site: release
        if not isinstance(req.finished_reason, FINISH_ABORT):
            prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)  # site: abort
