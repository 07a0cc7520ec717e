"""Tune the non-learned controllers of a scenario on validation seeds (never test seeds).

Random search (seeded, with the defaults as the first point) over the signal-aware rule's
knobs and, separately, the MPC's; every candidate is played on the same validation seeds
and the one with the lowest mean cost wins. Both families get the same treatment, so the
headroom between them is not an artefact of tuning one and not the other.

The candidates run as Ray Tune trials, the project's tuning machinery (as ``cloudrl
tune-heuristic`` and ``cloudrl sweep``): the seeded list of points (the defaults, then the
random points, then for the rule its run-at-once-like corner) is a grid over point
indices, so trial ``i`` is point ``i``; one trial plays its point on every validation seed
in one process and reports the mean cost (``cost_usd``, the objective, minimised) and the
mean of every cost term. At most ``workers`` trials run at once. Each episode is
deterministic given its seed, so the same arguments give the same costs and the same
choice however the trials are scheduled (ties go to the earlier point).

Ray: a running Ray (the caller's, or ``RAY_ADDRESS``'s cluster) is reused; otherwise
:func:`tune` starts a local one with ``workers`` CPUs and shuts it down when done. Tune's
console output is off, and ``print`` is left as it was found. Tune's experiment directory
goes to ``storage_path`` when given, else to a temporary directory removed afterwards.
With a ``tracking_uri``, the search is one MLflow run and every trial a nested run under
it (off by default).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.heuristics.signal_aware import SignalAwareConfig
from cloudrl.mpc.forecast_mpc import MPCConfig
from cloudrl.protocol import validation_seeds
from cloudrl.scenarios.runner import ControllerSpec, run_controllers
from envs.scenario.config import ScenarioConfig

# the signal-aware rule's point closest to running everything at once (always "cheap")
RUN_AT_ONCE_LIKE = {"quantile": 1.0, "window_hours": 24.0, "release_util": 1.0,
                    "ready_margin": 0.6, "guard_hours": 0.0}
OBJECTIVE = "cost_usd"
EXPERIMENT = "cloudrl-scenario-tune"
# while Tune runs (only where unset): cloudrl's quiet settings (no console reporter box)
# and no tqdm patch of ``print`` by Ray's driver
QUIET_TUNE_ENV = {"RAY_TQDM_PATCH_PRINT": "0"}


# The ready margin's range per menu: "narrow" is the baselines' historical search range;
# "wide" is the learned policy's own (FINE_READY_MARGINS: -0.5 to 1.0), so every controller
# can act through the same action set.
MENUS = {"narrow": (0.0, 0.6), "wide": (-0.5, 1.0)}
KINDS = ("signal_aware", "deadline_aware", "mpc")


def _margin(rng: np.random.Generator, menu: str) -> float:
    if menu not in MENUS:
        raise ValueError(f"tune: menu must be one of {sorted(MENUS)}, got {menu!r}")
    lo, hi = MENUS[menu]
    return float(rng.uniform(lo, hi))


def heuristic_space(rng: np.random.Generator, menu: str = "narrow") -> dict[str, Any]:
    return {"quantile": float(rng.uniform(0.05, 0.7)),
            "window_hours": float(rng.choice([3.0, 6.0, 12.0, 18.0, 24.0])),
            "release_util": float(rng.uniform(0.5, 1.0)),
            "ready_margin": _margin(rng, menu),
            "guard_hours": float(rng.choice([0.0, 1.0, 2.0, 4.0]))}


def deadline_space(rng: np.random.Generator, menu: str = "narrow") -> dict[str, Any]:
    """The signal-aware knobs plus the release-by-deadline guard's."""
    return {**heuristic_space(rng, menu), "slack_k": float(rng.uniform(0.0, 4.0)),
            "wait_factor": float(rng.uniform(0.0, 3.0))}


def mpc_space(rng: np.random.Generator, menu: str = "narrow") -> dict[str, Any]:
    return {"max_util": float(rng.uniform(0.6, 0.95)),
            "ready_hedge": _margin(rng, menu)}


@dataclass
class TuneResult:
    kind: str
    params: dict[str, Any]
    mean_cost: float
    default_cost: float
    n_seeds: int
    n_samples: int
    trials: list[tuple[dict[str, Any], float]]
    storage_path: str | None = None  # Tune's experiment directory, when it was kept
    mlflow_run_id: str | None = None  # the parent run, when logged


