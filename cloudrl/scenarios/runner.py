"""Run scenario controllers on seeds, on Ray workers, paired by seed.

Controllers are named by a :class:`ControllerSpec` (a kind and its parameters), so a
worker can build them; each worker (a Ray actor, :mod:`cloudrl.parallel`) builds the
scenario's simulator once and each controller the first time it plays it. Results are
per-seed metric dicts (every cost term separately), the same whatever the worker count.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envs.scenario.config import ScenarioConfig
from envs.scenario.control import Controller, RunAtOnce, run_episode
from envs.scenario.sim import ScenarioSim

KINDS = ("run_at_once", "signal_aware", "deadline_aware", "mpc", "oracle", "mpc_rounded",
         "signal_aware_rounded", "hindsight_mpc", "sim_mpc", "sim_hindsight", "learned",
         "rllib")
LEARNED_KINDS = ("learned", "rllib")  # controllers that run torch


@dataclass(frozen=True)
class ControllerSpec:
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or self.kind

    def build(self) -> Controller:
        if self.kind == "run_at_once":
            return RunAtOnce()
        if self.kind == "signal_aware":
            from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral

            return SignalAwareDeferral(SignalAwareConfig.from_dict(self.params))
        if self.kind == "deadline_aware":
            from cloudrl.heuristics.deadline_aware import (
                DeadlineAwareConfig,
                DeadlineAwareDeferral,
            )

            return DeadlineAwareDeferral(DeadlineAwareConfig.from_dict(self.params))
        if self.kind == "mpc":
            from cloudrl.mpc.forecast_mpc import ForecastMPC, MPCConfig

            return ForecastMPC(MPCConfig(**self.params))
        if self.kind == "oracle":
            from cloudrl.mpc.oracle import ClairvoyantOracle, OracleConfig

            return ClairvoyantOracle(OracleConfig(**self.params))
        if self.kind == "mpc_rounded":  # the MPC through the env's discrete actions
            from cloudrl.algorithms.distill.actions import RoundedController
            from cloudrl.mpc.forecast_mpc import ForecastMPC, MPCConfig

            return RoundedController(ForecastMPC(MPCConfig(**self.params)))
        if self.kind == "signal_aware_rounded":  # the rule through the env's discrete actions
            from cloudrl.algorithms.distill.actions import RoundedController
            from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral

            return RoundedController(SignalAwareDeferral(SignalAwareConfig.from_dict(self.params)))
        if self.kind == "hindsight_mpc":  # clairvoyant in the signals: a teacher, not a baseline
            from cloudrl.mpc.forecast_mpc import MPCConfig
            from cloudrl.mpc.hindsight import HindsightMPC

            return HindsightMPC(MPCConfig(**self.params))
        if self.kind == "sim_mpc":  # CEM over rollouts of the simulator on sampled futures
            from cloudrl.mpc.sim_mpc import SimMPC, SimMPCConfig

            return SimMPC(SimMPCConfig(**self.params))
        if self.kind == "sim_hindsight":  # the same search on the realised future
            from cloudrl.mpc.sim_mpc import HINDSIGHT_DEFAULTS, SimHindsightOracle

            return SimHindsightOracle(HINDSIGHT_DEFAULTS, **self.params)
        if self.kind == "learned":  # params: {"checkpoint": DIR}
            from cloudrl.algorithms.distill.policy import load_controller

            return load_controller(self.params["checkpoint"], self.name)
        if self.kind == "rllib":  # params: {"checkpoint": DIR, optional "margin": $}
            from cloudrl.scenarios.rl_policy import load_rl_controller

            return load_rl_controller(self.params["checkpoint"], self.name,
                                      margin=self.params.get("margin"))
        raise ValueError(f"controller kind {self.kind!r}; valid: {', '.join(KINDS)}")


def checkpoint_kind(path: str) -> str:
    """``learned`` for a distilled checkpoint (``policy.json``), ``rllib`` for one of
    ``cloudrl train --scenario`` (``cloudrl.json``); a ValueError naming what is wrong."""
    if (Path(path) / "cloudrl.json").is_file():
        from cloudrl.scenarios.rl_policy import read_scenario_meta

        read_scenario_meta(path)
        return "rllib"
    from cloudrl.algorithms.distill.policy import load_checkpoint

    load_checkpoint(path)
    return "learned"


def _metrics(sim: ScenarioSim, ctrl: Controller, seed: int) -> dict[str, float]:
    res = run_episode(sim, ctrl, seed)
    metrics = dict(res.metrics)
    metrics["decide_ms"] = res.decide_s * 1000.0
    solve = getattr(ctrl, "solve_times", None)
    if solve:
        metrics["solve_s"] = float(np.mean(solve))
        metrics["solve_p50_ms"] = float(np.percentile(solve, 50) * 1000.0)
        metrics["solve_p99_ms"] = float(np.percentile(solve, 99) * 1000.0)
    times = getattr(ctrl, "decide_times", None)
    if times:  # per-decision wall times (learned policies record them)
        metrics["decide_p50_ms"] = float(np.percentile(times, 50) * 1000.0)
        metrics["decide_p99_ms"] = float(np.percentile(times, 99) * 1000.0)
    return metrics


def _worker_state(cfg: ScenarioConfig, specs: list[ControllerSpec]) -> dict[str, Any]:
    """A Ray worker's state: the simulator, the specs and the controllers built so far."""
    return {"sim": ScenarioSim(cfg), "specs": specs, "ctrls": {}}


def _worker_episode(state: dict[str, Any], item: tuple[int, int]) -> dict[str, float]:
    i, seed = item
    ctrl = state["ctrls"].get(i)
    if ctrl is None:
        ctrl = state["ctrls"][i] = state["specs"][i].build()
    return _metrics(state["sim"], ctrl, seed)


def run_controllers(cfg: ScenarioConfig, specs: list[ControllerSpec], seeds: list[int],
                    workers: int | None = None, desc: str | None = None
                    ) -> list[list[dict[str, float]]]:
    """``results[i][k]``: metrics of controller ``specs[i]`` on ``seeds[k]``; ``workers``
    Ray actors (1: in this process), a progress bar ``desc`` on stderr (None: none)."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(seeds)))
    if workers == 1:  # in this process: one simulator, each controller built once
        from cloudrl.progress import progress_bar

        sim = ScenarioSim(cfg)
        res: list[list[dict[str, float]]] = []
        with progress_bar(len(specs) * len(seeds), desc, unit="ep") as bar:
            for spec in specs:
                ctrl = spec.build()
                res.append([])
                for seed in seeds:
                    res[-1].append(_metrics(sim, ctrl, seed))
                    bar.update(1)
        return res
    from cloudrl.parallel import ordered_map

    items = [(i, s) for i in range(len(specs)) for s in seeds]
    out = ordered_map(_worker_episode, items, workers, init=_worker_state,
                      init_args=(cfg, specs), desc=desc)
    n = len(seeds)
    return [out[i * n:(i + 1) * n] for i in range(len(specs))]


def paired_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Mean of ``a - b`` and its 95% t-interval (paired by seed)."""
    from scipy import stats

    d = np.asarray(a, float) - np.asarray(b, float)
    n = len(d)
    mean = float(d.mean())
    if n < 2:
        return mean, mean, mean
    half = float(stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / np.sqrt(n))
    return mean, mean - half, mean + half
