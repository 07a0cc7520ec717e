"""The per-tick signal series the simulator reads: price, carbon, solar, and their calendar.

One value per tick, each the mean over the tick ``[start + i*tick, start + (i+1)*tick)``.
Times are naive local times (no time zone). The arrays are read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

SECONDS_PER_WEEK = 7 * 86400


@numba.njit(cache=True)
def _all_finite(a):  # pragma: no cover (compiled)
    """``numpy.isfinite(a).all()`` of a 1-d float64 array, in one compiled pass."""
    ok = True
    for i in range(a.shape[0]):
        if not np.isfinite(a[i]):
            ok = False
            break
    return ok


@dataclass(frozen=True, eq=False)
class SignalSeries:
    """Price ($/MWh), grid carbon (gCO2/kWh) and on-site solar (kW, zeros without solar)
    per tick, from ``start`` (datetime64[s], local time, tick 0's beginning)."""

    price_usd_per_mwh: np.ndarray
    carbon_g_per_kwh: np.ndarray
    solar_kw: np.ndarray
    tick_seconds: float
    start: np.datetime64
    source: str = "synthetic"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.price_usd_per_mwh)
        for name in ("price_usd_per_mwh", "carbon_g_per_kwh", "solar_kw"):
            arr = np.ascontiguousarray(getattr(self, name), dtype=np.float64)
            if arr.shape != (n,):
                raise ValueError(f"{name}: shape {arr.shape}, expected ({n},)")
            if not _all_finite(arr):
                raise ValueError(f"{name}: non-finite values")
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        if not self.tick_seconds > 0:
            raise ValueError(f"tick_seconds: must be > 0, got {self.tick_seconds}")
        object.__setattr__(self, "start", np.datetime64(self.start, "s"))

    @property
    def n_ticks(self) -> int:
        return len(self.price_usd_per_mwh)

    @property
    def hour_of_week0(self) -> float:
        """Hours since Monday 00:00 at tick 0's beginning (0 <= h < 168)."""
        s = int(self.start.astype(np.int64))
        return ((s + 3 * 86400) % SECONDS_PER_WEEK) / 3600.0

    def hour_of_day(self, t: int | np.ndarray) -> np.ndarray | float:
        """Hour of day (0..24) at the beginning of tick ``t``."""
        return np.mod(self.hour_of_week0 + np.asarray(t) * self.tick_seconds / 3600.0, 24.0)

    def hour_of_week(self, t: int | np.ndarray) -> np.ndarray | float:
        """Hours since Monday 00:00 (0..168) at the beginning of tick ``t``."""
        return np.mod(self.hour_of_week0 + np.asarray(t) * self.tick_seconds / 3600.0, 168.0)

    def time_features(self, t: int) -> np.ndarray:
        """sin/cos of the hour of day and of the hour of week at tick ``t`` (4 floats)."""
        d = 2 * np.pi * self.hour_of_day(t) / 24.0
        w = 2 * np.pi * self.hour_of_week(t) / 168.0
        return np.array([np.sin(d), np.cos(d), np.sin(w), np.cos(w)], dtype=np.float32)

    def timestamps(self) -> np.ndarray:
        """Each tick's beginning as datetime64[s]."""
        offs = (np.arange(self.n_ticks) * self.tick_seconds).astype(np.int64)
        return self.start + offs.astype("timedelta64[s]")
