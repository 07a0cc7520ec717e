"""Segments from the scenarios (time-varying price and carbon, two job classes, power
states with boot times): controllers run on a scenario's simulator, every tick recorded.

Per tick: ``grid_kw`` (grid draw after on-site solar) and ``solar_kw`` (when the site has
panels), ``price`` ($/MWh), ``carbon`` (gCO2/kWh), ``queue:<class>`` (cores of work
waiting, latency-critical ``lc`` and deferrable ``batch``), ``sla:<class>`` (violations)
and ``servers:<state>`` (active, waking, suspended, off). The summary adds the
scenario's own dollar cost. A controller is any kind ``cloudrl.scenarios`` runs
(``run_at_once``, ``signal_aware``, ``mpc``, ...).

These segments carry no cluster-env observations (the scenario env observes a signal
vector), so operators label them and quality control counts them, but the export to the
reward model's pair dataset skips them (``no_observations``) until a reward model reads
scenario observations.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cloudrl.labelling.segments import EnvMeta, SegmentRecord, make_view

CLASS_NAMES = ("lc", "batch")
STATES = {"active": (0,), "waking": (3, 4), "suspended": (1,), "off": (2,)}


def record_scenario(scenario: str, controller: str, seed: int,
                    overrides: dict | None = None) -> tuple[dict[str, np.ndarray], float,
                                                             EnvMeta]:
    """Per-tick series of one episode of ``controller`` on ``scenario``; its cost; meta."""
    from cloudrl.scenarios.runner import ControllerSpec
    from envs.scenario.catalog import load_scenario
    from envs.scenario.sim import ScenarioSim

    cfg = load_scenario(scenario, overrides)
    sim = ScenarioSim(cfg)
    ctrl = ControllerSpec(controller).build()
    sim.reset(int(seed))
    ctrl.reset(sim)
    hours = cfg.tick_seconds / 3600.0
    rows: dict[str, list[float]] = {}
    sig = sim.signals
    solar = float(np.max(sig.solar_kw[:sim.n_ticks])) > 0

    def put(name: str, value: float) -> None:
        rows.setdefault(name, []).append(float(value))

    while not sim.done:
        if sim.t % cfg.decision_ticks == 0:
            sim.set_controls(*ctrl.decide(sim))
        t = sim.t
        tc = sim.tick()
        put("grid_kw", tc.grid_kwh / hours)
        if solar:
            put("solar_kw", sig.solar_kw[t])
        put("price", sig.price_usd_per_mwh[t])
        put("carbon", sig.carbon_g_per_kwh[t])
        for name, value in zip(CLASS_NAMES, sim.queued_cores_by_class(), strict=True):
            put(f"queue:{name}", value)
        for name, value in zip(CLASS_NAMES, tc.violations, strict=True):
            put(f"sla:{name}", value)
        for state, codes in STATES.items():
            put(f"servers:{state}", np.isin(sim.state, codes).sum())
        put("cost_usd", tc.cost_usd)
    meta = EnvMeta(peak_kw=0.0, queue_capacity=0, tick_seconds=cfg.tick_seconds,
                   n_tiers=0, scenario=cfg.name)
    return {k: np.asarray(v) for k, v in rows.items()}, float(sim.stats.cost_usd), meta


def scenario_segments(scenario: str, controllers: Sequence[str], seeds: Sequence[int],
                      length: int, stride: int | None = None,
                      overrides: dict | None = None) -> list[SegmentRecord]:
    """Segments of ``length`` ticks every ``stride`` ticks, per controller and seed."""
    from cloudrl.protocol import TRAIN_SEEDS

    if length < 1:
        raise ValueError(f"segment_length: {length} < 1")
    bad = [s for s in seeds if s not in TRAIN_SEEDS]
    if bad:
        raise ValueError(f"seeds: {bad[0]} is not a train seed (0..{len(TRAIN_SEEDS) - 1}); "
                         "test seeds stay held out")
    out = []
    for controller in controllers:
        for seed in seeds:
            series, _, meta = record_scenario(scenario, controller, seed, overrides)
            n = len(series["grid_kw"])
            if n < length:
                raise ValueError(f"segment_length: {length} ticks is longer than the "
                                 f"{scenario} episode ({n} ticks)")
            for start in range(0, n - length + 1, stride or length):
                cut = {k: v[start:start + length] for k, v in series.items()}
                cost = float(cut.pop("cost_usd").sum())
                view = make_view(series={k: [round(float(x), 4) for x in v]
                                         for k, v in cut.items()},
                                 meta=meta, policy=controller, source="scenario", seed=seed,
                                 start=start)
                view["summary"]["cost_usd"] = round(cost, 4)
                view["units"] = {"queue": "cores"}
                key = f"scn:{meta.scenario}:{controller}:{seed}:{start}:{length}"
                out.append(SegmentRecord(key=key, view=view))
    return out
