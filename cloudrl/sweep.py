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

Failures: a trial whose process fails (an exception, a killed worker, a lost
node) is restarted by Tune up to ``max_failures`` times (``tune.FailureConfig``)
and ``sweep_trainable`` restores the algorithm from the trial's last reported
checkpoint (``tune.get_checkpoint()``), so its env-step counter and iteration
count go on from there; the trial keeps its MLflow run, whose ``num_failures``
tag counts the restarts. A sweep whose driver died is continued with
``resume_sweep`` (``Tuner.restore(..., resume_errored=True)``): unfinished and
errored trials go on from their last checkpoints, then the evaluation and the
heuristics run as in a normal sweep. Runs are found again by their
``sweep_id`` / ``trial_id`` (and for heuristics ``policy`` / ``workload`` /
``interface``) tags, never opened twice; runs that already carry test metrics
are not evaluated again.

CLI: ``cloudrl sweep --config experiments/sweep_small.yaml``;
``cloudrl sweep --resume <experiment dir, or its name under --storage-path>``.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from ray.tune import Callback

from cloudrl import tracking
from cloudrl.config import ConfigError, deep_merge, format_validation_error
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
SWEEP_FILE = "cloudrl_sweep.json"  # the SweepConfig, in the Tune experiment dir (for resume)
# Test-only fault injection, read by the driver: "<trial|driver>:<iteration>:<marker file>".
# See ``_inject_fault``.
FAULT_ENV = "CLOUDRL_SWEEP_TEST_FAULT"


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
    max_failures: int = Field(
        default=2, ge=-1,
        description="Tune restarts of a failed trial, each from the trial's last checkpoint "
                    "(tune.FailureConfig); 0: none, -1: no limit")
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


def sweep_trainable(config: dict[str, Any], sweep_config: dict[str, Any],
                    fault: dict[str, Any] | None = None) -> None:
    """Tune function trainable: train one (algo, workload, run_seed) to the env-step budget.

    ``config`` is the trial's grid point; ``sweep_config`` the SweepConfig as a dict (bound with
    ``tune.with_parameters`` so it stays out of the trial config and its directory name).
    When Tune restarts the trial (after a failure, or on ``resume_sweep``) it hands back the
    last reported checkpoint: the algorithm restores from it (weights, optimizer, the
    env-step counter and the iteration count) and trains on to the same budget.
    ``fault`` is the test-only hook of ``_inject_fault``.
    """
    from ray import tune

    sweep = SweepConfig.model_validate(sweep_config)
    cfg = sweep.train_config(*_trial_keys(config))
    algo = algo_config_for(sweep, cfg).build_algo()
    try:
        steps, it = 0, 0
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as path:
                algo.restore_from_path(path)
            steps, it = restored_progress(algo)
            log.info("trial restored from %s at iteration %d, %d env steps",
                     checkpoint.path, it, steps)
        while steps < cfg.env_steps:
            metrics = flat_metrics(algo.train())
            it += 1
            _inject_fault(fault, it)
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


def restored_progress(algo: Any) -> tuple[int, int]:
    """(env steps sampled, training iterations) of an algorithm restored from a checkpoint."""
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

    steps = algo.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
    return int(steps), int(algo.iteration)


