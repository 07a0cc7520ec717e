"""Evolution strategies on the true cost, from a distilled checkpoint.

Imitation makes a student as good as its teacher at best; this step lets the student
improve on the cost itself. Natural-evolution-strategies gradient estimate (antithetic
Gaussian perturbations, centred-rank fitness shaping, Adam), the policy kept greedy:

1. ``theta``: the start's parameters (the logits layer, or every weight).
2. Per iteration: draw ``seeds_per_candidate`` TRAIN seeds, play ``theta + sigma eps_i``
   and ``theta - sigma eps_i`` for ``pairs`` directions on those same seeds (common random
   numbers), rank the ``2 x pairs`` mean costs, and step along
   ``sum_i (rank(+i) - rank(-i)) eps_i`` (lower cost, lower rank).
3. Every ``eval_every`` iterations, score ``theta`` on validation seeds; the start competes
   as iteration 0 and the lowest score is returned.

Episodes run on Ray actors (:mod:`cloudrl.parallel`, one per worker), each holding the
scenario's simulator and a copy of the module; a job sends one parameter vector and one
seed, so a worker that dies costs its jobs (replayed on its restarted actor), not the run,
and the numbers do not depend on which worker played what.

The policy is whatever ``loader(checkpoint)`` returns: a scenario controller with a
``module`` (default: the distilled policy,
:func:`~cloudrl.algorithms.distill.policy.load_controller`; the headline passes the RLlib
loader to fine-tune a gated DQN's Q-values). ``loader`` must
be a module-level function: the workers receive it by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cloudrl.algorithms.es.config import ESConfig
from cloudrl.protocol import train_seeds, validation_seeds
from envs.scenario.config import ScenarioConfig

Objective = Callable[[dict[str, float]], float]
Loader = Callable[[str], Any]  # checkpoint -> a scenario controller with a ``module``


def _cost(metrics: dict[str, float]) -> float:
    return float(metrics["cost_usd"])


def output_layer(module: torch.nn.Module) -> torch.nn.Module:
    """The layer whose outputs the greedy policy compares: a distilled policy's logits
    layer, a PPO module's last policy layer (``pi``) or a Q-network's last advantage layer
    (``af``; a dueling value stream adds the same number to every action, so it never
    changes the argmax). A ValueError for any other module (BDQ's branch heads)."""
    if hasattr(module, "logits"):
        return module.logits
    for name in ("af", "pi"):
        net = getattr(module, name, None)
        if isinstance(net, torch.nn.Sequential) and isinstance(net[-1], torch.nn.Linear):
            return net[-1]
    raise ValueError(f"{type(module).__name__} has no logits layer or Q head to fine-tune "
                     f"(--params head); use --params all")


def tuned_parameters(module: torch.nn.Module, which: str) -> list[torch.nn.Parameter]:
    """The parameters the search moves: the output layer (``head``) or all of them (a
    module with ``searched_parameters``, e.g. a release-capped one, names its own: not its
    anchor's)."""
    if which == "head":
        return list(output_layer(module).parameters())
    own = getattr(module, "searched_parameters", None)
    return list(own()) if own is not None else list(module.parameters())


def _distilled(checkpoint: str) -> Any:
    from cloudrl.algorithms.distill.policy import load_controller

    return load_controller(checkpoint)


def _init(scn: ScenarioConfig, checkpoint: str, which: str,
          loader: Loader = _distilled) -> dict[str, Any]:
    from cloudrl.quiet import quiet_library_logs
    from envs.scenario.sim import ScenarioSim

    quiet_library_logs()
    torch.set_num_threads(1)
    ctrl = loader(checkpoint)
    return {"sim": ScenarioSim(scn), "ctrl": ctrl, "params": tuned_parameters(ctrl.module, which)}


def _play(state: dict[str, Any], job: tuple[np.ndarray, int]) -> dict[str, float]:
    from envs.scenario.control import run_episode

    vec, seed = job
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.from_numpy(vec).float(), state["params"])
    return dict(run_episode(state["sim"], state["ctrl"], seed).metrics)


