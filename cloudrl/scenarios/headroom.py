"""Headroom of a scenario: tuned heuristic vs forecast MPC vs clairvoyant oracle.

On the held-out test seeds, paired by seed: the tuned signal-aware heuristic's cost, the
forecast MPC's (no future knowledge) and the oracle's (an achievable replayed schedule),
the heuristic -> oracle gap and the heuristic -> MPC gain in % of the heuristic's mean
cost with 95% t-intervals, and the MPC's mean solve time per re-plan. A scenario is a
*headline scenario* when the MPC gains at least 2% with the interval's lower end above 0
and the oracle leaves at least 5%.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloudrl.protocol import test_seeds
from cloudrl.scenarios.runner import ControllerSpec, paired_ci, run_controllers
from cloudrl.scenarios.tuning import tune
from envs.scenario.config import ScenarioConfig

GATE_MPC_PCT = 2.0
GATE_ORACLE_PCT = 5.0
METRICS = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "energy_kwh", "carbon_kg",
           "sla_lc", "sla_batch")


@dataclass
class HeadroomRow:
    name: str
    n_seeds: int
    heuristic_cost: float
    mpc_cost: float
    oracle_cost: float
    gap_pct: float
    gap_ci95: list[float]
    mpc_gain_pct: float
    mpc_gain_ci95: list[float]
    mpc_solve_s: float
    run_at_once_cost: float
    passes_gate: bool
    heuristic_params: dict[str, Any]
    mpc_params: dict[str, Any]
    means: dict[str, dict[str, float]] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def measure(cfg: ScenarioConfig, n_seeds: int = 50, tune_samples: int = 16,
            tune_seeds: int = 10, mpc_samples: int = 4, workers: int | None = None
            ) -> HeadroomRow:
    t0 = time.perf_counter()
    heur = tune(cfg, "signal_aware", tune_samples, tune_seeds, workers=workers)
    mpc = tune(cfg, "mpc", mpc_samples, tune_seeds, workers=workers) if mpc_samples > 1 \
        else None
    specs = [ControllerSpec("signal_aware", heur.params, "heuristic"),
             ControllerSpec("mpc", mpc.params if mpc else {}, "mpc"),
             ControllerSpec("oracle", {}, "oracle"),
             ControllerSpec("run_at_once", {}, "run_at_once")]
    res = run_controllers(cfg, specs, list(test_seeds(n_seeds)), workers, desc="test episodes")
    cost = {s.name: np.array([m["cost_usd"] for m in r]) for s, r in zip(specs, res, strict=True)}
    h = cost["heuristic"]
    base = float(h.mean())
    gap, glo, ghi = (100 * x / base for x in paired_ci(h, cost["oracle"]))
    gain, mlo, mhi = (100 * x / base for x in paired_ci(h, cost["mpc"]))
    solve = float(np.mean([m.get("solve_s", 0.0) for m in res[1]]))
    means = {s.name: {k: float(np.mean([m[k] for m in r])) for k in METRICS}
             for s, r in zip(specs, res, strict=True)}
    passes = gain >= GATE_MPC_PCT and mlo > 0 and gap >= GATE_ORACLE_PCT
    return HeadroomRow(cfg.name, n_seeds, base, float(cost["mpc"].mean()),
                       float(cost["oracle"].mean()), gap, [glo, ghi], gain, [mlo, mhi], solve,
                       float(cost["run_at_once"].mean()), bool(passes), heur.params,
                       mpc.params if mpc else {}, means, time.perf_counter() - t0)


def format_rows(rows: list[HeadroomRow]) -> str:
    head = (f"{'scenario':16s} {'N':>3s} {'heuristic $':>11s} {'MPC $':>9s} {'oracle $':>9s} "
            f"{'gap %':>17s} {'MPC gain %':>17s} {'solve s':>8s}  gate")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.name:16s} {r.n_seeds:3d} {r.heuristic_cost:11.2f} {r.mpc_cost:9.2f} "
            f"{r.oracle_cost:9.2f} {r.gap_pct:5.1f} [{r.gap_ci95[0]:4.1f},{r.gap_ci95[1]:4.1f}] "
            f"{r.mpc_gain_pct:5.1f} [{r.mpc_gain_ci95[0]:4.1f},{r.mpc_gain_ci95[1]:4.1f}] "
            f"{r.mpc_solve_s:8.4f}  {'PASS' if r.passes_gate else 'no'}")
    return "\n".join(lines)


def format_markdown(rows: list[HeadroomRow]) -> str:
    """The table as Markdown, for the docs (every number as measured)."""
    out = ["| scenario | test seeds | heuristic $ | MPC $ | oracle $ | run at once $ | "
           "heuristic→oracle gap % [95% CI] | heuristic→MPC gain % [95% CI] | MPC solve s | "
           "gate |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r.name} | {r.n_seeds} | {r.heuristic_cost:.2f} | {r.mpc_cost:.2f} | "
            f"{r.oracle_cost:.2f} | {r.run_at_once_cost:.2f} | {r.gap_pct:.1f} "
            f"[{r.gap_ci95[0]:.1f}, {r.gap_ci95[1]:.1f}] | {r.mpc_gain_pct:.1f} "
            f"[{r.mpc_gain_ci95[0]:.1f}, {r.mpc_gain_ci95[1]:.1f}] | {r.mpc_solve_s:.3f} | "
            f"{'**pass**' if r.passes_gate else 'no'} |")
    out += ["", "Mean cost terms per episode ($; kWh; SLA violation rate per class):", "",
            "| scenario | controller | energy $ | carbon $ | SLA $ | kWh | kgCO2 | SLA latency-"
            "critical | SLA batch |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for who, m in r.means.items():
            out.append(f"| {r.name} | {who} | {m['energy_usd']:.2f} | {m['carbon_usd']:.2f} | "
                       f"{m['sla_usd']:.2f} | {m['energy_kwh']:.1f} | {m['carbon_kg']:.1f} | "
                       f"{100 * m['sla_lc']:.3f}% | {100 * m['sla_batch']:.3f}% |")
    return "\n".join(out)
