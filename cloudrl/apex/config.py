"""``ApexBDQConfig``: BDQ's settings plus the Ape-X topology (shards, broadcast, exploration).

Everything BDQ/DQN configures keeps its meaning (``n_step``, ``gamma``, ``double_q``,
``lr``, ``target_network_update_freq``, ``td_error_loss_fn``; alpha and beta of the
prioritized replay come from ``replay_buffer_config``; the batch size is
``train_batch_size_per_learner``; the number of actors is ``num_env_runners``). The
Ape-X settings go into ``.training(...)`` too:

* ``num_replay_shards`` (2): replay shard actors, each a CPU ``DeviceReplayBuffer``;
  env runner ``i`` (1-based) always writes to shard ``(i - 1) % num_replay_shards``;
* ``replay_shard_capacity`` (100_000): transitions per shard;
* ``num_cpus_per_replay_shard`` (1.0) and ``max_num_replay_shard_restarts`` (-1: always
  restart a failed shard; Ray ``max_restarts``);
* ``replay_requests_in_flight`` (2): replay batches requested ahead from every shard;
* ``broadcast_interval`` (4): learner updates between two weight broadcasts;
* ``apex_epsilon`` (0.4) and ``apex_epsilon_alpha`` (7.0): runner ``i`` of ``N`` explores
  with the constant ``epsilon ** (1 + alpha * i / (N - 1))`` (``i`` 0-based) instead of
  the ``epsilon`` schedule;
* ``max_replay_ratio`` (None: as fast as the learner goes): cap on trained samples per
  sampled env step;
* ``replay_fetch_timeout_s`` (0.05): how long one training step waits for replay batches
  (or, before learning starts, for runner results) when none is ready;
* ``checkpoint_replay_shards`` (False): put the shards' contents into checkpoints.

Defaults that differ from BDQ's: ``rollout_fragment_length`` 16 (env steps per env and
remote sample call; DQN's "auto" is ``n_step``), 2 env runners, 2 sample requests in
flight per runner.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import NotProvided

from cloudrl.algorithms.bdq.bdq import BDQConfig

_APEX_FIELDS = {
    "num_replay_shards": int, "replay_shard_capacity": int,
    "num_cpus_per_replay_shard": float, "max_num_replay_shard_restarts": int,
    "replay_requests_in_flight": int, "broadcast_interval": int,
    "apex_epsilon": float, "apex_epsilon_alpha": float,
    "replay_fetch_timeout_s": float, "checkpoint_replay_shards": bool,
}


def runner_epsilon(index: int, num_runners: int, epsilon: float = 0.4,
                   alpha: float = 7.0) -> float:
    """Ape-X's exploration rate of actor ``index`` in ``[0, num_runners)``.

    ``epsilon ** (1 + alpha * index / (num_runners - 1))``; a single actor gets ``epsilon``.
    """
    if not 0 <= index < num_runners:
        raise ValueError(f"runner index {index} outside [0, {num_runners})")
    if num_runners == 1:
        return float(epsilon)
    return float(epsilon ** (1.0 + alpha * index / (num_runners - 1)))


class ApexBDQConfig(BDQConfig):
    """``BDQConfig`` for :class:`cloudrl.apex.ApexBDQ` (see the module docstring).

    ``ApexBDQConfig().environment(...).env_runners(num_env_runners=8)
    .training(num_replay_shards=2, ...).build_algo()``. The learner is the local one
    (``num_learners=0``), on a GPU when ``num_gpus_per_learner=1``.
    """

    def __init__(self, algo_class: type | None = None) -> None:
        if algo_class is None:
            from cloudrl.apex.algorithm import ApexBDQ

            algo_class = ApexBDQ
        super().__init__(algo_class=algo_class)
        self.num_replay_shards = 2
        self.replay_shard_capacity = 100_000
        self.num_cpus_per_replay_shard = 1.0
        self.max_num_replay_shard_restarts = -1
        self.replay_requests_in_flight = 2
        self.broadcast_interval = 4
        self.apex_epsilon = 0.4
        self.apex_epsilon_alpha = 7.0
        self.max_replay_ratio: float | None = None
        self.replay_fetch_timeout_s = 0.05
        self.checkpoint_replay_shards = False
        # Ape-X keeps every actor busy: one sample request queued behind the running one.
        # Rollouts of 16 steps per env (128 with 8 envs) per remote call, not DQN's "auto"
        # (= n_step): per-call costs (report, metrics, the shard add) dominate short ones
        # (1 runner, 2 cores: 778 vs 490 env steps/s, experiments/bench_scaling.py).
        self.rollout_fragment_length = 16
        self.num_env_runners = 2
        self.max_requests_in_flight_per_env_runner = 2
        # Per-iteration sample minimum as in DQN; an iteration is reporting only.
        self.min_sample_timesteps_per_iteration = 1000

    def training(self, *, max_replay_ratio: float | None = NotProvided,
                 **kwargs: Any) -> ApexBDQConfig:
        """``BDQConfig.training`` plus the Ape-X settings (see the module docstring)."""
        apex = {k: kwargs.pop(k) for k in list(kwargs) if k in _APEX_FIELDS}
        super().training(**kwargs)
        for key, value in apex.items():
            if value is not NotProvided:
                setattr(self, key, _APEX_FIELDS[key](value))
        if max_replay_ratio is not NotProvided:
            self.max_replay_ratio = None if max_replay_ratio is None else float(
                max_replay_ratio)
        return self

    @property
    def td_errors_on_device(self) -> bool:
        """Ape-X reads the learner's per-sample priorities from ``device_td_errors``."""
        return self.num_learners == 0

    def streams_per_runner(self) -> int:
        """N-step streams a runner uses: two per vectorized env (see ``EpisodeStreams``)."""
        return 2 * self.num_envs_per_env_runner

    def validate(self) -> None:
        super().validate()
        if self.in_evaluation:  # the evaluation copy samples synchronously, as any algo
            return
        if self.num_learners != 0:
            self._value_error("Ape-X BDQ uses the local learner (num_learners=0)")
        if self.num_env_runners < 1:
            self._value_error("Ape-X samples on remote env runners (num_env_runners >= 1)")
        if self.num_replay_shards < 1:
            self._value_error("num_replay_shards must be >= 1")
        if self.num_replay_shards > self.num_env_runners:
            self._value_error("num_replay_shards must not exceed num_env_runners "
                              "(every shard is fed by its own env runners)")
        if isinstance(self.n_step, (tuple, list)):
            self._value_error("Ape-X BDQ needs a fixed int n_step")
        if self.replay_shard_capacity < self.total_train_batch_size:
            self._value_error("replay_shard_capacity must hold at least one train batch "
                              f"({self.total_train_batch_size} transitions)")
        if self.replay_requests_in_flight < 1 or self.broadcast_interval < 1:
            self._value_error("replay_requests_in_flight and broadcast_interval must be >= 1")
        if not 0.0 <= self.apex_epsilon <= 1.0 or self.apex_epsilon_alpha < 0:
            self._value_error("apex_epsilon must be in [0, 1] and apex_epsilon_alpha >= 0")
        if self.max_replay_ratio is not None and self.max_replay_ratio <= 0:
            self._value_error("max_replay_ratio must be > 0 (or None)")
