"""Real sites: price publication (no hour past the cut-off seen exactly), carbon forecasts
that read only the past, and the temporal split (no test date in training or selection)."""

from __future__ import annotations

import datetime as _dt
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.sites.registry import BUILTIN, Period, SplitSpec
from cloudrl.sites.scenario import site_scenario
from cloudrl.sites.splits import (
    check_no_leak,
    episode_windows,
    part_dates,
    slice_path,
    stratified,
    write_signal_file,
)
from envs.signals.make import make_signals
from envs.signals.market import (
    MarketForecastConfig,
    carbon_features,
    known_until,
    market_forecast,
)
from envs.signals.real import load_table


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CLOUDRL_SITES_DIR", str(tmp_path / "sites"))


UTC_2022 = st.integers(int(_dt.datetime(2022, 1, 1, tzinfo=_dt.UTC).timestamp()),
                       int(_dt.datetime(2022, 12, 31, tzinfo=_dt.UTC).timestamp()))


@settings(max_examples=200, deadline=None)
@given(tau=UTC_2022, zone=st.sampled_from([("Europe/Berlin", 12, 0),
                                           ("America/Los_Angeles", 13, 0),
                                           ("Australia/Sydney", 9, 30)]))
def test_known_until_is_the_end_of_the_published_local_day(tau, zone):
    name, h, m = zone
    tz = ZoneInfo(name)
    until = known_until(float(tau), name, _dt.time(h, m))
    local = _dt.datetime.fromtimestamp(tau, tz)
    end = _dt.datetime.fromtimestamp(until, tz)
    assert end.hour == 0 and end.minute == 0  # a local midnight
    published = (local.hour, local.minute) >= (h, m)
    assert (end.date() - local.date()).days == (2 if published else 1)
    assert until > tau


def test_publication_examples_in_both_markets():
    # 11:59 Berlin winter time (10:59 UTC): today known only; 12:00: tomorrow too
    before = _dt.datetime(2023, 2, 14, 10, 59, tzinfo=_dt.UTC).timestamp()
    after = _dt.datetime(2023, 2, 14, 11, 0, tzinfo=_dt.UTC).timestamp()
    berlin = ZoneInfo("Europe/Berlin")
    assert known_until(before, "Europe/Berlin", _dt.time(12)) == _dt.datetime(
        2023, 2, 15, tzinfo=berlin).timestamp()
    assert known_until(after, "Europe/Berlin", _dt.time(12)) == _dt.datetime(
        2023, 2, 16, tzinfo=berlin).timestamp()
    # CAISO in summer time: 13:00 PDT is 20:00 UTC
    la = ZoneInfo("America/Los_Angeles")
    t = _dt.datetime(2023, 7, 4, 19, 30, tzinfo=_dt.UTC).timestamp()
    assert known_until(t, "America/Los_Angeles", _dt.time(13)) == _dt.datetime(
        2023, 7, 5, tzinfo=la).timestamp()
    assert known_until(t + 1800, "America/Los_Angeles", _dt.time(13)) == _dt.datetime(
        2023, 7, 6, tzinfo=la).timestamp()


def _perturbed_copy(src, dst, after_s: float, d_price: float, d_carbon: float):
    t = load_table(src)
    late = t.seconds >= after_s
    write_signal_file(dst, t.times, t.price + d_price * late, t.carbon + d_carbon * late)


@pytest.mark.parametrize("site_name,start,t", [("de_lu", "2023-05-09", 173),
                                                ("caiso", "2023-10-17", 380)])
