"""Phase 1 of preference alignment: behaviour cloning on Ray Train with Accelerate.

:func:`train_bc` reads the demonstrations (episodes written by
:mod:`cloudrl.recording`) on the driver into flat arrays
(:class:`cloudrl.data.demonstrations.Demonstrations`), puts them in Ray's object store
and runs a Ray Train ``TorchTrainer``. Every worker

* creates an ``accelerate.Accelerator`` inside the worker. Ray Train has already set up
  ``torch.distributed`` (gloo on CPU, NCCL with ``use_gpu``) and exported ``RANK``,
  ``WORLD_SIZE`` and ``LOCAL_RANK``; Accelerate adopts that process group (it only calls
  ``init_process_group`` when none exists). Without a GPU the Accelerator must be made
  with ``cpu=True``: otherwise Accelerate finds no device backend and falls back to
  ``DistributedType.NO``, a single process without gradient sync;
* builds the project's own RLModule with the ``model_config`` cloudrl's training uses
  (``{"encoder": {"hidden": H}, "head_hiddens": [H]}``): ``MaskedPPOTorchRLModule`` for
  the flat interface, ``BDQTorchRLModule`` for the branching one, the same seed on every
  rank, and ``accelerator.prepare(model, optimizer)`` (DDP when there are 2+ ranks);
* walks the same GLOBAL batches in the same order whatever the number of workers (one
  permutation per epoch from ``(seed, epoch)``); rank r takes the r-th contiguous part of
  each global batch and scales its summed loss by ``world / global_batch``, so after DDP's
  gradient average every step is the gradient of the global batch mean: 1 and 2 workers
  follow the same loss curve up to float reduction order.

Losses. Flat: cross-entropy of the masked policy logits on the demonstrated action
(encoder and policy head train; the value head stays as built: it is no part of the loss
and DDP needs every trainable parameter in the graph). Branching: DQfD's large-margin
loss (Hester et al. 2018) per branch d,
``max_{a feasible} [Q_d(s, a) + l(a_E, a)] - Q_d(s, a_E)`` with ``l = margin`` for
``a != a_E`` and 0 otherwise, averaged over branches (``cloudrl.algorithms.dqfd``); plus
``td_weight`` times BDQ's own 1-step double-Q TD loss on the recorded rewards (scaled by
``reward_scale`` as in training; :func:`cloudrl.algorithms.bdq.bdq_learner.bdq_td_errors`,
Huber, target network refreshed at the start of every epoch). DQfD combines both; the
TD term keeps the Q-values on the scale of returns, so BDQ does not start from
arbitrarily shifted values (``td_weight=0`` is margin only).

``num_workers=0`` runs the same loop in the calling process (one rank, no Ray Train;
the same numbers as one Ray Train worker). Per epoch every rank reports
(``ray.train.report``) the global loss, the accuracy of the argmax (flat) or per-branch
argmaxes (branching) against the demonstrated actions, the chance accuracy of a uniform
feasible action, and samples/s; rank 0 attaches a checkpoint after the last epoch.
The driver copies it to ``out``:

* the RLModule state, saved with RLlib's own ``RLModule.save_to_path`` from the
  unwrapped (non-DDP) module, *with target networks equal to the trained ones*: APPO's
  and BDQ's learners build their target copies before ``load_state_path`` is restored,
  so a state without them would leave random targets. For the flat interface the
  state is therefore saved from a ``MaskedAPPOTorchRLModule`` (a
  ``MaskedPPOTorchRLModule`` plus target copies): PPO and IMPALA ignore the extra keys;
* ``bc_meta.json`` (interface, module class, model_config, which algorithms it fits) and
  ``history.json``.

``TrainConfig(init_module_state=out)`` (``cloudrl.training``) passes ``out`` as
``RLModuleSpec(load_state_path=...)``, so PPO, APPO, IMPALA, BDQ and Ape-X BDQ start
from the cloned weights; :func:`cloudrl.algorithms.module_state.check_module_state`
validates that pairing first.
The driver logs the run to MLflow (:mod:`cloudrl.tracking`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cloudrl.algorithms.dqfd import dqfd_margin_loss
from cloudrl.algorithms.module_state import META_FILE
from cloudrl.data.demonstrations import Demonstrations, load_demonstrations

Interface = Literal["flat", "branching"]
HISTORY_FILE = "history.json"
# The module class BC trains, the class whose state it saves, and the algorithms that
# build a module that state fits (same parameter names and shapes).
TRAINED_CLASS = {"flat": "models.masked_ppo:MaskedPPOTorchRLModule",
                 "branching": "models.bdq:BDQTorchRLModule"}
SAVED_CLASS = {"flat": "models.masked_appo:MaskedAPPOTorchRLModule",
               "branching": "models.bdq:BDQTorchRLModule"}
# The parts the BC loss reads (the flat value head and any auxiliary head stay as built).
TRAINED_PARTS = {"flat": ("encoder", "pi"),
                 "branching": ("trunk", "value_head", "advantage_heads")}
FITS = {"flat": ("ppo", "appo", "impala"), "branching": ("bdq", "apex_bdq")}
# TrainConfig's defaults (tests/test_bc.py checks that they agree).
TRAIN_HIDDEN = 128
TRAIN_REWARD_SCALE = 0.01


class BCConfig(BaseModel):
    """One behaviour-cloning run. Defaults run (given recorded demonstrations)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    demos: str = Field("results/align/demos", description="directory of recorded episodes")
    interface: Interface = "flat"
    epochs: int = Field(10, ge=1)
    batch_size: int = Field(256, ge=1, description="GLOBAL batch, split over the workers")
    lr: float = Field(1e-3, gt=0.0)
    grad_clip: float = Field(10.0, ge=0.0, description="global grad-norm clip; 0: off")
    margin: float = Field(0.8, ge=0.0, description="DQfD margin l(a_E, a) for a != a_E")
    td_weight: float = Field(1.0, ge=0.0, description="branching: weight of the 1-step "
                             "TD loss on the recorded rewards; 0: margin loss only")
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    reward_scale: float = Field(TRAIN_REWARD_SCALE, gt=0.0,
                                description="rewards are multiplied by this (as in training)")
    hidden: int = Field(TRAIN_HIDDEN, ge=8,
                        description="encoder/head width; must equal TrainConfig.hidden")
    num_workers: int = Field(1, ge=0, description="Ray Train workers; 0: train in this "
                             "process (no Ray Train, no Ray)")
    use_gpu: bool = False
    cpus_per_worker: float = Field(1.0, gt=0.0)
    seed: int = 0
    out: str = "results/align/bc"
    name: str = "bc"
    storage_path: str = "results/ray_train"
    experiment: str = "cloudrl-align"
    tracking_uri: str | None = None
    mlflow: bool = True


