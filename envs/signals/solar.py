"""On-site solar generation (kW): pvlib on measured typical-year weather, or a synthetic bell.

``pvlib`` source (the ``solar`` extra): the TMY3 file shipped inside pvlib's wheel
(default ``723170TYA.CSV``: Greensboro, NC, 36.1 N, measured typical-meteorological-year
weather), read with ``pvlib.iotools.read_tmy3``; solar position at each hour's midpoint
(``pvlib.solarposition``), plane-of-array irradiance by the Hay-Davies transposition
(``pvlib.irradiance.get_total_irradiance``), cell temperature by the SAPM model (open rack,
glass/polymer), DC power by PVWatts (``pvlib.pvsystem.pvwatts_dc``) less the system
losses, AC by the PVWatts inverter model with a DC/AC ratio of 1.2. The result is kW per
kWp for the 8,760 hours of the typical year (hour ``i`` covers ``[i, i+1)`` h local
standard time from 1 January), mapped onto the series' calendar by day of year and hour
(the typical year repeats; 29 February reuses 1 March's weather), averaged over ticks of
an hour or more, interpolated linearly between the hours' midpoints for shorter ticks.

``synthetic`` source: a clear-sky bell between sunrise and sunset (day length and peak
following the season at ~36 N) times a daily clearness index drawn from a Beta(2.5, 1.2)
(mean 0.68), for runs without pvlib. Rough, not calibrated beyond its shape.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np

from envs.signals.resample import step_mean
from envs.signals.timebase import TickClock

DC_AC_RATIO = 1.2
HOURS_PER_YEAR = 8760
SOLAR_EXTRA_HINT = ("solar_source 'pvlib' needs pvlib: pip install 'cloudrl[solar]' "
                    "(or set solar_source: synthetic)")


def _pvlib():
    try:
        import pvlib
    except ImportError:
        raise ImportError(SOLAR_EXTRA_HINT) from None
    return pvlib


@functools.lru_cache(maxsize=8)
def tmy_kw_per_kwp(weather_file: str = "723170TYA.CSV", tilt_deg: float = 25.0,
                   azimuth_deg: float = 180.0, system_loss: float = 0.14,
                   temp_coeff_per_c: float = -0.0037) -> np.ndarray:
    """AC output in kW per kWp for each hour of pvlib's typical-year file (8,760 values)."""
    pvlib = _pvlib()
    path = Path(pvlib.__file__).parent / "data" / weather_file
    if not path.is_file():
        raise FileNotFoundError(f"solar_weather_file: {weather_file!r} is not in pvlib's data "
                                f"folder ({path.parent})")
    with warnings.catch_warnings():  # pvlib's own pandas deprecation notices
        warnings.simplefilter("ignore")
        return _tmy_kw_per_kwp(pvlib, path, weather_file, tilt_deg, azimuth_deg, system_loss,
                               temp_coeff_per_c)


def _tmy_kw_per_kwp(pvlib, path: Path, weather_file: str, tilt_deg: float,
                    azimuth_deg: float, system_loss: float,
                    temp_coeff_per_c: float) -> np.ndarray:
    import pandas as pd

    data, meta = pvlib.iotools.read_tmy3(str(path), coerce_year=2021, map_variables=True)
    if len(data) != HOURS_PER_YEAR:
        raise ValueError(f"solar_weather_file: {weather_file} has {len(data)} hours, "
                         f"expected {HOURS_PER_YEAR}")
    tz = f"Etc/GMT{-int(meta['TZ']):+d}"  # fixed offset, local standard time
    mid = pd.date_range("2021-01-01 00:30", periods=HOURS_PER_YEAR, freq="h", tz=tz)
    pos = pvlib.solarposition.get_solarposition(
        mid, meta["latitude"], meta["longitude"], altitude=meta["altitude"])
    dni_extra = pvlib.irradiance.get_extra_radiation(mid)
    ghi, dni, dhi = (np.asarray(data[c], dtype=np.float64) for c in ("ghi", "dni", "dhi"))
    poa = pvlib.irradiance.get_total_irradiance(
        tilt_deg, azimuth_deg, pos["apparent_zenith"].to_numpy(), pos["azimuth"].to_numpy(),
        dni, ghi, dhi, dni_extra=dni_extra.to_numpy(), model="haydavies")
    poa_global = np.nan_to_num(np.asarray(poa["poa_global"], dtype=np.float64), nan=0.0)
    params = pvlib.temperature.TEMPERATURE_MODEL_PARAMETERS["sapm"]["open_rack_glass_polymer"]
    cell = pvlib.temperature.sapm_cell(poa_global, np.asarray(data["temp_air"], dtype=float),
                                       np.asarray(data["wind_speed"], dtype=float), **params)
    pdc = pvlib.pvsystem.pvwatts_dc(poa_global, cell, 1.0, temp_coeff_per_c)
    pdc = np.asarray(pdc, dtype=np.float64) * (1.0 - system_loss)
    pac = pvlib.inverter.pvwatts(pdc, pdc0=1.0 / DC_AC_RATIO / 0.96)
    out = np.clip(np.nan_to_num(np.asarray(pac, dtype=np.float64), nan=0.0), 0.0, None)
    out.setflags(write=False)
    return out


