"""BDQ on RLlib's DQN machinery: the branching loss (learner), ``BDQConfig`` and ``BDQ``.

Loss (Tavakoli et al. 2018, with n-step returns and prioritized replay):

* one target shared by all D branches (double Q, feasible-masked next-state Q):
  ``y = r + gamma^n (1 - done) * (1/D) sum_d Q'_d(s', argmax_{a feasible} Q_d(s', a))``
  (``double_q=False``: ``max_{a feasible} Q'_d(s', a)`` instead);
* per-branch error ``delta_d = y - Q_d(s, a_d)``;
* ``loss = mean_batch(IS weight * mean_d L(delta_d))`` with ``L`` Huber (delta 1) or
  squared error (``td_error_loss_fn``);
* replay priorities: ``sum_d |delta_d|``, logged under ``TD_ERROR_KEY`` exactly where
  ``DQN.training_step`` reads it to update the ``PrioritizedEpisodeReplayBuffer``.

The 1/(D+1) trunk-gradient rescaling lives in ``BDQTorchRLModule._forward_train``.

What stops stock DQN on a MultiDiscrete space, and the fix here (RLlib unpatched):

* default module: ``DQNCatalog`` sizes its heads with ``action_space.n``
  (AttributeError on MultiDiscrete; no default encoder for the cluster Dict obs either)
  and its exploration flips one epsilon coin per sample over a flat ``(B, A)`` Q ->
  ``BDQTorchRLModule`` (``catalog_class=None``, per-branch heads and epsilon-greedy);
* loss: ``DQNTorchLearner`` gathers ``Q (B, A)`` with ``actions.view(B, D, 1)`` (rank
  mismatch) and would log a ``(B, D)`` TD error where the prioritized buffer needs one
  value per sampled transition -> ``BDQTorchLearner`` (gather per branch, summed
  priorities);
* action dtype: the module-to-env ``TensorToNumpy`` connector narrows the module's int64
  actions to int32 (``convert_to_numpy(reduce_type=True)``), so episodes and the replay
  buffer hold int32 ``(D,)`` actions; the env accepts any int dtype and the loss casts
  to int64 (``torch.gather`` needs it);
* unchanged and working: ``DQNConfig.validate`` (no action-space check), the episode
  replay buffers (actions copied as-is; n-step reward sums, ``n_step`` and IS
  ``weights`` per sample), the learner connectors (``(B, D)`` actions batch as-is),
  target-net sync and ``DQN.training_step``'s priority update.

Device replay (``BDQConfig.training(device_replay=True)``): ``BDQ.training_step`` runs
``cloudrl.bdq_training.device_replay_training_step`` instead (transitions in a
``DeviceReplayBuffer`` on the learner's device, pre-built tensor batches straight to the
local learner, priorities from ``BDQTorchLearner.device_td_errors``); the loss then reads
the per-sample ``discounts`` column instead of ``n_step``.

``BDQConfig.validate`` rejects what the branching loss does not implement:
distributional Q, noisy nets, the old API stack; stateful modules fail in the loss.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.algorithms.dqn.dqn import DQN, DQNConfig
from ray.rllib.algorithms.dqn.dqn_learner import (
    QF_LOSS_KEY,
    QF_MAX_KEY,
    QF_MEAN_KEY,
    QF_MIN_KEY,
    QF_NEXT_PREDS,
    QF_PREDS,
    QF_TARGET_NEXT_PREDS,
    TD_ERROR_MEAN_KEY,
)
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.metrics import TD_ERROR_KEY
from torch import nn

from models.bdq import BDQTorchRLModule

BDQ_NAME = "BDQ"
DISCOUNTS = "discounts"
DEVICE_REPLAY_STATE = "device_replay_buffer"


def bdq_td_errors(fwd_out: dict[str, torch.Tensor], batch: dict[str, Any], gamma: float,
                  double_q: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_selected (B, D), target y (B,))`` of the branching double-Q loss (y detached).

    The bootstrap discount is ``batch["discounts"]`` when present (per-sample ``gamma**k``
    from ``DeviceReplayBuffer``, ``k`` truncated at episode ends), else
    ``gamma ** batch["n_step"]`` (episode replay), else ``gamma``.
    """
    actions = batch[Columns.ACTIONS].long()
    q_selected = torch.gather(fwd_out[QF_PREDS], -1, actions[..., None]).squeeze(-1)
    q_target_next = fwd_out[QF_TARGET_NEXT_PREDS]
    if double_q:
        best = fwd_out[QF_NEXT_PREDS].argmax(dim=-1, keepdim=True)
        q_next = torch.gather(q_target_next, -1, best).squeeze(-1)
    else:
        q_next = q_target_next.max(dim=-1).values
    not_done = 1.0 - batch[Columns.TERMINATEDS].float()
    discounts = batch.get(DISCOUNTS)
    if discounts is not None:  # per-sample gamma**k from the device replay
        discount = discounts.float()
    else:
        n_step = batch.get("n_step")
        discount = gamma ** (n_step.float() if n_step is not None
                             else torch.ones_like(not_done))
    target = batch[Columns.REWARDS].float() + discount * not_done * q_next.mean(dim=-1)
    return q_selected, target.detach()


