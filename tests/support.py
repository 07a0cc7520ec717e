"""Test helpers shared by several test modules."""

from __future__ import annotations

from envs.workloads.base import JobTable


class FixedWorkload:
    """Replays one hand-written job table; warm start must be off."""

    name = "fixed"

    def __init__(self, table: JobTable) -> None:
        self.table = table

    def generate(self, horizon, rng, fleet):
        return self.table

    def stationary_sample(self, n, rng, fleet):
        raise AssertionError("warm start is off in these scenarios")

    def offered_rate(self, fleet):
        return 0.0

    def mean_duration(self, fleet):
        return 1.0
