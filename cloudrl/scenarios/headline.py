"""``cloudrl headline --scenario NAME``: the learned policy against the best non-learned
schedulers on one scenario, end to end, in one command.

Steps (seeds never cross: tuning and selection on validation seeds, training on train
seeds, the claim on the held-out test seeds):

1. tune the signal-aware heuristic and the forecast MPC on validation seeds (or reuse the
   parameters of a headroom JSON with ``params_from``);
2. train every learned candidate family (``distill``: behaviour cloning + DAgger from the
   tuned MPC; ``distill_default``: the same from the MPC at its defaults;
   ``distill_fine``: ``distill_default`` on a release grid of its own in steps of 0.05;
   ``distill_fine_ready``: ``distill_default`` with ready margins of its own;
   ``<family>_es`` for each of these: that family's run, then fine-tuned on the true cost
   by evolution strategies (:mod:`cloudrl.algorithms.es`);
   the RLlib families ``bdq``, ``dqn``, ``ppo`` and ``gated_dqn``, the DQN that picks a
   preset of the tuned signal-aware rule every decision period; ``gated_dqn_margin``: its
   run leaving the rule only for a preset whose Q-value beats the rule's by a margin chosen
   on validation seeds; ``gated_dqn_margin_es``: that run's Q head then fine-tuned on the
   true cost by evolution strategies, :mod:`cloudrl.scenarios.gated_es`) once per run
   seed;
3. select the family by the median over its run seeds of the validation cost;
4. play the heuristic, the MPC, the oracle and every run of the selected family on the
   test seeds, paired by seed; report each run, and claim the **median run** (by its test
   cost difference to the heuristic);
5. write a Markdown table, a picture, the ``headline.json`` row and an MLflow run; with
   ``publish`` copy the median run's checkpoint to ``checkpoints/<scenario>/``.

The goals it checks and prints: learned below the heuristic (paired 95% CI of the
difference entirely below 0), SLA violation rate per class not higher (paired CI's lower
end at most 0), learned reaching the MPC (upper end of the paired CI of learned - MPC at
most 0.5% of the heuristic's cost) and deciding in at most 10 ms p50.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.protocol import test_seeds, train_seeds, validation_seeds
from cloudrl.scenarios.runner import ControllerSpec, paired_ci, run_controllers
from envs.scenario.catalog import load_scenario
from envs.scenario.config import ScenarioConfig

REACH_MPC_PCT = 0.5
DECIDE_BUDGET_MS = 10.0
FAMILIES = ("distill",)
SLA_KEYS = {"latency_critical": "sla_lc", "batch": "sla_batch"}


@dataclass(frozen=True)
class ScenarioHeadlineConfig:
    """Knobs of ``cloudrl headline --scenario``; every default runs (about 30-45 min on a
    2-core machine for a 50-server, two-day scenario)."""

    scenario: str = "scarcity_spikes"
    n_test_seeds: int = 50
    n_val_seeds: int = 10
    tune_samples: int = 12
    tune_seeds: int = 8
    mpc_samples: int = 3
    params_from: str | None = None  # a headroom JSON: reuse its tuned parameters
    families: tuple[str, ...] = FAMILIES
    run_seeds: tuple[int, ...] = (0, 1, 2)
    expert_seeds: int = 20
    rl_env_steps: int = 80_640  # per RLlib run (BDQ at this budget: ~10 min on 2 cores)
    safe_sla_weight: float = 3.0  # ``*_safe`` RLlib families: SLA penalties x this in training
    dagger_rounds: int = 2
    dagger_seeds: int = 4
    distill_val_seeds: int = 4  # validation seeds that pick a distillation run's DAgger round
    es_iterations: int = 20  # per ``*_es`` run (20 x 64 episodes: ~7 min on 2 cores at N=50)
    es_pairs: int = 8
    es_params: str = "head"  # what every ``*_es`` search moves: the output layer, or "all"
    out_dir: str = "results/headline_scenario"
    publish: str | None = None  # copy the claimed run's checkpoint here
    headline_json: str | None = None  # merge the row into this headline.json
    workers: int | None = None
    tracking_uri: str | None = None
    log: bool = True
    tiny: bool = False
    # merged into the scenario's definition (``scenarios evaluate --override``): a variant,
    # trained and measured as such; the distilled families only, and never published
    override: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("n_test_seeds", "n_val_seeds", "tune_samples", "tune_seeds",
                     "mpc_samples", "expert_seeds", "distill_val_seeds", "es_iterations",
                     "es_pairs"):
            if getattr(self, name) < 1:
                raise ValueError(f"headline: {name.replace('_', '-')} must be >= 1, "
                                 f"got {getattr(self, name)}")
        if not 1 <= self.n_test_seeds <= 50:
            raise ValueError(f"headline: n-test-seeds must be 1..50, got {self.n_test_seeds}")
        if not 1.0 <= self.safe_sla_weight <= 100.0:
            raise ValueError(f"headline: safe-sla-weight must be in [1, 100], "
                             f"got {self.safe_sla_weight}")
        if self.dagger_rounds < 0 or self.dagger_seeds < 0:
            raise ValueError("headline: dagger-rounds and dagger-seeds must be >= 0")
        used = self.expert_seeds + self.dagger_rounds * self.dagger_seeds
        if used > 50:
            raise ValueError(f"headline: expert-seeds + dagger-rounds x dagger-seeds = {used} "
                             f"train seeds, only 50 exist")
        if self.params_from and not self.tiny:
            read_params(self.params_from, self.scenario)  # a bad file fails before any work
        if not self.run_seeds:
            raise ValueError("headline: at least one run seed")
        if self.es_params not in ("head", "all"):
            raise ValueError(f"headline: --es-params must be head or all, got {self.es_params!r}")
        bad = [f for f in self.families if f not in available_families()]
        if bad:
            raise ValueError(f"headline: unknown family {bad[0]!r}; valid: "
                             f"{', '.join(available_families())}")
        if self.override:
            rl = [f for f in self.families if not f.startswith("distill")]
            if rl:
                raise ValueError(f"headline: --override trains the distilled families only "
                                 f"(an RLlib run reads the catalog scenario by name), got "
                                 f"{rl[0]!r}")
            if self.publish or self.headline_json:
                raise ValueError("headline: a variant (--override) is not the catalog "
                                 "scenario: no --publish or --headline-json")


def tiny(cfg: ScenarioHeadlineConfig) -> ScenarioHeadlineConfig:
    """Smoke size: the ``tiny`` scenario, 3 test seeds, 2 run seeds, light tuning."""
    return replace(cfg, scenario="tiny", n_test_seeds=3, n_val_seeds=2, tune_samples=2,
                   tune_seeds=2, mpc_samples=1, run_seeds=(0, 1), expert_seeds=3,
                   dagger_rounds=1, dagger_seeds=1, params_from=None, rl_env_steps=480,
                   es_iterations=1, es_pairs=1, tiny=True)


# --- candidate families -------------------------------------------------------------------

Trainer = Callable[[ScenarioConfig, "ScenarioHeadlineConfig", dict[str, Any], int, Path],
                   ControllerSpec]


def _train_distill_default(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig, mpc_params: dict,
                           run_seed: int, out: Path) -> ControllerSpec:
    """``distill`` with the MPC at its default knobs as the teacher: the tuned MPC is the
    better controller, not always the easier one to imitate (on ``scarcity_spikes`` its
    students landed further from it than the default MPC's did)."""
    spec = _train_distill(scn, cfg, {}, run_seed, out)
    return replace(spec, label=f"distill_default-run{run_seed}")


def _train_distill_fine(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig, mpc_params: dict,
                        run_seed: int, out: Path) -> ControllerSpec:
    """``distill_default`` on the policy's own release grid in steps of 0.05: the env's six
    levels cost the rounded MPC 5% on ``scarcity_low_load``, the fine grid under 1%."""
    from cloudrl.algorithms.distill.actions import FINE_RELEASE_LEVELS

    spec = _train_distill(scn, cfg, {}, run_seed, out, FINE_RELEASE_LEVELS)
    return replace(spec, label=f"distill_fine-run{run_seed}")


def _train_distill_fine_ready(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig,
                              mpc_params: dict, run_seed: int, out: Path) -> ControllerSpec:
    """``distill_default`` with ready margins of its own (9 instead of the env's 4)."""
    from cloudrl.algorithms.distill.actions import FINE_READY_MARGINS

    spec = _train_distill(scn, cfg, {}, run_seed, out, ready_margins=FINE_READY_MARGINS)
    return replace(spec, label=f"distill_fine_ready-run{run_seed}")


def _train_distill(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig, mpc_params: dict,
                   run_seed: int, out: Path,
                   release_levels: tuple[float, ...] | None = None,
                   ready_margins: tuple[float, ...] | None = None) -> ControllerSpec:
    from cloudrl.algorithms.distill.command import train_to_dir
    from cloudrl.algorithms.distill.config import DistillConfig

    dc = DistillConfig(run_seed=run_seed, mpc_params=mpc_params,
                       n_expert_seeds=cfg.expert_seeds, dagger_rounds=cfg.dagger_rounds,
                       dagger_seeds_per_round=cfg.dagger_seeds,
                       n_val_seeds=min(cfg.distill_val_seeds, cfg.n_val_seeds),
                       release_levels=release_levels, ready_margins=ready_margins)
    cmd = (f"cloudrl scenarios distill --scenario {scn.name} --run-seed {run_seed} "
           f"--out {out} --mpc-params '{json.dumps(mpc_params)}' --expert-seeds "
           f"{cfg.expert_seeds} --dagger-rounds {cfg.dagger_rounds} --dagger-seeds "
           f"{cfg.dagger_seeds} --val-seeds {dc.n_val_seeds}"
           + (" --fine-release" if release_levels is not None else "")
           + (" --fine-ready" if ready_margins is not None else ""))
    cache = out.parent / ("expert" + ("-fine" if release_levels is not None else "")
                          + ("-ready" if ready_margins is not None else "") + ".npz")
    if _trained(out, scn, dc.to_dict()):
        print(f"reusing {out}: trained earlier with the same scenario and config", flush=True)
    else:
        train_to_dir(scn, dc, out, cache, command=cmd)
    return ControllerSpec("learned", {"checkpoint": str(out)}, f"distill-run{run_seed}")


def _trained(out: Path, scn: ScenarioConfig, config: dict[str, Any],
             **recorded_as: str) -> bool:
    """Whether ``out`` holds a checkpoint of this scenario and config (training is
    deterministic given both, so a rerun into the same directory resumes); every
    ``recorded_as`` item must also be in its manifest as it is (e.g. the start's digest)."""
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if any(manifest.get(k) != v for k, v in recorded_as.items()):
        return False
    same = json.loads(json.dumps({"s": scn.model_dump(mode="json"), "c": config}))
    recorded = manifest.get("config") or {}
    # a field a manifest lacks was added to the config later, with the default None
    return ((out / "policy.json").is_file() and set(recorded) <= set(same["c"])
            and {k: recorded.get(k) for k in same["c"]} == same["c"]
            and manifest.get("scenario_config") == same["s"])


def _es_config(cfg: ScenarioHeadlineConfig, run_seed: int) -> Any:
    """The evolution-strategies search of every ``*_es`` family's run ``run_seed``."""
    from cloudrl.algorithms.es.config import ESConfig

    return ESConfig(run_seed=run_seed, iterations=cfg.es_iterations, pairs=cfg.es_pairs,
                    seeds_per_candidate=1 if cfg.tiny else 4,
                    eval_every=1 if cfg.tiny else 5, n_val_seeds=cfg.n_val_seeds,
                    params=cfg.es_params, workers=cfg.workers)


def _es_command(scn: ScenarioConfig, start: Path, out: Path, ec: Any) -> str:
    return (f"cloudrl scenarios es --scenario {scn.name} --init-checkpoint {start} "
            f"--out {out} --run-seed {ec.run_seed} --iterations {ec.iterations} --pairs "
            f"{ec.pairs} --seeds-per-candidate {ec.seeds_per_candidate} --eval-every "
            f"{ec.eval_every} --n-val-seeds {ec.n_val_seeds}"
            + ("" if ec.params == "head" else f" --params {ec.params}"))


def _train_es(base: str) -> Trainer:
    """Family ``base``'s run (trained, or reused from ``base``'s own directory), then
    fine-tuned on the true cost by evolution strategies; the start competes on validation
    seeds, so the family is never worse there than ``base``."""

    def train_one(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig, mpc_params: dict,
                  run_seed: int, out: Path) -> ControllerSpec:
        from cloudrl.algorithms.es.command import train_to_dir, weights_digest

        start = out.parent.parent / base / f"run{run_seed}"
        available_families()[base](scn, cfg, mpc_params, run_seed, start)
        ec = _es_config(cfg, run_seed)
        if _trained(out, scn, ec.to_dict(), init_digest=weights_digest(start)):
            print(f"reusing {out}: trained earlier with the same scenario and config",
                  flush=True)
        else:
            train_to_dir(scn, start, ec, out, command=_es_command(scn, start, out, ec))
        return ControllerSpec("learned", {"checkpoint": str(out)}, f"{base}_es-run{run_seed}")

    return train_one


def _train_gated_es(heuristic_params: dict[str, Any] | None = None) -> Trainer:
    """``gated_dqn_margin``'s run (trained, or reused from its own directory) with its
    margin, then its Q head fine-tuned on the true cost by evolution strategies
    (:mod:`cloudrl.scenarios.gated_es`); the start competes on validation seeds."""

    def train_one(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig, mpc_params: dict,
                  run_seed: int, out: Path) -> ControllerSpec:
        from cloudrl.scenarios import gated_es

        start = out.parent.parent / "gated_dqn_margin" / f"run{run_seed}"
        _train_gated_margin(heuristic_params)(scn, cfg, mpc_params, run_seed, start)
        ec = _es_config(cfg, run_seed)
        if gated_es.trained(out, scn, ec, start):
            print(f"reusing {out}: trained earlier with the same scenario, config and start",
                  flush=True)
        else:
            gated_es.train_to_dir(scn, start, ec, out,
                                  command=_es_command(scn, start, out, ec))
        return ControllerSpec("rllib", {"checkpoint": str(out.resolve())},
                              f"gated_dqn_margin_es-run{run_seed}")

    return train_one


def _train_rllib(algo: str, heuristic_params: dict[str, Any] | None = None,
                 safe: bool = False) -> Trainer:
    """An RLlib family (``cloudrl train --scenario NAME --algo ALGO``) as a trainer; the
    gated DQN picks presets of the signal-aware rule at ``heuristic_params`` (the tuned
    point). ``safe``: trained with the SLA penalties times ``cfg.safe_sla_weight`` in its
    reward (``--sla-weight``), so that a cheaper policy does not buy its saving with
    violations."""
    family = f"{algo}_safe" if safe else algo

    def train_one(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig, mpc_params: dict,
                  run_seed: int, out: Path) -> ControllerSpec:
        from cloudrl.ray_utils import init_ray
        from cloudrl.training import TrainConfig, train

        tc = TrainConfig(algo=algo, scenario=scn.name, run_seed=run_seed,
                         env_steps=cfg.rl_env_steps, checkpoint_dir=str(out.resolve()),
                         scenario_heuristic=dict(heuristic_params or {}),
                         scenario_sla_weight=cfg.safe_sla_weight if safe else 1.0)
        if _rllib_trained(out, tc):
            print(f"reusing {out}: trained earlier with the same scenario and config",
                  flush=True)
            return ControllerSpec("rllib", {"checkpoint": str(out.resolve())},
                                  f"{family}-run{run_seed}")
        init_ray()
        path, history = train(tc)
        write_rllib_manifest(path, tc, scn, history[-1]["wall_s"])
        print(f"{family} run {run_seed}: {history[-1]['env_steps']:.0f} env steps "
              f"({history[-1]['wall_s']:.0f} s), {path}", flush=True)
        return ControllerSpec("rllib", {"checkpoint": str(path)}, f"{family}-run{run_seed}")

    return train_one


def _train_gated_margin(heuristic_params: dict[str, Any] | None = None) -> Trainer:
    """``gated_dqn``'s run (trained, or reused from ``gated_dqn``'s own directory), then
    its margin over the rule chosen on the validation seeds
    (:mod:`cloudrl.scenarios.gate_margin`); the checkpoint is copied with that margin."""

    def train_one(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig, mpc_params: dict,
                  run_seed: int, out: Path) -> ControllerSpec:
        from cloudrl.scenarios.gate_margin import (
            MARGINS,
            choose_margin,
            chosen_earlier,
            format_choice,
            selection_key,
            write_with_margin,
        )

        rule = dict(heuristic_params or {})
        base = out.parent.parent / "gated_dqn" / f"run{run_seed}"
        src = Path(_train_rllib("gated_dqn", rule)(scn, cfg, mpc_params, run_seed,
                                                   base).params["checkpoint"])
        seeds = list(validation_seeds(cfg.n_val_seeds))
        key = selection_key(json.loads((src / "cloudrl.json").read_text()), rule, seeds,
                            MARGINS)
        choice = chosen_earlier(out, key)
        if choice is not None:
            print(f"reusing {out}: its margin was chosen earlier on the same run and seeds",
                  flush=True)
        else:
            choice = choose_margin(scn, src, rule, seeds, workers=cfg.workers)
            write_with_margin(src, out, choice)
        print(f"gated_dqn_margin run {run_seed}: " + format_choice(choice), flush=True)
        return ControllerSpec("rllib", {"checkpoint": str(out.resolve())},
                              f"gated_dqn_margin-run{run_seed}")

    return train_one


def rllib_command(tc: Any) -> str:
    """The ``cloudrl train`` line that trains ``tc`` (a scenario TrainConfig)."""
    out = Path(tc.checkpoint_dir or ".")
    if out.is_absolute() and out.is_relative_to(Path.cwd()):
        out = out.relative_to(Path.cwd())
    cmd = (f"cloudrl train --scenario {tc.scenario} --algo {tc.algo} --run-seed {tc.run_seed} "
           f"--timesteps {tc.env_steps} --out {out}")
    if tc.scenario_heuristic:
        cmd += f" --heuristic-params '{json.dumps(tc.scenario_heuristic)}'"
    if tc.scenario_sla_weight != 1.0:
        cmd += f" --sla-weight {tc.scenario_sla_weight:g}"
    return cmd


def write_rllib_manifest(out: Path, tc: Any, scn: ScenarioConfig, wall_s: float) -> None:
    """``manifest.json`` beside an RLlib scenario checkpoint, as the distilled ones have:
    the command, the commit, the seeds, the wall time, the machine."""
    from cloudrl.algorithms.distill.command import machine, source_state

    manifest = {
        "command": rllib_command(tc), **source_state(),
        "scenario": scn.name, "scenario_config": scn.model_dump(mode="json"),
        "run_seed": tc.run_seed, "algo": tc.algo, "env_steps": tc.env_steps,
        "seeds": {"train": list(train_seeds(50)), "validation": [], "test": []},
        "env_config": tc.train_env_config(), "wall_s": float(wall_s), "machine": machine()}
    (Path(out) / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _rllib_trained(out: Path, tc: Any) -> bool:
    """Whether ``out`` holds an RLlib checkpoint that ``cloudrl train`` wrote for the same
    algorithm, env (scenario, interface, controller, seeds), budget, run seed and width."""
    try:
        meta = json.loads((out / "cloudrl.json").read_text())
    except (OSError, ValueError):
        return False
    want = json.loads(json.dumps({"algo": tc.algo, "env_steps": tc.env_steps,
                                  "run_seed": tc.run_seed, "hidden": tc.hidden,
                                  "env_config": tc.train_env_config()}))
    return (out / "rllib_checkpoint.json").is_file() and \
        all(meta.get(k) == v for k, v in want.items())


def available_families(heuristic_params: dict[str, Any] | None = None) -> dict[str, Trainer]:
    """``distill`` (imitation of the tuned MPC) and the RLlib families of ``cloudrl train
    --scenario`` (BDQ on the branching env, DQN and PPO on the flat one, the gated DQN over
    the signal-aware rule at ``heuristic_params``, the same trained with dearer SLA
    penalties, ``gated_dqn_safe``, and the gated DQN with a margin over the rule chosen on
    validation seeds, ``gated_dqn_margin``, and that run's Q head fine-tuned on the true
    cost, ``gated_dqn_margin_es``)."""
    distilled = {"distill": _train_distill, "distill_default": _train_distill_default,
                 "distill_fine": _train_distill_fine,
                 "distill_fine_ready": _train_distill_fine_ready}
    return {**distilled, **{f"{name}_es": _train_es(name) for name in distilled},
            "bdq": _train_rllib("bdq"), "dqn": _train_rllib("dqn"), "ppo": _train_rllib("ppo"),
            "gated_dqn": _train_rllib("gated_dqn", heuristic_params),
            "gated_dqn_safe": _train_rllib("gated_dqn", heuristic_params, safe=True),
            "gated_dqn_margin": _train_gated_margin(heuristic_params),
            "gated_dqn_margin_es": _train_gated_es(heuristic_params)}


# --- the pipeline ---------------------------------------------------------------------------

@dataclass
class HeadlineOutcome:
    row: dict[str, Any]
    table: str
    paths: list[str] = field(default_factory=list)
    run_id: str | None = None


def read_params(path: str, scenario: str) -> tuple[dict, dict]:
    """The tuned (heuristic, MPC) parameters of ``scenario`` in ``path``: a ``cloudrl
    scenarios headroom --json`` file or a published checkpoint's ``references.json``.
    Raises ValueError with one line naming the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--params-from {path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--params-from {path}: not JSON (line {e.lineno}: {e.msg})") from None
    if isinstance(data, dict) and isinstance(data.get("signal_aware"), dict) \
            and isinstance(data.get("mpc"), dict):
        return data["signal_aware"], data["mpc"]
    rows = data.get("scenarios") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"--params-from {path}: neither a headroom JSON (\"scenarios\") nor "
                         f"a checkpoint's references.json (\"signal_aware\", \"mpc\")")
    for r in rows:
        if isinstance(r, dict) and r.get("name") == scenario:
            if not isinstance(r.get("heuristic_params"), dict) or \
                    not isinstance(r.get("mpc_params"), dict):
                raise ValueError(f"--params-from {path}: scenario {scenario!r} lacks "
                                 f"heuristic_params / mpc_params")
            return r["heuristic_params"], r["mpc_params"]
    raise ValueError(f"--params-from {path}: no scenario {scenario!r} in it")


def _tuned_params(scn: ScenarioConfig, cfg: ScenarioHeadlineConfig) -> tuple[dict, dict, str]:
    if cfg.params_from:
        heur, mpc = read_params(cfg.params_from, scn.name)
        return heur, mpc, f"reused from {cfg.params_from}"
    from cloudrl.scenarios.tuning import tune

    heur = tune(scn, "signal_aware", cfg.tune_samples, cfg.tune_seeds, workers=cfg.workers)
    mpc = tune(scn, "mpc", cfg.mpc_samples, cfg.tune_seeds, workers=cfg.workers) \
        if cfg.mpc_samples > 1 else None
    return heur.params, (mpc.params if mpc else {}), (
        f"tuned on {cfg.tune_seeds} validation seeds ({cfg.tune_samples} heuristic points, "
        f"{cfg.mpc_samples} MPC points)")


def _provenance(cfg: ScenarioHeadlineConfig, scenario: str, tuned_how: str) -> str:
    """Where the published parameters came from: the tuning of this run, or the ``source``
    of the ``--params-from`` file they were reused from (so a republished checkpoint keeps
    the tuning that found them)."""
    reused = f"reused by 'cloudrl headline --scenario {scenario} --params-from'"
    if cfg.params_from:
        try:
            source = json.loads(Path(cfg.params_from).read_text()).get("source")
        except (OSError, ValueError, AttributeError):
            source = None
        if isinstance(source, str) and source:
            return source if source.endswith(reused) else f"{source}; {reused}"
    return f"tuned by 'cloudrl headline --scenario {scenario}' ({tuned_how})"


def _costs(res: list[dict[str, float]], key: str = "cost_usd") -> np.ndarray:
    return np.array([m[key] for m in res], float)


def _pct(x: float, base: float) -> float:
    return 100.0 * x / base


def summarise_run(name: str, learned: list[dict], heur: list[dict], mpc: list[dict],
                  oracle: list[dict]) -> dict[str, Any]:
    """Paired statistics of one learned run against the references (same seeds)."""
    h, m, o, ell = _costs(heur), _costs(mpc), _costs(oracle), _costs(learned)
    base = float(h.mean())
    d_h, lo_h, hi_h = paired_ci(ell, h)
    d_m, lo_m, hi_m = paired_ci(ell, m)
    sla = {}
    for cls, key in SLA_KEYS.items():
        d, lo, hi = paired_ci(_costs(learned, key), _costs(heur, key))
        sla[cls] = {"diff": d, "ci95": [lo, hi]}
    gap = base - float(o.mean())
    p50 = float(np.median([r.get("decide_p50_ms", np.nan) for r in learned]))
    return {"policy": name, "learned_cost": float(ell.mean()),
            "diff_vs_heuristic_pct": _pct(d_h, base),
            "diff_vs_heuristic_ci95": [_pct(lo_h, base), _pct(hi_h, base)],
            "diff_vs_mpc_pct": _pct(d_m, base),
            "diff_vs_mpc_ci95": [_pct(lo_m, base), _pct(hi_m, base)],
            "gap_closed_pct": 100.0 * (base - float(ell.mean())) / gap if gap > 0 else None,
            "sla_diff_vs_heuristic": sla, "decide_p50_ms": p50,
            "decide_p99_ms": float(np.median([r.get("decide_p99_ms", np.nan)
                                              for r in learned]))}


def goals(run: dict[str, Any]) -> dict[str, bool]:
    """Which of the issue's goals the (claimed) run meets."""
    return {"beats_heuristic": run["diff_vs_heuristic_ci95"][1] < 0,
            "sla_not_higher": all(v["ci95"][0] <= 0 for v in run["sla_diff_vs_heuristic"]
                                  .values()),
            "reaches_mpc": run["diff_vs_mpc_ci95"][1] <= REACH_MPC_PCT,
            "beats_mpc": run["diff_vs_mpc_ci95"][1] < 0,
            "decides_in_budget": run["decide_p50_ms"] <= DECIDE_BUDGET_MS}


def run_scenario_headline(cfg: ScenarioHeadlineConfig) -> HeadlineOutcome:
    t0 = time.perf_counter()
    scn = load_scenario(cfg.scenario, cfg.override)
    out = Path(cfg.out_dir) / scn.name
    out.mkdir(parents=True, exist_ok=True)
    say = _say(cfg)
    heur_p, mpc_p, tuned_how = _tuned_params(scn, cfg)
    say(f"[1/4] heuristic and MPC {tuned_how} ({time.perf_counter() - t0:.0f} s)")

    trainers = available_families(heur_p)
    candidates: dict[str, list[ControllerSpec]] = {}
    train_wall: dict[str, float] = {}
    from cloudrl.progress import progress_bar

    bar = progress_bar(len(cfg.families) * len(cfg.run_seeds), "training runs", unit="run")
    for fam in cfg.families:
        t1 = time.perf_counter()
        candidates[fam] = []
        for s in cfg.run_seeds:
            candidates[fam].append(trainers[fam](scn, cfg, mpc_p, s, out / fam / f"run{s}"))
            bar.update(1)
        train_wall[fam] = time.perf_counter() - t1
        say(f"[2/4] trained {fam} x {len(cfg.run_seeds)} run seeds "
            f"({train_wall[fam]:.0f} s)")
    bar.close()

    heur = ControllerSpec("signal_aware", heur_p, "heuristic")
    val_specs = [heur] + [s for fam in cfg.families for s in candidates[fam]]
    val = run_controllers(scn, val_specs, list(validation_seeds(cfg.n_val_seeds)), cfg.workers,
                          desc="validation episodes")
    val_cost = {s.name: float(_costs(r).mean()) for s, r in zip(val_specs, val, strict=True)}
    fam_score = {fam: float(np.median([val_cost[s.name] for s in candidates[fam]]))
                 for fam in cfg.families}
    chosen = min(fam_score, key=fam_score.get)
    say(f"[3/4] selected {chosen} on {cfg.n_val_seeds} validation seeds (median run "
        f"${fam_score[chosen]:.2f} against the heuristic's ${val_cost['heuristic']:.2f})")

    runs = candidates[chosen]
    refs = [heur, ControllerSpec("mpc", mpc_p, "mpc"), ControllerSpec("oracle", {}, "oracle")]
    seeds = list(test_seeds(cfg.n_test_seeds))
    res = run_controllers(scn, refs + runs, seeds, cfg.workers, desc="test episodes")
    by = {s.name: r for s, r in zip(refs + runs, res, strict=True)}
    per_run = [summarise_run(s.name, by[s.name], by["heuristic"], by["mpc"], by["oracle"])
               for s in runs]
    order = np.argsort([r["diff_vs_heuristic_pct"] for r in per_run])
    claim = per_run[int(order[len(order) // 2])]
    claim_spec = runs[int(order[len(order) // 2])]
    say(f"[4/4] {len(seeds)} test seeds played ({time.perf_counter() - t0:.0f} s in all)")

    checkpoint = claim_spec.params["checkpoint"]  # a distilled or an RLlib checkpoint
    if cfg.publish:
        dest = Path(cfg.publish)
        source = _provenance(cfg, scn.name, tuned_how)  # before --params-from may go
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(checkpoint, dest, ignore=shutil.ignore_patterns("*.npz"))
        (dest / "references.json").write_text(json.dumps({
            "source": source, "signal_aware": heur_p, "mpc": mpc_p}, indent=2) + "\n")
        checkpoint = str(dest)
    mean = {s.name: {k: float(np.mean([m[k] for m in by[s.name]]))
                     for k in ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "energy_kwh",
                               "carbon_kg", "sla_lc", "sla_batch")}
            for s in refs + runs}
    solve = float(np.mean([m.get("solve_s", 0.0) for m in by["mpc"]]))
    row = {
        "scenario": scn.name, "policy": claim["policy"], "family": chosen,
        "checkpoint": checkpoint, "n_test_seeds": len(seeds),
        "heuristic_cost": mean["heuristic"]["cost_usd"], "mpc_cost": mean["mpc"]["cost_usd"],
        "oracle_cost": mean["oracle"]["cost_usd"], "learned_cost": claim["learned_cost"],
        "diff_vs_heuristic_ci95": claim["diff_vs_heuristic_ci95"],
        "diff_vs_mpc_ci95": claim["diff_vs_mpc_ci95"],
        "gap_closed_pct": claim["gap_closed_pct"], "decide_p50_ms": claim["decide_p50_ms"],
        "decide_where": "in-process, batch 1, one torch thread (the service's own figure: "
                        "docs/tasks/serving-scenarios.md)",
        "mpc_solve_s": solve,
        "sla_by_class": {who: {cls: mean[who][key] for cls, key in SLA_KEYS.items()}
                         for who in ("heuristic", "mpc", claim["policy"])},
        "goals": goals(claim), "runs": per_run, "validation": {
            "seeds": cfg.n_val_seeds, "family_median_cost": fam_score,
            "heuristic_cost": val_cost["heuristic"]},
        "heuristic_params": heur_p, "mpc_params": mpc_p, "means": mean,
        "train_wall_s": train_wall, "wall_s": time.perf_counter() - t0,
        "command": " ".join(["cloudrl", *sys.argv[1:]]) if sys.argv[1:] else "",
        "tiny": cfg.tiny, "override": cfg.override}
    row["sla_by_class"]["learned"] = row["sla_by_class"].pop(claim["policy"])
    table = format_table(row)
    paths = _write(out, row, table, cfg, by, refs + runs)
    run_id = _log(row, paths, cfg) if cfg.log else None
    return HeadlineOutcome(row, table, paths, run_id)


def _say(cfg: ScenarioHeadlineConfig) -> Callable[[str], None]:
    def say(msg: str) -> None:
        print(("[tiny smoke run] " if cfg.tiny else "") + msg, flush=True)
    return say


def format_table(row: dict[str, Any]) -> str:
    """Markdown: every run of the selected family against the heuristic and the MPC."""
    base = row["heuristic_cost"]
    lines = [f"{row['scenario']}: {row['n_test_seeds']} test seeds, paired by seed; "
             f"differences in % of the tuned heuristic's mean cost (${base:.2f})", "",
             "| policy | cost $ | vs heuristic % [95% CI] | vs MPC % [95% CI] | gap closed % "
             "| SLA latency-critical | SLA batch | decide p50 ms |",
             "|---|---|---|---|---|---|---|---|"]
    m = row["means"]
    for who in ("heuristic", "mpc", "oracle"):
        lines.append(f"| {who} | {m[who]['cost_usd']:.2f} | | | | "
                     f"{100 * m[who]['sla_lc']:.3f}% | {100 * m[who]['sla_batch']:.3f}% | "
                     + (f"solve {1000 * row['mpc_solve_s']:.1f} |" if who == "mpc" else "|"))
    for r in row["runs"]:
        star = " (claim: median run)" if r["policy"] == row["policy"] else ""
        lo, hi = r["diff_vs_heuristic_ci95"]
        mlo, mhi = r["diff_vs_mpc_ci95"]
        gc = "" if r["gap_closed_pct"] is None else f"{r['gap_closed_pct']:.0f}"
        lines.append(f"| {r['policy']}{star} | {r['learned_cost']:.2f} | "
                     f"{r['diff_vs_heuristic_pct']:+.1f} [{lo:+.1f}, {hi:+.1f}] | "
                     f"{r['diff_vs_mpc_pct']:+.1f} [{mlo:+.1f}, {mhi:+.1f}] | {gc} | "
                     f"{100 * m[r['policy']]['sla_lc']:.3f}% | "
                     f"{100 * m[r['policy']]['sla_batch']:.3f}% | {r['decide_p50_ms']:.2f} |")
    g = row["goals"]
    lines += ["", "goals (claimed run): " + ", ".join(
        f"{k.replace('_', ' ')}: {'yes' if v else 'no'}" for k, v in g.items())]
    return "\n".join(lines)


def _write(out: Path, row: dict, table: str, cfg: ScenarioHeadlineConfig,
           by: dict[str, list[dict]], specs: list[ControllerSpec]) -> list[str]:
    paths = []
    (out / "headline.md").write_text(table + "\n")
    (out / "result.json").write_text(json.dumps({**row, "config": asdict(cfg), "per_seed": {
        s.name: by[s.name] for s in specs}}, indent=2, default=str))
    paths += [str(out / "headline.md"), str(out / "result.json")]
    with contextlib.suppress(ImportError):  # matplotlib is optional
        paths.append(str(plot(row, by, out / "headline.png")))
    if cfg.headline_json and not cfg.tiny:
        paths.append(str(merge_headline_json(Path(cfg.headline_json), row)))
    return paths


def merge_headline_json(path: Path, row: dict[str, Any]) -> Path:
    """Insert or replace ``row`` (by scenario) in ``{"scenarios": [...]}`` at ``path``."""
    data = json.loads(path.read_text()) if path.exists() else {"scenarios": []}
    keep = [r for r in data.get("scenarios", []) if r.get("scenario") != row["scenario"]]
    slim = {k: v for k, v in row.items() if k not in ("means", "tiny")}
    data["scenarios"] = sorted(keep + [slim], key=lambda r: r["scenario"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def plot(row: dict, by: dict[str, list[dict]], path: Path) -> Path:
    """Cost per test seed relative to the heuristic: the MPC, the oracle and each run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = _costs(by["heuristic"])
    names = ["mpc", "oracle"] + [r["policy"] for r in row["runs"]]
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for i, n in enumerate(names):
        d = 100.0 * (_costs(by[n]) - h) / h.mean()
        mean, lo, hi = paired_ci(_costs(by[n]), h)
        ax.scatter(np.full(len(d), i) + np.linspace(-0.15, 0.15, len(d)), d, s=6, alpha=0.35)
        ax.errorbar(i, 100 * mean / h.mean(), yerr=[[100 * (mean - lo) / h.mean()],
                                                    [100 * (hi - mean) / h.mean()]],
                    fmt="o", color="black", capsize=4)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("cost - heuristic (% of heuristic)")
    ax.set_title(f"{row['scenario']}: {row['n_test_seeds']} test seeds, paired")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _log(row: dict, paths: list[str], cfg: ScenarioHeadlineConfig) -> str:
    from cloudrl import tracking

    client, run_id = tracking.open_run(cfg.tracking_uri, "cloudrl-headline",
                                       f"headline-{row['scenario']}",
                                       {"scenario": row["scenario"], "kind": "headline",
                                        "tiny": str(cfg.tiny)})
    with tracking.finishing(client, run_id):
        tracking.log_params(client, run_id, {"config": asdict(cfg),
                                             "heuristic": row["heuristic_params"],
                                             "mpc": row["mpc_params"]})
        metrics = {f"{who}.{k}": v for who, ms in row["means"].items() for k, v in ms.items()}
        for r in row["runs"]:
            metrics[f"{r['policy']}.diff_vs_heuristic_pct"] = r["diff_vs_heuristic_pct"]
            metrics[f"{r['policy']}.diff_vs_mpc_pct"] = r["diff_vs_mpc_pct"]
            metrics[f"{r['policy']}.decide_p50_ms"] = r["decide_p50_ms"]
        metrics["mpc_solve_s"] = row["mpc_solve_s"]
        metrics.update({f"goal.{k}": float(v) for k, v in row["goals"].items()})
        tracking.log_metrics(client, run_id, metrics)
        tracking.log_artifacts(client, run_id, paths)
    return run_id
