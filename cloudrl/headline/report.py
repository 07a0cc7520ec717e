"""The headline table: per policy mean ± 95% CI, paired differences vs the tuned heuristic,
the share of the heuristic-to-bound gap closed, whether the headline goal is met; plots.

Paired statistics compare two policies seed by seed on the same test episodes: the
mean of the per-seed differences with its 95% t interval (``cloudrl.metrics.summarize``).
The headline goal for the learned policy against the tuned heuristic: energy
difference CI entirely below 0, violation-rate difference CI upper bound at most
``violation_margin_pp`` percentage points, and at least ``gap_goal`` of the gap to
the clairvoyant bound closed (on at least one workload, judged over the workloads).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.lower_bound import gap_closed
from cloudrl.metrics import EpisodeMetrics, summarize

REFERENCE = "power_aware_tuned"
BOUND = "lower_bound"
OFFERED = "offered_reference"  # F(offered load): a fair target for serving policies, no bound
COLUMNS = ("energy_kwh", "sla_violation_rate", "toggles", "episode_reward")


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean and 95% CI half-width of the per-seed differences ``a - b``."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    s = summarize(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    return s.mean, s.ci95


def policy_rows(episodes: dict[str, list[EpisodeMetrics]], bound_kwh: Sequence[float],
                violation_margin_pp: float, gap_goal: float,
                learned: str | None, offered_kwh: Sequence[float] | None = None
                ) -> list[dict[str, Any]]:
    """One row per policy, one for the bound and (with ``offered_kwh``) one for the
    offered-work reference (``cloudrl.lower_bound.offered_load``); ``episodes`` per policy
    in seed order. ``gap_closed`` is measured against the bound (the headline goal),
    ``gap_closed_offered`` against the offered-work reference."""
    ref = episodes[REFERENCE]
    seeds = [e.seed for e in ref]
    ref_energy = float(np.mean([e.energy_kwh for e in ref]))
    bound_mean = float(np.mean(bound_kwh))
    offered_mean = float(np.mean(offered_kwh)) if offered_kwh is not None else float("nan")
    rows: list[dict[str, Any]] = []
    for name, eps in episodes.items():
        if [e.seed for e in eps] != seeds:
            raise ValueError(f"{name}: episodes are not on the reference's seeds")
        row: dict[str, Any] = {"policy": name, "episodes": len(eps),
                               "learned": name == learned}
        for m in COLUMNS:
            s = summarize([getattr(e, m) for e in eps])
            row[f"{m}_mean"], row[f"{m}_ci95"] = s.mean, s.ci95
        e_diff, e_ci = paired([e.energy_kwh for e in eps], [e.energy_kwh for e in ref])
        v_diff, v_ci = paired([e.sla_violation_rate for e in eps],
                              [e.sla_violation_rate for e in ref])
        row.update(energy_diff_mean=e_diff, energy_diff_ci95=e_ci,
                   energy_diff_upper=e_diff + e_ci,
                   violation_diff_pp_mean=100 * v_diff, violation_diff_pp_ci95=100 * v_ci,
                   violation_diff_pp_upper=100 * (v_diff + v_ci),
                   gap_closed=gap_closed(row["energy_kwh_mean"], ref_energy, bound_mean),
                   gap_closed_offered=gap_closed(row["energy_kwh_mean"], ref_energy,
                                                 offered_mean))
        row["energy_better"] = bool(row["energy_diff_upper"] < 0)
        row["violations_not_worse"] = bool(row["violation_diff_pp_upper"] <= violation_margin_pp)
        row["pareto_dominates"] = row["energy_better"] and row["violations_not_worse"]
        row["gap_goal_met"] = bool(row["gap_closed"] >= gap_goal)  # NaN -> False
        rows.append(row)
    b = summarize(bound_kwh)
    rows.append({"policy": BOUND, "episodes": len(bound_kwh), "learned": False,
                 "energy_kwh_mean": b.mean, "energy_kwh_ci95": b.ci95,
                 "energy_diff_mean": bound_mean - ref_energy, "gap_closed": 1.0,
                 "gap_closed_offered": gap_closed(b.mean, ref_energy, offered_mean)})
    if offered_kwh is not None:
        o = summarize(offered_kwh)
        rows.append({"policy": OFFERED, "episodes": len(offered_kwh), "learned": False,
                     "energy_kwh_mean": o.mean, "energy_kwh_ci95": o.ci95,
                     "energy_diff_mean": offered_mean - ref_energy,
                     "gap_closed": gap_closed(o.mean, ref_energy, bound_mean),
                     "gap_closed_offered": 1.0})
    return rows


def _fmt(row: dict[str, Any], key: str, scale: float = 1.0, digits: int = 1,
         suffix: str = "") -> str:
    mean = row.get(f"{key}_mean")
    if mean is None or not math.isfinite(mean):
        return "–"
    ci = row.get(f"{key}_ci95", 0.0) or 0.0
    return f"{scale * mean:.{digits}f} ± {scale * ci:.{digits}f}{suffix}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`policy_rows`."""
    head = ["policy", "energy kWh", "SLA viol. %", "toggles", "reward",
            "Δ energy vs tuned (kWh)", "Δ viol. vs tuned (pp)", "gap to bound closed",
            "gap to offered closed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def pct(gap: Any) -> str:
        return f"{100 * gap:.0f}%" if gap is not None and math.isfinite(gap) else "–"

    for r in rows:
        cells = [r["policy"] + (" (learned)" if r.get("learned") else ""),
                 _fmt(r, "energy_kwh", digits=2), _fmt(r, "sla_violation_rate", 100, 3),
                 _fmt(r, "toggles"), _fmt(r, "episode_reward"),
                 _fmt(r, "energy_diff", digits=2), _fmt(r, "violation_diff_pp", digits=3),
                 pct(r.get("gap_closed")), pct(r.get("gap_closed_offered"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goal_verdict(per_workload: dict[str, list[dict[str, Any]]], gap_goal: float
                 ) -> dict[str, Any]:
    """Did the learned policy Pareto-dominate the tuned heuristic on every workload and close
    ``gap_goal`` of the gap on at least one?"""
    learned = {wl: next((r for r in rows if r.get("learned")), None)
               for wl, rows in per_workload.items()}
    dominates = {wl: bool(r and r["pareto_dominates"]) for wl, r in learned.items()}
    gaps = {wl: (r["gap_closed"] if r else float("nan")) for wl, r in learned.items()}
    gap_met = any(g >= gap_goal for g in gaps.values() if math.isfinite(g))
    return {"pareto_dominates": dominates, "gap_closed": gaps,
            "gap_goal": gap_goal, "gap_goal_met": gap_met,
            "met": all(dominates.values()) and gap_met}


def write_tables(per_workload: dict[str, list[dict[str, Any]]], titles: dict[str, str],
                 verdict: dict[str, Any], out: Path) -> list[Path]:
    """``table.md``, ``table.csv`` (one row per workload × policy) and ``rows.json``."""
    out.mkdir(parents=True, exist_ok=True)
    md = [f"## {titles[wl]}\n\n{format_table(rows)}\n" for wl, rows in per_workload.items()]
    md.append(f"Goal met: {'yes' if verdict['met'] else 'no'} "
              f"(Pareto-dominates the tuned heuristic: {verdict['pareto_dominates']}; "
              f"gap closed: { {k: round(v, 3) for k, v in verdict['gap_closed'].items()} }, "
              f"goal >= {verdict['gap_goal']:.0%} on one workload)\n")
    paths = [out / "table.md", out / "table.csv", out / "rows.json"]
    paths[0].write_text("\n".join(md))
    flat = [{"workload": wl, **r} for wl, rows in per_workload.items() for r in rows]
    keys = list(dict.fromkeys(k for r in flat for k in r))
    with paths[1].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(flat)
    paths[2].write_text(json.dumps({"rows": per_workload, "goal": verdict}, indent=1,
                                   default=float))
    return paths


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_plot(per_workload: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """Energy vs SLA violation rate per policy, 95% CI error bars, the bound (and the
    offered-work reference) as lines."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(per_workload), figsize=(6 * len(per_workload), 4.5),
                             squeeze=False)
    for ax, (wl, rows) in zip(axes[0], per_workload.items(), strict=True):
        for r in rows:
            if r["policy"] == BOUND:
                ax.axvline(r["energy_kwh_mean"], color="k", ls="--",
                           label=f"clairvoyant bound ({r['energy_kwh_mean']:.1f} kWh)")
                continue
            if r["policy"] == OFFERED:
                ax.axvline(r["energy_kwh_mean"], color="0.4", ls=":",
                           label=f"offered-work reference ({r['energy_kwh_mean']:.1f} kWh)")
                continue
            ax.errorbar(r["energy_kwh_mean"], 100 * r["sla_violation_rate_mean"],
                        xerr=r["energy_kwh_ci95"], yerr=100 * r["sla_violation_rate_ci95"],
                        fmt="o", capsize=3, label=r["policy"])
        _label(ax, wl, "energy per episode (kWh)", "SLA violation rate (%)")
    return _save(plt, fig, path)


def learning_curves(curves: dict[str, dict[str, Any]], path: Path) -> Path:
    """Training return vs env steps and validation reward of each candidate checkpoint."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), squeeze=False)
    for ax, (wl, c) in zip(axes[0], curves.items(), strict=True):
        hist = [h for h in c["history"] if "episode_return_mean" in h]
        if hist:
            ax.plot([h["env_steps"] for h in hist],
                    [h["episode_return_mean"] / c["reward_scale"] for h in hist],
                    label="train episodes (return / reward_scale)")
        val = c["validation"]
        if val:
            ax.errorbar([v["env_steps"] for v in val], [v["reward_mean"] for v in val],
                        yerr=[v["reward_ci95"] for v in val], fmt="s", capsize=3,
                        label="validation seeds (candidates)")
        if c.get("tuned_validation_reward") is not None:
            ax.axhline(c["tuned_validation_reward"], color="k", ls=":",
                       label="tuned heuristic, validation")
        _label(ax, wl, "env steps", "episode reward")
    return _save(plt, fig, path)


def _label(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
