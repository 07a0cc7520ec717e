"""Phase 2 of preference alignment: the reward model, on Ray Train with DeepSpeed ZeRO-2.

:func:`train_reward_model` reads and validates a pair dataset
(:mod:`cloudrl.data.pairs`) on the driver, puts the arrays in Ray's object
store, and runs a Ray Train ``TorchTrainer``. Each worker

* builds a :class:`models.reward_net.RewardEnsemble` (k nets, r(s, s') per step on the
  shared cluster encoder, with the step's SLA violations derived from the two
  observations when the macro vector has the env's layout, else r(s'); the same seed on
  every rank) and a ``torch.optim.AdamW``;
* calls ``deepspeed.initialize`` with ``zero_optimization.stage`` (2 by default): the
  gradients and the Adam moments are partitioned across the ranks. DeepSpeed runs on the
  process group Ray Train set up: gloo and DeepSpeed's CPU accelerator without GPUs,
  NCCL/CUDA with ``use_gpu=True``; nothing else in the loop depends on the device;
* trains on its rank's share of the training pairs (the same number of pairs on every
  rank, so every rank takes the same number of steps) with the Bradley-Terry loss
  (:mod:`cloudrl.algorithms.bradley_terry`; every member gets its own loss, summed);
* after every ``eval_every``-th epoch evaluates the held-out pairs (accuracy without ties, loss,
  calibration, ensemble spread) and reports them with ``ray.train.report``; rank 0
  attaches a checkpoint: ``reward_model.pt`` (with ``early_stopping``, the default,
  the weights of the evaluation with the lowest held-out loss so far, marked
  ``selected`` in the history; small pair sets overfit within a few dozen epochs;
  a plain ``state_dict`` plus the spec that rebuilds the net, loadable without
  DeepSpeed: :func:`load_reward_model`),
  ``history.json`` and ``calibration.json``.

The ZeRO partitioning is read back from each rank after the first epoch: the engine's
``zero_optimization_stage()`` and the element count of the Adam state (``exp_avg`` +
``exp_avg_sq``) that rank holds, next to the model's parameter count; with stage 2 and
W ranks each holds about 2 * params / W.

Why the pairs travel through the object store and not ``ray.data`` shards: a pair set
fits in memory (3,000 pairs of 25-step segments at N=15 are ~0.1 GB) and Ray Data's read
tasks would compete with the training workers for the CPUs of a small machine; the split
by rank is explicit and equal-sized instead.

The driver logs each run to MLflow (:mod:`cloudrl.tracking`): the config as params, the
per-epoch metrics, the ZeRO read-back, and the calibration plot, the history and the
checkpoint as artifacts.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from cloudrl.algorithms.bradley_terry import bt_loss, calibration, pair_accuracy
from cloudrl.data.pairs import PairArrays, PairDataError, first_state_segment_file, read_pairs
from models.encoders import EncoderConfig
from models.reward_net import RewardEnsemble, build_reward_ensemble, encoder_spec

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "reward_model.pt"
HISTORY_FILE = "history.json"
CALIBRATION_FILE = "calibration.json"
OBS_PARTS = ("macro", "servers", "jobs")
ADAM_STATE_KEYS = ("exp_avg", "exp_avg_sq")


class RewardNetSpec(BaseModel):
    """Widths of the reward net (the encoder's fields plus the reward head)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    macro_hiddens: list[int] = Field(default_factory=lambda: [64])
    row_hiddens: list[int] = Field(default_factory=lambda: [64, 64])
    fusion_hiddens: list[int] = Field(default_factory=list)
    hidden: int = Field(default=128, ge=1)
    activation: str = "relu"
    head_hiddens: list[int] = Field(default_factory=lambda: [64])
    overload_features: bool = Field(
        default=True, description="add per-server utilisation and the indicator utilisation "
                                  "> overload_threshold to the server rows (when the rows "
                                  "have the env's columns)")
    overload_threshold: float = Field(default=0.9, gt=0.0, le=1.0)
    transition_features: bool = Field(
        default=True, description="r(s, s'): add the step's SLA violations, recovered from "
                                  "the macro violation_rate EMA before and after the step, "
                                  "to the post-step macro vector (when the macro vector has "
                                  "the env's layout); needs pairs with T+1 observations")
    violation_ema: float = Field(default=0.05, gt=0.0, le=1.0,
                                 description="the simulator's EMA weight of violation_rate "
                                             "(envs.sim._EMA)")

    def encoder(self) -> EncoderConfig:
        return EncoderConfig(tuple(self.macro_hiddens), tuple(self.row_hiddens),
                             tuple(self.fusion_hiddens), self.hidden, self.activation)


class RewardModelConfig(BaseModel):
    """One reward-model run. Defaults run (given ``data``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    data: str | None = Field(default=None, description="pair dataset directory (parquet)")
    val_data: str | None = Field(default=None,
                                 description="held-out pair dataset; None: val_fraction of data")
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    soft_labels: bool = Field(default=False, description="accept labels anywhere in [0, 1]")
    net: RewardNetSpec = Field(default_factory=RewardNetSpec)
    ensemble_size: int = Field(default=1, ge=1)
    epochs: int = Field(default=10, ge=1)
    batch_size: int = Field(default=32, ge=1, description="pairs per worker per step")
    lr: float = Field(default=1e-3, gt=0.0)
    weight_decay: float = Field(default=1e-4, ge=0.0)
    early_stopping: bool = Field(default=True,
                                 description="the checkpoint keeps the weights of the "
                                             "evaluation with the lowest held-out loss")
    grad_clip: float = Field(default=1.0, ge=0.0, description="0: off")
    zero_stage: int = Field(default=2, ge=0, le=2,
                            description="0: plain data parallel; 1: optimizer state, "
                                        "2: + gradients partitioned (3 would shard the "
                                        "parameters, which the plain checkpoint needs whole)")
    num_workers: int = Field(default=2, ge=1)
    use_gpu: bool = False
    cpus_per_worker: float = Field(default=1.0, gt=0.0)
    seed: int = 0
    calibration_bins: int = Field(default=10, ge=1)
    eval_every: int = Field(default=1, ge=1,
                            description="evaluate, report and checkpoint every n epochs "
                                        "(and after the last)")
    name: str = "reward_model"
    storage_path: str = "results/ray_train"
    experiment: str = "cloudrl-align"
    tracking_uri: str | None = None
    mlflow: bool = True

    @model_validator(mode="after")
    def _net_builds(self) -> RewardModelConfig:
        try:
            self.net.encoder()
        except ValueError as exc:
            raise ValueError(f"net: {exc}") from None
        return self


@dataclass
class RewardModelResult:
    """What a run produced: per-epoch metrics, the ZeRO read-back, where the model is."""

    history: list[dict[str, Any]]
    zero: dict[str, Any]
    checkpoint_dir: Path
    calibration: dict[str, Any]
    run_id: str | None = None

    @property
    def final(self) -> dict[str, Any]:
        """The metrics of the checkpointed weights: the best held-out-loss evaluation with
        early stopping, else the last."""
        best = [row for row in self.history if row.get("selected")]
        return best[-1] if best else self.history[-1]


# ----------------------------------------------------------------------------- data


def split_indices(n_pairs: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded permutation cut into (train, held-out) indices; both non-empty."""
    if n_pairs < 2:
        raise PairDataError(f"data: {n_pairs} pair(s); need at least 2 (train + held-out)")
    n_val = min(max(int(round(n_pairs * val_fraction)), 1), n_pairs - 1)
    order = np.random.default_rng(seed).permutation(n_pairs)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def rank_shard(indices: np.ndarray, rank: int, world: int) -> np.ndarray:
    """Rank ``rank``'s equal share of ``indices`` (strided; the remainder is dropped)."""
    per_rank = len(indices) // world
    return indices[rank::world][:per_rank]


def segment_obs(pairs: PairArrays, side: str, transition: bool) -> dict[str, np.ndarray]:
    """The observations a net scores: all T+1 for a transition net, the T post-step ones
    for a state net (either layout)."""
    if not transition:
        return pairs.post_step_obs(side)
    if not pairs.transitions:
        raise PairDataError(f"pairs: field obs_steps: {pairs.shape.get('obs_steps')} "
                            f"observations for {pairs.shape['segment_length']} steps; the "
                            "transition reward needs T+1")
    return {part: pairs.obs[side][part] for part in OBS_PARTS}


def pair_batch(pairs: PairArrays, index: np.ndarray, device: torch.device | str,
               transition: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Sides A then B stacked on the batch axis: obs (2B, O, ...) and labels (B,), with
    O = T+1 for a transition net, T for a state net."""
    sides = [segment_obs(pairs, s, transition) for s in ("a", "b")]
    obs = {part: torch.from_numpy(np.concatenate([sides[0][part][index],
                                                  sides[1][part][index]]))
           .to(device=device, dtype=torch.float32) for part in OBS_PARTS}
    label = torch.from_numpy(pairs.label[index]).to(device=device, dtype=torch.float32)
    return obs, label


def server_feature_spec(cfg: RewardModelConfig, server_dim: int) -> dict[str, Any] | None:
    """The derived server columns' spec, or None when off or the rows lack the env's columns."""
    from envs.observation import SERVER_COLS, S

    if not cfg.net.overload_features or server_dim < len(SERVER_COLS):
        return None
    return {"cpu_util": S["cpu_util"], "mem_cap": S["mem_cap"], "mem_free": S["mem_free"],
            "threshold": cfg.net.overload_threshold}


def violation_rate_index(macro_dim: int) -> int | None:
    """Where ``violation_rate`` sits in a macro vector of the env's layout (4 per tier, then
    ``MACRO_TAIL``), or None when ``macro_dim`` does not fit that layout."""
    from envs.observation import MACRO_TAIL

    per_tier = macro_dim - len(MACRO_TAIL)
    if per_tier < 4 or per_tier % 4:
        return None
    return per_tier + MACRO_TAIL.index("violation_rate")


def transition_feature_spec(cfg: RewardModelConfig, macro_dim: int) -> dict[str, Any] | None:
    """The derived transition column's spec, or None when off or the macro layout differs."""
    index = violation_rate_index(macro_dim) if cfg.net.transition_features else None
    return None if index is None else {"violation_rate": index, "ema": cfg.net.violation_ema}


def check_obs_layout(pairs: PairArrays, spec: dict[str, Any], where: str | None) -> None:
    """A transition net needs segments of T+1 observations: one line naming the first file
    (under ``where``, a dataset path, when given) that holds only T, and the column."""
    if not spec.get("transition_features") or pairs.transitions:
        return
    t = pairs.shape["segment_length"]
    problem = f"{pairs.shape.get('obs_steps', t)} observations per side for {t} steps"
    found = first_state_segment_file(where) if where and Path(where).exists() else None
    if found is not None:
        where = str(found[0])
        if found[1]:
            problem = f"missing column (a file from before transition segments: {problem})"
    raise PairDataError(
        f"{where or 'pairs'}: field obs_steps: {problem}; the transition reward r(s, s') "
        f"needs {t + 1}: re-create the pairs (cloudrl align pairs, cloudrl feedback export "
        "--format pairs) or set net.transition_features: false")


def net_spec(cfg: RewardModelConfig, shape: dict[str, int]) -> dict[str, Any]:
    """What :func:`models.reward_net.build_reward_ensemble` needs (stored with the weights)."""
    return {"server_features": server_feature_spec(cfg, shape["server_dim"]),
            "transition_features": transition_feature_spec(cfg, shape["macro_dim"]),
            "macro_dim": shape["macro_dim"], "n_servers": shape["n_servers"],
            "server_dim": shape["server_dim"], "k_slots": shape["k_slots"],
            "job_dim": shape["job_dim"], "ensemble_size": cfg.ensemble_size,
            "encoder": encoder_spec(cfg.net.encoder()), "head_hiddens": list(cfg.net.head_hiddens)}


def synthetic_linear_pairs(n_pairs: int, *, segment_length: int = 4, n_servers: int = 4,
                           k_slots: int = 3, macro_dim: int = 4, server_dim: int = 3,
                           job_dim: int = 3, seed: int = 0) -> tuple[PairArrays, dict]:
    """Pairs of random segments labelled by a known linear per-step reward.

    r(s) = w_m . macro + w_s . mean_rows(servers) + w_j . mean_rows(jobs), with the
    server and job weights larger than the macro ones, so a model that does not read the
    per-row (micro) features cannot rank the pairs. Label 1 when A's return is higher.
    Returns the pairs and the weights.
    """
    rng = np.random.default_rng(seed)
    weights = {"macro": rng.normal(0, 0.5, macro_dim),
               "servers": rng.normal(0, 1.0, server_dim) * 3.0,
               "jobs": rng.normal(0, 1.0, job_dim) * 3.0}
    dims = {"macro": (macro_dim,), "servers": (n_servers, server_dim), "jobs": (k_slots, job_dim)}
    obs: dict[str, dict[str, np.ndarray]] = {}
    returns = {}
    for side in ("a", "b"):
        obs[side] = {part: rng.normal(0, 1, (n_pairs, segment_length, *d)).astype(np.float32)
                     for part, d in dims.items()}
        obs[side]["actions"] = np.zeros((n_pairs, segment_length, 1), dtype=np.int64)
        step = (obs[side]["macro"] @ weights["macro"]
                + obs[side]["servers"].mean(-2) @ weights["servers"]
                + obs[side]["jobs"].mean(-2) @ weights["jobs"])
        returns[side] = step.sum(-1)
    label = (returns["a"] > returns["b"]).astype(np.float64)
    shape = {"segment_length": segment_length, "obs_steps": segment_length,
             "n_servers": n_servers, "k_slots": k_slots, "macro_dim": macro_dim,
             "server_dim": server_dim, "job_dim": job_dim, "action_dim": 1}
    meta = {"pair_id": np.array([f"syn-{i}" for i in range(n_pairs)], dtype=object),
            "source": np.array(["teacher"] * n_pairs, dtype=object)}
    return PairArrays(label=label, obs=obs, meta=meta, shape=shape), weights


def synthetic_transition_pairs(n_pairs: int, *, segment_length: int = 8, n_servers: int = 4,
                               k_slots: int = 3, server_dim: int = 3, job_dim: int = 3,
                               ema: float = 0.05, micro_weight: float = 0.3,
                               seed: int = 0) -> tuple[PairArrays, np.ndarray]:
    """Transition segments (T+1 observations) labelled by a reward no single state shows.

    The macro vector has the env's layout for one tier (``4 + len(MACRO_TAIL)`` columns,
    random except ``violation_rate``), and ``violation_rate`` follows the simulator's EMA
    of hidden per-step violation counts v_t ~ Poisson(lambda), lambda drawn per segment,
    from a random starting level. The true per-step reward is
    ``-v_t + micro_weight * mean_rows(servers_{t+1}) . w``: the violations are visible
    only in the change of the EMA between o_t and o_{t+1}. Label 1 when A's return is
    higher. Returns the pairs and the (P, 2, T) violation counts (sides a, b).
    """
    from envs.observation import MACRO_TAIL

    rng = np.random.default_rng(seed)
    macro_dim = 4 + len(MACRO_TAIL)
    vi = violation_rate_index(macro_dim)
    t_len, o_len = segment_length, segment_length + 1
    w = rng.normal(0, 1.0, server_dim)
    obs: dict[str, dict[str, np.ndarray]] = {}
    returns, counts = {}, []
    for side in ("a", "b"):
        macro = rng.normal(0, 1, (n_pairs, o_len, macro_dim))
        lam = rng.uniform(0.0, 1.0, (n_pairs, 1))
        v = rng.poisson(lam, (n_pairs, t_len)).astype(np.float64)
        level = rng.uniform(0.0, 1.0, n_pairs)
        macro[:, 0, vi] = level
        for t in range(t_len):
            level = level + ema * (v[:, t] - level)
            macro[:, t + 1, vi] = level
        servers = rng.normal(0, 1, (n_pairs, o_len, n_servers, server_dim))
        obs[side] = {"macro": macro.astype(np.float32), "servers": servers.astype(np.float32),
                     "jobs": rng.normal(0, 1, (n_pairs, o_len, k_slots, job_dim))
                     .astype(np.float32),
                     "actions": np.zeros((n_pairs, t_len, 1), dtype=np.int64)}
        micro = obs[side]["servers"][:, 1:].mean(-2) @ w
        returns[side] = (-v + micro_weight * micro).sum(-1)
        counts.append(v)
    label = (returns["a"] > returns["b"]).astype(np.float64)
    shape = {"segment_length": t_len, "obs_steps": o_len, "n_servers": n_servers,
             "k_slots": k_slots, "macro_dim": macro_dim, "server_dim": server_dim,
             "job_dim": job_dim, "action_dim": 1}
    meta = {"pair_id": np.array([f"syn-t-{i}" for i in range(n_pairs)], dtype=object),
            "source": np.array(["teacher"] * n_pairs, dtype=object)}
    return (PairArrays(label=label, obs=obs, meta=meta, shape=shape),
            np.stack(counts, axis=1))


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def member_gaps(model: RewardEnsemble, pairs: PairArrays, index: np.ndarray | None = None,
                batch_size: int = 256, device: torch.device | str = "cpu") -> np.ndarray:
    """R_a - R_b of every member on the pairs: (k, P)."""
    index = np.arange(len(pairs)) if index is None else index
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(index), batch_size):
        obs, _ = pair_batch(pairs, index[start:start + batch_size], device, model.transition)
        returns = model.segment_returns(obs)
        half = returns.shape[1] // 2
        out.append((returns[:, :half] - returns[:, half:]).double().cpu().numpy())
    model.train(was_training)
    return np.concatenate(out, axis=1) if out else np.zeros((model.size, 0))


