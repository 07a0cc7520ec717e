"""The alignment head on a lever that reaches latency-critical violations
(``cloudrl scenarios align-reserve``).

On ``scarcity_spikes`` the dropped latency-critical (LC) jobs are large ones that no
server has room for; the scenario's two controls (release, ready) and the executor's awake
spare do not reach them. The executor's reserve does (``executor.lc_reserve_cores``: batch
work leaves the last server of the largest tier with that many free cores to LC jobs). Here
the operator's labels pick it:

1. **Labels, reward model and head** per run seed, exactly as ``cloudrl scenarios align``
   makes them: at most 1,000 comparisons of pool episodes ranked by the scripted teacher
   (``safe_cost``), ``noise`` of them flipped; the Bradley-Terry reward model ``r`` and the
   alignment head ``h`` (:mod:`cloudrl.scenarios.safety_head`) on the same labels.
2. **The policy** (a checkpoint, e.g. the headline's, or the tuned heuristic) plays every
   reserve of ``grid`` on the validation seeds. *With the head*: the reserve whose episodes
   score best under ``r + head_weight * h``. *Without it*: the same policy on the default
   executor (reserve 0). The reserve ``r`` alone picks is reported beside it, so the head's
   own share is visible.
3. **Test** (test seeds, paired by seed, 95% t-intervals), run seed by run seed: LC
   violations per episode, cost and the teacher's utility, with the head against without.

Nothing here trains the policy: the head steers a lever the policy does not have.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.protocol import test_seeds, validation_seeds
from cloudrl.scenarios.align import (
    AlignConfig,
    LabelConfig,
    check_label_knobs,
    learn_preferences,
    teacher,
    teacher_params,
)
from cloudrl.scenarios.runner import ControllerSpec, checkpoint_kind, paired_ci, run_controllers
from cloudrl.scenarios.steering import features
from envs.scenario.config import ScenarioConfig

GRID = (0.0, 16.0, 24.0, 32.0, 40.0, 48.0)
METRICS = ("cost_usd", "violations_lc", "sla_lc", "sla_batch")


@dataclass
class ReserveHeadConfig(LabelConfig):
    """Knobs of ``cloudrl scenarios align-reserve`` (every default runs); the labelling
    knobs are ``align``'s."""

    checkpoint: str | None = None  # None: the tuned heuristic is the policy
    grid: tuple[float, ...] = GRID
    n_val_seeds: int = 30

    def __post_init__(self) -> None:
        self.grid = tuple(float(g) for g in self.grid)
        self.run_seeds = tuple(int(s) for s in self.run_seeds)
        check_label_knobs(self)
        for name in ("n_val_seeds", "n_test_seeds", "pool_seeds"):
            v = getattr(self, name)
            if not 1 <= v <= 50:
                raise ValueError(f"--{name.replace('_', '-')} must be in [1, 50], got {v}")
        if not self.grid or any(not np.isfinite(g) or g < 0 for g in self.grid):
            raise ValueError(f"--grid: reserves in cores, finite and >= 0, got "
                             f"{' '.join(f'{g:g}' for g in self.grid) or 'none'}")
        if 0.0 not in self.grid:
            self.grid = (0.0, *self.grid)  # the policy without the head is always a candidate
        if not (np.isfinite(self.head_weight) and self.head_weight >= 0):
            raise ValueError(f"--head-weight must be finite and >= 0, got {self.head_weight}")


def with_reserve(scn: ScenarioConfig, reserve: float) -> ScenarioConfig:
    """``scn`` with the executor's LC reserve at ``reserve`` cores; a ValueError names a
    reserve the fleet cannot hold."""
    from pydantic import ValidationError

    data = scn.model_dump(mode="json")
    data["executor"]["lc_reserve_cores"] = float(reserve)
    try:
        return ScenarioConfig.model_validate(data)
    except ValidationError as e:
        why = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
        raise ValueError(f"--grid {reserve:g}: {why}") from None


def policy_spec(scn: ScenarioConfig, cfg: ReserveHeadConfig) -> ControllerSpec:
    """The policy the head steers: the checkpoint, else the tuned heuristic."""
    if cfg.checkpoint is not None:
        kind = checkpoint_kind(cfg.checkpoint)  # a ValueError names a bad directory
        return ControllerSpec(kind, {"checkpoint": str(cfg.checkpoint)}, "policy")
    params = teacher_params(scn, AlignConfig(scenario=scn.name,
                                             heuristic_params=cfg.heuristic_params))
    return ControllerSpec("signal_aware", params, "policy")


def play_reserves(scn: ScenarioConfig, spec: ControllerSpec, reserves: list[float],
                  seeds: list[int], workers: int | None) -> dict[float, list[dict[str, float]]]:
    """The policy's episodes on ``seeds`` at each reserve."""
    return {r: run_controllers(with_reserve(scn, r), [spec], seeds, workers)[0]
            for r in reserves}


