"""Reading a large signal CSV: time and peak memory of ``read_signal_file`` (chunked) against
a same-run reference that first holds the whole file as Python strings.

Run::

    python -m experiments.benchmarks.bench_signal_csv --mb 100

Writes a carbon-only file (``datetime,CO2 (gCO2/kWh)``, one row a minute) of about ``--mb``
MB in a temporary directory, then reads it in a fresh Python process per row of the table:
``read_signal_file`` (rows parsed in chunks of 65,536 into arrays, every check of the
schema), and the reference (``csv.reader`` into a list of rows, then the columns into numpy
arrays, no checks), which is how the reader worked before it read in chunks. Prints wall
seconds, CPU seconds and the process's peak RSS (``VmHWM``) above what it held after its
imports. Expect the
chunked reader to need a small fraction of the reference's memory (tens of bytes a row
against a few hundred) at a similar or lower CPU time; wall time on a shared machine swings
with its load.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HEADER = "datetime,CO2 (gCO2/kWh)"
BYTES_PER_ROW = 26  # "2015-01-01T00:00:00,312.5\n"

READERS = {  # name: (imports, the read); only the read is measured
    "read_signal_file (chunked)": (
        "from envs.signals.csv_import import read_signal_file",
        "n = read_signal_file(path).n_rows"),
    "reference: whole file as strings": (
        "import csv",
        "with open(path, newline='') as fh:\n"
        "    rows = list(csv.reader(fh))[1:]\n"
        "cols = list(zip(*rows))\n"
        "times = np.array(cols[0], dtype='datetime64[s]')\n"
        "carbon = np.array(cols[1], dtype=np.float64)\n"
        "n = len(times)"),
}

# peak RSS from /proc (VmHWM starts afresh at exec; ru_maxrss keeps the parent's peak)
CHILD = """
import sys, time
import numpy as np
{setup}


def hwm_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


path = sys.argv[1]
base = hwm_kib()
t0, c0 = time.perf_counter(), time.process_time()
{read}
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(n, wall, cpu, hwm_kib() - base)
"""


def write_file(path: Path, mb: float) -> int:
    """A carbon-only file of about ``mb`` MB; its number of data rows."""
    n = int(mb * 1e6 / BYTES_PER_ROW)
    t = np.datetime64("2015-01-01T00:00:00") + np.arange(n).astype("timedelta64[m]")
    rng = np.random.default_rng(0)
    values = np.round(300 + 100 * np.sin(np.arange(n) / 720) + rng.normal(0, 10, n), 1)
    with path.open("w") as f:
        f.write(HEADER + "\n")
        for i in range(0, n, 500_000):
            ts = np.datetime_as_string(t[i:i + 500_000], unit="s")
            f.write("".join(f"{a},{b}\n" for a, b in zip(ts, values[i:i + 500_000].tolist(),
                                                            strict=True)))
    return n


def measure(path: Path, setup: str, read: str) -> tuple[int, float, float, float]:
    """(rows, wall s, CPU s, peak RSS growth in MB) of one read in a fresh process, its
    imports done before."""
    out = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, read=read),
                          str(path)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    rows, wall, cpu, kib = out.stdout.split()
    return int(rows), float(wall), float(cpu), int(kib) / 1024


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="file size, MB (default 100)")
    args = parser.parse_args(argv)
    if not 1 <= args.mb <= 2000:
        parser.error(f"--mb {args.mb:g}: expected 1..2000")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "carbon.csv"
        n = write_file(path, args.mb)
        size = path.stat().st_size / 1e6
        print(f"{path.name}: {size:.0f} MB, {n:,} rows ({HEADER})")
        print(f"{'reader':34s} {'rows':>10s} {'wall s':>8s} {'cpu s':>7s} {'peak MB':>8s} "
              f"{'B/row':>6s}")
        for name, (setup, read) in READERS.items():
            rows, wall, cpu, mb = measure(path, setup, read)
            results.append({"reader": name, "rows": rows, "wall_s": wall, "cpu_s": cpu,
                            "peak_mb": mb})
            print(f"{name:34s} {rows:10,d} {wall:8.1f} {cpu:7.1f} {mb:8.0f} "
                  f"{mb * 2**20 / rows:6.0f}")
    return results


if __name__ == "__main__":
    main()
