"""A hierarchical supervisor on the named scenarios: every segment (a few hours) it picks one
of a few specialised sub-agents, which then sets the two standing controls.

Sub-agents (:func:`sub_agents`; the heuristic and MPC parameters were tuned on
``scarcity_spikes`` validation seeds and are used as given on any scenario):

* ``cost``: the tuned signal-aware heuristic (the project's reference);
* ``sla``: the same rule preset to release held work at once and keep more capacity ready
  (``quantile`` 1.0: the grid is always "cheap enough"; ``release_util`` 1.0;
  ``ready_margin`` 0.6): run-at-once-like, it trades energy for few violations;
* ``signal``: an aggressive deferral preset (``quantile`` 0.15 over a 36 h window,
  ``release_util`` 0.9, ``ready_margin`` 0.25): work waits for the cheapest hours and
  runs at its latest start otherwise;
* ``mpc``: the tuned forecast MPC.

**The hindsight ceiling** (:func:`hindsight_episode`): at each segment start the simulator
and every sub-agent are deep-copied once per sub-agent; each copy plays its sub-agent for
the segment (the episode's arrivals and signals are pre-generated at reset, so a copy
plays the real future); the real episode continues from the end state of the cheapest.
The score of a segment is its cost, plus with ``lookahead="rollout"`` the cost of the
``cost`` sub-agent (the base) from the segment's end to the episode's end: without it,
greedy favours whoever pushes cost past the segment (held batch work, servers turned off
before a peak). Greedy per segment is the ceiling of *greedy* supervisors that see the
segment's future, not the global optimum over switching sequences (that needs a search
over ``4 ** segments`` sequences); with the rollout score it is one step of policy
improvement over the base and never costs more than the base on an episode.

**The learned supervisor** (:class:`SupervisorController`) sees only the scenario env's
observation (:func:`envs.scenario.env.observe`, 34 floats) at the segment start and picks
a sub-agent with a small MLP trained by cross-entropy on the ceiling's choices on train
seeds (imitation of the hindsight label, :func:`train_classifier`). Its inference is numpy
(no torch in the worker processes).
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envs.scenario.config import ScenarioConfig
from envs.scenario.control import Controller, plan_view
from envs.scenario.env import observe
from envs.scenario.sim import ScenarioSim

TUNED_HEURISTIC = {"quantile": 0.5786256554801771, "window_hours": 18.0,
                   "release_util": 0.8033178878835899, "ready_margin": 0.437697936590399,
                   "guard_hours": 4.0}
TUNED_MPC = {"max_util": 0.6143407333776681, "ready_hedge": 0.009916581317117456}
SLA_PRESET = {**TUNED_HEURISTIC, "quantile": 1.0, "release_util": 1.0, "ready_margin": 0.6}
SIGNAL_PRESET = {**TUNED_HEURISTIC, "quantile": 0.15, "window_hours": 36.0,
                 "release_util": 0.9, "ready_margin": 0.25}
AGENTS: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("cost", "signal_aware", TUNED_HEURISTIC),
    ("sla", "signal_aware", SLA_PRESET),
    ("signal", "signal_aware", SIGNAL_PRESET),
    ("mpc", "mpc", TUNED_MPC),
)
AGENT_NAMES = tuple(a[0] for a in AGENTS)
BASE = 0  # the "cost" sub-agent: ties and the rollout tail go to it
LOOKAHEADS = ("segment", "rollout")
METRICS = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "sla_lc", "sla_batch")


def sub_agents(names: tuple[str, ...] = AGENT_NAMES) -> list[Controller]:
    """Fresh controllers of the named sub-agents (see the module docstring)."""
    from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral
    from cloudrl.mpc.forecast_mpc import ForecastMPC, MPCConfig

    out: list[Controller] = []
    spec = {a[0]: a for a in AGENTS}
    for name in names:
        _, kind, params = spec[name]
        ctrl: Controller = (SignalAwareDeferral(SignalAwareConfig.from_dict(params))
                            if kind == "signal_aware" else ForecastMPC(MPCConfig(**params)))
        out.append(ctrl)
    return out


def segment_ticks(cfg: ScenarioConfig, hours: float) -> int:
    """Ticks of a ``hours`` segment, a whole number of decision periods (at least one)."""
    if not np.isfinite(hours) or hours <= 0:
        raise ValueError(f"segment hours must be > 0, got {hours}")
    d = cfg.decision_ticks
    return max(1, int(round(hours * cfg.ticks_per_hour / d))) * d


def play(sim: ScenarioSim, ctrl: Controller, ticks: int | None) -> float:
    """Run ``ctrl`` on ``sim`` for ``ticks`` ticks (None: to the end); the cost it added.
    Decisions at multiples of ``decision_ticks``, as in :func:`run_episode`."""
    d = sim.cfg.decision_ticks
    c0 = sim.stats.cost_usd
    end = sim.n_ticks if ticks is None else min(sim.n_ticks, sim.t + ticks)
    while sim.t < end:
        if sim.t % d == 0:
            sim.set_controls(*ctrl.decide(sim))
        sim.tick()
    return sim.stats.cost_usd - c0


@dataclass
class Segment:
    t: int
    obs: list[float]
    scores: list[float]  # per sub-agent: the segment's cost (+ the rollout tail)
    seg_costs: list[float]  # per sub-agent: the segment's cost alone
    choice: int


@dataclass
class SupervisedEpisode:
    seed: int
    metrics: dict[str, float]
    segments: list[Segment] = field(default_factory=list)

    @property
    def choices(self) -> list[int]:
        return [s.choice for s in self.segments]


def branch_scores(sim: ScenarioSim, ctrls: list[Controller], seg: int, lookahead: str
                  ) -> tuple[list[float], list[float], list[tuple[ScenarioSim, list]]]:
    """Each sub-agent played for ``seg`` ticks on its own copy of ``sim`` and of all the
    controllers; ``sim`` and ``ctrls`` are left untouched. Scores, segment costs and the
    copies' end states."""
    scores, costs, ends = [], [], []
    for i in range(len(ctrls)):
        twin, twin_ctrls = copy.deepcopy((sim, ctrls))
        c = play(twin, twin_ctrls[i], seg)
        score = c
        if lookahead == "rollout" and not twin.done:
            tail, tail_ctrls = copy.deepcopy((twin, twin_ctrls))
            score += play(tail, tail_ctrls[BASE], None)
        scores.append(score)
        costs.append(c)
        ends.append((twin, twin_ctrls))
    return scores, costs, ends


