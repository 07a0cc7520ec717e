"""Phase 3 of preference alignment: train a policy on the learned reward (``cloudrl align train``).

:func:`train_phase3` runs cloudrl's ordinary training (:func:`cloudrl.training.train`, so
the checkpoint is a normal cloudrl checkpoint that ``cloudrl evaluate --checkpoint`` and
``cloudrl serve`` load) with :func:`configure_phase3` applied to the RLlib config:

* the learner connector :class:`~cloudrl.alignment.learned_reward.LearnedRewardConnector`
  (``config.learners(learner_connector=..., add_default_connectors_to_learner_pipeline=
  True)``), loaded from the phase-2 reward model and normalised over the pair set;
* the algorithm's anchored learner (its row's ``anchored_learner`` in
  :mod:`cloudrl.algorithms.specs`) with ``learner_config_dict["anchor"]``: the KL anchor
  to the phase-1 module (PPO/APPO) or the DQfD margin on the demonstrations (BDQ);
  ``anchor_coeff`` 0 is the plain algorithm;
* for replaying algorithms (BDQ), the replay buffer that keeps n-step intermediate
  observations (``LearnedRewardPrioritizedEpisodeReplayBuffer``, same module);
* with ``requery.every > 0`` the re-query callbacks (:mod:`cloudrl.alignment.requery`).

The policy starts from the phase-1 module (``init_from_bc``) when a BC state is given.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cloudrl.alignment.requery import HISTORY_FILE, Requery, RequeryConfig
from cloudrl.alignment.teacher import TeacherConfig
from cloudrl.training import TrainConfig
from envs.env_config import EnvConfig

PHASE3_META = "phase3.json"
REPLAY_BUFFER = "cloudrl.alignment.learned_reward.LearnedRewardPrioritizedEpisodeReplayBuffer"


class Phase3Config(BaseModel):
    """The ``train`` section of ``experiments/configs/align.yaml``: policy optimisation on the
    learned reward."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    algo: Literal["ppo", "appo", "bdq"] = "ppo"
    env_steps: int = Field(20_000, ge=1)
    reward_model: str = Field("results/align/reward",
                              description="phase-2 reward model (checkpoint dir or .pt)")
    pairs: str = Field("results/align/pairs", description="pair set: normalisation, "
                       "re-query base")
    mix: float = Field(1.0, ge=0.0, le=1.0, description="1: learned reward only; 0: env")
    target_std: float = Field(1.0, gt=0.0, description="std of the learned reward per step, "
                              "in raw env-reward units (times reward_scale)")
    bc_module: str | None = Field("results/align/bc", description="phase-1 RLModule state; "
                                  "None: no BC start, no KL anchor")
    init_from_bc: bool = Field(True, description="start the policy from bc_module")
    anchor_coeff: float = Field(0.0, ge=0.0, description="KL (PPO/APPO) or margin (BDQ) "
                                "anchor weight; 0: plain algorithm")
    anchor_demos: str = Field("results/align/demos", description="demonstrations (BDQ anchor)")
    anchor_batch: int = Field(64, ge=1)
    anchor_margin: float = Field(0.8, ge=0.0)
    requery: RequeryConfig = Field(default_factory=RequeryConfig)
    hparams: dict[str, Any] = Field(default_factory=dict)
    hidden: int = Field(128, ge=8)
    reward_scale: float = Field(0.01, gt=0.0)
    num_env_runners: int = Field(0, ge=0)
    envs_per_runner: int = Field(8, ge=1)
    run_seed: int = Field(0, ge=0)
    out: str = "results/align/policy"


@dataclass
class Phase3Result:
    """Where the checkpoint is, the per-iteration metrics and the re-queries."""

    checkpoint: Path
    history: list[dict[str, float]]
    requeries: list[dict[str, Any]] = field(default_factory=list)
    train_config: TrainConfig | None = None


def reward_checkpoint_file(path: str | Path) -> Path:
    """The ``reward_model.pt`` of a phase-2 output (its dir, a Ray Train checkpoint, the file)."""
    from cloudrl.alignment.reward_model import CHECKPOINT_FILE

    p = Path(path)
    if p.is_file():
        return p
    direct = p / CHECKPOINT_FILE
    if direct.is_file():
        return direct
    found = sorted(p.rglob(CHECKPOINT_FILE)) if p.is_dir() else []
    if not found:
        raise ValueError(f"reward_model: {path}: no {CHECKPOINT_FILE} (train one with "
                         "cloudrl align reward)")
    return found[-1]


