"""``cloudrl steer summary``: the tables of several ``cloudrl steer loop`` reports (run
seeds) per hidden utility, as markdown.

Per utility (the one the operator holds at the end) and family: each run's steered row
(U on the test seeds, U minus the default-tuned heuristic with its paired 95% interval,
the share of the gap closed to the same family tuned on the hidden utility, measured from
the family's cost-tuned point and from the default-tuned heuristic), the median run's
share (over the runs whose reference found a gap: ``(k of n)`` when not all did) and,
for the learned family, the shares by label count (the runs' own count and any
``--snapshots``). An operator whose utility never moved but whose drift check fired
(a false alarm) keeps the row steered on the model of all its labels; the retrained row
is listed with the drifted operators. A share is ``n/a`` where the hidden-tuned point is
no better (on the test seeds) than the baseline it is measured from: there is no gap to
close, the reference search did not find one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _share(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:.0f}%"


def _median(xs: list[float]) -> str:
    """The median share over the runs that had a gap to close; ``(k of n)`` when some had
    none, ``n/a`` when none had."""
    ok = [x for x in xs if np.isfinite(x)]
    if not ok:
        return "n/a"
    return _share(float(np.median(ok))) + (f" ({len(ok)} of {len(xs)})" if len(ok) < len(xs)
                                            else "")


def _ci(v: list[float]) -> str:
    d, lo, hi = v
    return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def load_reports(paths: list[str]) -> list[dict[str, Any]]:
    """The reports (a directory holding ``report.json``, or the file); ValueError names a
    path that is neither."""
    out = []
    for p in paths:
        path = Path(p) / "report.json" if Path(p).is_dir() else Path(p)
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            raise ValueError(f"report {p}: not a steer loop report ({type(e).__name__})") \
                from None
    return out


def _end(utility: str) -> str:
    return utility.split(">")[-1].split("@")[0]


def summarise(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows per (utility, family): one per run and label count, with the run seed."""
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rep in reports:
        seed = rep["config"]["seed"]
        n = rep["config"]["comparisons"]
        base = {(r["operator"], r["family"]): r for r in rep["rows"] if r["policy"] == "hidden"}
        dflt = {(r["operator"], r["family"]): r for r in rep["rows"]
                if r["policy"] == "default"}
        stale = {r["operator"] for r in rep["rows"] if r["operator"].endswith(":stale")}
        for r in rep["rows"]:
            if r["policy"] != "steered":
                continue
            op = r["operator"].split("@")[0].split(":")[0]
            who = r["operator"]
            if ">" not in r["utility"] and f"{op}:stale" in stale:
                # a false alarm: this operator's utility never moved, so its model of all
                # its labels (":stale") is its row and the retrained one goes with the drift
                who = op if who == f"{op}:stale" else (
                    f"{who} (retrained on a false alarm)" if who == op else who)
            hid, d = base.get((op, r["family"])), dflt.get((op, r["family"]))
            gap, gap_h = r["gap_closed"], r.get("gap_closed_vs_heuristic", float("nan"))
            if hid is None or d is None or hid["utility_mean"] >= d["utility_mean"]:
                gap = float("nan")
            if hid is None or hid["vs_default_heuristic"][0] >= 0:
                gap_h = float("nan")
            rows.setdefault((_end(r["utility"]), r["family"]), []).append({
                "seed": seed, "labels": r.get("labels", n), "operator": who,
                "spec": r["utility"], "U": r["utility_mean"], "cost": r["cost_usd_mean"],
                "vs_default_heuristic": r["vs_default_heuristic"],
                "hidden_vs_default_heuristic": hid["vs_default_heuristic"] if hid else None,
                "gap_closed": gap, "gap_closed_vs_heuristic": gap_h})
    return {"rows": {f"{u}|{f}": v for (u, f), v in rows.items()}}


def markdown(summary: dict[str, Any]) -> str:
    """The steered rows (operators with one utility), the median shares, then the drifted
    operators' rows (``A>B@f``: measured under B)."""
    head = ["| utility | family | run seed | labels | U | U − default-tuned heuristic "
             "[95% CI] | hidden-tuned − default-tuned heuristic | gap closed (from the "
             "family's cost-tuned point) | gap closed (from the default heuristic) |",
             "|---|---|---:|---:|---:|---|---|---:|---:|"]
    lines, drift = list(head), list(head)
    for key, rows in sorted(summary["rows"].items()):
        u, f = key.split("|")
        for r in sorted(rows, key=lambda r: (r["labels"], r["seed"], r["operator"])):
            hid = r["hidden_vs_default_heuristic"]
            who = f" {r['operator']}" if ">" in r["spec"] or "alarm" in r["operator"] else ""
            (drift if who else lines).append(
                f"| `{r['spec']}`{who} | {f} | {r['seed']} | {r['labels']} | {r['U']:.3f} | "
                f"{_ci(r['vs_default_heuristic'])} | {_ci(hid) if hid else ''} | "
                f"{_share(r['gap_closed'])} | {_share(r['gap_closed_vs_heuristic'])} |")
    lines += ["", "Median share of the gap closed, by utility, family and label count "
              "(runs):", "", "| utility | family | labels | runs | median (family's point) | "
              "median (default heuristic) |", "|---|---|---:|---:|---:|---:|"]
    for key, rows in sorted(summary["rows"].items()):
        u, f = key.split("|")
        by: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            if ":stale" not in r["operator"] and ">" not in r["spec"] \
                    and "alarm" not in r["operator"]:
                by.setdefault(r["labels"], []).append(r)
        for n, rs in sorted(by.items()):
            g = [r["gap_closed"] for r in rs]
            h = [r["gap_closed_vs_heuristic"] for r in rs]
            lines.append(f"| `{u}` | {f} | {n} | {len(rs)} | {_median(g)} | {_median(h)} |")
    if len(drift) > 2:
        lines += ["", "Operators whose utility switched (measured under the one they hold at "
                  "the end; `:stale`: steered on the model of all their labels, before the "
                  "drift check retrained it):", "", *drift]
    return "\n".join(lines)
