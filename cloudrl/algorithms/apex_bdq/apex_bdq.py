"""Ape-X BDQ on RLlib: ``ApexBDQConfig`` (BDQ's settings plus the Ape-X topology) and
``ApexBDQ`` (the distributed actor / replay / learner loop).

**Config.** Everything BDQ/DQN configures keeps its meaning (``n_step``, ``gamma``, ``double_q``,
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

**Algorithm.** Components (no shared mutable state; they only exchange messages and object refs):

* actors: RLlib remote env runners (``num_env_runners``), each exploring with its own
  constant epsilon, sampling continuously (``max_requests_in_flight_per_env_runner``
  sample requests queued per runner), completing n-step transitions and computing their
  initial priorities itself, and sending them straight to its replay shard
  (``runner``); the driver receives only their small reports;
* replay shards: ``num_replay_shards`` Ray actors (``shard``), managed by an
  RLlib ``FaultTolerantActorManager``;
* learner: the ``BDQTorchLearner`` of the algorithm's ``LearnerGroup``: by default the local
  one, in the driver (``num_learners=0``); with ``num_learners=1`` one remote learner actor
  (e.g. on a GPU node while the driver stays on a CPU node), with ``num_learners >= 2``
  DDP learners (gloo on CPU, NCCL on GPU) that split each replay batch.

One ``training_step`` (never waits on a runner; waits at most ``replay_fetch_timeout_s``):

1. collect the runner reports that are ready (tag ``apex_sample``) and re-issue sample
   requests to every healthy runner; env-step counters and episode metrics come from the
   reports (``metrics.aggregate`` as IMPALA does);
2. collect the replay batches that are ready (tag ``replay_sample``); once
   ``num_steps_sampled_before_learning_starts`` env steps are sampled, keep
   ``replay_requests_in_flight`` sample requests in flight per shard that holds a batch;
3. per batch: ``learner_group.update`` (tensor batch straight to the local learner), then
   the per-sample ``sum_d |delta_d|`` from ``BDQTorchLearner.device_td_errors`` goes back
   to the shard that produced the batch (fire and forget; the shard drops entries whose
   slot was overwritten meanwhile). Remote learners report each sample's position in the
   batch next to its ``|delta|`` (``bdq.training_step.update_learners``), so every priority
   reaches the slot (and stamp) it was computed on whatever the order of their shards;
4. every ``broadcast_interval`` learner updates: ``ray.put`` the learner weights once and
   send them asynchronously to all runners (``set_state`` with the learner's
   ``WEIGHTS_SEQ_NO`` as version, inference-only). Runners apply them between two
   rollouts and report the version they sample with; nobody waits for a broadcast.

Fault tolerance: a dead env runner is restarted by RLlib (``restart_failed_env_runners``,
``Algorithm.restore_env_runners`` at the top of every step), then gets the latest weights;
its actor state (epsilon, streams, n-step windows, incarnation) is rebuilt on its first
sample call; the incomplete n-step windows of the dead process (at most ``n_step - 1``
steps per open episode) are lost with it. A dead shard is restarted by Ray
(``max_restarts``); the manager marks it unhealthy on the failed call,
``probe_unhealthy_actors`` brings it back, and its previous
contents are counted as lost (``apex/shard_transitions_lost``: the last size reported by
the dead incarnation, so at most one shard's capacity per failure) along with the rows
whose add failed (``apex/rows_lost_in_flight``).

Checkpoints: ``save_to_path`` / ``restore_from_path`` as for any RLlib algorithm (learner
state, metrics with the env-step counters, the Ape-X counters); with
``checkpoint_replay_shards`` the shards' contents too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.utils.actor_manager import FaultTolerantActorManager
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
    WEIGHTS_SEQ_NO,
)

from cloudrl.algorithms.apex_bdq.runner import sample_into_shard
from cloudrl.algorithms.apex_bdq.shard import ReplayShard
from cloudrl.algorithms.bdq.bdq import BDQConfig
from cloudrl.algorithms.bdq.training_step import update_learners
from cloudrl.replay import ReplayConfig

APEX_RESULTS = "apex"
SAMPLE_TAG = "apex_sample"
WEIGHTS_TAG = "apex_weights"
REPLAY_TAG = "replay_sample"
SHARD_STATE = "apex_replay_shards"
COUNTERS_STATE = "apex_counters"
_SHARD_PROBE_TIMEOUT_S = 0.1


_APEX_FIELDS = {
    "num_replay_shards": int, "replay_shard_capacity": int,
    "num_cpus_per_replay_shard": float, "max_num_replay_shard_restarts": int,
    "replay_requests_in_flight": int, "broadcast_interval": int,
    "apex_epsilon": float, "apex_epsilon_alpha": float,
    "replay_fetch_timeout_s": float, "checkpoint_replay_shards": bool,
}


@dataclass
class ApexCounters:
    """Driver-side lifetime counters (checkpointed with the algorithm)."""

    learner_updates: int = 0
    trained_samples: int = 0
    broadcasts: int = 0
    priority_updates_sent: int = 0
    priority_updates_failed: int = 0
    shard_restarts: int = 0
    shard_transitions_lost: int = 0
    runner_restarts: int = 0


@dataclass
class ShardView:
    """What the driver last heard from one shard (its reports, never its memory)."""

    incarnation: str | None = None
    size: int = 0
    retired: set[str] = field(default_factory=set)


class ApexBDQConfig(BDQConfig):
    """``BDQConfig`` for :class:`ApexBDQ` (see the module docstring).

    ``ApexBDQConfig().environment(...).env_runners(num_env_runners=8)
    .training(num_replay_shards=2, ...).build_algo()``. The learner is the local one
    (``num_learners=0``; on a GPU when ``num_gpus_per_learner=1``), one remote learner
    (``num_learners=1``) or DDP learners (``num_learners >= 2``).
    """

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or ApexBDQ)
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
        # (1 runner, 2 cores: 778 vs 490 env steps/s, experiments/benchmarks/bench_scaling.py).
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


class ApexBDQ(Algorithm):
    """Ape-X BDQ: asynchronous actors, sharded prioritized replay, local or remote learners."""

    config: ApexBDQConfig

    @classmethod
    def get_default_config(cls) -> ApexBDQConfig:
        return ApexBDQConfig()

    @classmethod
    def default_resource_request(cls, config: Any) -> Any:
        """RLlib's bundles plus one ``{"CPU": num_cpus_per_replay_shard}`` per shard.

        Under Tune the shard actors are created inside the trial's placement group
        (Tune captures child actors), so they are reserved with the trial.
        """
        from ray.tune.execution.placement_groups import PlacementGroupFactory

        pgf = super().default_resource_request(config)
        cfg = config if isinstance(config, ApexBDQConfig) else \
            cls.get_default_config().update_from_dict(config)
        shards = [{"CPU": cfg.num_cpus_per_replay_shard}] * cfg.num_replay_shards \
            if cfg.num_cpus_per_replay_shard > 0 else []
        return PlacementGroupFactory(bundles=pgf.bundles + shards, strategy=pgf.strategy)

    # -- setup / teardown ---------------------------------------------------------------
    def setup(self, config: ApexBDQConfig) -> None:
        super().setup(config)
        cfg = self.config
        obs_space, action_space = next(iter(self.learner_group.foreach_learner(
            lambda learner: (learner.module[DEFAULT_MODULE_ID].observation_space,
                             learner.module[DEFAULT_MODULE_ID].action_space)))).get()
        rb = cfg.replay_buffer_config
        replay_cfg = ReplayConfig(
            capacity=cfg.replay_shard_capacity, alpha=float(rb.get("alpha", 0.6)),
            beta=float(rb.get("beta", 0.4)), gamma=float(cfg.gamma), device="cpu")
        shard_cls = ray.remote(
            num_cpus=cfg.num_cpus_per_replay_shard,
            max_restarts=cfg.max_num_replay_shard_restarts, max_task_retries=0,
        )(ReplayShard)
        seed = cfg.seed or 0
        self._shard_handles = [
            shard_cls.remote(i, cfg.num_replay_shards, replay_cfg, obs_space, action_space,
                             seed,
                             max(1, int(cfg.num_cpus_per_replay_shard)))
            for i in range(cfg.num_replay_shards)]
        self._shards = FaultTolerantActorManager(
            self._shard_handles,
            max_remote_requests_in_flight_per_actor=cfg.replay_requests_in_flight)
        self._shard_views = [ShardView() for _ in self._shard_handles]
        self.apex_counters = ApexCounters()
        self.runner_reports: dict[int, dict[str, Any]] = {}
        self._rows_lost_by_runner: dict[tuple[int, str], int] = {}
        self._latest_weights: dict[str, Any] | None = None
        self._priority_refs: list[Any] = []
        self._broadcast_weights()

    def cleanup(self) -> None:
        super().cleanup()
        for handle in getattr(self, "_shard_handles", []):
            ray.kill(handle, no_restart=True)
        self._shard_handles = []

    def replay_shards(self) -> list[Any]:
        """The shard actor handles, by shard index (for inspection and tests)."""
        return list(self._shard_handles)

    # -- weights ------------------------------------------------------------------------
    def _broadcast_weights(self) -> int:
        """Send the learner weights to all runners without waiting."""
        lg_state = self.learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}",
            inference_only=True)[COMPONENT_LEARNER]
        version = int(lg_state.get(WEIGHTS_SEQ_NO, 0))
        runner_state = ray.put({COMPONENT_RL_MODULE: lg_state[COMPONENT_RL_MODULE],
                                WEIGHTS_SEQ_NO: version})
        self._latest_weights = {"runner": runner_state, "version": version}
        if self.env_runner is not None:  # the local runner backs get_module() and restores
            self.env_runner.set_state({COMPONENT_RL_MODULE: lg_state[COMPONENT_RL_MODULE],
                                       WEIGHTS_SEQ_NO: version})
        self.env_runner_group.fetch_ready_async_reqs(tags=WEIGHTS_TAG, timeout_seconds=0)
        self.env_runner_group.foreach_env_runner_async(
            "set_state", tag=WEIGHTS_TAG, kwargs={"state": runner_state})
        self.apex_counters.broadcasts += 1
        return version

    def restore_env_runners(self, env_runner_group: Any) -> list[int]:
        """RLlib's restore, then the latest learner weights for the restarted runners."""
        restored = super().restore_env_runners(env_runner_group)
        if restored and env_runner_group is self.env_runner_group and self._latest_weights:
            self.apex_counters.runner_restarts += len(restored)
            env_runner_group.foreach_env_runner(
                "set_state", kwargs={"state": self._latest_weights["runner"]},
                remote_worker_ids=restored, local_env_runner=False,
                timeout_seconds=self.config.env_runner_restore_timeout_s)
        return restored

    # -- shards -------------------------------------------------------------------------
    def _note_shard_stats(self, shard_id: int, stats: dict[str, Any]) -> None:
        view = self._shard_views[shard_id]
        incarnation = stats.get("incarnation")
        if incarnation is None or incarnation in view.retired:
            return  # a late report from a dead incarnation
        if view.incarnation is not None and incarnation != view.incarnation:
            view.retired.add(view.incarnation)
            self.apex_counters.shard_restarts += 1
            self.apex_counters.shard_transitions_lost += view.size
            view.size = 0
        # Sizes only grow within an incarnation; runner acks may arrive out of order.
        view.incarnation = incarnation
        view.size = max(view.size, int(stats.get("size", 0)))

    def _restore_shards(self) -> None:
        restored = self._shards.probe_unhealthy_actors(
            timeout_seconds=_SHARD_PROBE_TIMEOUT_S, mark_healthy=True)
        for shard_id in restored:
            try:
                stats = ray.get(self._shard_handles[shard_id].stats.remote(),
                                timeout=self.config.env_runner_restore_timeout_s)
            except (ray.exceptions.RayError, TimeoutError):
                continue  # died again; its next reply reports the incarnation
            self._note_shard_stats(shard_id, stats)

    # -- the training step --------------------------------------------------------------
    def _env_steps(self) -> int:
        return int(self.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME),
                                     default=0))

    def _collect_runner_reports(self, timeout_s: float) -> int:
        cfg = self.config
        self.env_runner_group.fetch_ready_async_reqs(
            tags=[WEIGHTS_TAG, "set_state"], timeout_seconds=0)
        reports = [r for _, r in self.env_runner_group.fetch_ready_async_reqs(
            tags=SAMPLE_TAG, timeout_seconds=timeout_s)]
        if reports:
            self.metrics.aggregate([r.pop("metrics") for r in reports], key=ENV_RUNNER_RESULTS)
        for report in reports:
            self.runner_reports[report["worker_index"]] = report
            self._rows_lost_by_runner[(report["worker_index"], report["incarnation"])] = \
                report["rows_lost"]
            stats = report["shard_stats"]
            if stats:
                self._note_shard_stats(report["shard_index"], stats)
        self.env_runner_group.foreach_env_runner_async(
            sample_into_shard, tag=SAMPLE_TAG,
            kwargs={"shards": self._shard_handles, "epsilon": cfg.apex_epsilon,
                    "epsilon_alpha": cfg.apex_epsilon_alpha,
                    "streams_per_runner": cfg.streams_per_runner(),
                    "n_step": int(cfg.n_step), "gamma": float(cfg.gamma)})
        return len(reports)

    def _request_replay_batches(self, env_steps: int) -> None:
        cfg = self.config
        if env_steps < cfg.num_steps_sampled_before_learning_starts:
            return
        ratio = self.apex_counters.trained_samples / max(1, env_steps)
        if cfg.max_replay_ratio is not None and ratio >= cfg.max_replay_ratio:
            return
        batch = cfg.total_train_batch_size
        ready = [i for i in self._shards.healthy_actor_ids()
                 if self._shard_views[i].size >= batch]
        if ready:  # the manager drops requests beyond replay_requests_in_flight per shard
            self._shards.foreach_actor_async(
                "sample", tag=REPLAY_TAG, kwargs={"batch_size": batch},
                remote_actor_ids=ready * cfg.replay_requests_in_flight)

    def _settle_priority_updates(self) -> None:
        """Forget the finished priority updates; count the ones a dead shard lost."""
        if not self._priority_refs:
            return
        done, self._priority_refs = ray.wait(
            self._priority_refs, num_returns=len(self._priority_refs), timeout=0)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                self.apex_counters.priority_updates_failed += 1

    def _learn_on(self, shard_id: int, reply: dict[str, Any], env_steps: int) -> None:
        cfg, metrics = self.config, self.metrics
        batch = reply["batch"]
        # The learners see the batch positions as its replay slots: with remote (DDP)
        # learners each reports the positions of its shard of the batch next to their
        # |TD|, which map back to the shard's slots and stamps (a prioritized batch may
        # hold one slot twice, so the slot itself is no key).
        sample = {**batch, "indices": torch.arange(len(batch["indices"]))}
        learner = self.learner_group._learner
        if learner is not None:
            sample = _to_device(sample, learner.device)
        timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: env_steps,
                     NUM_AGENT_STEPS_SAMPLED_LIFETIME: metrics.peek(
                         (ENV_RUNNER_RESULTS, NUM_AGENT_STEPS_SAMPLED_LIFETIME), default={})}
        with metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results, (positions, td_abs) = update_learners(self.learner_group, sample,
                                                           timesteps)
        metrics.aggregate(results, key=LEARNER_RESULTS)
        positions = positions.cpu()
        td_abs = td_abs.detach().cpu()
        # Straight to the shard's handle, not through the manager: its per-tag in-flight
        # cap would drop updates; these are bounded by the batches fetched anyway.
        self._priority_refs.append(self._shard_handles[shard_id].update_priorities.remote(
            batch["indices"][positions], reply["stamps"][positions], td_abs,
            reply["incarnation"]))
        counters = self.apex_counters
        counters.priority_updates_sent += 1
        counters.learner_updates += 1
        counters.trained_samples += int(td_abs.shape[0])
        if counters.learner_updates % cfg.broadcast_interval == 0:
            with metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
                self._broadcast_weights()

    def training_step(self) -> None:
        """One round of the asynchronous loop (see the module docstring)."""
        cfg = self.config
        self._restore_shards()
        learning = self._env_steps() >= cfg.num_steps_sampled_before_learning_starts
        in_flight = self._shards.num_outstanding_async_reqs(REPLAY_TAG)
        # Wait for runners only when there is no replay work to wait for instead.
        self._collect_runner_reports(0.0 if learning and in_flight else
                                     cfg.replay_fetch_timeout_s)
        env_steps = self._env_steps()
        self._settle_priority_updates()
        self._request_replay_batches(env_steps)
        replies = self._shards.fetch_ready_async_reqs(
            tags=REPLAY_TAG, timeout_seconds=cfg.replay_fetch_timeout_s
            if self._shards.num_outstanding_async_reqs(REPLAY_TAG) else 0)
        for result in replies:
            if not result.ok:
                continue  # the manager marked the shard unhealthy; probed next step
            reply = result.get()
            self._note_shard_stats(result.actor_id, reply["stats"])
            if reply["batch"] is not None and reply["incarnation"] == \
                    self._shard_views[result.actor_id].incarnation:
                self._learn_on(result.actor_id, reply, env_steps)
        self._request_replay_batches(env_steps)
        self._log_apex_metrics(env_steps)

    def _log_apex_metrics(self, env_steps: int) -> None:
        counters = self.apex_counters
        gauges: dict[str, float] = {f"{k}": float(v) for k, v in asdict(counters).items()}
        gauges["replay_ratio"] = counters.trained_samples / max(1, env_steps)
        gauges["rows_lost_in_flight"] = float(sum(self._rows_lost_by_runner.values()))
        gauges["weights_version"] = float(self._latest_weights["version"]
                                          if self._latest_weights else 0)
        for i, view in enumerate(self._shard_views):
            gauges[f"shard_{i}_size"] = float(view.size)
        gauges["replay_size"] = float(sum(v.size for v in self._shard_views))
        versions = [r["weights_seq_no"] for r in self.runner_reports.values()]
        if versions:
            gauges["runner_weights_version_min"] = float(min(versions))
            gauges["runner_weights_version_max"] = float(max(versions))
        for key, value in gauges.items():
            self.metrics.log_value((APEX_RESULTS, key), value, window=1)

    # -- checkpoints --------------------------------------------------------------------
    def get_state(self, components: Any = None, *, not_components: Any = None,
                  **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self._check_component(COUNTERS_STATE, components, not_components):
            state[COUNTERS_STATE] = asdict(self.apex_counters)
        if (self.config.checkpoint_replay_shards
                and self._check_component(SHARD_STATE, components, not_components)):
            state[SHARD_STATE] = ray.get([h.get_state.remote() for h in self._shard_handles])
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if COUNTERS_STATE in state:
            known = {f.name for f in fields(ApexCounters)}
            self.apex_counters = ApexCounters(
                **{k: v for k, v in state[COUNTERS_STATE].items() if k in known})
        if SHARD_STATE in state:
            shard_states = state[SHARD_STATE]
            if len(shard_states) != len(self._shard_handles):
                raise ValueError(f"checkpoint has {len(shard_states)} replay shards, "
                                 f"this algorithm {len(self._shard_handles)}")
            stats = ray.get([h.set_state.remote(s)
                             for h, s in zip(self._shard_handles, shard_states, strict=True)])
            for i, s in enumerate(stats):
                self._note_shard_stats(i, s)
                self._shard_views[i].size = int(s["size"])  # loaded contents replace all
        if hasattr(self, "_shard_handles"):
            self._broadcast_weights()  # restored learner weights to runners and shards


def _to_device(value: Any, device: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value.to(device, non_blocking=True)


__all__ = ["APEX_RESULTS", "ApexBDQ", "ApexBDQConfig", "ApexCounters"]
