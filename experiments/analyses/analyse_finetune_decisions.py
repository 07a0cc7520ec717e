"""Which decisions the fine-tune on every weight changed, and where the money comes from.

The published scenario policy (``checkpoints/scarcity_spikes``) is a distilled MLP
(``<checkpoint>/start``, DAgger from the forecast MPC) fine-tuned by evolution strategies
on the true episode cost. Every decision period it picks a release level for held batch
work and a ready margin. This script measures, on held-out test seeds:

1. **Same observations.** It plays the fine-tuned policy exactly as ``cloudrl scenarios
   evaluate --checkpoint`` does (same observation, greedy action, controls; the episode
   costs equal that command's). At every decision it also asks the start policy and the
   MPC (tuned parameters from ``<checkpoint>/references.json``, its controls rounded to
   the policies' grid) what they would do on the same observation. Their answers do not
   touch the episode. It reports how often the fine-tune departs from the start, in which
   direction, and in which context: realised price spike or not (a tick is in a spike
   when its price is at least 2.5x the scenario's mean price; "before" and "after" are
   the 2 h next to one), the observed ``price_rank_24h`` quintile, the hour of the day
   and the held batch work (terciles of ``pool_work``).
2. **Own trajectories.** It plays the start policy and the MPC along their own episodes
   on the same seeds and gives, per context, each policy's mean controls, grid energy
   and the cost terms (energy, carbon, SLA $), per episode. The spike context is taken
   tick by tick (what each tick was billed at); the other contexts are those of the
   decision that set the period.

The price and time contexts depend only on the seed and the tick, so every policy is
binned on the same periods. Episodes run in ``--workers`` processes (default 1).

Run::

    python experiments/analyses/analyse_finetune_decisions.py --n-seeds 10 \\
        --json results/finetune_decisions/scarcity_spikes.json

Measured (docs/results/finetune-decisions.md; 10 test seeds, 32 s in one process on the
shared 2-core machine; 50 seeds 132 s): on the same observations the fine-tune picks
another release level in 18.4% of decisions and another ready margin in 6.9%. In the 2 h
before a spike it releases less (mean level 0.28 against the start's 0.34); in spikes it
acts as the start. Along its own episodes it buys 42.2 kWh in spike ticks for $34.00
against the start's 49.3 kWh for $39.63, and its SLA cost is $4.70 against $6.70.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.argparsing import CliParser

SPIKE_FACTOR = 2.5  # a tick is in a price spike at >= 2.5x the scenario's mean price
NEAR_HOURS = 2.0  # "before"/"after" a spike: within 2 h of a spike tick
SPIKE_BINS = ("spike", "before spike (<= 2 h)", "after spike (<= 2 h)", "calm")
RANK_BINS = ("0.0-0.2 (cheapest)", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1.0 (dearest)")
HOUR_BINS = ("00-04", "04-08", "08-12", "12-16", "16-20", "20-24")
POOL_BINS = ("low", "middle", "high")
GROUPS = {"spike": ("Realised price spike", SPIKE_BINS),
          "rank": ("Observed price rank in the next 24 h (price_rank_24h quintile)", RANK_BINS),
          "hour": ("Hour of day", HOUR_BINS),
          "pool": ("Held batch work (pool_work in fleet-hours, cut at the terciles of the "
                   "fine-tuned run)", POOL_BINS)}
POLICIES = ("finetuned", "start", "mpc")
COST_TERMS = ("grid_kwh", "energy_usd", "carbon_usd", "sla_usd")
# observation entries shown per spike context along each policy's own episode
STATE_FEATURES = ("frac_active", "committed", "batch_queued", "pool_work", "pool_due_4h",
                  "price_fc_4h")


# ---------------------------------------------------------------------- playing
def _net(path: str | Path) -> Any:
    """A checkpoint's controller; ``greedy_action`` decides as it does in an episode."""
    from cloudrl.algorithms.distill.policy import load_controller

    return load_controller(path)


