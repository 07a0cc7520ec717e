"""Workloads: Poisson, Google-v2-like and trace replay, chosen by a discriminated config."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from envs.workloads.base import DeadlineConfig, FleetCapacity, JobTable, Workload
from envs.workloads.synthetic import (
    GoogleV2LikeConfig,
    GoogleV2LikeWorkload,
    PoissonConfig,
    PoissonWorkload,
)
from envs.workloads.trace_replay import TraceReplayConfig, TraceReplayWorkload

WorkloadConfig = Annotated[
    Union[PoissonConfig, GoogleV2LikeConfig, TraceReplayConfig],  # noqa: UP007
    Field(discriminator="kind"),
]
WORKLOAD_KINDS = ("poisson", "google_v2_like", "trace")


def make_workload(cfg: PoissonConfig | GoogleV2LikeConfig | TraceReplayConfig,
                  tick_seconds: float) -> Workload:
    """The workload object for a config."""
    if isinstance(cfg, PoissonConfig):
        return PoissonWorkload(cfg)
    if isinstance(cfg, GoogleV2LikeConfig):
        return GoogleV2LikeWorkload(cfg)
    return TraceReplayWorkload(cfg, tick_seconds)


__all__ = [
    "WORKLOAD_KINDS", "DeadlineConfig", "FleetCapacity", "GoogleV2LikeConfig", "JobTable",
    "PoissonConfig", "TraceReplayConfig", "Workload", "WorkloadConfig", "make_workload",
]
