"""The scheduler's side of the kvtrace fixture "dropped-else": where it binds its queues
(its class is not part of this fixture; the inflight queue's drain is in disaggregation/prefill.py)."""


class Scheduler:
    def init_disaggregation_queues(self) -> None:
        self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue()  # noqa: F821
        self.disagg_prefill_inflight_queue: list = []  # site: reassign