def test_no_price_past_the_cutoff_and_no_future_carbon_is_seen(tmp_path, site_name, start, t):
    site = BUILTIN[site_name]
    cfg = site_scenario(site, "temporal", "test", start_date=start,
                        carbon_model="seasonal_naive")
    sig = cfg.signals
    n, tick = cfg.signal_ticks, cfg.tick_seconds
    h = int(round(sig.horizon_hours * 3600 / tick))
    truth = make_signals(sig, n, tick, seed=5)
    tau = float(truth.start.astype(np.int64)) + t * tick
    cutoff = known_until(tau, site.timezone, sig.market.publish_time)
    # the truth changed after the publication cut-off (price) and after tick t (carbon)
    other = tmp_path / "other.csv.gz"
    _perturbed_copy(sig.csv_path, other, cutoff, 250.0, 0.0)
    changed = make_signals(sig.model_copy(update={"csv_path": str(other)}), n, tick, seed=5)
    p0, c0, _ = market_forecast(truth, t, h, sig, 5)
    p1, c1, _ = market_forecast(changed, t, h, sig, 5)
    np.testing.assert_array_equal(p0, p1)
    np.testing.assert_array_equal(c0, c1)
    times = tau + np.arange(1, h + 1) * tick
    seen = times < cutoff
    assert 0 < seen.sum() < h  # the horizon straddles the cut-off in these cases
    np.testing.assert_array_equal(p0[seen], truth.price_usd_per_mwh[t + 1:t + 1 + h][seen])
    # past the cut-off the forecast is not the (changed) truth
    assert np.all(p1[~seen] != changed.price_usd_per_mwh[t + 1:t + 1 + h][~seen])
    carbon_changed = tmp_path / "carbon.csv.gz"
    hour_end = (tau // 3600 + 1) * 3600
    _perturbed_copy(sig.csv_path, carbon_changed, hour_end, 0.0, 400.0)
    changed = make_signals(sig.model_copy(update={"csv_path": str(carbon_changed)}), n, tick,
                           seed=5)
    np.testing.assert_array_equal(c0, market_forecast(changed, t, h, sig, 5)[1])


@settings(max_examples=30, deadline=None)
@given(issue=st.integers(0, 400), lead=st.integers(1, 30), seed=st.integers(0, 10**6))
def test_carbon_model_features_read_only_up_to_the_issue_hour(issue, lead, seed):
    rng = np.random.default_rng(seed)
    values = rng.uniform(50, 600, 500)
    later = values.copy()
    later[issue + 1:] = rng.uniform(50, 600, len(later) - issue - 1)
    f0 = carbon_features(values, 1.6e9, np.array([issue]), np.array([lead]))
    f1 = carbon_features(later, 1.6e9, np.array([issue]), np.array([lead]))
    np.testing.assert_array_equal(f0, f1)


def test_market_config_names_bad_fields():
    with pytest.raises(ValueError, match="timezone: 'Mars/Olympus'"):
        MarketForecastConfig(timezone="Mars/Olympus")
    with pytest.raises(ValueError, match="publish_local: '25:00'"):
        MarketForecastConfig(publish_local="25:00")
    with pytest.raises(ValueError, match="train_path"):
        MarketForecastConfig(carbon_model="gbt")


@pytest.mark.parametrize("site_name", sorted(BUILTIN))
@pytest.mark.parametrize("split", ["temporal", "regime_shift"])
def test_no_test_date_reaches_training_or_selection(site_name, split):
    site = BUILTIN[site_name]
    test = site.splits[split].test
    test_lo = np.datetime64(test.start).astype("datetime64[s]")
    test_hi = np.datetime64(test.end).astype("datetime64[s]")
    check_no_leak(site, split)
    for part in ("train", "validation"):
        cfg = site_scenario(site, split, part, carbon_model="seasonal_naive")
        first, end = part_dates(cfg.signals.csv_path)
        assert end <= test_lo, (part, end)
        # the learned carbon model is fit on the train file only
        assert site_scenario(site, split, part).signals.market.train_path == str(
            slice_path(site, split, "train"))
    cfg = site_scenario(site, split, "test", carbon_model="seasonal_naive")
    windows = episode_windows(site, split, cfg.signal_ticks * cfg.tick_seconds, cfg.days)
    assert len(windows) >= 100
    need = np.timedelta64(int(np.ceil(cfg.signal_ticks * cfg.tick_seconds)), "s")
    for w in windows:
        start = np.datetime64(w.start_date).astype("datetime64[s]")
        assert test_lo <= start and start + need <= test_hi
    assert len({w.seed for w in windows}) == len(windows)
    picked = stratified(windows, 25)
    assert [sum(w.season == s for w in picked) for s in ("DJF", "MAM", "JJA", "SON")] == \
        [25, 25, 25, 25]


def test_a_leaky_split_is_caught():
    site = BUILTIN["caiso"]
    leaky = site.model_copy(update={"splits": {"bad": SplitSpec(
        train=Period(start="2021-01-01", end="2022-03-01"),
        validation=Period(start="2021-10-01", end="2022-01-01"),
        test=Period(start="2022-01-01", end="2023-01-01"))}})
    with pytest.raises(AssertionError, match="train file reaches"):
        check_no_leak(leaky, "bad")


def test_site_scenario_moves_peak_hours_to_utc():
    de = site_scenario(BUILTIN["de_lu"], "temporal", "validation",
                       carbon_model="seasonal_naive")
    ca = site_scenario(BUILTIN["caiso"], "temporal", "validation",
                       carbon_model="seasonal_naive")
    # the catalog's latency-critical peak is 19:00 local: 18:00 UTC in CET, 03:00 in PST
    assert de.classes[0].peak_hour == pytest.approx(18.0)
    assert ca.classes[0].peak_hour == pytest.approx(3.0)


@pytest.mark.parametrize("site_name,split", [("de_lu", "temporal"), ("caiso", "regime_shift")])
def test_sites_train_reads_no_test_date_in_training_or_selection(site_name, split):
    """Every episode ``cloudrl sites train`` plays to train (train seeds, and the held-out
    seeds that keep a DAgger round or an ES iteration) or to select (validation seeds) ends
    before the test period starts: checked on the series each seed actually gets."""
    from cloudrl.protocol import train_seeds, validation_seeds
    from cloudrl.sites.train import phase_scenarios

    site = BUILTIN[site_name]
    per = site.splits[split]
    test_lo = np.datetime64(per.test.start).astype("datetime64[s]")
    scns = phase_scenarios(site, split, carbon_model="seasonal_naive")
    assert set(scns) == {"train", "validation"}
    for part, seeds in (("train", [*train_seeds(50)[::7], *validation_seeds(8)[::3]]),
                        ("validation", list(validation_seeds(12))[::2])):
        cfg = scns[part]
        assert cfg.signals.csv_path == str(slice_path(site, split, part))
        lo = np.datetime64(getattr(per, part).start).astype("datetime64[s]")
        hi = np.datetime64(getattr(per, part).end).astype("datetime64[s]")
        need = np.timedelta64(int(cfg.signal_ticks * cfg.tick_seconds), "s")
        starts = set()
        for seed in seeds:
            s = make_signals(cfg.signals, cfg.signal_ticks, cfg.tick_seconds, seed)
            start = np.datetime64(s.start).astype("datetime64[s]")
            starts.add(start)
            # the episode and its forecast horizon lie in the part's file, before the test
            assert start + need <= min(hi, test_lo), (part, seed, start)
            assert start >= lo - np.timedelta64(8, "D"), (part, seed, start)
        assert len(starts) > 1  # seeds draw their own days
