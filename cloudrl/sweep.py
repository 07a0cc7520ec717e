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

Roles: this module is the Tune side (the grid, the trainable, run and resume) and
decides what gets evaluated; :mod:`cloudrl.sweep_tracking` is the MLflow side, which
takes plain values (run names, tags, params, evaluation results) and never calls back
here; :mod:`cloudrl.evaluate` runs the evaluations.

Scenarios: with ``scenario=NAME`` the grid is algos x run seeds on that named scenario
(``workloads`` and the cluster env settings are unused; the grid's ``workload`` key holds
the scenario's name); each trial trains on the scenario env (``TrainConfig.scenario``),
and after ``fit()`` the final checkpoints and the signal-aware heuristic are played on the
same test seeds by the evaluator the caller passes (``cloudrl sweep --scenario`` passes
``cloudrl.cli.compare_with_heuristic``), their ``test/<metric>_mean`` /
``_ci95`` logged as above (the heuristic: one run, ``policy=signal_aware``).

CLI: ``cloudrl sweep --config experiments/configs/sweep_small.yaml``;
``cloudrl sweep --resume <experiment dir, or its name under --storage-path>``;
``cloudrl sweep --scenario scarcity_spikes --algos dqn bdq --run-seeds 0 1``.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cloudrl import tracking
from cloudrl.algorithms.specs import Algo, hparams_by_algo, spec_of
from cloudrl.config_loader import ConfigError, deep_merge, format_validation_error
from cloudrl.protocol import N_SEEDS
from cloudrl.sweep_tracking import (
    MlflowTrialCallback,
    TrialRun,
    find_runs,
    log_evaluation,
    log_scenario_evaluation,
    logged_test_metrics,
    run_name,
)
from cloudrl.training import (
    SCENARIO_ALGOS,
    TrainConfig,
    build_algo_config,
    flat_metrics,
    write_meta,
)
from envs.env_config import EnvConfig

log = logging.getLogger(__name__)

SWEEP_FILE = "cloudrl_sweep.json"  # the SweepConfig, in the Tune experiment dir (for resume)
# Test-only fault injection, read by the driver: "<trial|driver>:<iteration>:<marker file>".
# See ``_inject_fault``.
FAULT_ENV = "CLOUDRL_SWEEP_TEST_FAULT"
# (scenario, {label: checkpoint dir}, seeds, heuristic params, workers) -> per-seed metrics
# of "heuristic" and of each label, paired by seed (the scenario runner's metric dicts)
ScenarioEvaluator = Callable[[str, dict[str, str], list[int], dict[str, Any], int],
                             dict[str, list[dict[str, float]]]]


class SweepConfig(BaseModel):
    """One sweep: the grid, the shared env and budget, evaluation and tracking."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    hparams: dict[Algo, dict[str, Any]] = Field(
        default_factory=dict, description="per algorithm, its typed hyperparameters")
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
    scenario: str | None = Field(
        default=None, description="a named scenario: algos x run seeds on it instead of "
        "workloads, evaluated against the signal-aware heuristic")
    scenario_heuristic: dict[str, Any] = Field(
        default_factory=dict, description="with scenario: the signal-aware heuristic's "
        "parameters (default: its defaults)")

    @model_validator(mode="after")
    def _scenario_fits(self) -> SweepConfig:
        if self.scenario is not None:
            from envs.scenario.catalog import load_scenario

            load_scenario(self.scenario)  # an unknown name lists the valid ones
            bad = [a for a in self.algos if a not in SCENARIO_ALGOS]
            if bad:
                raise ValueError(f"algos: {bad} do not train on a scenario; expected some "
                                 f"of {', '.join(SCENARIO_ALGOS)}")
        return self

    def grid_workloads(self) -> list[str]:
        """The grid's ``workload`` axis: the workloads, or the one scenario."""
        return [self.scenario] if self.scenario is not None else list(self.workloads)

    def trial_run_name(self, policy: str, workload: str, run_seed: int | None = None) -> str:
        """MLflow run name: ``<policy>-<workload>-n<N>[-s<seed>]``, on a scenario
        ``<policy>-<scenario>[-s<seed>]``."""
        if self.scenario is not None:
            return f"{policy}-{workload}" + (f"-s{run_seed}" if run_seed is not None else "")
        return run_name(policy, workload, self.n_servers, run_seed)

    def interfaces(self) -> list[str]:
        """The action interfaces the sweep's algorithms act on (heuristics run on each)."""
        return sorted({spec_of(a).interface for a in self.algos})

    @field_validator("hparams", mode="before")
    @classmethod
    def _typed_hparams(cls, hparams: Any) -> Any:
        """Each algorithm's hparams against its model: errors read ``hparams.dqn.lr``."""
        if not isinstance(hparams, dict):
            return hparams  # the field's own type check names it
        checked = hparams_by_algo().model_validate(hparams)
        return {algo: model.model_dump(mode="json", exclude_unset=True)
                for algo in hparams if (model := getattr(checked, algo)) is not None}

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
        if self.scenario is not None:
            return TrainConfig(algo=algo, scenario=self.scenario, env_steps=self.env_steps,
                               num_env_runners=self.num_env_runners, run_seed=run_seed,
                               hidden=self.hidden, hparams=dict(self.hparams.get(algo, {})),
                               scenario_heuristic=dict(self.scenario_heuristic))
        return TrainConfig(algo=algo, env=self.env_config(workload), env_steps=self.env_steps,
                           num_env_runners=self.num_env_runners, run_seed=run_seed,
                           hidden=self.hidden, hparams=dict(self.hparams.get(algo, {})))


GRID_KEYS = ("algo", "workload", "run_seed")  # a trial's grid point, in its Tune config


def trial_keys(config: dict[str, Any]) -> tuple[str, str, int]:
    """(algo, workload, run_seed) of a trial's Tune config."""
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
    """Build and validate every algorithm's RLlib config before Tune starts, so settings
    RLlib rejects (a minibatch larger than the batch, say) fail fast, by algorithm name."""
    for algo in sweep.algos:
        try:
            algo_config_for(sweep, sweep.train_config(algo, sweep.grid_workloads()[0],
                                                      sweep.run_seeds[0])).validate()
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
    cfg = sweep.train_config(*trial_keys(config))
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
            algo_config = algo_config_for(sweep, sweep.train_config(*trial_keys(config)))
            return algo_config.algo_class.default_resource_request(algo_config)
    return tune.with_resources(
        tune.with_parameters(sweep_trainable, sweep_config=sweep.model_dump(mode="json"),
                             fault=_fault_from_env()),
        resources)


def run_sweep(sweep: SweepConfig,
              evaluate_scenario: ScenarioEvaluator | None = None) -> dict[str, Any]:
    """Run the Tune sweep, evaluate every final checkpoint and the heuristics, log to MLflow.

    A scenario sweep needs ``evaluate_scenario`` (see :data:`ScenarioEvaluator`).

    Returns ``{"sweep_id", "tracking_uri", "experiment", "learned": [...], "heuristics": [...],
    "failed": [trial ids], "experiment_dir"}``; each row has the run id and the test metrics
    (learned rows also ``num_failures``, the trial's restarts).
    """
    from ray import tune

    if sweep.scenario is not None and evaluate_scenario is None:
        raise ConfigError("a scenario sweep needs an evaluator (evaluate_scenario=cloudrl.cli."
                          "compare_with_heuristic)")
    check_algo_configs(sweep)
    _start_ray()
    name = sweep.name or f"{sweep.experiment}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = Path(sweep.storage_path).resolve()
    # What resume_sweep reads back: the tracking URI and the paths pinned to absolute ones, so
    # a resume from another directory logs to the same store.
    sweep = sweep.model_copy(update={
        "name": name, "storage_path": str(storage),
        "tracking_uri": tracking.resolve_tracking_uri(sweep.tracking_uri)})
    callback = trial_callback(sweep, sweep_id=name)
    tuner = tune.Tuner(
        _trainable(sweep),
        param_space={"algo": tune.grid_search(list(sweep.algos)),
                     "run_seed": tune.grid_search(list(sweep.run_seeds)),
                     "workload": tune.grid_search(sweep.grid_workloads())},
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
    return _finish(sweep, storage / name, tuner.fit(), callback, evaluate_scenario)


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


def resume_sweep(ref: str | Path, storage_path: str | Path | None = None,
                 evaluate_scenario: ScenarioEvaluator | None = None) -> dict[str, Any]:
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
    if sweep.scenario is not None and evaluate_scenario is None:
        raise ConfigError("a scenario sweep needs an evaluator (evaluate_scenario=cloudrl.cli."
                          "compare_with_heuristic)")
    if not tune.Tuner.can_restore(exp):
        raise ConfigError(f"{exp}: no Tune experiment state to restore")
    _start_ray()
    tuner = tune.Tuner.restore(str(exp), trainable=_trainable(sweep),
                               resume_unfinished=True, resume_errored=True)
    # Tune drives the callback pickled with the experiment; this one only finds the runs.
    callback = trial_callback(sweep, sweep_id=sweep.name or exp.name)
    return _finish(sweep, exp, tuner.fit(), callback, evaluate_scenario)


def common_tags(sweep: SweepConfig, sweep_id: str, workload: str) -> dict[str, Any]:
    """Tags of every MLflow run of the sweep on ``workload`` (trials and heuristics)."""
    if sweep.scenario is not None:
        return {"sweep_id": sweep_id, "scenario": workload, "workload": workload,
                "eval_seeds": sweep.eval_seeds}
    env = sweep.env_config(workload)
    return {"sweep_id": sweep_id, "workload": workload, "n_servers": sweep.n_servers,
            "episode_length": env.sim.episode_length, "eval_seeds": sweep.eval_seeds}


def trial_callback(sweep: SweepConfig, sweep_id: str) -> MlflowTrialCallback:
    """The MLflow callback, told every grid point's run name, tags and params up front."""
    runs = {}
    for algo in sweep.algos:
        for workload in sweep.grid_workloads():
            for seed in sweep.run_seeds:
                cfg = sweep.train_config(algo, workload, seed)
                tags = {**common_tags(sweep, sweep_id, workload), "kind": "learned",
                        "policy": algo, "algo": algo, "run_seed": seed,
                        "interface": cfg.interface()}
                params = {**cfg.model_dump(mode="json", exclude={"checkpoint_dir"}),
                          "reporting": sweep.reporting, "env_runners": sweep.env_runners}
                runs[(algo, workload, seed)] = TrialRun(
                    sweep.trial_run_name(algo, workload, seed), tags, params)
    return MlflowTrialCallback(str(sweep.tracking_uri or tracking.resolve_tracking_uri()),
                               sweep.experiment, sweep_id, GRID_KEYS, runs)


def eval_config(sweep: SweepConfig, workload: str, interface: str,
                policies: list[str]) -> Any:
    """The test-seed evaluation of ``policies`` on one workload and interface."""
    from cloudrl.evaluate import EvalConfig

    return EvalConfig(env=sweep.env_config(workload), policies=policies, interface=interface,
                      n_seeds=sweep.eval_seeds, workers=sweep.eval_workers)


def evaluate_trial(sweep: SweepConfig, result: Any, run_id: str, client: Any,
                   eval_dir: Path) -> dict[str, Any]:
    """Evaluate the trial's final checkpoint into its run (unless a resumed sweep did)."""
    from cloudrl.evaluate import evaluate

    algo, workload, seed = trial_keys(result.config)
    ckpt = Path(result.checkpoint.path)
    step = int(result.metrics.get("env_steps", 0))
    run = client.get_run(run_id)
    row = {"run_id": run_id, "policy": algo, "workload": workload, "run_seed": seed,
           "checkpoint": str(ckpt), "env_steps": step,
           "num_failures": int(run.data.tags.get("num_failures", 0))}
    metrics = logged_test_metrics(run)
    if metrics is not None and run.data.tags.get("checkpoint") == str(ckpt):
        return {**row, **metrics}
    interface = sweep.train_config(algo, workload, seed).interface()
    cfg = eval_config(sweep, workload, interface, [str(ckpt)])
    results = evaluate(cfg, progress=sweep.verbose > 0)
    client.set_tag(run_id, "checkpoint", str(ckpt))
    metrics = log_evaluation(client, run_id, results, eval_dir / run_name(
        algo, workload, sweep.n_servers, seed), step, cfg)
    return {**row, **metrics}


def evaluate_heuristics(sweep: SweepConfig, sweep_id: str, client: Any, experiment_id: str,
                        eval_dir: Path) -> list[dict[str, Any]]:
    """Each heuristic on each workload and each interface the sweep's algorithms use, one
    MLflow run each; one already evaluated in this sweep (a resume) keeps its run."""
    from cloudrl.evaluate import evaluate

    rows = []
    for workload in sweep.workloads:
        for interface in sweep.interfaces():
            tags = {**common_tags(sweep, sweep_id, workload), "kind": "heuristic",
                    "interface": interface}
            runs, done = {}, {}
            for name in sweep.heuristics:
                found = find_runs(client, experiment_id, {
                    "sweep_id": sweep_id, "kind": "heuristic", "policy": name,
                    "workload": workload, "interface": interface})
                if found:
                    runs[name] = found[0].info.run_id
                    if (metrics := logged_test_metrics(found[0])) is not None:
                        done[name] = metrics
            todo = [n for n in sweep.heuristics if n not in done]
            cfg = eval_config(sweep, workload, interface, todo)
            results = evaluate(cfg, progress=sweep.verbose > 0) if todo else []
            for name in sweep.heuristics:
                if name not in done:
                    label = name if interface == "flat" else f"{name}-branching"
                    rn = run_name(label, workload, sweep.n_servers)
                    run_id = runs.get(name) or tracking.start_run(
                        client, experiment_id, rn, {**tags, "policy": name})
                    if name not in runs:
                        tracking.log_params(client, run_id,
                                            {"env": cfg.env.model_dump(mode="json")})
                    done[name] = log_evaluation(client, run_id,
                                                [r for r in results if r.policy == name],
                                                eval_dir / rn, 0, cfg)
                    tracking.end_run(client, run_id)
                    runs[name] = run_id
                rows.append({"run_id": runs[name], "policy": name, "workload": workload,
                             "interface": interface, **done[name]})
    return rows


def evaluate_scenario_trials(sweep: SweepConfig, trials: list[tuple[Any, str]],
                             callback: MlflowTrialCallback, evaluate: ScenarioEvaluator
                             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A scenario sweep's evaluation: every final checkpoint (``trials``: Tune result and
    run id) and the signal-aware heuristic on the same test seeds, in one call of
    ``evaluate``; logged into the trials' runs and one heuristic run (found again on a
    resume). Returns (learned rows, heuristic rows) as :func:`run_sweep`'s."""
    from cloudrl.protocol import test_seeds

    client, scenario = callback.client, str(sweep.scenario)
    checkpoints, rows = {}, []
    for result, run_id in trials:
        algo, _, seed = trial_keys(result.config)
        checkpoints[f"{algo}-s{seed}"] = str(Path(result.checkpoint.path))
        rows.append({"run_id": run_id, "policy": algo, "workload": scenario,
                     "scenario": scenario, "run_seed": seed,
                     "checkpoint": checkpoints[f"{algo}-s{seed}"],
                     "env_steps": int(result.metrics.get("env_steps", 0)),
                     "num_failures": int(client.get_run(run_id).data.tags.get(
                         "num_failures", 0))})
    per_seed = evaluate(scenario, checkpoints, list(test_seeds(sweep.eval_seeds)),
                        dict(sweep.scenario_heuristic), sweep.eval_workers)
    for row, label in zip(rows, checkpoints, strict=True):
        client.set_tag(row["run_id"], "checkpoint", row["checkpoint"])
        row.update(log_scenario_evaluation(client, row["run_id"], per_seed[label],
                                           row["env_steps"]))
    tags = {**common_tags(sweep, callback.sweep_id, scenario), "kind": "heuristic",
            "policy": "signal_aware"}
    found = find_runs(client, callback.experiment_id, tags)
    run_id = found[0].info.run_id if found else tracking.start_run(
        client, callback.experiment_id, sweep.trial_run_name("signal_aware", scenario), tags)
    if not found:
        tracking.log_params(client, run_id, {"signal_aware": sweep.scenario_heuristic})
    metrics = log_scenario_evaluation(client, run_id, per_seed["heuristic"], 0)
    tracking.end_run(client, run_id)
    return rows, [{"run_id": run_id, "policy": "signal_aware", "workload": scenario,
                   "scenario": scenario, **metrics}]


def _finish(sweep: SweepConfig, exp: Path, grid: Any, callback: MlflowTrialCallback,
            evaluate_scenario: ScenarioEvaluator | None = None) -> dict[str, Any]:
    """After ``fit()``: evaluate each trial's final checkpoint, then the heuristics."""
    eval_dir = exp / "eval"
    learned, failed, trained = [], [], []
    for result in grid:
        trial_id = (result.metrics or {}).get("trial_id")
        run_id = callback.run_id_for(trial_id) if trial_id is not None else None
        if result.error is not None or result.checkpoint is None or run_id is None:
            failed.append(trial_id or str(result.path))
            log.error("trial %s failed: %s", trial_id or result.path, result.error)
            continue
        trained.append((result, run_id))
    if sweep.scenario is not None:
        if evaluate_scenario is None:
            raise ConfigError("a scenario sweep needs an evaluator to finish")
        learned, heuristics = evaluate_scenario_trials(
            sweep, trained, callback, evaluate_scenario) if trained else ([], [])
        return {"sweep_id": callback.sweep_id, "tracking_uri": callback.client.tracking_uri,
                "experiment": sweep.experiment, "learned": learned,
                "heuristics": heuristics, "failed": failed, "experiment_dir": str(exp)}
    for result, run_id in trained:
        learned.append(evaluate_trial(sweep, result, run_id, callback.client, eval_dir))
    heuristics = evaluate_heuristics(sweep, callback.sweep_id, callback.client,
                                      callback.experiment_id, eval_dir) if sweep.heuristics else []
    return {"sweep_id": callback.sweep_id, "tracking_uri": callback.client.tracking_uri,
            "experiment": sweep.experiment, "learned": learned, "heuristics": heuristics,
            "failed": failed, "experiment_dir": str(exp)}
