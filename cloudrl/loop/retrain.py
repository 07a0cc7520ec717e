"""``cloudrl loop retrain``: new operator feedback -> reward model -> fine-tuned policy ->
validation -> a registered challenger, only when it is no worse than the champion.

One run:

1. **Feedback since the last run.** The watermark is the highest feedback row id an earlier
   run consumed: the tag ``loop.watermark`` of the latest FINISHED run of the MLflow
   experiment ``cloudrl-loop`` (so it lives in the registry's store and a failed run does not
   advance it). Rows with a larger id in the feedback store (``cloudrl.feedback``, the
   service's ``state_db``) are new; up to ``max_old_pairs`` older ones are replayed.
   Both become pair datasets through ``cloudrl.feedback.export_pairs`` on the champion's env
   and interface (operators judge trajectories of the served fleet).
2. **Reward model.** Drift is measured first: the accuracy of the current reward model
   (``models:/cloudrl-reward-model@champion``) on the new pairs. Then it is fine-tuned (a
   fresh net when there is none) with the Bradley-Terry loss on old + new pairs, each new
   pair weighted ``recent_weight`` times an old one; a held-out share of the new pairs
   scores old and new model. The new model is registered with its eval table and lineage
   (feedback row ids) and becomes the reward model's ``champion`` (the next run's base).
3. **Policy.** The champion policy (``models:/cloudrl-policy@champion``, a PPO/APPO/BDQ
   checkpoint) is fine-tuned for ``env_steps`` on the learned reward (phase 3 of the
   alignment pipeline, ``cloudrl.alignment.phase3.configure_phase3``; the module starts
   from the champion's weights). ``candidate`` skips this and takes a given checkpoint.
4. **Validation.** Champion and candidate run on the same ``val_seeds`` validation seeds
   (``cloudrl.protocol.validation_seeds``, episodes of ``eval_ticks`` ticks) with the true
   env reward. The candidate is registered with alias ``challenger`` only when its mean
   reward is no worse than the champion's: ``mean_candidate >= mean_champion - tolerance``.

The run is logged to ``cloudrl-loop`` (config, drift, accuracies, validation rewards, the
decision and its reason). Defaults take a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cloudrl import tracking
from cloudrl.config_loader import ConfigError
from cloudrl.loop import registry

EXPERIMENT = "cloudrl-loop"
WATERMARK_TAG = "loop.watermark"
KIND_TAG = "loop.kind"
FINE_TUNABLE = ("ppo", "appo", "bdq")  # algorithms phase 3 trains on the learned reward


class RetrainConfig(BaseModel):
    """One retrain run; every default runs in a few minutes on 2 cores."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    feedback_db: str = Field("results/serve/state.db", description="the service's state_db")
    tracking_uri: str | None = Field(None, description="MLflow store of the registry")
    out: str = Field("results/loop", description="work dir: pairs, models, checkpoints")
    policy_model: str = registry.POLICY_MODEL
    reward_model: str = registry.REWARD_MODEL
    # feedback -> pairs
    segment_length: int = Field(8, ge=1, description="steps per pair side (export_pairs)")
    min_new_pairs: int = Field(1, ge=1, description="fewer usable new pairs: nothing to do")
    max_old_pairs: int = Field(2000, ge=0, description="older rows replayed (most recent)")
    # reward model
    recent_weight: float = Field(3.0, gt=0.0, description="loss weight of a new pair vs an "
                                 "old one")
    reward_epochs: int = Field(30, ge=1)
    reward_lr: float = Field(1e-3, gt=0.0)
    reward_batch: int = Field(32, ge=1)
    heldout_fraction: float = Field(0.25, ge=0.0, lt=1.0,
                                    description="share of new pairs held out for scoring")
    # policy
    env_steps: int = Field(2000, ge=1, description="fine-tuning budget (env steps)")
    hparams: dict[str, Any] = Field(default_factory=dict, description="algorithm overrides")
    mix: float = Field(1.0, ge=0.0, le=1.0, description="1: learned reward only; 0: env")
    target_std: float = Field(1.0, gt=0.0)
    candidate: str | None = Field(None, description="evaluate this checkpoint instead of "
                                  "fine-tuning the champion")
    # validation
    val_seeds: int = Field(5, ge=1, le=50)
    eval_ticks: int = Field(200, ge=1, description="episode length of validation episodes")
    tolerance: float = Field(0.0, ge=0.0, description="allowed drop of mean validation reward")
    seed: int = Field(0, ge=0)


