"""Offline constrained agent on a named scenario: logged behaviour episodes -> CQL-Lag.

Three steps, each usable alone:

* :func:`record` plays the behaviour policies (the tuned signal-aware heuristic and the
  forecast MPC) on TRAIN seeds through the scenario env's flat action space
  (:class:`envs.scenario.env.MaskedScenarioEnv`, ``interface="flat"``, ``Discrete(24)``):
  at every decision the controller's ``(release_util, ready_cores)`` is rounded to the
  nearest env action (:func:`cloudrl.algorithms.distill.actions.nearest_action`) and the
  env steps it. Each decision becomes one step of an RLlib ``SingleAgentEpisode``: the
  observation (the env's masked Dict layout), the action, reward = -cost of the decision
  period in $ (the env's reward), the next observation and ``terminated`` at the end;
  every step's infos keep the period's cost terms and the per-class SLA violation counts
  (``violations_lc``, ``violations_batch``), the last step's infos the episode summary.
  :func:`write_dataset` writes them in RLlib's offline episode format
  (:mod:`cloudrl.data.episodes`, read with ``offline_data(input_=[dir],
  input_read_episodes=True)``) after :func:`set_costs` put the constraint cost in every
  step's ``infos["cost"]`` (what :class:`cloudrl.algorithms.cql_lag.CQLLag` reads).
* Per-class budgets (:func:`class_budgets`): the SLA violation rate of each class that
  the behaviour policies reach, the larger of their two mean per-episode rates on the
  logged episodes. CQL-Lag has one Lagrangian constraint, so the two classes become one
  cost (the smallest adaptation): per step ``c = v_lc / (B_lc·J_lc) + v_batch /
  (B_batch·J_batch)`` with ``J_k`` the episode's class-k jobs, so an episode's cost is
  about the sum of the two rate-to-budget ratios; the episode budget is
  ``2 · budget_fraction`` (1 and 1 at the budgets). A policy can meet that sum with one
  class over its budget; the evaluation checks each class on its own.
* :func:`train` fits :class:`~cloudrl.algorithms.cql_lag.CQLLagConfig` (the flat
  ``models.cql_lag`` module on the masked observation) on the dataset only and writes an
  RLlib checkpoint with ``cloudrl.json`` (algo ``cql_lag``, the scenario, interface
  ``flat``) that the scenario runner plays as ``ControllerSpec("rllib", {"checkpoint":
  DIR})``; :func:`evaluate` plays it beside both behaviour policies on test seeds, paired.

The second learner, budget-filtered cloning into the scenario policy, is
:mod:`cloudrl.scenarios.offline_student` (``run(..., student=StudentSettings())``);
``record(..., noise=(0.25,))`` adds runs with random actions injected for it (DART).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.algorithms.distill.actions import nearest_action
from envs.scenario.config import ScenarioConfig
from envs.scenario.env import READY_MARGINS, MaskedScenarioEnv
from envs.scenario.sim import PLACEMENT_NAMES

# the tuned behaviour policies (validation-tuned on scarcity_spikes; other scenarios: defaults)
TUNED: dict[str, dict[str, dict[str, float]]] = {
    "scarcity_spikes": {
        "signal_aware": {"quantile": 0.5786256554801771, "window_hours": 18.0,
                         "release_util": 0.8033178878835899,
                         "ready_margin": 0.437697936590399, "guard_hours": 4.0},
        "mpc": {"max_util": 0.6143407333776681, "ready_hedge": 0.009916581317117456},
    },
}
BEHAVIOURS = ("signal_aware", "mpc")
CLASSES = ("lc", "batch")
STEP_KEYS = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "energy_kwh",
             "violations_lc", "violations_batch")


def placement_info(sim: Any) -> dict[str, float]:
    """The fleet's placement state after a step (``place_<name>`` for each of
    :data:`~envs.scenario.sim.PLACEMENT_NAMES`): logged beside the observation for a model
    of the data (``--learner model --placement``), never seen by the policies."""
    return {f"place_{k}": float(v) for k, v in zip(PLACEMENT_NAMES, sim.placement(),
                                                  strict=True)}


def behaviour_params(scenario: str) -> dict[str, dict[str, float]]:
    return {b: dict(TUNED.get(scenario, {}).get(b, {})) for b in BEHAVIOURS}


def _controller(kind: str, params: dict[str, Any]) -> Any:
    from cloudrl.scenarios.runner import ControllerSpec

    return ControllerSpec(kind, params).build()


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if isinstance(value, np.generic) else value


WINDOW_STEPS = 8  # a shifted window: 8 decisions, two hours at the 15-minute period


def shifted(i: int, j: int, shift: tuple[int, int], n_release: int, n_ready: int
            ) -> tuple[int, int]:
    """Release index ``i`` and ready index ``j`` moved by ``shift``, clipped to the grid."""
    return (min(max(i + shift[0], 0), n_release - 1), min(max(j + shift[1], 0), n_ready - 1))


def record_episode(cfg: ScenarioConfig, controller: Any, seed: int, behaviour: str,
                   noise: float = 0.0, kind: str = "step") -> Any:
    """One episode of ``controller`` rounded to the flat env actions, as RLlib records it.
    With ``noise`` > 0 and ``kind="step"`` each decision is, with that probability, a
    uniformly random action instead; with ``kind="window"`` each window of
    :data:`WINDOW_STEPS` decisions is, with that probability, shifted as a whole: the
    behaviour's release and ready levels moved by a step drawn once per window from -2..+2
    and -1..+1 (not both 0), a sustained deviation whose later cost a critic can see.
    Seeded by the episode seed, the behaviour, the noise and its kind; every step's infos
    keep the behaviour's own action (``behaviour_action``), so a learner can imitate the
    behaviour from the states its perturbed runs reach (DART, Laskey et al. 2017)."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    env = MaskedScenarioEnv({"config": cfg, "interface": "flat"})
    inner = env.unwrapped
    if kind not in ("step", "window"):
        raise ValueError(f"noise kind {kind!r}: valid: step, window")
    rng = np.random.default_rng([int(seed), sum(map(ord, behaviour)), int(round(noise * 1e6)),
                                 *([] if kind == "step" else [1])])
    ep = SingleAgentEpisode(observation_space=env.observation_space,
                            action_space=env.action_space)
    obs, info = env.reset(seed=int(seed))
    controller.reset(inner.sim)
    ep.add_env_reset(observation=obs, infos={**info, **placement_info(inner.sim)})
    n_actions = int(env.action_space.n)
    n_release = n_actions // len(READY_MARGINS)
    shifts = [(a, b) for a in range(-2, 3) for b in range(-1, 2) if (a, b) != (0, 0)]
    shift, t = (0, 0), 0
    while True:
        i, j = nearest_action(inner._view, *controller.decide(inner.sim))
        intended = i * len(READY_MARGINS) + j
        if kind == "window":
            if t % WINDOW_STEPS == 0:
                shift = shifts[int(rng.integers(len(shifts)))] if noise > 0 and \
                    rng.random() < noise else (0, 0)
            a, b = shifted(i, j, shift, n_release, len(READY_MARGINS))
            action = a * len(READY_MARGINS) + b
        else:
            action = int(rng.integers(n_actions)) if noise > 0 and rng.random() < noise \
                else intended
        t += 1
        obs, reward, terminated, truncated, info = env.step(action)
        step_info = {k: float(info[k]) for k in STEP_KEYS}
        step_info["behaviour_action"] = int(intended)
        step_info.update(placement_info(inner.sim))
        if "episode" in info:
            step_info["episode"] = {k: float(v) for k, v in info["episode"].items()}
        ep.add_env_step(observation=obs, action=int(action), reward=float(reward),
                        infos=step_info, terminated=bool(terminated),
                        truncated=bool(truncated))
        if terminated or truncated:
            break
    ep.custom_data.update({"episode_seed": int(seed), "policy": behaviour,
                           "interface": "flat", "noise": float(noise), "noise_kind": kind})
    return ep


