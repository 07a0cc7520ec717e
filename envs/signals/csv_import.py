"""Read and validate a signal file; every problem is one line naming the line and column.

Schema (CSV, header row, comma-separated, optionally gzip-compressed ``.gz``):

=====================  ========  =====================================================
column                 required  meaning
=====================  ========  =====================================================
``timestamp``          yes       ISO-8601 (``2020-01-01T00:00:00``, a space instead of
                                 ``T`` is fine); the start of the interval the row covers.
                                 Naive times are local and taken as written; times with
                                 an offset (``+01:00``, ``Z``) are converted to UTC.
``price_usd_per_mwh``  yes       wholesale electricity price, $/MWh (may be negative)
``carbon_g_per_kwh``   yes       grid carbon intensity, gCO2/kWh (>= 0)
``solar_kw``           no        on-site solar generation, kW (>= 0)
=====================  ========  =====================================================

A carbon-only file in the ``Time,Carbon Intensity`` layout (gCO2/kWh; the German 2020
dataset's own layout) is accepted too; the price then comes from the generator.

Rows are equally spaced (the file's interval is the median step); a single missing row is
tolerated and forward-filled, a longer gap is an error. Values are resampled to ticks by
the exact mean over each tick (:mod:`envs.signals.resample`).

Rejected, with :class:`SignalFileError` (a ``ValueError``) and one line: a missing or
unknown column, a row with the wrong number of fields, an unparseable timestamp, an empty
or non-numeric or non-finite value, negative carbon or solar, timestamps not increasing or
duplicated, gaps, fewer than two rows, and values in the wrong units: carbon below 5
everywhere (kg/kWh?) or above 2,000 anywhere (g/MWh?), every price below 2 $/MWh in
magnitude ($/kWh?) or any above 20,000 (cents or $/GWh?).
"""

from __future__ import annotations

import csv
import datetime as _dt
import gzip
import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TIMESTAMP, PRICE, CARBON, SOLAR = "timestamp", "price_usd_per_mwh", "carbon_g_per_kwh", "solar_kw"
STANDARD_COLUMNS = (TIMESTAMP, PRICE, CARBON, SOLAR)
REQUIRED_COLUMNS = (TIMESTAMP, PRICE, CARBON)
CARBON_ONLY_LAYOUT = ("Time", "Carbon Intensity")

CARBON_MIN_PLAUSIBLE_MAX = 5.0       # gCO2/kWh: a whole file below this is kg/kWh
CARBON_MAX_PLAUSIBLE = 2000.0        # gCO2/kWh: lignite is ~1,100; above is g/MWh
PRICE_MIN_PLAUSIBLE_MAX = 2.0        # $/MWh: a whole file below this is $/kWh
PRICE_MAX_PLAUSIBLE = 20000.0        # $/MWh: market caps are 3,000-5,000


class SignalFileError(ValueError):
    """A signal file that cannot be used; the message is one line naming line and column."""


@dataclass(frozen=True)
class SignalTable:
    """A validated signal file: times (datetime64[s]) and its columns (float64)."""

    path: str
    times: np.ndarray
    interval_s: float
    carbon: np.ndarray
    price: np.ndarray | None
    solar: np.ndarray | None
    layout: str                 # "standard" or "carbon-only"

    @property
    def seconds(self) -> np.ndarray:
        return self.times.astype(np.int64).astype(np.float64)

    @property
    def end(self) -> np.datetime64:
        """End of the last row's interval."""
        return self.times[-1] + np.timedelta64(int(self.interval_s), "s")

    @property
    def n_rows(self) -> int:
        return len(self.times)

    def columns(self) -> dict[str, np.ndarray]:
        out = {CARBON: self.carbon}
        if self.price is not None:
            out[PRICE] = self.price
        if self.solar is not None:
            out[SOLAR] = self.solar
        return out


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _parse_time(text: str) -> tuple[np.datetime64, bool]:
    """(naive datetime64[s], had an offset); ValueError when not ISO-8601."""
    s = text.strip()
    if len(s) < 10 or not s[:4].isdigit() or s[4] != "-":
        raise ValueError(s)
    d = _dt.datetime.fromisoformat(s)
    aware = d.tzinfo is not None
    if aware:
        d = d.astimezone(_dt.UTC).replace(tzinfo=None)
    return np.datetime64(d.replace(microsecond=0), "s"), aware


