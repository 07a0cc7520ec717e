"""Phase 3 of preference alignment: the learner connector that rewards with the reward model.

:class:`LearnedRewardConnector` is a learner ``ConnectorV2`` piece. It rewrites the rewards
in the episodes the learner gets, before any default piece turns them into a batch:

    r = mix * r_model + (1 - mix) * r_env        (mix = 1: replace, 0: the env reward)

``r_env`` is what the env returned, already multiplied by ``TrainConfig.reward_scale``.
``r_model`` is the reward net's (:mod:`models.reward_net`, ensemble mean) output,
**normalised with fixed statistics from the pair dataset** (mean and standard deviation
of the net's per-step output over every step of every pair, both sides; they are
recomputed only when the net changes, i.e. after a re-query fine-tune, so the reward of a
state does not drift with the batches) and scaled like the env reward:

    r_model(s, s') = reward_scale * target_std * (net(s, s') - mean) / std

``target_std`` is in raw env-reward units per step (the env's own reward has a per-step
standard deviation of a few units at the default alpha/beta). Fixed statistics, not a
running mean/std: PPO's value targets and DQN's replayed transitions stay consistent
between re-queries, and the reward of a transition is a function of the transition alone.

Which observations: the reward of step t (action a_t taken on o_t) is ``net(o_t, o_{t+1})``
for a transition net (the step's SLA violations are read from the change of the violation
EMA between the two) and ``net(o_{t+1})``, the state the action led to, for a state net
(reward models trained before transition rewards). Either way the connector hands the net
both observations of every step.

Where in the pipeline (``config.learners(learner_connector=..)`` puts custom pieces
first, before RLlib's defaults):

* PPO/APPO/IMPALA: the learner prepends ``AddOneTsToEpisodesAndTruncate`` before this
  piece, so episodes carry one artificial last step (reward 0, masked out of the loss);
  it is left alone (``shared_data["_added_loss_mask_for_valid_episode_ts"]``). GAE runs
  at the end of the pipeline, on the rewritten rewards (value targets and advantages
  follow the learned reward);
* DQN/BDQ: episodes come from the replay buffer as ``(o_t, a_t, R, o_{t+n})`` with R the
  n-step discounted sum of env rewards. The learned n-step sum
  ``sum_{k<n} gamma^k r_model(o_{t+k}, o_{t+k+1})`` needs the intermediate observations;
  :class:`LearnedRewardPrioritizedEpisodeReplayBuffer` (RLlib's prioritized episode
  replay) attaches them to every sampled episode (``custom_data``). n = 1 needs nothing
  extra.

The connector's state (``get_state``/``set_state``: the net's weights and the
normalisation) is what the re-query loop (:mod:`cloudrl.alignment.requery`) pushes to the
learners after each fine-tune (:func:`push_reward_state`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
    PrioritizedEpisodeReplayBuffer,
)

from models.reward_net import RewardEnsemble, build_reward_ensemble

OBS_PARTS = ("macro", "servers", "jobs")
INTERMEDIATE_OBS = "learned_reward_intermediate_obs"
ADDED_TS = "_added_loss_mask_for_valid_episode_ts"
MODEL_REWARD_KEY = "learned_reward/model_mean"
ENV_REWARD_KEY = "learned_reward/env_mean"


# ----------------------------------------------------------------------------- helpers


def stack_obs(observations: Any) -> dict[str, np.ndarray]:
    """Observations as ``{part: (n, ...)}`` from a list of obs dicts or a dict of arrays."""
    if isinstance(observations, Mapping):
        return {k: np.asarray(observations[k], np.float32) for k in OBS_PARTS}
    return {k: np.stack([np.asarray(o[k], np.float32) for o in observations])
            for k in OBS_PARTS}


def concat_obs(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in OBS_PARTS}


def transitions(observations: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(o_0..o_{n-1}, o_1..o_n) of n+1 consecutive observations, each ``{part: (n, ...)}``."""
    obs = stack_obs(observations)
    return {k: v[:-1] for k, v in obs.items()}, {k: v[1:] for k, v in obs.items()}


def _chunk(obs: dict[str, np.ndarray], start: int, stop: int) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v[start:stop]))
            for k, v in obs.items() if k in OBS_PARTS}


@torch.no_grad()
def net_rewards(model: RewardEnsemble, prev: dict[str, np.ndarray] | None,
                nxt: dict[str, np.ndarray], batch_size: int = 4096) -> np.ndarray:
    """The ensemble-mean reward of ``model`` on n transitions (``prev``, ``nxt``), each
    ``{part: (n, ...)}`` (a state net reads ``nxt`` only; ``prev`` may then be None): (n,)."""
    n = int(nxt["macro"].shape[0])
    out = []
    was_training = model.training
    model.eval()
    for start in range(0, n, batch_size):
        stop = start + batch_size
        before = _chunk(prev, start, stop) if prev is not None else None
        out.append(model.rewards(before, _chunk(nxt, start, stop)).mean(0).double().numpy())
    model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0)