def preference_metrics(gaps: np.ndarray, label: np.ndarray, n_bins: int = 10
                       ) -> tuple[dict[str, float], dict[str, Any]]:
    """Held-out metrics of member gaps (k, P): the ensemble's P(A > B) is the member mean
    of sigmoid(gap). Returns scalar metrics and the calibration bins."""
    prob = (1.0 / (1.0 + np.exp(-np.clip(gaps, -60, 60)))).mean(0)
    eps = 1e-7
    p = np.clip(prob, eps, 1 - eps)
    loss = -(label * np.log(p) + (1 - label) * np.log(1 - p))
    cal = calibration(prob, label, n_bins)
    metrics = {"val_accuracy": pair_accuracy(prob, label), "val_loss": float(loss.mean()),
               "val_ece": cal.ece, "val_gap_std": float(gaps.std(0).mean())}
    return metrics, cal.as_dict()


# ----------------------------------------------------------------------------- worker


def optimizer_state_numel(engine: Any) -> int:
    """Elements of the Adam moments (exp_avg + exp_avg_sq) this rank's optimizer holds."""
    opt = engine.optimizer
    base = getattr(opt, "optimizer", opt)
    return int(sum(t.numel() for state in base.state.values() for k, t in state.items()
                   if k in ADAM_STATE_KEYS and torch.is_tensor(t)))


