"""``cloudrl align ...``: the alignment pipeline's commands and its config (``AlignConfig``).

* ``cloudrl align record --policy power_aware --episodes 4 --out DIR``: demonstrations
  on the train seeds, in RLlib's offline episode format (:mod:`.recording`);
* ``cloudrl align pairs --episodes DIR --n-pairs 300 --out DIR``: teacher-labelled
  segment pairs (:mod:`.teacher`) as a pair dataset (:mod:`.preferences`);
* ``cloudrl align operator-pairs --db results/serve/state.db --out DIR``: the feedback
  store's operator pairs with inline trajectories, in the same schema
  (:func:`cloudrl.feedback.export_pairs`); ``cloudrl feedback export --format pairs`` is
  the same command;
* ``cloudrl align bc --demos DIR --interface flat --out DIR [--num-workers 2]``:
  behaviour cloning on Ray Train + Accelerate (:mod:`.bc`); ``--out`` holds an RLModule
  state that ``cloudrl train`` starts from with ``init_module_state``.

Every command takes ``--config experiments/configs/align.yaml`` (an :class:`AlignConfig`;
``CLOUDRL__RECORD__EPISODES=8``-style variables and flags override it). Bad input is
one line naming the field or file, exit code 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cloudrl.alignment.bc import BCConfig
from cloudrl.alignment.phase3 import Phase3Config
from cloudrl.alignment.pipeline import PipelineConfig, register_commands
from cloudrl.alignment.reward_model import RewardModelConfig
from cloudrl.alignment.teacher import TeacherConfig
from cloudrl.config_loader import ConfigError, load_config
from envs.env_config import EnvConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RecordConfig(_Strict):
    """Demonstrations: which policies, how many episodes each, where."""

    policies: list[str] = Field(default_factory=lambda: ["power_aware"], min_length=1,
                                description="heuristic names or checkpoint dirs")
    episodes: int = Field(4, ge=1, le=10_000, description="episodes per policy (train seeds)")
    interface: Literal["flat", "branching"] = "flat"
    max_steps: int | None = Field(None, ge=1, description="cut episodes after this many steps")
    episodes_per_file: int = Field(1, ge=1)
    out: str = "results/align/demos"


class PairsConfig(_Strict):
    """Teacher pairs cut from recorded episodes."""

    episodes: str = Field("results/align/demos", description="directory of recorded episodes")
    n_pairs: int = Field(300, ge=1)
    segment_length: int = Field(25, ge=1)
    seed: int = 0
    out: str = "results/align/pairs"


class OperatorPairsConfig(_Strict):
    """Operator pairs from the decision service's feedback store."""

    db: str = "results/serve/state.db"
    out: str = "results/align/operator_pairs"
    cut: Literal["head", "tail"] = "head"
    min_steps: int = Field(1, ge=1, description="skip trajectories shorter than this")


def _default_env() -> EnvConfig:
    return EnvConfig.model_validate({"n_servers": 15})


class AlignConfig(_Strict):
    """The alignment pipeline's config (``experiments/configs/align.yaml``); defaults run."""

    env: EnvConfig = Field(default_factory=_default_env)
    record: RecordConfig = Field(default_factory=RecordConfig)
    pairs: PairsConfig = Field(default_factory=PairsConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    operator: OperatorPairsConfig = Field(default_factory=OperatorPairsConfig)
    bc: BCConfig = Field(default_factory=BCConfig)
    reward: RewardModelConfig = Field(
        default_factory=lambda: RewardModelConfig(data="results/align/pairs"))
    train: Phase3Config = Field(default_factory=Phase3Config)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)


# ----------------------------------------------------------------------------- handlers


def _config(args: argparse.Namespace, overrides: dict[str, Any]) -> AlignConfig:
    """AlignConfig: defaults < --config YAML < CLOUDRL__* env vars < flags."""
    env: dict[str, Any] = {}
    if getattr(args, "n_servers", None) is not None:
        env["n_servers"] = args.n_servers
    if getattr(args, "episode_length", None) is not None:
        env["sim"] = {"episode_length": args.episode_length}
    if env:
        overrides = {**overrides, "env": env}
    return load_config(AlignConfig, getattr(args, "config", None), overrides)


