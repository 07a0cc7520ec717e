"""Bring your own site: validate a price CSV and a carbon CSV and store them as a site.

Both files go through the signal importer (:mod:`envs.signals.csv_import`), so every defect
it knows is one line naming the file, line and column: missing or unknown columns,
unparseable times, empty, non-numeric or non-finite values, negative carbon, wrong units,
duplicated or decreasing times, gaps. On top, a site needs hourly rows with *no* missing
hour (the importer forward-fills one; a site refuses it) and says when a gap or a repeated
hour sits where a daylight-saving clock change falls: local clock times, where UTC (or
offsets) are needed. Negative prices are kept. Each file's first defect is one line; all
lines are printed and nothing is stored.

The stored site (``$CLOUDRL_SITES_DIR/<name>/``, default ``./sites``) holds the hours both
files cover, prices times ``--currency-rate``, and one split: the first 60% of the days
train, the next 15% validate, the last 25% test.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import math
import shutil
import tempfile
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np

from cloudrl.sites.registry import (
    BUILTIN,
    NAME_RE,
    SIGNALS_FILE,
    Period,
    Site,
    SplitSpec,
    save_site,
    sites_dir,
)
from envs.signals.csv_import import CARBON, PRICE, SignalFileError, SignalTable, read_signal_file
from envs.signals.market import MarketForecastConfig

HOUR = 3600
MIN_DAYS = 60
SPLIT_SHARES = (0.60, 0.15, 0.25)


class SiteInputError(ValueError):
    """Bad input to ``sites add``: one line per defect."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def _read_text(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
            return fh.read()
    return path.read_text(encoding="utf-8")


def _dst_hint(t: np.datetime64, timezone: str) -> str:
    """`` (a daylight-saving clock change ...)`` when ``t`` (as written) is an hour a DST
    change skips or repeats in ``timezone``, or in the small hours of a Sunday in March,
    April, October or November (where Europe and North America change clocks); else ''."""
    d = t.astype("datetime64[s]").astype(_dt.datetime)
    tz = ZoneInfo(timezone)
    a, b = d.replace(tzinfo=tz, fold=0), d.replace(tzinfo=tz, fold=1)
    on_change = a.utcoffset() != b.utcoffset()
    sunday_small_hours = d.weekday() == 6 and d.month in (3, 4, 10, 11) and d.hour <= 4
    if on_change or sunday_small_hours:
        return (" (a daylight-saving clock change: the times look like local clock times; "
                "give them in UTC or with an offset such as +01:00)")
    return ""


def _table(path: Path, kind: str, timezone: str) -> SignalTable:
    """The importer's table of one file. A price-only file (or a ``timestamp,
    carbon_g_per_kwh`` file) gets a constant placeholder for the other column so the
    importer checks it; errors keep the file's own name, lines and columns."""
    if not path.is_file():
        raise SignalFileError(f"--{kind}: file not found: {path}")
    text = _read_text(path)
    lines = text.splitlines()
    header = [c.strip().lstrip("\ufeff") for c in lines[0].split(",")] if lines else []
    if kind == "carbon" and (PRICE in header or CARBON not in header):
        return read_signal_file(path)  # both columns, or the importer's carbon-only layout
    placeholder = (PRICE, "50") if kind == "carbon" else (CARBON, "100")
    if lines and placeholder[0] not in header:
        lines = [lines[0] + f",{placeholder[0]}"] + [
            ln + f",{placeholder[1]}" if ln.strip() else ln for ln in lines[1:]]
    with tempfile.TemporaryDirectory(prefix="cloudrl_site_") as tmp:
        probe = Path(tmp) / f"{kind}.csv"
        probe.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            return read_signal_file(probe)
        except SignalFileError as e:
            raise SignalFileError(str(e).replace(str(probe), str(path))) from None


def _check_hourly(table: SignalTable, path: Path, timezone: str) -> None:
    """Hourly rows, none missing (the importer fills one missing row; a site does not)."""
    if abs(table.interval_s - HOUR) > 1e-6:
        raise SignalFileError(f"{path}: rows are {table.interval_s / 60:g} min apart; a site "
                              "needs hourly rows")
    steps = np.diff(table.times).astype(np.int64)
    bad = np.flatnonzero(steps != HOUR)
    if bad.size:
        i = int(bad[0])
        missing = table.times[i] + np.timedelta64(HOUR, "s")
        hint = _dst_hint(missing, timezone)
        raise SignalFileError(f"{path}: the hour {missing} is missing (after "
                              f"{table.times[i]}){hint}")


