"""Quality control: gold accuracy, agreement, Krippendorff's alpha and Cohen's kappa.

* Per operator: labels, skips, gold answered (skips on gold are not answers), gold
  accuracy, agreement with others (over the pairs another operator also answered, the
  share of other answers equal to theirs), median time taken.
* An operator with at least ``min_gold_labels`` gold answers and a gold accuracy below
  ``min_gold_accuracy`` is *flagged*: their labels stay in the store (``labels.flagged``
  = 1) and the export leaves them out.
* Overall: Krippendorff's alpha (nominal; the ``krippendorff`` package) on the
  operators x pairs matrix of answers a / b / equal (skips missing), and Cohen's kappa,
  the mean over operator pairs who answered at least ``min_common`` pairs in common
  (each pair's kappa is listed too). Flagged operators are left out of both unless
  ``include_flagged``.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np

CODES = {"a": 0.0, "b": 1.0, "equal": 2.0}


@dataclass
class QualityConfig:
    """Thresholds of the quality report (defaults run)."""

    min_gold_accuracy: float = 0.7
    min_gold_labels: int = 5
    min_common: int = 2


def answers(conn: sqlite3.Connection) -> list[tuple[int, int, str]]:
    """(operator_id, pair_id, choice) of every non-skip label."""
    return [(int(o), int(p), str(c)) for o, p, c in conn.execute(
        "SELECT operator_id, pair_id, choice FROM labels WHERE choice != 'skip'")]


def cohen_kappa(x: list[str], y: list[str]) -> float:
    """Cohen's kappa of two raters' answers to the same items (NaN when undefined)."""
    if len(x) != len(y) or not x:
        return math.nan
    cats = sorted(set(x) | set(y))
    n = len(x)
    p_o = sum(a == b for a, b in zip(x, y, strict=True)) / n
    p_e = sum((x.count(c) / n) * (y.count(c) / n) for c in cats)
    if p_e >= 1.0:
        return 1.0 if p_o >= 1.0 else math.nan
    return (p_o - p_e) / (1.0 - p_e)


def kappa_from_table(table: dict[tuple[str, str], int]) -> float:
    """Cohen's kappa from counts of (rater 1's answer, rater 2's answer)."""
    n = sum(table.values())
    if n == 0:
        return math.nan
    cats = {c for pair in table for c in pair}
    p_o = sum(v for (a, b), v in table.items() if a == b) / n
    p_e = sum((sum(v for (a, _), v in table.items() if a == c) / n)
              * (sum(v for (_, b), v in table.items() if b == c) / n) for c in cats)
    if p_e >= 1.0:
        return 1.0 if p_o >= 1.0 else math.nan
    return (p_o - p_e) / (1.0 - p_e)


def reliability_matrix(rows: list[tuple[int, int, str]]) -> tuple[list[int], list[int],
                                                                  np.ndarray]:
    """Operators x pairs, codes of :data:`CODES`, NaN where an operator did not answer."""
    ops = sorted({o for o, _, _ in rows})
    pairs = sorted({p for _, p, _ in rows})
    oi = {o: i for i, o in enumerate(ops)}
    pi = {p: i for i, p in enumerate(pairs)}
    m = np.full((len(ops), len(pairs)), np.nan)
    for o, p, c in rows:
        m[oi[o], pi[p]] = CODES[c]
    return ops, pairs, m


def value_counts(conn: sqlite3.Connection, excluded: set[int] = frozenset()) -> np.ndarray:
    """Units (pairs) x answers (a, b, equal): how many operators gave each answer, for the
    pairs with at least two answers; operators in ``excluded`` left out (counted in SQL)."""
    counts: dict[int, np.ndarray] = {}
    for pid, op, choice in conn.execute(
            "SELECT pair_id, operator_id, choice FROM labels WHERE choice != 'skip' AND "
            "pair_id IN (SELECT pair_id FROM labels WHERE choice != 'skip' GROUP BY pair_id "
            "HAVING COUNT(*) >= 2)"):
        if op not in excluded:
            counts.setdefault(pid, np.zeros(len(CODES)))[int(CODES[choice])] += 1
    rows = [c for c in counts.values() if c.sum() >= 2]
    return np.array(rows) if rows else np.zeros((0, len(CODES)))


def alpha_from_counts(counts: np.ndarray) -> float:
    """Nominal alpha from a units x values count matrix (NaN when it is undefined)."""
    import krippendorff

    if counts.shape[0] == 0 or np.count_nonzero(counts.sum(0)) < 2:
        return math.nan
    try:
        return float(krippendorff.alpha(value_counts=counts, level_of_measurement="nominal"))
    except (ValueError, ZeroDivisionError):
        return math.nan


