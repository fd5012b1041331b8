"""Scheduler metrics (kvtrace fixture "nixl-pin"); the inflight gauge is len() of the queue."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)


class SchedulerMetricsMixin:
    def log_prefill_stats(self: Scheduler, adder, can_run_list, running_bs: int) -> None:
        now = time.perf_counter()
        gap = now - self.last_prefill_stats_tic
        self.last_prefill_stats_tic = now
        self.stats.num_running_reqs = running_bs
        self.stats.num_queue_reqs = len(self.waiting_queue)
        self.stats.num_prefill_inflight_queue_reqs = len(self.disagg_prefill_inflight_queue)  # site: gauge
        self.stats.num_prefill_bootstrap_queue_reqs = len(self.disagg_prefill_bootstrap_queue.queue)
        if self.enable_metrics:
            self.metrics_collector.log_stats(self.stats)
        logger.info(
            "Prefill batch. new-seq %d, inflight-req %d, gap %.2fs",
            len(can_run_list),
            self.stats.num_prefill_inflight_queue_reqs,
            gap,
        )


class SchedulerQueueBinding:
    """Where the scheduler binds its queues (the bootstrap queue's class is not part of this fixture)."""

    def init_disaggregation_queues(self) -> None:
        self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue()  # noqa: F821
        self.disagg_prefill_inflight_queue: list = []  # site: reassign
