"""Build the shipped site tables from the shared Electricity Maps / SustainCluster files.

Run from the repository root::

    python -m cloudrl.sites.build_data --data ../shared/data

For each shipped site it reads ``prices/<REGION>/<YEAR>.csv`` (``Datetime (UTC)``,
``Price (USD/MWh)``) and ``carbon/<REGION>/<YEAR>.csv`` (``Datetime (UTC)``, ``Carbon
Intensity gCO₂eq/kWh (direct)``) for 2021-2023, joins them on the UTC hour and writes
``envs/signals/data/sites/<site>.csv.gz`` in the signal importer's schema
(``timestamp,price_usd_per_mwh,carbon_g_per_kwh``; naive timestamps in UTC; prices to
0.01 $/MWh, carbon to 0.01 gCO2/kWh; negative prices kept). Every hour must be present
once in both files; anything else is an error naming the file and the hour. The written
file is read back through :func:`envs.signals.csv_import.read_signal_file`.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import sys
from pathlib import Path

import numpy as np

from envs.signals.csv_import import read_signal_file

OUT_DIR = Path(__file__).resolve().parents[2] / "envs" / "signals" / "data" / "sites"
REGIONS = {"de_lu": "DE-LU", "caiso": "US-CAL-CISO"}
YEARS = (2021, 2022, 2023)
PRICE_COLUMN = "Price (USD/MWh)"
CARBON_COLUMN = "Carbon Intensity gCO₂eq/kWh (direct)"
TIME_COLUMN = "Datetime (UTC)"


def _read(path: Path, column: str) -> dict[np.datetime64, float]:
    out: dict[np.datetime64, float] = {}
    with open(path, encoding="utf-8", newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            stamp = row[TIME_COLUMN].strip().replace("+00:00", "")
            t = np.datetime64(stamp, "s")
            if t in out:
                raise ValueError(f"{path} line {line}: hour {t} appears twice")
            out[t] = float(row[column])
    return out


def build_site(data: Path, site: str, out_dir: Path = OUT_DIR) -> Path:
    """Write one site's table; returns its path."""
    region = REGIONS[site]
    rows: list[tuple[str, float, float]] = []
    for year in YEARS:
        price = _read(data / "prices" / region / f"{year}.csv", PRICE_COLUMN)
        carbon = _read(data / "carbon" / region / f"{year}.csv", CARBON_COLUMN)
        hours = np.arange(np.datetime64(f"{year}-01-01T00", "h"),
                          np.datetime64(f"{year + 1}-01-01T00", "h")).astype("datetime64[s]")
        for t in hours:
            for name, table in (("prices", price), ("carbon", carbon)):
                if t not in table:
                    raise ValueError(f"{data / name / region}/{year}.csv: hour {t} missing")
            rows.append((str(t), price[t], carbon[t]))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{site}.csv.gz"
    text = io.StringIO()
    w = csv.writer(text, lineterminator="\n")
    w.writerow(["timestamp", "price_usd_per_mwh", "carbon_g_per_kwh"])
    for t, p, c in rows:
        w.writerow([t, f"{p:.2f}", f"{c:.2f}"])
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                filename="") as fh:
        fh.write(text.getvalue().encode("utf-8"))  # mtime 0: the same bytes on a rebuild
    table = read_signal_file(path)  # the importer accepts what was written
    assert table.n_rows == len(rows) and table.interval_s == 3600.0
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"),
                    help="folder holding prices/ and carbon/")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    for site in REGIONS:
        try:
            path = build_site(args.data, site, args.out)
        except (OSError, ValueError, KeyError) as e:
            print(f"build_data: {e}", file=sys.stderr)
            return 2
        t = read_signal_file(path)
        print(f"{path}: {t.n_rows} rows, {t.times[0]} .. {t.times[-1]} UTC, price mean "
              f"{t.price.mean():.1f} min {t.price.min():.1f} max {t.price.max():.1f} $/MWh, "
              f"carbon mean {t.carbon.mean():.1f} gCO2/kWh")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
