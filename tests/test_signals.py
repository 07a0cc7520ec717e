"""Signals: config validation, determinism of make_signals, and the forecast error model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from envs.signals import SignalConfig, SignalSeries, forecast, make_signals

FIELDS = ("price_usd_per_mwh", "carbon_g_per_kwh", "solar_kw")
SYN_SOLAR = SignalConfig(solar_kwp=40.0, solar_source="synthetic")


def _same(a: SignalSeries, b: SignalSeries) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS) and (
        a.start == b.start)


def test_defaults_run_and_cover_the_ticks():
    s = make_signals(SignalConfig(), n_ticks=577 + 288, tick_seconds=300, seed=0)
    assert s.n_ticks == 865 and s.tick_seconds == 300.0
    for f in FIELDS:
        arr = getattr(s, f)
        assert arr.dtype == np.float64 and arr.shape == (865,)
        assert not arr.flags.writeable
    assert np.all(s.solar_kw == 0.0)  # no solar by default
    assert np.all(s.carbon_g_per_kwh > 0)
    assert 0.0 <= s.hour_of_week0 < 168.0


@pytest.mark.parametrize("bad", [
    {"price_mean_usd_per_mwh": float("nan")}, {"forecast_error": -0.1},
    {"solar_kwp": -1.0}, {"price_carbon_correlation": 1.5}, {"unknown_field": 1},
    {"source": "csv"}, {"csv_path": "x.csv"}, {"start_date": "2020-13-45"},
    {"horizon_hours": 0.0}, {"export_price_usd_per_mwh": -5.0},
])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValidationError) as err:
        SignalConfig(**bad)
    field = next(iter(bad))
    assert field in str(err.value)


def test_horizon_ticks():
    assert SignalConfig(horizon_hours=24).horizon_ticks(300) == 288
    assert SignalConfig(horizon_hours=1).horizon_ticks(7200) == 1
    assert SignalConfig(horizon_hours=2.5).horizon_ticks(3600) == 3


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**40), n=st.integers(1, 400),
       tick=st.sampled_from([60.0, 300.0, 900.0, 3600.0]))
def test_same_seed_same_series_bit_for_bit(seed, n, tick):
    a = make_signals(SYN_SOLAR, n, tick, seed)
    b = make_signals(SYN_SOLAR, n, tick, seed)
    assert _same(a, b)
    assert np.all(a.carbon_g_per_kwh >= SYN_SOLAR.carbon_floor_g_per_kwh)
    assert np.all(a.solar_kw >= 0) and np.all(a.solar_kw <= SYN_SOLAR.solar_kwp)


def test_different_seeds_differ_and_pick_different_days():
    series = [make_signals(SignalConfig(), 96, 900, seed) for seed in range(8)]
    assert len({str(s.start) for s in series}) >= 6
    for a, b in zip(series, series[1:], strict=False):
        assert not np.array_equal(a.carbon_g_per_kwh, b.carbon_g_per_kwh)
        assert not np.array_equal(a.price_usd_per_mwh, b.price_usd_per_mwh)


def test_start_date_fixes_the_calendar():
    s = make_signals(SignalConfig(start_date="2020-03-02"), 48, 1800, 5)  # a Monday
    assert str(s.start) == "2020-03-02T00:00:00"
    assert s.hour_of_week0 == 0.0
    assert s.hour_of_day(3) == pytest.approx(1.5)


def test_solar_switch_leaves_price_and_carbon_alone():
    a = make_signals(SignalConfig(), 200, 900, 11)
    b = make_signals(SYN_SOLAR, 200, 900, 11)
    assert np.array_equal(a.price_usd_per_mwh, b.price_usd_per_mwh)
    assert np.array_equal(a.carbon_g_per_kwh, b.carbon_g_per_kwh)
    assert b.solar_kw.max() > 0


@pytest.mark.parametrize("n,tick", [(0, 300), (10, 0), (10, float("nan"))])
def test_make_signals_rejects_bad_arguments(n, tick):
    with pytest.raises(ValueError):
        make_signals(SignalConfig(), n, tick, 0)


# --- forecasts -------------------------------------------------------------------------

SERIES = make_signals(SYN_SOLAR, 2 * 288 + 288, 300, 3)


@settings(max_examples=30, deadline=None)
@given(t=st.integers(0, SERIES.n_ticks - 1), h=st.integers(1, 400), seed=st.integers(0, 99))
def test_error_zero_is_the_truth(t, h, seed):
    price, carbon, solar = forecast(SERIES, t, h, 0.0, seed)
    idx = np.minimum(np.arange(t + 1, t + 1 + h), SERIES.n_ticks - 1)
    assert np.array_equal(price, SERIES.price_usd_per_mwh[idx])
    assert np.array_equal(carbon, SERIES.carbon_g_per_kwh[idx])
    assert np.array_equal(solar, SERIES.solar_kw[idx])


@settings(max_examples=30, deadline=None)
@given(t=st.integers(0, 575), h=st.integers(1, 288), seed=st.integers(0, 2**32),
       error=st.floats(0.0, 1.0))
def test_forecast_is_deterministic_and_non_negative(t, h, seed, error):
    a = forecast(SERIES, t, h, error, seed)
    b = forecast(SERIES, t, h, error, seed)
    for x, y in zip(a, b, strict=True):
        assert x.shape == (h,) and np.array_equal(x, y)
    assert np.all(a[1] >= 0) and np.all(a[2] >= 0)
    # the sign of a price is never flipped by noise
    truth = SERIES.price_usd_per_mwh[t + 1:t + 1 + h]
    assert np.all(a[0] * truth >= 0)


def test_forecast_returns_fresh_arrays():
    p, _, _ = forecast(SERIES, 5, 10, 0.0, 0)
    p[:] = -1.0
    assert forecast(SERIES, 5, 10, 0.0, 0)[0][0] == SERIES.price_usd_per_mwh[6]


def test_forecast_error_grows_like_sqrt_lead():
    """Relative error sd at lead k is error * sqrt(k * tick / 24 h), over seeds and times."""
    series = make_signals(SignalConfig(), 600, 900, 0)  # 15-min ticks
    error = 0.2
    leads = np.array([4, 16, 48, 96])   # 1 h, 4 h, 12 h, 24 h
    rel = {k: [] for k in leads}
    for seed in range(60):
        for t in (0, 100, 200, 300, 400):
            _, carbon, _ = forecast(series, t, 96, error, seed)
            truth = series.carbon_g_per_kwh[t + 1:t + 97]
            for k in leads:
                rel[k].append(carbon[k - 1] / truth[k - 1] - 1.0)
    sds = np.array([np.std(rel[k]) for k in leads])
    expected = error * np.sqrt(leads * 900 / 86400)
    assert np.all(np.diff(sds) > 0)
    np.testing.assert_allclose(sds, expected, rtol=0.25)


def test_forecast_rejects_bad_arguments():
    with pytest.raises(ValueError, match="t:"):
        forecast(SERIES, SERIES.n_ticks, 5, 0.1, 0)
    with pytest.raises(ValueError, match="horizon_ticks"):
        forecast(SERIES, 0, 0, 0.1, 0)
    with pytest.raises(ValueError, match="error"):
        forecast(SERIES, 0, 5, -0.1, 0)


@settings(max_examples=25, deadline=None)
@given(mean=st.floats(0, 1500), amp=st.floats(0, 5), slow=st.floats(0, 1000),
       fast=st.floats(0, 1000), floor=st.floats(0, 1500), pamp=st.floats(0, 3),
       psd=st.floats(0, 1.5), seed=st.integers(0, 2**31), kwp=st.floats(0, 1e4))
def test_any_valid_config_gives_finite_physical_signals(mean, amp, slow, fast, floor, pamp,
                                                        psd, seed, kwp):
    cfg = SignalConfig(carbon_mean_g_per_kwh=mean, carbon_daily_amplitude=amp,
                       carbon_slow_sd_g_per_kwh=slow, carbon_fast_sd_g_per_kwh=fast,
                       carbon_floor_g_per_kwh=floor, price_daily_amplitude=pamp,
                       price_noise_sd=psd, solar_kwp=kwp, solar_source="synthetic")
    s = make_signals(cfg, 300, 900, seed)
    assert np.all(s.carbon_g_per_kwh >= floor)
    assert np.all(s.solar_kw >= 0) and np.all(s.solar_kw <= kwp + 1e-9)
    assert np.all(np.isfinite(s.price_usd_per_mwh))
    # without negative episodes no price is negative, whatever the shape and noise
    calm = make_signals(cfg.model_copy(update={"price_negative_per_day": 0.0}), 300, 900, seed)
    assert np.all(calm.price_usd_per_mwh >= 0)


def test_export_price_switch():
    assert not SignalConfig().exports
    assert not SignalConfig(export_price_usd_per_mwh=0).exports
    assert SignalConfig(export_price_usd_per_mwh=25).exports