@dataclass
class ReserveHeadResult:
    config: dict[str, Any]
    policy: dict[str, Any]
    validation: dict[str, dict[str, float]]  # reserve -> mean metrics on validation seeds
    runs: list[dict[str, Any]] = field(default_factory=list)
    test: dict[str, dict[str, float]] = field(default_factory=dict)
    wall_s: float = 0.0
    table: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def align_reserve(scn: ScenarioConfig, cfg: ReserveHeadConfig,
                  log: Callable[[str], None] = print) -> ReserveHeadResult:
    t0 = time.perf_counter()
    for r in cfg.grid:  # a reserve the fleet cannot hold fails before any episode
        with_reserve(scn, r)
    spec = policy_spec(scn, cfg)
    utility = teacher(AlignConfig(scenario=scn.name, lc_bound=cfg.lc_bound,
                                  batch_bound=cfg.batch_bound))

    # 1. the pool, the labels, the reward model and the head per run seed (as ``align``)
    models, heads, infos = learn_preferences(scn, cfg, utility, log)

    # 2. every reserve on the validation seeds; each run seed's pick
    vseeds = list(validation_seeds(cfg.n_val_seeds))
    val = play_reserves(scn, spec, list(cfg.grid), vseeds, cfg.workers)
    log(f"{spec.name} ({spec.kind}) played {len(cfg.grid)} reserves on {len(vseeds)} "
        f"validation seeds ({time.perf_counter() - t0:.0f} s)")
    res = ReserveHeadResult(asdict(cfg), {"kind": spec.kind, "params": spec.params},
                            {f"{r:g}": _means(eps, utility) for r, eps in val.items()})
    for info in infos:
        rs, model, head = info["run_seed"], models[info["run_seed"]], heads[info["run_seed"]]
        score_r = {r: float(np.mean(model.score(features(eps)))) for r, eps in val.items()}
        score_h = {r: float(np.mean(head.score(features(eps)))) for r, eps in val.items()}
        with_head = max(cfg.grid, key=lambda r: (score_r[r] + cfg.head_weight * score_h[r], -r))
        model_only = max(cfg.grid, key=lambda r: (score_r[r], -r))
        res.runs.append({
            **info, "reserve_with_head": with_head, "reserve_reward_model_alone": model_only,
            "validation_scores": {f"{r:g}": {"reward_model": score_r[r], "head": score_h[r]}
                                  for r in cfg.grid}})
        log(f"run seed {rs}: reserve with the head {with_head:g} cores (the reward model "
            f"alone: {model_only:g})")

    # 3. test seeds: each chosen reserve and the policy without the head, paired
    tseeds = list(test_seeds(cfg.n_test_seeds))
    needed = sorted({0.0, *(r["reserve_with_head"] for r in res.runs),
                     *(r["reserve_reward_model_alone"] for r in res.runs)})
    test = play_reserves(scn, spec, needed, tseeds, cfg.workers)
    res.test = {f"{r:g}": _means(eps, utility) for r, eps in test.items()}
    for run in res.runs:
        for which in ("reserve_with_head", "reserve_reward_model_alone"):
            run[f"test_{which}"] = _paired(test[run[which]], test[0.0], utility)
        # the head's own share: its pick against the reward model's alone
        run["test_head_vs_reward_model_alone"] = _paired(
            test[run["reserve_with_head"]], test[run["reserve_reward_model_alone"]], utility)
    res.wall_s = time.perf_counter() - t0
    res.table = format_table(res)
    return res


def _means(eps: list[dict[str, float]], utility: Callable[[dict[str, float]], float]
           ) -> dict[str, float]:
    return {"utility": float(np.mean([utility(m) for m in eps])),
            **{k: float(np.mean([m[k] for m in eps])) for k in METRICS}}


def _paired(a: list[dict[str, float]], b: list[dict[str, float]],
            utility: Callable[[dict[str, float]], float]) -> dict[str, list[float]]:
    """``a - b`` per metric: [mean, lo, hi] (95% t-interval, paired by seed)."""
    out = {}
    for k in ("violations_lc", "sla_lc", "sla_batch", "cost_usd", "utility"):
        f = utility if k == "utility" else (lambda m, k=k: m[k])
        out[k] = list(paired_ci(np.array([f(m) for m in a]), np.array([f(m) for m in b])))
    return out


def format_table(res: ReserveHeadResult) -> str:
    c = res.config
    lines = [f"{c['scenario']}: the alignment head picks the executor's LC reserve for "
             f"{res.policy['kind']} ({c['checkpoint'] or 'the tuned heuristic'}); "
             f"{c['n_val_seeds']} validation seeds, {c['n_test_seeds']} test seeds",
             "validation (mean per episode):",
             f"  {'reserve':>8s} {'U $':>8s} {'cost $':>8s} {'LC viol.':>9s} {'LC %':>8s} "
             f"{'batch %':>8s}"]
    for r, m in res.validation.items():
        lines.append(f"  {r:>8s} {m['utility']:8.2f} {m['cost_usd']:8.2f} "
                     f"{m['violations_lc']:9.2f} {100 * m['sla_lc']:8.4f} "
                     f"{100 * m['sla_batch']:8.4f}")
    lines.append("test, with the head - without it (reserve 0), paired [95% CI]:")
    for run in res.runs:
        t = run["test_reserve_with_head"]

        def f(k: str, scale: float = 1.0, t: dict = t) -> str:
            d, lo, hi = (scale * x for x in t[k])
            return f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]"
        lines.append(f"  run {run['run_seed']}: reserve {run['reserve_with_head']:g} (reward "
                     f"model alone: {run['reserve_reward_model_alone']:g}); LC violations "
                     f"{f('violations_lc')}, cost $ {f('cost_usd')}, U $ {f('utility')}")
        own = run["test_head_vs_reward_model_alone"]["violations_lc"]
        lines.append(f"         the head's own share (its pick - the reward model's alone): "
                     f"LC violations {own[0]:+.2f} [{own[1]:+.2f}, {own[2]:+.2f}]")
    lines.append(f"wall time {res.wall_s:.0f} s")
    return "\n".join(lines)


def write_result(path: str | Path | None, res: ReserveHeadResult) -> None:
    from cloudrl.scenarios.steer_cli import write_json

    write_json(str(path) if path else None, json.loads(json.dumps(res.to_json(), default=float)))
