"""MLflow side of a sweep: one run per Tune trial, test-seed evaluations logged into runs.

:class:`MlflowTrialCallback` runs on the Tune driver: it opens (or, for a restarted trial
or a resumed sweep, finds again by its ``sweep_id`` / ``trial_id`` tags) one MLflow run
per trial and logs ``TRACKED_METRICS`` at ``step = env_steps``. After ``Tuner.fit()``,
:func:`evaluate_trial` evaluates a trial's final checkpoint on the held-out test seeds
into its run and :func:`evaluate_heuristics` gives every heuristic a run of its own, so
``cloudrl compare`` reads everything back from one experiment. Runs that already carry
their test metrics (a resumed sweep) are not evaluated again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from cloudrl import tracking
from cloudrl.metrics import METRICS

if TYPE_CHECKING:
    from cloudrl.sweep import SweepConfig

TRACKED_METRICS = ("env_steps", "episode_return_mean", "energy_kwh", "sla_violation_rate",
                   "toggles", "invalid_actions", "total_loss", "policy_loss", "vf_loss",
                   "entropy", "qf_loss")  # the keys flat_metrics() can return

def trial_keys(config: dict[str, Any]) -> tuple[str, str, int]:
    return config["algo"], config["workload"], int(config["run_seed"])


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
        algo, workload, seed = trial_keys(trial.config)
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


def evaluate_heuristics(sweep: SweepConfig, sweep_id: str, client: Any, experiment_id: str,
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


def evaluate_trial(sweep: SweepConfig, result: Any, run_id: str, client: Any,
                    eval_dir: Path) -> dict[str, Any]:
    """Evaluate the trial's final checkpoint into its run (unless a resumed sweep did)."""
    from cloudrl.evaluate import EvalConfig, evaluate

    algo, workload, seed = trial_keys(result.config)
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
