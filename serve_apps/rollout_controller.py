"""Automatic canary decisions: watch the canary's live signals, promote or roll back.

A canary started with an ``auto`` plan (``cloudrl.serving.schemas.AutoPlan``) is watched
decision by decision (:meth:`RolloutController.observe`, called for every answered state):

* **roll back at once** when the canary's circuit breaker opens, when it proposes more
  infeasible actions than ``max_infeasible`` (default 0: the first one), or, once
  ``min_decisions`` canary decisions are in, when its fallback rate, shield-intervention
  rate, latency p95 or predicted SLA risk (its mean minus the stable version's) crosses
  its threshold;
* **promote** after ``promote_after`` canary decisions with no signal over its threshold.

Whatever the plan, and for a canary started by hand too, a canary whose model **hangs** is
rolled back at its ``max_timeouts``-th decision that timed out (``ServiceConfig.
canary_rollback_timeouts``, default 3; 0: never). Each such decision was answered by the
fallback; without this, a manual canary whose model stopped answering would keep its
traffic share on the fallback for good (its breaker opens, half-opens, times out again).
While the breaker is open the model is not asked, so no timeouts are counted: a limit
above ``failure_threshold`` is reached one timeout per ``cooldown_s``.

Signals, per version, counted from the canary's start: decisions; fallbacks (any reason,
``breaker_open`` included); shield interventions (the model answered or failed and the
shield replaced its answer: ``error``, ``nan``, ``timeout``, ``infeasible``); infeasible
attempts; server-side latency (a window of the last ``LATENCY_WINDOW``); SLA risk
(:func:`sla_risk`: the share of pending jobs at their last chance to meet the deadline that
the decision leaves waiting).

**Pause** stops the promotion clock: decisions made while paused do not count towards
``promote_after`` and nothing is promoted; safety still holds (a tripped breaker or an
infeasible attempt still rolls the canary back). **Resume** restarts the clock where it
stopped. Operators force a decision with the rollout endpoint's ``promote``/``rollback``.
Plan and pause flag live in the persisted rollout state (``Rollout.set_auto``), every
transition in its event log with the reason. Counts are per replica: with several
replicas, the first to see ``promote_after`` canary decisions promotes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloudrl.serving.schemas import AutoPlan
from serve_apps.rollout import Rollout
from serve_apps.runtime import PolicySpecError
from serve_apps.shield import Outcome, Shield

LATENCY_WINDOW = 1000
INTERVENTION_REASONS = ("error", "nan", "timeout", "infeasible")


def sla_risk(jobs: Sequence[Any], placed: Sequence[int]) -> float:
    """Share of pending jobs at their last chance (``deadline - duration == 0``: placed
    now they just make it) that the decision leaves waiting: each is a predicted SLA
    violation. ``jobs`` have ``deadline`` and ``duration`` (ticks from now), ``placed``
    are the indices the decision places."""
    if not jobs:
        return 0.0
    placed_set = set(placed)
    last_chance = [i for i, j in enumerate(jobs) if j.deadline - j.duration == 0]
    return sum(1 for i in last_chance if i not in placed_set) / len(jobs)


@dataclass
class VersionSignals:
    """Live signals of one policy version since the watch began."""

    decisions: int = 0
    fallbacks: int = 0
    interventions: int = 0
    infeasible: int = 0
    risk_sum: float = 0.0
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def add(self, outcome: Outcome, latency_ms: float, risk: float) -> None:
        self.decisions += 1
        self.latencies.append(latency_ms)
        self.risk_sum += risk
        if not outcome.by_model:
            self.fallbacks += 1
            if outcome.reason in INTERVENTION_REASONS:
                self.interventions += 1
            if outcome.reason == "infeasible":
                self.infeasible += 1

    @property
    def mean_risk(self) -> float:
        return self.risk_sum / self.decisions if self.decisions else 0.0

    def latency_p95(self) -> float:
        return float(np.percentile(np.fromiter(self.latencies, float), 95)) \
            if self.latencies else 0.0

    def report(self) -> dict[str, Any]:
        n = max(self.decisions, 1)
        return {"decisions": self.decisions, "fallback_rate": self.fallbacks / n,
                "intervention_rate": self.interventions / n, "infeasible": self.infeasible,
                "latency_p95_ms": self.latency_p95(), "sla_risk": self.mean_risk}


class RolloutController:
    """The automatic decision over one replica's rollout (see the module docstring)."""

    def __init__(self, rollout: Rollout, max_timeouts: int = 3) -> None:
        self.rollout = rollout
        self.max_timeouts = max_timeouts  # the canary's Nth timed-out decision rolls it back
        self._watched: str | None = None  # canary version the signals belong to
        self._breaker_base = 0
        self.signals: dict[str, VersionSignals] = {}
        self.counted = 0  # canary decisions while not paused

    # ------------------------------------------------------------ state
    def _plan(self) -> AutoPlan | None:
        auto = self.rollout.auto
        return None if not auto else AutoPlan.model_validate(auto["plan"])

    def _follow(self) -> Shield | None:
        """The watched canary, (re)starting the watch when the canary changed."""
        canary = self.rollout.canary
        version = None if canary is None else canary.policy.version
        if version != self._watched:
            self._watched = version
            self.signals = {}
            auto = self.rollout.auto or {}
            self.counted = int(auto.get("counted", 0))
            self._breaker_base = 0 if canary is None else canary.breaker.times_opened
        return canary

    # ------------------------------------------------------------ signals
    def observe(self, shield: Shield, outcome: Outcome, latency_ms: float,
                risk: float = 0.0) -> str | None:
        """Count one answered state of ``shield``'s version; returns ``"promoted"`` or
        ``"rolled_back"`` when this decision settled the canary, else None."""
        canary = self._follow()
        if canary is None:
            return None
        if shield is canary and outcome.reason == "timeout":
            reason = self.timeout_reason(canary)
            if reason is not None:
                self.rollout.rollback(f"automatic: {reason}")
                return "rolled_back"
        if self.rollout.auto is None:
            return None
        version = shield.policy.version
        self.signals.setdefault(version, VersionSignals()).add(outcome, latency_ms, risk)
        if shield is not canary:
            return None
        if not self.rollout.auto.get("paused"):
            self.counted += 1
        return self.evaluate()

    def evaluate(self) -> str | None:
        """Apply the plan to the signals so far; promote or roll back if it says so."""
        canary, plan = self._follow(), self._plan()
        if canary is None or plan is None:
            return None
        reason = self.rollback_reason(canary, plan)
        if reason is not None:
            self.rollout.rollback(f"automatic: {reason}")
            return "rolled_back"
        if self.counted >= plan.promote_after and not self.rollout.auto.get("paused"):
            mine = self.signals.get(canary.policy.version, VersionSignals())
            self.rollout.promote(f"automatic: {self.counted} canary decisions, no signal over "
                                 f"its threshold ({_summary(mine)})")
            return "promoted"
        return None

    def timeout_reason(self, canary: Shield) -> str | None:
        """Why a hanging canary must go now (``max_timeouts`` reached), or None."""
        timeouts = int(canary.counters["fallback_timeout"])
        if self.max_timeouts < 1 or timeouts < self.max_timeouts:
            return None
        return (f"{timeouts} decisions timed out (no answer from the model within "
                f"{canary.timeout_s:g} s; canary_rollback_timeouts {self.max_timeouts})")

    def rollback_reason(self, canary: Shield, plan: AutoPlan) -> str | None:
        """Why the canary must go now, or None."""
        if canary.breaker.times_opened > self._breaker_base:
            return (f"circuit breaker opened after {canary.breaker.consecutive_failures} "
                    "consecutive failed batches")
        mine = self.signals.get(canary.policy.version)
        if mine is None:
            return None
        if mine.infeasible > plan.max_infeasible:
            return f"{mine.infeasible} infeasible actions attempted (max {plan.max_infeasible})"
        if mine.decisions < plan.min_decisions:
            return None
        n = mine.decisions
        if mine.fallbacks / n > plan.max_fallback_rate:
            return f"fallback rate {mine.fallbacks / n:.3f} > {plan.max_fallback_rate:g} " \
                   f"over {n} decisions"
        if mine.interventions / n > plan.max_intervention_rate:
            return f"shield intervention rate {mine.interventions / n:.3f} > " \
                   f"{plan.max_intervention_rate:g} over {n} decisions"
        p95 = mine.latency_p95()
        if p95 > plan.max_latency_p95_ms:
            return f"latency p95 {p95:.1f} ms > {plan.max_latency_p95_ms:g} ms"
        if plan.max_sla_risk_excess is not None:
            stable = self.signals.get(self.rollout.stable.policy.version)
            base = stable.mean_risk if stable and stable.decisions else 0.0
            if mine.mean_risk - base > plan.max_sla_risk_excess:
                return f"predicted SLA risk {mine.mean_risk:.3f} vs stable {base:.3f} " \
                       f"(excess > {plan.max_sla_risk_excess:g})"
        return None

    # ------------------------------------------------------------ operator
    def start(self, spec: Any, weight: float, plan: AutoPlan | None,
              reason: str = "operator") -> str:
        auto = None if plan is None else {"plan": plan.model_dump(), "paused": False,
                                          "counted": 0}
        version = self.rollout.start_canary(spec, weight, auto=auto, reason=reason)
        self._follow()
        return version

    def pause(self, reason: str = "operator") -> None:
        self._set_paused(True, "paused", reason)

    def resume(self, reason: str = "operator") -> None:
        self._set_paused(False, "resumed", reason)

    def _set_paused(self, paused: bool, event: str, reason: str) -> None:
        self._follow()
        auto = self.rollout.auto
        if auto is None:
            raise PolicySpecError("no automatic canary to pause or resume: start one with "
                                  "action 'canary' and an 'auto' plan")
        if bool(auto.get("paused")) == paused:
            raise PolicySpecError(f"the canary is already {'paused' if paused else 'running'}")
        self.rollout.set_auto(dict(auto, paused=paused, counted=self.counted), event,
                              f"{reason}; {self.counted} canary decisions counted")

    def report(self) -> dict[str, Any]:
        canary = self._follow()
        plan = self._plan()
        auto = self.rollout.auto or {}
        return {"canary": None if canary is None else canary.policy.version,
                "mode": "manual" if plan is None else "automatic",
                "paused": bool(auto.get("paused")), "counted": self.counted,
                "plan": None if plan is None else plan.model_dump(),
                "signals": {v: s.report() for v, s in self.signals.items()}}


def _summary(signals: VersionSignals) -> str:
    r = signals.report()
    return (f"fallback rate {r['fallback_rate']:.3f}, intervention rate "
            f"{r['intervention_rate']:.3f}, latency p95 {r['latency_p95_ms']:.1f} ms")