class _Recorder:
    """Plays ``primary`` (a name in ``nets`` or ``"mpc"``) and asks every other policy it
    holds for its action on the same observation; records one row per decision."""

    name = "recorder"
    clairvoyant = False

    def __init__(self, primary: str, nets: dict[str, Any], mpc: Any | None,
                 levels: tuple[float, ...], margins: tuple[float, ...]) -> None:
        self.primary, self.nets, self.mpc = primary, nets, mpc
        self.levels, self.margins = levels, margins
        self.rows: list[dict[str, Any]] = []

    def reset(self, sim) -> None:
        self.rows = []
        if self.mpc is not None:
            self.mpc.reset(sim)

    def decide(self, sim) -> tuple[float, float]:
        from cloudrl.algorithms.distill.actions import action_controls, nearest_action
        from envs.scenario.control import plan_view
        from envs.scenario.env import observe

        v = plan_view(sim)
        obs = observe(sim, v)
        acts = {name: net.greedy_action(obs) for name, net in self.nets.items()}
        mpc_controls = None
        if self.mpc is not None:
            mpc_controls = self.mpc.decide_view(v)
            acts["mpc"] = nearest_action(v, *mpc_controls, self.levels, self.margins)
        if self.primary == "mpc":
            controls = mpc_controls
        else:
            net = self.nets[self.primary]
            controls = action_controls(v, acts[self.primary], net.release_levels, net.ready_margins)
        self.rows.append({"t": int(sim.t), "hour": float(sim.signals.hour_of_day(sim.t)),
                          "obs": obs, "acts": acts, "release_ctl": float(controls[0]),
                          "ready_frac": float(controls[1]) / v.fleet_cores})
        return controls


def _spike_context(price: np.ndarray, mean_price: float, ticks_per_hour: float) -> np.ndarray:
    """Per tick: 0 spike, 1 before a spike (<= NEAR_HOURS), 2 after one, 3 calm."""
    spike = price >= SPIKE_FACTOR * mean_price
    near = int(round(NEAR_HOURS * ticks_per_hour))
    idx = np.flatnonzero(spike)
    n = len(price)
    ctx = np.full(n, 3, dtype=np.int64)
    t = np.arange(n)
    if idx.size:
        nxt = np.searchsorted(idx, t, side="right")  # first spike tick after t
        ahead = np.where(nxt < idx.size, idx[np.minimum(nxt, idx.size - 1)] - t, n + near)
        prv = np.searchsorted(idx, t, side="left") - 1  # last spike tick before t
        behind = np.where(prv >= 0, t - idx[np.maximum(prv, 0)], n + near)
        ctx[behind <= near] = 2
        ctx[ahead <= near] = 1
    ctx[spike] = 0
    return ctx


def _play(sim, rec: _Recorder, seed: int) -> dict[str, Any]:
    """One episode, the loop of :func:`envs.scenario.control.run_episode` (same controls,
    same ticks), keeping each tick's cost terms."""
    sim.reset(seed)
    rec.reset(sim)
    d = sim.cfg.decision_ticks
    ticks: list[tuple[float, ...]] = []
    while not sim.done:
        if sim.t % d == 0:
            sim.set_controls(*rec.decide(sim))
        tc = sim.tick()
        ticks.append((tc.grid_kwh, tc.energy_usd, tc.carbon_usd, tc.sla_usd))
    cfg = sim.cfg
    n = len(ticks)
    ctx = _spike_context(np.asarray(sim.signals.price_usd_per_mwh[:n], dtype=float),
                         float(cfg.signals.price_mean_usd_per_mwh), cfg.ticks_per_hour)
    tick_arr = np.asarray(ticks, dtype=float).reshape(n, len(COST_TERMS))
    names = list(rec.nets) + (["mpc"] if rec.mpc is not None else [])
    rows = rec.rows
    from envs.scenario.env import OBS_NAMES

    col = {name: OBS_NAMES.index(name) for name in ("price_rank_24h", "pool_work")}
    return {
        "seed": seed, "metrics": sim.stats.summary(),
        "t": np.array([r["t"] for r in rows]), "hour": np.array([r["hour"] for r in rows]),
        "price": np.asarray(sim.signals.price_usd_per_mwh, dtype=float)[[r["t"] for r in rows]],
        "rank": np.array([float(r["obs"][col["price_rank_24h"]]) for r in rows]),
        "pool": np.array([float(r["obs"][col["pool_work"]]) for r in rows]),
        "obs": np.asarray([r["obs"] for r in rows], dtype=float),
        "release_ctl": np.array([r["release_ctl"] for r in rows]),
        "ready_frac": np.array([r["ready_frac"] for r in rows]),
        "rel": {p: np.array([r["acts"][p][0] for r in rows]) for p in names},
        "rdy": {p: np.array([r["acts"][p][1] for r in rows]) for p in names},
        "tick_ctx": ctx, "tick_costs": tick_arr, "decision_ticks": d,
    }