@dataclass
class RetrainResult:
    """What a run did; ``decision`` is ``registered``, ``rejected`` or ``no_new_feedback``."""

    decision: str
    reason: str
    watermark: int
    new_rows: list[int] = field(default_factory=list)
    pairs: dict[str, int] = field(default_factory=dict)
    reward: dict[str, float] = field(default_factory=dict)
    reward_version: int | None = None
    validation: dict[str, Any] = field(default_factory=dict)
    champion_version: int | None = None
    challenger_version: int | None = None
    candidate: str | None = None
    run_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- watermark


def watermark(tracking_uri: str | None = None) -> int:
    """The highest feedback row id a finished retrain run consumed (0: none yet)."""
    client = tracking.make_client(tracking_uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return 0
    runs = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`{KIND_TAG}` = 'retrain' and "
                                            "attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=20)
    marks = [int(r.data.tags[WATERMARK_TAG]) for r in runs if WATERMARK_TAG in r.data.tags]
    return max(marks, default=0)


def pending_feedback(db: str | Path, tracking_uri: str | None = None) -> int:
    """Feedback rows stored after the watermark (what the next retrain would read)."""
    if not Path(db).is_file():
        return 0
    conn = sqlite3.connect(f"file:{Path(db).resolve()}?mode=ro", uri=True, timeout=10)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM feedback WHERE id > ?",
                                (watermark(tracking_uri),)).fetchone()[0])
    finally:
        conn.close()


# ----------------------------------------------------------------------------- feedback


def _row_ids(db: Path) -> list[int]:
    conn = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True, timeout=10)
    try:
        return [int(r[0]) for r in conn.execute("SELECT id FROM feedback ORDER BY id")]
    except sqlite3.DatabaseError as e:
        raise ConfigError(f"--feedback-db {db}: not a feedback database ({e})") from None
    finally:
        conn.close()


def _subset_db(db: Path, ids: list[int], dst: Path) -> Path:
    """A copy of the feedback store holding only rows ``ids`` (their ids kept)."""
    from cloudrl.feedback import SCHEMA

    out = sqlite3.connect(str(dst))
    out.executescript(SCHEMA)
    out.execute("ATTACH DATABASE ? AS src", (f"file:{db.resolve()}?mode=ro",))
    if ids:
        out.execute(f"INSERT INTO feedback SELECT * FROM src.feedback WHERE id IN "
                    f"({','.join('?' * len(ids))})", ids)
    out.commit()
    out.execute("DETACH DATABASE src")
    out.close()
    return dst


def _export(db: Path, ids: list[int], out_dir: Path, env_config: Any, interface: str,
            segment_length: int) -> tuple[Any, dict[str, Any]]:
    """(PairArrays or None, export summary) of feedback rows ``ids``."""
    from cloudrl.data.pairs import read_pairs
    from cloudrl.feedback import export_pairs

    if not ids:
        return None, {"pairs": 0, "skipped": {}}
    with tempfile.TemporaryDirectory() as tmp:
        sub = _subset_db(db, ids, Path(tmp) / "subset.db")
        res = export_pairs(sub, out_dir, env_config=env_config, interface=interface,
                           segment_length=segment_length, cut="head")
    summary = {"pairs": res.written, "skipped": dict(res.skipped),
               "first_skip": dict(res.first_skip)}
    return (read_pairs(out_dir) if res.written else None), summary


