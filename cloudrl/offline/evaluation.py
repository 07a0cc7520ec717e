"""Offline agents and baselines on the held-out test seeds, with normalised cost.

Per policy and test seed: episode reward, SLA violations (the episode cost) and energy;
normalised cost = violations / budget (DSRL's convention: ≤ 1 is within the budget).
A row reports the means, the share of seeds with normalised cost ≤ 1 (with its 95% Wilson
interval), and the 95% t-CI of reward and cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cloudrl.metrics import summarize as mean_ci
from cloudrl.protocol import seeds_for
from envs.env_config import EnvConfig


def run_policy(policy: Any, env: Any, seed: int) -> dict[str, float]:
    obs, _ = env.reset(seed=seed)
    policy.reset()
    reward = cost = energy = 0.0
    done = False
    while not done:
        obs, r, terminated, truncated, info = env.step(policy.act(obs))
        reward += r
        cost += float(info["violations"])
        energy += float(info["energy_kwh"])
        done = terminated or truncated
    return {"reward": reward, "cost": cost, "energy_kwh": energy}


def load(spec: str, env_cfg: EnvConfig, interface: str = "flat") -> Any:
    """A heuristic by name on ``interface``, or a checkpoint (greedy) checked against the
    env and the interface."""
    from cloudrl.checkpoint_policy import CheckpointPolicy, is_checkpoint
    from cloudrl.heuristics import make_heuristic

    if is_checkpoint(spec):
        pol = CheckpointPolicy(spec, mode="greedy")
        if pol.interface != interface:
            raise ValueError(f"checkpoint {spec} acts on the {pol.interface} interface, "
                             f"the evaluation runs on {interface}")
        pol.check_env(env_cfg)
        return pol
    return make_heuristic(spec, interface)


def within_budget(costs: Sequence[float], budget: float,
                  ci: bool = False) -> float | tuple[float, float]:
    """Share of episodes with cost ≤ budget; ``ci``: its 95% Wilson interval (lo, hi)."""
    n = len(costs)
    k = float(np.sum(np.asarray(costs, dtype=float) <= budget + 1e-9))
    if not ci:
        return k / n
    z = 1.959964
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (float(max(0.0, mid - half)), float(min(1.0, mid + half)))


def evaluate(specs: Sequence[str], env_cfg: EnvConfig, budget: float, n_seeds: int = 10,
             names: Sequence[str] | None = None, keep_costs: bool = False,
             interface: str = "flat") -> list[dict[str, Any]]:
    """One row per policy (``names`` label them; default the policy names) on
    ``interface``; ``keep_costs``: each row also lists the per-seed costs (``costs``)."""
    from cloudrl.policy import make_env

    env = make_env(env_cfg, interface)
    rows = []
    for i, spec in enumerate(specs):
        pol = load(spec, env_cfg, interface)
        eps = [run_policy(pol, env, s) for s in seeds_for("test", n_seeds)]
        reward = np.array([e["reward"] for e in eps])
        cost = np.array([e["cost"] for e in eps])
        r, c = mean_ci(reward), mean_ci(cost)
        r_mean, r_ci, c_mean, c_ci = r.mean, r.ci95, c.mean, c.ci95
        rows.append({"policy": names[i] if names else pol.name, "reward": r_mean,
                     "reward_ci": r_ci, "cost": c_mean, "cost_ci": c_ci,
                     "normalized_cost": c_mean / budget,
                     "within_budget": within_budget(cost, budget),
                     "within_budget_ci": within_budget(cost, budget, ci=True),
                     "energy_kwh": float(np.mean([e["energy_kwh"] for e in eps])),
                     "seeds": n_seeds})
        if keep_costs:
            rows[-1]["costs"] = cost.tolist()
    return rows


def format_rows(rows: Sequence[dict[str, Any]], budget: float) -> str:
    lines = [f"budget {budget:g} SLA violations per episode",
             f"{'policy':20s} {'reward':>18s} {'violations':>14s} {'norm. cost':>10s} "
             f"{'<= budget [95% CI]':>20s} {'energy kWh':>10s}"]
    for r in rows:
        lo, hi = r.get("within_budget_ci", (float("nan"), float("nan")))
        lines.append(f"{r['policy']:20s} {r['reward']:10.1f} ± {r['reward_ci']:5.1f} "
                     f"{r['cost']:7.2f} ± {r['cost_ci']:4.2f} {r['normalized_cost']:10.2f} "
                     f"{r['within_budget']:6.0%} [{lo:4.0%}, {hi:4.0%}] "
                     f"{r['energy_kwh']:10.2f}")
    return "\n".join(lines)