def _set(section: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        section[key] = value


def _cmd_record(args: argparse.Namespace) -> int:
    from cloudrl.recording import record_episodes

    sec: dict[str, Any] = {}
    if args.policy:
        sec["policies"] = args.policy
    for key in ("episodes", "interface", "max_steps", "out"):
        _set(sec, key, getattr(args, key))
    cfg = _config(args, {"record": sec} if sec else {})
    rec = cfg.record
    out = []
    for policy in rec.policies:
        try:
            summary = record_episodes(policy, rec.out, env_config=cfg.env,
                                      interface=rec.interface, episodes=rec.episodes,
                                      max_steps=rec.max_steps,
                                      episodes_per_file=rec.episodes_per_file)
        except ValueError as e:
            raise ConfigError(f"record.policies: {policy}: {e}") from None
        out.append({"policy": summary.policy, "episodes": len(summary.seeds),
                    "env_steps": summary.env_steps,
                    "mean_return": sum(summary.returns) / len(summary.returns),
                    "files": len(summary.paths)})
    print(json.dumps({"out": rec.out, "recorded": out}))
    return 0


def _cmd_pairs(args: argparse.Namespace) -> int:
    from cloudrl.alignment.teacher import make_teacher_pairs

    sec: dict[str, Any] = {}
    for key in ("episodes", "n_pairs", "segment_length", "seed", "out"):
        _set(sec, key, getattr(args, key))
    cfg = _config(args, {"pairs": sec} if sec else {})
    p = cfg.pairs
    try:
        summary = make_teacher_pairs(p.episodes, p.n_pairs, p.segment_length, p.seed, p.out,
                                     config=cfg.teacher)
    except ValueError as e:  # PairDataError too
        raise ConfigError(f"pairs: {e}") from None
    print(json.dumps({"out": p.out, "pairs": summary.n_pairs,
                      "labels": {str(k): v for k, v in sorted(summary.labels.items())},
                      "decided_by": summary.decided_by, "flipped": summary.flipped,
                      "files": len(summary.paths)}))
    return 0


def cmd_operator_pairs(args: argparse.Namespace) -> int:
    """``cloudrl align operator-pairs`` and ``cloudrl feedback export --format pairs``."""
    from cloudrl.feedback import export_pairs

    sec: dict[str, Any] = {}
    for key in ("db", "out", "cut"):
        _set(sec, key, getattr(args, key, None))
    overrides: dict[str, Any] = {"operator": sec} if sec else {}
    if getattr(args, "segment_length", None) is not None:
        overrides["pairs"] = {"segment_length": args.segment_length}
    cfg = _config(args, overrides)
    op = cfg.operator
    try:
        result = export_pairs(op.db, op.out, env_config=cfg.env, interface=cfg.record.interface,
                              segment_length=cfg.pairs.segment_length, cut=op.cut,
                              min_steps=op.min_steps, teacher_config=cfg.teacher)
    except ValueError as e:
        raise ConfigError(f"operator: {e}") from None
    print(json.dumps(result.as_dict()))
    return 0


def _cmd_bc(args: argparse.Namespace) -> int:
    from cloudrl.alignment.bc import train_bc
    from cloudrl.ray_utils import init_ray

    sec: dict[str, Any] = {}
    for key in ("demos", "interface", "epochs", "batch_size", "lr", "num_workers", "seed",
                "out"):
        _set(sec, key, getattr(args, key))
    if args.no_mlflow:
        sec["mlflow"] = False
    cfg = load_config(AlignConfig, args.config, {"bc": sec} if sec else {}).bc
    if cfg.num_workers > 0:
        init_ray()
    try:
        result = train_bc(cfg)
    except ValueError as e:
        raise ConfigError(f"bc.{e}") from None
    print(json.dumps({"out": str(result.out), "interface": cfg.interface,
                      "samples": result.meta["samples"], "final": result.final,
                      "mlflow_run": result.run_id}))
    return 0


# ----------------------------------------------------------------------------- parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="AlignConfig file, e.g. "
                   "experiments/configs/align.yaml (CLOUDRL__* env vars and flags override)")
    p.add_argument("--n-servers", type=_positive, help="fleet size (env.n_servers)")
    p.add_argument("--episode-length", type=_positive, help="ticks per episode")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``align record|pairs|operator-pairs|bc`` to a CLI's subparsers."""
    align = subparsers.add_parser("align", help="preference alignment: demonstrations, "
                                                "teacher and operator pair datasets")
    sub = align.add_subparsers(dest="align_command", required=True)

    rec = sub.add_parser("record", help="record episodes of a policy on the train seeds "
                                        "(RLlib offline episode format)")
    _common(rec)
    rec.add_argument("--policy", action="append", help="heuristic name or checkpoint dir "
                     "(repeatable; default power_aware)")
    rec.add_argument("--episodes", type=_positive, help="episodes per policy (default 4)")
    rec.add_argument("--interface", choices=("flat", "branching"), help="default flat")
    rec.add_argument("--max-steps", type=_positive, help="cut episodes after this many steps")
    rec.add_argument("--out", help="output directory (default results/align/demos)")
    rec.set_defaults(func=_cmd_record)

    pairs = sub.add_parser("pairs", help="teacher-labelled segment pairs from recorded "
                                         "episodes")
    _common(pairs)
    pairs.add_argument("--episodes", help="directory of recorded episodes")
    pairs.add_argument("--n-pairs", type=_positive, help="pairs to write (default 300)")
    pairs.add_argument("--segment-length", type=_positive, help="steps per segment "
                       "(default 25)")
    pairs.add_argument("--seed", type=int, help="sampling and label-noise seed (default 0)")
    pairs.add_argument("--out", help="output directory (default results/align/pairs)")
    pairs.set_defaults(func=_cmd_pairs)

    op = sub.add_parser("operator-pairs", help="the feedback store's operator pairs as a pair "
                                               "dataset (same schema as teacher pairs)")
    _common(op)
    op.add_argument("--db", help="the service's state_db (default results/serve/state.db)")
    op.add_argument("--out", help="output directory (default results/align/operator_pairs)")
    op.add_argument("--segment-length", type=_positive, help="steps per segment (default 25)")
    op.add_argument("--cut", choices=("head", "tail"), help="which steps a longer trajectory "
                    "keeps (default head)")
    op.set_defaults(func=cmd_operator_pairs)

    bc = sub.add_parser("bc", help="behaviour cloning on the demonstrations (Ray Train + "
                                   "Accelerate); writes an RLModule state to start from")
    bc.add_argument("--config", metavar="YAML", help="AlignConfig file (its bc: section)")
    bc.add_argument("--demos", help="directory of recorded episodes (default "
                    "results/align/demos)")
    bc.add_argument("--interface", choices=("flat", "branching"), help="default flat")
    bc.add_argument("--epochs", type=_positive, help="default 10")
    bc.add_argument("--batch-size", type=_positive, help="global batch (default 256)")
    bc.add_argument("--lr", type=float, help="Adam step size (default 1e-3)")
    bc.add_argument("--num-workers", type=int, help="Ray Train workers (default 1; 0: "
                    "train in this process, without Ray)")
    bc.add_argument("--seed", type=int, help="init and batch order seed (default 0)")
    bc.add_argument("--out", help="output directory (default results/align/bc)")
    bc.add_argument("--no-mlflow", action="store_true", help="do not log an MLflow run")
    bc.set_defaults(func=_cmd_bc)
    register_commands(sub, _common, _config)  # reward, train, pipeline (.pipeline)
    return align
