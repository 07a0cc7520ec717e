"""BDQ training step on the device-resident replay (``BDQConfig.training(device_replay=True)``).

What one ``BDQ.training_step`` does here (DQN's loop, with the replay swapped):

1. sample episode chunks from the env runners (synchronous, as DQN does);
2. convert the new chunks ONCE into single-step transitions (obs dict incl.
   ``action_mask``, next obs, int64 ``(D,)`` actions, reward, terminated, truncated,
   stream id) and ``add`` them to a :class:`~cloudrl.replay.DeviceReplayBuffer` on the
   learner's device; n-step returns are assembled there (config ``n_step``, ``gamma``);
3. once ``num_steps_sampled_before_learning_starts`` env steps are sampled, run the
   configured number of updates (``calculate_rr_weights``, i.e. ``training_intensity``):
   ``sample(total_train_batch_size)`` -> a ``MultiAgentBatch`` of device tensors with
   RLlib column names (``obs``, ``new_obs``, ``actions``, ``rewards``, ``terminateds``,
   ``discounts``, ``weights``) -> ``learner_group.update(batch=...)`` -> priorities from
   the learner's per-sample ``sum_d |delta_d|`` tensor (no host round trip);
4. sync weights to the env runners; target-net sync happens in the learner
   (``DQNLearner.after_gradient_based_update``, by sampled env steps) as in DQN.

Learner-connector bypass (RLlib 2.60): ``Learner.update`` runs the learner connector
only when it gets ``episodes``; a ``MultiAgentBatch`` whose tensors are already torch
tensors on the learner's device goes straight to ``_update`` (``_make_batch_if_necessary``
converts only numpy leaves or tensors on another device). With ``num_learners=0``
``LearnerGroup.update(batch=...)`` calls the local ``Learner.update`` in-process, so the
batch never leaves the device. With ``num_learners > 1`` (DDP: gloo on CPU, NCCL on GPU)
the buffer lives on the driver's CPU and :func:`update_learners` sends each learner one
contiguous shard with its replay slots; the learners report slots and TD errors
together, so priorities return to the right rows.

Streams: each open episode (by ``id_``) gets a small integer stream id, released when
the episode ends; the buffer keeps at most ``n_step - 1`` pending rows per stream.
There are twice as many streams as env slots (env runners x envs per runner) so that
an episode abandoned by its env runner (a reset without an end) cannot block a slot;
a stream is reused only when all are taken (oldest first; its stale pending rows would
then join the new episode's first window, which RLlib's runners do not cause).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    REPLAY_BUFFER_ADD_DATA_TIMER,
    REPLAY_BUFFER_RESULTS,
    REPLAY_BUFFER_SAMPLE_TIMER,
    REPLAY_BUFFER_UPDATE_PRIOS_TIMER,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TD_ERROR_KEY,
    TIMERS,
)

from cloudrl.algorithms.bdq.bdq_learner import DISCOUNTS, REPLAY_INDICES
from cloudrl.replay import DeviceReplayBuffer, ReplayConfig


@dataclass
class EpisodeStreams:
    """Maps open episode ids to stream ids in ``[0, num_streams)``; frees them at episode end."""

    num_streams: int
    open_steps: dict[str, int] = field(default_factory=dict)  # steps added per open episode
    _ids: dict[str, int] = field(default_factory=dict)
    _evicted: list[int] = field(default_factory=list)

    def stream_of(self, episode_id: str) -> int:
        if episode_id not in self._ids:
            taken = set(self._ids.values())
            free = [s for s in range(self.num_streams) if s not in taken]
            if not free:  # all taken: reuse the oldest (dicts keep insertion order)
                oldest = next(iter(self._ids))
                free = [self._ids.pop(oldest)]
                self.open_steps.pop(oldest, None)
                self._evicted.append(free[0])
            self._ids[episode_id] = free[0]
        return self._ids[episode_id]

    def take_evicted(self) -> list[int]:
        """Streams handed to a new episode while an old one never ended (its env runner
        died, say) since the last call: the buffer must drop their pending rows
        (``DeviceReplayBuffer.discard_pending``) before the new rows go in, or the new
        episode's first windows would join the dead one's rows."""
        evicted, self._evicted = self._evicted, []
        return evicted

    def advance(self, episode_id: str, steps: int, done: bool) -> None:
        if done:
            self._ids.pop(episode_id, None)
            self.open_steps.pop(episode_id, None)
        else:
            self.open_steps[episode_id] = self.open_steps.get(episode_id, 0) + steps

    def pending_rows(self, n_step: int) -> int:
        """Rows the buffer still holds back (incomplete n-step windows of open episodes)."""
        return sum(min(n_step - 1, steps) for steps in self.open_steps.values())


def _stack_obs(observations: Any) -> dict[str, np.ndarray]:
    if isinstance(observations, dict):
        return {k: np.asarray(v) for k, v in observations.items()}
    keys = observations[0].keys()  # a list of per-step dicts (episode not yet numpy)
    return {k: np.stack([o[k] for o in observations]) for k in keys}


def episodes_to_transitions(episodes: list[Any], streams: EpisodeStreams
                            ) -> dict[str, Any] | None:
    """Single-step transitions of new episode chunks, in time order per episode (numpy)."""
    parts: list[dict[str, Any]] = []
    for ep in episodes:
        n = len(ep)
        if n == 0:
            continue
        obs = _stack_obs(ep.get_observations())  # n + 1 observations of this chunk
        ended = np.zeros(n, dtype=bool)
        terminated, truncated = ended.copy(), ended.copy()
        terminated[-1], truncated[-1] = bool(ep.is_terminated), bool(ep.is_truncated)
        parts.append({
            "obs": {k: v[:-1] for k, v in obs.items()},
            "next_obs": {k: v[1:] for k, v in obs.items()},
            "action": np.asarray(ep.get_actions()).astype(np.int64).reshape(n, -1),
            "reward": np.asarray(ep.get_rewards(), dtype=np.float32),
            "terminated": terminated, "truncated": truncated,
            "stream_id": np.full(n, streams.stream_of(ep.id_), dtype=np.int64),
        })
        streams.advance(ep.id_, n, bool(ep.is_done))
    if not parts:
        return None
    out: dict[str, Any] = {}
    for key in parts[0]:
        if key in ("obs", "next_obs"):
            out[key] = {k: np.concatenate([p[key][k] for p in parts]) for k in parts[0][key]}
        else:
            out[key] = np.concatenate([p[key] for p in parts])
    return out


@dataclass
class DeviceReplay:
    """The algorithm's device buffer and its episode-to-stream map."""

    buffer: DeviceReplayBuffer
    streams: EpisodeStreams
    num_added: int = 0