def search_points(kind: str, n_samples: int, seed: int = 0,
                  menu: str = "narrow") -> list[dict[str, Any]]:
    """The points :func:`tune` evaluates, in trial order: the defaults, ``n_samples - 1``
    seeded random points over ``menu``'s ready margins (:data:`MENUS`) and, for the
    rules (when searching at all), the run-at-once-like corner."""
    if kind == "signal_aware":
        default, space = asdict(SignalAwareConfig()), heuristic_space
    elif kind == "deadline_aware":
        from cloudrl.heuristics.deadline_aware import DeadlineAwareConfig

        default, space = asdict(DeadlineAwareConfig()), deadline_space
    elif kind == "mpc":
        default, space = {k: v for k, v in asdict(MPCConfig()).items()
                          if k not in ("horizon_hours", "carbon_weight")}, mpc_space
    else:
        raise ValueError(f"tune: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    rng = np.random.default_rng(seed)
    points = [default] + [space(rng, menu) for _ in range(max(n_samples - 1, 0))]
    if kind != "mpc" and n_samples > 1:  # the rule may also choose not to defer
        corner = dict(RUN_AT_ONCE_LIKE)
        if kind == "deadline_aware":
            corner.update(slack_k=0.0, wait_factor=0.0)
        points.append(corner)
    return points


def evaluate_point(cfg: ScenarioConfig, kind: str, params: dict[str, Any],
                   seeds: list[int]) -> dict[str, float]:
    """Mean over ``seeds`` of every metric of one controller, played in this process."""
    (per_seed,) = run_controllers(cfg, [ControllerSpec(kind, params)], list(seeds), workers=1)
    return {k: float(np.mean([m[k] for m in per_seed])) for k in per_seed[0]}


def _trial(config: dict[str, Any], cfg: ScenarioConfig, kind: str,
           points: list[dict[str, Any]], seeds: list[int]) -> None:
    from ray import tune

    means = evaluate_point(cfg, kind, points[config["point"]], seeds)
    tune.report({OBJECTIVE: means[OBJECTIVE], "validation": means})


@contextlib.contextmanager
def _quiet_tune() -> Iterator[None]:
    """Tune's console reporter and Ray's ``print`` patch off for the block; the
    environment and ``builtins.print`` as they were afterwards."""
    from cloudrl.quiet import QUIET_ENV, quiet_library_logs

    quiet_library_logs()
    env = {**QUIET_ENV, **QUIET_TUNE_ENV}
    added = [k for k in env if k not in os.environ]
    for key in added:
        os.environ[key] = env[key]
    printer = builtins.print
    try:
        yield
    finally:
        builtins.print = printer
        for key in added:
            os.environ.pop(key, None)


@contextlib.contextmanager
def _ray(num_cpus: int) -> Iterator[None]:
    """A running Ray as it is; else a local one (``init_ray``'s) started and shut down here."""
    import ray

    if ray.is_initialized():
        yield
        return
    from cloudrl.ray_utils import init_ray

    init_ray(num_cpus)
    try:
        yield
    finally:
        ray.shutdown()


def _storage(path: str | Path | None) -> contextlib.AbstractContextManager[str]:
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        return contextlib.nullcontext(str(Path(path).resolve()))
    return tempfile.TemporaryDirectory(prefix="cloudrl_scenario_tune_")


def _mlflow_trials(client: Any, experiment_id: str, parent_id: str, tags: dict[str, Any],
                   points: list[dict[str, Any]]) -> Any:
    """A Tune callback (Ray imported inside): one nested MLflow run per trial, with its
    point's parameters and its mean metrics on the validation seeds."""
    from ray.tune import Callback

    from cloudrl import tracking

    class MlflowTrials(Callback):
        def _run(self, trial: Any) -> str:
            i = int(trial.config["point"])
            run_id = tracking.start_run(client, experiment_id, f"point-{i}",
                                        {**tags, "mlflow.parentRunId": parent_id,
                                         "trial_id": trial.trial_id})
            tracking.log_params(client, run_id, {"point": i, **points[i]})
            return run_id

        def on_trial_complete(self, iteration: int, trials: list, trial: Any,
                              **info: Any) -> None:
            run_id = self._run(trial)
            means = (trial.last_result or {}).get("validation", {})
            tracking.log_metrics(client, run_id, {f"validation/{k}": v
                                                  for k, v in means.items()})
            tracking.end_run(client, run_id)

        def on_trial_error(self, iteration: int, trials: list, trial: Any,
                           **info: Any) -> None:
            tracking.end_run(client, self._run(trial), "FAILED")

    return MlflowTrials()


def tune(cfg: ScenarioConfig, kind: str, n_samples: int = 16, n_seeds: int = 10,
         seed: int = 0, workers: int | None = None, *, menu: str = "narrow",
         storage_path: str | Path | None = None,
         tracking_uri: str | None = None, experiment: str = EXPERIMENT,
         parent_run_id: str | None = None) -> TuneResult:
    """Best parameters of ``kind`` (:data:`KINDS`) on ``n_seeds`` validation seeds over
    ``menu``'s ready margins,
    searched with Ray Tune (see the module docstring); ``storage_path`` keeps Tune's
    experiment directory, ``tracking_uri`` logs the search to MLflow (nested under
    ``parent_run_id`` when given)."""
    points = search_points(kind, n_samples, seed, menu)
    seeds = list(validation_seeds(n_seeds))
    concurrent = max(1, min(workers or os.cpu_count() or 1, len(points)))
    name = (f"scenario-tune-{cfg.name}-{kind}-{time.strftime('%Y%m%d-%H%M%S')}-"
            f"{uuid.uuid4().hex[:6]}")
    tags = {"phase": "scenario_tune", "scenario": cfg.name, "kind": kind, "menu": menu}
    client = exp_id = run_id = None
    if tracking_uri is not None:
        from cloudrl import tracking

        client = tracking.make_client(tracking_uri)
        exp_id = tracking.get_or_create_experiment(client, experiment)
        run_id = tracking.start_run(client, exp_id, name, {
            **tags, **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})})
    try:
        with _quiet_tune(), _ray(concurrent), _storage(storage_path) as storage:
            costs, metrics = _search(cfg, kind, points, seeds, concurrent, name, storage,
                                     (client, exp_id, run_id, tags) if client else None)
    except BaseException:
        if client is not None:
            tracking.end_run(client, run_id, "FAILED")
        raise
    best = int(np.argmin(costs))
    result = TuneResult(kind, points[best], costs[best], costs[0], n_seeds, len(points),
                        list(zip(points, costs, strict=True)),
                        str(Path(storage_path).resolve() / name) if storage_path else None,
                        run_id)
    if client is not None:
        tracking.log_params(client, run_id, {
            "scenario": cfg.name, "kind": kind, "n_samples": len(points), "n_seeds": n_seeds,
            "search_seed": seed, "objective": f"validation/{OBJECTIVE} (min)",
            **{f"best.{k}": v for k, v in result.params.items()}})
        tracking.log_metrics(client, run_id, {
            **{f"best/validation/{k}": v for k, v in metrics[best].items()},
            **{f"default/validation/{k}": v for k, v in metrics[0].items()}})
        tracking.end_run(client, run_id)
    return result