def module_model_config(hidden: int) -> dict[str, Any]:
    """The ``model_config`` ``cloudrl.training.build_algo_config`` gives every module."""
    return {"encoder": {"hidden": int(hidden)}, "head_hiddens": [int(hidden)]}


def _bc_net(module: Any, interface: Interface) -> Any:
    """An ``nn.Module`` around the RLModule whose forward gives what the BC loss reads:
    masked logits ``(B, A)`` (flat) or unmasked Q ``(B, D, n)`` (branching)."""
    from torch import nn

    from models.encoders import feasible_actions
    from models.masked_ppo import mask_logits

    class BCNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rl_module = module

        def forward(self, obs: dict[str, Any]) -> Any:
            m = self.rl_module
            if interface == "flat":
                return mask_logits(m.pi(m.encoder(obs)), obs), feasible_actions(obs)
            feasible = m.feasibility(obs)
            return m.q_from_representation(m.trunk(obs), feasible), feasible

    return BCNet()


def build_module(interface: Interface, observation_space: Any, action_space: Any,
                 hidden: int, cls_path: str | None = None) -> Any:
    """The RLModule BC trains (or ``cls_path``), built as cloudrl's training builds it."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from cloudrl.algorithms.specs import load

    return RLModuleSpec(module_class=load(cls_path or TRAINED_CLASS[interface]),
                        observation_space=observation_space, action_space=action_space,
                        model_config=module_model_config(hidden)).build()


def save_module_state(module: Any, interface: Interface, out: str | Path) -> Path:
    """Save ``module`` (unwrapped) with RLlib's ``save_to_path``, target copies included."""
    out = Path(out)
    if interface == "flat":
        saved = build_module("flat", module.observation_space, module.action_space,
                             module.model_config["encoder"]["hidden"], SAVED_CLASS["flat"])
        saved.load_state_dict(module.state_dict())  # same keys before the targets exist
    else:
        saved = module
    saved.make_target_networks()
    saved.save_to_path(str(out))
    return out


