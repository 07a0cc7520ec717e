"""The RLHF phases on a scenario (``cloudrl scenarios align``), with a scripted teacher that
ranks episodes by cost and per-class safety bounds (``safe_cost`` in
:mod:`cloudrl.scenarios.steering`).

1. **BC from the heuristic**: the tuned signal-aware rule demonstrates on TRAIN seeds and the
   scenario policy (:mod:`cloudrl.algorithms.distill`) clones it: the start. No DAgger round
   by default; with ``bc_dagger_rounds`` the heuristic also labels the clone's own states.
2. **Reward model from ranked pairs** (per run seed): at most 1,000 comparisons of pool
   episodes (the steering pool: the heuristic and the MPC at random points on TRAIN seeds)
   labelled by the teacher, ``noise`` of them flipped; a Bradley-Terry reward model on the
   episodes' summary features, and the alignment head (:mod:`cloudrl.scenarios.safety_head`)
   on the same labels.
3. **Policy optimisation** (per run seed): evolution strategies (:mod:`cloudrl.algorithms.es`)
   from the start on the learned reward, and, with the same run seed (the same
   perturbations and seeds), on the learned reward plus ``head_weight`` times the head. The
   true-reward reference: the same search on the teacher's utility itself.
4. **Test** (TEST seeds, paired by seed, 95% t-intervals): every policy under the teacher's
   utility; the learned-reward policy against the true-reward one (inside its interval is
   the goal); with the head against without it, run seed by run seed, in latency-critical
   violations.

Runs already written to ``out`` with the same inputs are reused (``align-key.json``), so an
interrupted command continues where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.protocol import test_seeds, train_seeds
from cloudrl.scenarios.runner import ControllerSpec, paired_ci
from cloudrl.scenarios.safety_head import SafetyHead, learn_head
from cloudrl.scenarios.steering import (
    DEFAULT_TUNED,
    FEATURES,
    SAFE_BOUNDS,
    EpisodeCache,
    RewardModel,
    SteerConfig,
    features,
    learn_reward,
    learned_spec,
    pool_specs,
    safe_cost,
    sample_comparisons,
)
from envs.scenario.config import ScenarioConfig

TEACHER = "safe_cost"


@dataclass
class LabelConfig:
    """The labelling knobs ``align`` and ``align-reserve`` share: the scenario, the pool,
    the comparisons and their noise, the teacher's bounds, the run seeds."""

    scenario: str = "scarcity_spikes"
    n_comparisons: int = 1000
    noise: float = 0.1
    run_seeds: tuple[int, ...] = (0, 1, 2)
    n_test_seeds: int = 50
    head_weight: float = 1.0
    # the teacher's per-class bounds (violation rates; None: safe_cost's 0.03% and 0.3%)
    lc_bound: float | None = None
    batch_bound: float | None = None
    pool_heuristic: int = 30
    pool_mpc: int = 10
    pool_seeds: int = 2
    pool_seed: int = 0
    heuristic_params: dict[str, Any] | None = None  # None: the scenario's tuned point
    cache: str | None = "results/steer/episodes.json"
    workers: int | None = None


