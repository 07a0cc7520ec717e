"""What an Ape-X actor does: sample, assemble n-step transitions, prioritize, send, report.

:func:`sample_into_shard` runs ON an RLlib env runner (the algorithm sends it with
``EnvRunnerGroup.foreach_env_runner_async``). One call:

1. on the first call of this runner process (a restarted runner is a new process) it
   creates the runner's :class:`ActorState` (a fresh ``incarnation`` id, its own
   :class:`~cloudrl.algorithms.bdq.training_step.EpisodeStreams` and
   :class:`~.actor_side.NStepAssembler`) and sets the runner module's constant
   epsilon to :func:`runner_epsilon` of its ``worker_index``;
2. samples one rollout (``runner.sample()``, exploring, with whatever weights the runner
   has: weight broadcasts are queued on the runner between sample calls);
3. turns the episode chunks into single-step rows, completes the n-step windows locally
   and computes the completed transitions' initial priorities with its own module
   (:mod:`.actor_side`), as Ape-X's actors do;
4. waits for the shard's acknowledgement of the PREVIOUS add, then sends the transitions
   and priorities with ``shard.add.remote`` straight to the runner's shard: episodes never
   pass through the driver, and at most one add per runner is in flight (back-pressure: a
   runner never gets more than one rollout ahead of its shard);
5. returns a small report: the runner's metrics (env steps, episode returns), its
   weights version, epsilon, and the transitions the shard acknowledged or lost.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.rllib.core import DEFAULT_MODULE_ID

from cloudrl.algorithms.apex_bdq.actor_side import NStepAssembler, as_numpy, initial_td_abs
from cloudrl.algorithms.bdq.training_step import EpisodeStreams, episodes_to_transitions

STATE_ATTR = "_cloudrl_apex_actor"
ACK_TIMEOUT_S = 120.0


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



@dataclass
class ActorState:
    """Per-process state of one Ape-X actor, kept as an attribute of its env runner."""

    incarnation: str
    epsilon: float
    streams: EpisodeStreams
    assembler: NStepAssembler
    pending: Any = None  # ObjectRef of the last add, not yet acknowledged
    pending_rows: int = 0
    rows_sent: int = 0
    rows_acked: int = 0
    rows_lost: int = 0
    shard_stats: dict[str, Any] = field(default_factory=dict)


def runner_module(runner: Any) -> Any:
    """The env runner's (single-agent) RLModule."""
    module = runner.module
    try:
        return module[DEFAULT_MODULE_ID]
    except (KeyError, TypeError, AttributeError):
        return module


def actor_state(runner: Any, epsilon: float, epsilon_alpha: float,
                streams_per_runner: int, n_step: int, gamma: float) -> ActorState:
    """This runner's :class:`ActorState`, created (and its epsilon set) on first use."""
    state = getattr(runner, STATE_ATTR, None)
    if state is None:
        num_runners = max(1, int(runner.config.num_env_runners))
        index = min(max(int(runner.worker_index) - 1, 0), num_runners - 1)
        eps = runner_epsilon(index, num_runners, epsilon, epsilon_alpha)
        module = runner_module(runner)
        module.set_epsilon(eps)
        assembler = NStepAssembler(module.observation_space, len(module.action_space.nvec),
                                   n_step, gamma, streams_per_runner)
        state = ActorState(incarnation=uuid.uuid4().hex, epsilon=eps,
                           streams=EpisodeStreams(streams_per_runner), assembler=assembler)
        setattr(runner, STATE_ATTR, state)
    return state


def _settle(state: ActorState) -> None:
    """Wait for the previous add; count its rows as acknowledged or lost."""
    if state.pending is None:
        return
    try:
        state.shard_stats = ray.get(state.pending, timeout=ACK_TIMEOUT_S)
        state.rows_acked += state.pending_rows
    except (ray.exceptions.RayError, TimeoutError):  # shard died (restarting) or hung
        state.rows_lost += state.pending_rows
    state.pending, state.pending_rows = None, 0


def sample_into_shard(runner: Any, *, shards: list[Any], epsilon: float,
                      epsilon_alpha: float, streams_per_runner: int, n_step: int,
                      gamma: float) -> dict[str, Any]:
    """One Ape-X actor step on ``runner`` (see the module docstring); returns its report."""
    state = actor_state(runner, epsilon, epsilon_alpha, streams_per_runner, n_step, gamma)
    episodes = runner.sample()
    env_steps = sum(len(ep) for ep in episodes)
    rows = episodes_to_transitions(episodes, state.streams)
    state.assembler.discard(state.streams.take_evicted())
    transitions = state.assembler.push(rows)
    shard_index = (int(runner.worker_index) - 1) % len(shards)
    _settle(state)
    if transitions is not None:
        td_abs = initial_td_abs(runner_module(runner), transitions, gamma)
        n = len(td_abs)
        state.pending = shards[shard_index].add.remote(as_numpy(transitions),
                                                       td_abs.numpy())
        state.pending_rows = n
        state.rows_sent += n
    return {
        "worker_index": int(runner.worker_index),
        "incarnation": state.incarnation,
        "epsilon": state.epsilon,
        "weights_seq_no": int(getattr(runner, "_weights_seq_no", 0)),
        "env_steps": env_steps,
        "shard_index": shard_index,
        "rows_sent": state.rows_sent,
        "rows_acked": state.rows_acked,
        "rows_lost": state.rows_lost,
        "shard_stats": dict(state.shard_stats),
        "metrics": runner.get_metrics(),
    }
