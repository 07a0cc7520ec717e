"""experiments/benchmarks/bench_training.py --sampling: the same-run reference, its errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.benchmarks.bench_training",
                           "--sampling", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_unknown_reference_revision_is_one_line_and_exit_2():
    out = _bench("--reference-rev", "deadbeef")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--reference-rev deadbeef" in lines[0]
    assert "--reference-rev none" in lines[0]


@pytest.mark.slow  # ~20 s: eight env runners built and sampled
def test_sampling_table_has_the_four_rows_per_algorithm_without_reference():
    out = _bench("--reference-rev", "none", "--n-servers", "5", "--envs-per-runner", "2",
                 "--iters", "1", "--rounds", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines() if line[:4] in ("ppo ", "bdq ")]
    assert len(rows) == 8
    assert sum("batched env runner" in " ".join(r) for r in rows) == 2
    assert all(float(r[-2]) > 0 for r in rows)
    assert [r[-1] for r in rows][0] == "1.00x"  # first row is the ratio base without a reference