# ----------------------------------------------------------------------------- reward model


def _accuracy(model: Any, pairs: Any, index: np.ndarray | None = None) -> float:
    from cloudrl.alignment.reward_model import member_gaps, preference_metrics

    index = np.arange(len(pairs)) if index is None else index
    if len(index) == 0:
        return math.nan
    gaps = member_gaps(model, pairs, index)
    return float(preference_metrics(gaps, pairs.label[index])[0]["val_accuracy"])


def _fits(spec: dict[str, Any], shape: dict[str, int]) -> bool:
    return all(spec.get(k) == shape.get(k) for k in ("macro_dim", "n_servers", "server_dim",
                                                       "k_slots", "job_dim"))


def train_reward(old: tuple[Any, dict[str, Any]] | None, new: Any, old_pairs: Any,
                 cfg: RetrainConfig) -> tuple[Any, dict[str, Any], dict[str, float]]:
    """Fine-tune (or start) the reward model on old + new pairs, new ones weighted; returns
    (model, spec, metrics) with the drift (old model on all new pairs) and the held-out
    accuracies of old and new model."""
    import torch

    from cloudrl.algorithms.bradley_terry import bt_loss
    from cloudrl.alignment.reward_model import RewardModelConfig, net_spec, pair_batch
    from models.reward_net import build_reward_ensemble

    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(new))
    n_held = int(round(len(new) * cfg.heldout_fraction)) if len(new) >= 4 else 0
    held, train_new = np.sort(order[:n_held]), np.sort(order[n_held:])
    metrics: dict[str, float] = {"new_pairs": float(len(new)), "heldout_pairs": float(n_held),
                                 "old_pairs": float(len(old_pairs) if old_pairs else 0)}
    torch.manual_seed(cfg.seed)
    if old is not None and _fits(old[1], new.shape):
        metrics["drift_accuracy"] = _accuracy(old[0], new)
        metrics["old_heldout_accuracy"] = _accuracy(old[0], new, held)
        spec = dict(old[1])
        model = build_reward_ensemble(spec)
        model.load_state_dict(old[0].state_dict())
    else:
        spec = net_spec(RewardModelConfig(), new.shape)
        model = build_reward_ensemble(spec)
    sets = [(new, train_new, cfg.recent_weight)]
    if old_pairs is not None and len(old_pairs) and old_pairs.shape == new.shape:
        sets.append((old_pairs, np.arange(len(old_pairs)), 1.0))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.reward_lr, weight_decay=1e-4)
    model.train()
    for epoch in range(cfg.reward_epochs):
        perms = [(p, np.random.default_rng([cfg.seed, epoch, i]).permutation(idx), w)
                 for i, (p, idx, w) in enumerate(sets)]
        steps = max(math.ceil(len(idx) / cfg.reward_batch) for _, idx, _ in perms)
        for step in range(steps):
            total, weight = torch.zeros(()), 0.0
            for pairs, idx, w in perms:
                batch = idx[step * cfg.reward_batch:(step + 1) * cfg.reward_batch]
                if len(batch) == 0:
                    continue
                obs, label = pair_batch(pairs, batch, "cpu", model.transition)
                returns = model(obs).sum(-1)
                half = returns.shape[1] // 2
                loss = bt_loss(returns[:, :half], returns[:, half:],
                               label.expand(returns.shape[0], -1), reduction="none")
                total = total + w * loss.mean(0).sum()
                weight += w * len(batch)
            opt.zero_grad()
            (total / max(weight, 1e-9)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    model.eval()
    metrics["new_heldout_accuracy"] = _accuracy(model, new, held)
    metrics["new_train_accuracy"] = _accuracy(model, new, train_new)
    return model, spec, metrics


def save_reward(model: Any, spec: dict[str, Any], out: Path, metrics: dict[str, float]) -> Path:
    """A reward-model directory ``cloudrl align``'s phase 3 and ``load_reward_model`` read."""
    import torch

    from cloudrl.alignment.reward_model import CHECKPOINT_FILE, HISTORY_FILE

    out.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {k: v.detach().cpu().clone() for k, v in
                               model.state_dict().items()}, "spec": spec}, out / CHECKPOINT_FILE)
    (out / HISTORY_FILE).write_text(json.dumps([metrics], indent=1))
    return out


