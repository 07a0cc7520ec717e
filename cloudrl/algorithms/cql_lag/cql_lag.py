"""``CQLLagConfig`` and ``CQLLag``: offline constrained fitted Q on RLlib's offline path.

RLlib's CQL is SAC-based (continuous actions only) and its Lagrangian is a TODO; this is
the discrete, constrained variant, built like RLlib's offline algorithms (BC, MARWIL):

* data: ``offline_data(input_=[dir], input_read_episodes=True)`` - the whole episodes
  ``cloudrl offline record`` writes (:mod:`cloudrl.offline.dataset`). RLlib's
  ``OfflinePreLearner`` unpacks them into its episode buffer and samples 1-step
  transitions; the learner connector adds NEXT_OBS (as RLlib's CQL does) and the
  ``costs`` column from each step's ``infos["cost"]``
  (:class:`~.connectors.AddCostsFromInfos`). By default the pre-learner runs in the
  driver (:class:`~.offline_data.LocalEpisodeData`); ``offline_data(offline_data_class=
  OfflineData)`` gives RLlib's Ray Data streaming instead;
* module: :class:`models.cql_lag.CQLLagTorchRLModule` (reward-Q and cost-Q heads, λ);
* learner: :class:`~.cql_lag_learner.CQLLagTorchLearner`;
* training step: one offline batch of ``train_batch_size_per_learner`` transitions per
  iteration, ``num_epochs`` passes over it in ``minibatch_size`` updates (sampling
  whole-episode rows costs more than an update on a small machine, so each sampled
  batch serves several updates).

The constraint: a per-episode SLA budget B (violations per episode, DSRL's convention) of
episodes of T steps becomes the per-step threshold d = B / T; the learner compares it with
the cost estimate (1-γ)·E[Q_c(s, π(s))] - both per-step cost rates (a constant per-step
cost c has Q_c = c / (1-γ)), so no γ-dependent rescaling of B is needed.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.connectors.common.add_observations_from_episodes_to_batch import (
    AddObservationsFromEpisodesToBatch,
)
from ray.rllib.connectors.learner import (
    AddColumnsFromEpisodesToTrainBatch,
    AddNextObservationsFromEpisodesToTrainBatch,
)
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.metrics import (
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    OFFLINE_SAMPLING_TIMER,
    TIMERS,
)

from cloudrl.algorithms.cql_lag.connectors import AddCostsFromInfos
from cloudrl.algorithms.cql_lag.lagrange import LagrangeController
from cloudrl.algorithms.cql_lag.offline_data import LocalEpisodeData

TRAINING_KEYS = ("cql_alpha", "cql_cost_alpha", "cost_budget", "episode_length",
                 "reward_scale", "cost_scale", "lagrange_mode", "lagrange_init",
                 "lagrange_lr", "lagrange_min", "lagrange_max", "pid_kp", "pid_ki",
                 "pid_kd", "lagrange_warmup", "tau", "target_network_update_freq",
                 "support_threshold", "support_data", "support_top", "bc_weight",
                 "cost_upper_alpha")


class CQLLagConfig(AlgorithmConfig):
    """Discrete CQL + cost critic + Lagrangian. ``training(...)`` takes, besides RLlib's:

    ``cql_alpha`` (CQL weight on the reward head, 1.0), ``cql_cost_alpha`` (CQL on the
    cost head: the source's formulation, 0 = off), ``cost_budget`` (SLA violations per
    episode; required), ``episode_length`` (T, 1000), ``reward_scale`` (0.01) and
    ``cost_scale`` (1.0) of the TD targets, ``lagrange_mode`` ("dual" on log λ | "pid"),
    ``lagrange_init`` (0.1), ``lagrange_lr`` (η of the dual step, 0.01),
    ``lagrange_min``/``lagrange_max`` (1e-3, 100), ``pid_kp``/``pid_ki``/``pid_kd``,
    ``lagrange_warmup`` (updates with λ frozen while the cost critic learns, 500),
    ``tau`` (Polyak rate of the target networks, 0.05; 1.0 = copy),
    ``target_network_update_freq`` (updates between target updates, 1),
    ``support_threshold`` (BCQ's τ: only actions with behaviour-cloned probability >=
    τ·max; 0.3; 0 = every valid action), ``support_data`` ("safe": the behaviour head
    learns from the episodes within ``cost_budget`` only, OSRL's BC-Safe as BCQ's
    generative model; "all": every episode), ``support_top`` (of those episodes, the
    share with the highest return the behaviour head learns from - the %BC of Chen et
    al. 2021 as BCQ's generative model; 1.0 = all of them), ``bc_weight`` (the behaviour head's
    cross-entropy, 1.0) and ``cost_upper_alpha`` (the upward cost penalty on
    out-of-data actions, 0 = off). ``lagrange_mode`` "plain" is the source's unnormalised
    dual ascent (the saturation ablation).
    """

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or CQLLag)
        self.gamma = 0.95  # Q_c converges in ~1/(tau(1-gamma)) updates
        self.lr = 3e-4
        self.train_batch_size_per_learner = 1024
        self.minibatch_size = 256
        self.cql_alpha = 1.0
        self.cql_cost_alpha = 0.0
        self.cost_budget: float | None = None
        self.episode_length = 1000
        self.reward_scale = 0.01
        self.cost_scale = 1.0
        self.lagrange_mode = "dual"
        self.lagrange_init = 0.1
        self.lagrange_lr = 0.01
        self.lagrange_min = 1e-3
        self.lagrange_max = 100.0
        self.pid_kp = 0.1
        self.pid_ki = 0.01
        self.pid_kd = 0.0
        self.lagrange_warmup = 500
        self.tau = 0.05
        self.target_network_update_freq = 1
        self.support_threshold = 0.3
        self.support_data = "safe"
        self.support_top = 1.0
        self.bc_weight = 1.0
        self.cost_upper_alpha = 0.0
        # offline data: whole episodes, one local learner, the pre-learner in the driver
        self.input_read_episodes = True
        self.dataset_num_iters_per_learner = 1
        self.offline_data_class = LocalEpisodeData
        self._is_online = False  # no env runners (as MARWIL and BC)

    def training(self, **kwargs: Any) -> CQLLagConfig:
        ours = {k: kwargs.pop(k) for k in TRAINING_KEYS if k in kwargs}
        super().training(**kwargs)
        for key, value in ours.items():
            if value is not NotProvided:
                setattr(self, key, value)
        return self

    def cost_threshold(self) -> float:
        """Per-step threshold d = cost_budget / episode_length."""
        return float(self.cost_budget) / float(self.episode_length)

    def lagrange_controller(self) -> LagrangeController:
        return LagrangeController(self.lagrange_mode, self.lagrange_init, self.lagrange_lr,
                                  self.lagrange_min, self.lagrange_max, self.pid_kp,
                                  self.pid_ki, self.pid_kd, self.lagrange_warmup)

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        from models.cql_lag import CQLLagTorchRLModule

        return RLModuleSpec(module_class=CQLLagTorchRLModule)

    def get_default_learner_class(self) -> type:
        from cloudrl.algorithms.cql_lag.cql_lag_learner import CQLLagTorchLearner

        return CQLLagTorchLearner

    def build_learner_connector(self, input_observation_space: Any,
                                input_action_space: Any, device: Any = None) -> Any:
        pipeline = super().build_learner_connector(
            input_observation_space=input_observation_space,
            input_action_space=input_action_space, device=device)
        pipeline.insert_after(AddObservationsFromEpisodesToBatch,
                              AddNextObservationsFromEpisodesToTrainBatch())
        pipeline.insert_after(AddColumnsFromEpisodesToTrainBatch, AddCostsFromInfos())
        return pipeline

    def validate(self) -> None:
        super().validate()
        if self.input_ in (None, "sampler") or not self.input_:
            self._value_error("CQLLag learns from a dataset only: set offline_data(input_="
                              "[dir]) (`cloudrl offline train --data DIR`)")
        if self.cost_budget is None or self.cost_budget <= 0:
            self._value_error(f"cost_budget must be > 0 (SLA violations per episode), got "
                              f"{self.cost_budget}")
        if self.episode_length < 1:
            self._value_error(f"episode_length must be >= 1, got {self.episode_length}")
        if self.target_network_update_freq < 1:
            self._value_error("target_network_update_freq must be >= 1")
        if self.lagrange_warmup < 0:
            self._value_error(f"lagrange_warmup must be >= 0 updates, got "
                              f"{self.lagrange_warmup}")
        if not 0 <= self.support_threshold <= 1:
            self._value_error(f"support_threshold must be in [0, 1], got "
                              f"{self.support_threshold}")
        if self.support_data not in ("safe", "all"):
            self._value_error(f"support_data must be 'safe' or 'all', got "
                              f"{self.support_data!r}")
        if not 0 < self.support_top <= 1:
            self._value_error(f"support_top must be in (0, 1], got {self.support_top}")
        if not 0 < self.tau <= 1:
            self._value_error(f"tau must be in (0, 1], got {self.tau}")
        self.lagrange_controller()  # raises on a bad mode or bounds

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        return {}


class CQLLag(Algorithm):
    """Offline constrained fitted Q (see :class:`CQLLagConfig`)."""

    @classmethod
    def get_default_config(cls) -> CQLLagConfig:
        return CQLLagConfig()

    def training_step(self) -> None:
        cfg = self.config
        with self.metrics.log_time((TIMERS, OFFLINE_SAMPLING_TIMER)):
            batch = self.offline_data.sample(num_samples=cfg.train_batch_size_per_learner,
                                             num_shards=cfg.num_learners,
                                             return_iterator=cfg.num_learners > 0)
            self.metrics.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME,
                                   cfg.train_batch_size_per_learner * max(1, cfg.num_learners),
                                   reduce="lifetime_sum")
        data = (TrainingData(data_iterators=batch) if cfg.num_learners > 0
                else TrainingData(batch=batch))
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results = self.learner_group.update(
                training_data=data, minibatch_size=cfg.minibatch_size,
                num_epochs=cfg.num_epochs,
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                    NUM_ENV_STEPS_SAMPLED_LIFETIME)},
                **self.offline_data.iter_batches_kwargs)
            self.metrics.aggregate(results, key=LEARNER_RESULTS)