def krippendorff_alpha(matrix: np.ndarray) -> float:
    """Nominal alpha of a raters x units matrix (NaN when it is undefined)."""
    import krippendorff

    pairable = np.sum(~np.isnan(matrix), axis=0) >= 2
    values = matrix[:, pairable]
    if values.size == 0 or len(np.unique(values[~np.isnan(values)])) < 2:
        return math.nan
    try:
        return float(krippendorff.alpha(reliability_data=values,
                                        level_of_measurement="nominal"))
    except (ValueError, ZeroDivisionError):
        return math.nan


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 4)


def operator_table(conn: sqlite3.Connection, cfg: QualityConfig) -> list[dict[str, Any]]:
    """One row per operator (see the module docstring); the counting runs in SQLite."""
    names = dict(conn.execute("SELECT id, name FROM operators"))
    per_op = {r[0]: r[1:] for r in conn.execute(
        "SELECT operator_id, COUNT(*), COALESCE(SUM(choice = 'skip'), 0), "
        "COALESCE(SUM(gold_correct IS NOT NULL), 0), COALESCE(SUM(gold_correct), 0) "
        "FROM labels GROUP BY operator_id")}
    agreement = {r[0]: r[1:] for r in conn.execute(
        "SELECT l1.operator_id, COALESCE(SUM(l1.choice = l2.choice), 0), COUNT(*) "
        "FROM labels l1 JOIN labels l2 ON l2.pair_id = l1.pair_id AND "
        "l2.operator_id != l1.operator_id WHERE l1.choice != 'skip' AND l2.choice != 'skip' "
        "GROUP BY l1.operator_id")}
    times: dict[int, list[int]] = {}
    for op_id, ms in conn.execute("SELECT operator_id, time_taken_ms FROM labels"):
        times.setdefault(op_id, []).append(ms)
    rows = []
    for op_id, name in sorted(names.items()):
        n, skips, gold_n, gold_ok = per_op.get(op_id, (0, 0, 0, 0))
        agree, total = agreement.get(op_id, (0, 0))
        acc = gold_ok / gold_n if gold_n else math.nan
        flagged = gold_n >= cfg.min_gold_labels and acc < cfg.min_gold_accuracy
        t = times.get(op_id)
        rows.append({"operator": name, "id": op_id, "labels": n, "skips": skips,
                     "gold_answered": gold_n, "gold_accuracy": _num(acc),
                     "agreement": _num(agree / total if total else math.nan),
                     "compared": total,
                     "median_time_s": _num(float(np.median(t)) / 1000 if t else math.nan),
                     "flagged": bool(flagged)})
    return rows


def flag_labels(conn: sqlite3.Connection, flagged_ids: list[int]) -> None:
    """``labels.flagged`` = 1 exactly for the labels of ``flagged_ids`` (one transaction)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("UPDATE labels SET flagged = 0")
        conn.executemany("UPDATE labels SET flagged = 1 WHERE operator_id = ?",
                         [(i,) for i in flagged_ids])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def quality_report(conn: sqlite3.Connection, cfg: QualityConfig | None = None, *,
                   include_flagged: bool = False) -> dict[str, Any]:
    """Operators, alpha, kappa (mean and per operator pair), counts."""
    cfg = cfg or QualityConfig()
    ops = operator_table(conn, cfg)
    flagged = {r["id"] for r in ops if r["flagged"]}
    counts = value_counts(conn, set() if include_flagged else flagged)
    names = {r["id"]: r["operator"] for r in ops}
    tables: dict[tuple[int, int], dict[tuple[str, str], int]] = {}
    for o1, o2, c1, c2, n in conn.execute(
            "SELECT l1.operator_id, l2.operator_id, l1.choice, l2.choice, COUNT(*) FROM labels "
            "l1 JOIN labels l2 ON l2.pair_id = l1.pair_id AND l2.operator_id > l1.operator_id "
            "WHERE l1.choice != 'skip' AND l2.choice != 'skip' GROUP BY 1, 2, 3, 4"):
        if include_flagged or (o1 not in flagged and o2 not in flagged):
            tables.setdefault((o1, o2), {})[(c1, c2)] = n
    kappas = []
    for (o1, o2), table in sorted(tables.items()):
        common = sum(table.values())
        if common < cfg.min_common:
            continue
        kappas.append({"operators": [names[o1], names[o2]], "common": common,
                       "kappa": _num(kappa_from_table(table))})
    finite = [k["kappa"] for k in kappas if k["kappa"] is not None]
    return {"operators": ops, "flagged": sorted(names[i] for i in flagged),
            "krippendorff_alpha": _num(alpha_from_counts(counts)),
            "cohen_kappa_mean": _num(float(np.mean(finite))) if finite else None,
            "cohen_kappa_pairs": kappas, "pairs_with_two_answers": int(counts.shape[0]),
            "thresholds": {"min_gold_accuracy": cfg.min_gold_accuracy,
                           "min_gold_labels": cfg.min_gold_labels}}