def record(cfg: ScenarioConfig, seeds: list[int], params: dict[str, dict] | None = None,
           behaviours: tuple[str, ...] = BEHAVIOURS, noise: tuple[float, ...] = (),
           window_noise: tuple[float, ...] = ()) -> list[Any]:
    """Episodes of every behaviour on every seed (``params``: behaviour -> its config), once
    more per level in ``noise`` with that share of random actions, and once more per level
    in ``window_noise`` with that share of two-hour windows shifted
    (:func:`record_episode`)."""
    params = params if params is not None else behaviour_params(cfg.name)
    out = []
    runs = [(0.0, "step"), *((x, "step") for x in noise), *((x, "window") for x in window_noise)]
    for level, kind in runs:
        for b in behaviours:
            ctrl = _controller(b, params.get(b, {}))
            out += [record_episode(cfg, ctrl, s, b, level, kind) for s in seeds]
    return out


def is_clean(ep: Any) -> bool:
    """Whether the episode is the behaviour's own (no injected noise)."""
    return float(ep.custom_data.get("noise", 0.0)) == 0.0


def episode_summary(ep: Any) -> dict[str, float]:
    return dict(ep.get_infos(len(ep))["episode"])


def class_budgets(episodes: list[Any], quantile: float | None = None) -> dict[str, float]:
    """Per class: the larger of the behaviours' mean per-episode SLA violation rates (their
    own episodes, without injected noise); with ``quantile``, the larger of their
    per-episode rates' ``quantile`` instead (0.95: the rate each behaviour keeps on 95% of
    its logged days)."""
    by: dict[str, list[dict[str, float]]] = {}
    for ep in filter(is_clean, episodes):
        by.setdefault(ep.custom_data["policy"], []).append(episode_summary(ep))

    def level(rates: list[float]) -> float:
        return float(np.mean(rates) if quantile is None else np.quantile(rates, quantile))

    return {c: max(level([s[f"sla_{c}"] for s in rows]) for rows in by.values())
            for c in CLASSES}


