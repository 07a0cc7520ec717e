"""Where a release-capped search may release more than its anchor: the states the logs
show to be nearly free of latency-critical violations.

The offline model search saves money by releasing batch work at cheap hours, and on a
full fleet that takes the room large latency-critical jobs need. The model's aggregate
state does not predict those violations, but the logs record where they happened. This
module reads, for every logged state, the violations of the ``horizon`` periods after it,
and finds the observation column and threshold that leave the most logged states at or
below the threshold while those states carry at most ``share`` of the logged violations.
A :class:`~models.scenario_policy.ReleaseCappedPolicyModule` with that ``cap_gate`` holds
its anchor's release cap only above the threshold.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def counts_ahead(counts: np.ndarray, episodes: np.ndarray, horizon: int) -> np.ndarray:
    """Per row, the sum of ``counts`` over that row and the ``horizon - 1`` after it in the
    same episode (rows of an episode are contiguous and in order)."""
    counts = np.asarray(counts, np.float64)
    episodes = np.asarray(episodes)
    if counts.shape != episodes.shape or counts.ndim != 1:
        raise ValueError(f"counts_ahead: counts {counts.shape} and episodes "
                         f"{episodes.shape} must be equal 1-D shapes")
    if horizon < 1:
        raise ValueError(f"counts_ahead: horizon must be >= 1, got {horizon}")
    out = np.zeros_like(counts)
    bounds = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1], True])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        cs = np.concatenate([[0.0], np.cumsum(counts[a:b])])
        idx = np.arange(b - a)
        out[a:b] = cs[np.minimum(idx + horizon, b - a)] - cs[idx]
    return out


def cap_gate(states: np.ndarray, counts: np.ndarray, episodes: np.ndarray, share: float,
             horizon: int = 4) -> dict[str, Any] | None:
    """The gate: ``{"column", "above", "free_share", "violation_share"}``, where
    ``free_share`` of the logged ``states`` ``(N, D)`` have ``states[:, column] <= above``
    and they carry ``violation_share`` (at most ``share``) of the violations logged in the
    ``horizon`` periods after each state (:func:`counts_ahead`). The column is the one
    that frees the most states (the lowest index among equals), the threshold the highest
    that keeps within ``share``. None where no column frees any state (the cap then holds
    everywhere)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"cap_gate: share must be in (0, 1), got {share}")
    states = np.asarray(states, np.float64)
    ahead = counts_ahead(counts, episodes, horizon)
    if states.ndim != 2 or len(states) != len(ahead):
        raise ValueError(f"cap_gate: states {states.shape} do not match {len(ahead)} counts")
    total = float(ahead.sum())
    best: dict[str, Any] | None = None
    for col in range(states.shape[1]):
        order = np.argsort(states[:, col], kind="stable")
        xs = states[order, col]
        cum = np.cumsum(ahead[order]) / total if total > 0 else np.zeros(len(xs))
        cut = np.r_[xs[1:] != xs[:-1], True]  # a threshold may fall only between values
        ok = np.flatnonzero(cut & (cum <= share + 1e-12))
        if not len(ok):
            continue
        k = int(ok[-1])
        if best is None or k + 1 > best["free_rows"]:
            best = {"column": col, "above": float(xs[k]), "free_rows": k + 1,
                    "violation_share": float(cum[k])}
    if best is None:
        return None
    free = best.pop("free_rows")
    best["free_share"] = free / len(states)
    return best