def _search(cfg: ScenarioConfig, kind: str, points: list[dict[str, Any]], seeds: list[int],
            concurrent: int, name: str, storage: str,
            mlflow: tuple[Any, str, str, dict[str, Any]] | None
            ) -> tuple[list[float], list[dict[str, float]]]:
    """Mean cost and mean metrics of every point, in point order, from one Tune run. A
    trial reports ``cost_usd`` (the objective) and ``validation``: the mean over the seeds
    of every metric of an episode (each cost term, energy, SLA violations, decision times)."""
    from ray import tune as rtune

    callbacks = [_mlflow_trials(*mlflow, points)] if mlflow is not None else []
    trainable = rtune.with_resources(
        rtune.with_parameters(_trial, cfg=cfg, kind=kind, points=points, seeds=seeds),
        {"cpu": 1})
    tuner = rtune.Tuner(
        trainable, param_space={"point": rtune.grid_search(list(range(len(points))))},
        tune_config=rtune.TuneConfig(metric=OBJECTIVE, mode="min", num_samples=1,
                                     max_concurrent_trials=concurrent, reuse_actors=True),
        run_config=rtune.RunConfig(name=name, storage_path=storage, verbose=0,
                                   callbacks=callbacks))
    grid = tuner.fit()
    by_point: dict[int, dict[str, float]] = {}
    for r in grid:
        if r.error is not None or OBJECTIVE not in (r.metrics or {}):
            i = (r.config or {}).get("point")
            where = f"point {i} {points[i]}" if i is not None else "a trial"
            raise RuntimeError(f"scenario tuning ({kind}): {where} failed: {r.error}")
        by_point[int(r.config["point"])] = dict(r.metrics["validation"])
    metrics = [by_point[i] for i in range(len(points))]
    return [m[OBJECTIVE] for m in metrics], metrics
