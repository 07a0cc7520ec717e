"""Workloads: Poisson, Google-v2-like and trace replay, chosen by a discriminated config."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from envs.sim_config import SimConfig
from envs.workloads.base import DeadlineConfig, FleetCapacity, JobTable, Workload
from envs.workloads.synthetic import (
    GoogleV2LikeConfig,
    GoogleV2LikeWorkload,
    PoissonConfig,
    PoissonWorkload,
)
from envs.workloads.trace_replay import TraceReplayConfig, TraceReplayWorkload
from envs.workloads.work_size import WorkSizeError, check_episode_work

WorkloadConfig = Annotated[
    Union[PoissonConfig, GoogleV2LikeConfig, TraceReplayConfig],  # noqa: UP007
    Field(discriminator="kind"),
]
WORKLOAD_KINDS = ("poisson", "google_v2_like", "trace")


def make_workload(cfg: PoissonConfig | GoogleV2LikeConfig | TraceReplayConfig,
                  tick_seconds: float, sim: SimConfig | None = None) -> Workload:
    """The workload object for a config; given ``sim``, one episode's expected work is
    checked against ``sim.limits`` first (:class:`WorkSizeError` names the field)."""
    workload: Workload
    if isinstance(cfg, PoissonConfig):
        workload = PoissonWorkload(cfg)
    elif isinstance(cfg, GoogleV2LikeConfig):
        workload = GoogleV2LikeWorkload(cfg)
    else:
        workload = TraceReplayWorkload(cfg, tick_seconds)
    if sim is not None:
        check_episode_work(sim, workload)
    return workload


__all__ = [
    "WORKLOAD_KINDS", "DeadlineConfig", "FleetCapacity", "GoogleV2LikeConfig", "JobTable",
    "PoissonConfig", "TraceReplayConfig", "WorkSizeError", "Workload", "WorkloadConfig",
    "make_workload",
]
