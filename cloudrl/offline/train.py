"""Train the offline constrained agent (or a baseline) on a recorded dataset; checkpoint it.

``train(cfg)``: validates the dataset (a malformed file is a ``DatasetError`` naming it),
derives the per-episode SLA budget (``train.budget``, else the best behaviour's mean
episode cost in the dataset, at least 0.5, times ``budget_fraction``), builds the RLlib
config - ``CQLLagConfig`` or, as baselines, RLlib's stock ``BCConfig`` / ``MARWILConfig``
with the masked PPO module - on ``offline_data(input_=[data], input_read_episodes=True)``,
runs ``train.iterations`` iterations, logs the learner's metrics (λ, cost estimate, loss
terms) to MLflow, and writes a checkpoint ``cloudrl evaluate --checkpoint`` and
``cloudrl serve`` load (``cloudrl.json``: algo ``cql_lag``; the baselines' modules are
masked PPO modules, recorded as algo ``ppo`` with ``trained_by`` bc|marwil). The
interface is the dataset's: a branching dataset trains the per-branch module
(``models.cql_lag_branching``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloudrl.data.offline import read_dataset
from cloudrl.offline.config import OfflineConfig
from cloudrl.offline.dataset import summarize

LEARNER_KEYS = ("lagrange", "cost_estimate", "cost_threshold", "td_reward", "td_cost",
                "cql_reward", "cql_cost", "q_reward", "q_cost", "bc", "cost_upper",
                "supported_actions", "loss", "policy_loss",
                "vf_loss", "total_loss")


def dataset_budget(summary: dict[str, Any]) -> float:
    """The best behaviour's (highest mean return, ε = 0 when there is one) mean episode
    cost, at least 0.5 (a budget of 0 has no per-step threshold to compare with)."""
    rows = summary["behaviours"]
    plain = [r for r in rows if "+eps" not in r["policy"]] or rows
    best = max(plain, key=lambda r: r["mean_return"])
    return max(0.5, float(best["mean_cost"]))


def check_algo_interface(algo: str, interface: str) -> None:
    """ValueError unless ``algo`` trains on datasets of ``interface`` (RLlib's BC and
    MARWIL train the flat masked PPO module)."""
    if interface != "flat" and algo != "cql_lag":
        raise ValueError(f"train.algo {algo!r} needs a flat dataset (RLlib's {algo} trains "
                         f"the flat masked PPO module); this one is {interface}: use cql_lag "
                         "(support_threshold 1 acts as the cloned behaviour)")


def _spaces(cfg: OfflineConfig, interface: str):
    from cloudrl.policy import make_env

    env = make_env(cfg.env, interface)
    return env.observation_space, env.action_space


def build_config(cfg: OfflineConfig, budget: float, interface: str = "flat") -> Any:
    """The RLlib ``AlgorithmConfig`` of ``cfg.train.algo`` on a dataset recorded on
    ``interface`` (branching: the cql_lag module per branch; BC/MARWIL's masked PPO
    module is flat only, a ValueError)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from cloudrl.algorithms.cql_lag.offline_data import LocalEpisodeData

    t = cfg.train
    check_algo_interface(t.algo, interface)
    obs_space, act_space = _spaces(cfg, interface)
    model = {"encoder": {"hidden": t.hidden}, "head_hiddens": [t.hidden]}
    if t.algo == "cql_lag":
        from cloudrl.algorithms.cql_lag import CQLLagConfig

        config = CQLLagConfig().training(
            cost_budget=budget, episode_length=cfg.env.sim.episode_length,
            cql_alpha=t.cql_alpha, cql_cost_alpha=t.cql_cost_alpha,
            reward_scale=t.reward_scale, lagrange_mode=t.lagrange_mode,
            lagrange_init=t.lagrange_init, lagrange_lr=t.lagrange_lr,
            lagrange_max=t.lagrange_max, lagrange_warmup=t.lagrange_warmup, tau=t.tau,
            target_network_update_freq=t.target_network_update_freq,
            support_threshold=t.support_threshold, support_data=t.support_data,
            support_top=t.support_top,
            bc_weight=t.bc_weight,
            cost_upper_alpha=t.cost_upper_alpha)
        if interface == "flat":
            config.rl_module(model_config=model)
        else:
            from models.cql_lag_branching import CQLLagBranchingTorchRLModule

            config.rl_module(rl_module_spec=RLModuleSpec(
                module_class=CQLLagBranchingTorchRLModule, model_config=model))
    else:
        from ray.rllib.algorithms.bc import BCConfig
        from ray.rllib.algorithms.marwil import MARWILConfig

        from models.masked_ppo import MaskedPPOTorchRLModule

        config = (BCConfig() if t.algo == "bc" else MARWILConfig())
        config.rl_module(rl_module_spec=RLModuleSpec(module_class=MaskedPPOTorchRLModule,
                                                     model_config=model))
    config.environment(observation_space=obs_space, action_space=act_space)
    config.offline_data(input_=[str(Path(t.data).resolve())], input_read_episodes=True,
                        offline_data_class=LocalEpisodeData, dataset_num_iters_per_learner=1)
    config.training(lr=t.lr, gamma=t.gamma, train_batch_size_per_learner=t.train_batch_size,
                    minibatch_size=t.minibatch_size, num_epochs=t.num_epochs)
    config.debugging(seed=t.seed)
    return config


