"""Train the hierarchy's two learned sub-agents: a power specialist and an SLA specialist.

Each is a ``gated_dqn`` (a DQN over presets of the power-aware heuristic's headroom knobs,
``cloudrl/algorithms/gated/``) trained with ``cloudrl train`` on its own reward weights
(``env.sim.alpha``: energy weight, ``env.sim.beta``: weight per SLA violation, set through
``CLOUDRL__ENV__SIM__*``):

* ``lean``: energy-heavy weights (alpha x3), presets that keep less headroom than the
  heuristic (preset 0 = the heuristic itself);
* ``cautious``: violation-heavy weights (beta x5), presets that keep more headroom, up to
  never sleeping a server.

Their strengths differ by phase (lean pays at low load, cautious at bursts), so a
supervisor switching between them can gain. The checkpoints go to
``<out>/<name>_<workload>_n<N>``; pass them to the supervisor::

    python experiments/benchmarks/train_sub_agents.py --workload poisson --n-servers 15 \
        --env-steps 6000
    cloudrl train --algo hierarchical_branching --n-servers 15 --hparams '{"sub_agents":
      ["results/sub_agents/lean_poisson_n15", "results/sub_agents/cautious_poisson_n15"]}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cloudrl.argparsing import CliParser

NO_SLEEP = 100.0  # as cloudrl.algorithms.gated.controller.NO_SLEEP
ALPHA, BETA = 5.0, 60.0  # envs.sim_config.SimConfig defaults

SPECIALISTS: dict[str, dict] = {
    "lean": {"alpha": 3 * ALPHA, "beta": BETA, "presets": [
        {}, {"spare_floor": -0.25, "lead_ticks": -1.0},
        {"spare_floor": -0.5, "lead_ticks": -2.0, "hysteresis": -0.5},
        {"spare_floor": -1.0, "lead_ticks": -3.0, "hysteresis": -1.0}]},
    "cautious": {"alpha": ALPHA, "beta": 5 * BETA, "presets": [
        {}, {"spare_floor": 0.5, "lead_ticks": 1.0}, {"spare_floor": 1.0, "lead_ticks": 2.0},
        {"hysteresis": NO_SLEEP}]},
}


def train_command(name: str, workload: str, n_servers: int, env_steps: int, out: Path,
                  decision_every: int, run_seed: int) -> tuple[list[str], dict[str, str]]:
    """The ``cloudrl train`` argv and the env vars (reward weights) of one specialist."""
    spec = SPECIALISTS[name]
    hparams = {"presets": spec["presets"], "decision_every": decision_every,
               "training_intensity": 16}
    argv = [sys.executable, "-m", "cloudrl", "train", "--algo", "gated_dqn",
            "--workload", workload, "--n-servers", str(n_servers),
            "--env-steps", str(env_steps), "--run-seed", str(run_seed),
            "--hparams", json.dumps(hparams), "--out", str(out)]
    env = {"CLOUDRL__ENV__SIM__ALPHA": str(spec["alpha"]),
           "CLOUDRL__ENV__SIM__BETA": str(spec["beta"])}
    return argv, env


def main(argv: list[str] | None = None) -> int:
    p = CliParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="poisson")
    p.add_argument("--n-servers", type=int, default=15)
    p.add_argument("--env-steps", type=int, default=6000, help="gated decisions per agent")
    p.add_argument("--decision-every", type=int, default=5)
    p.add_argument("--run-seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/sub_agents"))
    p.add_argument("--only", choices=sorted(SPECIALISTS), help="train just this one")
    args = p.parse_args(argv)
    for name in [args.only] if args.only else list(SPECIALISTS):
        out = (args.out / f"{name}_{args.workload}_n{args.n_servers}").resolve()
        cmd, env = train_command(name, args.workload, args.n_servers, args.env_steps, out,
                                 args.decision_every, args.run_seed)
        print(f"[{name}] {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(cmd[1:])}",
              flush=True)
        rc = subprocess.call(cmd, env={**os.environ, **env})
        if rc:
            return rc
        print(f"[{name}] checkpoint: {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