class _Players:
    """Plays (parameter vector, seed) jobs on Ray actors, or in-process for one worker."""

    def __init__(self, scn: ScenarioConfig, checkpoint: str, which: str, workers: int,
                 loader: Loader = _distilled) -> None:
        self.pool = None
        self.state: dict[str, Any] = {}
        if workers == 1:
            self.state = _init(scn, checkpoint, which, loader=loader)
        else:
            from cloudrl.parallel import WorkerPool

            self.pool = WorkerPool(workers, _init, (scn, checkpoint, which, loader))

    def play(self, jobs: list[tuple[np.ndarray, int]], desc: str | None = None
             ) -> list[dict[str, float]]:
        if self.pool is None:
            return [_play(self.state, j) for j in jobs]
        return self.pool.map(_play, jobs, desc)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def centred_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of ``x`` scaled to [-0.5, 0.5] (ties broken by position)."""
    flat = np.asarray(x, float).ravel()
    r = np.empty(flat.size)
    r[np.argsort(flat, kind="stable")] = np.arange(flat.size)
    return (r / max(flat.size - 1, 1) - 0.5).reshape(np.shape(x))


@dataclass
class ESResult:
    module: torch.nn.Module
    kept_iteration: int
    history: list[dict[str, Any]] = field(default_factory=list)
    episodes: int = 0
    wall_s: float = 0.0


def es_finetune(scn: ScenarioConfig, init_checkpoint: str, cfg: ESConfig,
                log: Callable[[str], None] = print, objective: Objective | None = None,
                loader: Loader = _distilled) -> ESResult:
    """Fine-tune ``init_checkpoint`` on ``scn`` (see the module docstring)."""
    import os

    t0 = time.perf_counter()
    objective = objective or _cost
    module = loader(str(init_checkpoint)).module
    params = tuned_parameters(module, cfg.params)
    theta = torch.nn.utils.parameters_to_vector(params).detach().double().numpy().copy()
    rng = np.random.default_rng(cfg.run_seed)
    pool_seeds = list(train_seeds(50))
    val = list(validation_seeds(cfg.n_val_seeds))
    workers = cfg.workers or max(1, min(os.cpu_count() or 1, 2 * cfg.pairs))
    players = _Players(scn, str(init_checkpoint), cfg.params, workers, loader)
    adam_m, adam_v = np.zeros_like(theta), np.zeros_like(theta)
    history: list[dict[str, Any]] = []
    kept: list[tuple[float, int, np.ndarray]] = []
    episodes = 0

    def score(k: int) -> None:
        nonlocal episodes
        v = float(np.mean([objective(m) for m in players.play([(theta, s) for s in val])]))
        episodes += len(val)
        kept.append((v, k, theta.copy()))
        history.append({"iteration": k, "val": v, "wall_s": time.perf_counter() - t0})
        log(f"iteration {k}: validation {'cost' if objective is _cost else 'objective'} "
            f"{v:.3f} on {len(val)} seeds ({time.perf_counter() - t0:.0f} s)")

    from cloudrl.progress import progress_bar

    bar = progress_bar(cfg.iterations, "ES iterations")
    try:
        score(0)
        for it in range(1, cfg.iterations + 1):
            eps = rng.standard_normal((cfg.pairs, theta.size))
            seeds = [int(s) for s in rng.choice(pool_seeds, cfg.seeds_per_candidate,
                                                replace=False)]
            jobs = [(theta + sign * cfg.sigma * eps[i], s)
                    for i in range(cfg.pairs) for sign in (1.0, -1.0) for s in seeds]
            out = np.array([objective(m) for m in players.play(jobs)])
            episodes += len(jobs)
            fit = out.reshape(cfg.pairs, 2, len(seeds)).mean(-1)
            ranks = centred_ranks(fit)
            grad = ((ranks[:, 0] - ranks[:, 1])[:, None] * eps).sum(0) / (cfg.pairs * cfg.sigma)
            adam_m = 0.9 * adam_m + 0.1 * grad
            adam_v = 0.999 * adam_v + 0.001 * grad * grad
            step = (adam_m / (1 - 0.9 ** it)) / (np.sqrt(adam_v / (1 - 0.999 ** it)) + 1e-8)
            theta = theta - cfg.lr * step
            history.append({"iteration": it, "seeds": seeds, "population_mean": float(fit.mean()),
                            "pair_gap": float(np.abs(fit[:, 0] - fit[:, 1]).mean()),
                            "wall_s": time.perf_counter() - t0})
            log(f"iteration {it}: population mean {fit.mean():.3f}, mean antithetic gap "
                f"{history[-1]['pair_gap']:.3f} on seeds {seeds}")
            if it % cfg.eval_every == 0 or it == cfg.iterations:
                score(it)
            bar.update(1)
    finally:
        bar.close()
        players.close()
    best_val, best_it, best_theta = min(kept, key=lambda x: (x[0], x[1]))
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.from_numpy(best_theta).float(), params)
    log(f"kept iteration {best_it} (validation {best_val:.3f}; the start "
        f"{kept[0][0]:.3f})")
    return ESResult(module.eval(), best_it, history, episodes, time.perf_counter() - t0)
