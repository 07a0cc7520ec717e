"""Sweeps with Ray Tune: algorithms x run seeds x workloads, every trial tracked in MLflow.

``run_sweep(SweepConfig(...))`` grids over (algo, run_seed, workload), trains
each trial with RLlib on the 50 train seeds to an env-step budget (one
function trainable per trial, 1 CPU each by default), and keeps each trial's
final checkpoint as a cloudrl checkpoint. An MLflow callback on the driver
opens one run per trial (tags: algo, workload, run_seed, n_servers,
kind=learned) and logs the small metric set of ``flat_metrics`` with
``step = env_steps``. After ``Tuner.fit()`` each final checkpoint is evaluated
on the held-out test seeds and ``test/<metric>_mean`` / ``test/<metric>_ci95``
go into the trial's run with the per-episode CSV; the heuristics are
evaluated on the same seeds, one MLflow run each (kind=heuristic), so
``cloudrl compare`` can put everything in one table.

CLI: ``cloudrl sweep --config experiments/sweep_small.yaml``.
"""

from __future__ import annotations

import inspect
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from ray.tune import Callback

from cloudrl import tracking
from cloudrl.config import ConfigError, deep_merge
from cloudrl.metrics import METRICS
from cloudrl.protocol import N_SEEDS
from cloudrl.training import (
    BRANCHING_ALGOS,
    Algo,
    TrainConfig,
    build_algo_config,
    flat_metrics,
    write_meta,
)
from envs.env_config import EnvConfig

log = logging.getLogger(__name__)

TRACKED_METRICS = ("env_steps", "episode_return_mean", "energy_kwh", "sla_violation_rate",
                   "toggles", "invalid_actions", "total_loss", "policy_loss", "vf_loss",
                   "entropy", "qf_loss")  # the keys flat_metrics() can return


class SweepConfig(BaseModel):
    """One sweep: the grid, the shared env and budget, evaluation and tracking."""

    model_config = ConfigDict(extra="forbid")

    algos: list[Algo] = Field(default_factory=lambda: ["ppo", "dqn"], min_length=1)
    run_seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    workloads: list[str] = Field(default_factory=lambda: ["poisson", "google_v2_like"],
                                 min_length=1)
    n_servers: int = Field(default=15, ge=1)
    episode_length: int | None = Field(default=None, ge=1, description="None: env default")
    env: dict[str, Any] = Field(default_factory=dict, description="extra EnvConfig fields")
    workload_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per workload kind, e.g. {trace: {path: x.npz}}")
    env_steps: int = Field(default=20_000, ge=1)
    hparams: dict[Algo, dict[str, Any]] = Field(default_factory=dict)
    num_env_runners: int = Field(default=0, ge=0)
    hidden: int = Field(default=128, ge=8)
    reporting: dict[str, Any] = Field(default_factory=dict,
                                      description="AlgorithmConfig.reporting() kwargs")
    env_runners: dict[str, Any] = Field(default_factory=dict,
                                        description="AlgorithmConfig.env_runners() kwargs")
    checkpoint_every: int = Field(default=0, ge=0, description="iterations; 0: at the end only")
    eval_seeds: int = Field(default=N_SEEDS, ge=1, le=N_SEEDS)
    eval_workers: int = Field(default=2, ge=1)
    heuristics: list[str] = Field(default_factory=lambda: ["all"], validate_default=True)
    experiment: str = "cloudrl-sweep"
    name: str | None = Field(default=None, description="Tune run name; default experiment-time")
    storage_path: str = "results/tune"
    max_concurrent_trials: int = Field(default=2, ge=1)
    cpus_per_trial: float = Field(default=1.0, gt=0)
    tracking_uri: str | None = None
    verbose: int = Field(default=1, ge=0, le=3)

    def interfaces(self) -> list[str]:
        """The action interfaces the sweep's algorithms act on (heuristics run on each)."""
        return sorted({"branching" if a in BRANCHING_ALGOS else "flat" for a in self.algos})

    @field_validator("workloads")
    @classmethod
    def _known_workloads(cls, kinds: list[str]) -> list[str]:
        from envs.workloads import WORKLOAD_KINDS

        bad = [k for k in kinds if k not in WORKLOAD_KINDS]
        if bad:
            raise ValueError(f"unknown workload(s) {bad}; expected {list(WORKLOAD_KINDS)}")
        return list(dict.fromkeys(kinds))

    @field_validator("heuristics")
    @classmethod
    def _known_heuristics(cls, names: list[str]) -> list[str]:
        from cloudrl.heuristics import HEURISTICS

        out: list[str] = []
        for name in names:
            if name != "all" and name not in HEURISTICS:
                raise ValueError(f"unknown heuristic {name!r}; expected {sorted(HEURISTICS)}")
            out.extend(HEURISTICS if name == "all" else [name])
        return list(dict.fromkeys(out))

    @field_validator("tracking_uri")
    @classmethod
    def _valid_uri(cls, uri: str | None) -> str | None:
        return tracking.resolve_tracking_uri(uri) if uri else None

    @field_validator("reporting", "env_runners")
    @classmethod
    def _algo_config_kwargs(cls, kwargs: dict[str, Any], info: Any) -> dict[str, Any]:
        from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

        known = inspect.signature(getattr(AlgorithmConfig, info.field_name)).parameters
        bad = sorted(set(kwargs) - set(known))
        if bad:
            raise ValueError(f"not AlgorithmConfig.{info.field_name}() arguments: {bad}")
        return kwargs

    def env_config(self, workload: str) -> EnvConfig:
        """The env of one workload: shared ``env`` + size + episode length + workload options."""
        env = deep_merge(self.env, {"n_servers": self.n_servers,
                                    "workload": {"kind": workload,
                                                 **self.workload_options.get(workload, {})}})
        if self.episode_length is not None:
            env = deep_merge(env, {"sim": {"episode_length": self.episode_length}})
        return EnvConfig.model_validate(env)

    def train_config(self, algo: str, workload: str, run_seed: int) -> TrainConfig:
        return TrainConfig(algo=algo, env=self.env_config(workload), env_steps=self.env_steps,
                           num_env_runners=self.num_env_runners, run_seed=run_seed,
                           hidden=self.hidden, hparams=dict(self.hparams.get(algo, {})))