def set_costs(episodes: list[Any], budgets: dict[str, float]) -> None:
    """``infos["cost"]`` of every step: the violations of each class over its budgeted
    count in that episode (see the module docstring)."""
    from cloudrl.data.offline import COST_KEY

    for ep in episodes:
        s = episode_summary(ep)
        allowed = {c: max(budgets[c] * max(s[f"jobs_{c}"], 1.0), 1e-3) for c in CLASSES}
        for t in range(1, len(ep) + 1):
            info = ep.get_infos(t)
            info[COST_KEY] = sum(float(info[f"violations_{c}"]) / allowed[c] for c in CLASSES)


def write_dataset(episodes: list[Any], out: str | Path, budgets: dict[str, float],
                  override: dict[str, Any] | None = None) -> Path:
    """The episodes (costs set) in RLlib's offline format under ``out`` plus
    ``dataset.json`` (budgets, behaviours, per-behaviour mean cost and SLA rates, and the
    scenario ``override`` they were recorded under)."""
    from cloudrl.data.episodes import write_episodes

    set_costs(episodes, budgets)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.parquet"):
        old.unlink()
    for b in sorted({ep.custom_data["policy"] for ep in episodes}):
        write_episodes([ep for ep in episodes if ep.custom_data["policy"] == b], out,
                       prefix=f"scenario-{b}", episodes_per_file=50)
    (out / "dataset.json").write_text(json.dumps(
        {"budgets": budgets, "behaviours": behaviour_table(episodes),
         "noise": sorted({float(ep.custom_data.get("noise", 0.0)) for ep in episodes
                          if ep.custom_data.get("noise_kind", "step") == "step"}),
         "window_noise": sorted({float(ep.custom_data["noise"]) for ep in episodes
                                 if ep.custom_data.get("noise_kind") == "window"}),
         "override": override},
        indent=1))
    return out


def behaviour_table(episodes: list[Any]) -> dict[str, dict[str, float]]:
    """Per behaviour, its own episodes' count, mean cost and SLA rates (noisy runs apart)."""
    by: dict[str, list[dict[str, float]]] = {}
    for ep in filter(is_clean, episodes):
        by.setdefault(ep.custom_data["policy"], []).append(episode_summary(ep))
    return {b: {"episodes": len(rows),
                **{k: float(np.mean([r[k] for r in rows]))
                   for k in ("cost_usd", "sla_lc", "sla_batch")}}
            for b, rows in by.items()}


@dataclass
class TrainSettings:
    iterations: int = 300
    run_seed: int = 0
    budget_fraction: float = 1.0
    hidden: int = 128
    gamma: float = 0.97
    lr: float = 3e-4
    cql_alpha: float = 1.0
    support_threshold: float = 0.3
    lagrange_warmup: int = 200
    lagrange_lr: float = 0.02
    train_batch_size: int = 1024
    minibatch_size: int = 256
    num_epochs: int = 4
    torch_threads: int = 1