# ----------------------------------------------------------------------------- policy


def fine_tune(champion: Path, reward: tuple[Any, dict[str, Any]], pairs: Any,
              cfg: RetrainConfig, out: Path) -> Path:
    """Phase 3 from the champion's module: ``cfg.env_steps`` on the learned reward."""
    from cloudrl.alignment.learned_reward import pair_reward_stats, reward_payload
    from cloudrl.alignment.phase3 import configure_phase3
    from cloudrl.checkpoint_policy import MODULE_SUBDIR, read_meta
    from cloudrl.training import TrainConfig, train
    from envs.env_config import EnvConfig

    meta = read_meta(champion)
    if meta["algo"] not in FINE_TUNABLE:
        raise ConfigError(f"champion {champion}: a {meta['algo']} policy cannot be fine-tuned "
                          f"on the learned reward (phase 3 trains {', '.join(FINE_TUNABLE)}); "
                          "give --candidate CHECKPOINT")
    model, spec = reward
    mean, std = pair_reward_stats(model, pairs)
    payload = reward_payload(model, spec, mean, std)
    tcfg = TrainConfig(algo=meta["algo"], env=EnvConfig.model_validate(meta["env"]),
                       env_steps=cfg.env_steps, hidden=int(meta.get("hidden", 128)),
                       run_seed=cfg.seed, hparams=cfg.hparams,
                       init_module_state=str(champion / MODULE_SUBDIR),
                       checkpoint_dir=str(out.resolve()))
    from cloudrl.ray_utils import init_ray

    init_ray()  # joins the cluster under ray job submit ($RAY_ADDRESS), else a local Ray
    anchor = {"coeff": 0.0, "module": None, "demos": None, "batch": 64, "margin": 0.8,
              "seed": cfg.seed}
    ckpt, _ = train(tcfg, configure=lambda c: configure_phase3(
        c, meta["algo"], reward=payload, mix=cfg.mix, reward_scale=tcfg.reward_scale,
        target_std=cfg.target_std, anchor=anchor))
    return ckpt


def validate(paths: dict[str, Path], env_config: Any, cfg: RetrainConfig) -> dict[str, Any]:
    """Each checkpoint on the same validation seeds (true env reward): per-seed rewards,
    means, energy and violation rate."""
    from cloudrl.checkpoint_policy import load_policy
    from cloudrl.evaluate import make_env, run_episode
    from cloudrl.protocol import validation_seeds

    seeds = validation_seeds(cfg.val_seeds)
    data = env_config.model_dump(mode="json")
    data["sim"]["episode_length"] = cfg.eval_ticks
    env_cfg = type(env_config).model_validate(data)
    table: dict[str, Any] = {"seeds": list(seeds), "episode_ticks": cfg.eval_ticks}
    for role, path in paths.items():
        policy = load_policy(path, mode="greedy")
        policy.check_env(env_cfg)
        env = make_env(env_cfg, policy.interface)
        eps = [run_episode(policy, env, s) for s in seeds]
        rewards = [e.episode_reward for e in eps]
        table[role] = {"policy": policy.name, "rewards": rewards,
                       "reward_mean": float(np.mean(rewards)),
                       "energy_kwh_mean": float(np.mean([e.energy_kwh for e in eps])),
                       "sla_violation_rate_mean": float(np.mean([e.sla_violation_rate
                                                                 for e in eps])),
                       "invalid_actions": int(sum(e.invalid_actions for e in eps))}
    return table