def deepspeed_config(cfg: RewardModelConfig) -> dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": cfg.batch_size, "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.grad_clip, "zero_optimization": {"stage": cfg.zero_stage},
            "zero_allow_untested_optimizer": True, "fp16": {"enabled": False},
            "bf16": {"enabled": False}, "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False}


def _gather(value: Any) -> list[Any]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _train_loop(loop: dict[str, Any]) -> None:
    """The Ray Train worker function (one per rank)."""
    import ray
    import ray.train

    cfg = RewardModelConfig.model_validate(loop["config"])
    if not cfg.use_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    pairs: PairArrays = ray.get(loop["pairs"])
    val_pairs: PairArrays | None = ray.get(loop["val_pairs"]) if loop.get("val_pairs") else None
    if val_pairs is None:
        train_idx, val_idx = split_indices(len(pairs), cfg.val_fraction, cfg.seed)
        val_pairs = pairs
    else:
        train_idx, val_idx = np.arange(len(pairs)), np.arange(len(val_pairs))
    shard = rank_shard(train_idx, rank, world)

    torch.manual_seed(cfg.seed)
    spec = loop["spec"]
    model = build_reward_ensemble(spec)
    transition = model.transition
    param_numel = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config=deepspeed_config(cfg))
    device = engine.device
    history: list[dict[str, Any]] = []
    zero: dict[str, Any] = {}
    best_loss = math.inf
    best_state: dict[str, torch.Tensor] = {}
    best_cal: dict[str, Any] = {}
    for epoch in range(1, cfg.epochs + 1):
        order = np.random.default_rng([cfg.seed, epoch, rank]).permutation(shard)
        engine.train()
        loss_sum = torch.zeros((), device=device)
        t0 = time.perf_counter()
        for start in range(0, len(order), cfg.batch_size):
            obs, label = pair_batch(pairs, order[start:start + cfg.batch_size], device,
                                    transition)
            returns = engine(obs).sum(-1)  # (k, 2B) segment returns
            half = returns.shape[1] // 2
            per_member = bt_loss(returns[:, :half], returns[:, half:],
                                 label.expand(returns.shape[0], -1), reduction="none").mean(1)
            loss = per_member.sum()
            engine.backward(loss)
            engine.step()
            loss_sum += per_member.detach().mean() * half
        elapsed = time.perf_counter() - t0
        if not zero:
            zero = {"zero_stage": int(engine.zero_optimization_stage()),
                    "param_numel": int(param_numel), "world_size": world,
                    "opt_state_numel_per_rank": _gather(optimizer_state_numel(engine))}
        if epoch % cfg.eval_every and epoch != cfg.epochs:
            continue
        totals = torch.tensor([loss_sum.item(), float(len(order))], device=device,
                              dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(totals)
        times = _gather(elapsed)
        gaps = member_gaps(engine.module, val_pairs, val_idx, device=device)
        metrics, cal = preference_metrics(gaps, val_pairs.label[val_idx], cfg.calibration_bins)
        metrics = {"epoch": epoch, "train_loss": float(totals[0] / max(totals[1], 1.0)),
                   "train_pairs_per_s": float(totals[1] / max(max(times), 1e-9)),
                   **metrics}
        improved = metrics["val_loss"] < best_loss
        best_loss = min(best_loss, metrics["val_loss"])
        metrics["selected"] = bool(improved or not cfg.early_stopping)
        history.append(metrics)
        report = {**metrics, **zero}
        if rank == 0:
            if metrics["selected"]:  # the checkpoint holds the best weights so far
                best_state = _state(engine.module)
                best_cal = cal
            with tempfile.TemporaryDirectory() as tmp:
                _write_checkpoint(Path(tmp), best_state, spec, history, best_cal)
                ray.train.report(report, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        else:
            ray.train.report(report)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _write_checkpoint(out: Path, state: dict[str, torch.Tensor] | torch.nn.Module,
                      spec: dict[str, Any], history: list[dict[str, Any]],
                      cal: dict[str, Any]) -> None:
    """Write ``reward_model.pt`` (a module's weights, or a state dict), history, calibration."""
    if isinstance(state, torch.nn.Module):
        state = _state(state)
    torch.save({"state_dict": state, "spec": spec}, out / CHECKPOINT_FILE)
    (out / HISTORY_FILE).write_text(json.dumps(history, indent=1))
    (out / CALIBRATION_FILE).write_text(json.dumps(cal, indent=1))


def load_reward_model(path: str | Path) -> RewardEnsemble:
    """The trained ensemble from a checkpoint directory (or its ``reward_model.pt``); plain
    torch, no DeepSpeed."""
    p = Path(path)
    p = p / CHECKPOINT_FILE if p.is_dir() else p
    payload = torch.load(p, map_location="cpu", weights_only=True)
    model = build_reward_ensemble(payload["spec"])
    model.load_state_dict(payload["state_dict"])
    return model.eval()


# ----------------------------------------------------------------------------- driver


def plot_calibration(cal: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Reliability diagram: mean label vs mean predicted P(A > B) per bin, with counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pred, emp = np.asarray(cal["mean_pred"], float), np.asarray(cal["mean_label"], float)
    counts = np.asarray(cal["counts"])
    edges = np.asarray(cal["edges"])
    fig, (ax, axc) = plt.subplots(2, 1, figsize=(4.5, 5.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], "--", color="grey", lw=1, label="perfect")
    ok = counts > 0
    ax.plot(pred[ok], emp[ok], "o-", label=f"model (ECE {cal['ece']:.3f})")
    ax.set_ylabel("empirical P(A preferred)")
    ax.set_title(title or "reward model calibration (held-out pairs)")
    ax.legend(loc="upper left")
    axc.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="tab:blue", alpha=0.5)
    axc.set_xlabel("predicted P(A preferred)")
    axc.set_ylabel("pairs")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def load_pairs(cfg: RewardModelConfig) -> tuple[PairArrays, PairArrays | None]:
    """The training (and optional held-out) pairs of ``cfg``, validated."""
    if not cfg.data:
        raise PairDataError("data: no pair dataset given (RewardModelConfig.data)")
    pairs = read_pairs(cfg.data, soft_labels=cfg.soft_labels)
    val = read_pairs(cfg.val_data, soft_labels=cfg.soft_labels) if cfg.val_data else None
    if val is not None:
        for name, value in pairs.shape.items():
            if name != "action_dim" and val.shape.get(name) != value:
                raise PairDataError(f"{cfg.val_data}: field {name}: {val.shape.get(name)} "
                                    f"differs from {value} in {cfg.data}")
    return pairs, val


def train_reward_model(cfg: RewardModelConfig, pairs: PairArrays | None = None,
                       val_pairs: PairArrays | None = None) -> RewardModelResult:
    """Train the reward model with Ray Train + DeepSpeed; log the run to MLflow.

    ``pairs`` (and ``val_pairs``) given in memory replace ``cfg.data`` (``cfg.val_data``).
    Raises :class:`PairDataError` for a malformed dataset before any worker starts.
    """
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if pairs is None:
        pairs, val_pairs = load_pairs(cfg)
    n_train = (len(pairs) if val_pairs is not None
               else len(split_indices(len(pairs), cfg.val_fraction, cfg.seed)[0]))
    if n_train < cfg.num_workers or (val_pairs is not None and len(val_pairs) == 0):
        raise PairDataError(f"data: {len(pairs)} pairs are too few for {cfg.num_workers} "
                            f"worker(s) and a held-out share")
    spec = net_spec(cfg, pairs.shape)
    check_obs_layout(pairs, spec, cfg.data)
    if val_pairs is not None:
        check_obs_layout(val_pairs, spec, cfg.val_data)
    if not ray.is_initialized():
        ray.init()
    loop = {"config": cfg.model_dump(), "spec": spec, "pairs": ray.put(pairs),
            "val_pairs": ray.put(val_pairs) if val_pairs is not None else None}
    trainer = TorchTrainer(
        _train_loop, train_loop_config=loop,
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                     resources_per_worker={"CPU": cfg.cpus_per_worker}),
        run_config=RunConfig(name=f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}-"
                                  f"{uuid.uuid4().hex[:6]}",
                             storage_path=str(Path(cfg.storage_path).resolve()),
                             checkpoint_config=CheckpointConfig(num_to_keep=1)))
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"reward model run {cfg.name}: no checkpoint was reported")
    ckpt_dir = Path(result.checkpoint.path)
    history = json.loads((ckpt_dir / HISTORY_FILE).read_text())
    cal = json.loads((ckpt_dir / CALIBRATION_FILE).read_text())
    metrics = result.metrics or {}
    zero = {k: metrics[k] for k in ("zero_stage", "param_numel", "world_size",
                                    "opt_state_numel_per_rank") if k in metrics}
    out = RewardModelResult(history=history, zero=zero, checkpoint_dir=ckpt_dir,
                            calibration=cal)
    if cfg.mlflow:
        out.run_id = _log_to_mlflow(cfg, out)
    return out


