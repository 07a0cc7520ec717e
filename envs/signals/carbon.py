"""Stochastic grid carbon intensity (gCO2/kWh), fitted to the real German grid of 2020.

Model, evaluated at every tick's midpoint::

    c(t) = mean + a * profile(hour of day) + weekday offset
           + slow(t) + fast(t),              softly floored at ``floor``

* ``profile``: the mean daily shape of 2020 (24 hourly values, below, interpolated
  periodically): a night plateau, a morning bump, the midday solar trough (-39 at 11:00)
  and the evening peak (+36 at 18:00); ``a`` scales it (``carbon_daily_amplitude``).
* weekday offset: weekdays are ``weekend_drop`` dirtier than weekends; the offsets
  (+2/7, -5/7 of it) keep the weekly mean at ``mean``; the switch ramps over 6 h around
  midnight (:meth:`TickClock.weekend_weight`).
* ``slow``: an Ornstein-Uhlenbeck process (weather: wind fronts lasting days).
* ``fast``: a smooth (critically damped, two cascaded first-order filters) process for the
  within-day deviations; its autocorrelation is ``(1 + k/tau) exp(-k/tau)``.
* soft floor: below ``floor + 40`` the value bends smoothly towards ``floor``
  (``floor + 40 exp((x - floor - 40) / 40)``), so it never goes under ``floor``.

The fit (:data:`FIT`) comes from the hourly means of the German 2020 series (1 Jan to
31 Dec 2020, 8,784 hours) of Wiesner et al., "Let's Wait Awhile: How Temporal Workload
Shifting Can Reduce Carbon Emissions in the Cloud", Middleware 2021,
doi:10.1145/3464298.3493399 (ENTSO-E production data, IPCC emission factors): mean,
weekday-minus-weekend mean, the hour-of-day means of what remains, then the two
components' weights and correlation times by least squares on the residual's
autocorrelation at lags 1, 2, 3, 6, 12, 24, 48, 72, 120 and 168 h.

Real-data statistics (:data:`REAL_STATS`) are what the tests hold the generator to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from envs.signals.timebase import TickClock, ar1, interp_into, interp_slopes, mod24_into, smooth_ar

SOFT_KNEE_G_PER_KWH = 40.0


@dataclass(frozen=True)
class CarbonFit:
    """Carbon generator parameters fitted to the German grid, 2020 (gCO2/kWh, hours)."""

    mean: float = 313.4
    weekend_drop: float = 65.5
    slow_sd: float = 90.8
    slow_hours: float = 168.0
    fast_sd: float = 50.8
    fast_hours: float = 4.1
    floor: float = 90.0
    # mean deviation from the (weekday-adjusted) mean at hours 0..23, value at hour h + 0.5
    profile: tuple[float, ...] = (
        -5.4, -8.7, -7.5, -0.6, 9.5, 15.3, 12.0, 0.7, -14.1, -26.7, -34.9, -38.8,
        -37.1, -29.5, -16.1, 1.8, 19.9, 32.7, 36.1, 32.5, 26.5, 20.2, 9.6, 0.3,
    )


FIT = CarbonFit()

# Statistics of the real 2020 series (hourly means), for the generator's tests and docs.
REAL_STATS = {
    "mean": 313.4,            # gCO2/kWh
    "sd": 110.4,
    "min": 101.7,
    "max": 592.6,
    "daily_swing_mean": 133.4,  # mean over days of (max - min) of the hourly values
    "weekday_mean": 332.0,
    "weekend_mean": 266.5,
    "acf_1h": 0.990,
    "acf_24h": 0.689,
}


# The ranges the generator's defaults must land in (4 seeds x 364 days at 15-min ticks,
# averaged to hours like the real series), next to the real value; checked by the tests.
# Measured: mean 316, sd 102, daily swing 137, weekday-weekend 66, lag-1 h 0.985,
# lag-24 h 0.63, mean profile lowest at 11:00 and highest at 18:00 (72 apart; real 75).
GENERATOR_RANGES = {
    "mean": (290.0, 340.0),               # real 313.4
    "sd": (85.0, 130.0),                  # real 110.4 (per year)
    "daily_swing_mean": (110.0, 160.0),   # real 133.4
    "weekday_minus_weekend": (45.0, 85.0),  # real 65.5
    "acf_1h": (0.975, 0.995),             # real 0.990
    "acf_24h": (0.5, 0.8),                # real 0.689
}


_PROFILE = np.asarray(FIT.profile)
_PROFILE_XP = np.arange(-0.5, 24.5 + 1e-9, 1.0)  # hour centres, wrapped at both ends
_PROFILE_FP = np.concatenate([_PROFILE[-1:], _PROFILE, _PROFILE[:1]])
_PROFILE_SLOPES = interp_slopes(_PROFILE_XP, _PROFILE_FP)


def daily_profile(hours: np.ndarray, amplitude: float = 1.0) -> np.ndarray:
    """The fitted daily shape at fractional hours of day (periodic linear interpolation)."""
    return amplitude * np.interp(np.mod(hours, 24.0), _PROFILE_XP, _PROFILE_FP)


def soft_floor(x: np.ndarray, floor: float) -> np.ndarray:
    """``x`` above ``floor + knee``; below it, a smooth exponential approach to ``floor``."""
    knee = floor + SOFT_KNEE_G_PER_KWH
    below = floor + SOFT_KNEE_G_PER_KWH * np.exp(
        np.minimum(x - knee, 0.0) / SOFT_KNEE_G_PER_KWH)
    return np.where(x >= knee, x, below)


def carbon_components(clock: TickClock, rng_slow: np.random.Generator,
                      rng_fast: np.random.Generator, slow_hours: float,
                      fast_hours: float) -> tuple[np.ndarray, np.ndarray]:
    """Unit-variance slow (OU) and fast (smooth) noise paths, one value per tick."""
    dt_h = clock.tick_seconds / 3600.0
    slow = ar1(rng_slow, clock.n_ticks, np.exp(-dt_h / slow_hours))
    fast = smooth_ar(rng_fast, clock.n_ticks, np.exp(-dt_h / fast_hours))
    return slow, fast


@numba.njit(cache=True)
def _carbon_kernel(hours, weekend, slow, fast, mean, amplitude, drop, slow_sd, fast_sd, knee,
                   xp, fp, slopes, x_out, arg_out):  # pragma: no cover (compiled)
    """``x_out``: the carbon before the soft floor, ``arg_out``: the floor's exponent
    ``min(x - knee, 0) / knee width``, per tick, in :func:`generate_carbon`'s numpy
    operations and order (:func:`daily_profile`, the weekday offset, the noise terms)."""
    two_sevenths = 2.0 / 7.0
    n = hours.shape[0]
    profile = np.empty(n)
    mod24_into(hours, profile)
    interp_into(profile, xp, fp, slopes, profile)
    for i in range(n):
        x = (((mean + amplitude * profile[i]) + drop * (two_sevenths - weekend[i]))
             + slow_sd * slow[i]) + fast_sd * fast[i]
        x_out[i] = x
        d = x - knee
        arg_out[i] = (d if not d > 0.0 else 0.0) / SOFT_KNEE_G_PER_KWH


@numba.njit(cache=True)
def _soft_floor_finish(x, e, floor, knee, out):  # pragma: no cover (compiled)
    """:func:`soft_floor` from ``e = exp(arg_out)`` of :func:`_carbon_kernel`."""
    for i in range(x.shape[0]):
        out[i] = x[i] if x[i] >= knee else floor + SOFT_KNEE_G_PER_KWH * e[i]


def generate_carbon(clock: TickClock, cfg, slow: np.ndarray, fast: np.ndarray) -> np.ndarray:
    """Carbon intensity per tick from the config's parameters and unit noise paths.

    ``mean + daily_profile(hours, a) + drop * (2/7 - weekend weight) + slow_sd * slow +
    fast_sd * fast``, then :func:`soft_floor`: one compiled pass for the sums, numpy's
    ``exp``, one for the floor (the same values as those numpy expressions)."""
    n = clock.n_ticks
    floor = float(cfg.carbon_floor_g_per_kwh)
    knee = floor + SOFT_KNEE_G_PER_KWH
    x = np.empty(n)
    arg = np.empty(n)
    _carbon_kernel(clock.hour_of_day(), clock.weekend_weight(),
                   np.ascontiguousarray(slow, dtype=np.float64),
                   np.ascontiguousarray(fast, dtype=np.float64),
                   float(cfg.carbon_mean_g_per_kwh), float(cfg.carbon_daily_amplitude),
                   float(cfg.carbon_weekend_drop_g_per_kwh), float(cfg.carbon_slow_sd_g_per_kwh),
                   float(cfg.carbon_fast_sd_g_per_kwh), knee, _PROFILE_XP, _PROFILE_FP,
                   _PROFILE_SLOPES, x, arg)
    out = np.empty(n)
    _soft_floor_finish(x, np.exp(arg), floor, knee, out)
    return out