def _fault_from_env() -> dict[str, Any] | None:
    """The driver's ``$CLOUDRL_SWEEP_TEST_FAULT``, parsed (None when unset)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    target, iteration, marker = spec.split(":", 2)
    if target not in ("trial", "driver"):
        raise ConfigError(f"{FAULT_ENV}={spec!r}: expected trial|driver:<iteration>:<marker>")
    # The driver's pid travels with the trainable's parameters (it reads no env var itself:
    # Ray workers do not see variables the driver set after Ray started).
    return {"target": target, "iteration": int(iteration), "marker": marker,
            "driver_pid": os.getpid()}


def _inject_fault(fault: dict[str, Any] | None, iteration: int) -> None:
    """Test-only: SIGKILL the trial's process (or the driver, then the trial) at ``iteration``.

    Fires once: it creates ``fault["marker"]`` first, and a restarted attempt that finds the
    file goes on. It fires after ``algo.train()`` and before that iteration is reported, so
    the restart has only the previous iteration's checkpoint. ``driver`` assumes the trial
    runs on the driver's machine (true in tests: one local Ray), and first waits a little:
    the driver saves the experiment state (which names that checkpoint) just after it
    schedules this iteration, and a resume starts from the last state saved.
    """
    if fault is None or iteration != fault["iteration"]:
        return
    try:
        Path(fault["marker"]).touch(exist_ok=False)
    except FileExistsError:
        return
    log.warning("%s: killing the %s at iteration %d", FAULT_ENV, fault["target"], iteration)
    if fault["target"] == "driver":
        time.sleep(3)
        os.kill(fault["driver_pid"], signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


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

    def run_id_for(self, trial_id: str) -> str | None:
        """The trial's MLflow run: this driver's, else one an earlier driver opened (by tag)."""
        if trial_id not in self.run_ids:
            runs = find_runs(self.client, self.experiment_id,
                             {"sweep_id": self.sweep_id, "trial_id": trial_id})
            if runs:
                self.run_ids[trial_id] = runs[0].info.run_id
        return self.run_ids.get(trial_id)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        # Also called when Tune restarts a failed trial, and for every trial that a resumed
        # sweep continues: those keep their run (set back to RUNNING if it had ended).
        run_id = self.run_id_for(trial.trial_id)
        if run_id is not None:
            if self.client.get_run(run_id).info.status != "RUNNING":
                self.client.update_run(run_id, status="RUNNING")
            return
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

    def _end(self, trial: Any, status: str | None) -> None:
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is not None:
            self.client.set_tag(run_id, "num_failures", str(trial.num_failures))
            if status is not None:
                tracking.end_run(self.client, run_id, status)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, None)  # Tune restarts it from its last checkpoint: the run goes on

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, "FINISHED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, "FAILED")


def find_runs(client: Any, experiment_id: str, tags: dict[str, Any]) -> list:
    """Runs of the experiment carrying all ``tags`` (oldest first)."""
    flt = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
    return list(client.search_runs([experiment_id], filter_string=flt,
                                   order_by=["attributes.start_time ASC"]))


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


def _logged_test_metrics(run: Any) -> dict[str, float] | None:
    """The run's ``test/*`` metrics when its evaluation was logged in full, else None."""
    keys = [f"test/{m}_{s}" for m in METRICS for s in ("mean", "ci95")]
    logged = run.data.metrics
    return {k: logged[k] for k in keys} if all(k in logged for k in keys) else None


def _evaluate_heuristics(sweep: SweepConfig, sweep_id: str, client: Any, experiment_id: str,
                         eval_dir: Path) -> list[dict[str, Any]]:
    """Each heuristic on each workload and each interface the sweep's algorithms use.

    A heuristic already evaluated in this sweep (a resumed sweep) keeps its run and metrics.
    """
    from cloudrl.evaluate import EvalConfig, evaluate

    rows = []
    for workload in sweep.workloads:
        for interface in sweep.interfaces():
            runs, done = {}, {}
            for name in sweep.heuristics:
                found = find_runs(client, experiment_id, {
                    "sweep_id": sweep_id, "kind": "heuristic", "policy": name,
                    "workload": workload, "interface": interface})
                if found:
                    runs[name] = found[0].info.run_id
                    metrics = _logged_test_metrics(found[0])
                    if metrics is not None:
                        done[name] = metrics
            todo = [n for n in sweep.heuristics if n not in done]
            if todo:
                cfg = EvalConfig(env=sweep.env_config(workload), policies=todo,
                                 interface=interface, n_seeds=sweep.eval_seeds,
                                 workers=sweep.eval_workers)
                results = evaluate(cfg, progress=sweep.verbose > 0)
            for name in sweep.heuristics:
                if name in done:
                    rows.append({"run_id": runs[name], "policy": name, "workload": workload,
                                 "interface": interface, **done[name]})
                else:
                    rows.append(_log_heuristic(
                        sweep, sweep_id, client, experiment_id, eval_dir, cfg, name,
                        [r for r in results if r.policy == name], runs.get(name)))
    return rows


