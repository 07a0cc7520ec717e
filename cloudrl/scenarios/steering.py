"""Preferences steer the scenario policies: a scripted operator with a hidden utility labels
pairs of episodes, a Bradley-Terry reward model learns from those labels only, and the
learned reward tunes the heuristic's and the MPC's parameters.

Hidden utilities (a cost in $ per episode, lower is better; ``m`` is an episode's
``stats.summary()``):

- ``lc_guard``: ``cost_usd + 50 * max(0, sla_lc - 0.0003) / 0.0001`` -- the default cost
  plus $50 per 0.01 percentage point of latency-critical violation rate above 0.03%.
- ``green_wear``: ``energy_usd + sla_usd + 4 * carbon_usd + 0.03 * transitions`` -- carbon
  at 4x its tariff (an internal carbon price) plus $0.03 of wear per power-state transition.
- ``sla_first``: ``energy_usd + carbon_usd + 10 * sla_usd`` -- SLA credits weigh 10x their
  tariff (what a missed deadline costs this operator in churn and credits).
- ``safe_cost``: ``cost_usd + 10 * max(0, sla_lc - 0.0003) / 0.0001 + 10 * max(0, sla_batch -
  0.003) / 0.001`` -- the scripted teacher of the RLHF phases (``cloudrl scenarios align``):
  the default cost, plus $10 per 0.01 percentage point of latency-critical violation rate
  above its bound (0.03%) and $10 per 0.1 point of batch violation rate above its (0.3%).

Steps (``steer``):

1. Pool (TRAIN seeds only): the heuristic and the MPC at random points of
   ``tuning.heuristic_space`` / :func:`steer_mpc_space` (and the rule's run-at-once
   corner), each played on a few train seeds; fixed by ``pool_seed``, shared by every run
   seed. The MPC's space adds the operator's weights the plan can carry (its carbon price
   and its penalty for late batch work) to the two knobs cost tuning searches.
2. Comparisons (per run seed): ``n_comparisons`` random pairs of pool episodes labelled by
   the hidden utility, ``noise`` of the labels flipped (seeded by the run seed).
3. Reward model (per run seed): Bradley-Terry over the episode's summary features,
   normalised by the pool's mean and spread; a linear term plus a small MLP (32 tanh
   units, Adam, weight decay 1e-2, 300 full-batch steps); 20% of the
   comparisons held out for the pair accuracy (against the noisy labels and the true ones).
4. Tuning (VALIDATION seeds): a Ray Tune search of each family (:func:`tune_search`: trial
   ``i`` plays point ``i`` of a seeded random list, the default-tuned point first, on the
   validation seeds and reports every run seed's mean learned reward, the objective); the
   steered point maximises the learned reward, the hidden-tuned reference minimises the
   hidden utility itself (the ceiling of this search), the default-tuned one is the
   project's cost-tuned point (``DEFAULT_TUNED``; the search's lowest mean cost where
   none is known).
5. Learned policy (optional, :func:`steer_learned`): the cost-tuned learned checkpoint
   is fine-tuned by DAgger towards the steered teacher (the steered heuristic or MPC,
   whichever the learned reward scores higher), and the round kept is the one with the
   best mean learned reward on validation seeds (the start competes too); the
   hidden-tuned reference is the same fine-tune towards the hidden-tuned teacher, kept by
   the hidden utility. With ``learned_method="es"`` the fine-tune is evolution strategies
   on the learned reward itself (:mod:`cloudrl.algorithms.es`: no teacher; each run
   seed's reward model scores the episodes), and the hidden-tuned reference is the same
   search on the hidden utility.
6. Test (TEST seeds): every chosen point under the hidden utility, paired by seed, 95%
   t-intervals; the gap closed is (U(default) - U(steered)) / (U(default) - U(hidden)).

Episodes are cached by (scenario, kind, parameters, seed) in a JSON file, so the two
utilities and the run seeds share every episode they can.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cloudrl.algorithms.bradley_terry import fit_pairs, pair_accuracy
from cloudrl.protocol import test_seeds, train_seeds, validation_seeds
from cloudrl.scenarios.runner import ControllerSpec, paired_ci, run_controllers
from cloudrl.scenarios.tuning import RUN_AT_ONCE_LIKE, heuristic_space, mpc_space
from envs.scenario.config import ScenarioConfig

LC_THRESHOLD = 0.0003  # 0.03% latency-critical violation rate
LC_STEP = 0.0001  # 0.01 percentage point
LC_PRICE = 50.0  # $ per step above the threshold
CARBON_WEIGHT = 4.0
WEAR_USD = 0.03  # $ per power-state transition
SLA_WEIGHT = 10.0
SAFE_BOUNDS = {"sla_lc": 0.0003, "sla_batch": 0.003}  # per-class violation-rate bounds
SAFE_STEPS = {"sla_lc": 0.0001, "sla_batch": 0.001}
SAFE_PRICE = 10.0  # $ per step above a bound


def lc_guard(m: dict[str, float]) -> float:
    """cost_usd + 50 * max(0, sla_lc - 0.0003) / 0.0001 ($, lower is better)."""
    return float(m["cost_usd"] + LC_PRICE * max(0.0, m["sla_lc"] - LC_THRESHOLD) / LC_STEP)


def green_wear(m: dict[str, float]) -> float:
    """energy_usd + sla_usd + 4 * carbon_usd + 0.03 * transitions ($, lower is better)."""
    return float(m["energy_usd"] + m["sla_usd"] + CARBON_WEIGHT * m["carbon_usd"]
                 + WEAR_USD * m["transitions"])


def sla_first(m: dict[str, float]) -> float:
    """energy_usd + carbon_usd + 10 * sla_usd ($, lower is better)."""
    return float(m["energy_usd"] + m["carbon_usd"] + SLA_WEIGHT * m["sla_usd"])


def safe_cost(m: dict[str, float], bounds: dict[str, float] | None = None) -> float:
    """cost_usd + $10 per step above each class's bound (LC: 0.01 pp above 0.03%; batch:
    0.1 pp above 0.3%; ``bounds`` replaces any of those rates) ($, lower is better)."""
    b = {**SAFE_BOUNDS, **(bounds or {})}
    return float(m["cost_usd"] + sum(SAFE_PRICE * max(0.0, m[c] - b[c]) / SAFE_STEPS[c]
                                     for c in SAFE_BOUNDS))


UTILITIES: dict[str, Callable[[dict[str, float]], float]] = {
    "lc_guard": lc_guard, "green_wear": green_wear, "sla_first": sla_first,
    "safe_cost": safe_cost}

# the summary metrics the reward model sees (no job counts: they are the seed's, not the
# behaviour's; no timings)
FEATURES = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "energy_kwh", "carbon_kg",
            "transitions", "transition_kwh", "sla_lc", "sla_batch", "violations_lc",
            "violations_batch")

# the parameters tuned on the default reward (cost_usd) per scenario
DEFAULT_TUNED: dict[str, dict[str, dict[str, Any]]] = {
    "scarcity_spikes": {
        "signal_aware": {"quantile": 0.5786256554801771, "window_hours": 18.0,
                         "release_util": 0.8033178878835899, "ready_margin": 0.437697936590399,
                         "guard_hours": 4.0},
        "mpc": {"max_util": 0.6143407333776681, "ready_hedge": 0.009916581317117456}},
}
FAMILIES = ("signal_aware", "mpc")
FAMILY_NAMES = {"signal_aware": "heuristic", "mpc": "MPC", "learned": "learned"}


def steer_mpc_space(rng: np.random.Generator) -> dict[str, Any]:
    """``tuning.mpc_space`` plus the weights an operator's objective can put in the plan:
    the penalty factor for late batch work (1..30, log-uniform) and the multiple of the
    carbon tariff the plan prices (0.5..8, log-uniform)."""
    p = mpc_space(rng)
    p["shortfall_factor"] = float(np.exp(rng.uniform(np.log(1.0), np.log(30.0))))
    p["carbon_weight"] = float(np.exp(rng.uniform(np.log(0.5), np.log(8.0))))
    return p


# ------------------------------------------------------------------ episodes, cached
class EpisodeCache:
    """Per-episode summary metrics keyed by (scenario, kind, parameters, seed)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self.data: dict[str, dict[str, float]] = {}
        if self.path and self.path.exists():
            self.data = json.loads(self.path.read_text())

    @staticmethod
    def key(scenario: str, spec: ControllerSpec, seed: int) -> str:
        return json.dumps([scenario, spec.kind, spec.params, int(seed)], sort_keys=True)

    def play(self, cfg: ScenarioConfig, specs: list[ControllerSpec], seeds: list[int],
             workers: int | None = None) -> list[list[dict[str, float]]]:
        """``out[i][k]``: metrics of ``specs[i]`` on ``seeds[k]``, playing only what is new."""
        todo = [s for s in _unique(specs)
                if any(self.key(cfg.name, s, k) not in self.data for k in seeds)]
        if todo:
            missing = sorted({k for s in todo for k in seeds
                              if self.key(cfg.name, s, k) not in self.data})
            res = run_controllers(cfg, todo, missing, workers)
            for s, r in zip(todo, res, strict=True):
                for k, m in zip(missing, r, strict=True):
                    self.data[self.key(cfg.name, s, k)] = {a: float(v) for a, v in m.items()}
            self.save()
        return [[self.data[self.key(cfg.name, s, k)] for k in seeds] for s in specs]

    def save(self) -> None:
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data))
            tmp.replace(self.path)


