"""Queue gauges for the scheduler (kvtrace fixture "healthy")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


@dataclass
class DisaggQueueStats:
    bootstrap: int = 0
    inflight: int = 0
    waiting: int = 0


def collect_disagg_queue_stats(scheduler: Scheduler) -> DisaggQueueStats:
    return DisaggQueueStats(
        bootstrap=len(scheduler.disagg_prefill_bootstrap_queue.queue),
        inflight=len(scheduler.disagg_prefill_inflight_queue),  # site: gauge
        waiting=len(scheduler.waiting_queue),
    )


class QueueMetricsMixin:
    def report_disagg_queues(self: Scheduler) -> None:
        stats = collect_disagg_queue_stats(self)
        self.metrics_collector.set_gauge("num_prefill_bootstrap_queue_reqs", stats.bootstrap)
        self.metrics_collector.set_gauge("num_prefill_inflight_queue_reqs", stats.inflight)
        self.metrics_collector.set_gauge("num_queue_reqs", stats.waiting)


class SchedulerQueueBinding:
    """Where the scheduler binds its queues (the bootstrap queue's class is not part of this fixture)."""

    def init_disaggregation_queues(self) -> None:
        self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue()  # noqa: F821
        self.disagg_prefill_inflight_queue: list = []  # site: reassign