def _log_heuristic(sweep: SweepConfig, sweep_id: str, client: Any, experiment_id: str,
                   eval_dir: Path, cfg: Any, name: str, results: list,
                   run_id: str | None = None) -> dict[str, Any]:
    workload, interface = cfg.env.workload.kind, cfg.interface
    label = name if interface == "flat" else f"{name}-branching"
    rn = run_name(label, workload, sweep.n_servers)
    if run_id is None:
        tags = {**common_tags(sweep, sweep_id, workload), "kind": "heuristic", "policy": name,
                "interface": interface}
        run_id = tracking.start_run(client, experiment_id, rn, tags)
        tracking.log_params(client, run_id, {"env": cfg.env.model_dump(mode="json")})
    metrics = log_evaluation(client, run_id, results, eval_dir / rn, 0, cfg)
    tracking.end_run(client, run_id)
    return {"run_id": run_id, "policy": name, "workload": workload, "interface": interface,
            **metrics}


def _evaluate_trial(sweep: SweepConfig, result: Any, run_id: str, client: Any,
                    eval_dir: Path) -> dict[str, Any]:
    """Evaluate the trial's final checkpoint into its run (unless a resumed sweep did)."""
    from cloudrl.evaluate import EvalConfig, evaluate

    algo, workload, seed = _trial_keys(result.config)
    ckpt = Path(result.checkpoint.path)
    step = int(result.metrics.get("env_steps", 0))
    run = client.get_run(run_id)
    row = {"run_id": run_id, "policy": algo, "workload": workload, "run_seed": seed,
           "checkpoint": str(ckpt), "env_steps": step,
           "num_failures": int(run.data.tags.get("num_failures", 0))}
    metrics = _logged_test_metrics(run)
    if metrics is not None and run.data.tags.get("checkpoint") == str(ckpt):
        return {**row, **metrics}
    interface = sweep.train_config(algo, workload, seed).interface()
    cfg = EvalConfig(env=sweep.env_config(workload), policies=[str(ckpt)], interface=interface,
                     n_seeds=sweep.eval_seeds, workers=sweep.eval_workers)
    results = evaluate(cfg, progress=sweep.verbose > 0)
    client.set_tag(run_id, "checkpoint", str(ckpt))
    metrics = log_evaluation(client, run_id, results, eval_dir / run_name(
        algo, workload, sweep.n_servers, seed), step, cfg)
    return {**row, **metrics}


def _start_ray() -> None:
    from cloudrl.ray_utils import init_ray

    # Each trial keeps one checkpoint (num_to_keep=1), which forces an experiment-state
    # snapshot per checkpoint; Tune then warns about "excessive" snapshots. Expected here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    init_ray()


def _trainable(sweep: SweepConfig) -> Any:
    """``sweep_trainable`` with the sweep bound and its resources (the same on resume)."""
    from ray import tune

    resources: Any = {"cpu": sweep.cpus_per_trial}
    if sweep.num_env_runners > 0:
        def resources(config: dict[str, Any]) -> Any:  # driver + remote env runners
            algo_config = algo_config_for(sweep, sweep.train_config(*_trial_keys(config)))
            return algo_config.algo_class.default_resource_request(algo_config)
    return tune.with_resources(
        tune.with_parameters(sweep_trainable, sweep_config=sweep.model_dump(mode="json"),
                             fault=_fault_from_env()),
        resources)