def pair_reward_stats(model: RewardEnsemble, pairs: Any) -> tuple[float, float]:
    """(mean, std) of the net's per-step output over every step of a pair set
    (:class:`cloudrl.data.pairs.PairArrays`, both sides); std >= 1e-6."""
    from cloudrl.alignment.reward_model import segment_obs

    prev, nxt = [], []
    for s in ("a", "b"):
        seg = segment_obs(pairs, s, model.transition)
        lo = 1 if model.transition else 0
        prev.append({k: v[:, :-1].reshape(-1, *v.shape[2:]) for k, v in seg.items()})
        nxt.append({k: v[:, lo:].reshape(-1, *v.shape[2:]) for k, v in seg.items()})
    r = net_rewards(model, concat_obs(prev) if model.transition else None, concat_obs(nxt))
    return float(r.mean()), float(max(r.std(), 1e-6))


def reward_payload(model: RewardEnsemble, spec: Mapping[str, Any], mean: float,
                   std: float) -> dict[str, Any]:
    """The connector state of a net: spec, CPU state dict, normalisation."""
    return {"spec": dict(spec), "mean": float(mean), "std": float(std),
            "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}


# ----------------------------------------------------------------------------- connector


class LearnedRewardConnector(ConnectorV2):
    """Learner piece: episode rewards <- ``mix * r_model + (1 - mix) * r_env``.

    ``reward``: a :func:`reward_payload` (spec, state dict, mean, std). ``gamma`` is the
    algorithm's, for the n-step sums of replayed DQN/BDQ transitions.
    """

    def __init__(self, input_observation_space: Any = None, input_action_space: Any = None, *,
                 reward: Mapping[str, Any], mix: float = 1.0, reward_scale: float = 0.01,
                 target_std: float = 1.0, gamma: float = 0.99, **kwargs: Any) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        if not 0.0 <= float(mix) <= 1.0:
            raise ValueError(f"mix must be in [0, 1], got {mix}")
        self.mix = float(mix)
        self.reward_scale = float(reward_scale)
        self.target_std = float(target_std)
        self.gamma = float(gamma)
        self.model: RewardEnsemble | None = None
        self.spec: dict[str, Any] = {}
        self.mean, self.std = 0.0, 1.0
        self.version = 0
        self.set_state({"reward": dict(reward)})

    # -- state --------------------------------------------------------------------------

    def get_state(self, components: Any = None, *, not_components: Any = None,
                  **kwargs: Any) -> dict[str, Any]:
        assert self.model is not None
        return {"reward": reward_payload(self.model, self.spec, self.mean, self.std),
                "version": self.version}

    def set_state(self, state: dict[str, Any]) -> None:
        reward = state.get("reward")
        if not reward:
            return
        spec = dict(reward["spec"])
        if self.model is None or spec != self.spec:
            self.model = build_reward_ensemble(spec)
            self.spec = spec
        self.model.load_state_dict(reward["state_dict"])
        self.model.eval()
        self.mean, self.std = float(reward["mean"]), float(reward["std"])
        self.version = int(state.get("version", self.version + 1))

    # -- rewards ------------------------------------------------------------------------

    def model_rewards(self, prev: dict[str, np.ndarray],
                      nxt: dict[str, np.ndarray]) -> np.ndarray:
        """Scaled, normalised learned rewards of n transitions ``{part: (n, ...)}`` each."""
        assert self.model is not None
        raw = net_rewards(self.model, prev, nxt)
        return self.reward_scale * self.target_std * (raw - self.mean) / self.std

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list[Any],
                 explore: bool | None = None, shared_data: dict | None = None,
                 metrics: Any = None, **kwargs: Any) -> Any:
        added_ts = bool((shared_data or {}).get(ADDED_TS))
        sa_episodes = list(self.single_agent_episode_iterator(episodes,
                                                              agents_that_stepped_only=False))
        jobs: list[tuple[Any, str, int, int]] = []  # episode, kind, real length, n
        prev_parts: list[dict[str, np.ndarray]] = []
        next_parts: list[dict[str, np.ndarray]] = []
        for ep in sa_episodes:
            n_step = ep.extra_model_outputs.get("n_step") if hasattr(
                ep, "extra_model_outputs") else None
            if n_step is not None:  # a replayed (o_t, a_t, R, o_{t+n}) transition
                n = int(np.asarray(ep.get_extra_model_outputs("n_step")).reshape(-1)[0])
                middle = ep.custom_data.get(INTERMEDIATE_OBS)
                if n > 1 and (middle is None or len(middle) != n - 1):
                    raise ValueError(
                        f"learned reward with n_step={n} needs the intermediate observations "
                        "of replayed transitions: use replay_buffer_config type "
                        "cloudrl.alignment.learned_reward.LearnedRewardPrioritizedEpisodeReplayBuffer")
                # o_t, o_{t+1} .. o_{t+n-1}, o_{t+n}: the n transitions of the n-step sum
                prev, nxt = transitions([ep.get_observations(0), *(middle or []),
                                         ep.get_observations(-1)])
                jobs.append((ep, "nstep", 1, n))
            else:
                real = len(ep) - 1 if added_ts else len(ep)
                if real <= 0:
                    continue
                # o_0 .. o_real of the chunk: the real steps' transitions
                prev, nxt = transitions(ep.get_observations(slice(0, real + 1)))
                jobs.append((ep, "steps", real, 1))
            prev_parts.append(prev)
            next_parts.append(nxt)
        if not jobs:
            return batch
        learned = self.model_rewards(concat_obs(prev_parts), concat_obs(next_parts))
        offset = 0
        model_sum = env_sum = 0.0
        count = 0
        for ep, kind, real, n in jobs:
            if kind == "nstep":
                r = learned[offset:offset + n]
                offset += n
                model_r = np.array([float(np.sum(r * self.gamma ** np.arange(n)))])
                env_r = np.asarray(ep.get_rewards(slice(0, 1)), np.float64).reshape(-1)
            else:
                model_r = learned[offset:offset + real]
                offset += real
                env_r = np.asarray(ep.get_rewards(slice(0, real)), np.float64).reshape(-1)
            new = self.mix * model_r + (1.0 - self.mix) * env_r
            ep.set_rewards(new_data=new.astype(np.float32), at_indices=slice(0, len(new)))
            model_sum += float(model_r.sum())
            env_sum += float(env_r.sum())
            count += len(new)
        if metrics is not None and count:
            # under the module id: DQN reads every top-level learner result as a module's
            metrics.log_value((DEFAULT_MODULE_ID, MODEL_REWARD_KEY), model_sum / count,
                              window=1)
            metrics.log_value((DEFAULT_MODULE_ID, ENV_REWARD_KEY), env_sum / count, window=1)
        return batch


