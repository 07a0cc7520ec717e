"""Prometheus metrics of the decision service and the production loop (Ray's metrics API).

Every metric is a ``ray.util.metrics`` Counter, Histogram or Gauge, so it is exported on
Ray's metrics endpoint (``ray_<name>`` on each node's metrics export port, scraped by
Prometheus and shown in Ray's dashboard). Each wrapper also keeps what it recorded in
this process (:meth:`Recorded.samples`), which the service shows as JSON on
``GET /v1/metrics`` and tests read without waiting for Ray's export interval.

Service (:class:`ServiceMetrics`, one per replica):

* ``cloudrl_decisions`` (counter; ``version``, ``answered_by``): decisions answered;
  decisions/s is its rate;
* ``cloudrl_decide_latency_ms`` (histogram; ``version``): server-side latency of a decision;
* ``cloudrl_decide_fallbacks`` (counter; ``version``, ``reason``): answered by the fallback;
* ``cloudrl_shield_interventions`` (counter; ``version``, ``reason``): the shield replaced
  the model's answer (``error``, ``nan``, ``timeout``, ``infeasible``);
* ``cloudrl_canary_share`` (gauge; ``version``): the canary's traffic weight (0: none);
* ``cloudrl_rollout_transitions`` (counter; ``event``): canary started, promoted, ...;
* ``cloudrl_feedback_rows`` (counter): operator feedback pairs stored.

Loop (:class:`LoopMetrics`, set by the retrain job or whatever drives the loop):

* ``cloudrl_reward_model_accuracy`` (gauge; ``model_version``, ``split``): accuracy of the
  reward model on held-out (``split="validation"``) or new (``split="new"``: drift) pairs;
* ``cloudrl_feedback_rows_pending`` (gauge): feedback pairs not yet used by a retrain.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ray.util import metrics

LATENCY_BUCKETS_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]


class Recorded:
    """A Ray metric plus what this process recorded into it, per tag set."""

    def __init__(self, kind: str, name: str, description: str,
                 tag_keys: tuple[str, ...] = (), boundaries: list[float] | None = None) -> None:
        self.kind, self.name, self.tag_keys = kind, name, tag_keys
        if kind == "counter":
            self.metric: metrics.Metric = metrics.Counter(name, description, tag_keys)
        elif kind == "gauge":
            self.metric = metrics.Gauge(name, description, tag_keys)
        else:
            self.boundaries = list(boundaries or LATENCY_BUCKETS_MS)
            self.metric = metrics.Histogram(name, description, self.boundaries, tag_keys)
        self._values: dict[tuple[str, ...], Any] = defaultdict(float)

    def _key(self, tags: dict[str, str]) -> tuple[str, ...]:
        return tuple(str(tags[k]) for k in self.tag_keys)

    def _tags(self, tags: dict[str, str] | None) -> dict[str, str]:
        return {k: str(v) for k, v in (tags or {}).items()}

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        tags = self._tags(tags)
        self.metric.inc(value, tags=tags)  # type: ignore[attr-defined]
        self._values[self._key(tags)] += value

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        tags = self._tags(tags)
        self.metric.set(value, tags=tags)  # type: ignore[attr-defined]
        self._values[self._key(tags)] = float(value)

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        tags = self._tags(tags)
        self.metric.observe(float(value), tags=tags)  # type: ignore[attr-defined]
        key = self._key(tags)
        if not self._values[key]:
            self._values[key] = {"count": 0, "sum": 0.0,
                                 "buckets": [0] * (len(self.boundaries) + 1)}
        h = self._values[key]
        h["count"] += 1
        h["sum"] += float(value)
        h["buckets"][sum(1 for b in self.boundaries if value > b)] += 1

    def samples(self) -> list[dict[str, Any]]:
        """Per tag set: the tags and the value (a histogram: count, sum, bucket counts)."""
        return [{"tags": dict(zip(self.tag_keys, key, strict=True)), "value": value}
                for key, value in sorted(self._values.items())]

    def value(self, **tags: str) -> Any:
        """The recorded value of one tag set (0.0 when never recorded)."""
        return self._values.get(self._key(tags), 0.0)


class _MetricSet:
    def snapshot(self) -> dict[str, Any]:
        return {m.name: {"type": m.kind, "tag_keys": list(m.tag_keys), "samples": m.samples()}
                for m in vars(self).values() if isinstance(m, Recorded)}


class ServiceMetrics(_MetricSet):
    """The decision service's metrics (see the module docstring)."""

    def __init__(self) -> None:
        self.decisions = Recorded("counter", "cloudrl_decisions", "decisions answered",
                                  ("version", "answered_by"))
        self.latency = Recorded("histogram", "cloudrl_decide_latency_ms",
                                "server-side latency of a decision (ms)", ("version",),
                                LATENCY_BUCKETS_MS)
        self.fallbacks = Recorded("counter", "cloudrl_decide_fallbacks",
                                  "decisions answered by the fallback heuristic",
                                  ("version", "reason"))
        self.interventions = Recorded("counter", "cloudrl_shield_interventions",
                                      "model answers the shield replaced",
                                      ("version", "reason"))
        self.canary_share = Recorded("gauge", "cloudrl_canary_share",
                                     "traffic weight of the canary (0: no canary)", ("version",))
        self.transitions = Recorded("counter", "cloudrl_rollout_transitions",
                                    "rollout transitions", ("event",))
        self.feedback_rows = Recorded("counter", "cloudrl_feedback_rows",
                                      "operator feedback pairs stored")

    def decision(self, version: str, by_model: bool, reason: str | None,
                 latency_ms: float) -> None:
        self.decisions.inc(tags={"version": version,
                                 "answered_by": "model" if by_model else "fallback"})
        self.latency.observe(latency_ms, tags={"version": version})
        if not by_model:
            self.fallbacks.inc(tags={"version": version, "reason": reason or "unknown"})
            if reason in ("error", "nan", "timeout", "infeasible"):
                self.interventions.inc(tags={"version": version, "reason": reason})

    def rollout_state(self, canary_version: str | None, weight: float,
                      previous: str | None) -> None:
        """The canary gauge: ``weight`` for the canary, 0 for a canary that left."""
        if previous and previous != canary_version:
            self.canary_share.set(0.0, tags={"version": previous})
        if canary_version:
            self.canary_share.set(weight, tags={"version": canary_version})


class LoopMetrics(_MetricSet):
    """The production loop's metrics (see the module docstring)."""

    def __init__(self) -> None:
        self.reward_accuracy = Recorded("gauge", "cloudrl_reward_model_accuracy",
                                        "reward model pair accuracy",
                                        ("model_version", "split"))
        self.feedback_pending = Recorded("gauge", "cloudrl_feedback_rows_pending",
                                         "feedback pairs not yet used by a retrain")

    def reward_model(self, accuracy: float, model_version: str, split: str = "validation"
                     ) -> None:
        self.reward_accuracy.set(accuracy, tags={"model_version": str(model_version),
                                                 "split": split})

    def pending(self, rows: int) -> None:
        self.feedback_pending.set(rows)