def ensure_device_replay(algo: Any) -> DeviceReplay:
    """Creates ``algo.device_replay`` on the local learner's device on first use."""
    replay = getattr(algo, "device_replay", None)
    if replay is not None:
        return replay
    config, learner = algo.config, algo.learner_group._learner
    if learner is not None:
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        obs_space, action_space, device = (module.observation_space, module.action_space,
                                           learner.device)
    else:  # remote (DDP) learners: the buffer lives on the driver's CPU
        obs_space, action_space = algo.env_runner_group.get_spaces()[DEFAULT_MODULE_ID]
        device = torch.device("cpu")
    slots = max(1, config.num_env_runners) * config.num_envs_per_env_runner
    rb = config.replay_buffer_config
    replay_cfg = ReplayConfig(
        capacity=config.device_replay_capacity, alpha=float(rb.get("alpha", 0.6)),
        beta=float(rb.get("beta", 0.4)), n_step=_n_step(config), gamma=float(config.gamma),
        num_streams=2 * slots, device=device)
    buffer = DeviceReplayBuffer(replay_cfg, obs_space, action_shape=(len(action_space.nvec),))
    algo.device_replay = DeviceReplay(buffer, EpisodeStreams(2 * slots))
    return algo.device_replay


def buffer_checkpoint_state(buffer: DeviceReplayBuffer) -> dict[str, Any]:
    """``buffer.state_dict()`` without pending n-step rows.

    A restored algorithm starts new episodes, so the open episodes' incomplete windows
    (at most ``n_step - 1`` rows each) can never complete; they are dropped.
    """
    state = dict(buffer.state_dict())
    pending = dict(state["pending"])
    pending["valid"] = torch.zeros_like(pending["valid"])
    state["pending"] = pending
    return state


def replay_batch(sample: dict[str, Any], with_indices: bool = False) -> MultiAgentBatch:
    """A ``MultiAgentBatch`` (default module) of device tensors with RLlib column names;
    ``with_indices`` adds the replay slots (``REPLAY_INDICES``) for remote learners."""
    columns = {Columns.OBS: sample["obs"], Columns.NEXT_OBS: sample["next_obs"],
               Columns.ACTIONS: sample["actions"], Columns.REWARDS: sample["rewards"],
               Columns.TERMINATEDS: sample["dones"], DISCOUNTS: sample["discounts"],
               "weights": sample["weights"]}
    if with_indices:
        columns[REPLAY_INDICES] = sample["indices"]
    size = int(sample["rewards"].shape[0])
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=size)


def _n_step(config: Any) -> int:
    n = config.n_step
    if isinstance(n, (tuple, list)):
        raise ValueError("device_replay needs a fixed int n_step")
    return int(n)


