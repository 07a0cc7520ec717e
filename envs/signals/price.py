"""Stochastic wholesale electricity price ($/MWh) with a day-ahead market's daily shape.

Model, per tick (midpoint)::

    p(t) = M * L(weekday) * S(hour, weekday) * exp(sd * x(t) - sd^2 / 2)
    x(t) = rho * z(t) + sqrt(1 - rho^2) * y(t)

then spikes and negative episodes overwrite it.

* ``S``: a time-of-use shape, one for weekdays (morning peak ~08:00, midday dip ~13:00
  where solar is strong, the evening peak ~18:00-19:00 the highest, night trough) and a
  flatter one for weekends (no morning peak, deeper midday dip); each has mean 1;
  ``price_daily_amplitude`` scales its deviation from 1.
* ``L``: weekend level ``price_weekend_factor`` times the weekday level, the week's mean
  kept at ``M`` (``price_mean_usd_per_mwh``); level and shape blend over 6 h around the
  weekend's midnights.
* ``y``: an AR(1)/OU log-price noise (correlation time ``price_noise_hours``); ``z`` the
  carbon generator's slow (weather) component, standardised, so windy days are cheap and
  clean together (``price_carbon_correlation``).
* spikes: Poisson, ``price_spikes_per_day``, starting in the morning (07-09) or evening
  (17-20) peak, lasting 1-3 h, the price raised to ``price_spike_factor * M`` times a
  lognormal(0, 0.4) draw.
* negative episodes: at most one per day, probability ``price_negative_per_day`` (x 0.7 on
  weekdays, x 1.75 on weekends, same weekly mean), starting 10:00-13:00, lasting 2-6 h,
  at ``price_negative_usd_per_mwh`` times a lognormal(0, 0.5) draw.

Calibration (approximate, to published annual statistics of the German/Luxembourg
day-ahead auction, as reported by e.g. Bundesnetzagentur's SMARD platform and Fraunhofer
ISE's Energy-Charts): negative prices in about 2-4 % of hours (211 h in 2019, 298 h in
2020, 301 h in 2023), daily peak-to-trough ratios of about 1.4-1.6 on weekdays, weekend
prices some 15-25 % below weekdays, and occasional hours at several times the mean. The
mean level (60 $/MWh) sits between the 2019-2020 annual averages (~30-38 EUR/MWh) and
2023's (~95 EUR/MWh); set it to the tariff being studied. :data:`TARGETS` holds the
ranges the tests check the generator against.
"""

from __future__ import annotations

import numba
import numpy as np

from envs.signals.timebase import TickClock, ar1, interp_into, interp_slopes, mod24_into

# Relative hourly shapes (value at hour h + 0.5), normalised to mean 1 below.
_WEEKDAY = np.array([
    0.90, 0.86, 0.83, 0.82, 0.83, 0.88, 1.00, 1.10, 1.14, 1.08, 1.02, 0.97,
    0.93, 0.92, 0.93, 0.97, 1.04, 1.13, 1.19, 1.17, 1.09, 1.03, 0.98, 0.92])
_WEEKEND = np.array([
    0.96, 0.92, 0.89, 0.87, 0.86, 0.87, 0.90, 0.93, 0.97, 0.97, 0.95, 0.90,
    0.85, 0.83, 0.86, 0.92, 1.00, 1.10, 1.19, 1.20, 1.15, 1.08, 1.04, 0.98])
WEEKDAY_SHAPE = _WEEKDAY / _WEEKDAY.mean()
WEEKEND_SHAPE = _WEEKEND / _WEEKEND.mean()

# What the generator's defaults must reproduce (checked in the tests), per hour.
TARGETS = {
    "negative_hour_share": (0.015, 0.05),
    "weekend_over_weekday": (0.72, 0.9),
    "weekday_peak_over_trough": (1.4, 1.9),     # of the mean weekday hourly profile
    "spike_hour_share": (0.002, 0.02),          # hours above 2.5 x the mean
}


