"""Steering the learned policy: evolution strategies on a per-trace objective.

The fine-tune of :mod:`cloudrl.algorithms.es` scores an episode by its summary metrics
(the true cost); steering needs the episode's per-tick trace instead, scored by an
operator's learned reward model (:class:`cloudrl.steer.reward.SequenceReward`: higher is
preferred, so the objective is its negative). Same search: antithetic Gaussian
perturbations of the start's weights, centred-rank fitness shaping, Adam, common random
numbers (both members of a pair on the same TRAIN seeds); every ``eval_every`` iterations
the current weights are scored on VALIDATION seeds under the same objective, the start
competes as iteration 0 and the best is kept, so a fine-tune that does not help keeps the
start. Episodes run in this process (one core). With ``val_scn`` (a real site) the
candidates play the train part's scenario and the validations the validation part's.

The objective is a callable on a list of traces (lower is better); this module never
imports an operator's utility: the evaluation passes one in for the hidden-tuned
reference, the loop passes the learned reward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cloudrl.protocol import train_seeds, validation_seeds
from cloudrl.steer.trace import Trace, record
from envs.scenario.config import ScenarioConfig

TraceObjective = Callable[[list[Trace]], np.ndarray]  # traces -> per-trace loss


@dataclass(frozen=True)
class SteerES:
    """Knobs of the steering fine-tune (``2 x pairs x seeds_per_candidate`` episodes per
    iteration, ``n_val_seeds`` per validation)."""

    iterations: int = 6
    pairs: int = 3
    seeds_per_candidate: int = 2
    sigma: float = 0.02
    lr: float = 0.01
    eval_every: int = 2
    n_val_seeds: int = 4
    params: str = "all"
    run_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("iterations", "pairs", "seeds_per_candidate", "eval_every",
                     "n_val_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"es {name} must be >= 1, got {getattr(self, name)}")
        if self.seeds_per_candidate > 50 or self.n_val_seeds > 50:
            raise ValueError("es seeds_per_candidate and n_val_seeds must be <= 50")
        if not (self.sigma > 0 and self.lr > 0):
            raise ValueError(f"es sigma and lr must be > 0, got {self.sigma}, {self.lr}")
        if self.params not in ("head", "all"):
            raise ValueError(f"es params {self.params!r}: valid: head, all")

    def episodes(self) -> int:
        """Episodes one fine-tune plays."""
        n_val = 1 + self.iterations // self.eval_every + (self.iterations % self.eval_every > 0)
        return (self.iterations * 2 * self.pairs * self.seeds_per_candidate
                + n_val * self.n_val_seeds)


@dataclass
class Steered:
    """A fine-tune's result: the module (the kept weights), its history and the kept
    iteration's validation objective beside the start's."""

    module: torch.nn.Module
    kept_iteration: int
    val_start: float
    val_kept: float
    history: list[dict[str, Any]]
    episodes: int
    wall_s: float


def steer_policy(scn: ScenarioConfig, start: str | Path, objective: TraceObjective,
                 cfg: SteerES, log: Callable[[str], None] = print,
                 val_scn: ScenarioConfig | None = None) -> Steered:
    """Fine-tune the checkpoint ``start`` to lower ``objective`` (module docstring); the
    validations play ``val_scn`` (default: ``scn``)."""
    from cloudrl.algorithms.distill.policy import load_controller
    from cloudrl.algorithms.es.algorithm import centred_ranks, tuned_parameters
    from envs.scenario.sim import ScenarioSim

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ctrl = load_controller(start)
    params = tuned_parameters(ctrl.module, cfg.params)
    theta = torch.nn.utils.parameters_to_vector(params).detach().double().numpy().copy()
    sim = ScenarioSim(scn)
    vsim = sim if val_scn is None else ScenarioSim(val_scn)
    rng = np.random.default_rng([cfg.run_seed, 0x5E5])
    pool = list(train_seeds(50))
    val = list(validation_seeds(cfg.n_val_seeds))
    history: list[dict[str, Any]] = []
    kept: list[tuple[float, int, np.ndarray]] = []
    m, v = np.zeros_like(theta), np.zeros_like(theta)
    episodes = 0

    def play(vec: np.ndarray, seeds: list[int], on: ScenarioSim = sim) -> list[Trace]:
        nonlocal episodes
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.from_numpy(vec).float(), params)
        episodes += len(seeds)
        return [record(on, ctrl, s) for s in seeds]

    def validate(k: int) -> None:
        val_loss = float(np.mean(objective(play(theta, val, vsim))))
        kept.append((val_loss, k, theta.copy()))
        history.append({"iteration": k, "val": val_loss, "val_seeds": val,
                        "val_scenario": vsim.cfg.name, "wall_s": time.perf_counter() - t0})
        log(f"  es iteration {k}: validation objective {val_loss:.4f} on {len(val)} seeds")

    try:
        validate(0)
        for it in range(1, cfg.iterations + 1):
            eps = rng.standard_normal((cfg.pairs, theta.size))
            seeds = [int(s) for s in rng.choice(pool, cfg.seeds_per_candidate, replace=False)]
            traces = []
            for i in range(cfg.pairs):
                for sign in (1.0, -1.0):
                    traces += play(theta + sign * cfg.sigma * eps[i], seeds)
            fit = np.asarray(objective(traces), float).reshape(cfg.pairs, 2, len(seeds)).mean(-1)
            ranks = centred_ranks(fit)
            grad = ((ranks[:, 0] - ranks[:, 1])[:, None] * eps).sum(0) / (cfg.pairs * cfg.sigma)
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad * grad
            theta = theta - cfg.lr * (m / (1 - 0.9 ** it)) / (
                np.sqrt(v / (1 - 0.999 ** it)) + 1e-8)
            history.append({"iteration": it, "seeds": seeds, "scenario": sim.cfg.name,
                            "population_mean": float(fit.mean())})
            if it % cfg.eval_every == 0 or it == cfg.iterations:
                validate(it)
    finally:
        torch.set_num_threads(threads)
    best, best_it, best_theta = min(kept, key=lambda x: (x[0], x[1]))
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.from_numpy(best_theta).float(), params)
    return Steered(ctrl.module.eval(), best_it, kept[0][0], best, history, episodes,
                   time.perf_counter() - t0)


def save_steered(res: Steered, start: str | Path, out: str | Path, scn: ScenarioConfig,
                 cfg: SteerES, what: str) -> Path:
    """Write the fine-tuned policy as a checkpoint like the start's (``evaluate`` and
    ``serve`` play it), with a manifest naming the start, the objective and the history."""
    import json

    from cloudrl.algorithms.distill.policy import (
        load_checkpoint,
        ready_margins_of,
        release_levels_of,
        save_checkpoint,
    )
    from cloudrl.algorithms.es.command import weights_digest

    _, spec = load_checkpoint(start)
    path = save_checkpoint(res.module, out, tuple(spec["model_config"]["hiddens"]),
                           {"scenario": scn.name, "config": spec.get("config", {}),
                            "steer_es": asdict(cfg), "init_checkpoint": str(start)},
                           release_levels_of(spec), ready_margins_of(spec))
    (path / "manifest.json").write_text(json.dumps({
        "scenario": scn.name, "objective": what, "init_checkpoint": str(start),
        "init_digest": weights_digest(start), "config": asdict(cfg),
        "kept_iteration": res.kept_iteration, "val_start": res.val_start,
        "val_kept": res.val_kept, "history": res.history, "episodes": res.episodes,
        "wall_s": res.wall_s}, indent=2))
    return path
