"""Fault-injection policies for shield drills: deploy one as a canary and watch the fallback.

Each is the power-aware heuristic that misbehaves on states in the second half of the
horizon (``tick >= episode_length / 2``), so the service's startup probe and health
check (a tick-0 state) pass while real traffic trips the shield:

* ``python:serve_apps.faults:raising``: raises ``RuntimeError``;
* ``python:serve_apps.faults:nan``: returns NaN actions;
* ``python:serve_apps.faults:slow``: sleeps ``SLOW_SECONDS`` (beyond the model timeout);
* ``python:serve_apps.faults:infeasible``: returns an action the mask forbids;
* ``python:serve_apps.faults:broken``: raises on every state (fails health checks).
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
_PROGRESS = -1  # the macro vector ends with t / episode_length


@dataclass
class FaultyPolicy:
    fault: str
    interface: Interface
    always: bool = False

    def __post_init__(self) -> None:
        self.name = f"fault:{self.fault}"
        self._inner = make_heuristic("power_aware", self.interface)

    def act_batch(self, observations: list[dict[str, np.ndarray]]) -> list[Any]:
        actions = []
        for obs in observations:
            self._inner.reset()
            actions.append(self._inner.act(obs))
        if not self.always and all(obs["macro"][_PROGRESS] < 0.5 for obs in observations):
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
