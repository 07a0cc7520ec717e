"""``cloudrl tune-heuristic``: tune ``power_aware``'s knobs with Ray Tune on the train seeds.

The objective is what the learned policies optimise: the mean episode reward on the
first ``n_seeds`` train seeds (energy, SLA violation rate and toggles are logged next
to it). One Tune trial = one ``PowerAwareConfig`` evaluated on those seeds in one
process; random search over :func:`search_space`, with the default parameters as the
first point, so the sweep's best is never worse than the default on the train seeds.
Every trial is a nested MLflow run under one parent run per sweep.

The best of many noisy trials is biased up (the winner's curse: measured on Poisson N=50,
the best of 40 trials beat the defaults by 3 reward on the train seeds and lost to them
by 13 ± 15 reward and 0.90 ± 0.36 kWh on 50 validation seeds). So the best point must
also beat the defaults on ``confirm_seeds`` validation seeds (same seeds for both, i.e.
the paired mean difference); if it does not, the defaults are kept (``source:
"default"`` in the JSON). The test seeds are never touched.

The result is a JSON file (:class:`TunedHeuristic`): the full parameter set, where it
was tuned and how it scored. ``cloudrl evaluate --heuristic-params FILE`` runs it as
its own row, ``power_aware_tuned``, next to the untuned ``power_aware``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cloudrl.config_loader import ConfigError
from cloudrl.heuristics.power_aware import PowerAwareConfig
from cloudrl.heuristics.tuned import TUNED_SUFFIX, power_aware_config, tuned_heuristic
from cloudrl.policy import Interface
from cloudrl.protocol import N_SEEDS, train_seeds, validation_seeds
from envs.env_config import EnvConfig

TUNED_FILE = "tuned_power_aware.json"
JOB_ORDERS = ("viable", "slack", "fifo", "size")
SCORE_KEYS = ("reward_mean", "reward_ci95", "energy_kwh_mean", "sla_violation_rate_mean",
              "toggles_mean")


class TunedHeuristic(BaseModel):
    """The JSON ``cloudrl tune-heuristic`` writes: best parameters and how they scored."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=True, ser_json_inf_nan="constants")

    heuristic: Literal["power_aware"] = "power_aware"
    params: dict[str, Any]
    interface: Interface = "branching"
    workload: str = "poisson"
    n_servers: int = 50
    episode_length: int = 1000
    n_seeds: int = N_SEEDS
    num_samples: int = 1
    objective: str = "mean episode reward on the train seeds"
    train: dict[str, float] = Field(default_factory=dict)
    default_train: dict[str, float] = Field(default_factory=dict)
    # "search": ``params`` is the sweep's best (confirmed on validation when checked);
    # "default": the defaults, kept because no trial beat them (on train, then validation);
    # validation / default_validation: the sweep's best and the defaults on the
    # confirmation seeds (empty when not checked), whichever was kept
    source: Literal["search", "default"] = "search"
    validation: dict[str, float] = Field(default_factory=dict)
    default_validation: dict[str, float] = Field(default_factory=dict)
    mlflow_run_id: str | None = None

    @field_validator("params")
    @classmethod
    def _full_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        return asdict(power_aware_config(params))

    @property
    def name(self) -> str:
        return self.heuristic + TUNED_SUFFIX

    def config(self) -> PowerAwareConfig:
        return PowerAwareConfig(**self.params)


def load_tuned(path: str | Path) -> TunedHeuristic:
    """A tuned-parameters file; a ConfigError names the file and the bad field."""
    p = Path(path)
    try:
        return TunedHeuristic.model_validate(json.loads(p.read_text()))
    except OSError as e:
        raise ConfigError(f"--heuristic-params {p}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--heuristic-params {p}: not valid JSON: {e}") from None
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"--heuristic-params {p}: {loc}: {err['msg']}") from None


def score_params(params: dict[str, Any], env_cfg: EnvConfig, interface: Interface,
                 seeds: tuple[int, ...]) -> dict[str, float]:
    """Mean episode reward (with its 95% CI), energy, violation rate and toggles of
    ``power_aware`` with ``params`` on ``seeds``."""
    from cloudrl.evaluate import make_env, run_episode
    from cloudrl.metrics import summarize

    env = make_env(env_cfg, interface)
    policy = tuned_heuristic("power_aware", params, interface)
    eps = [run_episode(policy, env, s) for s in seeds]
    reward = summarize([e.episode_reward for e in eps])
    return {"reward_mean": reward.mean, "reward_ci95": reward.ci95,
            "energy_kwh_mean": float(np.mean([e.energy_kwh for e in eps])),
            "sla_violation_rate_mean": float(np.mean([e.sla_violation_rate for e in eps])),
            "toggles_mean": float(np.mean([e.toggles for e in eps]))}


