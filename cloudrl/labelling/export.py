"""Labels into the reward model's pair dataset: majority vote per pair; drift over time.

:func:`export_labels` writes the store's labelled pairs with
:func:`cloudrl.alignment.preferences.write_pairs` (source ``operator``, pair id
``label:<pair key>``), the dataset ``cloudrl align reward --data DIR`` trains on:

* votes are the non-skip labels of operators who are not flagged (:mod:`.quality`);
  the answer with the most votes wins, a tie between answers is ``equal`` (label 0.5);
  a pair with no vote is left out;
* a gold pair is written with its known answer (``include_gold``);
* segments without observations (view-only) and segments whose shape differs from the
  most common one are skipped and counted.

:func:`drift_report` scores the exported pairs with a trained reward model and compares
its accuracy (ties left out) on the most recently labelled pairs with the older ones.
"""

from __future__ import annotations

import json
import math
import sqlite3
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.labelling.quality import QualityConfig, flag_labels, operator_table
from cloudrl.labelling.segments import unpack_obs

LABEL_OF = {"a": 1.0, "b": 0.0, "equal": 0.5}


def majority(choices: list[str]) -> str | None:
    """The answer with the most votes; ``equal`` on a tie; None without votes (skips
    do not vote)."""
    counts = Counter(c for c in choices if c in LABEL_OF)
    if not counts:
        return None
    top = max(counts.values())
    winners = [c for c, n in counts.items() if n == top]
    return winners[0] if len(winners) == 1 else "equal"


@dataclass
class ExportResult:
    """What :func:`export_labels` wrote and left out."""

    written: int = 0
    labels: dict[float, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    flagged_operators: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    last_label_at: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"pairs": self.written, "labels": {str(k): v for k, v in
                                                  sorted(self.labels.items())},
                "skipped": dict(self.skipped), "flagged_operators": self.flagged_operators,
                "files": [str(p) for p in self.paths]}


def voted_pairs(conn: sqlite3.Connection, excluded: set[int], include_gold: bool = True
                ) -> list[dict[str, Any]]:
    """Every pair with a decided answer: id, key, answer, votes, last label time."""
    votes: dict[int, list[str]] = {}
    last: dict[int, float] = {}
    for pid, op, choice, at in conn.execute(
            "SELECT pair_id, operator_id, choice, created_at FROM labels"):
        if op in excluded:
            continue
        votes.setdefault(pid, []).append(choice)
        last[pid] = max(last.get(pid, 0.0), at)
    out = []
    for pid, key, gold in conn.execute("SELECT id, pair_key, gold FROM pairs ORDER BY id"):
        if gold is not None:
            if not include_gold or pid not in votes:
                continue
            answer = gold
        else:
            answer = majority(votes.get(pid, []))
            if answer is None:
                continue
        out.append({"pair_id": pid, "pair_key": key, "answer": answer,
                    "votes": dict(Counter(votes.get(pid, []))), "gold": gold,
                    "last_label_at": last.get(pid, math.nan)})
    return out


def _segment(conn: sqlite3.Connection, seg_id: int):
    from cloudrl.data.pairs import Segment

    blob, view_json = conn.execute("SELECT obs, view_json FROM segments WHERE id = ?",
                                   (seg_id,)).fetchone()
    if blob is None:
        return None
    obs, stats = unpack_obs(blob)
    view = json.loads(view_json)
    return Segment(macro=obs["macro"], servers=obs["servers"], jobs=obs["jobs"],
                   actions=obs["actions"], episode_seed=int(view.get("seed", -1)),
                   start=max(0, int(view.get("start", 0))), policy=str(view.get("policy", "")),
                   stats=stats)


def _shape(seg) -> tuple:
    return (seg.length, seg.obs_steps, seg.servers.shape[1:], seg.jobs.shape[1:],
            seg.macro.shape[1:], np.asarray(seg.actions).shape[1:])