def _work(job: tuple) -> list[dict[str, dict[str, Any]]]:
    """Play the three trajectories of each seed of one chunk (one simulator)."""
    cfg, checkpoint, start, mpc_params, seeds = job
    from cloudrl.mpc.forecast_mpc import ForecastMPC, MPCConfig
    from envs.scenario.sim import ScenarioSim

    sim = ScenarioSim(cfg)
    ft, st = _net(checkpoint), _net(start)
    if ft.release_levels != st.release_levels or ft.ready_margins != st.ready_margins:
        raise ValueError(f"{checkpoint} and {start} act on different grids")
    grid = (ft.release_levels, ft.ready_margins)
    recs = {"finetuned": _Recorder("finetuned", {"finetuned": ft, "start": st},
                                   ForecastMPC(MPCConfig(**mpc_params)), *grid),
            "start": _Recorder("start", {"start": st}, None, *grid),
            "mpc": _Recorder("mpc", {}, ForecastMPC(MPCConfig(**mpc_params)), *grid)}
    return [{name: _play(sim, rec, seed) for name, rec in recs.items()} for seed in seeds]


def play_all(cfg, checkpoint: str, start: str, mpc_params: dict, seeds: list[int],
             workers: int = 1) -> list[dict[str, dict[str, Any]]]:
    """Per seed (in order): the fine-tuned, start and MPC trajectories."""
    workers = max(1, min(int(workers), 2, len(seeds)))
    jobs = [(cfg, str(checkpoint), str(start), dict(mpc_params), seeds[w::workers])
            for w in range(workers)]
    if workers == 1:
        parts = [_work(jobs[0])]
    else:  # Ray tasks, one per worker's share of the seeds (cloudrl.parallel)
        from cloudrl.parallel import ordered_map

        parts = ordered_map(_work, jobs, workers, desc="seed shares")
    by_seed = {res["finetuned"]["seed"]: res for part in parts for res in part}
    return [by_seed[s] for s in seeds]