def _trial_keys(config: dict[str, Any]) -> tuple[str, str, int]:
    return config["algo"], config["workload"], int(config["run_seed"])


def algo_config_for(sweep: SweepConfig, cfg: TrainConfig) -> Any:
    """``build_algo_config(cfg)`` plus the sweep's ``reporting`` and ``env_runners`` kwargs."""
    algo_config = build_algo_config(cfg)
    if sweep.reporting:
        algo_config.reporting(**sweep.reporting)
    if sweep.env_runners:
        algo_config.env_runners(**sweep.env_runners)
    return algo_config


def check_algo_configs(sweep: SweepConfig) -> None:
    """Build every algorithm's config before Tune starts, so bad hparams fail fast, by name."""
    for algo in sweep.algos:
        try:
            algo_config_for(sweep, sweep.train_config(algo, sweep.workloads[0],
                                                      sweep.run_seeds[0]))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"invalid config (sweep): hparams.{algo}: {e}") from None


def sweep_trainable(config: dict[str, Any], sweep_config: dict[str, Any]) -> None:
    """Tune function trainable: train one (algo, workload, run_seed) to the env-step budget.

    ``config`` is the trial's grid point; ``sweep_config`` the SweepConfig as a dict (bound with
    ``tune.with_parameters`` so it stays out of the trial config and its directory name).
    """
    from ray import tune

    sweep = SweepConfig.model_validate(sweep_config)
    cfg = sweep.train_config(*_trial_keys(config))
    algo = algo_config_for(sweep, cfg).build_algo()
    try:
        steps, it = 0, 0
        while steps < cfg.env_steps:
            metrics = flat_metrics(algo.train())
            it += 1
            steps = int(metrics["env_steps"])
            last = steps >= cfg.env_steps
            if last or (sweep.checkpoint_every and it % sweep.checkpoint_every == 0):
                with tempfile.TemporaryDirectory(prefix="cloudrl_ckpt_") as tmp:
                    algo.save_to_path(tmp)
                    write_meta(Path(tmp), cfg)
                    # report() persists the directory into the trial's storage before returning.
                    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))
            else:
                tune.report(metrics)
    finally:
        algo.stop()