def _pick(scores: list[float]) -> int:
    """The lowest score; ties (within 1e-9 $) to the base."""
    best = int(np.argmin(scores))
    return BASE if scores[BASE] <= scores[best] + 1e-9 else best


def hindsight_episode(cfg: ScenarioConfig, seed: int, seg_hours: float = 4.0,
                      lookahead: str = "rollout", policy: Any = None,
                      names: tuple[str, ...] = AGENT_NAMES) -> SupervisedEpisode:
    """The greedy hindsight ceiling on ``seed`` (see the module docstring). With ``policy``
    (a callable obs -> sub-agent index) the episode follows the policy's choices while
    every visited segment is still labelled with the hindsight choice (DAgger)."""
    if lookahead not in LOOKAHEADS:
        raise ValueError(f"lookahead must be one of {LOOKAHEADS}, got {lookahead!r}")
    sim = ScenarioSim(cfg)
    sim.reset(seed)
    ctrls = sub_agents(names)
    for c in ctrls:
        c.reset(sim)
    seg = segment_ticks(cfg, seg_hours)
    out = SupervisedEpisode(seed, {})
    while not sim.done:
        obs = observe(sim, plan_view(sim))
        scores, costs, ends = branch_scores(sim, ctrls, seg, lookahead)
        label = _pick(scores)
        out.segments.append(Segment(sim.t, obs.tolist(), scores, costs, label))
        follow = label if policy is None else int(policy(obs))
        sim, ctrls = ends[follow]
    out.metrics = sim.stats.summary()
    return out


