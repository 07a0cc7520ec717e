"""Which of the two controls an offline model search changed costs the violations.

``cloudrl scenarios offline --learner model`` starts from the MPC clone (``<run>/start``)
and searches every weight (``<run>/policy``). On the test seeds the search saved money
and added latency-critical (LC) violations. This script plays, on validation seeds (the
test seeds are left alone), the clone, the searched policy and four compositions of the
two, each action taken per decision from the two networks on the same observation:

* ``release_only``: the searched release level, the clone's ready margin;
* ``ready_only``: the clone's release level, the searched ready margin;
* ``release_min``: the lower of the two release levels (hold back where either would),
  the clone's ready margin;
* ``release_max``: the higher of the two release levels, the clone's ready margin.

With ``--gate-data DIR`` (the logged episodes the run was trained on) and
``--gate-share``, one more: ``gated``, the searched policy with the clone's release level
as a cap only in the states the logs show to carry LC violations (the gate of
``--cap-gate``, :func:`cloudrl.algorithms.model_es.cap_gate`, found in those logs).

It prints, per policy, the mean episode cost, LC and batch violations per episode and the
share of seeds whose LC violation rate is above ``--lc-budget`` (the offline agent's tail
budget). Episodes run in one process.

Run::

    python experiments/analyses/analyse_offline_branches.py \\
        --run results/offline_scenarios/lmodel/model_seed0 --n-seeds 40 \\
        --json results/offline_scenarios/branches_lmodel_r0.json \\
        --gate-data results/offline_scenarios/win/data --gate-share 0.05
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cloudrl.argparsing import CliParser

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COMPOSITIONS = ("clone", "searched", "release_only", "ready_only", "release_min",
                "release_max")


class Composed:
    """The greedy action of two policies combined per decision (see the module
    docstring); plays through :class:`~cloudrl.algorithms.distill.policy.LearnedController`."""

    def __init__(self, searched: Any, clone: Any, how: str,
                 gate: tuple[int, float] | None = None) -> None:
        self.searched, self.clone, self.how, self.gate = searched, clone, how, gate
        self.branch_sizes = clone.branch_sizes

    def eval(self) -> Composed:
        return self

    @torch.no_grad()
    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        s, c = self.searched.greedy(obs), self.clone.greedy(obs)
        if self.how == "gated":
            column, above = self.gate
            capped = torch.where(obs[:, column] > above, torch.minimum(s[:, 0], c[:, 0]),
                                 s[:, 0])
            return torch.stack([capped, s[:, 1]], 1)
        release = {"clone": c[:, 0], "searched": s[:, 0], "release_only": s[:, 0],
                   "ready_only": c[:, 0], "release_min": torch.minimum(s[:, 0], c[:, 0]),
                   "release_max": torch.maximum(s[:, 0], c[:, 0])}[self.how]
        ready = s[:, 1] if self.how in ("searched", "ready_only") else c[:, 1]
        return torch.stack([release, ready], 1)


def logged_gate(data: Path, share: float) -> dict[str, Any] | None:
    """The release cap's gate found in the logged episodes under ``data``."""
    from cloudrl.data.offline import read_dataset
    from cloudrl.scenarios.offline_model import logged_arrays, logged_cap_gate

    return logged_cap_gate(logged_arrays(read_dataset(data)), share)


def analyse(run: Path, n_seeds: int, lc_budget: float,
            gate: dict[str, Any] | None = None) -> dict[str, Any]:
    from cloudrl.algorithms.distill.policy import LearnedController, load_checkpoint
    from cloudrl.protocol import seeds_for
    from envs.scenario.catalog import load_scenario
    from envs.scenario.control import run_episode
    from envs.scenario.sim import ScenarioSim

    torch.set_num_threads(1)
    searched, spec = load_checkpoint(run / "policy")
    clone, _ = load_checkpoint(run / "start")
    sim = ScenarioSim(load_scenario(spec.get("scenario") or "scarcity_spikes"))
    seeds = list(seeds_for("validation", n_seeds))
    out: dict[str, Any] = {"run": str(run), "seeds": seeds, "lc_budget": lc_budget,
                           "gate": gate, "policies": {}}
    hows = COMPOSITIONS + (("gated",) if gate is not None else ())
    for how in hows:
        ctrl = LearnedController(Composed(searched, clone, how, None if gate is None else
                                          (gate["column"], gate["above"])), how)
        rows = [run_episode(sim, ctrl, s).metrics for s in seeds]
        arr = np.array([[r["cost_usd"], r["violations_lc"], r["violations_batch"],
                         r["sla_lc"]] for r in rows])
        out["policies"][how] = {"cost_usd": float(arr[:, 0].mean()),
                                "violations_lc": float(arr[:, 1].mean()),
                                "violations_batch": float(arr[:, 2].mean()),
                                "lc_over_budget": float((arr[:, 3] > lc_budget).mean()),
                                "per_seed_cost": arr[:, 0].tolist()}
    return out


def format_table(res: dict[str, Any]) -> str:
    lines = [f"{len(res['seeds'])} validation seeds; {res['run']}"
             + ("" if not res.get("gate") else
                f"; gated: the cap where {res['gate']['name']} > {res['gate']['above']:.4f}"),
             f"{'policy':<14}{'cost $':>9}{'LC viol.':>10}{'batch viol.':>13}"
             f"{'LC over budget':>16}"]
    for how, r in res["policies"].items():
        lines.append(f"{how:<14}{r['cost_usd']:>9.2f}{r['violations_lc']:>10.2f}"
                     f"{r['violations_batch']:>13.2f}{100 * r['lc_over_budget']:>15.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = CliParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True,
                   help="a model-search run directory (holding start/ and policy/)")
    p.add_argument("--n-seeds", type=int, default=40, help="validation seeds (1..50)")
    p.add_argument("--lc-budget", type=float, default=0.001058,
                   help="LC violation-rate budget per episode (default: scarcity_spikes' "
                        "0.95 tail budget of win/data, 0.1058%%)")
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--gate-data", help="the logged episodes (a 'cloudrl scenarios offline' "
                                       "data directory): also play the gated composition")
    p.add_argument("--gate-share", type=float, default=0.05,
                   help="with --gate-data: the share of logged LC violations the states "
                        "below the gate may carry (default 0.05)")
    args = p.parse_args(argv)
    from cloudrl.algorithms.distill.policy import CheckpointError

    if not 1 <= args.n_seeds <= 50:
        print(f"analyse_offline_branches: --n-seeds must be in 1..50, got {args.n_seeds}",
              file=sys.stderr)
        return 2
    if not 0.0 < args.gate_share < 1.0:
        print(f"analyse_offline_branches: --gate-share must be in (0, 1), got "
              f"{args.gate_share}", file=sys.stderr)
        return 2
    if args.gate_data and not (Path(args.gate_data) / "dataset.json").is_file():
        print(f"analyse_offline_branches: --gate-data {args.gate_data}: no dataset.json (a "
              f"directory 'cloudrl scenarios offline' wrote)", file=sys.stderr)
        return 2
    try:
        gate = logged_gate(Path(args.gate_data), args.gate_share) if args.gate_data else None
        res = analyse(Path(args.run), args.n_seeds, args.lc_budget, gate)
    except CheckpointError as e:
        print(f"analyse_offline_branches: {e}", file=sys.stderr)
        return 2
    print(format_table(res))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
