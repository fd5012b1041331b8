"""Scheduler metrics (kvtrace fixture "installed-layout").

The reporter reads the inflight queue of its scheduler through QueueCount,
which is where num_prefill_inflight_queue_reqs comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


@dataclass
class QueueCount:
    num_reqs: int = 0
    num_tokens: int = 0

    @classmethod
    def from_reqs(cls, reqs: Iterable) -> "QueueCount":
        reqs = list(reqs)
        return cls(num_reqs=len(reqs), num_tokens=sum(len(r.origin_input_ids) for r in reqs))


class SchedulerMetricsReporter:
    def __init__(self, scheduler: Scheduler, collector):
        self.scheduler = scheduler
        self.collector = collector

    def report_disagg_prefill(self) -> None:
        bootstrap = QueueCount.from_reqs(self.scheduler.disagg_prefill_bootstrap_queue.queue)
        inflight = QueueCount.from_reqs(self.scheduler.disagg_prefill_inflight_queue)  # site: gauge
        self.collector.set_gauge("num_prefill_bootstrap_queue_reqs", bootstrap.num_reqs)
        self.collector.set_gauge("num_prefill_inflight_queue_reqs", inflight.num_reqs)


class SchedulerMetricsMixin:
    def init_metrics_reporter(self: Scheduler) -> None:
        self.metrics_reporter = SchedulerMetricsReporter(self, self.metrics_collector)


class SchedulerQueueBinding:
    """Where the scheduler binds its queues (the bootstrap queue's class is not part of this fixture)."""

    def init_disaggregation_queues(self) -> None:
        self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue()  # noqa: F821
        self.disagg_prefill_inflight_queue: list = []  # site: reassign