def _year_start_s(t0: np.datetime64) -> float:
    year = t0.astype("datetime64[Y]")
    return float(year.astype("datetime64[s]").astype(np.int64))


def pvlib_solar(clock: TickClock, cfg) -> np.ndarray:
    """kW per kWp per tick from the typical year, on the clock's calendar."""
    hourly = tmy_kw_per_kwp(cfg.solar_weather_file, cfg.solar_tilt_deg,
                            cfg.solar_azimuth_deg, cfg.solar_system_loss,
                            cfg.solar_temp_coeff_per_c)
    t0 = float(clock.start.astype("datetime64[s]").astype(np.int64))
    end = t0 + clock.n_ticks * clock.tick_seconds
    # lay the typical year onto each calendar year the ticks touch (365 days each; in a leap
    # year 29 Feb reuses 1 Mar, i.e. day-of-year index clipped by the date, not the position)
    first = clock.start.astype("datetime64[Y]")
    years = []
    y = first
    while _year_start_s(y) < end:
        ystart = y.astype("datetime64[D]")
        ndays = int(((y + 1).astype("datetime64[D]") - ystart).astype(np.int64))
        doy = np.arange(ndays)
        if ndays == 366:  # 1 Jan..28 Feb as is, 29 Feb = 1 Mar, then one day behind
            doy = np.where(doy >= 59, doy - 1, doy)
        years.append(hourly.reshape(365, 24)[doy].ravel())
        y = y + 1
    values = np.concatenate(years)
    times = _year_start_s(first) + 3600.0 * np.arange(values.size)
    if clock.tick_seconds >= 3600.0:
        return step_mean(times, values, 3600.0, t0, clock.tick_seconds, clock.n_ticks)
    # shorter ticks: interpolate linearly between the hours' midpoints (no hourly steps)
    return np.interp(t0 + clock.seconds_since_start(), times + 1800.0, values)


def synthetic_solar(clock: TickClock, rng: np.random.Generator) -> np.ndarray:
    """kW per kWp per tick: a seasonal clear-sky bell times a daily clearness draw."""
    secs = clock.seconds_of_epoch()
    day = clock.day_index()
    year0 = clock.start.astype("datetime64[Y]").astype("datetime64[D]").astype(np.int64)
    doy = day - year0
    season = np.sin(2 * np.pi * (np.asarray(doy, dtype=np.float64) - 80.0) / 365.0)
    day_length = 12.0 + 2.4 * season
    peak = 0.72 + 0.1 * season
    hours = np.mod(secs, 86400.0) / 3600.0
    phase = (hours - (12.0 - day_length / 2.0)) / day_length
    bell = np.where((phase > 0) & (phase < 1), np.sin(np.pi * np.clip(phase, 0, 1)) ** 1.5, 0.0)
    days = np.unique(day)
    clear = rng.beta(2.5, 1.2, size=days.size)
    k = clear[np.searchsorted(days, day)]
    return peak * bell * k