# ----------------------------------------------------------------------------- replay


class LearnedRewardPrioritizedEpisodeReplayBuffer(PrioritizedEpisodeReplayBuffer):
    """RLlib's prioritized episode replay that also hands out the intermediate observations
    ``o_{t+1} .. o_{t+n-1}`` of every n-step sample (in ``episode.custom_data``), so the
    learned-reward connector can sum the learned rewards over the same n steps."""

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        sampled = super().sample(*args, **kwargs)
        for ep, tree_idx in zip(sampled, self._last_sampled_indices, strict=True):
            ep_idx, ts = self._indices[self._tree_idx_to_sample_idx[tree_idx]][:2]
            source = self.episodes[ep_idx - self._num_episodes_evicted]
            n = int(np.asarray(ep.get_extra_model_outputs("n_step")).reshape(-1)[0])
            ep.custom_data[INTERMEDIATE_OBS] = [source.get_observations(ts + k)
                                                for k in range(1, n)]
        return sampled


# ----------------------------------------------------------------------------- learners


def find_connector(learner: Any) -> LearnedRewardConnector | None:
    """The learner's :class:`LearnedRewardConnector` piece (None without one)."""
    pipeline = getattr(learner, "_learner_connector", None)
    for piece in getattr(pipeline, "connectors", []) or []:
        if isinstance(piece, LearnedRewardConnector):
            return piece
    return None


def push_reward_state(algorithm: Any, payload: Mapping[str, Any], version: int) -> list[int]:
    """Set the reward net of every learner's connector; returns each learner's version."""
    state = {"reward": dict(payload), "version": int(version)}

    def _set(learner: Any) -> int:
        piece = find_connector(learner)
        if piece is None:
            raise RuntimeError("the learner has no LearnedRewardConnector")
        piece.set_state(state)
        return piece.version

    return _values(algorithm.learner_group.foreach_learner(_set))


def learner_reward_state(algorithm: Any) -> list[dict[str, Any]]:
    """Each learner's connector state (tests, diagnostics)."""
    return _values(algorithm.learner_group.foreach_learner(
        lambda learner: find_connector(learner).get_state()))


def _values(results: Any) -> list[Any]:
    """The values of ``foreach_learner``'s results; a learner's error is raised."""
    out = []
    for r in results:
        if hasattr(r, "ok") and not r.ok:
            raise r.get()
        out.append(r.get() if hasattr(r, "get") else r)
    return out