class SupervisorController:
    """Picks a sub-agent every ``seg`` ticks from the observation (``policy``: obs ->
    index) and lets it decide; a :class:`~envs.scenario.control.Controller`."""

    clairvoyant = False

    def __init__(self, policy: Any, seg: int, names: tuple[str, ...] = AGENT_NAMES,
                 name: str = "supervisor") -> None:
        self.policy, self.seg, self.names, self.name = policy, seg, names, name
        self.agents = sub_agents(names)
        self.current = BASE
        self.choices: list[int] = []

    def reset(self, sim: ScenarioSim) -> None:
        for a in self.agents:
            a.reset(sim)
        self.current, self.choices = BASE, []

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        if sim.t % self.seg == 0 or not self.choices:
            self.current = int(self.policy(observe(sim, plan_view(sim))))
            self.choices.append(self.current)
        return self.agents[self.current].decide(sim)


class FixedChoice:
    """A policy that always picks sub-agent ``i``."""

    def __init__(self, i: int) -> None:
        self.i = i

    def __call__(self, obs: np.ndarray) -> int:
        return self.i


@dataclass
class MLPPolicy:
    """A numpy MLP (ReLU hidden layers): standardised obs -> sub-agent logits."""

    mean: np.ndarray
    std: np.ndarray
    weights: list[tuple[np.ndarray, np.ndarray]]

    def logits(self, obs: np.ndarray) -> np.ndarray:
        x = (np.asarray(obs, np.float64) - self.mean) / self.std
        for k, (w, b) in enumerate(self.weights):
            x = x @ w + b
            if k < len(self.weights) - 1:
                x = np.maximum(x, 0.0)
        return x

    def __call__(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.logits(obs)))

    def to_json(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist(),
                "weights": [[w.tolist(), b.tolist()] for w, b in self.weights]}