# the tables wrapped at both ends, at the hours' centres (periodic interpolation)
_XP = np.arange(-0.5, 24.5 + 1e-9, 1.0)
_FP_WEEKDAY = np.concatenate([WEEKDAY_SHAPE[-1:], WEEKDAY_SHAPE, WEEKDAY_SHAPE[:1]])
_FP_WEEKEND = np.concatenate([WEEKEND_SHAPE[-1:], WEEKEND_SHAPE, WEEKEND_SHAPE[:1]])
_SLOPES_WEEKDAY = interp_slopes(_XP, _FP_WEEKDAY)
_SLOPES_WEEKEND = interp_slopes(_XP, _FP_WEEKEND)


def _shape(hours: np.ndarray, table: np.ndarray) -> np.ndarray:
    fp = np.concatenate([table[-1:], table, table[:1]])
    return np.interp(np.mod(hours, 24.0), _XP, fp)


def tou_shape(hours: np.ndarray, weekend: np.ndarray, amplitude: float = 1.0) -> np.ndarray:
    """The time-of-use factor (mean 1 over a day) at fractional hours of day; ``weekend``
    is the weekend weight (0 = weekday shape, 1 = weekend shape, blends in between)."""
    w = np.asarray(weekend, dtype=np.float64)
    h = np.mod(hours, 24.0)
    s = (1.0 - w) * np.interp(h, _XP, _FP_WEEKDAY) + w * np.interp(h, _XP, _FP_WEEKEND)
    return 1.0 + amplitude * (s - 1.0)


def _day_events(clock: TickClock, rng: np.random.Generator, per_day: float,
                start_h: tuple[float, float], dur_h: tuple[float, float],
                weekend_weight: float | None) -> list[tuple[float, float, float]]:
    """(start s, end s, log-size draw) of the events of every calendar day the ticks touch,
    in seconds since the clock's start. One draw per day in day order, so the same days
    get the same events whatever the tick length."""
    t0 = float(clock.start.astype("datetime64[s]").astype(np.int64))
    first = int(np.floor(t0 / 86400.0))
    last = int(np.floor((t0 + clock.n_ticks * clock.tick_seconds) / 86400.0))
    events = []
    for day in range(first, last + 1):
        u = rng.random(1)
        if weekend_weight is None:
            count = int(rng.poisson(per_day))
        else:
            weekend = (day + 3) % 7 >= 5
            w = weekend_weight if weekend else (7.0 - 2.0 * weekend_weight) / 5.0
            count = int(u[0] < min(1.0, per_day * w))
        for _ in range(count):
            v = rng.random(2)
            begin = day * 86400.0 - t0 + 3600.0 * (start_h[0] + (start_h[1] - start_h[0]) * v[0])
            length = 3600.0 * (dur_h[0] + (dur_h[1] - dur_h[0]) * v[1])
            events.append((begin, begin + length, float(rng.standard_normal())))
    return events


@numba.njit(cache=True)
def _price_kernel(hours, weekend, driver, y, weekday_level, weekend_factor, amplitude, rho,
                  c, sd, half_sd2, mean, xp, fp_weekday, fp_weekend, slopes_weekday,
                  slopes_weekend, base_out, arg_out):  # pragma: no cover (compiled)
    """``base_out``: ``mean * level * tou_shape``, ``arg_out``: ``sd * x - sd^2 / 2``, per
    tick, in :func:`generate_price`'s numpy operations and order."""
    n = hours.shape[0]
    h = np.empty(n)
    mod24_into(hours, h)
    s_weekday = np.empty(n)
    s_weekend = np.empty(n)
    interp_into(h, xp, fp_weekday, slopes_weekday, s_weekday)
    interp_into(h, xp, fp_weekend, slopes_weekend, s_weekend)
    for i in range(n):
        w = weekend[i]
        level = weekday_level * (1.0 + (weekend_factor - 1.0) * w)
        s = (1.0 - w) * s_weekday[i] + w * s_weekend[i]
        tou = 1.0 + amplitude * (s - 1.0)
        x = rho * driver[i] + c * y[i]
        base_out[i] = (mean * level) * tou
        arg_out[i] = sd * x - half_sd2


