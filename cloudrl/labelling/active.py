"""Active learning: rank open pairs by the current reward model's uncertainty.

For a pair, each ensemble member m gives P_m(A > B) = sigmoid(R_m(A) - R_m(B)); with
p the member mean, the priority is

    0.5 * (1 - |2p - 1|) + 0.5 * min(1, 2 * std_m P_m)

the Bradley-Terry probability's closeness to 0.5 plus the members' disagreement (0 for
a one-member model), in [0, 1]. The queue serves high priority first within each
stratum (:mod:`.queue`), so labels go where the model is least sure.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import numpy as np


def uncertainty(gaps: np.ndarray) -> np.ndarray:
    """Priority in [0, 1] from member gaps R_a - R_b of shape (k, P)."""
    probs = 1.0 / (1.0 + np.exp(-np.clip(np.asarray(gaps, dtype=np.float64), -60, 60)))
    p = probs.mean(0)
    spread = probs.std(0) if probs.shape[0] > 1 else np.zeros_like(p)
    return 0.5 * (1.0 - np.abs(2.0 * p - 1.0)) + 0.5 * np.minimum(1.0, 2.0 * spread)


def score_open_pairs(conn: sqlite3.Connection, reward_model: str | Path) -> dict[str, int]:
    """Set the priority of every open pair with observations; returns counts."""
    from cloudrl.alignment.reward_model import load_reward_model, member_gaps
    from cloudrl.data.pairs import pair_row, read_pairs
    from cloudrl.labelling.export import _segment, _shape
    from cloudrl.labelling.queue import set_priorities

    model = load_reward_model(reward_model)
    rows, ids, skipped = [], [], 0
    shape = None
    for pid, a_id, b_id in conn.execute(
            "SELECT id, a_seg, b_seg FROM pairs WHERE gold IS NULL AND taken < k").fetchall():
        a, b = _segment(conn, a_id), _segment(conn, b_id)
        if a is None or b is None or _shape(a) != _shape(b) or (shape and _shape(a) != shape):
            skipped += 1
            continue
        shape = _shape(a)
        rows.append(pair_row(f"p{pid}", "operator", 0.5, a, b))
        ids.append(pid)
    if rows:
        from cloudrl.data.pairs import write_pairs

        with tempfile.TemporaryDirectory() as tmp:
            write_pairs(rows, tmp)
            pairs = read_pairs(tmp)
        try:
            gaps = member_gaps(model, pairs)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"reward model {reward_model}: does not fit the pairs' shapes "
                             f"({str(exc).splitlines()[0]})") from None
        set_priorities(conn, list(zip(ids, uncertainty(gaps).tolist(), strict=True)))
    return {"scored": len(ids), "skipped": skipped}
