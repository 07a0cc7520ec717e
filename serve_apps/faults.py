"""Fault-injection policies for shield drills: deploy one as a canary and watch the fallback.

Each is the power-aware heuristic that misbehaves on states in the second half of the
horizon (``tick >= episode_length / 2``), so the service's startup probe and health
check (a tick-0 state) pass while real traffic trips the shield:

* ``python:serve_apps.faults:raising``: raises ``RuntimeError``;
* ``python:serve_apps.faults:nan``: returns NaN actions;
* ``python:serve_apps.faults:slow``: sleeps ``SLOW_SECONDS`` (beyond the model timeout);
* ``python:serve_apps.faults:infeasible``: returns an action the mask forbids;
* ``python:serve_apps.faults:broken``: raises on every state (refused as a canary: it
  fails the smoke test);
* ``python:serve_apps.faults:nan_always``, ``...:infeasible_always``, ``...:hangs``: NaN,
  forbidden or no answer (sleeps ``SLOW_SECONDS``) on every state: fail the smoke test;
* ``python:serve_apps.faults:breaks_later``: answers its first ``GOOD_CALLS`` batches
  (the smoke test passes), then raises on every state (a canary that breaks at run time:
  the health check drops it).
* ``python:serve_apps.faults:infeasible_later``: answers its first ``GOOD_CALLS`` batches,
  then proposes a forbidden action on every state, whatever the tick (the soak's planted
  bad canary: its failure does not depend on where the clusters are in their episodes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cloudrl.heuristics import make_heuristic
from cloudrl.policy import Interface
from envs.env_config import EnvConfig

SLOW_SECONDS = 3.0
GOOD_CALLS = 2
_PROGRESS = -1  # the macro vector ends with t / episode_length


@dataclass
class FaultyPolicy:
    fault: str
    interface: Interface
    always: bool = False
    good_calls: int | None = None  # set: fault on every state after this many batches

    def __post_init__(self) -> None:
        self.name = f"fault:{self.fault}"
        self._inner = make_heuristic("power_aware", self.interface)
        self._calls = 0

    def act_batch(self, observations: list[dict[str, np.ndarray]]) -> list[Any]:
        self._calls += 1
        late = self.good_calls is not None and self._calls > self.good_calls
        if late and self.fault == "raise":
            raise RuntimeError(f"injected model failure after {self.good_calls} batches")
        actions = []
        for obs in observations:
            self._inner.reset()
            actions.append(self._inner.act(obs))
        if not (self.always or late) and all(obs["macro"][_PROGRESS] < 0.5
                                             for obs in observations):
            return actions
        if self.fault == "raise":
            raise RuntimeError("injected model failure")
        if self.fault == "slow":
            time.sleep(SLOW_SECONDS)
            return actions
        if self.fault == "nan":
            return [np.full(np.shape(a), np.nan) for a in actions]
        return [_forbidden(obs, self.interface) for obs in observations]


def _forbidden(obs: dict[str, np.ndarray], interface: Interface) -> Any:
    mask = obs["action_mask"] > 0
    if interface == "flat":
        blocked = np.flatnonzero(~mask)
        return int(blocked[0]) if len(blocked) else -1
    return np.full(1, -1, dtype=np.int64)  # wrong length: outside the space


def raising(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("raise", interface)


def nan(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("nan", interface)


def slow(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("slow", interface)


def infeasible(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("infeasible", interface)


def broken(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("raise", interface, always=True)


def breaks_later(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("raise", interface, good_calls=GOOD_CALLS)


def infeasible_later(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("infeasible", interface, good_calls=GOOD_CALLS)


def nan_always(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("nan", interface, always=True)


def infeasible_always(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("infeasible", interface, always=True)


def hangs(env_config: EnvConfig, interface: Interface) -> FaultyPolicy:
    return FaultyPolicy("slow", interface, always=True)
