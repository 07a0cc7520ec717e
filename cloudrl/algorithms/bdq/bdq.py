"""BDQ on RLlib's DQN machinery: ``BDQConfig`` and the ``BDQ`` algorithm.

What stops stock DQN on a MultiDiscrete space, and the fix here (RLlib unpatched):

* default module: ``DQNCatalog`` sizes its heads with ``action_space.n``
  (AttributeError on MultiDiscrete; no default encoder for the cluster Dict obs either)
  and its exploration flips one epsilon coin per sample over a flat ``(B, A)`` Q ->
  ``models.bdq.BDQTorchRLModule`` (``catalog_class=None``, per-branch heads and
  epsilon-greedy);
* loss -> ``BDQTorchLearner`` (:mod:`cloudrl.algorithms.bdq.bdq_learner`);
* action dtype: the module-to-env ``TensorToNumpy`` connector narrows the module's int64
  actions to int32 (``convert_to_numpy(reduce_type=True)``), so episodes and the replay
  buffer hold int32 ``(D,)`` actions; the env accepts any int dtype and the loss casts
  to int64 (``torch.gather`` needs it);
* unchanged and working: ``DQNConfig.validate`` (no action-space check), the episode
  replay buffers (actions copied as-is; n-step reward sums, ``n_step`` and IS
  ``weights`` per sample), the learner connectors (``(B, D)`` actions batch as-is),
  target-net sync and ``DQN.training_step``'s priority update.

Device replay (``BDQConfig.training(device_replay=True)``): ``BDQ.training_step`` runs
:func:`cloudrl.algorithms.bdq.training_step.device_replay_training_step` instead
(transitions in a ``DeviceReplayBuffer`` on the learner's device, pre-built tensor
batches straight to the local learner, priorities from
``BDQTorchLearner.device_td_errors``).

``BDQConfig.validate`` rejects what the branching loss does not implement:
distributional Q, noisy nets, the old API stack; stateful modules fail in the loss.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.algorithms.dqn.dqn import DQN, DQNConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from cloudrl.algorithms.alignment_head import (
    configure_alignment,
    head_model_config,
    init_alignment,
    validate_alignment,
)
from cloudrl.algorithms.bdq.bdq_learner import BDQTorchLearner
from cloudrl.algorithms.bdq.training_step import (
    buffer_checkpoint_state,
    device_replay_training_step,
    ensure_device_replay,
)
from models.bdq import BDQTorchRLModule

BDQ_NAME = "BDQ"
DEVICE_REPLAY_STATE = "device_replay_buffer"


class BDQConfig(DQNConfig):
    """``DQNConfig`` for BDQ: branching module and learner, MultiDiscrete actions.

    ``BDQConfig().environment(...).training(...).build_algo()`` as with any RLlib
    algorithm; DQN's training settings (``n_step``, ``double_q``, ``epsilon``,
    ``replay_buffer_config``, ``td_error_loss_fn``, ``target_network_update_freq``,
    ``tau`` ...) keep their meaning. Defaults differ from DQN's: Huber loss, double Q,
    prioritized episode replay. BDQ is always dueling (``dueling`` is ignored).

    ``training(device_replay=True, device_replay_capacity=..., device_replay_checkpoint=...)``
    swaps the episode replay for ``cloudrl.replay.DeviceReplayBuffer`` on the learner's
    device (see :mod:`cloudrl.algorithms.bdq.training_step`; the local learner's device
    with ``num_learners=0``, the driver's CPU with DDP learners, ``num_learners >= 2``);
    alpha and
    beta come from ``replay_buffer_config``, ``n_step`` and ``gamma`` as usual.
    ``device_replay_checkpoint`` puts the buffer's tensors into the algorithm checkpoint.

    ``training(alignment_pairs=DIR, alignment_weight=w, alignment_batch=b,
    alignment_trunk_grad_scale=g)``: the preference-alignment head
    (:mod:`cloudrl.algorithms.alignment_head`); with ``w > 0`` the module gets the head
    (``model_config["alignment_head"]``) and the loss ``w * BT`` on ``b`` pairs a step.
    Defaults: no pairs, weight 0 (plain BDQ, bit for bit), 32 pairs, scale 1.
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
        init_alignment(self)

    def training(self, *, device_replay: bool | None = NotProvided,
                 device_replay_capacity: int | None = NotProvided,
                 device_replay_checkpoint: bool | None = NotProvided,
                 alignment_pairs: str | None = NotProvided,
                 alignment_weight: float | None = NotProvided,
                 alignment_batch: int | None = NotProvided,
                 alignment_trunk_grad_scale: float | None = NotProvided,
                 **kwargs: Any) -> BDQConfig:
        """``DQNConfig.training`` plus the device-replay switches and the alignment head's
        settings (see the class docstring)."""
        super().training(**kwargs)
        configure_alignment(self, {
            "alignment_pairs": alignment_pairs, "alignment_weight": alignment_weight,
            "alignment_batch": alignment_batch,
            "alignment_trunk_grad_scale": alignment_trunk_grad_scale})
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
        there instead of from the metrics (Ape-X BDQ sets it for its shards too).
        """
        return bool(self.device_replay) and self.num_learners == 0

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        return super()._model_config_auto_includes | head_model_config(self)

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
        if self.device_replay and self.num_learners == 1:
            self._value_error("device_replay runs on the local learner (num_learners=0) or "
                              "on DDP learners (num_learners >= 2), not on one remote one")
        if self.device_replay and self.device_replay_capacity < 1:
            self._value_error("device_replay_capacity must be >= 1")
        validate_alignment(self)


class BDQ(DQN):
    """DQN's training loop (replay, n-step, priorities, target sync) with the BDQ loss."""

    @classmethod
    def get_default_config(cls) -> BDQConfig:
        return BDQConfig()

    def training_step(self) -> None:
        """DQN's step, or the device-replay step (:mod:`.training_step`) when configured."""
        if not self.config.device_replay:
            return super().training_step()
        return device_replay_training_step(self)

    def get_state(self, components: Any = None, *, not_components: Any = None,
                  **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        replay = getattr(self, "device_replay", None)
        if (self.config.device_replay_checkpoint and replay is not None
                and self._check_component(DEVICE_REPLAY_STATE, components, not_components)):
            state[DEVICE_REPLAY_STATE] = buffer_checkpoint_state(replay.buffer)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if DEVICE_REPLAY_STATE in state:
            ensure_device_replay(self).buffer.load_state_dict(state[DEVICE_REPLAY_STATE])


def register_bdq() -> None:
    """Registers ``BDQ`` with Tune: ``tune.Tuner("BDQ", param_space=BDQConfig()...)``."""
    from ray.tune.registry import register_trainable

    register_trainable(BDQ_NAME, BDQ)
