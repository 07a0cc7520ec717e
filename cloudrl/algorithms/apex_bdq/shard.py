"""One Ape-X replay shard: a CPU ``DeviceReplayBuffer`` behind a Ray actor.

:class:`ReplayShard` is a plain class (unit-testable in-process); the algorithm runs it as
a Ray actor with ``max_restarts`` (a killed shard comes back empty, with a new
``incarnation`` id) and ``max_task_retries=0``.

* ``add(transitions, td_abs)``: complete n-step transitions from one env runner, which
  assembled them and computed their initial priorities ``sum_d |delta_d|``
  (:mod:`.actor_side`); stored as they are (``DeviceReplayBuffer.insert``),
  so a shard does no model compute at all: it stores, samples and reprioritizes.
* ``sample(batch_size)``: a prioritized batch (CPU tensors, IS weights, ring indices) plus
  the write stamps of those slots and the shard's incarnation; ``None`` while the shard
  holds fewer than ``batch_size`` transitions.
* ``update_priorities(indices, stamps, td_abs, incarnation)``: the learner's new |TD|;
  entries whose slot was overwritten since it was sampled (stamp changed) or that were
  sampled from an earlier incarnation are dropped and counted as stale.
* ``get_state`` / ``set_state``: the buffer's contents (checkpoints).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from cloudrl.algorithms.bdq.training_step import buffer_checkpoint_state
from cloudrl.replay import DeviceReplayBuffer, ReplayConfig


def _as_tensors(value: Any) -> Any:
    """Nested mapping of arrays -> torch tensors (copied: the arrays may be read-only)."""
    if isinstance(value, Mapping):
        return {k: _as_tensors(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value
    return torch.from_numpy(np.array(value))


class ReplayShard:
    """Prioritized replay of complete n-step transitions sent by the env runners."""

    def __init__(self, shard_index: int, num_shards: int, replay_config: ReplayConfig,
                 observation_space: Any, action_space: Any, seed: int = 0,
                 torch_threads: int = 1) -> None:
        torch.set_num_threads(max(1, torch_threads))
        self.shard_index, self.num_shards = shard_index, num_shards
        self.incarnation = uuid.uuid4().hex
        # The runners complete the n-step windows: the shard's ring never assembles.
        self.config = ReplayConfig(**{**asdict(replay_config), "n_step": 1,
                                      "num_streams": 1})
        self.buffer = DeviceReplayBuffer(self.config, observation_space,
                                         action_shape=(len(action_space.nvec),))
        self._stamps = torch.full((self.config.capacity,), -1, dtype=torch.long)
        self._writes = 0  # transitions ever stored; the stamp of the next one
        self._generator = torch.Generator().manual_seed(seed * 1000 + shard_index)
        self.counts = {"stored": 0, "initial_priorities": 0, "sampled_batches": 0,
                       "priority_updates": 0, "stale_priorities": 0}

    # -- FaultTolerantActorManager protocol ---------------------------------------------
    def ping(self) -> str:
        return "pong"

    def apply(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        return func(self, *args, **kwargs)

    # -- data ---------------------------------------------------------------------------
    def add(self, transitions: Mapping[str, Any], td_abs: Any = None) -> dict[str, Any]:
        """Store complete transitions with the runner's initial priorities (None: max)."""
        transitions = _as_tensors(transitions)  # Ray hands numpy arguments over read-only
        start = self.buffer.next_slot
        stored = self.buffer.insert(
            transitions, None if td_abs is None else _as_tensors(td_abs))
        offsets = torch.arange(len(transitions["rewards"]) - stored,
                               len(transitions["rewards"]))
        self._stamps[(start + torch.arange(stored)) % self.config.capacity] = \
            self._writes + offsets
        self._writes += len(transitions["rewards"])
        self.counts["stored"] += stored
        if td_abs is not None:
            self.counts["initial_priorities"] += stored
        return self.stats()

    def sample(self, batch_size: int) -> dict[str, Any]:
        """A prioritized batch with stamps and incarnation (``batch`` None if too few)."""
        if len(self.buffer) < batch_size:
            return {"batch": None, "stats": self.stats()}
        batch = self.buffer.sample(batch_size, generator=self._generator)
        self.counts["sampled_batches"] += 1
        return {"batch": batch, "stamps": self._stamps[batch["indices"]].clone(),
                "incarnation": self.incarnation, "stats": self.stats()}

    def update_priorities(self, indices: torch.Tensor, stamps: torch.Tensor,
                          td_abs: torch.Tensor, incarnation: str) -> int:
        """Apply the learner's |TD| where the slot still holds the sampled transition."""
        indices = torch.as_tensor(indices, dtype=torch.long)
        if incarnation != self.incarnation:
            self.counts["stale_priorities"] += len(indices)
            return 0
        fresh = self._stamps[indices] == torch.as_tensor(stamps, dtype=torch.long)
        n = int(fresh.sum())
        self.counts["stale_priorities"] += len(indices) - n
        if n:
            self.buffer.update_priorities(indices[fresh], torch.as_tensor(td_abs)[fresh])
            self.counts["priority_updates"] += n
        return n

    # -- introspection and checkpoints --------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {"shard_index": self.shard_index, "incarnation": self.incarnation,
                "size": len(self.buffer), **self.counts}

    def priorities(self) -> torch.Tensor:
        """Priorities of the stored slots (``0..len-1``)."""
        return self.buffer.priorities()[: len(self.buffer)].clone()

    def get_state(self) -> dict[str, Any]:
        return {"buffer": buffer_checkpoint_state(self.buffer), "stamps": self._stamps,
                "writes": self._writes, "counts": dict(self.counts)}

    def set_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        self.buffer.load_state_dict(state["buffer"])
        self._stamps.copy_(torch.as_tensor(state["stamps"]))
        self._writes = int(state["writes"])
        self.counts.update({k: v for k, v in state.get("counts", {}).items()
                            if k in self.counts})
        return self.stats()
