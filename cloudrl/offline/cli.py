"""``cloudrl offline record|train|evaluate``: the offline constrained agent's commands.

* ``record``: a logged dataset (heuristics, ε-noised variants, checkpoints) on train
  seeds, on the flat or the branching interface (``--interface``), its summary printed
  and logged to MLflow (:mod:`.dataset`);
* ``train``: the CQL-Lagrangian learner (``--algo cql_lag``) or a baseline (``bc``,
  ``marwil``: RLlib's stock configs, flat datasets only) on it; checkpoint for
  ``cloudrl evaluate`` and ``cloudrl serve`` (:mod:`.train`);
* ``evaluate``: checkpoints and heuristics on the test seeds with normalised cost
  (:mod:`.evaluation`).

Every command takes ``--config experiments/configs/offline.yaml`` (an :class:`OfflineConfig`);
``CLOUDRL__TRAIN__ITERATIONS=50``-style variables and flags override it. Bad input -
a bad value, a malformed dataset file - is one line naming the field or file, exit 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cloudrl.config_loader import ConfigError, load_config
from cloudrl.data.offline import DatasetError
from cloudrl.offline.config import OfflineConfig


def _config(args: argparse.Namespace, overrides: dict[str, Any]) -> OfflineConfig:
    env: dict[str, Any] = {}
    if getattr(args, "n_servers", None) is not None:
        env["n_servers"] = args.n_servers
    if getattr(args, "workload", None) is not None:
        env["workload"] = {"kind": args.workload}
    if getattr(args, "episode_length", None) is not None:
        env["sim"] = {"episode_length": args.episode_length}
    if env:
        overrides = {**overrides, "env": env}
    if getattr(args, "no_mlflow", False):
        overrides = {**overrides, "mlflow": False}
    if getattr(args, "interface", None) is not None:
        overrides = {**overrides, "interface": args.interface}
    return load_config(OfflineConfig, getattr(args, "config", None), overrides)


def _section(args: argparse.Namespace, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


class _Tracker:
    """One MLflow run (or nothing when ``cfg.mlflow`` is off)."""

    def __init__(self, cfg: OfflineConfig, name: str, params: dict[str, Any]) -> None:
        self.client = self.run_id = None
        if cfg.mlflow:
            from cloudrl.tracking import log_params, open_run

            self.client, self.run_id = open_run(cfg.tracking_uri, cfg.experiment, name,
                                                {"phase": name})
            log_params(self.client, self.run_id, params)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.client is not None:
            from mlflow.entities import Metric

            items = [Metric(k.replace("+", "_"), float(v), 0, step) for k, v in metrics.items()]
            for i in range(0, len(items), 500):
                self.client.log_batch(self.run_id, metrics=items[i:i + 500])

    def end(self, status: str = "FINISHED") -> None:
        if self.client is not None:
            from cloudrl.tracking import end_run

            end_run(self.client, self.run_id, status)


def _cmd_record(args: argparse.Namespace) -> int:
    from cloudrl.offline.dataset import format_summary, record_dataset, summarize, summary_metrics

    sec = _section(args, ("episodes", "out"))
    if args.policy:
        sec["policies"] = args.policy
    if args.epsilon:
        sec["epsilons"] = args.epsilon
    cfg = _config(args, {"record": sec} if sec else {})
    rec = cfg.record
    try:
        record_dataset(rec.out, rec.policies, env_config=cfg.env, interface=cfg.interface,
                       episodes=rec.episodes,
                       epsilons=rec.epsilons, max_steps=rec.max_steps,
                       overload_weight=rec.overload_weight,
                       overload_threshold=rec.overload_threshold, noise_seed=rec.noise_seed)
        summary = summarize(_read(rec.out))
    except ValueError as e:
        raise ConfigError(f"record: {e}") from None
    print(format_summary(summary))
    tracker = _Tracker(cfg, "offline-record", {"record": rec.model_dump(mode="json"),
                                               "env": cfg.env.model_dump(mode="json")})
    tracker.log(0, summary_metrics(summary))
    tracker.end()
    return 0


def _read(path: str):
    from cloudrl.data.offline import read_dataset

    try:
        return read_dataset(path)
    except DatasetError as e:
        raise ConfigError(f"dataset: {e}") from None


def _cmd_train(args: argparse.Namespace) -> int:
    from cloudrl.offline.train import check_algo_interface, train

    sec = _section(args, ("algo", "data", "budget", "budget_fraction", "iterations", "out",
                          "cql_cost_alpha"))
    cfg = _config(args, {"train": sec} if sec else {})
    episodes = _read(cfg.train.data)  # a malformed file: one line naming it, first
    interface = episodes[0].custom_data.get("interface", "flat") if episodes else "flat"
    del episodes
    try:
        check_algo_interface(cfg.train.algo, interface)
    except ValueError as e:
        raise ConfigError(f"{e} ({cfg.train.data})") from None
    tracker = _Tracker(cfg, f"offline-train-{cfg.train.algo}",
                       {"train": cfg.train.model_dump(mode="json"),
                        "env": cfg.env.model_dump(mode="json")})

    def report(it: int, m: dict[str, float]) -> None:
        if it % max(1, cfg.train.iterations // 10) == 0 or it == cfg.train.iterations:
            shown = {k: round(v, 4) for k, v in m.items()
                     if k in ("lagrange", "cost_estimate", "cost_threshold", "loss")}
            print(json.dumps({"iteration": it, **shown}), flush=True)

    try:
        out, metrics, budget = train(cfg, on_iteration=report, tracker=tracker.log)
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end()
    print(json.dumps({"checkpoint": str(out), "budget": budget, **metrics}))
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from cloudrl.checkpoint_policy import read_meta
    from cloudrl.offline.evaluation import evaluate, format_rows

    sec = _section(args, ("budget", "n_seeds", "out"))
    if args.checkpoint:
        sec["checkpoints"] = args.checkpoint
    if args.policy:
        sec["policies"] = args.policy
    cfg = _config(args, {"evaluate": sec} if sec else {})
    ev = cfg.evaluate
    budget = ev.budget
    env = cfg.env
    interface = cfg.interface
    for ck in ev.checkpoints:
        try:
            meta = read_meta(ck)
        except (OSError, ValueError) as e:
            raise ConfigError(f"evaluate.checkpoints: {e}") from None
        budget = budget or meta.get("budget")
        interface = meta.get("interface", "flat")
        if not (args.n_servers or args.episode_length or args.workload):
            from envs.env_config import EnvConfig

            env = EnvConfig.model_validate(meta["env"])
    if budget is None:
        raise ConfigError("evaluate.budget: needed when no checkpoint carries one")
    try:
        rows = evaluate([*ev.checkpoints, *ev.policies], env, budget, ev.n_seeds,
                        interface=interface)
    except ValueError as e:
        raise ConfigError(f"evaluate: {e}") from None
    print(format_rows(rows, budget))
    Path(ev.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{ev.out}.json").write_text(json.dumps({"budget": budget, "rows": rows}, indent=1))
    tracker = _Tracker(cfg, "offline-evaluate", {"evaluate": ev.model_dump(mode="json")})
    for r in rows:
        tag = "".join(c if c.isalnum() or c in "_-." else "_" for c in r["policy"])
        tracker.log(0, {f"{tag}/{k}": float(r[k]) for k in ("reward", "cost",
                                                             "normalized_cost",
                                                             "within_budget")})
    tracker.end()
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """``cloudrl offline ...`` on the top-level parser's subparsers."""
    off = subparsers.add_parser("offline", help="offline constrained agent: record datasets, "
                                "train CQL-Lagrangian (or BC/MARWIL), evaluate")
    sub = off.add_subparsers(dest="offline_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="YAML", help="e.g. experiments/configs/offline.yaml")
        p.add_argument("--n-servers", type=int, help="fleet size (default 15)")
        p.add_argument("--workload", choices=("poisson", "google_v2_like"),
                       help="workload kind (default poisson)")
        p.add_argument("--episode-length", type=int, help="ticks per episode (default 1000)")
        p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
        p.add_argument("--interface", choices=("flat", "branching"),
                       help="record: the action interface (default flat); train follows the "
                       "dataset's, evaluate the checkpoints'")

    rec = sub.add_parser("record", help="record a dataset of behaviour policies on the train "
                         "seeds (RLlib offline episodes with a per-step cost)")
    common(rec)
    rec.add_argument("--policy", action="append", help="heuristic or checkpoint (repeatable)")
    rec.add_argument("--epsilon", action="append", type=float,
                     help="ε of an ε-random-valid variant (repeatable; 0: as is)")
    rec.add_argument("--episodes", type=int, help="episodes per (policy, ε)")
    rec.add_argument("--out", help="dataset directory (default: results/offline/data)")
    rec.set_defaults(func=_cmd_record)

    tr = sub.add_parser("train", help="train on a dataset; writes a checkpoint")
    common(tr)
    tr.add_argument("--algo", choices=("cql_lag", "bc", "marwil"), help="default cql_lag")
    tr.add_argument("--data", help="dataset directory")
    tr.add_argument("--budget", type=float, help="SLA violations per episode")
    tr.add_argument("--budget-fraction", type=float, help="multiplies the budget")
    tr.add_argument("--iterations", type=int, help="training iterations")
    tr.add_argument("--cql-cost-alpha", type=float, help="CQL on the cost head (ablation)")
    tr.add_argument("--out", help="checkpoint directory (default: results/offline/cql_lag)")
    tr.set_defaults(func=_cmd_train)

    ev = sub.add_parser("evaluate", help="checkpoints and heuristics on the test seeds, "
                        "with normalised cost")
    common(ev)
    ev.add_argument("--checkpoint", action="append", help="checkpoint dir (repeatable)")
    ev.add_argument("--policy", action="append", help="heuristic name (repeatable)")
    ev.add_argument("--budget", type=float, help="violations per episode (default: the "
                    "checkpoint's)")
    ev.add_argument("--n-seeds", type=int, help="test seeds")
    ev.add_argument("--out", help="output path stem (.json) (default: results/offline/eval)")
    ev.set_defaults(func=_cmd_evaluate)
    return off