def generate_price(clock: TickClock, cfg, driver: np.ndarray,
                   rng: np.random.Generator | np.random.SeedSequence) -> np.ndarray:
    """Price per tick from the config, a standardised weather driver ``z`` (one per tick)
    and an RNG (or its seed sequence: only its spawned children draw); the draws depend
    only on the days covered and the tick count."""
    seq = rng if isinstance(rng, np.random.SeedSequence) else rng.bit_generator.seed_seq
    rng_noise, rng_spike, rng_neg = (np.random.default_rng(s) for s in seq.spawn(3))
    return price_from_streams(clock, cfg, driver, rng_noise, rng_spike, rng_neg)


def price_from_streams(clock: TickClock, cfg, driver: np.ndarray,
                       rng_noise: np.random.Generator, rng_spike: np.random.Generator,
                       rng_neg: np.random.Generator) -> np.ndarray:
    """:func:`generate_price` with its three streams given (the noise, the spikes, the
    negative episodes: the children 0, 1, 2 of its seed sequence)."""
    hours = clock.hour_of_day()
    weekend = clock.weekend_weight()
    f = cfg.price_weekend_factor
    weekday_level = 7.0 / (5.0 + 2.0 * f)
    dt_h = clock.tick_seconds / 3600.0
    y = ar1(rng_noise, clock.n_ticks, float(np.exp(-dt_h / cfg.price_noise_hours)))
    rho = cfg.price_carbon_correlation
    sd = cfg.price_noise_sd
    mean = cfg.price_mean_usd_per_mwh
    # p = mean * level * tou_shape(hours, weekend, amplitude) * exp(sd * x - sd^2 / 2),
    # x = rho * driver + sqrt(1 - rho^2) * y: one compiled pass, then numpy's exp
    p = np.empty(clock.n_ticks)
    arg = np.empty(clock.n_ticks)
    _price_kernel(hours, weekend, np.ascontiguousarray(driver, dtype=np.float64), y,
                  float(weekday_level), float(f), float(cfg.price_daily_amplitude),
                  float(rho), float(np.sqrt(1.0 - rho * rho)), float(sd), 0.5 * sd * sd,
                  float(mean), _XP, _FP_WEEKDAY, _FP_WEEKEND, _SLOPES_WEEKDAY,
                  _SLOPES_WEEKEND, p, arg)
    p *= np.exp(arg)
    mid = clock.seconds_since_start()

    def inside(begin: float, end: float) -> slice:
        # the ticks with begin <= midpoint < end: a slice, the midpoints being increasing
        return slice(int(np.searchsorted(mid, begin, "left")),
                     int(np.searchsorted(mid, end, "left")))

    # spikes: alternate morning/evening windows by a coin flip per spike
    for begin, end, g in _day_events(clock, rng_spike, cfg.price_spikes_per_day,
                                     (7.0, 9.0), (1.0, 3.0), None):
        if g > 0:  # evening peak instead of the morning one: shift by 10 h
            begin, end = begin + 10 * 3600.0, end + 10 * 3600.0
        ticks = inside(begin, end)
        height = mean * cfg.price_spike_factor * np.exp(0.4 * abs(g) - 0.08)
        p[ticks] = np.maximum(p[ticks], height)
    for begin, end, g in _day_events(clock, rng_neg, cfg.price_negative_per_day,
                                     (10.0, 13.0), (2.0, 6.0), 1.75):
        p[inside(begin, end)] = cfg.price_negative_usd_per_mwh * np.exp(0.5 * g - 0.125)
    return p


def carbon_driver(carbon: np.ndarray, tick_seconds: float, mean: float,
                  sd: float) -> np.ndarray:
    """A standardised weather driver from a real carbon series: its centred 24 h moving
    average minus ``mean``, over ``sd``, clipped to +-3 (zeros when ``sd`` is 0)."""
    if sd <= 0 or carbon.size == 0:
        return np.zeros_like(carbon)
    w = max(1, int(round(86400.0 / tick_seconds)))
    w = min(w, carbon.size)
    pad_l, pad_r = w // 2, w - 1 - w // 2
    padded = np.concatenate([np.full(pad_l, carbon[0]), carbon, np.full(pad_r, carbon[-1])])
    c = np.cumsum(np.concatenate([[0.0], padded]))
    ma = (c[w:] - c[:-w]) / w
    return np.clip((ma - mean) / sd, -3.0, 3.0)