def _unique(specs: list[ControllerSpec]) -> list[ControllerSpec]:
    seen, out = set(), []
    for s in specs:
        k = json.dumps([s.kind, s.params], sort_keys=True)
        if k not in seen:
            seen.add(k)
            out.append(s)
    return out


# ------------------------------------------------------------------ comparisons
@dataclass
class Comparisons:
    a: np.ndarray  # indices into the pool
    b: np.ndarray
    label: np.ndarray  # 1.0: A preferred (after noise), 0.0: B preferred
    true_label: np.ndarray  # the hidden utility's own verdict
    flipped: np.ndarray  # bool


def sample_comparisons(utilities: np.ndarray, n: int, noise: float,
                       rng: np.random.Generator) -> Comparisons:
    """``n`` random pairs of distinct pool episodes; A preferred when its hidden utility (a
    cost) is lower (a tie: a fair coin); then each label flipped with probability ``noise``."""
    u = np.asarray(utilities, float)
    if len(u) < 2:
        raise ValueError("the pool needs at least 2 episodes")
    if not 0.0 <= noise <= 0.5:
        raise ValueError(f"noise must be in [0, 0.5], got {noise}")
    a = rng.integers(0, len(u), n)
    b = (a + rng.integers(1, len(u), n)) % len(u)  # never a itself
    coin = rng.random(n) < 0.5
    true = np.where(u[a] < u[b], 1.0, np.where(u[a] > u[b], 0.0, coin.astype(float)))
    flipped = rng.random(n) < noise
    label = np.where(flipped, 1.0 - true, true)
    return Comparisons(a, b, label, true, flipped)