def search_space(interface: Interface) -> dict[str, Any]:
    """Ray Tune distributions over ``PowerAwareConfig``'s knobs (see its docstring)."""
    from ray import tune

    space: dict[str, Any] = {
        "spare_floor": tune.uniform(0.0, 3.0),  # free capacity kept beyond the queue
        "spare_frac": tune.uniform(0.0, 0.2),  # plus this share of the capacity in use
        "lead_ticks": tune.uniform(0.0, 6.0),  # plus this many ticks of arrivals
        "hysteresis": tune.uniform(0.0, 3.0),  # sleep only this far above the low water
        "tier_weight": tune.loguniform(1e-3, 30.0),  # most-loaded vs most-efficient tier
        "job_order": tune.choice(list(JOB_ORDERS)),
        # duration-aware placement: jobs this long (0 = off) use long_tier_weight
        "long_job_ticks": tune.choice([0.0, 30.0, 60.0, 100.0, 300.0]),
        "long_tier_weight": tune.loguniform(1e-3, 30.0),
    }
    if interface == "branching":
        space["priority_level"] = tune.choice([-1, 0, 1, 2])
    return space


def default_point(interface: Interface) -> dict[str, Any]:
    """The default ``PowerAwareConfig`` restricted to the searched knobs."""
    default = asdict(PowerAwareConfig())
    return {k: default[k] for k in search_space(interface)}


class Confirmation(BaseModel):
    """The sweep's best point against the defaults on held-out validation seeds."""

    keep_best: bool
    best: dict[str, float]
    default: dict[str, float]


def confirm_on_validation(params: dict[str, Any], env_cfg: EnvConfig, interface: Interface,
                          n_seeds: int) -> Confirmation:
    """Score ``params`` and the default parameters on the first ``n_seeds`` validation
    seeds; ``keep_best`` only if ``params``' mean reward is strictly higher there."""
    seeds = validation_seeds(n_seeds)
    best = score_params(params, env_cfg, interface, seeds)
    default = score_params({}, env_cfg, interface, seeds)
    return Confirmation(keep_best=best["reward_mean"] > default["reward_mean"], best=best,
                        default=default)


def _trial(config: dict[str, Any], env: dict[str, Any], interface: Interface,
           seeds: tuple[int, ...]) -> None:
    from ray import tune

    tune.report(score_params(config, EnvConfig.model_validate(env), interface, tuple(seeds)))