# ----------------------------------------------------------------------------- worker


def _tensors(arrays: dict[str, np.ndarray], idx: np.ndarray, device: Any) -> dict[str, Any]:
    import torch

    return {k: torch.as_tensor(v[idx], device=device) for k, v in arrays.items()}


EpochHook = Callable[[dict[str, Any], list[dict[str, Any]], Any], None]


def _fit(cfg: BCConfig, demos: Demonstrations, rank: int, world: int,
         on_epoch: EpochHook) -> None:
    """The training loop of one rank. After every epoch ``on_epoch(metrics, history,
    module)`` with the global metrics; ``module`` is the trained (unwrapped) RLModule on
    rank 0 after the last epoch, else None."""
    import copy

    import torch
    from accelerate import Accelerator
    from ray.rllib.algorithms.dqn.dqn_learner import (
        QF_NEXT_PREDS,
        QF_PREDS,
        QF_TARGET_NEXT_PREDS,
    )
    from ray.rllib.core.columns import Columns

    from cloudrl.algorithms.bdq.bdq_learner import bdq_td_errors

    accelerator = Accelerator(cpu=not (cfg.use_gpu and torch.cuda.is_available()))
    device = accelerator.device
    flat = cfg.interface == "flat"

    torch.manual_seed(cfg.seed)
    module = build_module(cfg.interface, demos.observation_space, demos.action_space,
                          cfg.hidden)
    module.requires_grad_(False)  # DDP needs every trainable parameter in the loss
    for name in TRAINED_PARTS[cfg.interface]:
        getattr(module, name).requires_grad_(True)
    net = _bc_net(module, cfg.interface)
    optimizer = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=cfg.lr)
    model, optimizer = accelerator.prepare(net, optimizer)
    plain = accelerator.unwrap_model(model)
    use_td = not flat and cfg.td_weight > 0
    n = len(demos)
    history: list[dict[str, Any]] = []
    for epoch in range(1, cfg.epochs + 1):
        target = copy.deepcopy(plain.rl_module).requires_grad_(False) if use_td else None
        order = np.random.default_rng([cfg.seed, epoch]).permutation(n)
        sums = torch.zeros(6, dtype=torch.float64, device=device)  # loss, margin, td,
        model.train()                                              # correct, chance, n
        t0 = time.perf_counter()
        for start in range(0, n, cfg.batch_size):
            global_idx = order[start:start + cfg.batch_size]
            idx = np.array_split(global_idx, world)[rank]
            obs = _tensors(demos.obs, idx, device)
            actions = torch.as_tensor(demos.actions[idx], device=device)
            out, feasible = model(obs)
            if flat:
                per_sample = torch.nn.functional.cross_entropy(out, actions, reduction="none")
                margin_part = td_part = torch.zeros_like(per_sample)
                correct = (out.argmax(-1) == actions).double()
                chance = 1.0 / feasible.sum(-1).double()
            else:
                margin_part = dqfd_margin_loss(out, actions, feasible, cfg.margin)
                td_part = torch.zeros_like(margin_part)
                if use_td:
                    nxt = _tensors(demos.next_obs, idx, device)
                    with torch.no_grad():
                        nxt_feasible = plain.rl_module.feasibility(nxt)
                        q_next = plain.rl_module.q_from_representation(
                            plain.rl_module.trunk(nxt), nxt_feasible)
                        q_target = target.q_from_representation(target.trunk(nxt),
                                                                nxt_feasible)
                    fwd = {QF_PREDS: out,
                           QF_NEXT_PREDS: module.mask_q(q_next, nxt_feasible),
                           QF_TARGET_NEXT_PREDS: module.mask_q(q_target, nxt_feasible)}
                    batch = {Columns.ACTIONS: actions,
                             Columns.REWARDS: torch.as_tensor(
                                 demos.rewards[idx] * cfg.reward_scale, device=device),
                             Columns.TERMINATEDS: torch.as_tensor(demos.terminateds[idx],
                                                                  device=device)}
                    q_sel, y = bdq_td_errors(fwd, batch, cfg.gamma, double_q=True)
                    td_part = torch.nn.functional.huber_loss(
                        q_sel, y[:, None].expand_as(q_sel), reduction="none").mean(-1)
                per_sample = margin_part + cfg.td_weight * td_part
                masked = out.masked_fill(~feasible, float("-inf"))
                correct = (masked.argmax(-1) == actions).double().mean(-1)
                chance = (1.0 / feasible.sum(-1).double()).mean(-1)
            # sum over this rank's share, scaled so DDP's average is the global mean
            loss = per_sample.sum() * (world / len(global_idx))
            optimizer.zero_grad()
            accelerator.backward(loss)
            if cfg.grad_clip > 0:
                accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            with torch.no_grad():
                sums += torch.stack([per_sample.sum().double(), margin_part.sum().double(),
                                     td_part.sum().double(), correct.sum(), chance.sum(),
                                     torch.tensor(float(len(idx)), dtype=torch.float64,
                                                  device=device)])
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        sums = accelerator.reduce(sums, reduction="sum")
        slowest = float(accelerator.gather(elapsed).max())
        count = float(sums[5])
        metrics = {"epoch": epoch, "loss": float(sums[0]) / count,
                   "accuracy": float(sums[3]) / count, "chance_accuracy": float(sums[4]) / count,
                   "samples": count, "samples_per_s": count / max(slowest, 1e-9),
                   "epoch_s": slowest, "world_size": world,
                   "ddp": float(isinstance(model, torch.nn.parallel.DistributedDataParallel))}
        if not flat:
            metrics.update(margin_loss=float(sums[1]) / count, td_loss=float(sums[2]) / count)
        history.append(metrics)
        last = rank == 0 and epoch == cfg.epochs
        on_epoch(metrics, history, plain.rl_module if last else None)