class BDQTorchLearner(DQNTorchLearner):
    """DQN learner with the branching (shared-target, per-branch error) loss.

    With ``config.td_errors_on_device`` (device replay or Ape-X, local learner,
    ``num_learners=0``) the per-sample priorities ``sum_d |delta_d|`` stay on the device
    in ``device_td_errors[module_id]`` (read by ``cloudrl.bdq_training`` and
    ``cloudrl.apex``) instead of going through the metrics logger, which would copy them
    to the host.
    """

    def build(self) -> None:
        super().build()
        self.device_td_errors: dict[str, torch.Tensor] = {}

    def compute_loss_for_module(self, *, module_id: str, config: DQNConfig,
                                batch: dict[str, Any],
                                fwd_out: dict[str, torch.Tensor]) -> torch.Tensor:
        if Columns.LOSS_MASK in batch:
            raise ValueError("BDQTorchLearner does not support stateful (sequence) modules")
        q_selected, target = bdq_td_errors(fwd_out, batch, config.gamma, config.double_q)
        target_b = target[:, None].expand_as(q_selected)
        loss_fn = nn.HuberLoss if config.td_error_loss_fn == "huber" else nn.MSELoss
        per_branch = loss_fn(reduction="none")(q_selected, target_b)
        weights = batch.get("weights")
        per_sample = per_branch.mean(dim=-1)
        if weights is not None:
            per_sample = weights.float() * per_sample
        total_loss = per_sample.mean()
        td_error = (target_b - q_selected).abs().sum(dim=-1).detach()
        if getattr(config, "td_errors_on_device", False):
            self.device_td_errors[module_id] = td_error
        else:
            self.metrics.log_value(key=(module_id, TD_ERROR_KEY), value=td_error,
                                   reduce="item_series")
        self.metrics.log_dict(
            {QF_LOSS_KEY: total_loss, QF_MEAN_KEY: q_selected.mean(),
             QF_MAX_KEY: q_selected.max(), QF_MIN_KEY: q_selected.min(),
             TD_ERROR_MEAN_KEY: td_error.mean()},
            key=module_id, window=1)
        return total_loss


