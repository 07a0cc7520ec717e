"""Noisy forecasts of the signals: the truth times ``(1 + noise)``, noise growing with lead.

Error model: for each signal and seed, a standard Brownian path ``W`` in units of days is
drawn once per series (one increment per tick). The forecast made at tick ``t`` for tick
``s > t`` is::

    forecast(s | t) = truth(s) * max(0, 1 + error * (W(s) - W(t)))

so the relative error has sd ``error * sqrt(lead / 24 h)`` (``error`` is the sd at 24 h
lead), is correlated along the horizon (a forecast that is high at +3 h tends to be high at
+4 h), and shrinks as ``t`` approaches ``s``: later forecasts of the same hour are better,
like re-issued day-ahead forecasts. ``error = 0`` returns the truth exactly; carbon and
solar forecasts are never negative (the factor is floored at 0, so no sign flips either).

Cost: the paths are drawn once per (series, seed) and cached; a call is three slices and a
multiply-add, a few microseconds for a 288-tick horizon. :func:`error_paths` draws only the
first rows when the later ones are not needed (the rows are drawn one after the other, so
the first rows are the same either way).
"""

from __future__ import annotations

import weakref

import numba
import numpy as np

from envs.signals.seeding import seeded_rng
from envs.signals.series import SignalSeries

_FORECAST_STREAM = 0xF0CA57
_MAX_SEEDS_PER_SERIES = 16
_paths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@numba.njit(cache=True)
def _brownian(normals, step, out):  # pragma: no cover (compiled)
    """``out[r, 0] = 0``, ``out[r, 1:] = cumsum(normals[r] * step)`` per row, in numpy's
    operations (the multiply, then ``add.accumulate``'s running sum)."""
    for r in range(out.shape[0]):
        out[r, 0] = 0.0
        if out.shape[1] > 1:
            acc = normals[r, 0] * step
            out[r, 1] = acc
            for i in range(1, normals.shape[1]):
                acc = acc + normals[r, i] * step
                out[r, i + 1] = acc


def error_paths(seed: int, n_ticks: int, tick_seconds: float, n_rows: int = 3) -> np.ndarray:
    """The first ``n_rows`` (1..3: price, carbon, solar) Brownian error paths of ``seed``
    for ``n_ticks`` ticks, ``(n_rows, n_ticks)``: the rows of :class:`Forecaster`'s
    ``paths``, bit for bit."""
    if not 1 <= n_rows <= 3:
        raise ValueError(f"n_rows: must be 1..3, got {n_rows}")
    rng = seeded_rng((int(seed) & 0xFFFFFFFFFFFFFFFF, _FORECAST_STREAM), slot=_FORECAST_STREAM)
    step = float(np.sqrt(tick_seconds / 86400.0))
    w = np.empty((n_rows, n_ticks), dtype=np.float64)
    normals = rng.standard_normal((n_rows, max(n_ticks - 1, 0)))
    _brownian(normals, step, w)
    return w


class Forecaster:
    """Forecasts of one series with one seed's error paths (see the module docstring)."""

    def __init__(self, series: SignalSeries, seed: int) -> None:
        n = series.n_ticks
        self.n_ticks = n  # no reference to the series: the cache is keyed weakly on it
        self.paths = error_paths(seed, n, series.tick_seconds)
        # the truth rows (the series' read-only arrays, not the series), stacked on first use
        self._rows = (series.price_usd_per_mwh, series.carbon_g_per_kwh, series.solar_kw)
        self._stacked: np.ndarray | None = None

    @property
    def _truth(self) -> np.ndarray:
        if self._stacked is None:
            self._stacked = np.stack(self._rows)
        return self._stacked

    def __call__(self, t: int, horizon_ticks: int, error: float
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = self.n_ticks
        if not 0 <= t < n:
            raise ValueError(f"t: tick {t} is outside the series (0..{n - 1})")
        if horizon_ticks < 1:
            raise ValueError(f"horizon_ticks: must be >= 1, got {horizon_ticks}")
        if not error >= 0:
            raise ValueError(f"error: must be >= 0, got {error}")
        lo, hi = t + 1, t + 1 + horizon_ticks
        # past the series' end: hold its last value
        idx = slice(lo, hi) if hi <= n else np.minimum(np.arange(lo, hi), n - 1)
        if error == 0:
            out = self._truth[:, idx].copy()
        else:
            w = self.paths
            out = np.subtract(w[:, idx], w[:, t:t + 1])
            out *= error
            out += 1.0
            np.maximum(out, 0.0, out=out)
            out *= self._truth[:, idx]
        return out[0], out[1], out[2]


def forecaster(series: SignalSeries, seed: int) -> Forecaster:
    """The cached :class:`Forecaster` of ``series`` for ``seed`` (drawn on first use)."""
    per_series = _paths.get(series)
    if per_series is None:
        per_series = {}
        _paths[series] = per_series
    f = per_series.get(seed)
    if f is None:
        if len(per_series) >= _MAX_SEEDS_PER_SERIES:
            per_series.pop(next(iter(per_series)))
        f = Forecaster(series, seed)
        per_series[seed] = f
    return f


def forecast(series: SignalSeries, t: int, horizon_ticks: int, error: float, seed: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forecasts of (price, carbon, solar) for ticks ``t+1 .. t+horizon_ticks`` made at tick
    ``t``: the truth times ``(1 + noise)`` with sd ``error * sqrt(lead / 24 h)``, floored at
    0. Deterministic in ``(seed, t)``; ``error = 0`` gives the truth. Ticks past the series'
    end hold its last value. Returns three new float64 arrays of length ``horizon_ticks``."""
    return forecaster(series, seed)(t, horizon_ticks, error)