# ------------------------------------------------------------------ reward model
class RewardModel:
    """Bradley-Terry reward over normalised episode features: linear term + small MLP.
    ``score`` is higher for preferred episodes."""

    def __init__(self, mean: np.ndarray, std: np.ndarray, hidden: int = 32,
                 seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.mean, self.std = np.asarray(mean, float), np.asarray(std, float)
        d = len(self.mean)
        self.linear = torch.nn.Linear(d, 1)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, 1))

    def parameters(self) -> list[torch.nn.Parameter]:
        return [*self.linear.parameters(), *self.mlp.parameters()]

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.linear(x) + self.mlp(x)).squeeze(-1)

    def _x(self, feats: np.ndarray) -> torch.Tensor:
        return torch.as_tensor((np.asarray(feats, float) - self.mean) / self.std,
                               dtype=torch.float32)

    def score(self, feats: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self._forward(self._x(np.atleast_2d(feats))).numpy().astype(float)

    def fit(self, feats: np.ndarray, a: np.ndarray, b: np.ndarray, label: np.ndarray,
            steps: int = 300, lr: float = 0.02, weight_decay: float = 1e-2) -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a few hundred tiny full-batch steps: one thread is fastest
        try:
            return self._fit(feats, a, b, label, steps, lr, weight_decay)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, feats: np.ndarray, a: np.ndarray, b: np.ndarray, label: np.ndarray,
             steps: int, lr: float, weight_decay: float) -> float:
        return fit_pairs(self._forward, self.parameters(), self._x(feats), a, b, label,
                         steps, lr, weight_decay)

    def prob_a(self, feats: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        r = self.score(feats)
        return 1.0 / (1.0 + np.exp(-(r[a] - r[b])))


def features(metrics: list[dict[str, float]]) -> np.ndarray:
    return np.array([[float(m[f]) for f in FEATURES] for m in metrics])


def learn_reward(feats: np.ndarray, comp: Comparisons, seed: int, holdout: float = 0.2,
                 steps: int = 300) -> tuple[RewardModel, dict[str, float]]:
    """Fit on (1 - holdout) of the comparisons; pair accuracy on the rest."""
    rng = np.random.default_rng([seed, 7])
    n = len(comp.a)
    order = rng.permutation(n)
    n_test = int(round(holdout * n)) if n >= 5 else 0
    test, train = order[:n_test], order[n_test:]
    std = feats.std(0)
    model = RewardModel(feats.mean(0), np.where(std > 0, std, 1.0), seed=seed)
    loss = model.fit(feats, comp.a[train], comp.b[train], comp.label[train], steps=steps)
    info = {"train_loss": loss, "n_train": int(len(train)), "n_heldout": int(n_test),
            "heldout_acc_noisy": float("nan"), "heldout_acc_true": float("nan")}
    if n_test:
        p = model.prob_a(feats, comp.a[test], comp.b[test])
        info["heldout_acc_noisy"] = pair_accuracy(p, comp.label[test])
        info["heldout_acc_true"] = pair_accuracy(p, comp.true_label[test])
    return model, info


# ------------------------------------------------------------------ the pipeline
@dataclass
class SteerConfig:
    scenario: str = "scarcity_spikes"
    utility: str = "lc_guard"
    n_comparisons: int = 1000
    noise: float = 0.1
    run_seeds: tuple[int, ...] = (0, 1, 2)
    n_test_seeds: int = 50
    pool_heuristic: int = 30  # random heuristic points in the pool (+ the run-at-once corner)
    pool_mpc: int = 10  # random MPC points in the pool (+ its defaults)
    pool_seeds: int = 2  # train seeds each pool point plays
    pool_seed: int = 0
    tune_heuristic: int = 24  # search points per family (the default-tuned one included)
    tune_mpc: int = 8
    tune_seeds: int = 8  # validation seeds
    tune_seed: int = 1
    workers: int | None = None
    cache: str | None = "results/steer/episodes.json"
    # the learned family (off unless ``learned``): a DAgger fine-tune of ``init_checkpoint``
    learned: bool = False
    init_checkpoint: str | None = None  # default: checkpoints/<scenario> when it exists
    learned_out: str = "results/steer/learned"
    learned_expert_seeds: int = 10
    learned_rounds: int = 2
    learned_round_seeds: int = 4
    learned_val_seeds: int = 8
    learned_bc_epochs: int = 20
    learned_round_epochs: int = 15
    learned_method: str = "dagger"  # or "es": evolution strategies on the learned reward
    learned_es_iterations: int = 15
    learned_es_params: str = "head"  # es: the output layer ("head") or every weight ("all")

    def __post_init__(self) -> None:
        if self.utility not in UTILITIES:
            raise ValueError(f"--utility {self.utility!r}: valid: {', '.join(UTILITIES)}")
        if not 2 <= self.n_comparisons <= 1000:
            raise ValueError(f"--comparisons must be in [2, 1000], got {self.n_comparisons}")
        if not 0.0 <= self.noise <= 0.5:
            raise ValueError(f"--noise must be in [0, 0.5], got {self.noise}")
        for name in ("n_test_seeds", "pool_seeds", "tune_seeds", "learned_val_seeds"):
            v = getattr(self, name)
            if not 1 <= v <= 50:
                raise ValueError(f"{name} must be in [1, 50], got {v}")
        for name in ("pool_heuristic", "pool_mpc", "tune_heuristic", "tune_mpc",
                     "learned_expert_seeds", "learned_bc_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.run_seeds:
            raise ValueError("at least one run seed")
        if self.learned:  # before anything runs: the start must load
            from cloudrl.algorithms.distill.policy import load_checkpoint

            load_checkpoint(self.init_checkpoint or f"checkpoints/{self.scenario}")
        if self.learned_method not in ("dagger", "es"):
            raise ValueError(f"--learned-method {self.learned_method!r}: valid: dagger, es")
        if self.learned_es_params not in ("head", "all"):
            raise ValueError(f"--learned-es-params {self.learned_es_params!r}: valid: head, all")
        if self.learned_es_iterations < 1:
            raise ValueError(f"learned_es_iterations must be >= 1, got "
                             f"{self.learned_es_iterations}")
        if self.learned_rounds < 0 or self.learned_round_seeds < 0 or \
                self.learned_round_epochs < 0:
            raise ValueError("learned_rounds, learned_round_seeds and learned_round_epochs "
                             "must be >= 0")


def pool_specs(cfg: SteerConfig) -> list[ControllerSpec]:
    rng = np.random.default_rng([cfg.pool_seed, 11])
    specs = [ControllerSpec("signal_aware", dict(RUN_AT_ONCE_LIKE)), ControllerSpec("mpc", {})]
    specs += [ControllerSpec("signal_aware", heuristic_space(rng))
              for _ in range(cfg.pool_heuristic)]
    specs += [ControllerSpec("mpc", steer_mpc_space(rng)) for _ in range(cfg.pool_mpc)]
    return specs


def search_specs(cfg: SteerConfig, default: dict[str, dict[str, Any]]
                 ) -> dict[str, list[ControllerSpec]]:
    rng = np.random.default_rng([cfg.tune_seed, 13])
    h = [ControllerSpec("signal_aware", default.get("signal_aware", {})),
         ControllerSpec("signal_aware", dict(RUN_AT_ONCE_LIKE))]
    h += [ControllerSpec("signal_aware", heuristic_space(rng))
          for _ in range(max(cfg.tune_heuristic - 2, 0))]
    m = [ControllerSpec("mpc", default.get("mpc", {}))]
    m += [ControllerSpec("mpc", steer_mpc_space(rng)) for _ in range(max(cfg.tune_mpc - 1, 0))]
    return {"signal_aware": _unique(h)[:max(cfg.tune_heuristic, 1)],
            "mpc": _unique(m)[:max(cfg.tune_mpc, 1)]}


@dataclass
class SteerResult:
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    reward_models: list[dict[str, Any]]
    wall_s: float
    table: str = ""
    chosen: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "rows": self.rows, "reward_models": self.reward_models,
                "chosen": self.chosen, "wall_s": self.wall_s, "table": self.table}


def _search_trial(config: dict[str, Any], scn: ScenarioConfig, specs: list[ControllerSpec],
                  seeds: list[int], cached: list[list[dict[str, float] | None]],
                  models: dict[int, RewardModel], utility: str) -> None:
    """One Tune trial: point ``config["point"]`` on every validation seed (cached episodes
    are not replayed); reports each run seed's mean learned reward, the hidden utility's
    mean (for the reference only) and the episodes."""
    from ray import tune as rtune

    i = int(config["point"])
    have = cached[i]
    missing = [k for k, m in zip(seeds, have, strict=True) if m is None]
    played = {}
    if missing:
        (res,) = run_controllers(scn, [specs[i]], missing, workers=1)
        played = dict(zip(missing, res, strict=True))
    eps = [m if m is not None else played[k] for k, m in zip(seeds, have, strict=True)]
    feats = features(eps)
    report: dict[str, Any] = {
        f"learned_reward_run{rs}": float(model.score(feats).mean())
        for rs, model in models.items()}
    report.update({"hidden_utility": float(np.mean([UTILITIES[utility](m) for m in eps])),
                   "cost_usd": float(np.mean([m["cost_usd"] for m in eps])),
                   "episodes": json.dumps(eps)})  # a string: Tune's loggers skip it
    rtune.report(report)


def _fit(scn: ScenarioConfig, specs: list[ControllerSpec], seeds: list[int],
         cached: list[list[dict[str, float] | None]], models: dict[int, RewardModel],
         utility: str, concurrent: int, first: str, name: str) -> Any:
    from ray import tune as rtune

    from cloudrl.scenarios.tuning import _quiet_tune, _ray, _storage

    with _quiet_tune(), _ray(concurrent), _storage(None) as storage:
        trainable = rtune.with_resources(rtune.with_parameters(
            _search_trial, scn=scn, specs=specs, seeds=seeds, cached=cached, models=models,
            utility=utility), {"cpu": 1})
        tuner = rtune.Tuner(
            trainable, param_space={"point": rtune.grid_search(list(range(len(specs))))},
            tune_config=rtune.TuneConfig(metric=first, mode="max", num_samples=1,
                                         max_concurrent_trials=concurrent,
                                         reuse_actors=True),
            run_config=rtune.RunConfig(name=name, storage_path=storage, verbose=0))
        grid = tuner.fit()
    return grid


def tune_search(scn: ScenarioConfig, specs: list[ControllerSpec], seeds: list[int],
                cache: EpisodeCache, models: dict[int, RewardModel], utility: str,
                workers: int | None = None) -> list[dict[str, Any]]:
    """The search of one family as a Ray Tune run: a grid over the point indices, one trial
    per point (at most ``workers`` at once, one CPU each), the objective each run seed's
    mean learned reward (maximised). Returns, per point in order, the trial's report; the
    episodes it played join ``cache``."""
    cached = [[cache.data.get(cache.key(scn.name, sp, k)) for k in seeds] for sp in specs]
    concurrent = max(1, min(workers or os.cpu_count() or 1, len(specs)))
    first = f"learned_reward_run{min(models)}"
    name = f"steer-{scn.name}-{utility}-{specs[0].kind}-{uuid.uuid4().hex[:6]}"
    grid = _fit(scn, specs, seeds, cached, models, utility, concurrent, first, name)
    by: dict[int, dict[str, Any]] = {}
    for r in grid:
        if r.error is not None or first not in (r.metrics or {}):
            raise RuntimeError(f"steer search: trial {r.config} failed: {r.error}")
        by[int(r.config["point"])] = dict(r.metrics)
    out = [by[i] for i in range(len(specs))]
    for sp, rep in zip(specs, out, strict=True):
        rep["episodes"] = json.loads(rep["episodes"])
        for k, m in zip(seeds, rep["episodes"], strict=True):
            cache.data[cache.key(scn.name, sp, k)] = {a: float(v) for a, v in m.items()}
    cache.save()
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "policy.pt").read_bytes()).hexdigest()[:16]