class BDQConfig(DQNConfig):
    """``DQNConfig`` for BDQ: branching module and learner, MultiDiscrete actions.

    ``BDQConfig().environment(...).training(...).build_algo()`` as with any RLlib
    algorithm; DQN's training settings (``n_step``, ``double_q``, ``epsilon``,
    ``replay_buffer_config``, ``td_error_loss_fn``, ``target_network_update_freq``,
    ``tau`` ...) keep their meaning. Defaults differ from DQN's: Huber loss, double Q,
    prioritized episode replay. BDQ is always dueling (``dueling`` is ignored).

    ``training(device_replay=True, device_replay_capacity=..., device_replay_checkpoint=...)``
    swaps the episode replay for ``cloudrl.replay.DeviceReplayBuffer`` on the learner's
    device (see ``cloudrl.bdq_training``; local learner only, ``num_learners=0``); alpha and
    beta come from ``replay_buffer_config``, ``n_step`` and ``gamma`` as usual.
    ``device_replay_checkpoint`` puts the buffer's tensors into the algorithm checkpoint.
    """

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or BDQ)
        self.double_q = True
        self.td_error_loss_fn = "huber"
        self.replay_buffer_config = {"type": "PrioritizedEpisodeReplayBuffer",
                                     "capacity": 100_000, "alpha": 0.6, "beta": 0.4}
        self.device_replay = False
        self.device_replay_capacity = 100_000
        self.device_replay_checkpoint = False

    def training(self, *, device_replay: bool | None = NotProvided,
                 device_replay_capacity: int | None = NotProvided,
                 device_replay_checkpoint: bool | None = NotProvided,
                 **kwargs: Any) -> BDQConfig:
        """``DQNConfig.training`` plus the device-replay switches (see the class docstring)."""
        super().training(**kwargs)
        if device_replay is not NotProvided:
            self.device_replay = bool(device_replay)
        if device_replay_capacity is not NotProvided:
            self.device_replay_capacity = int(device_replay_capacity)
        if device_replay_checkpoint is not NotProvided:
            self.device_replay_checkpoint = bool(device_replay_checkpoint)
        return self

    @property
    def td_errors_on_device(self) -> bool:
        """Whether the learner keeps per-sample priorities in ``device_td_errors``.

        True for the device replay on a local learner; the replay driver then reads them
        there instead of from the metrics (``cloudrl.apex`` sets it for its shards too).
        """
        return bool(self.device_replay) and self.num_learners == 0

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=BDQTorchRLModule, model_config=self.model_config)

    def get_default_learner_class(self) -> type[BDQTorchLearner]:
        return BDQTorchLearner

    def validate(self) -> None:
        super().validate()
        if self.framework_str != "torch":
            self._value_error("BDQ is implemented for torch only")
        if self.num_atoms > 1:
            self._value_error("BDQ does not implement distributional Q (num_atoms must be 1)")
        if self.noisy:
            self._value_error("BDQ does not implement noisy nets (noisy must be False)")
        if not (self.enable_rl_module_and_learner and self.enable_env_runner_and_connector_v2):
            self._value_error("BDQ runs on RLlib's new API stack only")
        if self.device_replay and self.num_learners > 0:
            self._value_error("device_replay needs the local learner (num_learners=0)")
        if self.device_replay and self.device_replay_capacity < 1:
            self._value_error("device_replay_capacity must be >= 1")


class BDQ(DQN):
    """DQN's training loop (replay, n-step, priorities, target sync) with the BDQ loss."""

    @classmethod
    def get_default_config(cls) -> BDQConfig:
        return BDQConfig()

    def training_step(self) -> None:
        """DQN's step, or the device-replay step (``cloudrl.bdq_training``) when configured."""
        if not self.config.device_replay:
            return super().training_step()
        from cloudrl.bdq_training import device_replay_training_step

        return device_replay_training_step(self)

    def get_state(self, components: Any = None, *, not_components: Any = None,
                  **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        replay = getattr(self, "device_replay", None)
        if (self.config.device_replay_checkpoint and replay is not None
                and self._check_component(DEVICE_REPLAY_STATE, components, not_components)):
            from cloudrl.bdq_training import buffer_checkpoint_state

            state[DEVICE_REPLAY_STATE] = buffer_checkpoint_state(replay.buffer)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if DEVICE_REPLAY_STATE in state:
            from cloudrl.bdq_training import ensure_device_replay

            ensure_device_replay(self).buffer.load_state_dict(state[DEVICE_REPLAY_STATE])


def register_bdq() -> None:
    """Registers ``BDQ`` with Tune: ``tune.Tuner("BDQ", param_space=BDQConfig()...)``."""
    from ray.tune.registry import register_trainable

    register_trainable(BDQ_NAME, BDQ)
