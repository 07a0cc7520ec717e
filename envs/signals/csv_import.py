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

A carbon-only file of two columns is accepted too: a time column (its header holds
``time`` or ``date``) and a carbon column in gCO2/kWh (its header holds ``carbon`` or
``co2``), e.g. ``Time,Carbon Intensity`` (the German 2020 dataset's own layout) or
``datetime,CO2 (gCO2/kWh)`` (case-insensitive); the price then comes from the generator.
Every error names the column by the file's own header.

Rows are equally spaced (the file's interval is the median step); a single missing row is
tolerated and forward-filled, a longer gap is an error. Values are resampled to ticks by
the exact mean over each tick (:mod:`envs.signals.resample`).

Rejected, with :class:`SignalFileError` (a ``ValueError``) and one line: a missing or
unknown column, a row with the wrong number of fields, an unparseable timestamp, an empty
or non-numeric or non-finite value, negative carbon or solar, timestamps not increasing or
duplicated, gaps, fewer than two rows, and values in the wrong units: carbon below 5
everywhere (kg/kWh?) or above 2,000 anywhere (g/MWh?), every price below 2 $/MWh in
magnitude ($/kWh?) or any above 20,000 (cents or $/GWh?).

The file is read in chunks of ``CHUNK_ROWS`` rows, each parsed into numpy arrays before the
next: memory stays near the size of the parsed arrays, whatever the file's size.
"""

from __future__ import annotations

import bisect
import csv
import datetime as _dt
import gzip
import io
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TIMESTAMP, PRICE, CARBON, SOLAR = "timestamp", "price_usd_per_mwh", "carbon_g_per_kwh", "solar_kw"
STANDARD_COLUMNS = (TIMESTAMP, PRICE, CARBON, SOLAR)
REQUIRED_COLUMNS = (TIMESTAMP, PRICE, CARBON)
CARBON_ONLY_LAYOUT = ("Time", "Carbon Intensity")  # the German 2020 dataset's header
TIME_WORDS = ("time", "date")       # a carbon-only file's first header holds one of these
CARBON_WORDS = ("carbon", "co2")    # ... and its second one of these (case-insensitive)
CHUNK_ROWS = 65_536                 # rows parsed per chunk: bounds the text held in memory

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
    headers: dict[str, str] = field(default_factory=dict)  # schema name -> the file's header

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


def _is_carbon_only(names: list[str]) -> bool:
    """Two columns: a time column, then a carbon column (in gCO2/kWh); a header of schema
    names is the standard layout (``timestamp,carbon_g_per_kwh`` lacks its price column)."""
    if len(names) != 2 or set(names) <= set(STANDARD_COLUMNS):
        return False
    first, second = (n.lower() for n in names)
    return (any(w in first for w in TIME_WORDS) and any(w in second for w in CARBON_WORDS)
)


def _header(path: Path, first: list[str] | None) -> tuple[str, list[str], dict[str, str]]:
    """The layout, the columns' schema names and each schema name's header in the file."""
    if first is None:
        raise SignalFileError(f"{path}: the file is empty (expected a header row: "
                              f"{','.join(REQUIRED_COLUMNS)}[,{SOLAR}])")
    names = [c.strip().lstrip("\ufeff") for c in first]
    if _is_carbon_only(names):
        return "carbon-only", [TIMESTAMP, CARBON], {TIMESTAMP: names[0], CARBON: names[1]}
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise SignalFileError(f"{path} line 1: column {i + 1} {name!r} is duplicated")
        seen.add(name)
        if name not in STANDARD_COLUMNS:
            raise SignalFileError(
                f"{path} line 1: unknown column {name!r} (expected {', '.join(STANDARD_COLUMNS)}"
                f"; or a carbon-only file of two columns, a time column (its name holding "
                f"'time' or 'date') and a carbon column ('carbon' or 'co2', gCO2/kWh))")
    for name in REQUIRED_COLUMNS:
        if name not in seen:
            raise SignalFileError(f"{path} line 1: missing column {name!r} (header: "
                                  f"{','.join(names)})")
    return "standard", names, {n: n for n in names}


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


class _Columns:
    """The file's rows parsed chunk by chunk into numpy arrays (bounded memory: one chunk of
    text at a time)."""

    def __init__(self, p: Path, names: list[str], shown: dict[str, str],
                 line_of: _LineMap) -> None:
        self.p, self.names, self.shown, self.line_of = p, names, shown, line_of
        self.times: list[np.ndarray] = []
        self.values: dict[str, list[np.ndarray]] = {n: [] for n in names if n != TIMESTAMP}
        self.aware: bool | None = None  # whether the first timestamp had a UTC offset

    def add(self, rows: list[list[str]], first: int) -> None:
        """Parse a chunk of rows whose first is data row ``first``."""
        if not rows:
            return
        lines = _ChunkLines(self.line_of, first)
        columns = list(zip(*rows, strict=True))
        self.times.append(self._times(columns[self.names.index(TIMESTAMP)], lines))
        for k, name in enumerate(self.names):
            if name != TIMESTAMP:
                self.values[name].append(self._values(name, columns[k], lines))

    def arrays(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        def cat(parts: list[np.ndarray], dtype: str) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

        # each column's chunks are let go as it is joined: at most one column held twice
        times = cat(self.times, "datetime64[s]")
        self.times = []
        cols = {}
        for name in list(self.values):
            cols[name] = cat(self.values.pop(name), "float64")
        return times, cols


    def _times(self, raw: tuple[str, ...], lines: _ChunkLines) -> np.ndarray:
        """Timestamps as datetime64[s]: numpy's vectorised parser for plain ISO-8601, row by
        row (offsets, or to find the bad row) otherwise."""
        column = self.shown[TIMESTAMP]
        if min(map(len, raw)) >= 10:  # offsets warn, so they take the row-by-row path
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    out = np.array(raw, dtype="datetime64[s]")
                if not np.isnat(out).any():
                    if self.aware:
                        raise SignalFileError(
                            f"{self.p} line {lines[0]}, column {column!r}: "
                            f"{raw[0].strip()!r} mixes times with and without a UTC offset")
                    self.aware = False
                    return out
            except (ValueError, DeprecationWarning, UserWarning) as e:
                if isinstance(e, SignalFileError):
                    raise
        out = np.empty(len(raw), dtype="datetime64[s]")
        for i, r in enumerate(raw):
            try:
                out[i], aware = _parse_time(r)
            except ValueError:
                raise SignalFileError(
                    f"{self.p} line {lines[i]}, column {column!r}: unparseable timestamp "
                    f"{r.strip()!r} (expected ISO-8601, e.g. 2020-01-01T00:00:00)") from None
            if self.aware is None:
                self.aware = aware
            elif aware != self.aware:
                raise SignalFileError(f"{self.p} line {lines[i]}, column {column!r}: "
                                      f"{r.strip()!r} mixes times with and without a UTC offset")
        return out

    def _values(self, name: str, raw: tuple[str, ...], lines: _ChunkLines) -> np.ndarray:
        """A numeric column: vectorised when clean, row by row to name the first bad value."""
        column = self.shown[name]
        try:
            out = np.array(raw, dtype=np.float64)
        except ValueError:
            out = np.array([_value(self.p, lines[i], column, r) for i, r in enumerate(raw)])
        bad = np.flatnonzero(~np.isfinite(out))
        if bad.size:
            i = int(bad[0])
            raise SignalFileError(f"{self.p} line {lines[i]}, column {column!r}: "
                                  f"{raw[i].strip()!r} is not a finite number (NaN/inf)")
        return out


class _LineMap:
    """File line of each data row without an array of them: data row ``i`` is on line
    ``i + 2`` plus the lines skipped before it (blank lines, rows over several lines), kept
    only where that count changes."""

    def __init__(self) -> None:
        self.rows: list[int] = []  # first data row of each new offset
        self.offsets: list[int] = []
        self.offset = 0

    def note(self, row: int, line: int) -> None:
        """Data row ``row`` is on ``line``, not where the rows before it put it."""
        self.offset = line - row - 2
        self.rows.append(row)
        self.offsets.append(self.offset)

    def __getitem__(self, i: int) -> int:
        k = bisect.bisect_right(self.rows, i) - 1
        return i + 2 + (self.offsets[k] if k >= 0 else 0)


class _ChunkLines:
    """``lines[i]``: the file line of a chunk's row ``i``."""

    def __init__(self, line_of: _LineMap, first: int) -> None:
        self.line_of, self.first = line_of, first

    def __getitem__(self, i: int) -> int:
        return self.line_of[self.first + i]


def read_signal_file(path: str | Path) -> SignalTable:
    """Parse and validate a signal file (see the module docstring for the schema).

    The file is read in chunks of ``CHUNK_ROWS`` rows, each parsed into numpy arrays before
    the next is read: memory stays near the arrays' size (16-32 bytes a row), whatever the
    file's size."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"signal file not found: {p}")
    try:
        with _open_text(p) as fh:
            reader = csv.reader(fh)
            layout, names, shown = _header(p, next(reader, None))
            width = len(names)
            line_of = _LineMap()
            parsed = _Columns(p, names, shown, line_of)
            rows: list[list[str]] = []  # one chunk
            n_rows = 0  # data rows before this one
            for row in reader:
                if len(row) != width:  # width >= 2: a blank line is [] or ['  ']
                    if not row or (len(row) == 1 and not row[0].strip()):
                        continue
                    raise SignalFileError(
                        f"{p} line {reader.line_num}: {len(row)} fields, expected {width} "
                        f"({','.join(shown[n] for n in names)})")
                if reader.line_num != n_rows + 2 + line_of.offset:
                    line_of.note(n_rows, reader.line_num)
                rows.append(row)
                n_rows += 1
                if len(rows) == CHUNK_ROWS:
                    parsed.add(rows, n_rows - CHUNK_ROWS)
                    rows = []
            parsed.add(rows, n_rows - len(rows))
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error) as e:
        raise SignalFileError(f"{p}: not a readable CSV file ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None
    times, cols = parsed.arrays()
    return _validate(p, layout, times, cols, line_of, shown)


def _validate(p: Path, layout: str, times: np.ndarray, cols: dict[str, np.ndarray],
              lines: _LineMap, shown: dict[str, str]) -> SignalTable:
    """The checks across rows; ``lines[i]`` is data row i's file line, ``shown`` each
    column's header as the file spells it."""
    n = len(times)
    if n < 2:
        raise SignalFileError(f"{p}: {n} data row(s); at least 2 are needed to know the "
                              "interval")
    col_t = shown[TIMESTAMP]
    steps = np.diff(times).view(np.int64)  # seconds
    bad = np.flatnonzero(steps <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        if steps[i - 1] == 0:
            raise SignalFileError(f"{p} line {lines[i]}, column {col_t!r}: "
                                  f"{times[i]} duplicates the previous row's timestamp")
        raise SignalFileError(f"{p} line {lines[i]}, column {col_t!r}: {times[i]} is earlier "
                              f"than the previous row's {times[i - 1]} (timestamps must "
                              "increase)")
    interval = float(np.median(steps, overwrite_input=True))  # reorders steps: no copy
    steps = np.diff(times).view(np.int64)
    gaps = np.flatnonzero(steps > 2 * interval + 1e-9)
    if gaps.size:
        i = int(gaps[0]) + 1
        raise SignalFileError(
            f"{p} line {lines[i]}, column {col_t!r}: gap of "
            f"{_fmt_span(float(steps[i - 1]))} after {times[i - 1]} (the file's interval is "
            f"{_fmt_span(interval)}; at most one missing row is filled)")
    carbon = cols[CARBON]
    col_c = shown[CARBON]
    _check_non_negative(p, col_c, carbon, lines, "carbon intensity")
    if carbon.max() < CARBON_MIN_PLAUSIBLE_MAX:
        i = int(np.argmax(carbon))
        raise SignalFileError(
            f"{p} line {lines[i]}, column {col_c!r}: every value is below "
            f"{CARBON_MIN_PLAUSIBLE_MAX:g} (max {carbon[i]:g}): looks like kg/kWh, expected "
            "gCO2/kWh (multiply by 1000)")
    if carbon.max() > CARBON_MAX_PLAUSIBLE:
        i = int(np.argmax(carbon > CARBON_MAX_PLAUSIBLE))
        raise SignalFileError(
            f"{p} line {lines[i]}, column {col_c!r}: {carbon[i]:g} is above "
            f"{CARBON_MAX_PLAUSIBLE:g} gCO2/kWh (no grid is that dirty): looks like g/MWh, "
            "expected gCO2/kWh")
    price = cols.get(PRICE)
    if price is not None:
        col_p = shown[PRICE]
        mag = np.abs(price)
        if mag.max() < PRICE_MIN_PLAUSIBLE_MAX:
            i = int(np.argmax(mag))
            raise SignalFileError(
                f"{p} line {lines[i]}, column {col_p!r}: every value is below "
                f"{PRICE_MIN_PLAUSIBLE_MAX:g} in magnitude (max {price[i]:g}): looks like "
                "$/kWh, expected $/MWh (multiply by 1000)")
        if mag.max() > PRICE_MAX_PLAUSIBLE:
            i = int(np.argmax(mag > PRICE_MAX_PLAUSIBLE))
            raise SignalFileError(
                f"{p} line {lines[i]}, column {col_p!r}: {price[i]:g} is beyond "
                f"+-{PRICE_MAX_PLAUSIBLE:g} $/MWh (market caps are 3,000-5,000): wrong units?")
    solar = cols.get(SOLAR)
    if solar is not None:
        _check_non_negative(p, shown[SOLAR], solar, lines, "solar generation")
    return SignalTable(str(p), times, interval, carbon, price, solar, layout, dict(shown))


def _check_non_negative(p: Path, column: str, values: np.ndarray, lines: _LineMap,
                        what: str) -> None:
    neg = np.flatnonzero(values < 0)
    if neg.size:
        i = int(neg[0])
        raise SignalFileError(f"{p} line {lines[i]}, column {column!r}: negative "
                              f"{what} {values[i]:g} (must be >= 0)")
