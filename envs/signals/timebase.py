"""The ticks' calendar (midpoints, hour of day, weekday) and the unit-variance noise paths
the generators share: a stationary AR(1) (an Ornstein-Uhlenbeck process sampled at the
ticks) and a smooth AR (two cascaded AR(1) filters, autocorrelation ``(1 + k/tau) e^{-k/tau}``
in the continuous limit). Times are naive local times (no time zone), like the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.signal import lfilter

SECONDS_PER_DAY = 86400
WEEKEND_RAMP_HOURS = 6.0


@dataclass(frozen=True)
class TickClock:
    """``n_ticks`` ticks of ``tick_seconds`` starting at ``start`` (datetime64[s], local)."""

    start: np.datetime64
    tick_seconds: float
    n_ticks: int

    def seconds_since_start(self) -> np.ndarray:
        """Each tick's midpoint, in seconds after ``start``."""
        return (np.arange(self.n_ticks, dtype=np.float64) + 0.5) * self.tick_seconds

    def seconds_of_epoch(self) -> np.ndarray:
        """Each tick's midpoint in seconds since 1970-01-01 00:00 (local), a Thursday."""
        t0 = float(self.start.astype("datetime64[s]").astype(np.int64))
        return t0 + self.seconds_since_start()

    def hour_of_day(self) -> np.ndarray:
        """Fractional hour of day (0..24) of every tick's midpoint."""
        return np.mod(self.seconds_of_epoch(), SECONDS_PER_DAY) / 3600.0

    def day_index(self) -> np.ndarray:
        """Days since 1970-01-01 of every tick's midpoint."""
        return np.floor_divide(self.seconds_of_epoch(), SECONDS_PER_DAY).astype(np.int64)

    def weekday(self) -> np.ndarray:
        """Day of week of every tick's midpoint, 0 = Monday .. 6 = Sunday."""
        return (self.day_index() + 3) % 7

    def is_weekend(self) -> np.ndarray:
        return self.weekday() >= 5

    def weekend_weight(self, ramp_hours: float = WEEKEND_RAMP_HOURS) -> np.ndarray:
        """How much of the weekend each tick is in: 0 on weekdays, 1 on Saturday and Sunday,
        ramping linearly over ``ramp_hours`` centred on midnight Friday/Saturday and
        Sunday/Monday (grids do not switch at the stroke of midnight). Its weekly mean is
        exactly 2/7."""
        how = np.mod(self.seconds_of_epoch() + 3 * SECONDS_PER_DAY, 7 * SECONDS_PER_DAY) / 3600.0

        def step(x: np.ndarray) -> np.ndarray:
            return np.clip((x + ramp_hours / 2.0) / ramp_hours, 0.0, 1.0)

        return step(how - 120.0) - step(how - 168.0) + 1.0 - step(how)


def ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """Stationary AR(1) with unit variance: ``x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t``."""
    e = rng.standard_normal(n)
    if n == 0:
        return e
    scale = np.sqrt(max(1.0 - phi * phi, 0.0))
    x0 = e[0]
    e[0] = 0.0
    out = lfilter([scale], [1.0, -phi], e)
    return out + x0 * phi ** np.arange(n)


def smooth_ar(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """Unit-variance stationary output of two cascaded AR(1) filters with the same ``phi``."""
    y = ar1(rng, n, phi)
    if n == 0:
        return y
    # z_t = phi z_{t-1} + c y_t has Var(z) = c^2 (1 + phi^2) / (1 - phi^2)^2 and
    # Cov(z, y) = c / (1 - phi^2); choose c for unit variance and start z stationary.
    c = (1.0 - phi * phi) / np.sqrt(1.0 + phi * phi)
    rho = 1.0 / np.sqrt(1.0 + phi * phi)
    z0 = rho * y[0] + np.sqrt(max(1.0 - rho * rho, 0.0)) * rng.standard_normal()
    drive = c * y
    drive[0] = 0.0
    return lfilter([1.0], [1.0, -phi], drive) + z0 * phi ** np.arange(n)
