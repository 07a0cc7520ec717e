"""Speed of a real site's runs: headroom on the test windows and ``sites train``, against a
reference measured in the same run.

Run::

    python -m experiments.benchmarks.bench_sites --raw results/sites/de_lu-temporal-learned.json

Reads the wall seconds a ``cloudrl sites train`` raw result recorded (its headroom part:
tuning, selection and the heuristic, MPC and fluid oracle on every test window; its training
part: distillation, ES, selection and the learned policy on every test window), and times
here, now, the reference: one episode of the site's heuristic on the first test window, and
one of each controller on ``--windows`` windows (heuristic, MPC, fluid oracle, learned), so
that the headroom's per-window cost can be re-timed at today's load and extrapolated to the
run's windows (said so in the table). Ratios to the reference episode compare across
machines and loads; the issue's targets are headroom <= 20 min and the site headline <= 60
min on 2 cores. Then the decide time per decision (p50, p99) of the heuristic, the MPC and
the learned policy on one episode, the heuristic's the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def decide_ms(site, split: str, window, spec) -> list[float]:
    """Wall milliseconds of every decision ``spec``'s controller makes in one episode of
    ``window`` (in process, one core)."""
    from cloudrl.sites.scenario import site_scenario
    from envs.scenario.sim import ScenarioSim

    cfg = site_scenario(site, split, "test", start_date=window.start_date, carbon_model="gbt")
    sim = ScenarioSim(cfg)
    ctrl = spec.build()
    sim.reset(window.seed)
    ctrl.reset(sim)
    out = []
    while not sim.done:
        if sim.t % cfg.decision_ticks == 0:
            t = time.perf_counter()
            controls = ctrl.decide(sim)
            out.append(1000.0 * (time.perf_counter() - t))
            sim.set_controls(*controls)
        sim.tick()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--raw", required=True, help="a cloudrl sites train --out JSON")
    p.add_argument("--windows", type=int, default=2,
                   help="test windows re-timed per controller here (default 2)")
    args = p.parse_args(argv)
    raw = json.loads(Path(args.raw).read_text())
    if "train" not in raw:
        raise SystemExit(f"bench_sites: {args.raw}: not a 'cloudrl sites train' result")
    from cloudrl.scenarios.runner import ControllerSpec
    from cloudrl.sites.headroom import ORACLE, _window_item
    from cloudrl.sites.registry import get_site
    from cloudrl.sites.splits import Window

    site = get_site(raw["site"])
    sel = raw["selection"]
    kind = sel["selected"]
    specs = [ControllerSpec(kind, sel["tuned"][kind]["params"], "heuristic"),
             ControllerSpec("mpc", {}, "mpc"), ORACLE,
             ControllerSpec("learned", {"checkpoint": raw["train"]["checkpoint"]}, "learned")]
    windows = [Window(**w) for w in raw["windows"]]
    print(f"load average at the start: {_load()} ({os.cpu_count()} CPUs)")
    _window_item((site, raw["split"], windows[0], specs[0], "gbt"))  # caches, imports
    t = time.perf_counter()
    _window_item((site, raw["split"], windows[0], specs[0], "gbt"))
    ref = time.perf_counter() - t
    per = {}
    for s in specs:
        t = time.perf_counter()
        for w in windows[:args.windows]:
            _window_item((site, raw["split"], w, s, "gbt"))
        per[s.name] = (time.perf_counter() - t) / args.windows
    n = len(windows)
    tw = raw["train"]["wall_s"]
    head_recorded = raw["wall_s"] - tw["test"]  # measure() adds the learned test to it
    head_now = n * sum(per[k] for k in ("heuristic", "mpc", "fluid oracle"))
    rows = [
        ("reference: 1 heuristic episode (here, now)", ref, "measured"),
        (f"headroom, {n} windows: recorded ({raw['size']['workers']} workers, with tuning)",
         head_recorded, "recorded in the raw result"),
        (f"headroom, {n} windows x 3 controllers: re-timed on {args.windows}, x{n}",
         head_now, f"extrapolated from {args.windows} windows, 1 worker"),
        (f"sites train: distil + ES ({raw['train']['workers']} worker)", tw["train"],
         "recorded"),
        ("sites train: selection on validation", tw["select"], "recorded"),
        (f"sites train: learned on {n} test windows", tw["test"], "recorded"),
        ("sites train: total", tw["total"], "recorded"),
    ]
    print(f"{raw['site']} {raw['split']}: {n} test windows; per window here, now: " +
          ", ".join(f"{k} {v:.2f} s" for k, v in per.items()))
    print(f"{'run':68s} {'wall s':>8s} {'min':>6s} {'x ref':>7s}  source")
    for name, s, how in rows:
        print(f"{name:68s} {s:8.1f} {s / 60:6.1f} {s / ref:7.0f}  {how}")
    import numpy as np

    print("decide ms per decision, one episode of the first test window (in process):")
    for spec in (specs[0], specs[1], specs[3]):
        ms = decide_ms(site, raw["split"], windows[0], spec)
        print(f"  {spec.name:10s} p50 {np.percentile(ms, 50):7.2f}  p99 "
              f"{np.percentile(ms, 99):7.2f}  ({len(ms)} decisions)")
    print(f"load average at the end: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