class TuneHeuristicConfig(BaseModel):
    """One ``cloudrl tune-heuristic`` sweep."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    env: EnvConfig = Field(default_factory=lambda: EnvConfig.model_validate({"n_servers": 50}))
    interface: Interface = "branching"
    num_samples: int = Field(default=40, ge=1, le=10_000)
    n_seeds: int = Field(default=N_SEEDS, ge=1, le=N_SEEDS)
    max_concurrent_trials: int = Field(default=2, ge=1)
    confirm_seeds: int = Field(default=N_SEEDS, ge=0, le=N_SEEDS, description=(
        "validation seeds on which the sweep's best must beat the defaults, else the "
        "defaults are kept; 0 = keep the best on the train seeds unchecked"))
    search_seed: int = Field(default=0, ge=0)
    experiment: str = "cloudrl-tune-heuristic"
    tracking_uri: str | None = None
    parent_run_id: str | None = Field(default=None, description="nest the sweep's MLflow "
                                      "run under this run (the headline pipeline's)")
    storage_path: str = "results/tune"
    verbose: int = Field(default=0, ge=0, le=3)

    def default_out(self, root: str | Path = "results/headline") -> Path:
        return tuned_path(root, self.env.workload.kind, self.env.sim.fleet.n_servers,
                          self.interface, self.env.sim.episode_length)


def tuned_path(root: str | Path, workload: str, n_servers: int, interface: str,
               episode_length: int) -> Path:
    """``<root>/tune_<workload>_n<N>_<interface>[_l<ticks>]/tuned_power_aware.json`` (the
    episode length only when not the default 1,000): where ``cloudrl tune-heuristic`` writes
    and ``cloudrl headline --reuse`` looks."""
    length = "" if episode_length == 1000 else f"_l{episode_length}"
    return Path(root) / f"tune_{workload}_n{n_servers}_{interface}{length}" / TUNED_FILE


def matches(tuned: TunedHeuristic, env: EnvConfig, interface: str) -> bool:
    """Was ``tuned`` tuned for this workload, fleet size, episode length and interface?"""
    return (tuned.workload, tuned.n_servers, tuned.episode_length, tuned.interface) == (
        env.workload.kind, env.sim.fleet.n_servers, env.sim.episode_length, interface)


class _MlflowTrials:
    """A Tune callback (built lazily, Ray imported inside): one nested MLflow run per trial."""

    @staticmethod
    def make(client: Any, experiment_id: str, parent_id: str, tags: dict[str, Any]) -> Any:
        from ray.tune import Callback

        from cloudrl import tracking

        class MlflowTrials(Callback):
            def on_trial_complete(self, iteration: int, trials: list, trial: Any,
                                  **info: Any) -> None:
                run_id = tracking.start_run(client, experiment_id, f"trial-{trial.trial_id}",
                                            {**tags, "mlflow.parentRunId": parent_id,
                                             "trial_id": trial.trial_id})
                tracking.log_params(client, run_id, trial.config)
                result = trial.last_result or {}
                tracking.log_metrics(client, run_id,
                                     {f"train/{k}": result[k] for k in SCORE_KEYS
                                      if k in result})
                tracking.end_run(client, run_id)

            def on_trial_error(self, iteration: int, trials: list, trial: Any,
                               **info: Any) -> None:
                run_id = tracking.start_run(client, experiment_id, f"trial-{trial.trial_id}",
                                            {**tags, "mlflow.parentRunId": parent_id})
                tracking.log_params(client, run_id, trial.config)
                tracking.end_run(client, run_id, "FAILED")

        return MlflowTrials()


def tune_heuristic(cfg: TuneHeuristicConfig, out: str | Path | None = None) -> TunedHeuristic:
    """Run the sweep, write the best parameters to ``out`` (JSON) and return them."""
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    from cloudrl import tracking
    from cloudrl.ray_utils import init_ray

    init_ray()
    seeds = train_seeds(cfg.n_seeds)
    wl, n = cfg.env.workload.kind, cfg.env.sim.fleet.n_servers
    name = f"tune-{wl}-n{n}-{cfg.interface}-{time.strftime('%Y%m%d-%H%M%S')}"
    tags = {"phase": "tune_heuristic", "workload": wl, "n_servers": n,
            "interface": cfg.interface}
    client = tracking.make_client(cfg.tracking_uri)
    exp_id = tracking.get_or_create_experiment(client, cfg.experiment)
    parent_tags = dict(tags)
    if cfg.parent_run_id:
        parent_tags["mlflow.parentRunId"] = cfg.parent_run_id
    run_id = tracking.start_run(client, exp_id, name, parent_tags)
    with tracking.finishing(client, run_id):
        tracking.log_params(client, run_id, {
            "workload": wl, "n_servers": n, "interface": cfg.interface,
            "episode_length": cfg.env.sim.episode_length, "num_samples": cfg.num_samples,
            "n_seeds": cfg.n_seeds, "objective": "train/reward_mean (max)"})
        default = default_point(cfg.interface)
        trainable = tune.with_resources(
            tune.with_parameters(_trial, env=cfg.env.model_dump(mode="json"),
                                 interface=cfg.interface, seeds=seeds), {"cpu": 1})
        tuner = tune.Tuner(
            trainable, param_space=search_space(cfg.interface),
            tune_config=tune.TuneConfig(
                num_samples=cfg.num_samples, metric="reward_mean", mode="max",
                search_alg=BasicVariantGenerator(points_to_evaluate=[default],
                                                 random_state=cfg.search_seed,
                                                 max_concurrent=cfg.max_concurrent_trials)),
            run_config=tune.RunConfig(
                name=name, storage_path=str(Path(cfg.storage_path).resolve()),
                verbose=cfg.verbose,
                callbacks=[_MlflowTrials.make(client, exp_id, run_id, tags)]))
        grid = tuner.fit()
        done = [r for r in grid if r.error is None and "reward_mean" in (r.metrics or {})]
        if not done:
            raise RuntimeError(f"tune-heuristic: all {len(grid)} trials failed; first error: "
                               f"{next((r.error for r in grid if r.error), None)}")
        best = max(done, key=lambda r: r.metrics["reward_mean"])
        default_result = next((r for r in done if all(r.config.get(k) == v
                                                      for k, v in default.items())), None)
        default_train = ({k: float(default_result.metrics[k]) for k in SCORE_KEYS}
                         if default_result is not None else {})
        params = {**asdict(PowerAwareConfig()), **best.config}
        train = {k: float(best.metrics[k]) for k in SCORE_KEYS}
        source, check = "search", None
        if best is default_result:
            source = "default"
        elif cfg.confirm_seeds:
            check = confirm_on_validation(params, cfg.env, cfg.interface, cfg.confirm_seeds)
            if not check.keep_best:
                source, params, train = "default", asdict(PowerAwareConfig()), default_train
        tuned = TunedHeuristic(
            params=params, interface=cfg.interface,
            workload=wl, n_servers=n, episode_length=cfg.env.sim.episode_length,
            n_seeds=cfg.n_seeds, num_samples=cfg.num_samples, train=train,
            default_train=default_train, source=source,
            validation=check.best if check else {},
            default_validation=check.default if check else {}, mlflow_run_id=run_id)
        tracking.log_params(client, run_id, {f"best.{k}": v for k, v in tuned.params.items()})
        tracking.log_metrics(client, run_id, {f"best/train/{k}": v
                                              for k, v in tuned.train.items()})
        tracking.log_metrics(client, run_id, {f"default/train/{k}": v
                                              for k, v in tuned.default_train.items()})
        tracking.log_params(client, run_id, {"source": tuned.source,
                                             "confirm_seeds": cfg.confirm_seeds})
        for label, scores in (("best", tuned.validation), ("default", tuned.default_validation)):
            tracking.log_metrics(client, run_id, {f"{label}/validation/{k}": v
                                                  for k, v in scores.items()})
        path = Path(out) if out is not None else cfg.default_out()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tuned.model_dump_json(indent=1))
        tracking.log_artifacts(client, run_id, [path])
    return tuned