# ----------------------------------------------------------------------------- the run


def _champion(name: str, uri: str | None) -> registry.RegisteredVersion:
    try:
        return registry.get_version(name, registry.CHAMPION, tracking_uri=uri)
    except registry.RegistryError:
        raise ConfigError(f"no models:/{name}@{registry.CHAMPION} in "
                          f"{tracking.resolve_tracking_uri(uri)}: register one first "
                          "(cloudrl loop register CHECKPOINT --alias champion)") from None


def retrain(cfg: RetrainConfig, log: Any = print) -> RetrainResult:
    """One retrain run (see the module docstring)."""
    from cloudrl.alignment.phase3 import load_reward
    from cloudrl.checkpoint_policy import is_checkpoint, read_meta
    from envs.env_config import EnvConfig

    db = Path(cfg.feedback_db)
    if not db.is_file():
        raise ConfigError(f"--feedback-db {db}: no such file (the service's state_db)")
    if cfg.candidate is not None and not is_checkpoint(cfg.candidate):
        raise ConfigError(f"--candidate {cfg.candidate}: not a cloudrl checkpoint")
    uri = cfg.tracking_uri
    champ = _champion(cfg.policy_model, uri)
    champ_path = registry.resolve(champ.uri, tracking_uri=uri)
    meta = read_meta(champ_path)
    env_config, interface = EnvConfig.model_validate(meta["env"]), meta["interface"]
    mark = watermark(uri)
    ids = _row_ids(db)
    new_ids = [i for i in ids if i > mark]
    old_ids = [i for i in ids if i <= mark][-cfg.max_old_pairs:] if cfg.max_old_pairs else []
    result = RetrainResult(decision="no_new_feedback", reason="", watermark=mark,
                           new_rows=[min(new_ids), max(new_ids)] if new_ids else [],
                           champion_version=champ.version)
    # a fresh directory per run: two runs in the same second must not share pair files
    work = Path(cfg.out) / (f"retrain-{time.strftime('%Y%m%d-%H%M%S')}-v{champ.version}-"
                            f"{uuid.uuid4().hex[:6]}")
    work.mkdir(parents=True)
    new, new_sum = _export(db, new_ids, work / "pairs_new", env_config, interface,
                           cfg.segment_length)
    old, old_sum = _export(db, old_ids, work / "pairs_old", env_config, interface,
                           cfg.segment_length)
    result.pairs = {"new_rows": len(new_ids), "new_pairs": new_sum["pairs"],
                    "old_rows": len(old_ids), "old_pairs": old_sum["pairs"],
                    **{f"skipped_{k}": v for k, v in new_sum["skipped"].items()}}
    client, run_id = tracking.open_run(uri, EXPERIMENT, f"retrain-v{champ.version}",
                                       {KIND_TAG: "retrain", "loop.champion": champ.version})
    result.run_id = run_id
    with tracking.finishing(client, run_id):
        tracking.log_params(client, run_id, cfg.model_dump())
        if new is None or len(new) < cfg.min_new_pairs:
            result.reason = (f"{new_sum['pairs']} usable new pair(s) in {len(new_ids)} new "
                             f"row(s) after row {mark} (< min_new_pairs {cfg.min_new_pairs})")
            if new_sum.get("first_skip"):
                result.reason += f"; skipped: {json.dumps(new_sum['first_skip'])}"
            client.set_tag(run_id, "loop.decision", result.decision)
            client.set_tag(run_id, "loop.reason", result.reason[:5000])
            client.set_tag(run_id, WATERMARK_TAG, str(mark))  # unusable rows stay pending
            log(f"retrain: nothing to do: {result.reason}")
            shutil.rmtree(work, ignore_errors=True)
            return result
        # reward model
        rm = registry.alias_version(cfg.reward_model, registry.CHAMPION, tracking_uri=uri)
        old_rm = None
        if rm is not None:
            rm_path = registry.resolve(f"models:/{cfg.reward_model}/{rm}", tracking_uri=uri)
            old_rm = load_reward(rm_path)
        model, spec, rmetrics = train_reward(old_rm, new, old, cfg)
        result.reward = rmetrics
        tracking.log_metrics(client, run_id, {f"reward/{k}": v for k, v in rmetrics.items()})
        log(f"retrain: reward model on {len(new)} new + {len(old) if old else 0} old pairs: "
            + ", ".join(f"{k} {v:.3f}" for k, v in rmetrics.items()))
        rm_dir = save_reward(model, spec, work / "reward_model", rmetrics)
        lineage_rows = {"feedback_rows": [min(new_ids), max(new_ids)], "watermark": mark,
                        "old_rows": [min(old_ids), max(old_ids)] if old_ids else []}
        result.reward_version = registry.register_reward_model(
            rm_dir, name=cfg.reward_model, eval_table=rmetrics,
            lineage={**lineage_rows, "parent_version": rm}, tracking_uri=uri,
            aliases=(registry.CHAMPION,), tags={"loop.retrain_run": run_id})
        # policy
        if cfg.candidate is not None:
            cand = Path(cfg.candidate).resolve()
        else:
            all_pairs = new if old is None or old.shape != new.shape else old
            log(f"retrain: fine-tuning {champ.uri} ({meta['algo']}) for {cfg.env_steps} "
                "env steps on the learned reward")
            cand = fine_tune(champ_path, (model, spec), all_pairs, cfg, work / "policy")
        result.candidate = str(cand)
        try:
            table = validate({"champion": champ_path, "candidate": cand}, env_config, cfg)
        except ValueError as e:  # a candidate for another fleet or queue layout
            raise ConfigError(f"--candidate {cand}: {e}") from None
        result.validation = table
        c_mean, k_mean = table["candidate"]["reward_mean"], table["champion"]["reward_mean"]
        tracking.log_metrics(client, run_id, {"val/champion_reward": k_mean,
                                              "val/candidate_reward": c_mean,
                                              "val/difference": c_mean - k_mean})
        if c_mean >= k_mean - cfg.tolerance:
            result.decision = "registered"
            result.reason = (f"candidate {c_mean:.1f} >= champion {k_mean:.1f} - tolerance "
                             f"{cfg.tolerance:g} on {cfg.val_seeds} validation seeds")
            result.challenger_version = registry.register_policy(
                cand, name=cfg.policy_model, tracking_uri=uri, aliases=(registry.CHALLENGER,),
                eval_table={"validation": table, "reward_model": rmetrics},
                lineage={**lineage_rows, "parent_version": champ.version,
                         "reward_model_version": result.reward_version,
                         "train_seeds": [0, 49], "env_steps": cfg.env_steps,
                         "validation_seeds": [table["seeds"][0], table["seeds"][-1]],
                         "candidate": cfg.candidate},
                tags={"loop.retrain_run": run_id})
            client.set_tag(run_id, "loop.challenger", result.challenger_version)
        else:
            result.decision = "rejected"
            result.reason = (f"candidate {c_mean:.1f} < champion {k_mean:.1f} - tolerance "
                             f"{cfg.tolerance:g} on {cfg.val_seeds} validation seeds: "
                             "not registered")
        client.set_tag(run_id, "loop.decision", result.decision)
        client.set_tag(run_id, "loop.reason", result.reason)
        client.log_dict(run_id, result.as_dict(), "retrain.json")
        client.set_tag(run_id, WATERMARK_TAG, str(max(new_ids)))
    log(f"retrain: {result.decision}: {result.reason}")
    shutil.rmtree(work / "pairs_old", ignore_errors=True)
    return result


__all__ = ["RetrainConfig", "RetrainResult", "pending_feedback", "retrain", "train_reward",
           "validate", "watermark"]