def export_labels(conn: sqlite3.Connection, out_dir: str | Path, *,
                  quality: QualityConfig | None = None, include_gold: bool = True,
                  rows_per_file: int = 256) -> ExportResult:
    """Flag operators, vote, write the pair dataset into ``out_dir``."""
    from cloudrl.data.pairs import pair_row, write_pairs

    ops = operator_table(conn, quality or QualityConfig())
    flagged = [r["id"] for r in ops if r["flagged"]]
    flag_labels(conn, flagged)
    result = ExportResult(flagged_operators=[r["operator"] for r in ops if r["flagged"]])
    candidates = []
    for v in voted_pairs(conn, set(flagged), include_gold):
        a_id, b_id = conn.execute("SELECT a_seg, b_seg FROM pairs WHERE id = ?",
                                  (v["pair_id"],)).fetchone()
        a, b = _segment(conn, a_id), _segment(conn, b_id)
        if a is None or b is None:
            result.skipped["no_observations"] = result.skipped.get("no_observations", 0) + 1
            continue
        if _shape(a) != _shape(b):
            result.skipped["shape"] = result.skipped.get("shape", 0) + 1
            continue
        candidates.append((v, a, b))
    if not candidates:
        return result
    common = Counter(_shape(a) for _, a, _ in candidates).most_common(1)[0][0]
    rows = []
    for v, a, b in candidates:
        if _shape(a) != common:
            result.skipped["shape"] = result.skipped.get("shape", 0) + 1
            continue
        label = LABEL_OF[v["answer"]]
        pid = f"label:{v['pair_key']}"
        rows.append(pair_row(pid, "operator", label, a, b))
        result.labels[label] = result.labels.get(label, 0) + 1
        result.last_label_at[pid] = v["last_label_at"]
        result.written += 1
    result.paths = write_pairs(rows, out_dir, rows_per_file=rows_per_file, prefix="labels")
    return result


def drift_report(conn: sqlite3.Connection, reward_model: str | Path, *,
                 recent_fraction: float = 0.3, quality: QualityConfig | None = None
                 ) -> dict[str, Any]:
    """The reward model's accuracy on the newest ``recent_fraction`` of labelled pairs
    (by their last label's time) vs the older ones; ties are left out."""
    from cloudrl.alignment.reward_model import load_reward_model, member_gaps
    from cloudrl.data.pairs import read_pairs

    if not 0.0 < recent_fraction < 1.0:
        raise ValueError(f"recent_fraction: {recent_fraction} is not in (0, 1)")
    model = load_reward_model(reward_model)
    with tempfile.TemporaryDirectory() as tmp:
        res = export_labels(conn, tmp, quality=quality)
        if res.written == 0:
            raise ValueError("no labelled pairs with observations to score")
        pairs = read_pairs(tmp)
    gaps = member_gaps(model, pairs)
    prob = (1.0 / (1.0 + np.exp(-np.clip(gaps, -60, 60)))).mean(0)
    decided = pairs.label != 0.5
    correct = (prob > 0.5) == (pairs.label > 0.5)
    times = np.array([res.last_label_at[p] for p in pairs.meta["pair_id"]])
    order = np.argsort(times, kind="stable")
    n_recent = max(1, int(round(len(order) * recent_fraction)))
    recent = np.zeros(len(order), dtype=bool)
    recent[order[-n_recent:]] = True

    def part(mask: np.ndarray) -> dict[str, Any]:
        m = mask & decided
        return {"pairs": int(mask.sum()), "decided": int(m.sum()),
                "accuracy": round(float(correct[m].mean()), 4) if m.any() else None,
                "from": float(times[mask].min()) if mask.any() else None,
                "to": float(times[mask].max()) if mask.any() else None}

    older, newer = part(~recent), part(recent)
    shift = (round(newer["accuracy"] - older["accuracy"], 4)
             if newer["accuracy"] is not None and older["accuracy"] is not None else None)
    return {"reward_model": str(reward_model), "older": older, "recent": newer,
            "accuracy_change": shift}
