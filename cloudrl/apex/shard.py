"""One Ape-X replay shard: a CPU ``DeviceReplayBuffer`` behind a Ray actor.

:class:`ReplayShard` is a plain class (unit-testable in-process); the algorithm runs it as
a Ray actor with ``max_restarts`` (a killed shard comes back empty, with a new
``incarnation`` id) and ``max_task_retries=0``.

* ``add(rows, runner_index, incarnation)``: single-step rows from one env runner (stream
  ids local to that runner). Runner ``r`` owns the stream block ``slot(r) * S ..
  slot(r) * S + S - 1`` (``S`` streams per runner, ``slot = (r - 1) // num_shards``); a
  new incarnation of the runner (it was restarted) first discards the block's pending
  n-step rows, which belong to episodes that will never continue. N-step transitions are
  assembled by the buffer; the ones completed by this call get their INITIAL PRIORITY
  here: the branching double-Q ``sum_d |delta_d|`` (``models.bdq_learner.bdq_td_errors``,
  the learner's own definition) under the latest broadcast weights, online and target
  network (``set_weights``). Before the first broadcast arrives (e.g. right after a
  restart) new transitions keep the buffer's default, the maximum priority so far.
* ``sample(batch_size)``: a prioritized batch (CPU tensors, IS weights, ring indices) plus
  the write stamps of those slots and the shard's incarnation; ``None`` while the shard
  holds fewer than ``batch_size`` transitions.
* ``update_priorities(indices, stamps, td_abs, incarnation)``: the learner's new |TD|;
  entries whose slot was overwritten since it was sampled (stamp changed) or that were
  sampled from an earlier incarnation are dropped and counted as stale.
* ``get_state`` / ``set_state``: buffer contents without pending rows (checkpoints).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns

from cloudrl.bdq_training import DISCOUNTS, buffer_checkpoint_state
from cloudrl.replay import DeviceReplayBuffer, ReplayConfig
from models.bdq_learner import bdq_td_errors


def _as_tensors(value: Any) -> Any:
    """Nested mapping of arrays -> torch tensors (copied: the arrays may be read-only)."""
    if isinstance(value, Mapping):
        return {k: _as_tensors(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value
    return torch.from_numpy(np.array(value))


class ReplayShard:
    """Prioritized n-step replay for the env runners mapped to this shard."""

    def __init__(self, shard_index: int, num_shards: int, replay_config: ReplayConfig,
                 observation_space: Any, action_space: Any, module_spec: Any = None,
                 streams_per_runner: int = 2, double_q: bool = True, seed: int = 0,
                 torch_threads: int = 1) -> None:
        torch.set_num_threads(max(1, torch_threads))
        self.shard_index, self.num_shards = shard_index, num_shards
        self.streams_per_runner = streams_per_runner
        self.incarnation = uuid.uuid4().hex
        self.config = replay_config
        self.buffer = DeviceReplayBuffer(replay_config, observation_space,
                                         action_shape=(len(action_space.nvec),))
        self.double_q = double_q
        self._stamps = torch.full((replay_config.capacity,), -1, dtype=torch.long)
        self._writes = 0  # transitions ever stored; the stamp of the next one
        self._runner_incarnations: dict[int, str] = {}
        self._generator = torch.Generator().manual_seed(seed * 1000 + shard_index)
        self._module_spec = module_spec
        self.module: Any = None
        self.weights_version = -1
        self.counts = {"rows_added": 0, "stored": 0, "initial_priorities": 0,
                       "sampled_batches": 0, "priority_updates": 0, "stale_priorities": 0,
                       "pending_discarded": 0}

    # -- FaultTolerantActorManager protocol ---------------------------------------------
    def ping(self) -> str:
        return "pong"

    def apply(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        return func(self, *args, **kwargs)

    # -- weights ------------------------------------------------------------------------
    def set_weights(self, state: Mapping[str, Any], version: int) -> int:
        """Load the learner module's full state (online + target nets) at ``version``."""
        if self.module is None:
            if self._module_spec is None:
                raise ValueError("this shard has no module spec to compute priorities with")
            self.module = self._module_spec.build()
            self.module.make_target_networks()
            self.module.eval()
        self.module.set_state(state)
        self.weights_version = int(version)
        return self.weights_version

    def td_abs(self, transitions: Mapping[str, Any]) -> torch.Tensor:
        """``sum_d |delta_d|`` of stored transitions under the current weights."""
        batch = {Columns.OBS: transitions["obs"], Columns.NEXT_OBS: transitions["next_obs"],
                 Columns.ACTIONS: transitions["actions"],
                 Columns.REWARDS: transitions["rewards"],
                 Columns.TERMINATEDS: transitions["dones"], DISCOUNTS: transitions["discounts"]}
        with torch.no_grad():
            fwd = self.module.forward_train(batch)
            q_selected, target = bdq_td_errors(fwd, batch, self.config.gamma, self.double_q)
        return (target[:, None] - q_selected).abs().sum(dim=-1)

    # -- data ---------------------------------------------------------------------------
    def _stream_block(self, runner_index: int) -> int:
        return ((runner_index - 1) // self.num_shards) * self.streams_per_runner

    def add(self, rows: Mapping[str, Any], runner_index: int, incarnation: str
            ) -> dict[str, Any]:
        """Store one runner's single-step rows; initial priorities for completed ones."""
        base = self._stream_block(runner_index)
        block = torch.arange(base, base + self.streams_per_runner)
        known = self._runner_incarnations.get(runner_index)
        if known is not None and known != incarnation:
            self.buffer.discard_pending(block)
            self.counts["pending_discarded"] += 1
        self._runner_incarnations[runner_index] = incarnation
        rows = _as_tensors(rows)  # Ray hands numpy arguments over read-only
        sid = rows["stream_id"].long()
        if len(sid) and (sid.min() < 0 or sid.max() >= self.streams_per_runner):
            raise ValueError("runner stream ids outside [0, streams_per_runner)")
        rows["stream_id"] = sid + base
        start = self.buffer.next_slot
        stored = int(self.buffer.add(rows))
        cap = self.config.capacity
        kept = min(stored, cap)  # a call storing more than the ring keeps the last cap
        offsets = torch.arange(stored - kept, stored)
        slots = (start + offsets) % cap
        self._stamps[slots] = self._writes + offsets
        self._writes += stored
        self.counts["rows_added"] += len(sid)
        self.counts["stored"] += stored
        if kept and self.module is not None:
            self.buffer.update_priorities(slots, self.td_abs(self.buffer.transitions(slots)))
            self.counts["initial_priorities"] += kept
        return self.stats()

    def sample(self, batch_size: int) -> dict[str, Any]:
        """A prioritized batch with stamps and incarnation (``batch`` None if too few)."""
        if len(self.buffer) < batch_size:
            return {"batch": None, "stats": self.stats()}
        batch = self.buffer.sample(batch_size, generator=self._generator)
        self.counts["sampled_batches"] += 1
        return {"batch": batch, "stamps": self._stamps[batch["indices"]].clone(),
                "incarnation": self.incarnation, "weights_version": self.weights_version,
                "stats": self.stats()}

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
                "size": len(self.buffer), "weights_version": self.weights_version,
                **self.counts}

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
        self.counts.update(state.get("counts", {}))
        self._runner_incarnations.clear()
        return self.stats()
