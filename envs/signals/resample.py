"""Exact resampling of a step series onto ticks: the mean over each tick.

A sample ``v_i`` at time ``t_i`` holds on ``[t_i, t_{i+1})`` (the last one for one more
interval). The mean over a tick is the integral of that step function over the tick,
divided by its length: averaging when ticks are longer than the samples, forward-filling
when they are shorter, both exact.
"""

from __future__ import annotations

import numpy as np


def step_mean(times_s: np.ndarray, values: np.ndarray, last_interval_s: float,
              tick_start_s: float, tick_seconds: float, n_ticks: int) -> np.ndarray:
    """Mean of the step series over ``n_ticks`` ticks from ``tick_start_s`` (same clock as
    ``times_s``, seconds). The ticks must lie inside ``[times_s[0], times_s[-1] +
    last_interval_s]``."""
    times_s = np.asarray(times_s, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    edges = np.append(times_s, times_s[-1] + last_interval_s)
    end = tick_start_s + n_ticks * tick_seconds
    if tick_start_s < edges[0] - 1e-6 or end > edges[-1] + 1e-6:
        raise ValueError(f"ticks [{tick_start_s}, {end}] s fall outside the data "
                         f"[{edges[0]}, {edges[-1]}] s")
    cum = np.concatenate([[0.0], np.cumsum(values * np.diff(edges))])
    x = tick_start_s + np.arange(n_ticks + 1, dtype=np.float64) * tick_seconds
    x = np.clip(x, edges[0], edges[-1])
    k = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(values) - 1)
    integral = cum[k] + values[k] * (x - edges[k])
    return np.diff(integral) / tick_seconds
