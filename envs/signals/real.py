"""Real-data sources: a signal CSV file, or the German 2020 carbon series shipped here.

The seed picks the start day (a midnight inside the data, such that every tick fits)
unless ``start_date`` is set; the data are resampled to ticks by the exact mean over each
tick. A carbon-only file gets its price from the generator (driven by the real carbon's
daily level, so windy days stay cheap); a file without ``solar_kw`` gets solar from the
solar config.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from envs.signals.csv_import import SignalFileError, SignalTable, read_signal_file
from envs.signals.resample import step_mean
from envs.signals.timebase import TickClock

DATA_DIR = Path(__file__).parent / "data"
DE_CARBON_2020 = DATA_DIR / "de_carbon_2020.csv.gz"


@functools.lru_cache(maxsize=8)
def _load(path: str, resolved: str, mtime_ns: int, size: int) -> SignalTable:
    return read_signal_file(path)


def load_table(path: str | Path) -> SignalTable:
    """The validated table of a signal file, cached while the file is unchanged; its errors
    name the file as ``path`` spells it (as ``cloudrl signals check`` does)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"signal file not found: {p}")
    st = os.stat(p)
    return _load(str(p), str(p.resolve()), st.st_mtime_ns, st.st_size)


def _start(table: SignalTable, need_s: float, start_date: str | None,
           rng: np.random.Generator) -> np.datetime64:
    first, end = table.times[0], table.end
    span_s = float((end - first).astype(np.int64))
    if need_s > span_s + 1e-6:
        raise SignalFileError(
            f"{table.path}: covers {span_s / 3600:g} h ({first} .. {end}), but the episode "
            f"and its forecast horizon need {need_s / 3600:g} h")
    need = np.timedelta64(int(np.ceil(need_s)), "s")
    if start_date is not None:
        start = np.datetime64(start_date, "D").astype("datetime64[s]")
        if start < first or start + need > end:
            raise SignalFileError(
                f"start_date: {start_date} + {need_s / 3600:g} h is outside the data "
                f"({first} .. {end}) of {table.path}")
        return start
    day0 = first.astype("datetime64[D]")
    if day0.astype("datetime64[s]") < first:
        day0 = day0 + np.timedelta64(1, "D")
    last = (end - need).astype("datetime64[D]")
    # latest midnight with start + need <= end
    while last.astype("datetime64[s]") + need > end:
        last = last - np.timedelta64(1, "D")
    if last < day0:  # no midnight fits: start at the data's first row
        return first
    n_days = int((last - day0).astype(np.int64)) + 1
    return (day0 + np.timedelta64(int(rng.integers(0, n_days)), "D")).astype("datetime64[s]")


def check_source(cfg, n_ticks: int, tick_seconds: float) -> None:
    """Up front, before any episode: a ``csv`` source's file reads and validates, and a real
    source covers ``n_ticks`` ticks of ``tick_seconds`` (from ``start_date`` when set).
    SignalFileError, one line naming the file (its line and column where one is at fault),
    else nothing; the table stays cached for the episodes. Synthetic sources pass."""
    if cfg.source == "synthetic":
        return
    path = DE_CARBON_2020 if cfg.source == "de_carbon_2020" else Path(cfg.csv_path)
    try:
        table = load_table(path)
    except FileNotFoundError as e:
        raise SignalFileError(f"signals.csv_path: {e}") from None
    _start(table, n_ticks * tick_seconds, cfg.start_date, np.random.default_rng(0))


def real_signals(cfg, n_ticks: int, tick_seconds: float, rng: np.random.Generator):
    """(clock, price or None, carbon, solar or None, meta) for a real source."""
    path = DE_CARBON_2020 if cfg.source == "de_carbon_2020" else Path(cfg.csv_path)
    table = load_table(path)
    start = _start(table, n_ticks * tick_seconds, cfg.start_date, rng)
    clock = TickClock(start, tick_seconds, n_ticks)
    t0 = float(start.astype(np.int64))
    secs = table.seconds

    def resample(values: np.ndarray) -> np.ndarray:
        return step_mean(secs, values, table.interval_s, t0, tick_seconds, n_ticks)

    carbon = resample(table.carbon)
    price = resample(table.price) if table.price is not None else None
    solar = resample(table.solar) if table.solar is not None else None
    meta = {"path": str(path), "layout": table.layout, "data_first": str(table.times[0]),
            "data_end": str(table.end)}
    return clock, price, carbon, solar, meta