def build_config(cfg: ScenarioConfig, data: str | Path, budget: float, episode_length: int,
                 s: TrainSettings) -> Any:
    from cloudrl.algorithms.cql_lag import CQLLagConfig
    from cloudrl.algorithms.cql_lag.offline_data import LocalEpisodeData

    env = MaskedScenarioEnv({"config": cfg, "interface": "flat"})
    config = CQLLagConfig().training(
        cost_budget=budget, episode_length=episode_length, cql_alpha=s.cql_alpha,
        reward_scale=1.0, cost_scale=1.0, lagrange_warmup=s.lagrange_warmup,
        lagrange_lr=s.lagrange_lr, support_threshold=s.support_threshold,
        support_data="all", lr=s.lr, gamma=s.gamma,
        train_batch_size_per_learner=s.train_batch_size, minibatch_size=s.minibatch_size,
        num_epochs=s.num_epochs)
    config.rl_module(model_config={"encoder": {"hidden": s.hidden},
                                   "head_hiddens": [s.hidden]})
    config.environment(observation_space=env.observation_space,
                       action_space=env.action_space)
    config.offline_data(input_=[str(Path(data).resolve())], input_read_episodes=True,
                        offline_data_class=LocalEpisodeData, dataset_num_iters_per_learner=1)
    config.debugging(seed=s.run_seed)
    return config


LEARNER_KEYS = ("lagrange", "cost_estimate", "cost_threshold", "td_reward", "td_cost",
                "cql_reward", "q_reward", "q_cost", "bc", "supported_actions")