def learned_spec(path: Path) -> ControllerSpec:
    """The runner's spec of a learned checkpoint, keyed by its weights (so the episode
    cache never serves a retrained checkpoint's episodes for another's)."""
    return ControllerSpec("learned", {"checkpoint": str(path), "sha": _digest(path)})


def _fine_tune(args: tuple) -> dict[str, Any]:
    """One DAgger fine-tune (a worker process): the teacher ``kind`` ("mpc" or
    "signal_aware") at ``params``, the round kept by ``objective`` (a learned reward model,
    or a hidden utility's name)."""
    scn, cfg, kind, params, run_seed, objective, out = args
    from cloudrl.algorithms.distill.command import train_to_dir
    from cloudrl.algorithms.distill.config import DistillConfig
    from cloudrl.quiet import quiet_library_logs

    quiet_library_logs()
    torch.set_num_threads(1)
    if isinstance(objective, str):
        score = UTILITIES[objective]
    else:
        def score(m: dict[str, float]) -> float:
            return -float(objective.score(features([m]))[0])
    from cloudrl.algorithms.distill.policy import fine_tune_fields

    teacher = {"heuristic_params": params} if kind == "signal_aware" else {"mpc_params": params}
    dc = DistillConfig(run_seed=run_seed, **fine_tune_fields(cfg["init"]), **teacher,
                       n_expert_seeds=cfg["expert_seeds"], dagger_rounds=cfg["rounds"],
                       dagger_seeds_per_round=cfg["round_seeds"], n_val_seeds=cfg["val_seeds"],
                       bc_epochs=cfg["bc_epochs"], round_epochs=cfg["round_epochs"])
    tag = hashlib.sha256(json.dumps([kind, params], sort_keys=True).encode()).hexdigest()[:10]
    lines: list[str] = []
    res = train_to_dir(scn, dc, out, Path(out).parent / f"expert-{tag}.npz",
                       command="cloudrl scenarios steer --learned (fine-tune)",
                       objective=score, log=lines.append)
    return {"checkpoint": str(out), "kept_round": res.best_round, "rounds": res.rounds,
            "log": lines, "teacher": kind, "teacher_params": params, "run_seed": run_seed}


