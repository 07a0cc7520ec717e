"""The offline agent's third learner: implicit Q-learning on every logged decision
(``cloudrl scenarios offline --learner iql``).

Cloning (:mod:`cloudrl.scenarios.offline_student`) can at best match the behaviour it
copies; the measured clones tie the heuristic and stay 2-3 % above the MPC. Improving on
the data needs values: which of the logged actions, in which state, led to lower cost
later. CQL-Lag learns them with a penalty on every unlogged action and measured worse than
the clones. IQL (:mod:`cloudrl.algorithms.iql`) never queries an unlogged action: V fits
an upper expectile of Q over the data's own actions, and the policy is the data's actions
re-weighted by their advantage. It uses every logged step, the behaviours' own runs and
their runs with injected random actions (``offline --noise``) alike, on the action taken
(the one the reward followed).

Reads the logged episodes through RLlib's offline path (``cloudrl.data.offline``) only;
the policy is the headline's scenario policy module (the distilled policies' checkpoint
format), so ``evaluate``, ``serve`` and the scenario runner play it. The per-class SLA
budgets are not a constraint of this learner: violations are priced in the reward (the
env's SLA $, plus ``--penalty`` per violation of each class when asked), and the
evaluation reports the share of test seeds within each budget.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.algorithms.iql import IQLConfig, Transitions, train_iql
from cloudrl.scenarios.offline_student import branch_actions, macro_rows
from envs.scenario.config import ScenarioConfig

CLASSES = ("lc", "batch")



def episode_transitions(ep: Any, penalty: tuple[float, ...] = (0.0, 0.0)
                        ) -> tuple[np.ndarray, ...]:
    """(obs, (release, ready) taken, reward, next obs, done, the behaviour's own (release,
    ready)) of every logged decision; the reward less ``penalty[k]`` $ per violation of
    class k."""
    n = len(ep)
    obs = macro_rows(ep.get_observations(slice(0, n + 1)))
    a = np.asarray(ep.get_actions(slice(0, n)), np.int64).reshape(-1)
    r = np.asarray(ep.get_rewards(slice(0, n)), np.float64)
    infos = [ep.get_infos(t + 1) for t in range(n)]
    for k, c in enumerate(CLASSES):
        if penalty[k]:
            r = r - penalty[k] * np.array([float(i[f"violations_{c}"]) for i in infos])
    done = np.zeros(n, np.float32)
    done[-1] = float(ep.is_terminated)
    own = np.array([int(i.get("behaviour_action", a[t])) for t, i in enumerate(infos)])
    return obs[:-1], branch_actions(a), r, obs[1:], done, branch_actions(own)


def transitions(episodes: list[Any], penalty: tuple[float, ...] = (0.0, 0.0)) -> Transitions:
    """Every logged decision of ``episodes`` as one batch."""
    parts = [episode_transitions(ep, penalty) for ep in episodes]
    return Transitions(*(np.concatenate([p[k] for p in parts]) for k in range(6)))


def discounted_returns(r: np.ndarray, gamma: float, horizon: int | None = None
                       ) -> np.ndarray:
    """``g[t] = sum_{k < horizon} gamma^k r[t + k]`` (to the end where ``horizon`` is None
    or reaches past it)."""
    n = len(r)
    g = np.zeros(n)
    acc = 0.0
    for t in range(n - 1, -1, -1):
        acc = r[t] + gamma * acc
        g[t] = acc
    if horizon is not None and horizon < n:  # less what the steps from t + horizon add
        g[:n - horizon] -= gamma ** horizon * g[horizon:]
    return g


def paired_returns(episodes: list[Any], gamma: float,
                   penalty: tuple[float, ...] = (0.0, 0.0),
                   horizon: int | None = None) -> np.ndarray:
    """Per logged decision (in :func:`transitions`' order): its discounted return-to-go
    (over the next ``horizon`` decisions; None: to the end) less the mean of the other
    episodes' of the same seed (``custom_data["episode_seed"]``) at the same step. Every
    seed needs at least two episodes; a step only some siblings reach is compared with
    those that do."""
    returns = [discounted_returns(episode_transitions(ep, penalty)[2], gamma, horizon)
               for ep in episodes]
    seeds = [int(ep.custom_data.get("episode_seed", -1)) for ep in episodes]
    out = []
    for k, (seed, g) in enumerate(zip(seeds, returns, strict=True)):
        sib = [returns[i] for i, s in enumerate(seeds) if s == seed and i != k]
        if not sib:
            raise ValueError(f"paired returns: seed {seed} has one logged episode; every "
                             f"seed needs two or more (record with --noise or "
                             f"--window-noise)")
        base = np.array([np.mean([h[t] for h in sib if t < len(h)] or [0.0])
                         for t in range(len(g))])
        out.append(g - base)
    return np.concatenate(out)


def train_iql_agent(cfg: ScenarioConfig, data: str | Path, out: str | Path,
                    budgets: dict[str, float], s: IQLConfig, log: Any = print
                    ) -> tuple[Path, dict[str, Any]]:
    """IQL on every logged decision under ``data``; the checkpoint dir and diagnostics."""
    import torch

    from cloudrl.algorithms.distill.policy import build_module, save_checkpoint
    from cloudrl.data.offline import read_dataset

    t0 = time.perf_counter()
    episodes = read_dataset(data)
    batch = transitions(episodes, s.penalty)
    if s.critic == "paired":
        batch.paired_returns = paired_returns(episodes, s.gamma, s.penalty, s.horizon)
    log(f"iql: {len(episodes)} logged episodes, {len(batch.obs)} decisions "
        f"({sum(float(ep.custom_data.get('noise', 0.0)) > 0 for ep in episodes)} episodes "
        f"with random actions or shifted windows injected)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(s.run_seed)  # the policy's initial weights too, not only the critic's
        module = build_module(s.policy_hiddens)
        stats = train_iql(module, batch, s, log)
    finally:
        torch.set_num_threads(threads)
    out = save_checkpoint(module, out, s.policy_hiddens,
                          {"scenario": cfg.name, "config": {"offline_iql": asdict(s)}})
    info = {"learner": "iql", "settings": asdict(s), "episodes": len(episodes), **stats,
            "dataset": str(Path(data).resolve()), "budgets": budgets,
            "train_s": time.perf_counter() - t0}
    (Path(out) / "offline.json").write_text(json.dumps(info, indent=1, default=float))
    log(f"iql: advantage of the data's actions {stats['adv_mean']:+.3f} ± "
        f"{stats['adv_std']:.3f}, weights capped on {100 * stats['weight_capped_share']:.1f}% "
        f"({info['train_s']:.0f} s) -> {out}")
    return Path(out), info