def train(cfg: ScenarioConfig, data: str | Path, out: str | Path, budgets: dict[str, float],
          s: TrainSettings, log: Any = None) -> tuple[Path, dict[str, float]]:
    """Train on the dataset at ``data`` only; the checkpoint dir and the last metrics."""
    import torch

    from cloudrl.checkpoint_policy import META_FILE
    from cloudrl.data.offline import read_dataset

    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)
    torch.manual_seed(s.run_seed)
    eps = read_dataset(data)
    episode_length = int(round(np.mean([len(ep) for ep in eps])))
    del eps
    budget = 2.0 * s.budget_fraction
    algo = build_config(cfg, data, budget, episode_length, s).build_algo()
    metrics: dict[str, float] = {}
    try:
        for it in range(1, s.iterations + 1):
            res = algo.train().get("learners", {}).get("default_policy", {})
            metrics = {k: float(res[k]) for k in LEARNER_KEYS
                       if res.get(k) is not None and math.isfinite(float(res[k]))}
            if log is not None and (it % 50 == 0 or it == s.iterations):
                log(f"  iter {it}: " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()
                                                 if k in ("lagrange", "cost_estimate",
                                                          "cost_threshold", "q_reward")))
        out = Path(out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        algo.save_to_path(str(out))
    finally:
        algo.stop()
    meta = {"algo": "cql_lag", "trained_by": "cql_lag", "scenario": cfg.name,
            "interface": "flat", "budgets": budgets, "episode_budget": budget,
            "episode_length": episode_length, "dataset": str(Path(data).resolve()),
            "settings": asdict(s), "last_metrics": metrics}
    (out / META_FILE).write_text(json.dumps(meta, indent=1))
    return out, metrics


@dataclass
class Evaluation:
    seeds: list[int]
    results: dict[str, list[dict[str, float]]]
    budgets: dict[str, float]
    comparisons: dict[str, dict[str, float]] = field(default_factory=dict)
    within: dict[str, dict[str, float]] = field(default_factory=dict)
    split: str = "test"


def evaluate(cfg: ScenarioConfig, checkpoint: str | Path, budgets: dict[str, float],
             seeds: list[int], params: dict[str, dict] | None = None,
             workers: int | None = None, label: str = "cql_lag",
             kind: str = "rllib") -> Evaluation:
    """The agent and both behaviour policies on ``seeds``: per-seed metrics, the agent's
    paired cost difference to each (95% t-interval) and the share of seeds on which each
    class's violation rate is within its budget (every policy). ``kind``: ``rllib`` (an
    RLlib checkpoint, CQL-Lag) or ``learned`` (a scenario-policy checkpoint)."""
    from cloudrl.scenarios.runner import ControllerSpec, paired_ci, run_controllers

    params = params if params is not None else behaviour_params(cfg.name)
    specs = [ControllerSpec(b, params.get(b, {})) for b in BEHAVIOURS]
    specs.append(ControllerSpec(kind, {"checkpoint": str(Path(checkpoint).resolve())},
                                label=label))
    res = run_controllers(cfg, specs, list(seeds), workers)
    results = {spec.name: r for spec, r in zip(specs, res, strict=True)}
    ev = Evaluation(list(seeds), results, budgets)
    agent = np.array([m["cost_usd"] for m in results[label]])
    for b in BEHAVIOURS:
        base = np.array([m["cost_usd"] for m in results[b]])
        d, lo, hi = paired_ci(agent, base)
        ev.comparisons[b] = {"diff": d, "lo": lo, "hi": hi,
                             "pct": 100.0 * d / float(base.mean())}
    for name, rows in results.items():
        ok = np.array([[m[f"sla_{c}"] <= budgets[c] + 1e-12 for c in CLASSES] for m in rows])
        ev.within[name] = {**{c: float(ok[:, k].mean()) for k, c in enumerate(CLASSES)},
                           "both": float(ok.all(axis=1).mean())}
    return ev


def format_table(ev: Evaluation, label: str = "cql_lag") -> str:
    b = ev.budgets
    lines = [f"{len(ev.seeds)} {ev.split} seeds; budgets: SLA LC {100 * b['lc']:.4f}%, "
             f"SLA batch {100 * b['batch']:.4f}% (violation rate per episode)",
             f"{'policy':14s}{'cost $':>10s}{'SLA LC %':>11s}{'SLA batch %':>13s}"
             f"{'LC within':>11s}{'batch within':>14s}{'both within':>13s}"]
    for name, rows in ev.results.items():
        lines.append(f"{name:14s}{np.mean([m['cost_usd'] for m in rows]):10.2f}"
                     f"{100 * np.mean([m['sla_lc'] for m in rows]):11.4f}"
                     f"{100 * np.mean([m['sla_batch'] for m in rows]):13.4f}"
                     f"{100 * ev.within[name]['lc']:10.0f}%"
                     f"{100 * ev.within[name]['batch']:13.0f}%"
                     f"{100 * ev.within[name]['both']:12.0f}%")
    for name, c in ev.comparisons.items():
        lines.append(f"{label} - {name}: {c['diff']:+.2f} $ [{c['lo']:+.2f}, {c['hi']:+.2f}] "
                     f"({c['pct']:+.1f}%; paired by seed, 95% t-interval)")
    return "\n".join(lines)


def to_json(ev: Evaluation) -> dict[str, Any]:
    return {"split": ev.split, "seeds": ev.seeds, "budgets": ev.budgets,
            "comparisons": ev.comparisons,
            "within_budget": ev.within,
            "means": {n: {k: float(np.mean([m[k] for m in rows]))
                          for k in ("cost_usd", "sla_lc", "sla_batch")}
                      for n, rows in ev.results.items()},
            "per_seed": ev.results}


@dataclass
class OfflineRun:
    data: Path
    checkpoint: Path
    budgets: dict[str, float]
    behaviours: dict[str, dict[str, float]]
    metrics: dict[str, float]
    evaluation: Evaluation
    wall_s: dict[str, float]


def run(cfg: ScenarioConfig, *, episodes: int, n_seeds: int, out: str | Path,
        settings: TrainSettings, workers: int | None = None, log: Any = print,
        data: str | Path | None = None, student: Any = None,
        noise: tuple[float, ...] = (), iql: Any = None,
        window_noise: tuple[float, ...] = (),
        override: dict[str, Any] | None = None,
        budget_quantile: float | None = None, split: str = "test",
        model: Any = None) -> OfflineRun:
    """Record (or reuse ``data``), train, evaluate on the first ``n_seeds`` seeds of
    ``split`` (test; validation to choose settings without touching the test seeds).
    ``student``: a :class:`cloudrl.scenarios.offline_student.StudentSettings` trains the
    budget-filtered cloning learner instead of CQL-Lag, ``iql`` a
    :class:`cloudrl.algorithms.iql.IQLConfig` implicit Q-learning
    (:mod:`cloudrl.scenarios.offline_iql`), ``model`` a
    :class:`cloudrl.algorithms.model_es.ModelESConfig` the clone (``student``'s settings)
    searched further in an input-driven model of the logs
    (:mod:`cloudrl.scenarios.offline_model`). ``override``: the scenario override ``cfg``
    was loaded with, recorded in the dataset. ``budget_quantile``: the budgets are that
    quantile of the behaviours' per-episode rates, not their means (:func:`class_budgets`;
    with ``data``, computed again from its episodes)."""
    from cloudrl.data.offline import read_dataset
    from cloudrl.protocol import seeds_for, train_seeds

    out = Path(out)
    wall: dict[str, float] = {}
    t0 = time.perf_counter()
    if data is None:
        eps = record(cfg, list(train_seeds(episodes)), noise=noise, window_noise=window_noise)
        budgets = class_budgets(eps, budget_quantile)
        data = write_dataset(eps, out / "data", budgets, override)
    else:
        eps = read_dataset(data)
        budgets = json.loads((Path(data) / "dataset.json").read_text())["budgets"]
        if budget_quantile is not None:
            budgets = class_budgets(eps, budget_quantile)
    behaviours = behaviour_table(eps)
    n_noisy = sum(not is_clean(ep) for ep in eps)
    episodes = max(int(row["episodes"]) for row in behaviours.values())  # of the data
    del eps
    wall["record_s"] = time.perf_counter() - t0
    log(f"{cfg.name}: {episodes} train episodes each of {', '.join(BEHAVIOURS)} "
        f"(rounded to env actions)" + (f" and {n_noisy} with random actions or shifted "
                                       f"windows injected" if n_noisy else "") + f" in {data}")
    for b, row in behaviours.items():
        log(f"  {b}: cost ${row['cost_usd']:.2f}, SLA LC {100 * row['sla_lc']:.4f}%, "
            f"batch {100 * row['sla_batch']:.4f}%")
    which = "rate" if budget_quantile is None else f"{budget_quantile:g} quantile"
    log(f"  budgets (the larger behaviour {which}): LC {100 * budgets['lc']:.4f}%, "
        f"batch {100 * budgets['batch']:.4f}%")
    t0 = time.perf_counter()
    if model is not None:
        from cloudrl.scenarios.offline_model import train_model_agent
        from cloudrl.scenarios.offline_student import StudentSettings

        ckpt, info = train_model_agent(cfg, data, out / f"model_seed{model.run_seed}",
                                       budgets, model,
                                       student or StudentSettings(run_seed=model.run_seed),
                                       log)
        metrics = {"kept_iteration": info["kept_iteration"], "rows": info["rows"],
                   "model_loss": info["model_loss"],
                   "held_out_start": info["history"][0]["held_objective"],
                   "held_out_kept": min(h["held_objective"] for h in info["history"])}
        label, kind = "model", "learned"
    elif student is not None:
        from cloudrl.scenarios.offline_student import train_student

        ckpt, info = train_student(cfg, data, out / f"student_seed{student.run_seed}",
                                   budgets, student, log)
        metrics = {"imitation_loss": info["imitation_loss"], "rows": info["rows"],
                   "kept_episodes": len(info["kept"]),
                   "kept_within_budget": info["kept_within_budget"]}
        label, kind = "student", "learned"
    elif iql is not None:
        from cloudrl.scenarios.offline_iql import train_iql_agent

        ckpt, info = train_iql_agent(cfg, data, out / f"iql_seed{iql.run_seed}", budgets, iql,
                                     log)
        metrics = {k: info[k] for k in ("q_loss", "v_loss", "adv_mean", "adv_std",
                                        "weight_capped_share", "reward_scale", "rows")}
        label, kind = "iql", "learned"
    else:
        ckpt, metrics = train(cfg, data, out / f"agent_seed{settings.run_seed}", budgets,
                              settings, log)
        label, kind = "cql_lag", "rllib"
    wall["train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ev = evaluate(cfg, ckpt, budgets, list(seeds_for(split, n_seeds)), workers=workers,
                  label=label, kind=kind)
    ev.split = split
    wall["evaluate_s"] = time.perf_counter() - t0
    return OfflineRun(Path(data), ckpt, budgets, behaviours, metrics, ev, wall)
