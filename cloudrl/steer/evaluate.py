"""Policies under an operator's hidden utility, on test seeds: the measurement side.

This is the one place beside the operator's own process that loads a hidden utility
(:mod:`cloudrl.steer.utilities`); the loop calls it only after the learner has chosen.
Per operator and family: the default-tuned point (lowest mean cost on validation), the
hidden-tuned point (lowest mean hidden utility on validation: the true-reward reference of
the same search) and the steered point; on test seeds, paired by seed, each against the
default-tuned heuristic (95% t-interval) and the share of the gap to the hidden-tuned
point closed: (U(default) - U(steered)) / (U(default) - U(hidden)).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cloudrl.scenarios.runner import paired_ci
from cloudrl.steer.trace import Trace
from cloudrl.steer.utilities import utilities_at_end


def hidden_choice(utility: str, val_traces: list[list[Trace]]) -> int:
    """The search point with the lowest mean hidden utility on validation."""
    u = utilities_at_end(utility)
    return int(np.argmin([np.mean([u(t) for t in row]) for row in val_traces]))


def rows_for(utility: str, family: str, test: dict[str, list[Trace]],
             base: list[Trace]) -> list[dict[str, Any]]:
    """Table rows of one operator and family; ``test`` has ``default``, ``hidden`` and
    ``steered`` traces on the test seeds; ``base``: the default-tuned heuristic's."""
    u = utilities_at_end(utility)
    vals = {k: np.array([u(t) for t in v]) for k, v in test.items()}
    ub = np.array([u(t) for t in base])
    denom = float(vals["default"].mean() - vals["hidden"].mean())
    rows = []
    for k in ("default", "hidden", "steered"):
        d, lo, hi = paired_ci(vals[k], ub)
        gap = float((vals["default"].mean() - vals[k].mean()) / denom) \
            if abs(denom) > 1e-9 else float("nan")
        rows.append({"family": family, "policy": k, "utility": utility,
                     "utility_mean": float(vals[k].mean()),
                     "cost_usd_mean": float(np.mean([t.cost_usd() for t in test[k]])),
                     "vs_default_heuristic": [d, lo, hi], "gap_closed": gap})
    return rows
