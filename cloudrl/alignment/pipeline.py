"""The alignment pipeline: record -> pairs -> bc -> reward -> train, each phase an MLflow run.

``cloudrl align reward|train|pipeline --config experiments/configs/align.yaml`` (the
``record``, ``pairs`` and ``bc`` commands are in :mod:`cloudrl.alignment.cli`):

* ``reward``: phase 2, :func:`cloudrl.alignment.reward_model.train_reward_model` on the
  ``reward:`` section; the trained ``reward_model.pt`` (+ history, calibration) is copied to
  ``train.reward_model`` so phase 3 finds it;
* ``train``: phase 3, :func:`cloudrl.alignment.phase3.train_phase3` on the ``train:``
  section; the checkpoint is a normal cloudrl training checkpoint (``cloudrl evaluate
  --checkpoint``, ``cloudrl serve``), evaluated on ``pipeline.eval_seeds`` test seeds;
* ``pipeline``: the five phases in order, in one MLflow experiment
  (``pipeline.experiment``): one parent run ``pipeline`` and each phase a run nested
  under it (tag ``mlflow.parentRunId``) and tagged ``cloudrl.pipeline=<parent id>``.
  Artifacts: the reward model's calibration plot and history (phase 2's run), the
  phase-3 ``phase3.json``/``requery.json`` and evaluation table.

Every phase reads its inputs from the paths of the previous one's outputs as the config
gives them (``record.out`` = ``pairs.episodes`` = ``bc.demos`` ...); the pipeline checks
those links before anything runs, so a mismatch is one line naming the fields.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PHASES = ("record", "pairs", "bc", "reward", "train")


class PipelineConfig(BaseModel):
    """The ``pipeline:`` section: where the runs go and how phase 3 is evaluated."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    experiment: str = "cloudrl-align"
    tracking_uri: str | None = None
    eval_seeds: int = Field(10, ge=1, le=50, description="test seeds for the phase-3 policy")
    eval_workers: int = Field(1, ge=1, le=64)
    skip: list[str] = Field(default_factory=list, description=f"phases to skip, of {PHASES}")


# ----------------------------------------------------------------------------- phases


def _client(cfg: Any):
    from cloudrl import tracking

    client = tracking.make_client(cfg.pipeline.tracking_uri)
    return client, tracking.get_or_create_experiment(client, cfg.pipeline.experiment)


def _run(cfg: Any, name: str, parent: str | None, params: dict[str, Any]) -> tuple[Any, str]:
    from cloudrl import tracking

    client, exp = _client(cfg)
    tags = {"phase": name, "cloudrl.kind": "align"}
    if parent:
        tags |= {"mlflow.parentRunId": parent, "cloudrl.pipeline": parent}
    run_id = tracking.start_run(client, exp, name, tags)
    tracking.log_params(client, run_id, params)
    return client, run_id


def _adopt(cfg: Any, run_id: str | None, parent: str | None) -> None:
    """Nest a run a phase function logged itself under the pipeline's parent run."""
    if run_id and parent:
        client, _ = _client(cfg)
        client.set_tag(run_id, "mlflow.parentRunId", parent)
        client.set_tag(run_id, "cloudrl.pipeline", parent)


def run_record(cfg: Any, parent: str | None = None) -> dict[str, Any]:
    from cloudrl import tracking
    from cloudrl.recording import record_episodes

    rec = cfg.record
    client, run_id = _run(cfg, "record", parent, rec.model_dump())
    out = []
    for policy in rec.policies:
        s = record_episodes(policy, rec.out, env_config=cfg.env, interface=rec.interface,
                            episodes=rec.episodes, max_steps=rec.max_steps,
                            episodes_per_file=rec.episodes_per_file)
        out.append({"policy": s.policy, "episodes": len(s.seeds), "env_steps": s.env_steps,
                    "mean_return": sum(s.returns) / len(s.returns)})
        tracking.log_metrics(client, run_id, {f"{s.policy}/mean_return": out[-1]["mean_return"],
                                              f"{s.policy}/env_steps": s.env_steps})
    tracking.end_run(client, run_id)
    return {"out": rec.out, "recorded": out, "mlflow_run": run_id}


def run_pairs(cfg: Any, parent: str | None = None) -> dict[str, Any]:
    from cloudrl import tracking
    from cloudrl.alignment.teacher import make_teacher_pairs

    p = cfg.pairs
    client, run_id = _run(cfg, "pairs", parent, {**p.model_dump(), **{
        f"teacher.{k}": v for k, v in cfg.teacher.model_dump().items()}})
    s = make_teacher_pairs(p.episodes, p.n_pairs, p.segment_length, p.seed, p.out,
                           config=cfg.teacher)
    tracking.log_metrics(client, run_id, {"pairs": s.n_pairs, "flipped": s.flipped,
                                          **{f"label_{k}": v for k, v in s.labels.items()},
                                          **{f"decided_by/{k}": v
                                             for k, v in s.decided_by.items()}})
    tracking.end_run(client, run_id)
    return {"out": p.out, "pairs": s.n_pairs, "mlflow_run": run_id}


