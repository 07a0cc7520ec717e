"""An env runner that records a batched vector env's steps as arrays, not per env.

RLlib's ``SingleAgentEnvRunner._sample`` handles every env of the vector env one at a
time on every step: it unbatches the observation and the actions into per-env items,
appends them to each episode (``add_env_step``), makes the per-step episode callbacks
and, when a chunk is returned, batches every list back into arrays (``to_numpy``). On
the cluster env with 32 envs that bookkeeping was about a third of the sampling time
(README, "RLlib sampling throughput").

:class:`BatchedSingleAgentEnvRunner` keeps RLlib's sampling loop — the same
env-to-module connector, module forward (exploration or inference, with RLlib's
timers), module-to-env connector and env step, in the same order, so the RNG draws are
the same — but records each step once, as the batched arrays it already is. When the
call ends it cuts every env's chunks out of the recorded ``(T, B, ...)`` arrays and
builds finished numpy ``SingleAgentEpisode`` s directly; the continuation chunks are
the same as ``SingleAgentEpisode.cut(episode_lookback_horizon)`` would make, and the
last ``episode_lookback_horizon`` rows are kept for the next call, so a continuing
chunk's lookback is a slice too. The episodes it returns equal the stock runner's:
observations, infos, actions, rewards, extra model outputs, lookback buffers,
``t_started``, flags, the pattern of ids, and the episode metrics
(``tests/test_batched_env_runner.py``). It also swaps RLlib's ``DictInfoToList``
wrapper for :class:`cloudrl.env_runners.info_list.FastDictInfoToList` (same lists).

It takes this fast path only where it is exact, and otherwise calls RLlib's own
``_sample``:

* sampling ``num_timesteps`` (not ``num_episodes``), not ``random_actions``;
* the env-runner pipelines are exactly the stacked ones of
  :mod:`cloudrl.connectors.stacked_batch` (no user connectors to feed per step);
* ``episodes_to_numpy`` on;
* no ``on_episode_created`` / ``on_episode_start`` / ``on_episode_step`` callbacks
  (classes that override them, or callback functions). ``on_episode_end`` callbacks
  run, in the order the episodes ended, with the finished (numpy) chunk and the earlier
  chunks, but at the end of the ``sample()`` call rather than on the step the episode
  ended, so they must not read the live env.

Install it with ``config.env_runners(env_runner_cls=BatchedSingleAgentEnvRunner)``
(``TrainConfig.batched_runner``, on by default for the cluster ids with the stacked
connectors).
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import numpy as np
from gymnasium.vector.utils import create_empty_array
from gymnasium.wrappers.vector import DictInfoToList
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core.columns import Columns
from ray.rllib.env.env_runner import ENV_STEP_FAILURE
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.metrics import (
    ENV_TO_MODULE_CONNECTOR,
    MODULE_TO_ENV_CONNECTOR,
    RLMODULE_INFERENCE_TIMER,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.spaces.space_utils import batch as batch_items

from cloudrl.connectors.stacked_batch import BatchedActionsToNumpy, StackLatestObservations
from cloudrl.env_runners.info_list import FastDictInfoToList

_PER_STEP_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step")


def _stack_steps(steps: list[Any]) -> Any:
    """``T`` batched items (arrays or flat dicts of arrays) -> one ``(T, B, ...)`` item."""
    if isinstance(steps[0], dict):
        return {key: np.stack([step[key] for step in steps]) for key in steps[0]}
    return np.stack([np.asarray(step) for step in steps])


def _take(stacked: Any, rows: slice, env: int) -> Any:
    """Env ``env``'s rows as contiguous copies: an episode owns its data, as RLlib's do (a
    connector that rewrites one chunk's rewards in place must not reach another chunk)."""
    if isinstance(stacked, dict):
        return {key: np.ascontiguousarray(value[rows, env]) for key, value in stacked.items()}
    return np.ascontiguousarray(stacked[rows, env])


def _concat(head: Any, tail: Any) -> Any:
    if isinstance(tail, dict):
        return {key: np.concatenate([head[key], tail[key]]) for key in tail}
    return np.concatenate([head, tail])


def _as_arrays(buffer: InfiniteLookbackBuffer, like: Any) -> Any:
    """All data of a buffer, lookback included, as arrays (``like``: an empty one's shape)."""
    if buffer.finalized:
        return buffer.data
    if buffer.data:
        return batch_items(buffer.data)
    if isinstance(like, dict):
        return {key: value[:0, 0] for key, value in like.items()}
    return like[:0, 0]


class _Start:
    """Where a chunk starts in a recording: at the episode chunk the call began with
    (``episode``, its first observation on the call's start row), or at a reset
    observation recorded on ``row`` (a new episode, with RLlib's id if it made one)."""

    __slots__ = ("episode", "row", "id_")

    def __init__(self, episode: SingleAgentEpisode | None, row: int,
                 id_: str | None = None) -> None:
        self.episode = episode
        self.row = row
        self.id_ = id_


class BatchedSingleAgentEnvRunner(SingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` that records steps as batched arrays (see module doc)."""

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        self._batched_obs: Any = None  # the env's latest batched observation (None: reset)
        self._batched_infos: list[dict] = []
        self._tail: dict | None = None  # the last call's rows kept for lookback
        self._ongoing_chunks_to_return: list[SingleAgentEpisode] = []
        super().__init__(config=config, **kwargs)  # calls make_env

    def make_env(self) -> None:
        super().make_env()
        if type(self.env) is DictInfoToList:  # RLlib's wrapper: the same lists, faster
            self.env = FastDictInfoToList(self.env.env)
        self._batched_obs = None

    def _fast_path_reason(self, num_timesteps, num_episodes, random_actions) -> str | None:
        """Why this call must take RLlib's own ``_sample`` (None: the fast path is exact)."""
        if num_timesteps is None or num_episodes is not None:
            return "samples whole episodes"
        if random_actions:
            return "random actions"
        if self.module is None or not self.episodes_to_numpy:
            return "no module or episodes not numpy'd"
        e2m = [type(c) for c in getattr(self._env_to_module, "connectors", [None])]
        m2e = [type(c) for c in getattr(self._module_to_env, "connectors", [None])]
        if e2m != [StackLatestObservations] or m2e != [BatchedActionsToNumpy]:
            return "env-runner pipelines are not exactly the stacked ones"
        for name in _PER_STEP_CALLBACKS:
            if getattr(self.config, f"callbacks_{name}", None):
                return f"{name} callback function"
            for callback in self._callbacks:
                if getattr(type(callback), name) is not getattr(RLlibCallback, name):
                    return f"{type(callback).__name__}.{name}"
        return None

    def _sample(self, *, num_timesteps: int | None = None, num_episodes: int | None = None,
                explore: bool, random_actions: bool = False, force_reset: bool = False):
        if self._fast_path_reason(num_timesteps, num_episodes, random_actions) is not None:
            episodes = super()._sample(num_timesteps=num_timesteps, num_episodes=num_episodes,
                                       explore=explore, random_actions=random_actions,
                                       force_reset=force_reset)
            self._sync_batched()  # RLlib's loop moved the envs on: take up where it stopped
            return episodes
        return self._sample_batched(num_timesteps, explore, force_reset)

    # ------------------------------------------------------------------ fast path
    def _reset_batched(self, explore: bool) -> None:
        self._reset_envs_and_episodes(explore)  # RLlib's: episodes, callbacks, to_module
        self._sync_batched()

    def _sync_batched(self) -> None:
        """The batched latest observation and infos, from the ongoing episodes (an episode
        that awaits its reset has none: zeros, never read); no recorded tail."""
        self._tail = None
        episodes = self._ongoing_episodes
        if any(episode is None for episode in episodes):
            self._batched_obs = None
            return
        batched = create_empty_array(self.env.single_observation_space, n=self.num_envs,
                                     fn=np.zeros)
        for env, episode in enumerate(episodes):
            if episode.is_reset:
                latest = episode.get_observations(-1)
                if isinstance(batched, dict):
                    for key in batched:
                        batched[key][env] = latest[key]
                else:
                    batched[env] = latest
        self._batched_obs = dict(batched) if isinstance(batched, dict) else batched
        self._batched_infos = [episode.get_infos(-1) if episode.is_reset else {}
                               for episode in episodes]

    def _sample_batched(self, num_timesteps: int, explore: bool, force_reset: bool):
        if force_reset or self._needs_initial_reset or self._batched_obs is None:
            self._reset_batched(explore)
        done_chunks: list[SingleAgentEpisode] = []
        ts = 0
        while True:
            rec = _Recording(self._batched_obs, self._batched_infos, self._tail)
            # an episode that ended on the last call's last step resets on this call's first
            awaiting_reset = np.array([not e.is_reset for e in self._ongoing_episodes])
            ended: list[tuple[int, int]] = []  # (env, its last observation row), in order
            failed = False
            while ts < num_timesteps:
                to_module, self._cached_to_module = self._cached_to_module, None
                to_env = self._forward(to_module, explore, ts)
                actions = to_env.pop(Columns.ACTIONS)
                actions_for_env = to_env.pop(Columns.ACTIONS_FOR_ENV, actions)
                results = self._try_env_step(actions_for_env)
                if isinstance(results, str) and results == ENV_STEP_FAILURE:
                    failed = True
                    break
                observations, rewards, terminateds, truncateds, infos = results
                row = rec.add(actions, to_env, observations, rewards, terminateds,
                              truncateds, infos, self._weights_seq_no)
                stepped = ~awaiting_reset
                ts += int(stepped.sum())
                done = (np.asarray(terminateds) | np.asarray(truncateds)) & stepped
                ended += [(env, row) for env in np.flatnonzero(done).tolist()]
                awaiting_reset = done
                self._batched_obs, self._batched_infos = observations, infos
                self._cached_to_module = self._env_to_module(
                    episodes=self._ongoing_episodes, batch={}, explore=explore,
                    rl_module=self.module, shared_data=self._shared_data,
                    metrics=self.metrics, metrics_prefix_key=(ENV_TO_MODULE_CONNECTOR,),
                    batched_observations=observations)
            done_chunks += self._finish(rec, ended, keep_ongoing=not failed,
                                        awaiting_reset=awaiting_reset)
            if not failed:
                break
            ts = 0  # as RLlib: the ongoing chunks are dropped and the envs reset
            self._reset_batched(explore)
        ongoing = self._ongoing_chunks_to_return
        self._done_episodes_for_metrics.extend(done_chunks)
        self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=ts)
        self._increase_sampled_metrics(ts, len(done_chunks))
        return done_chunks + ongoing

    def _forward(self, to_module: dict, explore: bool, ts: int) -> dict:
        if explore:
            runners = self.config.num_env_runners or 1
            t = (self.num_env_steps_sampled_lifetime // runners + ts) * runners
            with self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
                to_env = self.module.forward_exploration(to_module, t=t)
        else:
            with self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
                to_env = self.module.forward_inference(to_module)
        return self._module_to_env(rl_module=self.module, batch=to_env,
                                   episodes=self._ongoing_episodes, explore=explore,
                                   shared_data=self._shared_data, metrics=self.metrics,
                                   metrics_prefix_key=(MODULE_TO_ENV_CONNECTOR,))

    def _finish(self, rec: _Recording, ended: list[tuple[int, int]], keep_ongoing: bool,
                awaiting_reset: np.ndarray) -> list[SingleAgentEpisode]:
        """Cut the recorded steps into chunks, make the ``on_episode_end`` callbacks, set
        the continuation chunks (as RLlib's ``cut()``) and return the finished chunks."""
        data = rec.stacked()
        ends: dict[int, list[int]] = {}
        for env, row in ended:
            ends.setdefault(env, []).append(row)
        by_end: dict[tuple[int, int], SingleAgentEpisode] = {}
        tails: list[_Start] = []
        for env in range(self.num_envs):
            start = self._call_start(env, rec)
            for end in ends.get(env, []):
                by_end[(env, end)] = self._chunk(data, rec, env, start, end)[0]
                start = _Start(None, end + 1)
            tails.append(start)
        finished = []
        for env, end in ended:
            episode = by_end[(env, end)]
            make_callback("on_episode_end", callbacks_objects=self._callbacks,
                          callbacks_functions=self.config.callbacks_on_episode_end,
                          kwargs=dict(episode=episode, env_runner=self,
                                      metrics_logger=self.metrics, env=self.env.unwrapped,
                                      rl_module=self.module, env_index=env,
                                      prev_episode_chunks=self._ongoing_episodes_for_metrics[
                                          episode.id_]))
            finished.append(episode)
        self._ongoing_chunks_to_return = []
        if not keep_ongoing:
            return finished
        last = rec.rows - 1
        lookback = self.config.episode_lookback_horizon
        successors, history = [], []
        for env, start in enumerate(tails):
            if awaiting_reset[env] or start.row > last:  # ended on the call's last step:
                successors.append(self._fresh_episode())  # RLlib's new, empty episode
                history.append(0)
                continue
            chunk, first = self._chunk(data, rec, env, start, last)
            if chunk.t > 0:
                self._ongoing_episodes_for_metrics[chunk.id_].append(chunk)
                self._ongoing_chunks_to_return.append(chunk)
            successors.append(_successor(chunk, lookback, data, env, last)
                              if len(chunk) >= lookback else chunk.cut(lookback))
            history.append(last - first)  # this episode's steps on the recorded rows
        self._ongoing_episodes = successors
        self._tail = rec.tail(lookback, history)
        return finished

    def _call_start(self, env: int, rec: _Recording) -> _Start:
        """Where env ``env``'s first chunk of this call starts: the episode it continues,
        or (an episode that ended on the last call's last step) the reset after row 0."""
        episode = self._ongoing_episodes[env]
        if episode.is_reset:
            return _Start(episode, rec.start)
        return _Start(None, rec.start + 1, episode.id_)

    def _fresh_episode(self) -> SingleAgentEpisode:
        return SingleAgentEpisode(observation_space=self.env.single_observation_space,
                                  action_space=self.env.single_action_space)

    def _chunk(self, data: dict, rec: _Recording, env: int, start: _Start,
               end: int) -> tuple[SingleAgentEpisode, int]:
        """Env ``env``'s chunk from ``start`` to observation row ``end`` (inclusive), and
        the first recorded row it covers (its lookback included where recorded)."""
        head = start.episode
        lookback = head.observations.lookback if head is not None else 0
        # the lookback steps are recorded tail rows, unless the chunk the call began with
        # came from RLlib's own loop: then they are prepended from that episode object
        prepend = head is not None and lookback > rec.history(env)
        first = start.row if prepend else start.row - lookback
        obs_first = first + 1 if prepend else first  # the head holds its start obs too
        obs = _take(data["obs"], slice(obs_first, end + 1), env)
        infos = rec.infos_of(env, obs_first, end + 1)
        steps = slice(first, end)
        acts = _take(data["actions"], steps, env)
        rews = _take(data["rewards"], steps, env)
        extras = {key: _take(value, steps, env) for key, value in data["extras"].items()}
        if prepend:
            obs = _concat(_as_arrays(head.observations, data["obs"]), obs)
            infos = list(head.infos.data) + infos
            acts = _concat(_as_arrays(head.actions, data["actions"]), acts)
            rews = np.concatenate([_as_arrays(head.rewards, data["rewards"]), rews])
            extras = {key: _concat(_as_arrays(head.extra_model_outputs[key], value), value)
                      if key in head.extra_model_outputs else value
                      for key, value in extras.items()}
        # a key the chunk did not have yet starts without lookback (as add_env_step)
        extra_buffers = {key: InfiniteLookbackBuffer(
            value, lookback if head is not None and key in head.extra_model_outputs else 0)
            for key, value in extras.items()}
        if head is not None:
            id_, t_started, custom = head.id_, head.t_started, head.custom_data
        else:
            id_, t_started, custom = start.id_ or uuid.uuid4().hex, 0, {}
        stepped = end > start.row
        episode = SingleAgentEpisode(
            id_, observations=obs, observation_space=self.env.single_observation_space,
            infos=infos, actions=acts, action_space=self.env.single_action_space,
            rewards=rews,
            terminated=bool(data["terminateds"][end - 1, env]) if stepped else False,
            truncated=bool(data["truncateds"][end - 1, env]) if stepped else False,
            extra_model_outputs=extra_buffers, t_started=t_started,
            len_lookback_buffer=lookback)
        episode._custom_data = custom
        if stepped:
            episode._start_time = rec.times[start.row]
            episode._last_step_time = rec.times[end - 1]
        return episode, first


def _successor(chunk: SingleAgentEpisode, lookback: int, data: dict, env: int,
               last: int) -> SingleAgentEpisode:
    """``chunk.cut(lookback)`` for a chunk with at least ``lookback`` steps, from the rows
    (RLlib's cut reads them back through the episode's getters: ~5x slower)."""
    rows, steps = slice(last - lookback, last + 1), slice(last - lookback, last)
    successor = SingleAgentEpisode(
        chunk.id_, observations=_take(data["obs"], rows, env),
        observation_space=chunk.observation_space,
        infos=chunk.infos.data[len(chunk.infos.data) - lookback - 1:],
        actions=_take(data["actions"], steps, env), action_space=chunk.action_space,
        rewards=_take(data["rewards"], steps, env),
        extra_model_outputs={key: _take(value, steps, env)
                             for key, value in data["extras"].items()},
        t_started=chunk.t, len_lookback_buffer=lookback)
    successor._custom_data = copy.deepcopy(chunk.custom_data)
    return successor


class _Recording:
    """One ``sample()`` call's steps, batched. Rows before ``start`` are the last call's
    tail (kept for the lookback of continuing episodes); row ``start`` is the observation
    the call began at; action row ``r`` leads from observation row ``r`` to ``r + 1``."""

    def __init__(self, obs: Any, infos: list[dict], tail: dict | None) -> None:
        tail = tail or {"obs": [], "infos": [], "actions": [], "extras": [], "rewards": [],
                        "terminateds": [], "truncateds": [], "seq_nos": [], "times": [],
                        "history": None}
        self.start = len(tail["obs"])
        self.obs = tail["obs"] + [obs]
        self.infos = tail["infos"] + [infos]
        self.actions: list[Any] = tail["actions"]
        self.extras: list[dict] = tail["extras"]
        self.rewards: list[Any] = tail["rewards"]
        self.terminateds: list[Any] = tail["terminateds"]
        self.truncateds: list[Any] = tail["truncateds"]
        self.seq_nos: list[int] = tail["seq_nos"]
        self.times: list[float] = tail["times"]
        self._history = tail["history"]

    @property
    def rows(self) -> int:
        return len(self.obs)

    def history(self, env: int) -> int:
        """How many steps of env ``env``'s ongoing episode the tail rows hold."""
        return 0 if self._history is None else self._history[env]

    def add(self, actions, extras, obs, rewards, terminateds, truncateds, infos,
            seq_no: int) -> int:
        self.actions.append(actions)
        self.extras.append(extras)
        self.obs.append(obs)
        self.rewards.append(rewards)
        self.terminateds.append(terminateds)
        self.truncateds.append(truncateds)
        self.infos.append(infos)
        self.seq_nos.append(seq_no)
        self.times.append(time.perf_counter())
        return len(self.obs) - 1

    def infos_of(self, env: int, first: int, stop: int) -> list[dict]:
        return [self.infos[row][env] for row in range(first, stop)]

    def tail(self, lookback: int, history: list[int]) -> dict:
        """The rows the next call's continuing episodes may need as lookback."""
        n = min(lookback, len(self.actions))
        last = self.rows - 1
        return {"obs": self.obs[last - n:last], "infos": self.infos[last - n:last],
                "actions": self.actions[len(self.actions) - n:],
                "extras": self.extras[len(self.extras) - n:],
                "rewards": self.rewards[len(self.rewards) - n:],
                "terminateds": self.terminateds[len(self.terminateds) - n:],
                "truncateds": self.truncateds[len(self.truncateds) - n:],
                "seq_nos": self.seq_nos[len(self.seq_nos) - n:],
                "times": self.times[len(self.times) - n:],
                "history": [min(n, h) for h in history]}

    def stacked(self) -> dict[str, Any]:
        steps = len(self.actions)
        batch = len(self.rewards[0]) if steps else 0
        extras: dict[str, Any] = {}
        if steps:
            extras = {key: _stack_steps([e[key] for e in self.extras])
                      for key in self.extras[-1]}
            extras[WEIGHTS_SEQ_NO] = np.broadcast_to(
                np.asarray(self.seq_nos)[:, None], (steps, batch))
        return {"obs": _stack_steps(self.obs),
                "actions": _stack_steps(self.actions) if steps else None,
                "rewards": np.stack(self.rewards) if steps else None,
                "terminateds": np.stack(self.terminateds) if steps else None,
                "truncateds": np.stack(self.truncateds) if steps else None,
                "extras": extras}
