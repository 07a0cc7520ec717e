"""Probe (issue 13): does a state-dependent choice among the gated env's presets beat the heuristic?

What: Bertsekas' rollout, one step of policy iteration with the heuristic as base policy,
on the gated env (``envs/gated_env.py``, the six default presets of power_aware's headroom
knobs; preset 0 = power_aware at its default parameters, which are the tuned point). At
each decision (every ``decision_every`` ticks) every preset ``p`` is played on an
independent copy of the env: ``p`` for this block, then preset 0 for ``--horizon`` ticks,
over ``--futures-count`` futures with common random numbers across presets; the score is
the summed env reward (energy, violation and toggle terms); the real env steps with the
best preset (ties go to preset 0). Per seed the rollout episode is paired with constant
preset 0 on the same seed. Helpers: ``cloudrl/algorithms/rollout.py``.

``--futures true`` plays the episode's real future (the simulator pre-generates every
arrival at reset): a clairvoyant CEILING on what the preset choice can gain, not a policy.
``--futures resampled`` replaces the copies' not-yet-arrived jobs by fresh workload draws
(the honest rollout policy).

Run (one process at a time on the shared machine)::

    nice -n 10 .venv/bin/python experiments/probe_rollout.py --workload poisson \
        --futures true --seeds 0 1 2 3 4 --horizon 60 --futures-count 1

``--merge a.json b.json ...`` prints the table over earlier ``--out`` runs of one
configuration (run one seed per process to keep runs short). Bad arguments exit with code 2
and one line naming the argument.

Measured (2026-11-23, N=50, branching, six default presets, decision_every 5 as in
experiments/headline.yaml, train seeds; rollout - heuristic per seed, mean [95% t-CI]; one
process at a time on the shared 2-core machine, load average 1-4; the heuristic: 125.21 kWh
(poisson) / 105.75 kWh (google_v2_like), 0 violations on seeds 0..4):

workload, futures, H / M / rule     energy kWh             violations/ep.  reward         p0   s/ep
poisson true 60/1/mean (seeds 0..9) -0.09 [-0.79, +0.61]   +0.1 [-0.1,0.3] +3 [-16, +22]  95%   20
poisson true to end/1/mean          -1.04 [-2.02, -0.06]   0               +32 [+4, +59]  96%  129
poisson resampled 1000/2/mean       +0.45 [-0.23, +1.13]   +0.6 [-0.1,1.3] -44 [-86, -3]  88%  289
poisson resampled 200/4/consistent   +0.01 [-0.03, +0.04]   0               -0 [-1, +1]    99%  246
  (seeds 0..2)
google true to end/1/mean           -0.10 [-0.34, +0.14]   0               +2 [-3, +6]   99.6% 141
google resampled 1000/2/mean (0..2) -0.01 [-0.06, +0.03]   0               +0 [-1, +1]   99.7% 265

(p0: share of decisions that kept preset 0; s/ep: wall seconds per rollout episode.)

Findings: the clairvoyant one-step improvement (true future, base played to the episode
end) is the ceiling of a state-dependent preset choice: 1.04 kWh (0.8%) on poisson, 3% of
the heuristic's 31.7 kWh gap to the bound, nothing on google_v2_like. Truncated at H=60 it
is a wash (preset values are long-horizon). The honest rollout with resampled futures picks
noise (max of six noisy estimates) and loses reward; requiring a preset to beat preset 0 in
every sampled future stops the losses and the deviations with them. Distilling either into
the gate cannot meet issue 13's dominance goal (energy CI < 0 on both workloads).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cloudrl.algorithms.gated.controller import CONTROLLER_PATH
from cloudrl.algorithms.rollout import FUTURES, RULES, choose, rollout_scores
from cloudrl.headline.report import paired
from envs.gated_env import GatedControllerEnv

HEADLINE_YAML = Path(__file__).with_name("headline.yaml")


def fail(message: str) -> None:
    """One line on stderr, exit code 2 (bad user input)."""
    print(message, file=sys.stderr)
    sys.exit(2)


def headline_decision_every() -> int:
    """``train.hparams.decision_every`` of experiments/headline.yaml (the headline recipe)."""
    cfg = yaml.safe_load(HEADLINE_YAML.read_text())
    return int(cfg["train"]["hparams"]["decision_every"])


def make_env(workload: str, n_servers: int, decision_every: int,
             heuristic: dict[str, Any] | None, episode_length: int = 1000) -> GatedControllerEnv:
    return GatedControllerEnv({"n_servers": n_servers, "workload": workload,
                               "sim": {"episode_length": episode_length},
                               "controller": CONTROLLER_PATH,
                               "controller_config": {"heuristic": heuristic or {}},
                               "decision_every": decision_every})


def run_episode(env: GatedControllerEnv, seed: int, policy: str, horizon: int, futures: str,
                count: int, rule: str = "mean") -> dict[str, Any]:
    """One episode: ``policy`` "base" (constant preset 0) or "rollout"."""
    env.reset(seed=seed)
    t0 = time.perf_counter()
    total, decision, done = 0.0, 0, False
    choices = np.zeros(env.n_choices, dtype=np.int64)
    while not done:
        choice = 0
        if policy == "rollout":
            rngs = [np.random.default_rng([seed, decision, m]) for m in range(count)]
            choice = choose(rollout_scores(env, horizon, futures, rngs), rule)
        _, reward, term, trunc, _ = env.step(choice)
        total += reward
        choices[choice] += 1
        decision += 1
        done = term or trunc
    st = env.sim.stats
    return {"seed": seed, "policy": policy, "energy_kwh": st.energy_j / 3.6e6,
            "violations": st.violations, "violation_rate": st.violation_rate,
            "toggles": st.toggles, "reward": total, "choices": choices.tolist(),
            "wall_s": time.perf_counter() - t0}


def table(base: Sequence[dict], roll: Sequence[dict]) -> str:
    """Per-metric means and the paired mean difference (rollout - base) with its 95% CI."""
    lines = [f"{'metric':<16}{'base (preset 0)':>18}{'rollout':>14}{'rollout - base [95% CI]':>34}"]
    for key, scale, unit in (("energy_kwh", 1.0, ""), ("violations", 1.0, ""),
                             ("violation_rate", 100.0, " pp"), ("toggles", 1.0, ""),
                             ("reward", 1.0, "")):
        a = [r[key] * scale for r in roll]
        b = [r[key] * scale for r in base]
        d, ci = paired(a, b)
        lines.append(f"{key:<16}{np.mean(b):>18.4f}{np.mean(a):>14.4f}"
                     f"{f'{d:+.4f} [{d - ci:+.4f}, {d + ci:+.4f}]{unit}':>34}")
    share = np.sum([r["choices"] for r in roll], axis=0)
    lines.append("decision share of presets 0..5: "
                 + ", ".join(f"{x:.1%}" for x in share / share.sum()))
    lines.append(f"wall s per episode: base {np.mean([r['wall_s'] for r in base]):.1f}, "
                 f"rollout {np.mean([r['wall_s'] for r in roll]):.1f}")
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=("poisson", "google_v2_like"), default="poisson")
    ap.add_argument("--futures", choices=FUTURES, default="true")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--horizon", type=int, default=60, help="ticks of preset 0 after the block")
    ap.add_argument("--futures-count", type=int, default=1, help="M sampled futures")
    ap.add_argument("--rule", choices=RULES, default="mean",
                    help="mean: best mean score; consistent: deviate from preset 0 only for a "
                         "preset that beats it in every future")
    ap.add_argument("--decision-every", type=int, default=None,
                    help="ticks per decision (default: experiments/headline.yaml's)")
    ap.add_argument("--n-servers", type=int, default=50)
    ap.add_argument("--episode-length", type=int, default=1000, help="ticks (tests: small)")
    ap.add_argument("--heuristic-params", default=None,
                    help="JSON of PowerAwareConfig fields (or {'params': {...}})")
    ap.add_argument("--out", default=None, help="write per-seed rows as JSON here")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="print the table of earlier --out files (one run config) and exit")
    args = ap.parse_args(argv)
    for name, low in (("horizon", 0), ("futures_count", 1), ("n_servers", 1),
                      ("decision_every", 1), ("episode_length", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            ap.exit(2, f"--{name.replace('_', '-')}: must be >= {low}, got {value}\n")
    if any(s < 0 for s in args.seeds):
        ap.exit(2, f"--seeds: must be >= 0, got {min(args.seeds)}\n")
    return args


def merge(paths: Sequence[str]) -> None:
    """The table over the per-seed rows of several ``--out`` files of one configuration."""
    base, roll, configs = [], [], set()
    for path in paths:
        try:
            run = json.loads(Path(path).read_text())
            base += run["base"]
            roll += run["rollout"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            fail(f"--merge: cannot read {path}: {err}")
        a = run["args"]
        configs.add((a["workload"], a["futures"], a["horizon"], a["futures_count"],
                     a.get("rule", "mean"), run["decision_every"]))
    if len(configs) != 1:
        fail(f"--merge: the files mix configurations {sorted(configs)}")
    wl, fut, h, m, rule, every = configs.pop()
    print(f"{wl}, decision_every={every}, futures={fut}, H={h}, M={m}, rule={rule}, "
          f"seeds={[r['seed'] for r in roll]}")
    print(table(base, roll))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.merge:
        merge(args.merge)
        return
    heuristic = None
    if args.heuristic_params:
        try:
            raw = json.loads(Path(args.heuristic_params).read_text())
        except (OSError, ValueError) as err:
            fail(f"--heuristic-params: cannot read {args.heuristic_params}: {err}")
        heuristic = raw.get("params", raw)
    every = args.decision_every or headline_decision_every()
    try:
        env = make_env(args.workload, args.n_servers, every, heuristic, args.episode_length)
    except ValueError as err:
        fail(f"invalid argument: {' '.join(str(err).split())}")
    print(f"{args.workload}, N={args.n_servers}, decision_every={every}, futures={args.futures},"
          f" H={args.horizon}, M={args.futures_count}, rule={args.rule}, seeds={args.seeds}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    base, roll = [], []
    for seed in args.seeds:
        base.append(run_episode(env, seed, "base", 0, args.futures, 1))
        roll.append(run_episode(env, seed, "rollout", args.horizon, args.futures,
                                args.futures_count, args.rule))
        b, r = base[-1], roll[-1]
        print(f"seed {seed}: energy {b['energy_kwh']:.2f} -> {r['energy_kwh']:.2f} kWh, "
              f"violations {b['violations']} -> {r['violations']}, reward {b['reward']:.1f} -> "
              f"{r['reward']:.1f}, choices {r['choices']}, {r['wall_s']:.0f} s", flush=True)
    print(table(base, roll))
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "decision_every": every,
                                              "base": base, "rollout": roll}, indent=1))


if __name__ == "__main__":
    main()