def run_bc(cfg: Any, parent: str | None = None) -> dict[str, Any]:
    from cloudrl.alignment.bc import train_bc

    bc = cfg.bc.model_copy(update={"experiment": cfg.pipeline.experiment,
                                   "tracking_uri": cfg.pipeline.tracking_uri})
    res = train_bc(bc)
    _adopt(cfg, res.run_id, parent)
    return {"out": str(res.out), "final": res.final, "mlflow_run": res.run_id}


def run_reward(cfg: Any, parent: str | None = None) -> dict[str, Any]:
    """Phase 2, its output copied to ``train.reward_model``."""
    from cloudrl.alignment.reward_model import (
        CALIBRATION_FILE,
        CHECKPOINT_FILE,
        HISTORY_FILE,
        train_reward_model,
    )

    rm = cfg.reward.model_copy(update={"experiment": cfg.pipeline.experiment,
                                       "tracking_uri": cfg.pipeline.tracking_uri})
    res = train_reward_model(rm)
    out = Path(cfg.train.reward_model)
    out.mkdir(parents=True, exist_ok=True)
    for name in (CHECKPOINT_FILE, HISTORY_FILE, CALIBRATION_FILE):
        shutil.copy2(res.checkpoint_dir / name, out / name)
    _adopt(cfg, res.run_id, parent)
    return {"out": str(out), "final": res.final, "zero": res.zero, "mlflow_run": res.run_id}


def evaluate_checkpoint(checkpoint: str | Path, env: Any, n_seeds: int, workers: int = 1,
                        interface: str = "flat") -> dict[str, Any]:
    """The checkpoint on the first ``n_seeds`` test seeds: ``cloudrl evaluate``'s summary row."""
    from cloudrl.evaluate import EvalConfig, evaluate, summary_rows

    ecfg = EvalConfig(env=env, interface=interface, policies=[str(checkpoint)],
                      n_seeds=n_seeds, workers=workers)
    return summary_rows(evaluate(ecfg, progress=False))[0]


def run_train(cfg: Any, parent: str | None = None) -> dict[str, Any]:
    """Phase 3 + its evaluation on test seeds, one MLflow run."""
    from cloudrl import tracking
    from cloudrl.algorithms.specs import spec_of
    from cloudrl.alignment.phase3 import PHASE3_META, train_phase3

    t = cfg.train
    client, run_id = _run(cfg, "train", parent, t.model_dump())
    with tracking.finishing(client, run_id):
        res = train_phase3(t, cfg.env, cfg.teacher, on_iteration=lambda it, m: (
            tracking.log_metrics(client, run_id, m, step=it)))
        for r in res.requeries:
            tracking.log_metrics(client, run_id, {
                "requery/labels_used": r["labels_used"], "requery/pairs_total": r["pairs_total"],
                "requery/finetune_loss": r["finetune_loss"]}, step=int(r["iteration"]))
        row = evaluate_checkpoint(res.checkpoint, cfg.env, cfg.pipeline.eval_seeds,
                                  cfg.pipeline.eval_workers, spec_of(t.algo).interface)
        tracking.log_metrics(client, run_id, {f"test/{k}": v for k, v in row.items()
                                              if isinstance(v, int | float)})
        with tempfile.TemporaryDirectory() as tmp:
            table = Path(tmp) / "evaluation.json"
            table.write_text(json.dumps(row, indent=1, default=str))
            files = [table, res.checkpoint / PHASE3_META]
            rq = Path(t.out).resolve() / "requery" / "requery.json"
            tracking.log_artifacts(client, run_id, files + ([rq] if rq.is_file() else []),
                                   "phase3")
    return {"checkpoint": str(res.checkpoint), "iterations": len(res.history),
            "env_steps": res.history[-1]["env_steps"] if res.history else 0,
            "labels_requeried": sum(r["new_pairs"] for r in res.requeries),
            "test_episode_reward": row.get("episode_reward_mean"), "mlflow_run": run_id}


RUNNERS = {"record": run_record, "pairs": run_pairs, "bc": run_bc, "reward": run_reward,
           "train": run_train}


