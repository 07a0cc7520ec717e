"""The demo's scenario part: a committed learned policy, live, against the best
non-learned schedulers on one headline scenario.

:func:`run_scenario_demo` loads ``checkpoints/<scenario>/`` (the policy ``cloudrl headline
--scenario`` published, with the tuned heuristic's and MPC's parameters beside it in
``references.json``), plays it, the tuned signal-aware heuristic, the tuned forecast MPC
and the clairvoyant oracle on the held-out test seeds (paired by seed), and returns the
table: cost, kgCO2, kWh, SLA violation rate per class, and every policy's paired
difference to the heuristic with its 95% interval. The online policies are sorted by
mean cost (so the learned row comes first where it is the cheapest), the oracle last: it
knows the future and is a reference, not a policy. :func:`verdict` says in plain words
whether the learned policy wins, and by what. The picture is one two-day test episode:
price and carbon, each policy's grid draw, and when deferrable work ran.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.protocol import test_seeds
from cloudrl.scenarios.runner import ControllerSpec, checkpoint_kind, paired_ci, run_controllers
from envs.scenario.catalog import load_scenario

DEFAULT_SCENARIO = "scarcity_spikes"
REFERENCES = "references.json"
ORACLE = "oracle (clairvoyant)"
_REPO = Path(__file__).resolve().parents[2]


@dataclass
class ScenarioDemo:
    scenario: str
    checkpoint: str
    n_seeds: int
    rows: list[dict[str, Any]]
    learned: dict[str, Any]  # the learned policy's paired differences (vs heuristic, MPC)
    picture: str | None = None
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def find_checkpoint(scenario: str, checkpoint: str | None = None) -> Path:
    """``checkpoint``, else ``checkpoints/<scenario>`` here or in the source tree; a
    ValueError naming what is missing."""
    if checkpoint:
        path = Path(checkpoint)
    else:
        here = Path("checkpoints") / scenario
        path = here if here.is_dir() else _REPO / "checkpoints" / scenario
    if not path.is_dir():
        raise ValueError(f"demo: no checkpoint directory {path} (publish one with `cloudrl "
                         f"headline --scenario {scenario} --publish checkpoints/{scenario}`)")
    if not (path / REFERENCES).is_file():
        raise ValueError(f"demo: {path} has no {REFERENCES} (the tuned heuristic's and MPC's "
                         f"parameters that `cloudrl headline --publish` writes)")
    return path


def _row(name: str, res: list[dict], heur: np.ndarray, base: float) -> dict[str, Any]:
    cost = np.array([m["cost_usd"] for m in res], float)
    half = paired_ci(cost, np.zeros_like(cost))[2] - float(cost.mean())
    row = {"policy": name, "cost_usd": float(cost.mean()), "cost_ci": half}
    for k in ("carbon_kg", "energy_kwh", "sla_lc", "sla_batch"):
        row[k] = float(np.mean([m[k] for m in res]))
    if name != "heuristic (tuned)":
        d, lo, hi = paired_ci(cost, heur)
        row["vs_heuristic_pct"] = [100 * d / base, 100 * lo / base, 100 * hi / base]
    if any("decide_p50_ms" in m for m in res):
        row["time"] = f"decides {np.median([m['decide_p50_ms'] for m in res]):.1f} ms p50"
    elif any("solve_p50_ms" in m for m in res):
        row["time"] = f"solves {np.median([m['solve_p50_ms'] for m in res]):.1f} ms p50"
    return row


def run_scenario_demo(scenario: str = DEFAULT_SCENARIO, checkpoint: str | None = None,
                      n_seeds: int = 50, workers: int | None = None,
                      picture: str | Path | None = None) -> ScenarioDemo:
    t0 = time.perf_counter()
    scn = load_scenario(scenario)
    path = find_checkpoint(scenario, checkpoint)
    refs = json.loads((path / REFERENCES).read_text())
    kind = checkpoint_kind(str(path))
    specs = [ControllerSpec(kind, {"checkpoint": str(path)}, "learned"),
             ControllerSpec("signal_aware", refs.get("signal_aware", {}), "heuristic (tuned)"),
             ControllerSpec("mpc", refs.get("mpc", {}), "forecast MPC (tuned)"),
             ControllerSpec("oracle", {}, ORACLE)]
    seeds = list(test_seeds(n_seeds))
    res = run_controllers(scn, specs, seeds, workers, desc="demo episodes")
    by = {s.name: r for s, r in zip(specs, res, strict=True)}
    heur = np.array([m["cost_usd"] for m in by["heuristic (tuned)"]], float)
    base = float(heur.mean())
    rows = [_row(s.name, by[s.name], heur, base) for s in specs]
    online = sorted((r for r in rows if r["policy"] != ORACLE), key=lambda r: r["cost_usd"])
    rows = online + [r for r in rows if r["policy"] == ORACLE]
    ell = np.array([m["cost_usd"] for m in by["learned"]], float)
    mpc = np.array([m["cost_usd"] for m in by["forecast MPC (tuned)"]], float)
    d_m, lo_m, hi_m = paired_ci(ell, mpc)
    learned = {"vs_heuristic_pct": next(r for r in rows if r["policy"] == "learned")
               ["vs_heuristic_pct"],
               "vs_mpc_pct": [100 * d_m / base, 100 * lo_m / base, 100 * hi_m / base]}
    out = ScenarioDemo(scenario, str(path), n_seeds, rows, learned,
                       notes=[f"parameters of the heuristic and the MPC: {path / REFERENCES} "
                              f"({refs.get('source', 'no source given')})"])
    if picture:
        from cloudrl.scenarios.report import plot_episode

        out.picture = str(plot_episode(scn, specs, seeds[0], picture))
    out.wall_s = time.perf_counter() - t0
    return out


def _ci(v: list[float]) -> str:
    return f"{v[0]:+.1f}% [{v[1]:+.1f}, {v[2]:+.1f}]"


def format_table(demo: ScenarioDemo, markdown: bool = False) -> str:
    """The rows as a console table, or as Markdown for the docs."""
    head = ("policy", "cost $", "kgCO2", "kWh", "SLA latency-critical", "SLA batch",
            "vs heuristic (paired 95% CI)", "time per decision")
    cells = []
    for r in demo.rows:
        cells.append((r["policy"], f"{r['cost_usd']:.2f} ± {r['cost_ci']:.2f}",
                      f"{r['carbon_kg']:.1f}", f"{r['energy_kwh']:.1f}",
                      f"{100 * r['sla_lc']:.3f}%", f"{100 * r['sla_batch']:.3f}%",
                      _ci(r["vs_heuristic_pct"]) if "vs_heuristic_pct" in r else "",
                      r.get("time", "")))
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        return "\n".join(lines)
    width = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}s}}" for i, w in enumerate(width))
    return "\n".join([fmt.format(*head), "-" * (sum(width) + 2 * (len(width) - 1))]
                     + [fmt.format(*c) for c in cells])


def verdict(demo: ScenarioDemo) -> str:
    """Whether the learned policy wins, in plain words, with its paired intervals."""
    vh, vm = demo.learned["vs_heuristic_pct"], demo.learned["vs_mpc_pct"]
    if vh[2] < 0:
        h = f"beats the tuned heuristic ({_ci(vh)}, the interval entirely below 0)"
    elif vh[0] < 0:
        h = f"is cheaper than the tuned heuristic on average but not significantly ({_ci(vh)})"
    else:
        h = f"does not beat the tuned heuristic ({_ci(vh)})"
    if vm[2] < 0:
        m = f"and beats the forecast MPC ({_ci(vm)})"
    elif vm[1] > 0:
        m = f"and is significantly more expensive than the forecast MPC ({_ci(vm)})"
    else:
        m = f"and is not distinguishable from the forecast MPC ({_ci(vm)})"
    out = (f"On {demo.n_seeds} test seeds of {demo.scenario}, the learned policy "
           f"({demo.checkpoint}) {h}, {m}; differences in % of the heuristic's cost.")
    cost = {r["policy"]: r["cost_usd"] for r in demo.rows}
    if ORACLE in cost and "learned" in cost and cost["learned"] < cost[ORACLE]:
        out += (f" It also costs less than the oracle (${cost['learned']:.2f} against "
                f"${cost[ORACLE]:.2f}): the oracle replays one plan made on the real future "
                f"through the simulator, so it is a reference, not a lower bound.")
    return out
