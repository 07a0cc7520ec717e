"""Behaviour cloning from the forecast MPC, then DAgger rounds; the round kept is chosen on
validation seeds.

1. The rounded MPC plays ``n_expert_seeds`` TRAIN seeds; every decision is a row
   (observation, MPC action rounded to the env's). Optionally cached in an ``.npz`` keyed
   by the scenario, the seeds and the MPC's parameters (the MPC is deterministic).
2. The module is fitted to the rows (``bc_epochs``) and scored on validation seeds.
3. Each DAgger round: the current policy plays ``dagger_seeds_per_round`` fresh TRAIN
   seeds, the MPC labels every state it visits, the rows join the data set, the module
   trains ``round_epochs`` more epochs on all of it (warm start), and is scored again.
4. The weights of the round with the lowest mean validation cost are returned.

``objective`` replaces the validation cost by any score of an episode's metrics (lower is
better), e.g. an operator's learned reward; with ``init_checkpoint`` the start's own
weights compete as round ``-1``.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cloudrl.algorithms.distill.config import DistillConfig
from cloudrl.algorithms.distill.data import Demos, collect
from cloudrl.algorithms.distill.learner import evaluate_loss, fit
from cloudrl.algorithms.distill.policy import LearnedController, build_module
from cloudrl.mpc.forecast_mpc import ForecastMPC, MPCConfig
from cloudrl.protocol import train_seeds, validation_seeds
from envs.scenario.config import ScenarioConfig
from envs.scenario.control import run_episode
from envs.scenario.env import READY_MARGINS, RELEASE_LEVELS
from envs.scenario.sim import ScenarioSim
from models.scenario_policy import ScenarioPolicyModule


@dataclass
class DistillResult:
    module: ScenarioPolicyModule
    best_round: int
    rounds: list[dict[str, Any]] = field(default_factory=list)
    n_rows: int = 0
    wall_s: float = 0.0


def expert_meta(scn: ScenarioConfig, cfg: DistillConfig) -> str:
    meta = {"scenario": scn.model_dump(mode="json"), "mpc": cfg.mpc_params,
            "seeds": list(train_seeds(cfg.n_expert_seeds))}
    if cfg.release_levels is not None:
        meta["release_levels"] = list(cfg.levels)
    if cfg.ready_margins is not None:
        meta["ready_margins"] = list(cfg.margins)
    if cfg.heuristic_params is not None:
        meta = {**meta, "mpc": None, "signal_aware": cfg.heuristic_params}
    if cfg.sim_mpc_params is not None:
        meta["sim_mpc"] = cfg.sim_mpc_params
    return json.dumps(meta, sort_keys=True)


def teacher(cfg: DistillConfig):
    """The controller imitated: the forecast MPC at ``mpc_params``, the sim-MPC at
    ``sim_mpc_params`` (warm-started by that MPC), or the signal-aware rule at
    ``heuristic_params`` when those are given."""
    if cfg.sim_mpc_params is not None:
        from cloudrl.mpc.sim_mpc import SimMPC, SimMPCConfig

        return SimMPC(SimMPCConfig(**cfg.sim_mpc_params, mpc=cfg.mpc_params))
    if cfg.heuristic_params is not None:
        from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral

        return SignalAwareDeferral(SignalAwareConfig.from_dict(cfg.heuristic_params))
    return ForecastMPC(MPCConfig(**cfg.mpc_params))


Objective = Callable[[dict[str, float]], float]


def _cost(metrics: dict[str, float]) -> float:
    return float(metrics["cost_usd"])


def validation_cost(sim: ScenarioSim, module: ScenarioPolicyModule, n: int,
                    objective: Objective = _cost,
                    release_levels: tuple[float, ...] = RELEASE_LEVELS,
                    ready_margins: tuple[float, ...] = READY_MARGINS) -> float:
    ctrl = LearnedController(module, release_levels=release_levels, ready_margins=ready_margins)
    return float(np.mean([objective(run_episode(sim, ctrl, s).metrics)
                          for s in validation_seeds(n)]))


def _start(cfg: DistillConfig) -> ScenarioPolicyModule:
    if cfg.init_checkpoint is None:
        return build_module(cfg.hiddens, len(cfg.levels), len(cfg.margins))
    from cloudrl.algorithms.distill.policy import (
        load_checkpoint,
        ready_margins_of,
        release_levels_of,
    )

    module, spec = load_checkpoint(cfg.init_checkpoint)
    if (release_levels_of(spec), ready_margins_of(spec)) != (cfg.levels, cfg.margins):
        raise ValueError(f"init_checkpoint {cfg.init_checkpoint}: other action grids than "
                         f"the config's (release_levels / ready_margins)")
    if tuple(spec["model_config"]["hiddens"]) != tuple(cfg.hiddens):
        raise ValueError(f"init_checkpoint {cfg.init_checkpoint}: hidden sizes "
                         f"{spec['model_config']['hiddens']}, the config asks for "
                         f"{list(cfg.hiddens)}")
    return module.train()


def distill(scn: ScenarioConfig, cfg: DistillConfig, expert_cache: str | Path | None = None,
            log: Callable[[str], None] = print, objective: Objective | None = None
            ) -> DistillResult:
    t0 = time.perf_counter()
    torch.manual_seed(cfg.run_seed)
    sim = ScenarioSim(scn)
    expert = teacher(cfg)
    meta = expert_meta(scn, cfg)
    demos = Demos.load(expert_cache, meta) if expert_cache else None
    if demos is None:
        demos = collect(sim, expert, list(train_seeds(cfg.n_expert_seeds)),
                        release_levels=cfg.levels, ready_margins=cfg.margins)
        if expert_cache:
            Path(expert_cache).parent.mkdir(parents=True, exist_ok=True)
            demos.save(expert_cache, meta)
        log(f"expert: {len(demos)} rows from {cfg.n_expert_seeds} train seeds, rounded "
            f"{expert.name} mean cost {np.mean(list(demos.episode_costs.values())):.2f}")
    else:
        log(f"expert: {len(demos)} rows loaded from {expert_cache}")
    rng = np.random.default_rng(cfg.run_seed)
    pool = [int(s) for s in rng.permutation(list(train_seeds(50))[cfg.n_expert_seeds:])]
    objective = objective or _cost
    module = _start(cfg)
    rounds: list[dict[str, Any]] = []
    states: list[dict[str, torch.Tensor]] = []

    def score(k: int, train_cost: float | None, seeds: list[int]) -> None:
        val = validation_cost(sim, module, cfg.n_val_seeds, objective, cfg.levels, cfg.margins)
        rounds.append({"round": k, "rows": len(demos), "val_cost": val,
                       "train_loss": evaluate_loss(module, demos.obs, demos.actions),
                       "dagger_train_cost": train_cost, "dagger_seeds": seeds,
                       "wall_s": time.perf_counter() - t0})
        states.append(copy.deepcopy(module.state_dict()))
        log(f"round {k}: {len(demos)} rows, imitation loss {rounds[-1]['train_loss']:.3f}, "
            f"validation cost {val:.2f}" + ("" if train_cost is None
                                              else f", its DAgger episodes {train_cost:.2f}"))

    if cfg.init_checkpoint is not None:
        score(-1, None, [])  # the start itself
    opt = fit(module, demos.obs, demos.actions, cfg.bc_epochs, cfg.batch_size, cfg.lr,
              cfg.weight_decay, cfg.run_seed)
    score(0, None, [])
    for k in range(1, cfg.dagger_rounds + 1):
        seeds = pool[(k - 1) * cfg.dagger_seeds_per_round:k * cfg.dagger_seeds_per_round]
        new = collect(sim, expert, seeds,
                      actor=LearnedController(module, release_levels=cfg.levels,
                                              ready_margins=cfg.margins),
                      release_levels=cfg.levels, ready_margins=cfg.margins)
        demos = demos + new
        opt = fit(module, demos.obs, demos.actions, cfg.round_epochs, cfg.batch_size, cfg.lr,
                  cfg.weight_decay, cfg.run_seed + k, optimizer=opt)
        score(k, float(np.mean(list(new.episode_costs.values()))), seeds)
    best = int(np.argmin([r["val_cost"] for r in rounds]))
    module.load_state_dict(states[best])
    kept = rounds[best]["round"]
    log(f"kept round {kept} (validation {'cost' if objective is _cost else 'objective'} "
        f"{rounds[best]['val_cost']:.2f})")
    return DistillResult(module.eval(), kept, rounds, len(demos), time.perf_counter() - t0)