def _learner_metrics(result: dict[str, Any]) -> dict[str, float]:
    learner = result.get("learners", {}).get("default_policy", {})
    out = {}
    for key in LEARNER_KEYS:
        value = learner.get(key)
        if value is not None and math.isfinite(float(value)):
            out[key] = float(value)
    return out


def write_meta(path: Path, cfg: OfflineConfig, budget: float, summary: dict,
               last_metrics: dict[str, float] | None = None) -> None:
    from cloudrl.checkpoint_policy import META_FILE

    algo = "cql_lag" if cfg.train.algo == "cql_lag" else "ppo"
    meta = {"algo": algo, "trained_by": cfg.train.algo,
            "interface": summary.get("interface", "flat"),
            "env": cfg.env.model_dump(mode="json"), "hidden": cfg.train.hidden,
            "budget": budget, "dataset": str(Path(cfg.train.data).resolve()),
            "dataset_behaviours": summary["behaviours"], "iterations": cfg.train.iterations,
            "run_seed": cfg.train.seed, "last_metrics": last_metrics or {}}
    (path / META_FILE).write_text(json.dumps(meta, indent=1))


def train(cfg: OfflineConfig, on_iteration: Callable[[int, dict], None] | None = None,
          tracker: Any = None) -> tuple[Path, dict[str, float], float]:
    """(checkpoint dir, last learner metrics, budget); ``tracker(step, metrics)`` logs.

    No Ray cluster is started: the learner is local and the pre-learner runs in the
    driver (``LocalEpisodeData``).
    """
    if cfg.train.torch_threads:
        import torch

        torch.set_num_threads(cfg.train.torch_threads)  # small nets: 1 thread is fastest
    episodes = read_dataset(cfg.train.data)
    summary = summarize(episodes)
    del episodes
    budget = (cfg.train.budget or dataset_budget(summary)) * cfg.train.budget_fraction
    algo = build_config(cfg, budget, summary.get("interface", "flat")).build_algo()
    metrics: dict[str, float] = {}
    try:
        for it in range(1, cfg.train.iterations + 1):
            metrics = _learner_metrics(algo.train())
            if tracker is not None:
                tracker(it, metrics)
            if on_iteration is not None:
                on_iteration(it, metrics)
        out = Path(cfg.train.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        algo.save_to_path(str(out))
        write_meta(out, cfg, budget, summary, metrics)
    finally:
        algo.stop()
    return out, metrics, budget
