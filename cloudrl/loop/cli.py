"""Command line of the production loop: ``cloudrl loop register|retrain|rollout``,
``cloudrl backup`` and ``cloudrl restore``.

    cloudrl loop register results/checkpoints/ppo_poisson_n15_s0 --alias champion
    cloudrl loop retrain --feedback-db results/serve/state.db        # also under ray job submit
    cloudrl backup backups/2026-11-23 --feedback-db results/serve/state.db
    cloudrl restore backups/2026-11-23 --into restored/

Bad input is one line naming the flag (or field, or file) and exit code 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cloudrl.config_loader import ConfigError

TRACKING_HELP = ("MLflow tracking URI of the registry (default $MLFLOW_TRACKING_URI, else "
                 "sqlite:///$PWD/mlflow.db)")


def _positive(kind: type, low: float, high: float | None = None) -> Any:
    """An argparse type: a number in [low, high] (argparse names the flag on error)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value != value or value < low or (high is not None and value > high):
            bound = f"in [{low:g}, {high:g}]" if high is not None else f">= {low:g}"
            raise argparse.ArgumentTypeError(f"{text} is not {bound}")
        return value
    return parse


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


# ----------------------------------------------------------------------------- register


def _cmd_register(args: argparse.Namespace) -> int:
    from cloudrl.checkpoint_policy import is_checkpoint
    from cloudrl.loop import registry

    path = Path(args.checkpoint)
    if not path.is_dir():
        raise ConfigError(f"checkpoint {path}: not a directory")
    name = args.name or (registry.REWARD_MODEL if args.reward_model else registry.POLICY_MODEL)
    if not args.reward_model and not is_checkpoint(path):
        raise ConfigError(f"checkpoint {path}: not a cloudrl checkpoint (no cloudrl.json); "
                          "--reward-model registers a reward-model directory")
    register = registry.register_reward_model if args.reward_model else registry.register_policy
    try:
        version = register(path, name=name, eval_table=args.eval_table or {},
                           lineage=args.lineage or {}, tracking_uri=args.tracking_uri,
                           aliases=tuple(args.alias or ()))
    except registry.RegistryError as e:
        raise ConfigError(str(e)) from None
    aliases = "".join(f" @{a}" for a in args.alias or ())
    print(f"models:/{name}/{version}{aliases}")
    return 0


# ----------------------------------------------------------------------------- retrain

RETRAIN_FLAGS = ("feedback_db", "tracking_uri", "out", "env_steps", "candidate", "val_seeds",
                 "eval_ticks", "tolerance", "recent_weight", "reward_epochs", "segment_length",
                 "min_new_pairs", "hparams", "seed", "mix")


def _cmd_retrain(args: argparse.Namespace) -> int:
    from cloudrl.config_loader import load_config
    from cloudrl.loop.retrain import RetrainConfig, retrain

    overrides = {k: getattr(args, k) for k in RETRAIN_FLAGS if getattr(args, k) is not None}
    cfg = load_config(RetrainConfig, args.config, overrides)
    result = retrain(cfg)
    summary = {k: v for k, v in result.as_dict().items() if k != "validation"}
    for role in ("champion", "candidate"):
        if role in result.validation:
            summary[f"{role}_reward_mean"] = result.validation[role]["reward_mean"]
    print(json.dumps(summary, default=str))
    return 0