@dataclass
class AlignConfig(LabelConfig):
    """Knobs of ``cloudrl scenarios align`` (every default runs)."""

    bc_expert_seeds: int = 20
    bc_epochs: int = 60
    bc_dagger_rounds: int = 0  # DAgger rounds of BC, the heuristic labelling the clone's states
    es_iterations: int = 15
    val_seeds: int = 8  # validation seeds that pick each search's kept iteration
    out: str = "results/align"

    def __post_init__(self) -> None:
        check_label_knobs(self)
        for name in ("n_test_seeds", "bc_expert_seeds", "val_seeds", "pool_seeds"):
            v = getattr(self, name)
            if not 1 <= v <= 50:
                raise ValueError(f"{name} must be in [1, 50], got {v}")
        for name in ("bc_epochs", "es_iterations", "pool_heuristic", "pool_mpc"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.bc_dagger_rounds <= 5:
            raise ValueError(f"--bc-dagger-rounds must be in [0, 5], "
                             f"got {self.bc_dagger_rounds}")
        if self.bc_expert_seeds + 4 * self.bc_dagger_rounds > 50:
            raise ValueError(f"--bc-expert-seeds {self.bc_expert_seeds} and "
                             f"--bc-dagger-rounds {self.bc_dagger_rounds} need "
                             f"{self.bc_expert_seeds + 4 * self.bc_dagger_rounds} train seeds; "
                             f"50 exist")
        if not self.head_weight >= 0:
            raise ValueError(f"--head-weight must be >= 0, got {self.head_weight}")


def check_label_knobs(cfg: LabelConfig) -> None:
    """The knobs of the labelling phases that ``align`` and ``align-reserve`` share
    (comparisons, noise, the teacher's bounds, run seeds, workers); a ValueError names one."""
    if not 2 <= cfg.n_comparisons <= 1000:
        raise ValueError(f"--comparisons must be in [2, 1000], got {cfg.n_comparisons}")
    if not 0.0 <= cfg.noise <= 0.5:
        raise ValueError(f"--noise must be in [0, 0.5], got {cfg.noise}")
    for name in ("lc_bound", "batch_bound"):
        v = getattr(cfg, name)
        if v is not None and not 0.0 <= v <= 1.0:
            raise ValueError(f"--{name.replace('_', '-')} is a violation rate in [0, 1], "
                             f"got {v}")
    if not cfg.run_seeds:
        raise ValueError("at least one run seed")
    if cfg.workers is not None and cfg.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {cfg.workers}")


def teacher(cfg: AlignConfig) -> Callable[[dict[str, float]], float]:
    """The scripted teacher's utility: ``safe_cost`` at ``cfg``'s bounds."""
    bounds = {k: v for k, v in (("sla_lc", cfg.lc_bound), ("sla_batch", cfg.batch_bound))
              if v is not None}
    if not bounds:
        return safe_cost

    def utility(m: dict[str, float]) -> float:
        return safe_cost(m, bounds)
    return utility


def teacher_params(scn: ScenarioConfig, cfg: AlignConfig) -> dict[str, Any]:
    """The heuristic BC clones: ``cfg.heuristic_params``, else the point the headline tuned
    (``checkpoints/<scenario>/references.json``), else the cost-tuned point steering knows,
    else the rule's defaults."""
    if cfg.heuristic_params is not None:
        return dict(cfg.heuristic_params)
    ref = Path("checkpoints") / scn.name / "references.json"
    if ref.exists():
        return dict(json.loads(ref.read_text()).get("signal_aware", {}))
    return dict(DEFAULT_TUNED.get(scn.name, {}).get("signal_aware", {}))


def _key(**parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _reusable(out: Path, key: str) -> bool:
    f = out / "align-key.json"
    return (out / "policy.pt").exists() and f.exists() and \
        json.loads(f.read_text()).get("key") == key


def _mark(out: Path, key: str) -> None:
    (out / "align-key.json").write_text(json.dumps({"key": key}))


def learn_preferences(scn: ScenarioConfig, cfg: LabelConfig,
                      utility: Callable[[dict[str, float]], float], log: Callable[[str], None]
                      ) -> tuple[dict[int, RewardModel], dict[int, SafetyHead], list[dict]]:
    """Phase 2 of ``align`` (and of ``align-reserve``): the steering pool on TRAIN seeds
    (cached in ``cfg.cache``), then per run seed ``cfg.n_comparisons`` comparisons labelled
    by ``utility`` with ``cfg.noise`` flipped, the reward model and the alignment head."""
    cache = EpisodeCache(cfg.cache)
    sc = SteerConfig(scenario=scn.name, utility=TEACHER, pool_heuristic=cfg.pool_heuristic,
                     pool_mpc=cfg.pool_mpc, pool_seeds=cfg.pool_seeds, pool_seed=cfg.pool_seed)
    pool = [m for r in cache.play(scn, pool_specs(sc), list(train_seeds(cfg.pool_seeds)),
                                  cfg.workers) for m in r]
    feats = features(pool)
    u_pool = np.array([utility(m) for m in pool])
    log(f"pool: {len(pool)} episodes, teacher's utility {u_pool.min():.1f}..{u_pool.max():.1f} $")
    models, heads, infos = {}, {}, []
    for rs in cfg.run_seeds:
        comp = sample_comparisons(u_pool, cfg.n_comparisons, cfg.noise,
                                  np.random.default_rng([rs, 0xA119]))
        models[rs], info = learn_reward(feats, comp, seed=rs)
        heads[rs], hinfo = learn_head(feats, FEATURES, comp.a, comp.b, comp.label,
                                      comp.true_label, seed=rs)
        infos.append({"run_seed": rs, "flipped": float(comp.flipped.mean()),
                      "reward_model": info, "head": hinfo})
        log(f"run seed {rs}: {cfg.n_comparisons} comparisons ({comp.flipped.mean():.1%} flipped);"
            f" held-out pair accuracy (noisy / true labels): reward model "
            f"{info['heldout_acc_noisy']:.3f} / {info['heldout_acc_true']:.3f}, head "
            f"{hinfo['heldout_acc_noisy']:.3f} / {hinfo['heldout_acc_true']:.3f}")
    return models, heads, infos


def behaviour_clone(scn: ScenarioConfig, cfg: AlignConfig, params: dict[str, Any], out: Path,
                    log: Callable[[str], None]) -> Path:
    """Phase 1: the heuristic at ``params`` cloned into the scenario policy; with
    ``cfg.bc_dagger_rounds`` > 0, DAgger rounds in which the heuristic labels the states the
    clone itself reaches (the round kept by validation cost, the distillation's rule)."""
    from cloudrl.algorithms.distill.command import train_to_dir
    from cloudrl.algorithms.distill.config import DistillConfig

    dc = DistillConfig(run_seed=0, heuristic_params=params,
                       dagger_rounds=cfg.bc_dagger_rounds,
                       n_expert_seeds=cfg.bc_expert_seeds, bc_epochs=cfg.bc_epochs)
    key = _key(scenario=scn.model_dump(mode="json"), distill=dc.to_dict())
    if _reusable(out, key):
        log(f"BC: reusing {out} (same scenario and config)")
        return out
    train_to_dir(scn, dc, out, out.parent / "expert-bc.npz",
                 command="cloudrl scenarios align (BC from the heuristic)", log=log)
    _mark(out, key)
    return out


@dataclass
class AlignResult:
    config: dict[str, Any]
    policies: dict[str, dict[str, Any]]
    comparisons: list[dict[str, Any]]
    reward_models: list[dict[str, Any]]
    wall_s: float
    table: str = ""
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    median_run: str = ""  # the learned-reward run with the median test utility

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def align(scn: ScenarioConfig, cfg: AlignConfig, log: Callable[[str], None] = print
          ) -> AlignResult:
    from cloudrl.algorithms.es.command import train_to_dir, weights_digest
    from cloudrl.algorithms.es.config import ESConfig

    t0 = time.perf_counter()
    root = Path(cfg.out) / scn.name
    root.mkdir(parents=True, exist_ok=True)
    params = teacher_params(scn, cfg)
    utility = teacher(cfg)

    # 1. BC from the heuristic
    start = behaviour_clone(scn, cfg, params, root / "bc", log)
    log(f"BC from the heuristic -> {start} ({time.perf_counter() - t0:.0f} s)")

    # 2. pool, comparisons, reward model and head per run seed
    models, heads, infos = learn_preferences(scn, cfg, utility, log)

    # 3. policy optimisation: ES on the learned reward, with and without the head, and on
    #    the teacher's utility itself
    def objective(rs: int, weight: float) -> Callable[[dict[str, float]], float]:
        model, head = models[rs], heads[rs]

        def f(m: dict[str, float]) -> float:
            x = features([m])
            return -float(model.score(x)[0] + weight * head.score(x)[0])
        return f

    rs0 = cfg.run_seeds[0]
    jobs = [(f"learned{rs}", rs, objective(rs, 0.0), "the learned reward")
            for rs in cfg.run_seeds]
    jobs += [(f"head{rs}", rs, objective(rs, cfg.head_weight),
              f"the learned reward + {cfg.head_weight:g} x the alignment head")
             for rs in cfg.run_seeds]
    jobs.append((f"true{rs0}", rs0, utility, "the teacher's utility"))
    digest = weights_digest(start)
    runs: dict[str, dict[str, Any]] = {}
    for name, rs, obj, what in jobs:
        # a head search per weight: another weight is another policy, kept beside it
        w = "" if not name.startswith("head") or cfg.head_weight == 1 else \
            f"-w{cfg.head_weight:g}"
        out = root / f"es-{name}{w}"
        ec = ESConfig(run_seed=rs, iterations=cfg.es_iterations, n_val_seeds=cfg.val_seeds,
                      workers=cfg.workers)
        labels = [cfg.n_comparisons, cfg.noise, cfg.pool_heuristic, cfg.pool_mpc,
                  cfg.pool_seeds, cfg.pool_seed]
        if utility is not safe_cost:  # the teacher's own bounds (the default adds nothing)
            labels.append([cfg.lc_bound, cfg.batch_bound])
        key = _key(scenario=scn.model_dump(mode="json"), es=ec.to_dict(), start=digest,
                   what=what, labels=labels)
        if _reusable(out, key):
            man = json.loads((out / "manifest.json").read_text())
            runs[name] = {"checkpoint": str(out), "objective": what, "reused": True,
                          "kept_iteration": man["kept_iteration"], "history": man["history"]}
            log(f"ES on {what} (run seed {rs}): reusing {out}")
            continue
        lines: list[str] = []
        res = train_to_dir(scn, start, ec, out, objective=obj, log=lines.append,
                           command=f"cloudrl scenarios align ({name}: evolution strategies "
                                   f"on {what})")
        _mark(out, key)
        runs[name] = {"checkpoint": str(out), "objective": what, "reused": False,
                      "kept_iteration": res.kept_iteration, "history": res.history}
        log(f"ES on {what} (run seed {rs}) -> {out}: kept iteration {res.kept_iteration} "
            f"(validation: " + ", ".join(f"{h['iteration']}: {h['val']:.2f}"
                                         for h in res.history if "val" in h) +
            f"; {time.perf_counter() - t0:.0f} s)")

    # 4. test seeds, paired
    specs = {"heuristic": ControllerSpec("signal_aware", params),
             "bc": learned_spec(start)}
    specs.update({name: learned_spec(Path(r["checkpoint"])) for name, r in runs.items()})
    tseeds = list(test_seeds(cfg.n_test_seeds))
    cache = EpisodeCache(cfg.cache)
    played = dict(zip(specs, cache.play(scn, list(specs.values()), tseeds, cfg.workers),
                      strict=True))
    res = AlignResult(asdict(cfg), {}, [], infos, 0.0, runs=runs)
    for name, eps in played.items():
        res.policies[name] = {
            "utility": float(np.mean([utility(m) for m in eps])),
            **{k: float(np.mean([m[k] for m in eps]))
               for k in ("cost_usd", "sla_lc", "sla_batch", "violations_lc",
                         "violations_batch")}}
    learned = sorted((f"learned{rs}" for rs in cfg.run_seeds),
                     key=lambda n: res.policies[n]["utility"])
    res.median_run = learned[len(learned) // 2]

    def compare(a: str, b: str, metric: str) -> dict[str, Any]:
        f = utility if metric == "utility" else (lambda m: m[metric])
        d, lo, hi = paired_ci(np.array([f(m) for m in played[a]]),
                              np.array([f(m) for m in played[b]]))
        return {"a": a, "b": b, "metric": metric, "diff": d, "ci95": [lo, hi]}

    comps = [compare(f"learned{rs}", f"true{rs0}", "utility") for rs in cfg.run_seeds]
    comps += [compare(f"learned{rs}", "bc", "utility") for rs in cfg.run_seeds]
    comps += [compare(f"true{rs0}", "bc", "utility"), compare("bc", "heuristic", "utility")]
    # the family against the rule it started from: does the search pass its teacher?
    comps += [compare(f"learned{rs}", "heuristic", m) for rs in cfg.run_seeds
              for m in ("utility", "cost_usd")]
    comps.append(compare(f"true{rs0}", "heuristic", "utility"))
    for rs in cfg.run_seeds:
        comps += [compare(f"head{rs}", f"learned{rs}", m)
                  for m in ("violations_lc", "sla_lc", "utility", "cost_usd")]
    res.comparisons = comps
    res.wall_s = time.perf_counter() - t0
    res.table = format_table(res)
    return res


def format_table(res: AlignResult) -> str:
    c = res.config
    bounds = "" if c.get("lc_bound") is None and c.get("batch_bound") is None else (
        f" with bounds LC {100 * (c['lc_bound'] or SAFE_BOUNDS['sla_lc']):g}%, batch "
        f"{100 * (c['batch_bound'] or SAFE_BOUNDS['sla_batch']):g}%")
    lines = [f"{c['scenario']}, teacher {TEACHER}{bounds} ($/episode, lower is better), "
             f"{c['n_test_seeds']} test seeds; {c['n_comparisons']} comparisons per run seed, "
             f"{c['noise']:.0%} flipped",
             f"{'policy':14s} {'U':>8s} {'cost':>8s} {'LC viol.':>9s} {'LC %':>8s} "
             f"{'batch %':>8s}"]
    for name, p in res.policies.items():
        lines.append(f"{name:14s} {p['utility']:8.2f} {p['cost_usd']:8.2f} "
                     f"{p['violations_lc']:9.2f} {100 * p['sla_lc']:8.4f} "
                     f"{100 * p['sla_batch']:8.4f}")
    lines.append(f"median learned-reward run: {res.median_run}")
    lines.append("paired differences (a - b) [95% CI]:")
    for r in res.comparisons:
        lo, hi = r["ci95"]
        lines.append(f"  {r['a']:>10s} - {r['b']:<10s} {r['metric']:>14s} {r['diff']:+9.4f} "
                     f"[{lo:+9.4f}, {hi:+9.4f}]")
    lines.append("reward model / head held-out pair accuracy (noisy / true labels): " + ", ".join(
        f"run {i['run_seed']}: {i['reward_model']['heldout_acc_noisy']:.3f} / "
        f"{i['reward_model']['heldout_acc_true']:.3f}, head {i['head']['heldout_acc_noisy']:.3f}"
        f" / {i['head']['heldout_acc_true']:.3f}" for i in res.reward_models))
    lines.append(f"wall time {res.wall_s:.0f} s")
    return "\n".join(lines)
