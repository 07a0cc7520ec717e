"""The generators reproduce the statistics they were calibrated to (documented ranges), and
solar from pvlib's measured typical year has a plausible yield and daily shape."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from envs.signals import SignalConfig, make_signals
from envs.signals.carbon import FIT, GENERATOR_RANGES, REAL_STATS
from envs.signals.price import TARGETS


def _acf(x: np.ndarray, k: int) -> float:
    x = x - x.mean()
    return float((x[:-k] * x[k:]).sum() / (x * x).sum())


@pytest.fixture(scope="module")
def carbon_years() -> list[np.ndarray]:
    cfg = SignalConfig(start_date="2020-01-06")  # a Monday: days 5, 6 of each week are weekend
    return [make_signals(cfg, 364 * 96, 900, seed).carbon_g_per_kwh.reshape(-1, 4).mean(1)
            for seed in range(4)]


def _inside(name: str, value: float, ranges: dict) -> None:
    lo, hi = ranges[name]
    assert lo <= value <= hi, f"{name} = {value:.3f}, documented range [{lo}, {hi}]"


def test_documented_ranges_contain_the_real_data():
    for name, real in (("mean", "mean"), ("sd", "sd"), ("daily_swing_mean", "daily_swing_mean"),
                       ("acf_1h", "acf_1h"), ("acf_24h", "acf_24h")):
        _inside(name, REAL_STATS[real], GENERATOR_RANGES)
    _inside("weekday_minus_weekend", REAL_STATS["weekday_mean"] - REAL_STATS["weekend_mean"],
            GENERATOR_RANGES)


def test_carbon_generator_matches_the_german_2020_statistics(carbon_years):
    h = np.concatenate(carbon_years)
    days = h.reshape(-1, 24)
    weekend = np.arange(len(days)) % 7 >= 5
    _inside("mean", h.mean(), GENERATOR_RANGES)
    _inside("sd", float(np.mean([y.std() for y in carbon_years])), GENERATOR_RANGES)
    _inside("daily_swing_mean", float(np.mean(days.max(1) - days.min(1))), GENERATOR_RANGES)
    _inside("weekday_minus_weekend", days[~weekend].mean() - days[weekend].mean(),
            GENERATOR_RANGES)
    _inside("acf_1h", float(np.mean([_acf(y, 1) for y in carbon_years])), GENERATOR_RANGES)
    _inside("acf_24h", float(np.mean([_acf(y, 24) for y in carbon_years])), GENERATOR_RANGES)
    assert h.min() >= FIT.floor
    profile = days.mean(0)
    assert 10 <= int(np.argmin(profile)) <= 13      # midday solar trough
    assert 16 <= int(np.argmax(profile)) <= 20      # evening peak


def test_carbon_knobs_do_what_they_say():
    flat = SignalConfig(carbon_daily_amplitude=0, carbon_weekend_drop_g_per_kwh=0,
                        carbon_slow_sd_g_per_kwh=0, carbon_fast_sd_g_per_kwh=0)
    s = make_signals(flat, 500, 900, 0)
    np.testing.assert_allclose(s.carbon_g_per_kwh, flat.carbon_mean_g_per_kwh)
    low = SignalConfig(carbon_mean_g_per_kwh=20, carbon_floor_g_per_kwh=5)
    assert make_signals(low, 2000, 900, 0).carbon_g_per_kwh.min() >= 5


@pytest.fixture(scope="module")
def price_years() -> tuple[np.ndarray, np.ndarray, float]:
    cfg = SignalConfig(start_date="2020-01-06")
    ps = [make_signals(cfg, 364 * 24, 3600, seed).price_usd_per_mwh for seed in range(3)]
    return np.concatenate(ps), np.tile(np.arange(364 * 24) // 24 % 7 >= 5, 3), \
        cfg.price_mean_usd_per_mwh


def test_price_generator_matches_its_calibration_targets(price_years):
    p, weekend, mean = price_years
    _inside("negative_hour_share", float((p < 0).mean()), TARGETS)
    _inside("spike_hour_share", float((p > 2.5 * mean).mean()), TARGETS)
    _inside("weekend_over_weekday", p[weekend].mean() / p[~weekend].mean(), TARGETS)
    hod = np.arange(len(p)) % 24
    prof = np.array([p[~weekend & (hod == h)].mean() for h in range(24)])
    _inside("weekday_peak_over_trough", prof.max() / prof.min(), TARGETS)
    assert 0.85 * mean < p.mean() < 1.15 * mean
    assert 6 <= int(np.argmax(prof[:12])) <= 9        # morning peak
    assert 17 <= int(np.argmax(prof[12:])) + 12 <= 20  # evening peak, the day's highest
    assert prof[12:16].mean() < prof[7:10].mean()      # midday dip below the morning peak


def test_price_is_correlated_with_carbon_by_default():
    cfg = SignalConfig(start_date="2020-01-06")
    s = make_signals(cfg, 364 * 24, 3600, 1)
    r = np.corrcoef(s.carbon_g_per_kwh, s.price_usd_per_mwh)[0, 1]
    s0 = make_signals(SignalConfig(start_date="2020-01-06", price_carbon_correlation=0),
                      364 * 24, 3600, 1)
    r0 = np.corrcoef(s0.carbon_g_per_kwh, s0.price_usd_per_mwh)[0, 1]
    assert r > 0.15 and r > r0 + 0.1


def test_price_without_spikes_or_negatives():
    cfg = SignalConfig(price_spikes_per_day=0, price_negative_per_day=0, price_noise_sd=0)
    s = make_signals(cfg, 14 * 24, 3600, 0)
    assert s.price_usd_per_mwh.min() > 0
    assert s.price_usd_per_mwh.max() < 1.5 * cfg.price_mean_usd_per_mwh


def test_pvlib_solar_on_the_measured_typical_year():
    pytest.importorskip("pvlib")
    from envs.signals.solar import tmy_kw_per_kwp

    hourly = tmy_kw_per_kwp()
    assert hourly.shape == (8760,) and hourly.min() >= 0
    # Greensboro NC, 25 deg south: ~1,380 kWh/kWp/yr; PVWatts-like systems there: 1,250-1,550
    assert 1250 < hourly.sum() < 1550
    days = hourly.reshape(365, 24)
    assert days[150:180].sum(1).mean() > 1.4 * days[335:365].sum(1).mean()  # June > December
    assert np.all(days[:, :5] == 0) and np.all(days[:, 21:] == 0)          # dark at night
    assert 11 <= int(np.argmax(days.mean(0))) <= 13
    cfg = SignalConfig(solar_kwp=200, start_date="2020-06-01")
    hourly_ticks = make_signals(cfg, 48, 3600, 0)
    # hourly ticks are the typical year's hours (1 June 2020 = day 151 of the 365-day year)
    np.testing.assert_allclose(hourly_ticks.solar_kw[:24], 200 * days[151])
    s = make_signals(cfg, 2 * 288, 300, 0)
    assert s.solar_kw.max() <= 200 / 1.2 + 1e-9  # the inverter clips at the AC rating
    # 5-min ticks interpolate between hour midpoints: the day's energy is kept within 2 %
    np.testing.assert_allclose(s.solar_kw[:288].sum() / 12, 200 * days[151].sum(), rtol=0.02)
    steepest_hour = np.max(np.abs(np.diff(hourly_ticks.solar_kw)))
    assert np.max(np.abs(np.diff(s.solar_kw))) < 0.5 * steepest_hour


def test_synthetic_solar_is_a_daytime_bell():
    cfg = SignalConfig(solar_kwp=10, solar_source="synthetic", start_date="2020-06-01")
    s = make_signals(cfg, 7 * 24, 3600, 0)
    days = s.solar_kw.reshape(7, 24)
    assert np.all(days[:, :4] == 0) and np.all(days[:, 21:] == 0)
    assert days.max() <= 10 and days[:, 11:14].mean() > 2


def test_missing_pvlib_is_one_clear_line(monkeypatch):
    from envs.signals import solar

    monkeypatch.setitem(sys.modules, "pvlib", None)
    with pytest.raises(ImportError) as err:
        solar._pvlib()
    assert "cloudrl[solar]" in str(err.value) and "\n" not in str(err.value)