def _add_retrain(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML of RetrainConfig fields (flags override it)")
    p.add_argument("--feedback-db", help="the service's feedback store (its state_db; "
                                         "default results/serve/state.db)")
    p.add_argument("--tracking-uri", help=TRACKING_HELP)
    p.add_argument("--out", help="work directory (default results/loop)")
    p.add_argument("--env-steps", type=_positive(int, 1),
                   help="policy fine-tuning budget in env steps (default 2000)")
    p.add_argument("--candidate", help="evaluate this checkpoint instead of fine-tuning")
    p.add_argument("--val-seeds", type=_positive(int, 1, 50),
                   help="validation seeds (default 5)")
    p.add_argument("--eval-ticks", type=_positive(int, 1),
                   help="ticks per validation episode (default 200)")
    p.add_argument("--tolerance", type=_positive(float, 0.0),
                   help="allowed drop of the mean validation reward (default 0)")
    p.add_argument("--recent-weight", type=_positive(float, 1e-9),
                   help="loss weight of a new pair relative to an old one (default 3)")
    p.add_argument("--reward-epochs", type=_positive(int, 1), help="(default 30)")
    p.add_argument("--segment-length", type=_positive(int, 1),
                   help="steps per pair side (default 8)")
    p.add_argument("--min-new-pairs", type=_positive(int, 1),
                   help="fewer usable new pairs: nothing to do (default 1)")
    p.add_argument("--mix", type=_positive(float, 0.0, 1.0),
                   help="1: learned reward only, 0: env reward (default 1)")
    p.add_argument("--hparams", type=_json_object,
                   help="algorithm hyperparameter overrides (JSON object)")
    p.add_argument("--seed", type=_positive(int, 0))
    p.set_defaults(func=_cmd_retrain)


# ----------------------------------------------------------------------------- backup


def _cmd_backup(args: argparse.Namespace) -> int:
    from cloudrl.loop.backup import BackupError, backup

    try:
        manifest = backup(args.dest, checkpoints=args.checkpoint or [],
                          replay=args.replay or [], feedback_db=args.feedback_db,
                          tracking_uri=args.tracking_uri, registry=not args.no_registry)
    except BackupError as e:
        raise ConfigError(str(e)) from None
    print(f"backup {args.dest}: {len(manifest['files'])} files, "
          f"{sum(f['size'] for f in manifest['files'])} bytes")
    return 0


def _cmd_restore(args: argparse.Namespace) -> int:
    from cloudrl.loop.backup import BackupError, restore

    try:
        out = restore(args.src, args.into)
    except BackupError as e:
        raise ConfigError(str(e)) from None
    print(f"restored {len(out['files'])} files into {args.into}")
    for line in out.get("next_steps", []):
        print(line)
    return 0


def register(sub: Any) -> None:
    """Add ``loop`` (register, retrain and, when present, rollout), ``backup``, ``restore``."""
    loop = sub.add_parser("loop", help="the production loop: registry, retrain, canary rollout")
    lsub = loop.add_subparsers(dest="loop_command", required=True)

    reg = lsub.add_parser("register", help="register a policy checkpoint (or a reward model) "
                                           "in the MLflow Model Registry")
    reg.add_argument("checkpoint", help="checkpoint directory")
    reg.add_argument("--reward-model", action="store_true",
                     help="a reward-model directory (registered as cloudrl-reward-model)")
    reg.add_argument("--name", help="registered model name (default cloudrl-policy, or "
                                    "cloudrl-reward-model with --reward-model)")
    reg.add_argument("--alias", action="append", help="alias to set, e.g. champion (repeat)")
    reg.add_argument("--eval-table", type=_json_object, help="evaluation table (JSON object)")
    reg.add_argument("--lineage", type=_json_object, help="training data lineage (JSON)")
    reg.add_argument("--tracking-uri", help=TRACKING_HELP)
    reg.set_defaults(func=_cmd_register)

    _add_retrain(lsub.add_parser(
        "retrain", help="new feedback -> reward model -> fine-tuned champion -> validation "
                        "-> challenger (only when no worse)"))
    try:
        from cloudrl.loop import rollout
    except ImportError:
        rollout = None  # type: ignore[assignment]
    if rollout is not None and hasattr(rollout, "add_arguments"):
        ro = lsub.add_parser("rollout", help="canary a policy in a running service and wait "
                                             "for its automatic promote / roll back")
        rollout.add_arguments(ro)
        ro.set_defaults(func=rollout.run)
    register_backup(sub)


def register_backup(sub: Any) -> None:
    """Add ``backup`` and ``restore``."""
    bk = sub.add_parser("backup", help="checkpoints, replay shards, the feedback database "
                                       "(online-consistent) and the MLflow registry, with a "
                                       "checksummed manifest")
    bk.add_argument("dest", help="directory or pyarrow.fs URI (file://, s3://, gs://...)")
    bk.add_argument("--checkpoint", action="append",
                    help="policy or reward-model directory to include (repeat)")
    bk.add_argument("--replay", action="append", help="replay shard directory (repeat)")
    bk.add_argument("--feedback-db", help="feedback SQLite database (the service's state_db)")
    bk.add_argument("--tracking-uri", help=TRACKING_HELP + "; a SQLite store is backed up "
                                                           "with its mlartifacts/")
    bk.add_argument("--no-registry", action="store_true", help="leave the registry out")
    bk.set_defaults(func=_cmd_backup)

    rs = sub.add_parser("restore", help="verify a backup's checksums and restore it")
    rs.add_argument("src", help="backup directory or pyarrow.fs URI")
    rs.add_argument("--into", required=True, help="directory to restore into (fresh)")
    rs.set_defaults(func=_cmd_restore)