def run_sweep(sweep: SweepConfig) -> dict[str, Any]:
    """Run the Tune sweep, evaluate every final checkpoint and the heuristics, log to MLflow.

    Returns ``{"sweep_id", "tracking_uri", "experiment", "learned": [...], "heuristics": [...],
    "failed": [trial ids], "experiment_dir"}``; each row has the run id and the test metrics
    (learned rows also ``num_failures``, the trial's restarts).
    """
    from ray import tune

    check_algo_configs(sweep)
    _start_ray()
    name = sweep.name or f"{sweep.experiment}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = Path(sweep.storage_path).resolve()
    # What resume_sweep reads back: the tracking URI and the paths pinned to absolute ones, so
    # a resume from another directory logs to the same store.
    sweep = sweep.model_copy(update={
        "name": name, "storage_path": str(storage),
        "tracking_uri": tracking.resolve_tracking_uri(sweep.tracking_uri)})
    callback = MlflowTrialCallback(sweep, sweep_id=name)
    tuner = tune.Tuner(
        _trainable(sweep),
        param_space={"algo": tune.grid_search(list(sweep.algos)),
                     "run_seed": tune.grid_search(list(sweep.run_seeds)),
                     "workload": tune.grid_search(list(sweep.workloads))},
        tune_config=tune.TuneConfig(max_concurrent_trials=sweep.max_concurrent_trials),
        run_config=tune.RunConfig(
            name=name, storage_path=str(storage), verbose=sweep.verbose,
            # Function trainables checkpoint themselves (tune.report); checkpoint_at_end
            # is for class trainables only.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            callbacks=[callback]),
    )
    (storage / name / SWEEP_FILE).write_text(sweep.model_dump_json(indent=1))  # Tuner made it
    return _finish(sweep, storage / name, tuner.fit(), callback)


def experiment_dir(ref: str | Path, storage_path: str | Path | None = None) -> Path:
    """A sweep's Tune experiment directory from its path, or its name under ``storage_path``."""
    path = Path(ref).expanduser()
    if not path.is_dir():
        path = Path(storage_path or SweepConfig.model_fields["storage_path"].default) / ref
    path = path.resolve()
    if not (path / SWEEP_FILE).is_file():
        raise ConfigError(f"--resume {ref}: {path} is not a cloudrl sweep directory (no "
                          f"{SWEEP_FILE}; sweeps started before resume existed lack it)")
    return path


def saved_sweep(exp: Path) -> SweepConfig:
    """The SweepConfig that ``run_sweep`` saved in experiment dir ``exp``."""
    try:
        return SweepConfig.model_validate_json((exp / SWEEP_FILE).read_text())
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(exp / SWEEP_FILE))) from None


def resume_sweep(ref: str | Path, storage_path: str | Path | None = None) -> dict[str, Any]:
    """Continue a sweep whose driver died (``ref``: see ``experiment_dir``); as run_sweep.

    ``Tuner.restore(..., resume_unfinished=True, resume_errored=True)``: finished trials are
    kept, unfinished and errored ones go on from their last checkpoints. Tune's failure count
    of a trial carries over: one that errored out after ``max_failures`` restarts is run once
    more, and a further failure ends it. The trials keep their MLflow runs; trials and
    heuristics whose evaluation is already logged are not evaluated again.
    """
    from ray import tune

    exp = experiment_dir(ref, storage_path)
    sweep = saved_sweep(exp)
    if not tune.Tuner.can_restore(exp):
        raise ConfigError(f"{exp}: no Tune experiment state to restore")
    _start_ray()
    tuner = tune.Tuner.restore(str(exp), trainable=_trainable(sweep),
                               resume_unfinished=True, resume_errored=True)
    # Tune drives the callback pickled with the experiment; this one only finds the runs.
    callback = MlflowTrialCallback(sweep, sweep_id=sweep.name or exp.name)
    return _finish(sweep, exp, tuner.fit(), callback)


def _finish(sweep: SweepConfig, exp: Path, grid: Any,
            callback: MlflowTrialCallback) -> dict[str, Any]:
    """After ``fit()``: evaluate each trial's final checkpoint, then the heuristics."""
    eval_dir = exp / "eval"
    learned, failed = [], []
    for result in grid:
        trial_id = (result.metrics or {}).get("trial_id")
        run_id = callback.run_id_for(trial_id) if trial_id is not None else None
        if result.error is not None or result.checkpoint is None or run_id is None:
            failed.append(trial_id or str(result.path))
            log.error("trial %s failed: %s", trial_id or result.path, result.error)
            continue
        learned.append(_evaluate_trial(sweep, result, run_id, callback.client, eval_dir))
    heuristics = _evaluate_heuristics(sweep, callback.sweep_id, callback.client,
                                      callback.experiment_id, eval_dir) if sweep.heuristics else []
    return {"sweep_id": callback.sweep_id, "tracking_uri": callback.client.tracking_uri,
            "experiment": sweep.experiment, "learned": learned, "heuristics": heuristics,
            "failed": failed, "experiment_dir": str(exp)}
