"""The Lagrange multiplier λ ≥ 0 of the cost constraint: dual ascent on log λ, or PID.

Both read the relative violation e = (Ĵ_c - d) / d of the cost estimate Ĵ_c against the
per-step threshold d, clipped to [-1, 1], so one update moves λ by a bounded amount
whatever the cost scale (the source's unnormalised dual ascent saturated λ):

* ``dual``: log λ ← clip(log λ + η·e, log λ_min, log λ_max) - λ rises while the policy's
  estimated cost is above the threshold and falls while it is below;
* ``pid`` (Stooke et al. 2020, as in OSRL's BCQ-Lag): I ← max(0, I + e),
  λ = clip(K_p·e + K_i·I + K_d·max(0, e - e_prev), 0, λ_max);
* ``plain``: the source's dual ascent, log λ ← clip(log λ + η·(Ĵ_c - d), ...), on the
  raw, unnormalised, unclipped error (kept as the saturation ablation: its step grows
  with the cost scale, so λ runs to a bound).

Warm-up: the first ``warmup`` updates leave λ at its initial value (and the PID state
untouched): the cost critic starts at Q_c ≈ 0, so its early estimates sit below any
threshold and would drive λ to its floor before the critic has learned the data's cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class LagrangeController:
    """λ from a stream of (cost estimate, threshold) pairs."""

    mode: str = "dual"  # "dual" | "pid" | "plain"
    init: float = 0.1
    lr: float = 0.02
    min_value: float = 1e-3
    max_value: float = 100.0
    kp: float = 0.1
    ki: float = 0.01
    kd: float = 0.0
    warmup: int = 0  # updates that leave λ frozen at ``init``

    def __post_init__(self) -> None:
        if self.mode not in ("dual", "pid", "plain"):
            raise ValueError(f"lagrange mode must be 'dual', 'pid' or 'plain', got "
                             f"{self.mode!r}")
        if not 0 < self.min_value <= self.init <= self.max_value:
            raise ValueError("need 0 < lagrange_min <= lagrange_init <= lagrange_max, got "
                             f"{self.min_value}, {self.init}, {self.max_value}")
        self.log_value = math.log(self.init)
        self.integral = self.init / self.ki if self.mode == "pid" and self.ki > 0 else 0.0
        if self.warmup < 0:
            raise ValueError(f"lagrange warmup must be >= 0 updates, got {self.warmup}")
        self.prev_error = 0.0
        self.value = self.init
        self.steps = 0

    @staticmethod
    def relative_error(cost_estimate: float, threshold: float) -> float:
        return max(-1.0, min(1.0, (cost_estimate - threshold) / max(threshold, 1e-8)))

    def update(self, cost_estimate: float, threshold: float) -> float:
        """One step; returns the new λ (unchanged during the warm-up)."""
        self.steps += 1
        if self.steps <= self.warmup:
            return self.value
        e = self.relative_error(float(cost_estimate), float(threshold))
        if self.mode == "plain":
            e = float(cost_estimate) - float(threshold)
        if self.mode in ("dual", "plain"):
            self.log_value = min(math.log(self.max_value),
                                 max(math.log(self.min_value), self.log_value + self.lr * e))
            self.value = math.exp(self.log_value)
        else:
            self.integral = max(0.0, self.integral + e)
            raw = self.kp * e + self.ki * self.integral + self.kd * max(0.0, e - self.prev_error)
            self.value = min(self.max_value, max(0.0, raw))
        self.prev_error = e
        return self.value

    def set_value(self, value: float) -> None:
        """Resume from a λ (e.g. a checkpointed module's buffer)."""
        value = min(self.max_value, max(self.min_value, float(value)))
        self.value, self.log_value = value, math.log(value)
        if self.mode == "pid" and self.ki > 0:
            self.integral = value / self.ki
