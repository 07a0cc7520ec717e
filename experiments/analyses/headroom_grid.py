"""Where does online-reachable headroom come from? A grid over the scenario physics.

What it does: starting from one base scenario, it changes one physics knob at a time
(utilization, deferrable share, batch slack, forecast error, boot time, price shape,
on-site solar, carbon price) and, for every design, runs the headroom measurement of
``cloudrl scenarios headroom`` (tune the signal-aware heuristic on validation seeds, then
heuristic vs forecast MPC vs clairvoyant oracle on test seeds, paired by seed). Every
design is published, not only the ones that pass the gate.

How to run it::

    python -m experiments.analyses.headroom_grid --base price_peak --n-seeds 8 \
        --out docs/results/headroom_grid.json

Results to expect: a table, one row per design, with the MPC's gain and the oracle's gap
over the tuned heuristic in % of its cost and their 95% intervals (docs/results/
headroom.md holds the grid around scarcity_spikes and the machine it ran on, the notebook
page docs/notebook/headroom-2026-11.md the first grid, around price_peak).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from cloudrl.argparsing import CliParser
from cloudrl.scenarios.headroom import format_rows, measure
from envs.scenario.catalog import load_scenario

LC, BATCH = 0, 1


def designs(base: str) -> list[tuple[str, dict]]:
    """(label, overrides) pairs: the base, then one knob at a time."""
    cfg = load_scenario(base)
    classes = [c.model_dump() for c in cfg.classes]

    def share(batch_share: float) -> dict:
        c = [dict(classes[LC]), dict(classes[BATCH])]
        c[LC]["load_share"], c[BATCH]["load_share"] = 1 - batch_share, batch_share
        return {"classes": c}

    def slack(hours: float) -> dict:
        c = [dict(classes[LC]), dict(classes[BATCH])]
        c[BATCH]["slack_min"] = hours * 60.0
        return {"classes": c}

    out: list[tuple[str, dict]] = [("base", {})]
    out += [(f"utilization {u}", {"utilization": u}) for u in (0.4, 0.7)]
    out += [(f"batch share {s}", share(s)) for s in (0.3,)]
    out += [(f"batch slack {h} h", slack(h)) for h in (4.0, 16.0)]
    out += [(f"forecast error {e}", {"signals": {"forecast_error": e},
                                     "load_forecast_error": e}) for e in (0.0, 0.5)]
    out += [(f"boot {s} s", {"power": {"boot_seconds": s}}) for s in (900.0,)]
    out += [("flat price", {"signals": {"price_daily_amplitude": 0.0,
                                        "price_spikes_per_day": 0.0}})]
    out += [("solar 12 kWp", {"signals": {"solar_kwp": 12.0, "solar_source": "synthetic"}})]
    out += [("carbon price 250 $/t", {"cost": {"carbon_usd_per_tonne": 250.0}})]
    out += [("DR events 1/day x20", {"signals": {"price_spikes_per_day": 1.0,
                                                 "price_spike_factor": 20.0,
                                                 "forecast_error": 0.1}})]
    out += [("real DE carbon 150 $/t", {"signals": {"source": "de_carbon_2020"},
                                        "cost": {"carbon_usd_per_tonne": 150.0}})]
    out += [("utilization 0.7 slack 16 h", {"utilization": 0.7, **slack(16.0)})]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = CliParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="price_peak")
    ap.add_argument("--n-seeds", type=int, default=6)
    ap.add_argument("--tune-samples", type=int, default=6)
    ap.add_argument("--tune-seeds", type=int, default=4)
    ap.add_argument("--only", help="comma-separated design labels to run (default: all)")
    ap.add_argument("--out", default="results/headroom_grid.json")
    ap.add_argument("--markdown", help="also write the grid as a Markdown table here")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = json.loads(out.read_text())["designs"] if out.exists() else []
    have = {d["design"] for d in done}
    wanted = set(args.only.split(",")) if args.only else None
    t0 = time.perf_counter()
    for label, over in designs(args.base):
        if label in have or (wanted and label not in wanted):
            continue
        cfg = load_scenario(args.base, over)
        row = measure(cfg, n_seeds=args.n_seeds, tune_samples=args.tune_samples,
                      tune_seeds=args.tune_seeds, mpc_samples=1)
        row.name = label[:16]
        print(format_rows([row]).splitlines()[-1], f" {row.wall_s:.0f} s", flush=True)
        done.append({"design": label, "overrides": over, **row.to_json()})
        out.write_text(json.dumps({"base": args.base, "n_seeds": args.n_seeds,
                                   "tune_samples": args.tune_samples,
                                   "tune_seeds": args.tune_seeds, "designs": done}, indent=1))
    print(f"{len(done)} designs in {out} ({time.perf_counter() - t0:.0f} s)")
    if args.markdown:
        Path(args.markdown).write_text(markdown(done) + "\n")
    return 0


def markdown(rows: list[dict]) -> str:
    """The grid as a Markdown table (every design, pass or not)."""
    out = ["| design | heuristic $ | MPC $ | oracle $ | MPC gain % [95% CI] | "
           "oracle gap % [95% CI] | gate |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['design']} | {r['heuristic_cost']:.2f} | {r['mpc_cost']:.2f} | "
                   f"{r['oracle_cost']:.2f} | {r['mpc_gain_pct']:.1f} "
                   f"[{r['mpc_gain_ci95'][0]:.1f}, {r['mpc_gain_ci95'][1]:.1f}] | "
                   f"{r['gap_pct']:.1f} [{r['gap_ci95'][0]:.1f}, {r['gap_ci95'][1]:.1f}] | "
                   f"{'pass' if r['passes_gate'] else 'no'} |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
