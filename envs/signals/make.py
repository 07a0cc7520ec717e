"""``make_signals``: one episode's price, carbon and solar series from a :class:`SignalConfig`.

Deterministic per seed (same seed, same series, bit for bit). The seed picks the start day
(in 2020 for the synthetic source, inside the data for real ones, unless ``start_date`` is
set) and every random draw; each component has its own random stream, so switching solar
on does not change the price or carbon of a seed.
"""

from __future__ import annotations

import numpy as np

from envs.signals.carbon import carbon_components, generate_carbon
from envs.signals.config import SignalConfig
from envs.signals.price import carbon_driver, price_from_streams
from envs.signals.seeding import seeded_rng
from envs.signals.series import SignalSeries
from envs.signals.timebase import TickClock

# one stream per component: [seed, stream] seeds numpy's SeedSequence
_START, _CARBON_SLOW, _CARBON_FAST, _PRICE, _SOLAR = 1, 2, 3, 4, 5
SYNTHETIC_YEAR = 2020


_PRICE_CHILD_SLOT = 16  # this thread's generators of the price's three streams: 16, 17, 18


def _seq(seed: int, stream: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, stream])


def _rng(seed: int, stream: int) -> np.random.Generator:
    """``default_rng(_seq(seed, stream))``: this thread's generator for ``stream``, seeded
    the same way at a fraction of the cost (:mod:`envs.signals.seeding`); used up inside
    :func:`make_signals`."""
    return seeded_rng((int(seed) & 0xFFFFFFFFFFFFFFFF, stream), slot=stream)


def _price(clock: TickClock, cfg: SignalConfig, driver: np.ndarray, seed: int) -> np.ndarray:
    """``generate_price(clock, cfg, driver, _seq(seed, _PRICE))``: its three streams are
    the children of that seed sequence (spawn keys 0, 1, 2)."""
    entropy = (int(seed) & 0xFFFFFFFFFFFFFFFF, _PRICE)
    noise, spike, neg = (seeded_rng(entropy, (i,), slot=_PRICE_CHILD_SLOT + i)
                         for i in range(3))
    return price_from_streams(clock, cfg, driver, noise, spike, neg)


_FIRST_DAY = np.datetime64(f"{SYNTHETIC_YEAR}-01-01", "D")
_N_DAYS = int((np.datetime64(f"{SYNTHETIC_YEAR + 1}-01-01", "D") - _FIRST_DAY).astype(np.int64))


def _synthetic_start(cfg: SignalConfig, seed: int) -> np.datetime64:
    if cfg.start_date is not None:
        return np.datetime64(cfg.start_date, "D").astype("datetime64[s]")
    day = int(_rng(seed, _START).integers(0, _N_DAYS))
    return (_FIRST_DAY + np.timedelta64(day, "D")).astype("datetime64[s]")


def _solar(cfg: SignalConfig, clock: TickClock, seed: int) -> np.ndarray:
    if cfg.solar_kwp <= 0:
        return np.zeros(clock.n_ticks)
    if cfg.solar_source == "pvlib":
        from envs.signals.solar import pvlib_solar

        per_kwp = pvlib_solar(clock, cfg)
    else:
        from envs.signals.solar import synthetic_solar

        per_kwp = synthetic_solar(clock, _rng(seed, _SOLAR))
    return cfg.solar_kwp * per_kwp


def _check_args(n_ticks: int, tick_seconds: float) -> None:
    if int(n_ticks) != n_ticks or n_ticks < 1:
        raise ValueError(f"n_ticks: must be a positive integer, got {n_ticks}")
    if not (np.isfinite(tick_seconds) and tick_seconds > 0):
        raise ValueError(f"tick_seconds: must be > 0, got {tick_seconds}")


def make_signals(cfg: SignalConfig, n_ticks: int, tick_seconds: float,
                 seed: int) -> SignalSeries:
    """Price, carbon and solar for ``n_ticks`` ticks of ``tick_seconds`` (pass the episode
    length plus the forecast horizon), deterministic in ``seed``."""
    _check_args(n_ticks, tick_seconds)
    n_ticks = int(n_ticks)
    tick_seconds = float(tick_seconds)
    if cfg.source == "synthetic":
        clock = TickClock(_synthetic_start(cfg, seed), tick_seconds, n_ticks)
        slow, fast = carbon_components(clock, _rng(seed, _CARBON_SLOW),
                                       _rng(seed, _CARBON_FAST), cfg.carbon_slow_hours,
                                       cfg.carbon_fast_hours)
        carbon = generate_carbon(clock, cfg, slow, fast)
        price = _price(clock, cfg, slow, seed)
        meta = {}
    else:
        from envs.signals.real import real_signals

        clock, price, carbon, file_solar, meta = real_signals(cfg, n_ticks, tick_seconds,
                                                              _rng(seed, _START))
        if price is None:
            driver = carbon_driver(carbon, tick_seconds, cfg.carbon_mean_g_per_kwh,
                                   cfg.carbon_slow_sd_g_per_kwh)
            price = _price(clock, cfg, driver, seed)
        if file_solar is not None:
            return SignalSeries(price, carbon, file_solar, tick_seconds, clock.start,
                                source=cfg.source, meta=meta)
    solar = _solar(cfg, clock, seed)
    return SignalSeries(price, carbon, solar, tick_seconds, clock.start, source=cfg.source,
                        meta=meta)