def validate_file(path: str | Path, kind: str, timezone: str = "UTC") -> SignalTable:
    """A site's price (``kind='prices'``) or carbon file, or SignalFileError (one line)."""
    p = Path(path)
    try:
        table = _table(p, kind, timezone)
    except SignalFileError as e:
        msg = str(e)
        if "duplicates the previous row's timestamp" in msg:
            stamp = msg.split(": ")[1].split(" duplicates")[0] if ": " in msg else ""
            with contextlib.suppress(ValueError):
                msg += _dst_hint(np.datetime64(stamp.strip(), "s"), timezone)
        raise SignalFileError(msg) from None
    if kind == "prices" and table.price is None:
        raise SignalFileError(f"{p}: no price column (expected timestamp,price_usd_per_mwh)")
    _check_hourly(table, p, timezone)
    return table


def _split(first: np.datetime64, end: np.datetime64) -> dict[str, SplitSpec]:
    d0 = first.astype("datetime64[D]")
    if d0.astype("datetime64[s]") < first:
        d0 = d0 + np.timedelta64(1, "D")
    d1 = end.astype("datetime64[D]")
    days = int((d1 - d0).astype(np.int64))
    a = d0 + np.timedelta64(int(days * SPLIT_SHARES[0]), "D")
    b = a + np.timedelta64(int(days * SPLIT_SHARES[1]), "D")
    return {"temporal": SplitSpec(train=Period(start=str(d0), end=str(a)),
                                  validation=Period(start=str(a), end=str(b)),
                                  test=Period(start=str(b), end=str(d1)))}


def add_site(name: str, prices: str | Path, carbon: str | Path, timezone: str = "UTC",
             publish: str = "12:00", currency_rate: float = 1.0, force: bool = False) -> Site:
    """Validate, join and store a site; SiteInputError with one line per defect."""
    errors: list[str] = []
    if not NAME_RE.match(name):
        errors.append(f"NAME: {name!r} must be lower-case letters, digits and _ (starting "
                      "with a letter, at most 32)")
    elif name in BUILTIN:
        errors.append(f"NAME: {name!r} is a shipped site; choose another name")
    elif (sites_dir() / name).exists() and not force:
        errors.append(f"NAME: site {name!r} exists in {sites_dir()} (--force replaces it)")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        errors.append(f"--timezone: {timezone!r} is not an IANA time zone (e.g. "
                      "Europe/Berlin)")
        timezone = "UTC"
    try:
        MarketForecastConfig(publish_local=publish)
    except ValueError:
        errors.append(f"--publish: {publish!r} is not a time of day HH:MM")
    if not (math.isfinite(currency_rate) and 0 < currency_rate <= 1000):
        errors.append(f"--currency-rate: {currency_rate} must be a number in (0, 1000]")
    tables = {}
    for kind, path in (("prices", prices), ("carbon", carbon)):
        try:
            tables[kind] = validate_file(path, kind, timezone)
        except (SignalFileError, OSError) as e:
            errors.append(str(e).splitlines()[0])
    if not errors:
        pt, ct = tables["prices"], tables["carbon"]
        first, end = max(pt.times[0], ct.times[0]), min(pt.end, ct.end)
        span = float((end - first).astype(np.int64)) / 86400
        if span < MIN_DAYS:
            errors.append(f"--carbon: the two files share {max(span, 0):g} days "
                          f"({first} .. {end}); a site needs at least {MIN_DAYS}")
    if errors:
        raise SiteInputError(errors)
    hours = np.arange(first, end, np.timedelta64(HOUR, "s"))
    price = pt.price[((hours - pt.times[0]).astype(np.int64) // HOUR)] * currency_rate
    carb = ct.carbon[((hours - ct.times[0]).astype(np.int64) // HOUR)]
    from cloudrl.sites.splits import write_signal_file

    site = Site(name=name, description=f"added from {Path(prices).name} and "
                f"{Path(carbon).name}", signals_path=SIGNALS_FILE, timezone=timezone,
                publish_local=publish, currency_rate=currency_rate,
                splits=_split(first, end))
    folder = sites_dir() / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    write_signal_file(folder / SIGNALS_FILE, hours, price, carb)
    save_site(site)
    return site.model_copy(update={"signals_path": str(folder / SIGNALS_FILE)})
