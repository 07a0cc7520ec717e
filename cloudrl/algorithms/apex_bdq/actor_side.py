"""What an Ape-X actor computes before it sends: n-step transitions and their priorities.

As in Ape-X (Horgan et al. 2018), the actors, not the replay, assemble the n-step
transitions and compute their initial priorities with their local copy of the network,
so the replay shards only store and sample and the per-transition compute scales with
the number of actors.

* :class:`NStepAssembler`: the runner's single-step rows (tagged with stream ids local to
  the runner, see :class:`~cloudrl.algorithms.bdq.training_step.EpisodeStreams`) go
  through a small CPU
  :class:`~cloudrl.replay.DeviceReplayBuffer`, which completes the n-step windows exactly
  as the learner-side replay does (episode ends truncate, truncation bootstraps) and holds
  back the incomplete tails until the next call; :meth:`NStepAssembler.push` returns the
  transitions the call completed, in the layout of ``DeviceReplayBuffer.transitions``.
  The tails die with the runner process: a restarted runner starts with empty windows, so
  no shard ever joins a dead episode's rows to a new one (within a process, a stream that
  ``EpisodeStreams`` hands to a new episode while the old one never ended is cleared with
  :meth:`NStepAssembler.discard` first).
* :func:`initial_td_abs`: ``sum_d |delta_d|`` of the branching double-Q error
  (``cloudrl.algorithms.bdq.bdq_learner.bdq_td_errors``) with the runner's inference-only
  module, which has
  no target network: the online network both picks and evaluates the next action (Ape-X
  computes initial priorities the same way, from the actor's copy). The learner replaces
  them with its own target-network errors the first time it samples a transition.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.dqn.dqn_learner import QF_NEXT_PREDS, QF_PREDS, QF_TARGET_NEXT_PREDS
from ray.rllib.core.columns import Columns

from cloudrl.algorithms.bdq.bdq_learner import DISCOUNTS, bdq_td_errors
from cloudrl.replay import DeviceReplayBuffer, ReplayConfig, slice_rows

TRANSITION_KEYS = ("obs", "actions", "rewards", "next_obs", "dones", "discounts")


def _cat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: ({kk: torch.cat([p[k][kk] for p in parts]) for kk in parts[0][k]}
                if isinstance(parts[0][k], dict) else torch.cat([p[k] for p in parts]))
            for k in parts[0]}


class NStepAssembler:
    """Completes one runner's n-step windows (see the module docstring)."""

    def __init__(self, observation_space: Any, num_branches: int, n_step: int, gamma: float,
                 num_streams: int, capacity: int = 2048) -> None:
        self.config = ReplayConfig(capacity=capacity + num_streams * max(0, n_step - 1),
                                   n_step=n_step, gamma=gamma, num_streams=num_streams,
                                   device="cpu")
        self._buffer = DeviceReplayBuffer(self.config, observation_space,
                                          action_shape=(num_branches,))
        self._chunk = capacity  # rows per add: what one add stores always fits the ring

    def discard(self, stream_ids: list[int]) -> None:
        """Drop the incomplete windows of streams whose episodes will never continue
        (``EpisodeStreams.take_evicted``)."""
        if stream_ids:
            self._buffer.discard_pending(stream_ids)

    def push(self, rows: dict[str, Any] | None) -> dict[str, Any] | None:
        """Add single-step rows; the n-step transitions they complete (None if none)."""
        if rows is None:
            return None
        parts = []
        for start in range(0, len(rows["reward"]), self._chunk):
            first = self._buffer.next_slot
            stored = int(self._buffer.add(slice_rows(rows, start, start + self._chunk)))
            if stored:
                slots = (first + torch.arange(stored)) % self.config.capacity
                parts.append(self._buffer.transitions(slots))
        return _cat(parts) if parts else None


def initial_td_abs(module: Any, transitions: dict[str, Any], gamma: float) -> torch.Tensor:
    """Per-transition ``sum_d |delta_d|`` under ``module``'s online network only."""
    obs, next_obs = transitions["obs"], transitions["next_obs"]
    n = len(transitions["rewards"])
    with torch.no_grad():
        both = {k: torch.cat([torch.as_tensor(obs[k]), torch.as_tensor(next_obs[k])])
                for k in obs}
        q = module.compute_q_values({Columns.OBS: both})[QF_PREDS]
        fwd = {QF_PREDS: q[:n], QF_NEXT_PREDS: q[n:], QF_TARGET_NEXT_PREDS: q[n:]}
        batch = {Columns.ACTIONS: torch.as_tensor(transitions["actions"]),
                 Columns.REWARDS: torch.as_tensor(transitions["rewards"]),
                 Columns.TERMINATEDS: torch.as_tensor(transitions["dones"]),
                 DISCOUNTS: torch.as_tensor(transitions["discounts"])}
        q_selected, target = bdq_td_errors(fwd, batch, gamma, double_q=True)
    return (target[:, None] - q_selected).abs().sum(dim=-1)


def as_numpy(transitions: dict[str, Any]) -> dict[str, Any]:
    """Tensors -> numpy arrays (Ray ships numpy arrays to other processes zero-copy)."""
    return {k: ({kk: np.ascontiguousarray(vv.numpy()) for kk, vv in v.items()}
                if isinstance(v, dict) else np.ascontiguousarray(v.numpy()))
            for k, v in transitions.items()}
