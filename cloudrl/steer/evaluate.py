"""Policies under an operator's hidden utility, on test seeds: the measurement side.

This is the one place beside the operator's own process that loads a hidden utility
(:mod:`cloudrl.steer.utilities`); the loop calls it only after the learner has chosen.
Per operator and family: the default-tuned point (lowest mean cost on validation), the
hidden-tuned point (lowest mean hidden utility on validation: the true-reward reference of
the same search) and the steered point; on test seeds, paired by seed, each against the
default-tuned heuristic (95% t-interval) and the share of the gap to the hidden-tuned
point closed: (U(default) - U(steered)) / (U(default) - U(hidden)), and the same share
measured from the default-tuned heuristic (``gap_closed_vs_heuristic``).

For the learned family the hidden-tuned reference is the start fine-tuned by the same
search (:func:`cloudrl.steer.finetune.steer_policy`, same knobs) on the hidden utility
itself (:func:`hidden_reference`); it depends only on the scenario, the start, the
utility and the knobs, so it is cached across runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.scenarios.runner import paired_ci
from cloudrl.steer import utilities
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
    denom_h = float(ub.mean() - vals["hidden"].mean())
    rows = []
    for k in ("default", "hidden", "steered"):
        d, lo, hi = paired_ci(vals[k], ub)
        gap = float((vals["default"].mean() - vals[k].mean()) / denom) \
            if abs(denom) > 1e-9 else float("nan")
        rows.append({"family": family, "policy": k, "utility": utility,
                     "utility_mean": float(vals[k].mean()),
                     "cost_usd_mean": float(np.mean([t.cost_usd() for t in test[k]])),
                     "vs_default_heuristic": [d, lo, hi], "gap_closed": gap,
                     "gap_closed_vs_heuristic": float((ub.mean() - vals[k].mean()) / denom_h)
                     if abs(denom_h) > 1e-9 else float("nan")})
    return rows


def hidden_reference(scn: Any, start: str, utility: str, es: Any, cache: Path,
                     log: Any = print, val_scn: Any = None) -> Path:
    """The start fine-tuned on the hidden ``utility`` (the one it holds at its end) by the
    steering search ``es`` (candidates on ``scn``, validations on ``val_scn``, default
    ``scn``): a checkpoint under ``cache``, reused when there."""
    from dataclasses import asdict

    from cloudrl.algorithms.es.command import weights_digest
    from cloudrl.steer.finetune import save_steered, steer_policy

    name = utility.split(">")[-1].split("@")[0]
    # the utilities' source is in the key: a changed definition gets a fresh reference
    source = hashlib.sha256(Path(utilities.__file__).read_bytes()).hexdigest()
    parts = [scn.name, weights_digest(start), name, asdict(es), source]
    if val_scn is not None:  # a site: both parts' scenarios in full (files, forecasts)
        parts += [scn.model_dump_json(), val_scn.model_dump_json()]
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache) / f"{scn.name}-{name}-{key}"
    if (path / "policy.json").is_file():
        log(f"hidden-tuned reference for {name}: reusing {path}")
        return path
    u = utilities_at_end(utility)
    log(f"hidden-tuned reference for {name}: the start fine-tuned on the hidden utility")
    res = steer_policy(scn, start, lambda trs: np.array([u(t) for t in trs]), es, log,
                       val_scn)
    return save_steered(res, start, path, scn, es, f"hidden utility {name}")