def check_links(cfg: Any) -> None:
    """One ValueError naming the fields when a phase's input is not the previous output."""
    def same(a: str | None, b: str | None) -> bool:
        return a is not None and b is not None and Path(a).resolve() == Path(b).resolve()

    links = [("record.out", cfg.record.out, "pairs.episodes", cfg.pairs.episodes),
             ("record.out", cfg.record.out, "bc.demos", cfg.bc.demos),
             ("pairs.out", cfg.pairs.out, "reward.data", cfg.reward.data),
             ("pairs.out", cfg.pairs.out, "train.pairs", cfg.train.pairs),
             ("bc.out", cfg.bc.out, "train.bc_module", cfg.train.bc_module or cfg.bc.out)]
    for src, a, dst, b in links:
        if not same(a, b):
            raise ValueError(f"{dst}: {b} is not {src} ({a}); the pipeline feeds each "
                             "phase the previous one's output")
    if cfg.bc.interface != cfg.record.interface:
        raise ValueError(f"bc.interface: {cfg.bc.interface} differs from record.interface "
                         f"{cfg.record.interface}")
    from cloudrl.algorithms.specs import spec_of

    if spec_of(cfg.train.algo).interface != cfg.record.interface:
        raise ValueError(f"train.algo: {cfg.train.algo} acts on the "
                         f"{spec_of(cfg.train.algo).interface} interface, the demonstrations "
                         f"are {cfg.record.interface} (record.interface)")
    if cfg.bc.hidden != cfg.train.hidden:
        raise ValueError(f"train.hidden: {cfg.train.hidden} differs from bc.hidden "
                         f"{cfg.bc.hidden}")
    unknown = [p for p in cfg.pipeline.skip if p not in PHASES]
    if unknown:
        raise ValueError(f"pipeline.skip: unknown phase {unknown[0]!r}; phases are {PHASES}")


def run_pipeline(cfg: Any) -> dict[str, Any]:
    """All phases in order under one parent MLflow run; returns each phase's summary."""
    from cloudrl import tracking

    check_links(cfg)
    client, parent = _run(cfg, "pipeline", None, {"phases": ",".join(PHASES),
                                                  "skip": ",".join(cfg.pipeline.skip)})
    out: dict[str, Any] = {"mlflow_run": parent}
    with tracking.finishing(client, parent):
        for phase in PHASES:
            if phase not in cfg.pipeline.skip:
                out[phase] = RUNNERS[phase](cfg, parent)
    return out


# ----------------------------------------------------------------------------- CLI


def _main(fn: Any, args: argparse.Namespace, overrides: dict[str, Any], prefix: str,
          check: Any = None) -> int:
    from cloudrl.config_loader import ConfigError
    from cloudrl.ray_utils import init_ray

    cfg = args.load_config(args, overrides)  # cli's AlignConfig loader (flags, env, YAML)
    try:
        if check is not None:  # before Ray starts
            check(cfg)
        init_ray()
        result = fn(cfg)
    except ValueError as e:  # PairDataError, bad paths, config links
        raise ConfigError(f"{prefix}{e}") from None
    print(json.dumps(result, default=str))
    return 0


def _cmd_reward(args: argparse.Namespace) -> int:
    sec = {k: v for k in ("data", "epochs", "num_workers") if (v := getattr(args, k)) is not None}
    return _main(run_reward, args, {"reward": sec} if sec else {}, "reward: ")


def _cmd_train(args: argparse.Namespace) -> int:
    sec = {k: v for k in ("algo", "env_steps", "mix", "anchor_coeff", "out")
           if (v := getattr(args, k)) is not None}
    return _main(run_train, args, {"train": sec} if sec else {}, "train: ")


def _cmd_pipeline(args: argparse.Namespace) -> int:
    return _main(run_pipeline, args, {}, "", check_links)


def register_commands(sub: Any, common: Any, load_config: Any) -> None:
    """``align reward|train|pipeline`` on the ``align`` subparsers (``common`` adds
    ``--config``, ``--n-servers``, ``--episode-length``; ``load_config(args, overrides)``
    returns the AlignConfig)."""
    rw = sub.add_parser("reward", help="phase 2: reward model on Ray Train + DeepSpeed ZeRO-2 "
                                       "(the reward: section)")
    common(rw)
    rw.add_argument("--data", help="pair dataset directory (default results/align/pairs)")
    rw.add_argument("--epochs", type=int, help="training epochs")
    rw.add_argument("--num-workers", type=int, help="Ray Train workers")
    rw.set_defaults(load_config=load_config, func=_cmd_reward)

    tr = sub.add_parser("train", help="phase 3: policy on the learned reward with an anchor to "
                                      "the phase-1 policy (the train: section)")
    common(tr)
    tr.add_argument("--algo", choices=("ppo", "appo", "bdq"), help="default ppo")
    tr.add_argument("--env-steps", type=int, help="env-step budget")
    tr.add_argument("--mix", type=float, help="learned-reward weight in [0, 1] (1: replace)")
    tr.add_argument("--anchor-coeff", type=float, help="KL/margin anchor weight (0: off)")
    tr.add_argument("--out", help="checkpoint directory (default results/align/policy)")
    tr.set_defaults(load_config=load_config, func=_cmd_train)

    pl = sub.add_parser("pipeline", help="record -> pairs -> bc -> reward -> train, each "
                                         "phase an MLflow run under one parent")
    common(pl)
    pl.set_defaults(load_config=load_config, func=_cmd_pipeline)
