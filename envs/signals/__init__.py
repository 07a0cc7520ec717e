"""Exogenous signals for the simulator: electricity price, grid carbon, on-site solar.

Per tick, with noisy forecasts. Sources: built-in stochastic generators (carbon fitted to
the German grid of 2020, price shaped like a European day-ahead market), CSV files in a
documented schema, the real German 2020 carbon series shipped with the package, and solar
from pvlib's measured typical-year weather (the ``solar`` extra)::

    from envs.signals import SignalConfig, make_signals, forecast

    cfg = SignalConfig(solar_kwp=50)
    series = make_signals(cfg, n_ticks=576 + 288, tick_seconds=300, seed=0)
    price, carbon, solar = forecast(series, t=10, horizon_ticks=288,
                                    error=cfg.forecast_error, seed=0)
"""

from envs.signals.config import SOURCES, SignalConfig
from envs.signals.csv_import import SignalFileError, SignalTable, read_signal_file
from envs.signals.forecast import Forecaster, forecast, forecaster
from envs.signals.make import make_signals
from envs.signals.series import SignalSeries

__all__ = ["SOURCES", "Forecaster", "SignalConfig", "SignalFileError", "SignalSeries",
           "SignalTable", "forecast", "forecaster", "make_signals", "read_signal_file"]
