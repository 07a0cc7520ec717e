"""Market-true forecasts of a real site's price and carbon (no Gaussian noise model).

Price: a day-ahead market publishes the next day's hourly prices once its auction has
cleared (EPEX DE-LU about 12:00 Europe/Berlin, CAISO about 13:00 America/Los_Angeles).
At time ``tau`` the prices are known exactly up to the end of the market's next local day
when ``tau`` is past that day's publication time, else up to the end of today
(:func:`known_until`). Beyond that the controller sees a forecast: the seasonal-naive
value, the same hour one week earlier (always already published).

Carbon: no market, so only the present hour is known; the rest is forecast by either
``seasonal_naive`` (the same hour one day earlier, or two when that is still ahead) or
``gbt``: gradient-boosted trees on the last 24 hourly values, the values one day and one
week before the target, the target's calendar (hour, weekday, day of year) and the lead,
fit once on a *training file* only (``train_path``; :func:`fit_carbon_model`). Nothing
the forecast of tick ``t`` returns depends on a price past the publication cut-off or on
any carbon value after tick ``t``'s hour (tests perturb those and compare).

Times: the series' timestamps are read as UTC (the shipped site tables are in UTC). Solar
keeps the noisy forecast of :mod:`envs.signals.forecast`. A forecaster is built once per
(series, config) and kept while the series lives; the learned model once per training
file and configuration in this process.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
import weakref
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
from pydantic import Field, field_validator, model_validator

from envs.sim_config import StrictConfig

HOUR = 3600
DAY_HOURS, WEEK_HOURS = 24, 168
N_LAGS = 24
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class MarketForecastConfig(StrictConfig):
    """What a controller of a real site knows about the future prices and carbon."""

    timezone: str = Field(default="UTC", description="the market's time zone (IANA name, "
                          "e.g. Europe/Berlin); its local days are the delivery days")
    publish_local: str = Field(default="12:00", description="local time (HH:MM) the next "
                               "day's day-ahead prices are published")
    carbon_model: Literal["seasonal_naive", "gbt"] = Field(
        default="seasonal_naive", description="carbon forecaster: the same hour a day "
        "earlier, or gradient-boosted trees fit on train_path")
    train_path: str | None = Field(default=None, description="signal file the learned "
                                   "carbon model is fit on (training dates only)")

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone: {v!r} is not an IANA time zone (e.g. Europe/Berlin)"
                             ) from None
        return v

    @field_validator("publish_local")
    @classmethod
    def _hhmm(cls, v: str) -> str:
        m = re.fullmatch(r"(\d{1,2}):(\d{2})", v.strip())
        if not m or int(m[1]) > 23 or int(m[2]) > 59:
            raise ValueError(f"publish_local: {v!r} is not a time of day HH:MM")
        return v.strip()

    @model_validator(mode="after")
    def _model_needs_data(self) -> MarketForecastConfig:
        if self.carbon_model == "gbt" and not self.train_path:
            raise ValueError("train_path: carbon_model 'gbt' needs a training file")
        return self

    @property
    def publish_time(self) -> _dt.time:
        h, m = self.publish_local.split(":")
        return _dt.time(int(h), int(m))


def known_until(tau_s: float, timezone: str, publish: _dt.time) -> float:
    """UTC seconds up to which day-ahead prices are known at UTC second ``tau_s``: the end
    of the market's next local day once today's prices of tomorrow are published, else the
    end of today."""
    tz = ZoneInfo(timezone)
    local = _dt.datetime.fromtimestamp(tau_s, tz)
    day = local.date()
    published = _dt.datetime.combine(day, publish, tzinfo=tz)
    last_day = day + _dt.timedelta(days=2 if local >= published else 1)
    return _dt.datetime.combine(last_day, _dt.time(0), tzinfo=tz).timestamp()


# ---------------------------------------------------------------- the learned carbon model
def _calendar(hours_s: np.ndarray) -> np.ndarray:
    """(n, 5): sin/cos hour of day, weekday, sin/cos day of year of UTC seconds."""
    h = (hours_s // HOUR) % DAY_HOURS
    dow = ((hours_s // 86400) + 3) % 7
    doy = (hours_s % (365.25 * 86400)) / (365.25 * 86400)
    return np.stack([np.sin(2 * np.pi * h / 24), np.cos(2 * np.pi * h / 24), dow,
                     np.sin(2 * np.pi * doy), np.cos(2 * np.pi * doy)], axis=1)


def carbon_features(values: np.ndarray, first_s: float, issue: np.ndarray,
                    lead: np.ndarray) -> np.ndarray:
    """Features of forecasts made at hourly index ``issue`` (its value known) for index
    ``issue + lead`` of the hourly series ``values`` (first hour at UTC ``first_s``): the 24
    last values, their mean, the target hour a day earlier (two days when a day earlier is
    still ahead) and a week earlier, the target's calendar and the lead. Only indices
    ``<= issue`` are read (clipped at 0)."""
    issue = np.asarray(issue, np.int64)
    lead = np.asarray(lead, np.int64)
    target = issue + lead
    lags = values[np.clip(issue[:, None] - np.arange(N_LAGS)[None, :], 0, None)]
    days_back = -(-lead // DAY_HOURS)
    day_ago = values[np.clip(target - DAY_HOURS * days_back, 0, None)]
    week_ago = values[np.clip(target - WEEK_HOURS * -(-lead // WEEK_HOURS), 0, None)]
    cal = _calendar(first_s + target.astype(np.float64) * HOUR)
    return np.column_stack([lags, lags.mean(axis=1), day_ago, week_ago, cal, lead])


@functools.lru_cache(maxsize=8)
def _fit_cached(path: str, mtime_ns: int, max_lead: int):
    from envs.signals.real import load_table

    table = load_table(path)
    return fit_carbon_model(table.carbon, float(table.seconds[0]), max_lead)


def fit_carbon_model(values: np.ndarray, first_s: float, max_lead: int, stride: int = 3):
    """Gradient-boosted trees (scikit-learn's HistGradientBoostingRegressor, fixed seed)
    predicting the change of the hourly carbon ``lead`` hours ahead (1..``max_lead``) from
    :func:`carbon_features`, fit on every ``stride``-th issue hour of ``values`` alone."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    values = np.asarray(values, np.float64)
    n = len(values)
    issue = np.arange(WEEK_HOURS, n - 1, stride)
    leads = np.arange(1, max_lead + 1)
    ii, ll = np.meshgrid(issue, leads, indexing="ij")
    ii, ll = ii.ravel(), ll.ravel()
    keep = ii + ll < n
    ii, ll = ii[keep], ll[keep]
    model = HistGradientBoostingRegressor(max_iter=150, learning_rate=0.1, max_leaf_nodes=31,
                                          random_state=0)
    # the change from the present hour: robust to a shift of the level between years
    model.fit(carbon_features(values, first_s, ii, ll), values[ii + ll] - values[ii])
    return model


def predict_carbon(model, values: np.ndarray, first_s: float, issue: np.ndarray,
                   lead: np.ndarray) -> np.ndarray:
    """The model's forecasts (>= 0) for ``issue + lead``, reading ``values`` up to
    ``issue`` only."""
    issue = np.asarray(issue, np.int64)
    delta = model.predict(carbon_features(values, first_s, issue, lead))
    return np.maximum(values[np.clip(issue, 0, None)] + delta, 0.0)


def carbon_model(train_path: str, max_lead: int):
    """The model fit on ``train_path`` (kept per file version in this process)."""
    from pathlib import Path

    p = Path(train_path).resolve()
    return _fit_cached(str(p), p.stat().st_mtime_ns, int(max_lead))


# ---------------------------------------------------------------- per-episode forecaster
class MarketForecaster:
    """Forecasts of one episode's series (see the module docstring)."""

    def __init__(self, series, cfg: MarketForecastConfig, horizon_ticks: int) -> None:
        from envs.signals.real import load_table

        path = series.meta.get("path")
        if not path:
            raise ValueError("signals.market: market forecasts need a real signal file "
                             "(source 'csv')")
        table = load_table(path)
        if table.price is None:
            raise ValueError(f"signals.market: {path} has no price column")
        self.cfg = cfg
        self.tick = float(series.tick_seconds)
        self.start_s = float(series.start.astype(np.int64))
        self.n = series.n_ticks
        self.price = series.price_usd_per_mwh
        self.carbon = series.carbon_g_per_kwh
        self.tz, self.publish = cfg.timezone, cfg.publish_time
        self.t_first, self.interval = float(table.seconds[0]), float(table.interval_s)
        self.table_price, self.table_carbon = table.price, table.carbon
        times = self.start_s + np.arange(self.n) * self.tick
        self.price_naive = self._at(self.table_price, times - WEEK_HOURS * HOUR)
        self.ticks_per_day = DAY_HOURS * HOUR / self.tick
        self.horizon_hours = int(np.ceil(horizon_ticks * self.tick / HOUR)) + 1
        self._gbt: np.ndarray | None = None
        self._hour0 = int(np.floor((self.start_s - self.t_first) / self.interval))

    def _at(self, values: np.ndarray, times_s: np.ndarray) -> np.ndarray:
        """The table's value at each UTC time (its row's; before the table: its first row)."""
        i = np.floor((np.asarray(times_s) - self.t_first) / self.interval).astype(np.int64)
        return values[np.clip(i, 0, len(values) - 1)]

    def price_cutoff_tick(self, t: int) -> int:
        """First tick whose price is not yet published at tick ``t``."""
        until = known_until(self.start_s + t * self.tick, self.tz, self.publish)
        return int(np.ceil((until - self.start_s) / self.tick - 1e-9))

    def _gbt_table(self) -> np.ndarray:
        """(issue hour of the episode, lead 0..H) hourly carbon forecasts, made once."""
        if self._gbt is None:
            if abs(self.interval - HOUR) > 1e-6:
                raise ValueError("signals.market: the 'gbt' carbon model needs hourly data")
            model = carbon_model(self.cfg.train_path, self.horizon_hours)
            n_hours = int(np.ceil(self.n * self.tick / HOUR))
            issue = self._hour0 + np.arange(n_hours)
            leads = np.arange(1, self.horizon_hours + 1)
            ii, ll = np.meshgrid(issue, leads, indexing="ij")
            # the table up to each issue hour only: features read indices <= issue
            pred = predict_carbon(model, self.table_carbon, self.t_first, ii.ravel(),
                                  ll.ravel())
            out = np.empty((n_hours, self.horizon_hours + 1))
            out[:, 0] = np.nan  # lead 0 is the present hour: the truth
            out[:, 1:] = pred.reshape(n_hours, -1)
            self._gbt = out
        return self._gbt

    def __call__(self, t: int, horizon_ticks: int) -> tuple[np.ndarray, np.ndarray]:
        idx = np.minimum(np.arange(t + 1, t + 1 + horizon_ticks), self.n - 1)
        price = np.where(idx < self.price_cutoff_tick(t), self.price[idx], self.price_naive[idx])
        if self.cfg.carbon_model == "seasonal_naive":
            back = np.ceil((idx - t) / self.ticks_per_day - 1e-9) * DAY_HOURS * HOUR
            times = self.start_s + idx * self.tick - back
            carbon = np.where(times >= self.start_s,
                              self.carbon[np.clip(((times - self.start_s) / self.tick)
                                                  .round().astype(np.int64), 0, self.n - 1)],
                              self._at(self.table_carbon, times))
        else:
            hour_t = int((t * self.tick) // HOUR)
            lead = np.minimum((idx * self.tick // HOUR).astype(np.int64) - hour_t,
                              self.horizon_hours)
            table = self._gbt_table()
            carbon = np.where(lead == 0, self.carbon[idx], table[hour_t, lead])
        return price.astype(np.float64), carbon.astype(np.float64)


def market_forecaster(series, cfg: MarketForecastConfig, horizon_ticks: int
                      ) -> MarketForecaster:
    """The cached :class:`MarketForecaster` of ``series`` for ``cfg``."""
    per = _cache.get(series)
    if per is None:
        per = _cache[series] = {}
    key = (cfg, int(horizon_ticks))
    f = per.get(key)
    if f is None:
        f = per[key] = MarketForecaster(series, cfg, horizon_ticks)
    return f


def market_forecast(series, t: int, horizon_ticks: int, signals, seed: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(price, carbon, solar) forecasts for ticks ``t+1 .. t+horizon_ticks`` made at tick
    ``t`` under ``signals.market``; solar from the noisy forecaster of
    :mod:`envs.signals.forecast` with ``signals.forecast_error``."""
    from envs.signals.forecast import forecast

    if not 0 <= t < series.n_ticks:
        raise ValueError(f"t: tick {t} is outside the series (0..{series.n_ticks - 1})")
    price, carbon = market_forecaster(series, signals.market, horizon_ticks)(t, horizon_ticks)
    solar = forecast(series, t, horizon_ticks, signals.forecast_error, seed)[2]
    return price, carbon, solar
