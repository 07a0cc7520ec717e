"""Replay of a compact Google trace file (from ``cloudrl trace import``) as a Workload.

Each episode is a window of the trace that starts at an offset drawn from the
episode seed and wraps around at the end of the trace; trace time is mapped to
ticks (``tick_seconds``, optionally compressed by ``time_scale``), and every job
gets an SLA deadline with slack from :class:`~envs.workloads.base.DeadlineConfig`.

``time_scale`` lies in [0.001, 1000]. A scale that would turn the longest job into more
than ``MAX_TICKS`` ticks is refused (naming ``workload.time_scale``) unless
``max_duration_ticks`` clips it; one that would pack more jobs into an episode than
``sim.limits`` allows is refused by ``envs.workloads.work_size`` before ``reset()``.
"""

from __future__ import annotations

import functools
import os
from typing import Literal

import numpy as np
from pydantic import Field

from envs.sim_config import StrictConfig
from envs.snapshot import MAX_TICKS
from envs.workloads.base import DeadlineConfig, FleetCapacity, JobTable, assign_deadlines
from envs.workloads.google_trace import TraceJobs, load_trace
from envs.workloads.work_size import WorkSizeError


class TraceReplayConfig(StrictConfig):
    """Replay of a compact trace file; ``time_scale`` > 1 compresses trace time."""

    kind: Literal["trace"] = "trace"
    path: str = Field(min_length=1, max_length=4096, description="compact trace (.npz)")
    time_scale: float = Field(default=1.0, ge=0.001, le=1000.0,
                              description="trace seconds are divided by it")
    deadline: DeadlineConfig = Field(default_factory=DeadlineConfig)
    max_duration_ticks: int | None = Field(default=None, ge=1, le=MAX_TICKS,
                                           description="clip durations")


@functools.lru_cache(maxsize=8)
def _load_jobs(path: str, mtime_ns: int, size: int) -> TraceJobs:
    """One version of a trace file (by path, modification time and size), read once: config
    validation and every env built from the config share it, read-only."""
    jobs, _ = load_trace(path)
    for name in ("arrival_us", "duration_us", "cpu", "mem"):
        getattr(jobs, name).setflags(write=False)
    return jobs


def check_trace_file(path: str) -> TraceJobs:
    """The jobs of a compact trace that can be replayed; else FileNotFoundError, or a
    ValueError (:class:`~envs.workloads.google_trace.TraceFileError` for a file that is not
    a trace) naming the file."""
    try:
        stat = os.stat(path)
    except OSError:
        jobs, _ = load_trace(path)  # raises the error that names the file
    else:
        jobs = _load_jobs(os.fspath(path), stat.st_mtime_ns, stat.st_size)
    if len(jobs) == 0:
        raise ValueError(f"{path}: the trace holds no finished jobs to replay (its import "
                         f"kept none; see the import's exclusion counts)")
    return jobs


class TraceReplayWorkload:
    """Episodes are windows of the trace starting at a seeded offset, wrapping at the end."""

    name = "trace"

    def __init__(self, cfg: TraceReplayConfig, tick_seconds: float) -> None:
        if not tick_seconds > 0:
            raise ValueError(f"tick_seconds must be > 0, got {tick_seconds}")
        self.cfg = cfg
        self.jobs = check_trace_file(cfg.path)
        self.us_per_tick = tick_seconds * cfg.time_scale * 1e6
        ticks = np.maximum(np.ceil(self.jobs.duration_us / self.us_per_tick), 1)
        if cfg.max_duration_ticks is not None:
            ticks = np.minimum(ticks, cfg.max_duration_ticks)
        elif len(ticks) and ticks.max() > MAX_TICKS:
            raise WorkSizeError("workload.time_scale", (
                f"{cfg.time_scale:g} with {tick_seconds:g} s ticks makes the longest job "
                f"{ticks.max():.4g} ticks, above {MAX_TICKS:,}; use a larger time_scale or "
                f"set workload.max_duration_ticks"))
        self.duration_ticks = ticks.astype(np.int64)

    def _window(self, start_us: int, length_us: float) -> tuple[np.ndarray, np.ndarray]:
        """Job indices and arrival offsets (us) in ``[start, start + length)``, wrapping."""
        arrival, span = self.jobs.arrival_us, self.jobs.span_us
        indices, offsets = [], []
        copy = 0
        while copy * span < start_us + length_us:
            shifted = arrival + (copy * span - start_us)
            lo, hi = np.searchsorted(shifted, [0, length_us], side="left")
            indices.append(np.arange(lo, hi))
            offsets.append(shifted[lo:hi])
            copy += 1
        return np.concatenate(indices), np.concatenate(offsets)

    def _table(self, arrival: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> JobTable:
        duration = self.duration_ticks[idx]
        return JobTable(arrival=arrival, cpu=self.jobs.cpu[idx], mem=self.jobs.mem[idx],
                        duration=duration,
                        deadline=assign_deadlines(duration, rng, self.cfg.deadline))

    def generate(self, horizon: int, rng: np.random.Generator, fleet: FleetCapacity) -> JobTable:
        if horizon <= 0:
            return JobTable.empty()
        start = int(rng.integers(0, self.jobs.span_us))
        idx, offset_us = self._window(start, horizon * self.us_per_tick)
        arrival = np.floor(offset_us / self.us_per_tick).astype(np.int64)
        return self._table(np.minimum(arrival, horizon - 1), idx, rng)

    def stationary_sample(self, n: int, rng: np.random.Generator,
                          fleet: FleetCapacity) -> JobTable:
        idx = rng.integers(0, len(self.jobs), size=n)
        return self._table(np.zeros(n, dtype=np.int64), idx, rng)

    def offered_rate(self, fleet: FleetCapacity) -> float:
        return len(self.jobs) * self.us_per_tick / self.jobs.span_us

    def mean_duration(self, fleet: FleetCapacity) -> float:
        return float(self.duration_ticks.mean())