def _log_to_mlflow(cfg: RewardModelConfig, res: RewardModelResult) -> str:
    from cloudrl import tracking

    client, run_id = tracking.open_run(cfg.tracking_uri, cfg.experiment, cfg.name,
                                       {"phase": "reward_model", "cloudrl.kind": "align"})
    with tracking.finishing(client, run_id):
        tracking.log_params(client, run_id, cfg.model_dump())
        for row in res.history:
            tracking.log_metrics(client, run_id, {k: v for k, v in row.items() if k != "epoch"},
                                 step=int(row["epoch"]))
        per_rank = res.zero.get("opt_state_numel_per_rank") or []
        tracking.log_metrics(client, run_id, {
            "zero_stage": res.zero.get("zero_stage", math.nan),
            "param_numel": res.zero.get("param_numel", math.nan),
            "opt_state_numel_max_rank": max(per_rank) if per_rank else math.nan})
        with tempfile.TemporaryDirectory() as tmp:
            plot = plot_calibration(res.calibration, Path(tmp) / "calibration.png",
                                    f"{cfg.name}: held-out calibration")
            tracking.log_artifacts(client, run_id, [plot])
        tracking.log_artifacts(client, run_id, [res.checkpoint_dir / CHECKPOINT_FILE,
                                                res.checkpoint_dir / HISTORY_FILE,
                                                res.checkpoint_dir / CALIBRATION_FILE],
                               "reward_model")
    return run_id