def run_name(algo: str, workload: str, n_servers: int, run_seed: int | None = None) -> str:
    seed = f"-s{run_seed}" if run_seed is not None else ""
    return f"{algo}-{workload}-n{n_servers}{seed}"


class MlflowTrialCallback(Callback):
    """One MLflow run per Tune trial (on the driver); tracked metrics at step = env_steps."""

    def __init__(self, sweep: SweepConfig, sweep_id: str) -> None:
        self.sweep, self.sweep_id = sweep, sweep_id
        self.run_ids: dict[str, str] = {}
        self._client: Any = None
        self._experiment_id: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the RunConfig (and its callbacks) into tuner.pkl; a client is not state.
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = tracking.make_client(self.sweep.tracking_uri)
        return self._client

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = tracking.get_or_create_experiment(self.client,
                                                                    self.sweep.experiment)
        return self._experiment_id

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        algo, workload, seed = _trial_keys(trial.config)
        cfg = self.sweep.train_config(algo, workload, seed)
        tags = {**common_tags(self.sweep, self.sweep_id, workload), "kind": "learned",
                "policy": algo, "algo": algo, "run_seed": seed, "trial_id": trial.trial_id,
                "interface": cfg.interface()}
        run_id = tracking.start_run(self.client, self.experiment_id,
                                    run_name(algo, workload, self.sweep.n_servers, seed), tags)
        tracking.log_params(self.client, run_id, {
            **cfg.model_dump(mode="json", exclude={"checkpoint_dir"}),
            "reporting": self.sweep.reporting, "env_runners": self.sweep.env_runners})
        self.run_ids[trial.trial_id] = run_id

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is None or "env_steps" not in result:
            return
        metrics = {k: result[k] for k in TRACKED_METRICS if k in result}
        tracking.log_metrics(self.client, run_id, metrics, step=int(result["env_steps"]))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id in self.run_ids:
            tracking.end_run(self.client, self.run_ids[trial.trial_id], "FINISHED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id in self.run_ids:
            tracking.end_run(self.client, self.run_ids[trial.trial_id], "FAILED")


def common_tags(sweep: SweepConfig, sweep_id: str, workload: str) -> dict[str, Any]:
    env = sweep.env_config(workload)
    return {"sweep_id": sweep_id, "workload": workload, "n_servers": sweep.n_servers,
            "episode_length": env.sim.episode_length, "eval_seeds": sweep.eval_seeds}


def log_evaluation(client: Any, run_id: str, results: list, out: Path, step: int,
                   eval_cfg: Any) -> dict[str, float]:
    """``test/<metric>_mean`` and ``_ci95`` for every metric, plus the per-episode CSV/JSON."""
    from cloudrl.evaluate import summary_rows, write_results

    (row,) = summary_rows(results)
    metrics = {f"test/{m}_{s}": row[f"{m}_{s}"] for m in METRICS for s in ("mean", "ci95")}
    tracking.log_metrics(client, run_id, metrics, step=step)
    paths = write_results(results, [row], out, eval_cfg)
    tracking.log_artifacts(client, run_id, paths, artifact_path="eval")
    return metrics


def _evaluate_heuristics(sweep: SweepConfig, sweep_id: str, client: Any, experiment_id: str,
                         eval_dir: Path) -> list[dict[str, Any]]:
    """Each heuristic on each workload and each interface the sweep's algorithms use."""
    from cloudrl.evaluate import EvalConfig, evaluate

    rows = []
    for workload in sweep.workloads:
        for interface in sweep.interfaces():
            cfg = EvalConfig(env=sweep.env_config(workload), policies=sweep.heuristics,
                             interface=interface, n_seeds=sweep.eval_seeds,
                             workers=sweep.eval_workers)
            results = evaluate(cfg, progress=sweep.verbose > 0)
            for name in sweep.heuristics:
                rows.append(_log_heuristic(sweep, sweep_id, client, experiment_id, eval_dir,
                                           cfg, name, [r for r in results if r.policy == name]))
    return rows


def _log_heuristic(sweep: SweepConfig, sweep_id: str, client: Any, experiment_id: str,
                   eval_dir: Path, cfg: Any, name: str, results: list) -> dict[str, Any]:
    workload, interface = cfg.env.workload.kind, cfg.interface
    tags = {**common_tags(sweep, sweep_id, workload), "kind": "heuristic", "policy": name,
            "interface": interface}
    label = name if interface == "flat" else f"{name}-branching"
    rn = run_name(label, workload, sweep.n_servers)
    run_id = tracking.start_run(client, experiment_id, rn, tags)
    tracking.log_params(client, run_id, {"env": cfg.env.model_dump(mode="json")})
    metrics = log_evaluation(client, run_id, results, eval_dir / rn, 0, cfg)
    tracking.end_run(client, run_id)
    return {"run_id": run_id, "policy": name, "workload": workload, "interface": interface,
            **metrics}


def _evaluate_trial(sweep: SweepConfig, result: Any, run_id: str, client: Any,
                    eval_dir: Path) -> dict[str, Any]:
    from cloudrl.evaluate import EvalConfig, evaluate

    algo, workload, seed = _trial_keys(result.config)
    ckpt = Path(result.checkpoint.path)
    interface = sweep.train_config(algo, workload, seed).interface()
    cfg = EvalConfig(env=sweep.env_config(workload), policies=[str(ckpt)], interface=interface,
                     n_seeds=sweep.eval_seeds, workers=sweep.eval_workers)
    results = evaluate(cfg, progress=sweep.verbose > 0)
    client.set_tag(run_id, "checkpoint", str(ckpt))
    step = int(result.metrics.get("env_steps", 0))
    metrics = log_evaluation(client, run_id, results, eval_dir / run_name(
        algo, workload, sweep.n_servers, seed), step, cfg)
    return {"run_id": run_id, "policy": algo, "workload": workload, "run_seed": seed,
            "checkpoint": str(ckpt), "env_steps": step, **metrics}


def run_sweep(sweep: SweepConfig) -> dict[str, Any]:
    """Run the Tune sweep, evaluate every final checkpoint and the heuristics, log to MLflow.

    Returns ``{"sweep_id", "tracking_uri", "experiment", "learned": [...], "heuristics": [...],
    "failed": [trial ids]}``; each row has the run id and the test metrics.
    """
    from ray import tune

    from cloudrl.ray_utils import init_ray

    check_algo_configs(sweep)
    # Each trial keeps one checkpoint (num_to_keep=1), which forces an experiment-state
    # snapshot per checkpoint; Tune then warns about "excessive" snapshots. Expected here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    init_ray()
    name = sweep.name or f"{sweep.experiment}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = Path(sweep.storage_path).resolve()
    callback = MlflowTrialCallback(sweep, sweep_id=name)
    resources: Any = {"cpu": sweep.cpus_per_trial}
    if sweep.num_env_runners > 0:
        def resources(config: dict[str, Any]) -> Any:  # driver + remote env runners
            algo_config = algo_config_for(sweep, sweep.train_config(*_trial_keys(config)))
            return algo_config.algo_class.default_resource_request(algo_config)
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(sweep_trainable, sweep_config=sweep.model_dump(mode="json")),
            resources),
        param_space={"algo": tune.grid_search(list(sweep.algos)),
                     "run_seed": tune.grid_search(list(sweep.run_seeds)),
                     "workload": tune.grid_search(list(sweep.workloads))},
        tune_config=tune.TuneConfig(max_concurrent_trials=sweep.max_concurrent_trials),
        run_config=tune.RunConfig(
            name=name, storage_path=str(storage), verbose=sweep.verbose,
            # Function trainables checkpoint themselves (tune.report); checkpoint_at_end
            # is for class trainables only.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[callback]),
    )
    grid = tuner.fit()
    eval_dir = storage / name / "eval"
    learned, failed = [], []
    for result in grid:
        trial_id = (result.metrics or {}).get("trial_id")
        if result.error is not None or result.checkpoint is None or trial_id is None:
            failed.append(trial_id or str(result.path))
            log.error("trial %s failed: %s", trial_id or result.path, result.error)
            continue
        learned.append(_evaluate_trial(sweep, result, callback.run_ids[trial_id],
                                       callback.client, eval_dir))
    heuristics = _evaluate_heuristics(sweep, name, callback.client, callback.experiment_id,
                                      eval_dir) if sweep.heuristics else []
    return {"sweep_id": name, "tracking_uri": callback.client.tracking_uri,
            "experiment": sweep.experiment, "learned": learned, "heuristics": heuristics,
            "failed": failed}
