"""Recorded runs compared with a stated tolerance, not by a hash of float bytes.

numpy takes other SIMD paths on other CPUs (AVX-512, AVX2, its baseline), so float results
may differ in their last bits from one machine to another: a sha256 of float arrays is not
portable. A :class:`Trace` keeps what a seeded run produced in two parts:

* **exact**: integer and boolean arrays (masks, counts, terminations), strings and shapes,
  hashed with sha256. They are exact by construction on every machine.
* **floats**: per float array, a fingerprint ``[sum, sum |x|, x . w1, x . w2, min, max]``
  (``w1`` a ramp, ``w2`` a cosine, so a change that keeps the sum still moves a row), plus
  ``n_samples`` evenly spaced values. Fingerprints are compared with
  :data:`RTOL` relative to each array's scale (``max(sum |x|, max |x|, 1)``).

A recorded trace lives in ``tests/fixtures/recorded/<name>.npz``; tests never write it.
``python -m tests.fixtures.record_values`` rewrites the fixtures from the current code (run
it only for an intended change of behaviour, and say so in the commit).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

RTOL = 1e-9  # relative to each float array's scale: far above ulp noise, far below a change
FIXTURES = Path(__file__).parent / "fixtures" / "recorded"
N_SAMPLES = 8


def _prints(a: np.ndarray) -> np.ndarray:
    x = np.asarray(a, dtype=np.float64).ravel()
    x = np.where(np.isfinite(x), x, 0.0)
    n = x.size
    if n == 0:
        return np.zeros(6 + N_SAMPLES + 1)
    i = np.arange(n, dtype=np.float64)
    w1 = (i + 1.0) / n
    w2 = np.cos(0.7 * i)
    take = x[np.linspace(0, n - 1, N_SAMPLES).round().astype(np.int64)]
    scale = max(float(np.abs(x).sum()), float(np.abs(x).max()), 1.0)
    return np.concatenate([[x.sum(), np.abs(x).sum(), x @ w1, x @ w2, x.min(), x.max()],
                           take, [scale]])


class Trace:
    """What a seeded run produced: an exact part and float fingerprints (module docstring)."""

    def __init__(self) -> None:
        self._exact = hashlib.sha256()
        self._floats: list[np.ndarray] = []

    def add(self, name: str, value) -> None:
        """Add one named value: an array, a number or a string."""
        self._exact.update(name.encode() + b"\0")
        if isinstance(value, str):
            self._exact.update(b"s" + value.encode())
            return
        a = np.asarray(value)
        self._exact.update(f"{a.dtype.kind}{a.shape}".encode())
        if a.dtype.kind in "fc":
            a = a.real if a.dtype.kind == "c" else a
            self._exact.update(np.ascontiguousarray(~np.isfinite(a)).tobytes())
            self._floats.append(_prints(a))
        else:
            self._exact.update(np.ascontiguousarray(a).tobytes())

    def record(self) -> dict[str, np.ndarray]:
        floats = np.stack(self._floats) if self._floats else np.zeros((0, 6 + N_SAMPLES + 1))
        return {"exact": np.array(self._exact.hexdigest()), "floats": floats}


def load(name: str) -> dict[str, dict[str, np.ndarray]]:
    """The recorded traces of ``tests/fixtures/recorded/<name>.npz``, by case key."""
    with np.load(FIXTURES / f"{name}.npz") as data:
        out: dict[str, dict[str, np.ndarray]] = {}
        for key in data.files:
            case, part = key.rsplit("/", 1)
            out.setdefault(case, {})[part] = data[key]
    return out


def save(name: str, cases: dict[str, Trace]) -> Path:
    """Write ``cases`` as ``tests/fixtures/recorded/<name>.npz`` (the record script only)."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    arrays = {f"{case}/{part}": v for case, tr in cases.items()
              for part, v in tr.record().items()}
    path = FIXTURES / f"{name}.npz"
    np.savez_compressed(path, **arrays)
    return path


def assert_matches(trace: Trace, name: str, case: str, rtol: float = RTOL) -> None:
    """Fail, naming the first differing array, unless ``trace`` equals the recorded one:
    the exact part bit for bit, every float fingerprint within ``rtol`` of its scale."""
    want = load(name)[case]
    got = trace.record()
    assert got["floats"].shape == want["floats"].shape, (
        f"{name}/{case}: {got['floats'].shape[0]} float arrays, recorded "
        f"{want['floats'].shape[0]}")
    assert str(got["exact"]) == str(want["exact"]), (
        f"{name}/{case}: the exact part (integers, masks, shapes, names) changed")
    g, w = got["floats"][:, :-1], want["floats"][:, :-1]
    tol = rtol * want["floats"][:, -1:]
    bad = np.abs(g - w) > tol
    if bad.any():
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        worst = float((np.abs(g - w) / np.maximum(tol / rtol, 1e-300)).max())
        raise AssertionError(
            f"{name}/{case}: float array #{row} differs from the record "
            f"(relative difference {worst:.3g} > {rtol:g}); got {g[row]}, recorded {w[row]}")
