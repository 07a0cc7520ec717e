"""MLflow side of a sweep: one run per Tune trial, evaluations logged into runs.

Everything here takes plain values (a tracking URI, run names, tag and param dicts,
evaluation results) and knows nothing of the sweep that calls it:

* :class:`MlflowTrialCallback` runs on the Tune driver: it opens (or, for a restarted
  trial or a resumed sweep, finds again by its ``sweep_id`` / ``trial_id`` tags) one
  MLflow run per trial, named and tagged as the sweep described the trial's grid point
  beforehand (:class:`TrialRun`), and logs ``TRACKED_METRICS`` at ``step = env_steps``;
* :func:`log_evaluation` logs a finished evaluation into a run: ``test/<metric>_mean``
  and ``_ci95`` plus the per-episode CSV/JSON as artifacts;
* :func:`find_runs` and :func:`logged_test_metrics` let a resumed sweep skip what is
  already logged.

``cloudrl.sweep`` decides what to evaluate and calls these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune import Callback

from cloudrl import tracking
from cloudrl.metrics import METRICS

TRACKED_METRICS = ("env_steps", "episode_return_mean", "energy_kwh", "sla_violation_rate",
                   "toggles", "invalid_actions", "total_loss", "policy_loss", "vf_loss",
                   "entropy", "qf_loss", "cost_usd", "carbon_kg", "sla_lc",
                   "sla_batch")  # the keys training.flat_metrics() can return
TEST_METRIC_KEYS = tuple(f"test/{m}_{s}" for m in METRICS for s in ("mean", "ci95"))
# what a scenario sweep logs per policy (the scenario runner's per-episode metrics)
SCENARIO_TEST_METRICS = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "energy_kwh",
                         "carbon_kg", "sla_lc", "sla_batch")


def run_name(policy: str, workload: str, n_servers: int, run_seed: int | None = None) -> str:
    seed = f"-s{run_seed}" if run_seed is not None else ""
    return f"{policy}-{workload}-n{n_servers}{seed}"


@dataclass(frozen=True)
class TrialRun:
    """The MLflow run of one grid point: its name, tags and params."""

    name: str
    tags: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


class MlflowTrialCallback(Callback):
    """One MLflow run per Tune trial (on the driver); tracked metrics at step = env_steps.

    ``trial_runs`` maps a grid point, the values of ``grid_keys`` in the trial's config,
    to its :class:`TrialRun`.
    """

    def __init__(self, tracking_uri: str, experiment: str, sweep_id: str,
                 grid_keys: tuple[str, ...], trial_runs: Mapping[tuple, TrialRun]) -> None:
        self.tracking_uri, self.experiment, self.sweep_id = tracking_uri, experiment, sweep_id
        self.grid_keys, self.trial_runs = tuple(grid_keys), dict(trial_runs)
        self.run_ids: dict[str, str] = {}
        self._client: Any = None
        self._experiment_id: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the RunConfig (and its callbacks) into tuner.pkl; a client is not state.
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = tracking.make_client(self.tracking_uri)
        return self._client

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = tracking.get_or_create_experiment(self.client,
                                                                    self.experiment)
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
        planned = self.trial_runs[tuple(trial.config[k] for k in self.grid_keys)]
        run_id = tracking.start_run(self.client, self.experiment_id, planned.name,
                                    {**planned.tags, "sweep_id": self.sweep_id,
                                     "trial_id": trial.trial_id})
        tracking.log_params(self.client, run_id, planned.params)
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


def find_runs(client: Any, experiment_id: str, tags: Mapping[str, Any]) -> list:
    """Runs of the experiment carrying all ``tags`` (oldest first)."""
    flt = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
    return list(client.search_runs([experiment_id], filter_string=flt,
                                   order_by=["attributes.start_time ASC"]))


def logged_test_metrics(run: Any) -> dict[str, float] | None:
    """The run's ``test/*`` metrics when its evaluation was logged in full, else None."""
    logged = run.data.metrics
    return {k: logged[k] for k in TEST_METRIC_KEYS} if all(
        k in logged for k in TEST_METRIC_KEYS) else None


def log_evaluation(client: Any, run_id: str, results: list, out: Path, step: int,
                   eval_cfg: Any) -> dict[str, float]:
    """``test/<metric>_mean`` and ``_ci95`` of one policy's evaluation ``results`` (with
    ``eval_cfg``, its ``EvalConfig``), plus the per-episode CSV/JSON written to ``out``."""
    from cloudrl.evaluate import summary_rows, write_results

    (row,) = summary_rows(results)
    metrics = {f"test/{m}_{s}": row[f"{m}_{s}"] for m in METRICS for s in ("mean", "ci95")}
    tracking.log_metrics(client, run_id, metrics, step=step)
    paths = write_results(results, [row], out, eval_cfg)
    tracking.log_artifacts(client, run_id, paths, artifact_path="eval")
    return metrics


def log_scenario_evaluation(client: Any, run_id: str, per_seed: list[dict[str, float]],
                            step: int) -> dict[str, float]:
    """``test/<metric>_mean`` and ``_ci95`` (half-width of the 95% t-interval) of one
    policy's per-seed scenario metrics (``SCENARIO_TEST_METRICS``) into a run."""
    from cloudrl.metrics import summarize

    metrics: dict[str, float] = {}
    for m in SCENARIO_TEST_METRICS:
        s = summarize([float(r[m]) for r in per_seed])
        metrics[f"test/{m}_mean"], metrics[f"test/{m}_ci95"] = s.mean, s.ci95
    tracking.log_metrics(client, run_id, metrics, step=step)
    return metrics
