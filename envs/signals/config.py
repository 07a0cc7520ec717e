"""Typed configuration of the exogenous signals: electricity price, grid carbon, on-site solar.

Every field has a default that runs (a synthetic German-like grid, no solar, a 24 h
forecast with 10 % error at 24 h lead) and a documented physical range; unknown fields and
non-finite floats are errors that name the field. The carbon defaults are the parameters
fitted to the German 2020 grid (see :mod:`envs.signals.carbon`), the price defaults an
approximate calibration to European day-ahead market statistics (see
:mod:`envs.signals.price`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from envs.signals.carbon import FIT as CARBON_FIT
from envs.signals.market import MarketForecastConfig
from envs.sim_config import StrictConfig

SOURCES = ("synthetic", "csv", "de_carbon_2020")


class SignalConfig(StrictConfig):
    """Where the price, carbon and solar series come from, and how noisy their forecasts are.

    Sources: ``synthetic`` (built-in stochastic generators for price and carbon), ``csv`` (a
    file in the documented schema, or a carbon-only file in the ``Time,Carbon Intensity``
    layout, price then from the generator), ``de_carbon_2020`` (the real German 2020 grid
    carbon intensity shipped with the package, price from the generator). Solar is added on
    top of any source when ``solar_kwp > 0``.
    """

    source: Literal["synthetic", "csv", "de_carbon_2020"] = Field(
        default="synthetic", description="where price and carbon come from")
    csv_path: str | None = Field(
        default=None, description="the signal file when source is 'csv'")
    start_date: str | None = Field(
        default=None, description="ISO date (YYYY-MM-DD) the series starts at midnight; None: "
        "the seed picks the start day (inside the data for real sources, in 2020 otherwise)")

    # --- price ($/MWh) -------------------------------------------------------------------
    price_mean_usd_per_mwh: float = Field(
        default=60.0, ge=0.0, le=1000.0,
        description="mean wholesale price before spikes and negative episodes (0..1000 $/MWh)")
    price_daily_amplitude: float = Field(
        default=1.0, ge=0.0, le=3.0,
        description="scale of the time-of-use shape (0 = flat, 1 = calibrated shape; 0..3)")
    price_weekend_factor: float = Field(
        default=0.82, gt=0.0, le=2.0,
        description="weekend level relative to weekdays (0..2; calibrated 0.82)")
    price_noise_sd: float = Field(
        default=0.3, ge=0.0, le=1.5,
        description="sd of the log-price noise (0..1.5; calibrated 0.3)")
    price_noise_hours: float = Field(
        default=18.0, gt=0.0, le=720.0,
        description="correlation time of the price noise in hours (0..720)")
    price_carbon_correlation: float = Field(
        default=0.6, ge=-1.0, le=1.0,
        description="correlation of the price noise with the slow carbon component (windy "
        "days are cheap and clean; -1..1)")
    price_spikes_per_day: float = Field(
        default=0.1, ge=0.0, le=5.0,
        description="expected price spikes per day, in the morning or evening peak (0..5)")
    price_spike_factor: float = Field(
        default=4.0, ge=1.0, le=50.0,
        description="typical spike height as a multiple of the mean price (1..50)")
    price_negative_per_day: float = Field(
        default=0.2, ge=0.0, le=5.0,
        description="expected negative-price episodes per day, around midday (0..5)")
    price_negative_usd_per_mwh: float = Field(
        default=-20.0, ge=-500.0, le=0.0,
        description="typical depth of a negative-price episode (-500..0 $/MWh)")

    # --- carbon (gCO2/kWh) -----------------------------------------------------------------
    carbon_mean_g_per_kwh: float = Field(
        default=CARBON_FIT.mean, ge=0.0, le=1500.0,
        description="mean grid carbon intensity (0..1500 gCO2/kWh; DE 2020: 313)")
    carbon_daily_amplitude: float = Field(
        default=1.0, ge=0.0, le=5.0,
        description="scale of the fitted daily profile (0 = flat, 1 = DE 2020; 0..5)")
    carbon_weekend_drop_g_per_kwh: float = Field(
        default=CARBON_FIT.weekend_drop, ge=-500.0, le=500.0,
        description="weekday minus weekend mean (DE 2020: 65.5 gCO2/kWh)")
    carbon_slow_sd_g_per_kwh: float = Field(
        default=CARBON_FIT.slow_sd, ge=0.0, le=1000.0,
        description="sd of the slow (weather, multi-day) component (DE 2020 fit)")
    carbon_slow_hours: float = Field(
        default=CARBON_FIT.slow_hours, gt=0.0, le=8760.0,
        description="correlation time of the slow component in hours (DE 2020 fit)")
    carbon_fast_sd_g_per_kwh: float = Field(
        default=CARBON_FIT.fast_sd, ge=0.0, le=1000.0,
        description="sd of the fast (within-day) component (DE 2020 fit)")
    carbon_fast_hours: float = Field(
        default=CARBON_FIT.fast_hours, gt=0.0, le=720.0,
        description="correlation time of the fast component in hours (DE 2020 fit)")
    carbon_floor_g_per_kwh: float = Field(
        default=CARBON_FIT.floor, ge=0.0, le=1500.0,
        description="lowest value the generator returns (DE 2020 minimum: 101)")

    # --- on-site solar (kW) ------------------------------------------------------------------
    solar_kwp: float = Field(
        default=0.0, ge=0.0, le=1.0e6,
        description="installed PV peak power in kWp (0 = no solar)")
    solar_source: Literal["pvlib", "synthetic"] = Field(
        default="pvlib", description="'pvlib': measured typical-year weather through pvlib "
        "(extra 'solar'); 'synthetic': a clear-sky bell times a random daily clearness")
    solar_weather_file: str = Field(
        default="723170TYA.CSV", pattern=r"^[A-Za-z0-9_.-]+$",
        description="TMY3 file inside pvlib's data folder (723170TYA.CSV: Greensboro, NC)")
    solar_tilt_deg: float = Field(
        default=25.0, ge=0.0, le=90.0, description="panel tilt from horizontal (0..90 deg)")
    solar_azimuth_deg: float = Field(
        default=180.0, ge=0.0, lt=360.0,
        description="panel azimuth, degrees clockwise from north (180 = south)")
    solar_system_loss: float = Field(
        default=0.14, ge=0.0, lt=1.0,
        description="DC system losses: soiling, wiring, mismatch (PVWatts default 0.14)")
    solar_temp_coeff_per_c: float = Field(
        default=-0.0037, ge=-0.02, le=0.0,
        description="DC power temperature coefficient per degree C (crystalline Si: "
        "about -0.0035..-0.0047)")
    export_price_usd_per_mwh: float | None = Field(
        default=None, ge=0.0, le=1000.0,
        description="surplus solar: curtailed when None or 0, else exported at this price")

    # --- forecasts ---------------------------------------------------------------------------
    horizon_hours: float = Field(
        default=24.0, gt=0.0, le=168.0, description="forecast horizon in hours (0..168)")
    forecast_error: float = Field(
        default=0.1, ge=0.0, le=1.0,
        description="relative sd of the forecast error at 24 h lead; grows as "
        "sqrt(lead / 24 h); 0 = perfect forecast (0..1)")
    market: MarketForecastConfig | None = Field(
        default=None, description="market-true price and carbon forecasts of a real site "
        "(envs.signals.market) instead of the noisy ones; solar keeps forecast_error")

    @model_validator(mode="after")
    def _source_needs(self) -> SignalConfig:
        if self.source == "csv" and not self.csv_path:
            raise ValueError("csv_path: source 'csv' needs csv_path (a signal file)")
        if self.source != "csv" and self.csv_path:
            raise ValueError(f"csv_path: only used with source 'csv', not {self.source!r}")
        if self.start_date is not None:
            import numpy as np

            try:
                np.datetime64(self.start_date, "D")
            except ValueError:
                raise ValueError(f"start_date: {self.start_date!r} is not an ISO date "
                                 "(YYYY-MM-DD)") from None
        return self

    @property
    def exports(self) -> bool:
        """Whether surplus solar is sold (else it is curtailed)."""
        return bool(self.export_price_usd_per_mwh)

    def horizon_ticks(self, tick_seconds: float) -> int:
        """The forecast horizon in ticks (at least 1)."""
        return max(1, math.ceil(self.horizon_hours * 3600.0 / tick_seconds - 1e-9))
