"""A canary for the scenario controller: a second policy takes a share of the decisions and
is promoted or rolled back on what it did.

``POST /v1/scenario/canary`` (bearer token) starts one: ``{"policy": "learned:PATH",
"weight": 0.5, "promote_after": 40, "max_fallbacks": 0, "max_clamped": 0,
"max_decide_ms_p95": 250}``; ``{"action": "promote" | "rollback"}`` forces the decision.
``GET /v1/scenario/canary`` (bearer token) reports the stable and canary policies, the
canary's counters and the event log, each event with its reason.

Routing is deterministic: of every run of requests, the share ``weight`` goes to the
canary (request ``n`` is the canary's when ``floor((n + 1) w) > floor(n w)``). Each
canary decision is shielded as the stable one's is (:class:`ScenarioService`); the canary
is **rolled back at once** when its fallbacks (an error or a timeout answered by the
signal-aware rule) exceed ``max_fallbacks`` or its clamped answers exceed
``max_clamped``, and, at the promotion point, when its server-side decision time p95 is
above ``max_decide_ms_p95``; it is **promoted** (it becomes the stable policy) after
``promote_after`` canary decisions with none of these. A policy that does not load is
refused before it gets traffic (422). State is this replica's, in memory.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from serve_apps.scenario_schemas import ScenarioDecision, ScenarioState
from serve_apps.scenario_service import ScenarioService


class CanaryRequest(BaseModel):
    """Start a canary (``policy``) or force a decision on the running one (``action``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    policy: str | None = Field(default=None, max_length=1024,
                               description="learned:PATH, signal_aware, mpc or "
                                           "python:MODULE:FACTORY")
    action: str | None = Field(default=None, pattern="^(promote|rollback)$")
    weight: float = Field(default=0.5, gt=0.0, le=1.0)
    promote_after: int = Field(default=40, ge=1, le=1_000_000)
    max_fallbacks: int = Field(default=0, ge=0)
    max_clamped: int = Field(default=0, ge=0)
    max_decide_ms_p95: float = Field(default=1000.0, gt=0.0)
    reason: str = Field(default="operator", max_length=300)


class CanaryError(ValueError):
    """A canary request the service refuses (422, one line)."""


class ScenarioRollout:
    """The stable scenario controller and an optional canary (module docstring)."""

    def __init__(self, stable: ScenarioService) -> None:
        self.stable = stable
        self.canary: ScenarioService | None = None
        self.plan: dict[str, Any] = {}
        self.weight = 0.0
        self.n = 0
        self.counts = {"decisions": 0, "fallbacks": 0, "clamped": 0}
        self.events: list[dict[str, Any]] = []

    def _event(self, event: str, reason: str) -> dict[str, Any]:
        entry = {"id": len(self.events) + 1, "event": event, "reason": reason,
                 "policy": self.canary.cfg.policy if self.canary else None,
                 "at": time.time(), **{k: v for k, v in self.counts.items()}}
        self.events.append(entry)
        return entry

    def handle(self, req: CanaryRequest) -> dict[str, Any]:
        """Start a canary or force a decision; the report."""
        if req.action is not None:
            if self.canary is None:
                raise CanaryError(f"action: no canary is running to {req.action}")
            (self.promote if req.action == "promote" else self.rollback)(req.reason)
            return self.report()
        if not req.policy:
            raise CanaryError("policy: give a policy to start a canary, or an action")
        if self.canary is not None:
            raise CanaryError(f"policy: a canary ({self.canary.cfg.policy}) is running; "
                              "promote or roll it back first")
        from serve_apps.scenario_config import ScenarioServing
        from serve_apps.scenario_service import ScenarioPolicyError

        try:
            cfg = ScenarioServing(**{**self.stable.cfg.model_dump(), "policy": req.policy,
                                     "params": {}})
            canary = ScenarioService(cfg)
        except (ScenarioPolicyError, ValueError) as e:
            raise CanaryError(f"policy: {' '.join(str(e).split())[:300]}") from None
        self.canary, self.weight, self.n = canary, float(req.weight), 0
        self.plan = {k: getattr(req, k) for k in ("promote_after", "max_fallbacks",
                                                  "max_clamped", "max_decide_ms_p95")}
        self.counts = {"decisions": 0, "fallbacks": 0, "clamped": 0}
        self._event("started", f"weight {req.weight:g}, promote after {req.promote_after} "
                               "decisions")
        return self.report()

    async def decide(self, state: ScenarioState) -> ScenarioDecision:
        """The routed version's shielded decision; the canary's is watched."""
        n, self.n = self.n, self.n + 1
        canary = self.canary
        if canary is None or math.floor((n + 1) * self.weight) <= math.floor(n * self.weight):
            return await self.stable.decide(state)
        out = await canary.decide(state)
        if self.canary is canary:  # not decided meanwhile by another request
            self._observe(out)
        return out

    def _observe(self, out: ScenarioDecision) -> None:
        c, p = self.counts, self.plan
        c["decisions"] += 1
        c["fallbacks"] += int(out.fallback)
        c["clamped"] += int(bool(out.reason) and "clamped" in (out.reason or ""))
        if c["fallbacks"] > p["max_fallbacks"]:
            self.rollback(f"fallback {c['fallbacks']} > max_fallbacks {p['max_fallbacks']}: "
                          f"{out.reason}")
        elif c["clamped"] > p["max_clamped"]:
            self.rollback(f"clamped answer {c['clamped']} > max_clamped {p['max_clamped']}: "
                          f"{out.reason}")
        elif c["decisions"] >= p["promote_after"]:
            ms = list(self.canary.decide_ms)[-c["decisions"]:] if self.canary else []
            p95 = float(np.percentile(ms, 95)) if ms else 0.0
            if p95 > p["max_decide_ms_p95"]:
                self.rollback(f"decide_ms p95 {p95:.1f} > {p['max_decide_ms_p95']:g}")
            else:
                self.promote(f"{c['decisions']} canary decisions: {c['fallbacks']} "
                             f"fallbacks, {c['clamped']} clamped, decide_ms p95 {p95:.1f}")

    def promote(self, reason: str) -> None:
        if self.canary is not None:
            self._event("promoted", reason)
            self.stable, self.canary, self.weight = self.canary, None, 0.0

    def rollback(self, reason: str) -> None:
        if self.canary is not None:
            self._event("rolled_back", reason)
            self.canary, self.weight = None, 0.0

    def report(self) -> dict[str, Any]:
        return {"stable": self.stable.cfg.policy,
                "canary": self.canary.cfg.policy if self.canary else None,
                "weight": self.weight, "plan": dict(self.plan), "counts": dict(self.counts),
                "events": list(self.events)}
