"""What the headroom command leaves behind: an MLflow run per scenario (every cost term of
every controller) and a picture of one episode (signal, grid draw of each controller, when
deferrable work ran)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.scenarios.headroom import HeadroomRow
from cloudrl.scenarios.runner import ControllerSpec
from envs.scenario.config import ScenarioConfig
from envs.scenario.sim import ScenarioSim


def log_to_mlflow(row: HeadroomRow, tracking_uri: str | None,
                  experiment: str = "cloudrl-scenarios") -> str:
    """One MLflow run for ``row``: the gate numbers, each controller's mean cost terms and
    the tuned parameters. Returns the run id."""
    from cloudrl import tracking

    client, run_id = tracking.open_run(tracking_uri, experiment, f"headroom-{row.name}",
                                       {"scenario": row.name, "kind": "headroom"})
    with tracking.finishing(client, run_id):
        tracking.log_params(client, run_id, {"n_seeds": row.n_seeds,
                                             "heuristic": row.heuristic_params,
                                             "mpc": row.mpc_params})
        metrics: dict[str, float] = {
            "gap_pct": row.gap_pct, "mpc_gain_pct": row.mpc_gain_pct,
            "mpc_solve_s": row.mpc_solve_s, "passes_gate": float(row.passes_gate)}
        for who, means in row.means.items():
            metrics.update({f"{who}.{k}": v for k, v in means.items()})
        tracking.log_metrics(client, run_id, metrics)
    return run_id


def episode_traces(cfg: ScenarioConfig, specs: list[ControllerSpec], seed: int
                   ) -> dict[str, Any]:
    """Per-tick grid draw (kW) and busy batch cores of each controller on one seed."""
    sim = ScenarioSim(cfg)
    out: dict[str, Any] = {}
    for spec in specs:
        ctrl = spec.build()
        sim.reset(seed)
        ctrl.reset(sim)
        grid, batch = [], []
        while not sim.done:
            if sim.t % cfg.decision_ticks == 0:
                sim.set_controls(*ctrl.decide(sim))
            tc = sim.tick()
            grid.append(tc.grid_kwh * 3600.0 / cfg.tick_seconds)
            batch.append(sim.running_profile(1)[1, 0])
        out[spec.name] = {"grid_kw": np.array(grid), "batch_cores": np.array(batch),
                          "cost_usd": sim.stats.cost_usd}
    out["_signals"] = sim.signals
    out["_n"] = sim.n_ticks
    return out


def plot_episode(cfg: ScenarioConfig, specs: list[ControllerSpec], seed: int,
                 path: str | Path) -> Path:
    """The picture: price and carbon; grid draw per controller; busy batch cores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr = episode_traces(cfg, specs, seed)
    sig, n = tr["_signals"], tr["_n"]
    hours = np.arange(n) * cfg.tick_seconds / 3600.0
    fig, axes = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True)
    ax = axes[0]
    ax.plot(hours, sig.price_usd_per_mwh[:n], color="tab:red", label="price $/MWh")
    ax.set_ylabel("$/MWh")
    ax2 = ax.twinx()
    ax2.plot(hours, sig.carbon_g_per_kwh[:n], color="tab:green", label="carbon gCO2/kWh")
    ax2.set_ylabel("gCO2/kWh")
    if float(np.max(sig.solar_kw[:n])) > 0:
        ax2.plot(hours, sig.solar_kw[:n], color="tab:orange", label="solar kW")
    ax.set_title(f"{cfg.name}: one episode (seed {seed})")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    for spec in specs:
        t = tr[spec.name]
        axes[1].plot(hours, t["grid_kw"], lw=1, label=f"{spec.name} (${t['cost_usd']:.1f})")
        axes[2].plot(hours, t["batch_cores"], lw=1, label=spec.name)
    axes[1].set_ylabel("grid draw kW")
    axes[1].legend(fontsize=8, ncol=2)
    axes[2].set_ylabel("busy batch cores")
    axes[2].set_xlabel("hours")
    axes[2].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