def _fmt_span(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _header(path: Path, first: list[str] | None) -> tuple[str, list[str]]:
    """The layout and the column names, or a SignalFileError."""
    if first is None:
        raise SignalFileError(f"{path}: the file is empty (expected a header row: "
                              f"{','.join(REQUIRED_COLUMNS)}[,{SOLAR}])")
    names = [c.strip().lstrip("\ufeff") for c in first]
    if tuple(n.lower() for n in names) == tuple(c.lower() for c in CARBON_ONLY_LAYOUT):
        return "carbon-only", [TIMESTAMP, CARBON]
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise SignalFileError(f"{path} line 1: column {i + 1} {name!r} is duplicated")
        seen.add(name)
        if name not in STANDARD_COLUMNS:
            raise SignalFileError(
                f"{path} line 1: unknown column {name!r} (expected {', '.join(STANDARD_COLUMNS)}"
                f" or the carbon-only layout {','.join(CARBON_ONLY_LAYOUT)})")
    for name in REQUIRED_COLUMNS:
        if name not in seen:
            raise SignalFileError(f"{path} line 1: missing column {name!r} (header: "
                                  f"{','.join(names)})")
    return "standard", names


def _value(path: Path, line: int, column: str, text: str) -> float:
    s = text.strip()
    if not s:
        raise SignalFileError(f"{path} line {line}, column {column!r}: empty value")
    try:
        v = float(s)
    except ValueError:
        raise SignalFileError(f"{path} line {line}, column {column!r}: {s!r} is not a "
                              "number") from None
    if not math.isfinite(v):
        raise SignalFileError(f"{path} line {line}, column {column!r}: {s!r} is not a finite "
                              "number (NaN/inf)")
    return v


def read_signal_file(path: str | Path) -> SignalTable:
    """Parse and validate a signal file (see the module docstring for the schema)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"signal file not found: {p}")
    try:
        with _open_text(p) as fh:
            reader = csv.reader(fh)
            layout, names = _header(p, next(reader, None))
            width = len(names)
            rows: list[list[str]] = []
            lines: list[int] = []  # file line of each data row (header = line 1)
            for line, row in enumerate(reader, start=2):
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank line
                if len(row) != width:
                    raise SignalFileError(f"{p} line {line}: {len(row)} fields, expected "
                                          f"{width} ({','.join(names)})")
                rows.append(row)
                lines.append(line)
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error) as e:
        raise SignalFileError(f"{p}: not a readable CSV file ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    times = _times(p, columns[names.index(TIMESTAMP)], lines)
    cols = {name: _values(p, name, columns[k], lines)
            for k, name in enumerate(names) if name != TIMESTAMP}
    return _validate(p, layout, times, cols, lines)


def _times(p: Path, raw: tuple[str, ...], lines: list[int]) -> np.ndarray:
    """Timestamps as datetime64[s]: numpy's vectorised parser for plain ISO-8601, row by row
    (offsets, or to find the bad row) otherwise."""
    if not any("+" in r or r.rstrip().endswith("Z") or r.count("-") > 2 for r in raw):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                out = np.array([r.strip() for r in raw], dtype="datetime64[s]")
            if not np.isnat(out).any() and all(len(r.strip()) >= 10 for r in raw):
                return out
        except (ValueError, DeprecationWarning, UserWarning):
            pass
    out = np.empty(len(raw), dtype="datetime64[s]")
    aware_first: bool | None = None
    for i, r in enumerate(raw):
        try:
            out[i], aware = _parse_time(r)
        except ValueError:
            raise SignalFileError(
                f"{p} line {lines[i]}, column {TIMESTAMP!r}: unparseable timestamp "
                f"{r.strip()!r} (expected ISO-8601, e.g. 2020-01-01T00:00:00)") from None
        if aware_first is None:
            aware_first = aware
        elif aware != aware_first:
            raise SignalFileError(f"{p} line {lines[i]}, column {TIMESTAMP!r}: {r.strip()!r} "
                                  "mixes times with and without a UTC offset")
    return out


def _values(p: Path, name: str, raw: tuple[str, ...], lines: list[int]) -> np.ndarray:
    """A numeric column: vectorised when clean, row by row to name the first bad value."""
    try:
        out = np.array(raw, dtype=np.float64)
    except ValueError:
        out = np.array([_value(p, lines[i], name, r) for i, r in enumerate(raw)])
    bad = np.flatnonzero(~np.isfinite(out))
    if bad.size:
        i = int(bad[0])
        raise SignalFileError(f"{p} line {lines[i]}, column {name!r}: {raw[i].strip()!r} is "
                              "not a finite number (NaN/inf)")
    return out


def _line_of(i: int, lines: list[int]) -> int:
    """File line of data row ``i`` (the header is line 1)."""
    return lines[i]


def _validate(p: Path, layout: str, times: np.ndarray, cols: dict[str, np.ndarray],
              lines: list[int]) -> SignalTable:
    n = len(times)
    if n < 2:
        raise SignalFileError(f"{p}: {n} data row(s); at least 2 are needed to know the "
                              "interval")
    steps = np.diff(times).astype(np.int64)
    bad = np.flatnonzero(steps <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        if steps[i - 1] == 0:
            raise SignalFileError(f"{p} line {_line_of(i, lines)}, column {TIMESTAMP!r}: "
                                  f"{times[i]} duplicates the previous row's timestamp")
        raise SignalFileError(f"{p} line {_line_of(i, lines)}, column {TIMESTAMP!r}: {times[i]} "
                              f"is earlier than the previous row's {times[i - 1]} (timestamps "
                              "must increase)")
    interval = float(np.median(steps))
    gaps = np.flatnonzero(steps > 2 * interval + 1e-9)
    if gaps.size:
        i = int(gaps[0]) + 1
        raise SignalFileError(
            f"{p} line {_line_of(i, lines)}, column {TIMESTAMP!r}: gap of "
            f"{_fmt_span(float(steps[i - 1]))} after {times[i - 1]} (the file's interval is "
            f"{_fmt_span(interval)}; at most one missing row is filled)")
    carbon = cols[CARBON]
    _check_non_negative(p, CARBON, carbon, lines, "carbon intensity")
    if carbon.max() < CARBON_MIN_PLAUSIBLE_MAX:
        i = int(np.argmax(carbon))
        raise SignalFileError(
            f"{p} line {_line_of(i, lines)}, column {CARBON!r}: every value is below "
            f"{CARBON_MIN_PLAUSIBLE_MAX:g} (max {carbon[i]:g}): looks like kg/kWh, expected "
            "gCO2/kWh (multiply by 1000)")
    if carbon.max() > CARBON_MAX_PLAUSIBLE:
        i = int(np.argmax(carbon > CARBON_MAX_PLAUSIBLE))
        raise SignalFileError(
            f"{p} line {_line_of(i, lines)}, column {CARBON!r}: {carbon[i]:g} is above "
            f"{CARBON_MAX_PLAUSIBLE:g} gCO2/kWh (no grid is that dirty): looks like g/MWh, "
            "expected gCO2/kWh")
    price = cols.get(PRICE)
    if price is not None:
        mag = np.abs(price)
        if mag.max() < PRICE_MIN_PLAUSIBLE_MAX:
            i = int(np.argmax(mag))
            raise SignalFileError(
                f"{p} line {_line_of(i, lines)}, column {PRICE!r}: every value is below "
                f"{PRICE_MIN_PLAUSIBLE_MAX:g} in magnitude (max {price[i]:g}): looks like "
                "$/kWh, expected $/MWh (multiply by 1000)")
        if mag.max() > PRICE_MAX_PLAUSIBLE:
            i = int(np.argmax(mag > PRICE_MAX_PLAUSIBLE))
            raise SignalFileError(
                f"{p} line {_line_of(i, lines)}, column {PRICE!r}: {price[i]:g} is beyond "
                f"+-{PRICE_MAX_PLAUSIBLE:g} $/MWh (market caps are 3,000-5,000): wrong units?")
    solar = cols.get(SOLAR)
    if solar is not None:
        _check_non_negative(p, SOLAR, solar, lines, "solar generation")
    return SignalTable(str(p), times, interval, carbon, price, solar, layout)


def _check_non_negative(p: Path, column: str, values: np.ndarray, lines: list[int],
                        what: str) -> None:
    neg = np.flatnonzero(values < 0)
    if neg.size:
        i = int(neg[0])
        raise SignalFileError(f"{p} line {_line_of(i, lines)}, column {column!r}: negative "
                              f"{what} {values[i]:g} (must be >= 0)")
