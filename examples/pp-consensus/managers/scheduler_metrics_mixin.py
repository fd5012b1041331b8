"""Scheduler metrics (kvtrace fixture "pp-consensus"); queue sizes go through QueueCount."""

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


class SchedulerMetricsMixin:
    def update_disagg_queue_stats(self: Scheduler) -> None:
        self.stats.prefill_bootstrap_queue = QueueCount.from_reqs(self.disagg_prefill_bootstrap_queue.queue)
        self.stats.prefill_inflight_queue = QueueCount.from_reqs(self.disagg_prefill_inflight_queue)  # site: gauge
        self.stats.num_prefill_inflight_queue_reqs = self.stats.prefill_inflight_queue.num_reqs


class SchedulerQueueBinding:
    """Where the scheduler binds its queues (the bootstrap queue's class is not part of this fixture)."""

    def init_disaggregation_queues(self) -> None:
        self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue()  # noqa: F821
        self.disagg_prefill_inflight_queue: list = []  # site: reassign
