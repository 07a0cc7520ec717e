"""Do heuristic specialists leave a hierarchy anything to switch for? (issue 15)

A supervisor can only beat its sub-agents if each is better somewhere: a power
specialist that saves energy where the load allows it, an SLA specialist that avoids
violations where it does not. This probe runs two heuristic specialists alone, the
rule-based supervisor over them (``RuleSupervisor``: the SLA specialist when load, queue
fill or recent violations are high) and ``power_aware`` on the same train seeds, and
prints energy, violations and reward per episode. Specialists are sub-agent specs
(``power_aware:spare_floor=0,...``), separated by ``;``.

Run (about 1 min per workload on one core at the defaults)::

    .venv/bin/python experiments/probe_specialists.py --workload poisson [--interface branching]
        [--seeds 8] [--k 10] [--specialists "SPEC;SPEC"]

Measured 2026-11-24 (N=50, branching, train seeds 0..7, k=10; lean =
``power_aware:spare_floor=0,lead_ticks=0,hysteresis=0.5``, cautious =
``power_aware:spare_floor=8,lead_ticks=10,spare_frac=0.2``), per episode:

    workload        policy        energy kWh  violations  reward
    poisson         power_aware     125.63       0.00     -2345.2
                    lean            126.20       0.00     -2360.4
                    cautious        155.44       0.12     -2901.1
                    rule            127.11       0.00     -2390.9
    google_v2_like  power_aware     107.35       0.00     -1962.1
                    lean            107.30       0.00     -1961.4
                    cautious        127.66       0.00     -2334.7
                    rule            108.56       0.00     -2000.7

On the branching interface neither specialist has violations to avoid, so the reward is
energy alone, and the leanest headroom is not the lowest energy (lean spends more than
power_aware on Poisson): there is no regime in which the cautious specialist pays, and
the rule-based supervisor only loses energy by calling it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LEAN = "power_aware:spare_floor=0,lead_ticks=0,hysteresis=0.5"
CAUTIOUS = "power_aware:spare_floor=8,lead_ticks=10,spare_frac=0.2"


def policies(specs: list[str], interface: str, k: int) -> dict[str, object]:
    """power_aware, each specialist alone and the rule-based supervisor over them."""
    from cloudrl.algorithms.hierarchical.policy import HierarchicalPolicy
    from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
    from cloudrl.algorithms.hierarchical.supervisors import FixedSupervisor, RuleSupervisor
    from cloudrl.heuristics import make_heuristic

    def hierarchy(supervisor: object) -> HierarchicalPolicy:
        return HierarchicalPolicy(supervisor, [make_sub_agent(s, interface) for s in specs],
                                  k, interface)

    out: dict[str, object] = {"power_aware": make_heuristic("power_aware", interface)}
    for i, spec in enumerate(specs):
        out[spec] = hierarchy(FixedSupervisor(i))
    out["rule"] = hierarchy(RuleSupervisor())
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="poisson", choices=("poisson", "google_v2_like"))
    p.add_argument("--interface", default="branching", choices=("flat", "branching"))
    p.add_argument("--n-servers", type=int, default=50)
    p.add_argument("--seeds", type=int, default=8, help="train seeds 0..N-1")
    p.add_argument("--k", type=int, default=10, help="ticks per supervisor decision")
    p.add_argument("--specialists", default=f"{LEAN};{CAUTIOUS}",
                   help="sub-agent specs separated by ';' (power first, SLA second)")
    args = p.parse_args()

    from cloudrl.evaluate import make_env, run_episode
    from cloudrl.protocol import seeds_for
    from envs.env_config import EnvConfig

    env = make_env(EnvConfig.model_validate({"n_servers": args.n_servers,
                                             "workload": args.workload}), args.interface)
    specs = [s.strip() for s in args.specialists.split(";") if s.strip()]
    print(f"{args.workload}, N={args.n_servers}, {args.interface}, train seeds "
          f"0..{args.seeds - 1}, k={args.k}")
    print(f"{'policy':60s} {'energy kWh':>10s} {'violations':>10s} {'reward':>10s}")
    for name, policy in policies(specs, args.interface, args.k).items():
        eps = [run_episode(policy, env, s) for s in seeds_for("train", args.seeds)]
        energy = np.mean([e.energy_kwh for e in eps])
        violations = np.mean([e.sla_violation_rate * e.jobs_ended for e in eps])
        reward = np.mean([e.episode_reward for e in eps])
        print(f"{name:60s} {energy:10.2f} {violations:10.2f} {reward:10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