def train_classifier(x: np.ndarray, y: np.ndarray, n_classes: int, run_seed: int,
                     hidden: int = 64, epochs: int = 300, lr: float = 3e-3,
                     weight_decay: float = 1e-4) -> MLPPolicy:
    """Cross-entropy MLP (2 hidden layers) on (obs, hindsight label); full-batch Adam."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny net: more threads only contend on a loaded machine
    try:
        return _fit(torch, x, y, n_classes, run_seed, hidden, epochs, lr, weight_decay)
    finally:
        torch.set_num_threads(threads)


def _fit(torch: Any, x: np.ndarray, y: np.ndarray, n_classes: int, run_seed: int,
         hidden: int, epochs: int, lr: float, weight_decay: float) -> MLPPolicy:
    torch.manual_seed(run_seed)
    mean = x.mean(0)
    std = x.std(0) + 1e-3
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.long)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, n_classes))
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xt), yt)
        loss.backward()
        opt.step()
    layers = [m for m in net if isinstance(m, torch.nn.Linear)]
    weights = [(m.weight.detach().numpy().T.astype(np.float64).copy(),
                m.bias.detach().numpy().astype(np.float64).copy()) for m in layers]
    return MLPPolicy(mean, std, weights)


def run_supervised(cfg: ScenarioConfig, policy: Any, seed: int, seg_hours: float,
                   names: tuple[str, ...] = AGENT_NAMES) -> SupervisedEpisode:
    """One online episode of a supervisor policy (no hindsight)."""
    from envs.scenario.control import run_episode

    ctrl = SupervisorController(policy, segment_ticks(cfg, seg_hours), names)
    res = run_episode(ScenarioSim(cfg), ctrl, seed)
    ep = SupervisedEpisode(seed, dict(res.metrics))
    ep.segments = [Segment(-1, [], [], [], c) for c in ctrl.choices]
    return ep


def _job(args: tuple) -> SupervisedEpisode:
    what, cfg, seed, kw = args
    if what == "hindsight":
        return hindsight_episode(cfg, seed, **kw)
    return run_supervised(cfg, kw["policy"], seed, kw["seg_hours"])


def map_episodes(what: str, cfg: ScenarioConfig, seeds: list[int], workers: int | None,
                 **kw) -> list[SupervisedEpisode]:
    """``hindsight`` or ``online`` episodes on ``seeds``, as Ray tasks, by seed."""
    jobs = [(what, cfg, s, kw) for s in seeds]
    workers = max(1, min(workers or os.cpu_count() or 1, len(seeds)))
    if workers == 1:
        return [_job(j) for j in jobs]
    from cloudrl.parallel import ordered_map

    return ordered_map(_job, jobs, workers, desc=f"{what} episodes")


@dataclass
class SuperviseConfig:
    scenario: str
    seg_hours: float = 4.0
    lookahead: str = "rollout"
    n_test_seeds: int = 10
    n_train_seeds: int = 20
    run_seeds: tuple[int, ...] = (0, 1, 2)
    dagger: bool = False
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.lookahead not in LOOKAHEADS:
            raise ValueError(f"--lookahead must be one of {', '.join(LOOKAHEADS)}")
        if not np.isfinite(self.seg_hours) or self.seg_hours <= 0:
            raise ValueError(f"--segment-hours must be > 0, got {self.seg_hours}")
        for flag, n in (("--n-seeds", self.n_test_seeds), ("--train-seeds", self.n_train_seeds)):
            if not 1 <= n <= 50:
                raise ValueError(f"{flag} must be in 1..50, got {n}")
        if not self.run_seeds:
            raise ValueError("--run-seed: at least one")


@dataclass
class SuperviseResult:
    rows: dict[str, list[dict[str, float]]]  # name -> per test seed metrics
    comparisons: list[dict]
    choice_share: dict[str, list[float]]
    runs: dict[str, float]  # learned run seed -> mean test cost
    claimed: str
    table: str
    timings: dict[str, float]
    seeds: list[int]

    def to_json(self) -> dict:
        return {"seeds": self.seeds, "per_seed": self.rows, "comparisons": self.comparisons,
                "choice_share": self.choice_share, "runs": self.runs,
                "claimed": self.claimed, "timings_s": self.timings, "table": self.table}


def _stack(eps: list[SupervisedEpisode]) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([s.obs for e in eps for s in e.segments], dtype=np.float64)
    y = np.array([s.choice for e in eps for s in e.segments], dtype=np.int64)
    return x, y


def supervise(cfg: ScenarioConfig, sc: SuperviseConfig, log: Any = print) -> SuperviseResult:
    """Fixed sub-agents, the hindsight ceiling and the learned supervisor (one per run seed,
    the median claimed) on the test seeds, paired by seed."""
    from cloudrl.protocol import test_seeds, train_seeds

    seeds = list(test_seeds(sc.n_test_seeds))
    timings: dict[str, float] = {}
    rows: dict[str, list[dict[str, float]]] = {}
    shares: dict[str, list[float]] = {}
    k = len(AGENTS)

    t0 = time.perf_counter()
    for i, name in enumerate(AGENT_NAMES):
        eps = map_episodes("online", cfg, seeds, sc.workers, policy=FixedChoice(i),
                           seg_hours=sc.seg_hours)
        rows[name] = [e.metrics for e in eps]
    timings["sub_agents"] = time.perf_counter() - t0
    log(f"sub-agents on {len(seeds)} test seeds: {timings['sub_agents']:.0f} s")

    t0 = time.perf_counter()
    ceil = map_episodes("hindsight", cfg, seeds, sc.workers, seg_hours=sc.seg_hours,
                        lookahead=sc.lookahead)
    timings["ceiling"] = time.perf_counter() - t0
    rows["ceiling"] = [e.metrics for e in ceil]
    shares["ceiling"] = _share(ceil, k)
    log(f"ceiling ({sc.lookahead}) on {len(seeds)} test seeds: {timings['ceiling']:.0f} s")

    t0 = time.perf_counter()
    train = map_episodes("hindsight", cfg, list(train_seeds(sc.n_train_seeds)), sc.workers,
                         seg_hours=sc.seg_hours, lookahead=sc.lookahead)
    timings["labels"] = time.perf_counter() - t0
    x, y = _stack(train)
    log(f"hindsight labels on {sc.n_train_seeds} train seeds ({len(y)} segments, shares "
        f"{np.bincount(y, minlength=k) / len(y)}): {timings['labels']:.0f} s")

    runs: dict[str, float] = {}
    learned: dict[str, list[SupervisedEpisode]] = {}
    t0 = time.perf_counter()
    for rs in sc.run_seeds:
        pol = train_classifier(x, y, k, rs)
        if sc.dagger:
            more = map_episodes("hindsight", cfg, list(train_seeds(sc.n_train_seeds)),
                                sc.workers, seg_hours=sc.seg_hours, lookahead=sc.lookahead,
                                policy=pol)
            x2, y2 = _stack(more)
            pol = train_classifier(np.vstack([x, x2]), np.concatenate([y, y2]), k, rs)
        eps = map_episodes("online", cfg, seeds, sc.workers, policy=pol,
                           seg_hours=sc.seg_hours)
        learned[str(rs)] = eps
        runs[str(rs)] = float(np.mean([e.metrics["cost_usd"] for e in eps]))
        log(f"learned supervisor run seed {rs}: train acc "
            f"{np.mean([pol(o) == t for o, t in zip(x, y, strict=True)]):.2f}, test mean cost "
            f"{runs[str(rs)]:.2f} $")
    timings["learned"] = time.perf_counter() - t0
    order = sorted(runs, key=runs.get)
    claimed = order[len(order) // 2]
    rows["learned"] = [e.metrics for e in learned[claimed]]
    shares["learned"] = _share(learned[claimed], k)

    comparisons = []
    from cloudrl.scenarios.runner import paired_ci

    cost = {n: np.array([m["cost_usd"] for m in r]) for n, r in rows.items()}
    base = float(cost["cost"].mean())
    for a in ("ceiling", "learned"):
        for b in ("cost", "mpc", "ceiling"):
            if a == b:
                continue
            d, lo, hi = paired_ci(cost[a], cost[b])
            comparisons.append({"policy": a, "vs": b, "diff_usd": d, "ci95_usd": [lo, hi],
                                "diff_pct_of_heuristic": 100 * d / base,
                                "ci95_pct_of_heuristic": [100 * lo / base, 100 * hi / base]})
    best_fixed = np.min(np.stack([cost[n] for n in AGENT_NAMES]), axis=0)
    d, lo, hi = paired_ci(cost["ceiling"], best_fixed)
    comparisons.append({"policy": "ceiling", "vs": "best fixed sub-agent per seed",
                        "diff_usd": d, "ci95_usd": [lo, hi],
                        "diff_pct_of_heuristic": 100 * d / base,
                        "ci95_pct_of_heuristic": [100 * lo / base, 100 * hi / base]})
    table = format_table(cfg.name, sc, rows, comparisons, shares, runs, claimed)
    return SuperviseResult(rows, comparisons, shares, runs, claimed, table, timings, seeds)


def _share(eps: list[SupervisedEpisode], k: int) -> list[float]:
    c = np.bincount([s.choice for e in eps for s in e.segments], minlength=k)
    return (c / max(c.sum(), 1)).tolist()


LABELS = {"cost": "cost (tuned heuristic)", "sla": "sla preset", "signal": "signal preset",
          "mpc": "mpc (tuned)", "ceiling": "hindsight ceiling", "learned": "learned supervisor"}


def format_table(scenario: str, sc: SuperviseConfig, rows: dict, comparisons: list[dict],
                 shares: dict, runs: dict, claimed: str) -> str:
    n = len(next(iter(rows.values())))
    lines = [f"{scenario}: {n} test seeds, {sc.seg_hours:g} h segments, ceiling score "
             f"'{sc.lookahead}', learned = median of run seeds {list(runs)} (run {claimed}); "
             f"mean per episode",
             f"{'policy':24s}" + "".join(f"{c:>12s}" for c in METRICS)]
    for name, r in rows.items():
        lines.append(f"{LABELS.get(name, name):24s}" + "".join(
            f"{np.mean([m[c] for m in r]):12.4f}" for c in METRICS))
    lines.append("")
    for c in comparisons:
        lo, hi = c["ci95_usd"]
        plo, phi = c["ci95_pct_of_heuristic"]
        lines.append(f"{c['policy']} - {c['vs']}: {c['diff_usd']:+.2f} $ [{lo:+.2f}, {hi:+.2f}]"
                     f"  ({c['diff_pct_of_heuristic']:+.1f}% [{plo:+.1f}, {phi:+.1f}] of the "
                     f"heuristic)")
    lines.append("")
    for name, s in shares.items():
        lines.append(f"{name} segment choices: " + ", ".join(
            f"{a} {v:.0%}" for a, v in zip(AGENT_NAMES, s, strict=True)))
    lines.append("learned runs (test mean cost $): " + ", ".join(
        f"seed {k} {v:.2f}" for k, v in runs.items()))
    return "\n".join(lines)