def steer_learned(scn: ScenarioConfig, cfg: SteerConfig, chosen: dict[str, dict[str, Any]],
                  models: dict[int, RewardModel], log: Callable[[str], None] = print
                  ) -> dict[str, ControllerSpec]:
    """The learned family: the cost-tuned checkpoint (default-tuned); its DAgger fine-tune
    towards each run seed's steered point (of the heuristic or the MPC, whichever that run
    seed's learned reward scores higher on validation), kept by the learned reward
    (steered); and its fine-tune towards the hidden-tuned point (either family's, lower
    hidden utility on validation), kept by the hidden utility (hidden-tuned, the first run
    seed's). Fine-tunes run side by side as ``workers`` Ray tasks."""
    init = cfg.init_checkpoint or f"checkpoints/{scn.name}"
    root = Path(cfg.learned_out) / scn.name / cfg.utility
    if cfg.learned_method == "es":
        es_dir = "es" if cfg.learned_es_params == "head" else f"es-{cfg.learned_es_params}"
        return _steer_learned_es(scn, cfg, chosen, models, init, root / es_dir, log)
    kw = {"init": init, "expert_seeds": cfg.learned_expert_seeds, "rounds": cfg.learned_rounds,
          "round_seeds": cfg.learned_round_seeds, "val_seeds": cfg.learned_val_seeds,
          "bc_epochs": cfg.learned_bc_epochs, "round_epochs": cfg.learned_round_epochs}
    def best(keys: list[str], by: str, sign: float) -> tuple[str, dict[str, Any]]:
        k = max(keys, key=lambda k: sign * chosen[k][by])  # ties: the heuristic (first)
        return k.split("/")[1], chosen[k]["params"]

    jobs = []
    for rs in cfg.run_seeds:  # the teacher: the steered point of either family that the
        # run seed's learned reward scores higher on the validation seeds
        kind, params = best([f"steered{rs}/{f}" for f in FAMILIES], "val_learned_reward", 1.0)
        jobs.append((scn, kw, kind, params, rs, models[rs], root / f"steered-run{rs}"))
    rs0 = cfg.run_seeds[0]
    kind, params = best([f"hidden/{f}" for f in FAMILIES], "val_utility", -1.0)
    jobs.append((scn, kw, kind, params, rs0, cfg.utility, root / f"hidden-run{rs0}"))
    workers = max(1, min(cfg.workers or os.cpu_count() or 1, len(jobs)))
    t0 = time.perf_counter()
    if workers == 1:  # in this process (torch's thread setting restored afterwards)
        threads = torch.get_num_threads()
        try:
            done = [_fine_tune(job) for job in jobs]
        finally:
            torch.set_num_threads(threads)
    else:
        from cloudrl.parallel import ordered_map

        done = ordered_map(_fine_tune, jobs, workers, desc="learned fine-tunes")
    for d in done:
        log(f"learned fine-tune -> {d['checkpoint']} (teacher {d['teacher']}): kept round "
            f"{d['kept_round']} (validation: " + ", ".join(
                f"{r['round']}: {r['val_cost']:.2f}" for r in d["rounds"]) + ")")
    log(f"learned fine-tunes: {len(jobs)} in {time.perf_counter() - t0:.0f} s")
    specs = {"default/learned": learned_spec(Path(init))}
    keys = [f"steered{rs}/learned" for rs in cfg.run_seeds] + ["hidden/learned"]
    for key, d in zip(keys, done, strict=True):
        specs[key] = learned_spec(Path(d["checkpoint"]))
        chosen[key] = {"params": d["teacher_params"], "teacher": d["teacher"],
                       "kept_round": d["kept_round"], "checkpoint": d["checkpoint"],
                       "rounds": d["rounds"]}
    chosen["default/learned"] = {"params": {}, "checkpoint": init}
    return specs