def _write_outputs(out: str | Path, module: Any, interface: Interface,
                   history: list[dict[str, Any]]) -> None:
    save_module_state(module, interface, out)
    (Path(out) / HISTORY_FILE).write_text(json.dumps(history, indent=1))


def _train_loop(loop: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``: :func:`_fit` reporting to Ray Train."""
    import ray
    import ray.train

    cfg = BCConfig.model_validate(loop["config"])
    ctx = ray.train.get_context()

    def report(metrics: dict[str, Any], history: list[dict[str, Any]], module: Any) -> None:
        if module is None:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:
            _write_outputs(tmp, module, cfg.interface, history)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))

    _fit(cfg, ray.get(loop["demos"]), ctx.get_world_rank(), ctx.get_world_size(), report)


def _fit_in_process(cfg: BCConfig, demos: Demonstrations, out: Path) -> None:
    """``num_workers=0``: :func:`_fit` in this process (one rank, no Ray Train)."""
    def write(metrics: dict[str, Any], history: list[dict[str, Any]], module: Any) -> None:
        if module is not None:
            _write_outputs(out, module, cfg.interface, history)

    _fit(cfg, demos, 0, 1, write)


# ----------------------------------------------------------------------------- driver


def check_resources(cfg: BCConfig, resources: dict[str, float]) -> None:
    """Fail fast, naming the field, when the workers cannot all be placed (Ray Train
    would wait for them forever)."""
    cpus = cfg.num_workers * cfg.cpus_per_worker
    have = float(resources.get("CPU", 0.0))
    if cpus > have + 1e-9:
        raise ValueError(f"num_workers: {cfg.num_workers} worker(s) x {cfg.cpus_per_worker:g} "
                         f"CPU need {cpus:g} CPUs, the Ray cluster has {have:g}")
    gpus = float(resources.get("GPU", 0.0))
    if cfg.use_gpu and cfg.num_workers > gpus + 1e-9:
        raise ValueError(f"use_gpu: {cfg.num_workers} worker(s) need a GPU each, the Ray "
                         f"cluster has {gpus:g}")


@dataclass
class BCResult:
    """What a BC run produced: per-epoch metrics and where the RLModule state is."""

    history: list[dict[str, Any]]
    out: Path
    meta: dict[str, Any]
    run_id: str | None = None

    @property
    def final(self) -> dict[str, Any]:
        return self.history[-1]


def train_bc(cfg: BCConfig, demos: Demonstrations | None = None) -> BCResult:
    """Behaviour cloning with Ray Train + Accelerate; the module state goes to ``cfg.out``.

    ``demos`` given in memory replace ``cfg.demos``. A ValueError names a bad
    demonstration directory before any worker starts.
    """
    if demos is None:
        demos = load_demonstrations(cfg.demos, cfg.interface)
    if demos.interface != cfg.interface:
        raise ValueError(f"interface: the demonstrations are {demos.interface}, "
                         f"the config says {cfg.interface}")
    out = Path(cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if cfg.num_workers == 0:
        _fit_in_process(cfg, demos, out)
        return _finish(cfg, demos, out)
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not ray.is_initialized():
        ray.init()
    check_resources(cfg, ray.cluster_resources())
    loop = {"config": cfg.model_dump(), "demos": ray.put(demos)}
    trainer = TorchTrainer(
        _train_loop, train_loop_config=loop,
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                     resources_per_worker={"CPU": cfg.cpus_per_worker}),
        run_config=RunConfig(name=f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                             storage_path=str(Path(cfg.storage_path).resolve()),
                             checkpoint_config=CheckpointConfig(num_to_keep=1)))
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"BC run {cfg.name}: no checkpoint was reported")
    shutil.copytree(result.checkpoint.path, out, dirs_exist_ok=True)
    return _finish(cfg, demos, out)


def _finish(cfg: BCConfig, demos: Demonstrations, out: Path) -> BCResult:
    """Write ``bc_meta.json`` next to the saved state and log the MLflow run."""
    history = json.loads((out / HISTORY_FILE).read_text())
    meta = {"interface": cfg.interface, "module_class": SAVED_CLASS[cfg.interface],
            "trained_class": TRAINED_CLASS[cfg.interface],
            "model_config": module_model_config(cfg.hidden), "hidden": cfg.hidden,
            "fits": list(FITS[cfg.interface]), "demos": str(cfg.demos),
            "episodes": demos.episodes, "samples": len(demos), "policies": demos.policies,
            "epochs": cfg.epochs, "num_workers": cfg.num_workers,
            "final": history[-1]}
    (out / META_FILE).write_text(json.dumps(meta, indent=1))
    res = BCResult(history=history, out=out, meta=meta)
    if cfg.mlflow:
        res.run_id = _log_to_mlflow(cfg, res)
    return res


def _log_to_mlflow(cfg: BCConfig, res: BCResult) -> str:
    from cloudrl import tracking

    client, run_id = tracking.open_run(cfg.tracking_uri, cfg.experiment, cfg.name,
                                       {"phase": "bc", "cloudrl.kind": "align",
                                        "interface": cfg.interface})
    with tracking.finishing(client, run_id):
        tracking.log_params(client, run_id, {**cfg.model_dump(),
                                             "samples": res.meta["samples"],
                                             "episodes": res.meta["episodes"]})
        for row in res.history:
            tracking.log_metrics(client, run_id, {k: v for k, v in row.items()
                                                  if k != "epoch"}, step=int(row["epoch"]))
        tracking.log_artifacts(client, run_id, [res.out], "bc")
    return run_id