def update_learners(learner_group: Any, sample: dict[str, Any], timesteps: dict[str, Any]
                    ) -> tuple[list[dict[str, Any]], tuple[torch.Tensor, torch.Tensor]]:
    """One update on ``sample``: (learner results, (replay slots, |TD| sums) to reprioritise).

    Local learner: the batch stays on its device and the priorities come from
    ``BDQTorchLearner.device_td_errors`` (no host copy). Remote (DDP) learners: the
    batch carries its replay slots (``REPLAY_INDICES``); ``LearnerGroup`` splits it into
    one contiguous shard per learner, DDP averages their gradients, and each learner
    reports its shard's slots next to its TD errors, so every priority goes back to the
    row it was computed on whatever the order of the shards' results.
    """
    if learner_group.is_local:
        results = learner_group.update(batch=replay_batch(sample), timesteps=timesteps)
        td_abs = learner_group._learner.device_td_errors.pop(DEFAULT_MODULE_ID)
        slots = sample["indices"]
    else:
        results = learner_group.update(batch=replay_batch(sample, with_indices=True),
                                       timesteps=timesteps)
        slots_parts, td_parts = [], []
        for res in results:
            module_results = res[DEFAULT_MODULE_ID]
            slots_parts += _series(module_results.pop(REPLAY_INDICES))
            td_parts += _series(module_results.pop(TD_ERROR_KEY))
        slots, td_abs = torch.cat(slots_parts).long(), torch.cat(td_parts).float()
    for res in results:  # never aggregate a per-sample series into the algo metrics
        for module_results in res.values():
            if isinstance(module_results, dict):
                module_results.pop(TD_ERROR_KEY, None)
                module_results.pop(REPLAY_INDICES, None)
    return results, (slots, td_abs)


def _series(stats: Any) -> list[torch.Tensor]:
    """The tensors of an ``item_series`` metric (its ``peek()``) as flat CPU tensors."""
    values = stats.peek() if hasattr(stats, "peek") else stats
    values = values if isinstance(values, (list, tuple)) else [values]
    return [torch.as_tensor(np.asarray(v.cpu() if torch.is_tensor(v) else v)).reshape(-1)
            for v in values]


def device_replay_training_step(algo: Any) -> None:
    """One DQN-style training step on the device replay (see the module docstring)."""
    config, metrics = algo.config, algo.metrics
    replay = ensure_device_replay(algo)
    store_weight, train_weight = calculate_rr_weights(config)
    for _ in range(store_weight):
        with metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            episodes, runner_results = synchronous_parallel_sample(
                worker_set=algo.env_runner_group, concat=True,
                sample_timeout_s=config.sample_timeout_s, _uses_new_env_runners=True,
                _return_metrics=True)
        metrics.aggregate(runner_results, key=ENV_RUNNER_RESULTS)
        with metrics.log_time((TIMERS, REPLAY_BUFFER_ADD_DATA_TIMER)):
            transitions = episodes_to_transitions(episodes, replay.streams)
            evicted = replay.streams.take_evicted()
            if evicted:
                replay.buffer.discard_pending(evicted)
            if transitions is not None:
                replay.buffer.add(transitions)
                replay.num_added += len(transitions["reward"])
    metrics.log_value((REPLAY_BUFFER_RESULTS, "device_replay_size"), len(replay.buffer),
                      window=1)
    metrics.log_value((REPLAY_BUFFER_RESULTS, "device_replay_rows_added"),
                      replay.num_added, window=1)
    env_steps = metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
    if env_steps < config.num_steps_sampled_before_learning_starts or not len(replay.buffer):
        return
    timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: env_steps,
                 NUM_AGENT_STEPS_SAMPLED_LIFETIME: metrics.peek(
                     (ENV_RUNNER_RESULTS, NUM_AGENT_STEPS_SAMPLED_LIFETIME), default={})}
    results: list[dict[str, Any]] = []
    for _ in range(train_weight):
        with metrics.log_time((TIMERS, REPLAY_BUFFER_SAMPLE_TIMER)):
            sample = replay.buffer.sample(config.total_train_batch_size)
        with metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results, priorities = update_learners(algo.learner_group, sample, timesteps)
            metrics.aggregate(results, key=LEARNER_RESULTS)
        with metrics.log_time((TIMERS, REPLAY_BUFFER_UPDATE_PRIOS_TIMER)):
            replay.buffer.update_priorities(*priorities)
    with metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
        algo.env_runner_group.sync_weights(
            from_worker_or_learner_group=algo.learner_group,
            policies={DEFAULT_MODULE_ID}, global_vars=None, inference_only=True)


__all__ = ["DeviceReplay", "EpisodeStreams", "buffer_checkpoint_state",
           "device_replay_training_step", "ensure_device_replay", "episodes_to_transitions",
           "replay_batch", "update_learners"]