# ---------------------------------------------------------------------- binning
def _cat(episodes: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.concatenate([e[key] for e in episodes])


def _bins(group: str, ep: dict[str, Any], pool_cuts: np.ndarray) -> np.ndarray:
    """Bin index of every decision of one episode for ``group``."""
    if group == "spike":
        return ep["tick_ctx"][ep["t"]]
    if group == "rank":
        return np.minimum((ep["rank"] * 5).astype(np.int64), 4)
    if group == "hour":
        return np.minimum((ep["hour"] // 4).astype(np.int64), 5)
    if group == "pool":
        return np.searchsorted(pool_cuts, ep["pool"], side="left")  # <= cut: lower bin
    raise ValueError(group)


def _tick_bins(group: str, ep: dict[str, Any], pool_cuts: np.ndarray) -> np.ndarray:
    """Bin index of every tick: its own spike context, else its period's decision bin."""
    if group == "spike":
        return ep["tick_ctx"]
    n = len(ep["tick_ctx"])
    period = np.minimum(np.arange(n) // ep["decision_ticks"], len(ep["t"]) - 1)
    return _bins(group, ep, pool_cuts)[period]


def _mean(x: np.ndarray) -> float | None:
    return float(np.mean(x)) if x.size else None


def summarise(runs: list[dict[str, dict[str, Any]]], levels: tuple[float, ...],
              margins: tuple[float, ...]) -> dict[str, Any]:
    """The tables (plain dicts) from :func:`play_all`'s episodes."""
    n_seeds = len(runs)
    lv, mg = np.asarray(levels), np.asarray(margins)
    ft_eps = [r["finetuned"] for r in runs]
    pool_cuts = np.quantile(_cat(ft_eps, "pool"), [1 / 3, 2 / 3])
    out: dict[str, Any] = {"n_seeds": n_seeds, "seeds": [r["finetuned"]["seed"] for r in runs],
                           "release_levels": list(levels), "ready_margins": list(margins),
                           "pool_cuts": [float(c) for c in pool_cuts]}
    # --- episode costs (own trajectories)
    keys = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "grid_kwh", "energy_kwh",
            "violations_lc", "violations_batch", "transitions")
    out["costs"] = {p: {k: float(np.mean([r[p]["metrics"][k] for r in runs])) for k in keys}
                    for p in POLICIES}
    out["per_seed_cost"] = {p: [float(r[p]["metrics"]["cost_usd"]) for r in runs]
                            for p in POLICIES}
    # --- same observations: the fine-tuned trajectory
    rel = {p: np.concatenate([e["rel"][p] for e in ft_eps]) for p in POLICIES}
    rdy = {p: np.concatenate([e["rdy"][p] for e in ft_eps]) for p in POLICIES}
    n_dec = int(rel["finetuned"].size)
    d_rel = rel["finetuned"] != rel["start"]
    d_rdy = rdy["finetuned"] != rdy["start"]
    price = _cat(ft_eps, "price")

    def share(mask: np.ndarray) -> float:
        return float(mask.mean()) if mask.size else 0.0

    out["decisions"] = n_dec
    out["disagreement"] = {
        "release_vs_start": share(d_rel), "ready_vs_start": share(d_rdy),
        "either_vs_start": share(d_rel | d_rdy),
        "release_lower_than_start": share(lv[rel["finetuned"]] < lv[rel["start"]]),
        "release_higher_than_start": share(lv[rel["finetuned"]] > lv[rel["start"]]),
        "ready_lower_than_start": share(mg[rdy["finetuned"]] < mg[rdy["start"]]),
        "ready_higher_than_start": share(mg[rdy["finetuned"]] > mg[rdy["start"]]),
        "release_start_vs_mpc": share(rel["start"] != rel["mpc"]),
        "ready_start_vs_mpc": share(rdy["start"] != rdy["mpc"]),
        "release_finetuned_vs_mpc": share(rel["finetuned"] != rel["mpc"]),
        "ready_finetuned_vs_mpc": share(rdy["finetuned"] != rdy["mpc"]),
        "mean_release": {p: _mean(lv[rel[p]]) for p in POLICIES},
        "mean_margin": {p: _mean(mg[rdy[p]]) for p in POLICIES},
    }
    nl, nm = len(levels), len(margins)
    out["release_crosstab"] = np.bincount(rel["start"] * nl + rel["finetuned"],
                                          minlength=nl * nl).reshape(nl, nl).tolist()
    out["margin_crosstab"] = np.bincount(rdy["start"] * nm + rdy["finetuned"],
                                         minlength=nm * nm).reshape(nm, nm).tolist()
    out["same_obs"], out["own"] = {}, {}
    for group, (_, labels) in GROUPS.items():
        if group == "pool":
            lo, hi = pool_cuts
            labels = (f"low (<= {lo:.2f})", f"middle ({lo:.2f}-{hi:.2f}]", f"high (> {hi:.2f})")
        b = np.concatenate([_bins(group, e, pool_cuts) for e in ft_eps])
        rows = []
        for k, label in enumerate(labels):
            m = b == k
            rows.append({
                "bin": label, "decisions": int(m.sum()), "share": share(m),
                "release_differs": _mean(d_rel[m]), "share_of_release_changes":
                    float(d_rel[m].sum() / max(d_rel.sum(), 1)),
                "ready_differs": _mean(d_rdy[m]), "share_of_ready_changes":
                    float(d_rdy[m].sum() / max(d_rdy.sum(), 1)),
                "release": {p: _mean(lv[rel[p][m]]) for p in POLICIES},
                "margin": {p: _mean(mg[rdy[p][m]]) for p in POLICIES},
                "mean_price_usd_per_mwh": _mean(price[m])})
        out["same_obs"][group] = rows
        # --- own trajectories
        own_rows = [{"bin": label, "decisions": {}, "release": {}, "margin": {},
                     "ready_share": {}, **{c: {} for c in COST_TERMS}} for label in labels]
        for p in POLICIES:
            eps = [r[p] for r in runs]
            db = np.concatenate([_bins(group, e, pool_cuts) for e in eps])
            prel = lv[np.concatenate([e["rel"][p] for e in eps])]
            prdy = mg[np.concatenate([e["rdy"][p] for e in eps])]
            pready = _cat(eps, "ready_frac")
            tb = np.concatenate([_tick_bins(group, e, pool_cuts) for e in eps])
            tc = np.concatenate([e["tick_costs"] for e in eps])
            for k, row in enumerate(own_rows):
                m = db == k
                row["decisions"][p] = int(m.sum())
                row["release"][p] = _mean(prel[m])
                row["margin"][p] = _mean(prdy[m])
                row["ready_share"][p] = _mean(pready[m])
                for j, c in enumerate(COST_TERMS):
                    row[c][p] = float(tc[tb == k, j].sum() / n_seeds)
        out["own"][group] = own_rows
    from envs.scenario.env import OBS_NAMES

    cols = [OBS_NAMES.index(f) for f in STATE_FEATURES]
    out["state_by_spike"] = []
    per_policy = {p: (np.concatenate([_bins("spike", r[p], pool_cuts) for r in runs]),
                      np.concatenate([r[p]["obs"][:, cols] for r in runs])) for p in POLICIES}
    for k, label in enumerate(SPIKE_BINS):
        row: dict[str, Any] = {"bin": label}
        for j, f in enumerate(STATE_FEATURES):
            row[f] = {p: _mean(per_policy[p][1][per_policy[p][0] == k, j]) for p in POLICIES}
        out["state_by_spike"].append(row)
    return out


def analyse(cfg, checkpoint: str | Path, start: str | Path, mpc_params: dict,
            seeds: list[int], workers: int = 1) -> dict[str, Any]:
    """Play and summarise (the script's core); ``result["runs"]`` keeps the episodes."""
    runs = play_all(cfg, str(checkpoint), str(start), mpc_params, list(seeds), workers)
    net = _net(checkpoint)
    res = summarise(runs, net.release_levels, net.ready_margins)
    from envs.scenario.env import OBS_NAMES

    res["obs_mean_finetuned"] = dict(zip(OBS_NAMES, np.concatenate(
        [r["finetuned"]["obs"] for r in runs]).mean(axis=0).tolist(), strict=True))
    res["runs"] = runs
    return res


# ---------------------------------------------------------------------- printing
def _f(x: float | None, fmt: str = ".2f") -> str:
    return "" if x is None else format(x, fmt)


def _trio(d: dict[str, float | None], fmt: str = ".2f") -> str:
    return " / ".join(_f(d[p], fmt) for p in POLICIES)


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def report(res: dict[str, Any]) -> str:
    """The markdown tables of one :func:`analyse` result."""
    out = []
    c = res["costs"]
    out.append(f"### Episode cost, own trajectories (mean per episode, {res['n_seeds']} "
               f"seeds)\n")
    out.append(_table(
        ["policy", "cost $", "energy $", "carbon $", "SLA $", "grid kWh", "LC violations",
         "batch violations", "power transitions"],
        [[p, *(_f(c[p][k]) for k in ("cost_usd", "energy_usd", "carbon_usd", "sla_usd",
                                     "grid_kwh", "violations_lc", "violations_batch")),
          _f(c[p]["transitions"], ".0f")] for p in POLICIES]))
    d = res["disagreement"]
    pct = lambda x: _f(100 * x, ".1f")  # noqa: E731
    out.append(f"\n### Same observations: the fine-tuned trajectory ({res['decisions']} "
               f"decisions)\n")
    out.append(_table(
        ["", "release level", "ready margin"],
        [["fine-tune differs from start %", pct(d["release_vs_start"]),
          pct(d["ready_vs_start"])],
         ["fine-tune lower than start %", pct(d["release_lower_than_start"]),
          pct(d["ready_lower_than_start"])],
         ["fine-tune higher than start %", pct(d["release_higher_than_start"]),
          pct(d["ready_higher_than_start"])],
         ["start differs from MPC (rounded) %", pct(d["release_start_vs_mpc"]),
          pct(d["ready_start_vs_mpc"])],
         ["fine-tune differs from MPC (rounded) %", pct(d["release_finetuned_vs_mpc"]),
          pct(d["ready_finetuned_vs_mpc"])],
         ["mean: fine-tune / start / MPC", _trio(d["mean_release"], ".3f"),
          _trio(d["mean_margin"], ".3f")]]))
    out.append(f"\nEither control differs from the start: {pct(d['either_vs_start'])}% of "
               f"decisions.")
    for key, grid, name in (("release_crosstab", res["release_levels"], "release level"),
                            ("margin_crosstab", res["ready_margins"], "ready margin")):
        out.append(f"\n{name.capitalize()}: decisions by start's choice (rows) and the "
                   f"fine-tune's (columns), same observations\n")
        out.append(_table(["start (rows), fine-tune (columns)", *(f"{g:g}" for g in grid)],
                          [[f"{g:g}", *(str(x) for x in row)]
                           for g, row in zip(grid, res[key], strict=True)]))
    for group, (title, _) in GROUPS.items():
        out.append(f"\n### Same observations by context: {title}\n")
        out.append(_table(
            ["bin", "decisions", "% of decisions", "mean price $/MWh", "release differs %",
             "% of release changes", "ready differs %", "% of ready changes",
             "release ft / start / MPC", "margin ft / start / MPC"],
            [[r["bin"], str(r["decisions"]), pct(r["share"]),
              _f(r["mean_price_usd_per_mwh"], ".1f"),
              _f(None if r["release_differs"] is None else 100 * r["release_differs"], ".1f"),
              pct(r["share_of_release_changes"]),
              _f(None if r["ready_differs"] is None else 100 * r["ready_differs"], ".1f"),
              pct(r["share_of_ready_changes"]), _trio(r["release"]), _trio(r["margin"])]
             for r in res["same_obs"][group]]))
    for group, (title, _) in GROUPS.items():
        out.append(f"\n### Own trajectories by context: {title} (fine-tune / start / MPC; "
                   f"$ and kWh per episode)\n")
        rows = res["own"][group]
        body = [[r["bin"], _trio(r["decisions"], "d"), _trio(r["release"]),
                 _trio(r["margin"]),
                 _trio({p: None if r["ready_share"][p] is None else 100 * r["ready_share"][p]
                        for p in POLICIES}, ".1f"),
                 _trio(r["grid_kwh"], ".1f"), _trio(r["energy_usd"]), _trio(r["carbon_usd"]),
                 _trio(r["sla_usd"])] for r in rows]
        body.append(["**all**", _trio({p: sum(r["decisions"][p] for r in rows)
                                       for p in POLICIES}, "d"), "", "", "",
                     *(_trio({p: sum(r[c][p] for r in rows) for p in POLICIES},
                             ".1f" if c == "grid_kwh" else ".2f") for c in COST_TERMS)])
        out.append(_table(["bin", "decisions", "release", "ready margin", "ready cores % fleet",
                           "grid kWh", "energy $", "carbon $", "SLA $"], body))
    out.append("\n### Own trajectories: the observed state at decisions by realised price spike "
               "(fine-tune / start / MPC; mean observation entries)\n")
    out.append(_table(["bin", *STATE_FEATURES],
                      [[r["bin"], *(_trio(r[f], ".3f") for f in STATE_FEATURES)]
                       for r in res["state_by_spike"]]))
    return "\n".join(out)


def _fail(msg: str) -> None:
    print(f"analyse_finetune_decisions: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _reason(e: Exception, path: str = "") -> str:
    """An exception's first line, without a leading ``--checkpoint PATH:`` it repeats."""
    text = str(e.args[0] if e.args else e).splitlines()[0]
    return text.removeprefix(f"--checkpoint {path}: ") if path else text


def main() -> None:
    p = CliParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default="scarcity_spikes")
    p.add_argument("--checkpoint", default=None,
                   help="the fine-tuned policy (played; default: checkpoints/SCENARIO)")
    p.add_argument("--start", default=None,
                   help="the policy before the fine-tune (default: <checkpoint>/start)")
    p.add_argument("--references", default=None,
                   help="tuned MPC parameters (default: <checkpoint>/references.json; "
                        "MPC defaults when absent)")
    p.add_argument("--n-seeds", type=int, default=10, help="first N test seeds")
    p.add_argument("--workers", type=int, default=1, help="processes (1 or 2)")
    p.add_argument("--json", default=None, help="write the tables to this path")
    args = p.parse_args()

    from cloudrl.protocol import seeds_for
    from cloudrl.quiet import quiet_library_logs
    from cloudrl.scenarios.cli import policy_params
    from envs.scenario.catalog import load_scenario
    from envs.scenario.env import OBS_NAMES

    try:
        cfg = load_scenario(args.scenario)
    except (ValueError, OSError, KeyError) as e:
        _fail(f"--scenario: {_reason(e)}")
    if not 1 <= args.n_seeds <= 50:
        _fail(f"--n-seeds must be in 1..50 (test seeds), got {args.n_seeds}")
    if args.workers not in (1, 2):
        _fail(f"--workers must be 1 or 2, got {args.workers}")
    args.checkpoint = args.checkpoint or f"checkpoints/{cfg.name}"
    start = args.start or str(Path(args.checkpoint) / "start")
    from cloudrl.algorithms.distill.policy import load_checkpoint

    for flag, path in (("--checkpoint", args.checkpoint), ("--start", start)):
        try:
            load_checkpoint(path)
        except (ValueError, OSError) as e:
            _fail(f"{flag} {path}: {_reason(e, path)}")
    ref = Path(args.references or Path(args.checkpoint) / "references.json")
    if args.references and not ref.is_file():
        _fail(f"--references {ref}: no such file")
    try:
        mpc_params = policy_params(str(ref)).get("mpc", {}) if ref.is_file() else {}
    except ValueError as e:
        _fail(f"--references {ref}: {_reason(e)}")
    quiet_library_logs()
    seeds = list(seeds_for("test", args.n_seeds))
    print(f"scenario {cfg.name}; fine-tuned {args.checkpoint}; start {start}; MPC params "
          f"{json.dumps(mpc_params)} ({ref if ref.is_file() else 'defaults'}); "
          f"{len(seeds)} test seeds {seeds[0]}..{seeds[-1]}; {args.workers} worker(s)")
    print(f"observation ({len(OBS_NAMES)}): {', '.join(OBS_NAMES)}", flush=True)
    t0 = time.perf_counter()
    res = analyse(cfg, args.checkpoint, start, mpc_params, seeds, args.workers)
    wall = time.perf_counter() - t0
    print()
    print(report(res))
    print(f"\nwall time {wall:.0f} s ({len(seeds)} seeds x 3 trajectories)")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        data = {k: v for k, v in res.items() if k != "runs"}
        data.update({"command": " ".join(["python", *sys.argv]), "scenario": cfg.name,
                     "checkpoint": args.checkpoint, "start": start, "mpc_params": mpc_params,
                     "wall_s": wall})
        out.write_text(json.dumps(data, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
