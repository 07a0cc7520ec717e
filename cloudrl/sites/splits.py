"""A site's temporal split: per-part slices of its signal file and the test windows.

Each part (``train``, ``validation``, ``test``) is written as its own signal file holding
only the rows of ``[part start - LOOKBACK_DAYS, part end)`` (the look-back is older data
the forecasters read as history, never a later part). Every episode of a part reads that
file and nothing else: tuning draws its start days inside the train slice (seeds pick
them), selection plays the validation slice, and the test plays fixed 2-day windows of
the test slice. So no date of the test period can reach training, tuning or selection;
:func:`check_no_leak` asserts it on the dates each part's file actually holds.

Test windows: arrivals over ``days`` (2) starting at every other UTC midnight of the test
period, kept when the episode, its drain and its forecast horizon fit inside the period;
each with a season (DJF, MAM, JJA, SON) and a seed (``TEST_SEED_OFFSET + i``), the same
for every controller.
"""

from __future__ import annotations

import gzip
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cloudrl.protocol import TEST_SEED_OFFSET
from cloudrl.sites.registry import Period, Site, cache_dir
from envs.signals.real import load_table

LOOKBACK_DAYS = 8
PARTS = ("train", "validation", "test")
SEASONS = {12: "DJF", 1: "DJF", 2: "DJF", 3: "MAM", 4: "MAM", 5: "MAM", 6: "JJA", 7: "JJA",
           8: "JJA", 9: "SON", 10: "SON", 11: "SON"}


def _day(s: str) -> np.datetime64:
    return np.datetime64(s, "D").astype("datetime64[s]")


def period(site: Site, split: str, part: str) -> Period:
    if split not in site.splits:
        raise ValueError(f"split: {split!r} is not a split of site {site.name!r} "
                         f"({', '.join(site.splits)})")
    if part not in PARTS:
        raise ValueError(f"part: {part!r} is not one of {', '.join(PARTS)}")
    return getattr(site.splits[split], part)


def slice_path(site: Site, split: str, part: str) -> Path:
    """The part's signal file (written on first use from the site's file)."""
    per = period(site, split, part)
    src = Path(site.signals_path)
    st = src.stat()
    out = (cache_dir() / site.name / f"{split}-{part}-{per.start}-{per.end}-"
           f"{st.st_size}-{st.st_mtime_ns}.csv.gz")
    if out.is_file():
        return out
    table = load_table(src)
    lo = _day(per.start) - np.timedelta64(LOOKBACK_DAYS, "D")
    keep = (table.times >= lo) & (table.times < _day(per.end))
    if keep.sum() < 2:
        raise ValueError(f"split {split!r} {part} {per}: no data of site {site.name!r} "
                         f"({table.times[0]} .. {table.end})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    write_signal_file(tmp, table.times[keep], table.price[keep], table.carbon[keep])
    tmp.replace(out)
    return out


def write_signal_file(path: Path, times: np.ndarray, price: np.ndarray,
                      carbon: np.ndarray) -> None:
    """A gzip signal file in the importer's schema (naive UTC times, full precision)."""
    text = io.StringIO()
    text.write("timestamp,price_usd_per_mwh,carbon_g_per_kwh\n")
    for t, p, c in zip(times.astype("datetime64[s]"), price, carbon, strict=True):
        text.write(f"{t},{float(p)!r},{float(c)!r}\n")
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write(text.getvalue().encode())


@dataclass(frozen=True)
class Window:
    index: int
    start_date: str
    season: str
    seed: int


def episode_windows(site: Site, split: str, need_seconds: float, days: float = 2.0,
                 part: str = "test") -> list[Window]:
    """Every ``days``-day window of the part whose ``need_seconds`` of signal fit in it."""
    per = period(site, split, part)
    lo, hi = _day(per.start), _day(per.end)
    table = load_table(site.signals_path)
    hi = min(hi, table.end)
    step = np.timedelta64(int(round(days * 86400)), "s")
    need = np.timedelta64(int(np.ceil(need_seconds)), "s")
    out, start = [], max(lo, table.times[0])
    while start + need <= hi:
        d = str(start.astype("datetime64[D]"))
        out.append(Window(len(out), d, SEASONS[int(d[5:7])], TEST_SEED_OFFSET + len(out)))
        start = start + step
    return out


def stratified(windows: list[Window], per_season: int | None) -> list[Window]:
    """``per_season`` windows of each season, evenly spaced in time (all when None)."""
    if per_season is None:
        return list(windows)
    out = []
    for season in ("DJF", "MAM", "JJA", "SON"):
        ws = [w for w in windows if w.season == season]
        if not ws:
            continue
        k = min(per_season, len(ws))
        pick = np.unique(np.linspace(0, len(ws) - 1, k).round().astype(int))
        out += [ws[i] for i in pick]
    return sorted(out, key=lambda w: w.index)


def part_dates(path: Path) -> tuple[np.datetime64, np.datetime64]:
    """(first row, end of the last row) of a part's file."""
    t = load_table(path)
    return t.times[0], t.end


def check_no_leak(site: Site, split: str) -> None:
    """AssertionError unless the train and validation files end at or before the test
    period's start and the validation file's rows after its look-back are all inside it."""
    test = period(site, split, "test")
    for part in ("train", "validation"):
        first, end = part_dates(slice_path(site, split, part))
        if end > _day(test.start):
            raise AssertionError(f"{site.name}/{split}: the {part} file reaches {end}, past "
                                 f"the test start {test.start}")