def _steer_learned_es(scn: ScenarioConfig, cfg: SteerConfig, chosen: dict[str, dict[str, Any]],
                      models: dict[int, RewardModel], init: str, root: Path,
                      log: Callable[[str], None]) -> dict[str, ControllerSpec]:
    """:func:`steer_learned` by evolution strategies: per run seed, ``init`` fine-tuned on
    that run seed's learned reward (steered); once, on the hidden utility itself
    (hidden-tuned, the first run seed's perturbations). One search at a time, each over
    ``workers`` processes."""
    from cloudrl.algorithms.es.command import train_to_dir
    from cloudrl.algorithms.es.config import ESConfig

    def learned_objective(model: RewardModel) -> Callable[[dict[str, float]], float]:
        return lambda m: -float(model.score(features([m]))[0])

    jobs = [(f"steered{rs}/learned", f"steered-run{rs}", rs, learned_objective(models[rs]),
             "the learned reward") for rs in cfg.run_seeds]
    rs0 = cfg.run_seeds[0]
    jobs.append(("hidden/learned", f"hidden-run{rs0}", rs0, UTILITIES[cfg.utility],
                 "the hidden utility"))
    specs = {"default/learned": learned_spec(Path(init))}
    chosen["default/learned"] = {"params": {}, "checkpoint": init}
    t0 = time.perf_counter()
    for key, name, rs, objective, what in jobs:
        out = root / name
        ec = ESConfig(run_seed=rs, iterations=cfg.learned_es_iterations,
                      n_val_seeds=cfg.learned_val_seeds, workers=cfg.workers,
                      params=cfg.learned_es_params)
        lines: list[str] = []
        res = train_to_dir(scn, init, ec, out, objective=objective, log=lines.append,
                           command=f"cloudrl scenarios steer --learned --learned-method es "
                                   f"--learned-es-params {cfg.learned_es_params} "
                                   f"({key}: evolution strategies on {what})")
        log(f"learned ES on {what} -> {out}: kept iteration {res.kept_iteration} "
            f"(validation: " + ", ".join(f"{h['iteration']}: {h['val']:.2f}"
                                         for h in res.history if "val" in h) + ")")
        specs[key] = learned_spec(out)
        chosen[key] = {"params": {}, "method": "es", "es_params": cfg.learned_es_params,
                       "objective": what,
                       "kept_iteration": res.kept_iteration, "checkpoint": str(out),
                       "history": res.history}
    log(f"learned ES fine-tunes: {len(jobs)} in {time.perf_counter() - t0:.0f} s")
    return specs


