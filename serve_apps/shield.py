"""The safety shield: the model answers only with feasible actions, else the fallback does.

For a batch of observations of one policy version, :meth:`Shield.decide`

1. asks the circuit breaker; while it is open every request goes to the fallback
   heuristic (reason ``breaker_open``);
2. runs the model's batched forward in a worker thread with a timeout; a raise
   (``error``), a timeout (``timeout``) or NaN/inf scores (``nan``) sends the whole batch
   to the fallback and counts one failure on the breaker;
3. checks each model action against its mask; an infeasible one is replaced by the
   fallback's (``infeasible``), and a batch with any infeasible action counts one failure
   on the breaker too (a model that only proposes masked actions is a broken model).

The breaker opens after ``failure_threshold`` consecutive failed batches and half-opens
after ``cooldown_s``: the next batch tries the model, and closes the breaker on success
or re-opens it on failure. Every fallback is counted per reason. Only model faults count:
a state the model never saw (refused by validation) cannot reach it.

:meth:`Shield.smoke_test` (before a version is served) and :meth:`Shield.probe` (the
health check) run the model on known-good states and say what is wrong, if anything.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serve_apps.runtime import NonFiniteOutput, ServedPolicy, non_finite

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass
class CircuitBreaker:
    failure_threshold: int = 3
    cooldown_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    state: str = CLOSED
    consecutive_failures: int = 0
    opened_at: float = 0.0
    times_opened: int = 0

    def allow(self) -> bool:
        """May the model be tried now? (moves an open breaker to half-open after cooldown)"""
        if self.state == OPEN and self.clock() - self.opened_at >= self.cooldown_s:
            self.state = HALF_OPEN
        return self.state != OPEN

    def record_success(self) -> None:
        self.state, self.consecutive_failures = CLOSED, 0

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        if self.state == HALF_OPEN or self.consecutive_failures >= self.failure_threshold:
            if self.state != OPEN:
                self.times_opened += 1
            self.state, self.opened_at = OPEN, self.clock()


@dataclass
class Outcome:
    action: Any
    by_model: bool
    reason: str | None = None
    decided_by: str | None = None  # a hierarchical policy's sub-agent behind the action


@dataclass
class Shield:
    """Shielded decisions for one policy version (its own breaker and counters)."""

    policy: ServedPolicy
    timeout_s: float = 1.0
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    counters: Counter = field(default_factory=Counter)
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))

    async def decide(self, observations: list[dict[str, np.ndarray]]) -> list[Outcome]:
        self.counters["requests"] += len(observations)
        self.counters["batches"] += 1
        if not self.breaker.allow():
            return self._fallback(observations, "breaker_open")
        loop = asyncio.get_running_loop()
        explained = getattr(self.policy.model, "act_batch_explained", None)
        deciders: list[str | None] = [None] * len(observations)
        try:
            if explained is None:
                actions = await asyncio.wait_for(
                    loop.run_in_executor(self._pool, self.policy.model.act_batch, observations),
                    timeout=self.timeout_s)
            else:
                actions, deciders = await asyncio.wait_for(
                    loop.run_in_executor(self._pool, explained, observations),
                    timeout=self.timeout_s)
            if len(actions) != len(observations):
                raise RuntimeError(f"{len(actions)} actions for {len(observations)} states")
        except NonFiniteOutput:
            return self._failed(observations, "nan")
        except TimeoutError:
            return self._failed(observations, "timeout")
        except Exception:  # noqa: BLE001 - any model failure is answered by the fallback
            return self._failed(observations, "error")
        if any(non_finite(a) for a in actions):
            return self._failed(observations, "nan")
        feasible = [self.policy.is_feasible(a, obs)
                    for a, obs in zip(actions, observations, strict=True)]
        if all(feasible):
            self.breaker.record_success()
        else:
            self.breaker.record_failure()
        out = []
        for action, obs, ok, by in zip(actions, observations, feasible, deciders, strict=True):
            if ok:
                self.counters["model"] += 1
                out.append(Outcome(action, True, decided_by=by))
            else:
                out.extend(self._fallback([obs], "infeasible"))
        return out

    def _failed(self, observations: list[dict[str, np.ndarray]], reason: str) -> list[Outcome]:
        self.breaker.record_failure()
        return self._fallback(observations, reason)

    def _fallback(self, observations: list[dict[str, np.ndarray]], reason: str
                  ) -> list[Outcome]:
        self.counters[f"fallback_{reason}"] += len(observations)
        self.counters["fallback"] += len(observations)
        actions = self.policy.fallback.act_batch(observations)
        return [Outcome(a, False, reason) for a in actions]

    def _answer_error(self, observations: list[dict[str, np.ndarray]]) -> str | None:
        try:
            actions = self.policy.model.act_batch(observations)
        except Exception as e:  # noqa: BLE001 - reported as what is wrong with the model
            return f"{type(e).__name__}: {e}"
        return self.policy.check_actions(actions, observations)

    def health_error(self) -> str | None:
        """Why the model cannot answer a probe observation, or None when it can."""
        return self._answer_error([self.policy.probe_obs])

    def smoke_test(self, timeout_s: float) -> str | None:
        """Why the model fails on a few synthetic early-horizon states (an exception,
        non-finite or infeasible actions, no answer within ``timeout_s``), or None.
        Blocking; runs on the shield's model thread."""
        observations = self.policy.smoke_observations()
        future = self._pool.submit(self._answer_error, observations)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            return f"no answer within {timeout_s:g} s"

    async def probe(self, timeout_s: float) -> str | None:
        """:meth:`health_error` on the model thread, with a time limit (for health checks)."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool, self.health_error),
                                          timeout=timeout_s)
        except TimeoutError:
            return f"no answer to the probe state within {timeout_s:g} s"

    def report(self) -> dict[str, Any]:
        return {"breaker": self.breaker.state, "breaker_opened": self.breaker.times_opened,
                **dict(self.counters)}
