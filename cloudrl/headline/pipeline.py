"""``cloudrl headline``: the whole headline experiment, per workload, in one command.

1. **Tune** ``power_aware`` on the train seeds (``cloudrl.headline.tuning``), or reuse
   the JSON a previous run wrote (``--reuse``).
2. **Train** ``train.algo`` (any row of ``ALGORITHMS``) on the train seeds with
   ``cloudrl.training.train``, checkpointing every ``checkpoint_every`` iterations; each
   checkpoint is kept as a candidate (``candidates/iter_<k>``), the final one too. A
   ``"heuristic": "tuned"`` value in ``train.hparams`` becomes the tuned parameters.
3. **Select** on the validation seeds: the candidate with the best mean reward among
   those with no more violations than the tuned heuristic there; if none qualifies,
   the best mean reward overall (``selection.constrained`` says which).
4. **Test** on the test seeds, touched only here: the baselines, the tuned heuristic,
   the selected checkpoint, and the clairvoyant bound per seed; paired differences vs
   the tuned heuristic and the share of its gap to the bound closed
   (``cloudrl.headline.report``).

Everything goes to ``<out_dir>/<name>-<time>/`` (``table.md``/``.csv``, ``rows.json``,
``headline.json`` with every episode, ``pareto.png``, ``learning_curves.png``) and to
MLflow: one parent run, a nested run per workload, the tuning sweep nested under it.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloudrl import tracking
from cloudrl.checkpoint_policy import is_checkpoint
from cloudrl.evaluate import EvalConfig, evaluate
from cloudrl.headline import report
from cloudrl.headline.config import HeadlineConfig, resolved_hparams
from cloudrl.headline.tuning import (
    TUNED_FILE,
    TunedHeuristic,
    TuneHeuristicConfig,
    load_tuned,
    matches,
    tune_heuristic,
    tuned_path,
)
from cloudrl.lower_bound import episode_bounds
from cloudrl.metrics import EpisodeMetrics, summarize
from cloudrl.protocol import seeds_for
from envs.env_config import EnvConfig

Log = Callable[[str], None]


def _by_policy(results: list[EpisodeMetrics], names: list[str]) -> dict[str, list]:
    """Episodes grouped per entry of ``names`` (``evaluate`` keeps the policies' order)."""
    groups: dict[str, list[EpisodeMetrics]] = {}
    for r in results:
        groups.setdefault(r.policy, []).append(r)
    if len(groups) != len(names):
        raise RuntimeError(f"expected {len(names)} policies in the evaluation, got "
                           f"{list(groups)}")
    return dict(zip(names, groups.values(), strict=True))


def _evaluate(cfg: HeadlineConfig, env: EnvConfig, policies: list[str], split: str,
              n_seeds: int, tuned: TunedHeuristic) -> dict[str, list[EpisodeMetrics]]:
    ev = EvalConfig(env=env, interface=cfg.interface, policies=policies, split=split,
                    n_seeds=n_seeds, workers=cfg.eval_workers,
                    heuristic_params={tuned.heuristic: tuned.params})
    return _by_policy(evaluate(ev, progress=False), ev.policies)


def _tuned(cfg: HeadlineConfig, env: EnvConfig, wl: str, run_dir: Path, reuse: bool,
           parent: str, log: Log) -> TunedHeuristic:
    path = tuned_path(cfg.out_dir, wl, cfg.n_servers, cfg.interface, cfg.episode_length)
    tuned = load_tuned(path) if reuse and path.is_file() else None
    if tuned is not None and matches(tuned, env, cfg.interface):
        log(f"[{wl}] reusing tuned heuristic {path}")
    else:
        log(f"[{wl}] tuning power_aware: {cfg.tune.num_samples} trials x "
            f"{cfg.tune.n_seeds} train seeds")
        tuned = tune_heuristic(TuneHeuristicConfig(
            env=env, interface=cfg.interface, num_samples=cfg.tune.num_samples,
            n_seeds=cfg.tune.n_seeds, max_concurrent_trials=cfg.tune.max_concurrent_trials,
            confirm_seeds=cfg.tune.confirm_seeds,
            experiment=cfg.experiment, tracking_uri=cfg.tracking_uri, parent_run_id=parent,
            storage_path=str(Path(cfg.out_dir) / "tune")), path)
    if tuned.source == "default":
        log(f"[{wl}] tuned heuristic = the defaults (no trial beat them on the train seeds "
            "and then on the validation seeds)")
    shutil.copy(path, run_dir / TUNED_FILE)
    return tuned


class _Candidates:
    """Keeps every periodic checkpoint ``train`` writes (it overwrites one directory)."""

    def __init__(self, live: Path, keep: Path, every: int) -> None:
        self.live, self.keep, self.every = live, keep, every
        self.saved: list[tuple[Path, int]] = []  # (candidate dir, env steps)
        self.steps: dict[int, int] = {}

    def __call__(self, it: int, metrics: dict[str, float]) -> None:
        self.steps[it] = int(metrics["env_steps"])
        last = it - 1  # train() saves iteration k after calling on_iteration(k)
        if last > 0 and last % self.every == 0 and is_checkpoint(self.live):
            self.add(f"iter_{last:05d}", self.steps[last])

    def add(self, name: str, env_steps: int) -> None:
        dest = self.keep / name
        shutil.copytree(self.live, dest, dirs_exist_ok=True)
        self.saved.append((dest, env_steps))


def _train(cfg: HeadlineConfig, env: EnvConfig, tuned: TunedHeuristic, wl_dir: Path,
           client: Any, run_id: str, log: Log) -> tuple[_Candidates, list[dict], float]:
    from cloudrl.training import TrainConfig, train

    t = cfg.train
    train_cfg = TrainConfig(
        algo=t.algo, env=env, env_steps=t.env_steps,
        hparams=resolved_hparams(t.hparams, tuned.params),
        num_env_runners=t.num_env_runners, num_learners=t.num_learners,
        num_gpus_per_learner=t.num_gpus_per_learner, run_seed=t.run_seed,
        checkpoint_dir=str((wl_dir / "checkpoint").resolve()),
        checkpoint_every=t.checkpoint_every)
    tracking.log_params(client, run_id, {"train": train_cfg.model_dump(
        mode="json", exclude={"env"})})
    candidates = _Candidates(Path(train_cfg.checkpoint_dir), wl_dir / "candidates",
                             t.checkpoint_every)

    def on_iteration(it: int, m: dict[str, float]) -> None:
        candidates(it, m)
        tracking.log_metrics(client, run_id, {f"train/{k}": v for k, v in m.items()},
                             step=int(m["env_steps"]))
        if it % 10 == 1 and "episode_return_mean" in m:
            log(f"  iter {it:4d}  env_steps {int(m['env_steps']):8d}  return "
                f"{m['episode_return_mean']:9.2f}  ({m['wall_s']:.0f} s)")

    log(f"[{env.workload.kind}] training {t.algo} for {t.env_steps} env steps on the train "
        f"seeds")
    path, history = train(train_cfg, on_iteration=on_iteration)
    candidates.add("final", int(history[-1]["env_steps"]) if history else 0)
    return candidates, history, train_cfg.reward_scale


def _select(cfg: HeadlineConfig, env: EnvConfig, tuned: TunedHeuristic,
            candidates: _Candidates, client: Any, run_id: str, log: Log) -> dict[str, Any]:
    """Validation-seed scores of the candidates and the tuned heuristic; the chosen one."""
    paths = [str(p.resolve()) for p, _ in candidates.saved]
    eps = _evaluate(cfg, env, [*paths, tuned.name], "validation", cfg.validation_seeds, tuned)
    scores = []
    for (p, steps), name in zip(candidates.saved, paths, strict=True):
        r = summarize([e.episode_reward for e in eps[name]])
        v = summarize([e.sla_violation_rate for e in eps[name]])
        scores.append({"checkpoint": name, "candidate": p.name, "env_steps": steps,
                       "reward_mean": r.mean, "reward_ci95": r.ci95,
                       "sla_violation_rate_mean": v.mean})
        tracking.log_metrics(client, run_id, {"validation/reward_mean": r.mean,
                                              "validation/sla_violation_rate_mean": v.mean},
                             step=steps)
    ref = eps[tuned.name]
    ref_reward = summarize([e.episode_reward for e in ref]).mean
    ref_viol = summarize([e.sla_violation_rate for e in ref]).mean
    ok = [s for s in scores if s["sla_violation_rate_mean"] <= ref_viol]
    best = max(ok or scores, key=lambda s: s["reward_mean"])
    note = "" if ok else " [no candidate met the violation constraint]"
    log(f"  selected {best['candidate']} (validation reward {best['reward_mean']:.1f}, "
        f"viol. {100 * best['sla_violation_rate_mean']:.3f}%; tuned heuristic "
        f"{ref_reward:.1f}, {100 * ref_viol:.3f}%){note}")
    return {"scores": scores, "selected": best, "constrained": bool(ok),
            "tuned_reward_mean": ref_reward, "tuned_sla_violation_rate_mean": ref_viol}


def run_workload(cfg: HeadlineConfig, wl: str, run_dir: Path, reuse: bool, client: Any,
                 exp_id: str, parent: str, log: Log) -> dict[str, Any]:
    """Tune, train, select, test on one workload; returns its rows and every episode."""
    env = EnvConfig.model_validate(cfg.env(wl))
    wl_dir = run_dir / wl
    wl_dir.mkdir(parents=True, exist_ok=True)
    run_id = tracking.start_run(client, exp_id, f"{cfg.name}-{wl}",
                                {"mlflow.parentRunId": parent, "workload": wl,
                                 "phase": "headline_workload"})
    with tracking.finishing(client, run_id):
        tuned = _tuned(cfg, env, wl, wl_dir, reuse, run_id, log)
        candidates, history, reward_scale = _train(cfg, env, tuned, wl_dir, client, run_id,
                                                   log)
        selection = _select(cfg, env, tuned, candidates, client, run_id, log)
        learned = selection["selected"]["checkpoint"]
        log(f"[{wl}] test: {cfg.test_seeds} seeds")
        names = [*cfg.baselines, tuned.name, learned]
        eps = _evaluate(cfg, env, names, "test", cfg.test_seeds, tuned)
        label = f"{cfg.train.algo}:{Path(learned).name}"  # the selected candidate
        eps = {label if k == learned else k: v for k, v in eps.items()}
        seeds = seeds_for("test", cfg.test_seeds)
        bounds = episode_bounds(env, seeds)
        rows = report.policy_rows(eps, [b.energy_kwh for b in bounds],
                                  cfg.violation_margin_pp, cfg.gap_goal, learned=label,
                                  offered_kwh=[b.offered_kwh for b in bounds])
        for r in rows:
            key = re.sub(r"[^\w\-.:/ ]", "_", r["policy"])
            tracking.log_metrics(client, run_id, {
                f"test/{key}/{k}": v for k, v in r.items()
                if isinstance(v, float | int) and not isinstance(v, bool)})
        (wl_dir / "episodes.json").write_text(json.dumps({
            "episodes": {k: [e.as_dict() for e in v] for k, v in eps.items()},
            "bounds": [b.as_dict() for b in bounds]}, indent=1))
        tracking.log_artifacts(client, run_id, [wl_dir / "episodes.json",
                                                wl_dir / TUNED_FILE])
    return {"rows": rows, "tuned": tuned.model_dump(mode="json"), "selection": selection,
            "curve": {"history": history, "validation": selection["scores"],
                      "reward_scale": reward_scale,
                      "tuned_validation_reward": selection["tuned_reward_mean"]},
            "title": f"{wl}, N={cfg.n_servers}, {cfg.interface} interface, "
                     f"{cfg.test_seeds} test seeds, {cfg.episode_length} ticks"}


def _timed(log: Log) -> Log:
    start = time.perf_counter()
    return lambda msg: log(f"[{time.perf_counter() - start:6.0f} s] {msg}")


def run_headline(cfg: HeadlineConfig, reuse: bool = False, log: Log = print
                 ) -> dict[str, Any]:
    """The whole experiment; returns ``{"run_dir", "rows", "goal", "paths", "run_id"}``."""
    from cloudrl.ray_utils import init_ray

    log = _timed(log)
    init_ray()
    run_dir = Path(cfg.out_dir) / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
    client = tracking.make_client(cfg.tracking_uri)
    exp_id = tracking.get_or_create_experiment(client, cfg.experiment)
    parent = tracking.start_run(client, exp_id, run_dir.name, {"phase": "headline"})
    start = time.perf_counter()
    with tracking.finishing(client, parent):
        tracking.log_params(client, parent, cfg.model_dump(mode="json"))
        results = {wl: run_workload(cfg, wl, run_dir, reuse, client, exp_id, parent, log)
                   for wl in cfg.workloads}
        per_wl = {wl: r["rows"] for wl, r in results.items()}
        verdict = report.goal_verdict(per_wl, cfg.gap_goal)
        paths = report.write_tables(per_wl, {wl: r["title"] for wl, r in results.items()},
                                    verdict, run_dir)
        paths.append(report.pareto_plot(per_wl, run_dir / "pareto.png"))
        paths.append(report.learning_curves({wl: r["curve"] for wl, r in results.items()},
                                            run_dir / "learning_curves.png"))
        wall = time.perf_counter() - start
        summary = run_dir / "headline.json"
        summary.write_text(json.dumps({
            "config": cfg.model_dump(mode="json"), "goal": verdict, "wall_s": wall,
            "workloads": {wl: {k: v for k, v in r.items() if k != "curve"}
                          for wl, r in results.items()}}, indent=1, default=float))
        paths.append(summary)
        tracking.log_metrics(client, parent, {"goal_met": float(verdict["met"]),
                                              "wall_s": wall})
        tracking.log_artifacts(client, parent, paths)
    return {"run_dir": run_dir, "rows": per_wl, "goal": verdict, "paths": paths,
            "run_id": parent, "results": results}
