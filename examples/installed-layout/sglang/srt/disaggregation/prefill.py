"""Prefill-only scheduling for prefill/decode disaggregation.

kvtrace fixture "installed-layout": the inflight loop is the one of "nixl-pin".
PrefillBootstrapQueue polls and drains a different queue (its own .queue) and
is not the inflight drain.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, List, Optional

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


class PrefillBootstrapQueue:
    """Requests whose sender is still handshaking with decode; not the inflight queue."""

    def __init__(self, scheduler: Scheduler, req_to_metadata_buffer_idx_allocator, gloo_group):
        self.scheduler = scheduler
        self.req_to_metadata_buffer_idx_allocator = req_to_metadata_buffer_idx_allocator
        self.gloo_group = gloo_group
        self.queue: List[Req] = []

    def add(self, req: Req, kv_sender_class) -> None:
        req.disagg_kv_sender = kv_sender_class(self.scheduler.kv_manager, req.bootstrap_host, req.bootstrap_room)
        self.queue.append(req)

    def pop_bootstrapped(self) -> List[Req]:
        """Hand over the requests whose handshake is done; fail the ones that broke."""
        if not self.queue:
            return []
        polls = poll_and_all_reduce([req.disagg_kv_sender for req in self.queue], self.gloo_group)
        bootstrapped: List[Req] = []
        still_waiting: List[Req] = []
        for req, poll in zip(self.queue, polls):
            if poll == KVPoll.Bootstrapping:
                still_waiting.append(req)  # expect: silent-wait[:Bootstrapping]
            elif poll == KVPoll.Failed:
                reason = f"bootstrap of {req.rid} failed"
                prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
                self.scheduler.stream_output([req], req.return_logprob)
            else:
                index: Optional[int] = self.req_to_metadata_buffer_idx_allocator.alloc()
                req.metadata_buffer_index = index
                req.disagg_kv_sender.init(len(req.origin_input_ids), index)
                bootstrapped.append(req)
        self.queue = still_waiting
        return bootstrapped


class SchedulerDisaggregationPrefillMixin:
    """Methods the scheduler gains when it only runs prefill."""

    def process_batch_result_disagg_prefill(
        self: Scheduler, batch: ScheduleBatch, result: GenerationBatchResult
    ) -> None:
        """After a prefill forward, start sending each finished request's KV cache."""
        next_token_ids = result.next_token_ids.tolist()
        for req, next_token_id in zip(batch.reqs, next_token_ids):
            if req.is_chunked > 0:
                # Only part of the prompt ran; ship what is ready and keep going.
                req.is_chunked -= 1
                self.send_kv_chunk(req, last_chunk=False)
                continue
            req.output_ids.append(next_token_id)
            self.disagg_prefill_inflight_queue.append(req)  # site: entry
            self.send_kv_chunk(req, last_chunk=True)

    def process_disagg_prefill_inflight_queue(self: Scheduler) -> List[Req]:
        """Poll the requests whose KV cache is on its way and finish those that ended."""
        if not self.disagg_prefill_inflight_queue:
            return []

        done_reqs: List[Req] = []
        undone_reqs: List[Req] = []
        senders = [req.disagg_kv_sender for req in self.disagg_prefill_inflight_queue]
        polls = poll_and_all_reduce(senders, self.attn_tp_cpu_group)  # site: poll

        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):  # fates: Failed=leaves Bootstrapping=leaves WaitingForInput=kept Transferring=kept Success=leaves
            if poll in [KVPoll.WaitingForInput, KVPoll.Transferring]:  # site: check
                undone_reqs.append(req)  # site: keep ; expect: silent-wait[:Transferring], silent-wait[:WaitingForInput]
            elif poll == KVPoll.Success:  # site: check
                release_kv_cache(req, self.tree_cache)  # site: release
                req.finished_reason = FINISH_LENGTH(length=0)
                req.disagg_kv_sender.clear()
                done_reqs.append(req)  # site: done
            else:
                # Failed, or a sender that slid back to Bootstrapping after prefill ran.
                reason = (
                    f"KV transfer of {req.rid} ended in state {poll} "
                    f"(tp rank {self.tp_rank}, room {req.bootstrap_room})"
                )
                try:
                    req.disagg_kv_sender.failure_exception()
                except Exception as exc:
                    reason += f" because {exc}"
                logger.warning(reason)
                release_kv_cache(req, self.tree_cache)  # site: release
                prepare_abort(req, reason, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)  # site: abort
                done_reqs.append(req)  # site: done

        for req in done_reqs:
            maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)  # site: release

        self.stream_output(done_reqs, any(r.return_logprob for r in done_reqs), None)
        self.disagg_prefill_inflight_queue = undone_reqs  # site: reassign
        return done_reqs