def load_reward(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """The phase-2 ensemble and its spec."""
    import torch

    from models.reward_net import build_reward_ensemble

    payload = torch.load(reward_checkpoint_file(path), map_location="cpu", weights_only=True)
    model = build_reward_ensemble(payload["spec"])
    model.load_state_dict(payload["state_dict"])
    return model.eval(), dict(payload["spec"])


def train_config(cfg: Phase3Config, env: EnvConfig) -> TrainConfig:
    """The :class:`TrainConfig` of a phase-3 run (checkpoint dir ``cfg.out``)."""
    extra: dict[str, Any] = {}
    if cfg.init_from_bc and cfg.bc_module:
        extra["init_module_state"] = cfg.bc_module
    return TrainConfig(algo=cfg.algo, env=env, env_steps=cfg.env_steps,
                       num_env_runners=cfg.num_env_runners, envs_per_runner=cfg.envs_per_runner,
                       run_seed=cfg.run_seed, reward_scale=cfg.reward_scale, hidden=cfg.hidden,
                       hparams=cfg.hparams, checkpoint_dir=str(Path(cfg.out).resolve()), **extra)


def configure_phase3(config: Any, algo: str, *, reward: dict[str, Any], mix: float,
                     reward_scale: float, target_std: float, anchor: dict[str, Any],
                     requery: Requery | None = None, max_episodes: int = 64) -> None:
    """Apply phase 3 to an RLlib ``AlgorithmConfig`` of ``algo`` (see the module docstring)."""
    from cloudrl.algorithms.specs import load, spec_of
    from cloudrl.alignment.learned_reward import LearnedRewardConnector
    from cloudrl.alignment.requery import collector

    spec = spec_of(algo)
    if spec.anchored_learner is None:
        raise ValueError(f"algo: phase 3 is not implemented for {algo}")
    if getattr(config, "device_replay", False):
        raise ValueError("hparams.device_replay: phase 3 rewrites rewards in the learner "
                         "connector, which the device replay bypasses; use the episode replay")
    gamma = float(config.gamma)
    config.learners(
        learner_connector=lambda *a, **k: LearnedRewardConnector(
            reward=reward, mix=mix, reward_scale=reward_scale, target_std=target_std,
            gamma=gamma),
        add_default_connectors_to_learner_pipeline=True,
        learner_class=load(spec.anchored_learner),
        learner_config_dict={"anchor": dict(anchor)})
    buffer = getattr(config, "replay_buffer_config", None)
    if isinstance(buffer, dict) and "type" in buffer:
        kind = buffer["type"]
        name = kind if isinstance(kind, str) else kind.__name__
        if name.rsplit(".", 1)[-1] not in ("PrioritizedEpisodeReplayBuffer",
                                           "LearnedRewardPrioritizedEpisodeReplayBuffer"):
            raise ValueError(f"hparams.replay_buffer_config.type: phase 3 needs the "
                             f"prioritized episode replay, got {name}")
        # a string: RLlib tests the type's name for "EpisodeReplayBuffer"
        config.training(replay_buffer_config={**buffer, "type": REPLAY_BUFFER})
    if requery is not None:
        config.callbacks(on_sample_end=collector(max_episodes), on_train_result=requery)


def train_phase3(cfg: Phase3Config, env: EnvConfig, teacher: TeacherConfig | None = None,
                 on_iteration: Any = None) -> Phase3Result:
    """Phase 3: train ``cfg.algo`` on the learned reward; a normal cloudrl checkpoint."""
    from cloudrl.alignment.learned_reward import pair_reward_stats, reward_payload
    from cloudrl.data.pairs import read_pairs
    from cloudrl.training import train

    model, spec = load_reward(cfg.reward_model)
    pairs = read_pairs(cfg.pairs)
    mean, std = pair_reward_stats(model, pairs)
    payload = reward_payload(model, spec, mean, std)
    tcfg = train_config(cfg, env)
    anchor = {"coeff": cfg.anchor_coeff, "module": str(Path(cfg.bc_module).resolve())
              if cfg.bc_module else None, "demos": cfg.anchor_demos,
              "batch": cfg.anchor_batch, "margin": cfg.anchor_margin, "seed": cfg.run_seed}
    if cfg.anchor_coeff > 0 and cfg.algo != "bdq" and not cfg.bc_module:
        raise ValueError("train.bc_module: anchor_coeff > 0 anchors to the phase-1 module; "
                         "give its state dir")
    out = Path(cfg.out).resolve()
    requery = None
    if cfg.requery.every > 0:
        requery = Requery(cfg.requery, teacher or TeacherConfig(), model, spec, pairs,
                          out / "requery")
    ckpt, history = train(tcfg, on_iteration, configure=lambda c: configure_phase3(
        c, cfg.algo, reward=payload, mix=cfg.mix, reward_scale=cfg.reward_scale,
        target_std=cfg.target_std, anchor=anchor, requery=requery,
        max_episodes=cfg.requery.max_episodes))
    requeries = []
    rq_file = out / "requery" / HISTORY_FILE
    if rq_file.is_file():
        requeries = json.loads(rq_file.read_text())
    (ckpt / PHASE3_META).write_text(json.dumps({
        "reward_model": str(reward_checkpoint_file(cfg.reward_model).resolve()),
        "pairs": str(Path(cfg.pairs).resolve()), "mix": cfg.mix, "target_std": cfg.target_std,
        "reward_mean": mean, "reward_std": std, "anchor": anchor,
        "labels_requeried": sum(r["new_pairs"] for r in requeries),
        "final_env_steps": history[-1]["env_steps"] if history else math.nan}, indent=1))
    return Phase3Result(ckpt, history, requeries, tcfg)