def steer(scn: ScenarioConfig, cfg: SteerConfig, log: Callable[[str], None] = print
          ) -> SteerResult:
    t0 = time.perf_counter()
    util = UTILITIES[cfg.utility]
    cache = EpisodeCache(cfg.cache)

    # 1. the pool, on train seeds
    pspecs = pool_specs(cfg)
    pseeds = list(train_seeds(cfg.pool_seeds))
    pres = cache.play(scn, pspecs, pseeds, cfg.workers)
    pool = [m for r in pres for m in r]
    feats = features(pool)
    u_pool = np.array([util(m) for m in pool])
    log(f"pool: {len(pool)} episodes ({len(pspecs)} behaviours x {len(pseeds)} train seeds), "
        f"{cfg.utility} {u_pool.min():.1f}..{u_pool.max():.1f} $ "
        f"({time.perf_counter() - t0:.0f} s)")

    # 2-3. per run seed: comparisons, reward model
    models: dict[int, RewardModel] = {}
    infos = []
    for rs in cfg.run_seeds:
        rng = np.random.default_rng([rs, 0x57EE])
        comp = sample_comparisons(u_pool, cfg.n_comparisons, cfg.noise, rng)
        model, info = learn_reward(feats, comp, seed=rs)
        info.update({"run_seed": rs, "flipped": float(comp.flipped.mean())})
        models[rs] = model
        infos.append(info)
        log(f"run seed {rs}: {cfg.n_comparisons} comparisons ({comp.flipped.mean():.1%} "
            f"flipped), held-out pair accuracy {info['heldout_acc_noisy']:.3f} (noisy labels) "
            f"/ {info['heldout_acc_true']:.3f} (true order)")

    # 4. the search (Ray Tune, validation seeds): each run seed's learned reward
    default = DEFAULT_TUNED.get(scn.name, {})
    cands: dict[str, list[ControllerSpec]] = search_specs(cfg, default)
    vseeds = list(validation_seeds(cfg.tune_seeds))
    from cloudrl.scenarios.tuning import _ray

    with _ray(max(1, cfg.workers or os.cpu_count() or 1)):  # one Ray for both searches
        reports = {fam: tune_search(scn, cands[fam], vseeds, cache, models, cfg.utility,
                                    cfg.workers) for fam in FAMILIES}
    log(f"search (Ray Tune): {sum(len(c) for c in cands.values())} points x {len(vseeds)} "
        f"validation seeds ({time.perf_counter() - t0:.0f} s)")
    chosen: dict[str, dict[str, Any]] = {}
    specs_of: dict[str, ControllerSpec] = {}
    for fam in FAMILIES:
        rep = reports[fam]
        cost = np.array([r["cost_usd"] for r in rep])
        hid = np.array([r["hidden_utility"] for r in rep])
        picks = {f"default/{fam}": 0 if fam in default else int(np.argmin(cost)),
                 f"hidden/{fam}": int(np.argmin(hid))}
        for rs in cfg.run_seeds:  # ties: the earlier point
            picks[f"steered{rs}/{fam}"] = int(np.argmax([r[f"learned_reward_run{rs}"]
                                                         for r in rep]))
        for k, idx in picks.items():
            chosen[k] = {"index": idx, "params": cands[fam][idx].params,
                         "val_utility": float(hid[idx])}
            if k.startswith("steered"):
                rs = int(k.split("/")[0].removeprefix("steered"))
                chosen[k]["val_learned_reward"] = float(rep[idx][f"learned_reward_run{rs}"])
            specs_of[k] = cands[fam][idx]
        log(f"{FAMILY_NAMES[fam]}: default #{picks[f'default/{fam}']}, hidden-tuned "
            f"#{picks[f'hidden/{fam}']}, steered " + ", ".join(
                f"#{picks[f'steered{rs}/{fam}']}" for rs in cfg.run_seeds))

    # 5. the learned family (optional)
    families = list(FAMILIES)
    if cfg.learned:
        specs_of.update(steer_learned(scn, cfg, chosen, models, log))
        families.append("learned")

    # 6. test seeds, paired
    tseeds = list(test_seeds(cfg.n_test_seeds))
    keys = list(specs_of)
    tres = cache.play(scn, [specs_of[k] for k in keys], tseeds, cfg.workers)
    metrics_of = dict(zip(keys, tres, strict=True))

    def test_u(k: str) -> np.ndarray:
        return np.array([util(m) for m in metrics_of[k]])

    base = test_u("default/signal_aware")
    rows = []
    for fam in families:
        ud, uh = test_u(f"default/{fam}"), test_u(f"hidden/{fam}")
        entries = [("default-tuned", f"default/{fam}", None),
                   ("hidden-tuned", f"hidden/{fam}", None)]
        entries += [(f"steered (run {rs})", f"steered{rs}/{fam}", rs) for rs in cfg.run_seeds]
        for label, key, rs in entries:
            u = test_u(key)
            d, lo, hi = paired_ci(u, base)
            dd, dlo, dhi = paired_ci(u, ud)
            hd, hlo, hhi = paired_ci(u, uh)
            denom = float(ud.mean() - uh.mean())
            gap = float((ud.mean() - u.mean()) / denom) if abs(denom) > 1e-9 else float("nan")
            rows.append({"family": FAMILY_NAMES[fam], "policy": label, "run_seed": rs,
                         "params": chosen[key]["params"], "utility_mean": float(u.mean()),
                         "cost_usd_mean": float(np.mean([m["cost_usd"]
                                                         for m in metrics_of[key]])),
                         "vs_default_heuristic": [d, lo, hi],
                         "vs_default_same_family": [dd, dlo, dhi],
                         "vs_hidden_same_family": [hd, hlo, hhi], "gap_closed": gap,
                         "u_default_minus_u_hidden": denom})
        st = [r for r in rows if r["family"] == FAMILY_NAMES[fam] and r["run_seed"] is not None]
        med = sorted(st, key=lambda r: r["utility_mean"])[len(st) // 2]
        rows.append({**med, "policy": f"steered (median: run {med['run_seed']})",
                     "median_of": [r["run_seed"] for r in st]})
    res = SteerResult(asdict(cfg), rows, infos, time.perf_counter() - t0, chosen=chosen)
    res.table = format_table(res, scn.name)
    return res


def format_table(res: SteerResult, scenario: str) -> str:
    c = res.config
    lines = [f"{scenario}, hidden utility {c['utility']} ($/episode, lower is better), "
             f"{c['n_test_seeds']} test seeds; {c['n_comparisons']} comparisons, "
             f"{c['noise']:.0%} label noise",
             f"{'family':10s} {'policy':26s} {'U':>9s} {'cost':>8s}  "
             f"{'U - default heuristic [95% CI]':>32s}  {'U - hidden-tuned [95% CI]':>28s}  "
             f"{'gap closed':>10s}"]
    for r in res.rows:
        d, lo, hi = r["vs_default_heuristic"]
        gap = "" if r["run_seed"] is None and "median" not in r["policy"] else \
            "n/a" if not np.isfinite(r["gap_closed"]) else f"{100 * r['gap_closed']:9.0f}%"
        h, hlo, hhi = r["vs_hidden_same_family"]
        lines.append(f"{r['family']:10s} {r['policy']:26s} {r['utility_mean']:9.2f} "
                     f"{r['cost_usd_mean']:8.2f}  {d:+9.2f} [{lo:+8.2f}, {hi:+8.2f}]      "
                     f"{h:+9.2f} [{hlo:+8.2f}, {hhi:+8.2f}]  {gap:>10s}")
    lines.append("reward model held-out pair accuracy (noisy labels / true order): " + ", ".join(
        f"run {m['run_seed']}: {m['heldout_acc_noisy']:.3f} / {m['heldout_acc_true']:.3f}"
        for m in res.reward_models))
    lines.append("U - hidden-tuned: against the same family tuned on the hidden utility "
                 "itself (the true-reward reference)")
    lines.append("gap closed: (U(default-tuned) - U(steered)) / (U(default-tuned) - "
                 "U(hidden-tuned)) within the family; n/a where the two references tie")
    lines.append(f"wall time {res.wall_s:.0f} s")
    return "\n".join(lines)
