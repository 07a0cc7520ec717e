"""How much can any supervisor gain by switching among its sub-agents? (issue 15)

What: the clairvoyant supervisor of ``cloudrl/algorithms/hierarchical/ceiling.py`` (at each
decision, every ``--k`` ticks, each sub-agent is played on a copy of the env for the block
and the base sub-agent, the first, to the episode end, all on the episode's real future;
the real env takes the best) next to each sub-agent alone and the rule-based supervisor, on
the same seeds. With the horizon to the end it is an exact one-step policy improvement over
the base, never below it; a learned supervisor sees only the macro state, so this is a
ceiling on its gain, not a policy. Paired per seed: ceiling minus each row, mean [95% t-CI].
Sub-agents are specs (``power_aware:spare_floor=0,...``, ``sjf``) separated by ``;``.

Run (N=50: ~25 s per ceiling episode on branching, ~15 s on flat; ``--workers`` processes)::

    .venv/bin/python experiments/probe_supervisor_ceiling.py --workload poisson \
        --interface branching --seeds 10 [--k 10] [--specialists "SPEC;SPEC;..."]

Bad arguments exit with code 2 and one line naming the argument.

Measured 2026-11-24 (N=50, train seeds 0..9, 2 workers on the 2-core machine; full table in
the README's issue-15 section, "A clairvoyant supervisor"). Ceiling minus power_aware, reward
per episode [95% t-CI]:

    sub-agents                        interface, k   poisson                 google_v2_like
    power_aware; lean; cautious       branching, 10  +21.8 [+7.1, +36.5]     +1.0 [-0.2, +2.3]
    (the default --specialists)       flat, 10       +13.5 [+1.7, +25.4]     +9.2 [-1.1, +19.4]
    power_aware; pa_headroom; sjf     flat, 10       +42.0 [+17.1, +66.9]    +41.0 [+6.9, +75.0]
    power_aware; sjf; ffd; round_robin branching, 5  +67.5 [+38.8, +96.2]    +17.7 [+12.5, +22.8]

(power_aware alone: about -2,350 poisson, -1,884 / -4,631 google_v2_like branching / flat.)
``--seeds 20 --k 5 --specialists "power_aware;sjf;round_robin" --distil 20``: ceiling
+74.9 [+55.3, +94.4]; the student (linear or ``--student-hidden 64``) learns "always
power_aware" and ties it on 20 validation seeds. ``--futures resampled --n-futures 2``
(6 seeds): +32.8 [-22.8, +88.3] reward at +0.42 kWh, not significant.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LEAN = "power_aware:spare_floor=0,lead_ticks=0,hysteresis=0.5"
CAUTIOUS = "power_aware:spare_floor=8,lead_ticks=10,spare_frac=0.2"
DEFAULT_SPECIALISTS = f"power_aware;{LEAN};{CAUTIOUS}"


def _env(workload: str, interface: str, n_servers: int):
    from cloudrl.evaluate import make_env
    from envs.env_config import EnvConfig

    return make_env(EnvConfig.model_validate({"n_servers": n_servers, "workload": workload}),
                    interface)


def _episodes(args: tuple[str, str, int, list[str], int, int, dict, bool]
              ) -> dict[str, tuple]:
    """(reward, kWh, violations) of every row on one seed, and the ceiling's choices."""
    from cloudrl.algorithms.hierarchical.ceiling import run_ceiling_episode
    from cloudrl.algorithms.hierarchical.policy import HierarchicalPolicy
    from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
    from cloudrl.algorithms.hierarchical.supervisors import RuleSupervisor
    from cloudrl.evaluate import run_episode

    workload, interface, n_servers, specs, k, seed, futures, keep = args
    env = _env(workload, interface, n_servers)
    out: dict[str, tuple] = {}
    for spec in specs:
        ep = run_episode(make_sub_agent(spec, interface), env, seed)
        out[spec] = (ep.episode_reward, ep.energy_kwh, ep.sla_violation_rate * ep.jobs_ended)
    # the rule's SLA specialist is the last spec, its power specialist the first
    rule = HierarchicalPolicy(RuleSupervisor(power=0, sla=len(specs) - 1),
                              [make_sub_agent(s, interface) for s in specs], k, interface)
    ep = run_episode(rule, env, seed)
    out["rule supervisor"] = (ep.episode_reward, ep.energy_kwh,
                              ep.sla_violation_rate * ep.jobs_ended)
    ceiling = run_ceiling_episode(env, [make_sub_agent(s, interface) for s in specs], seed, k,
                                  keep_observations=keep, **futures)
    out["ceiling"] = (ceiling.reward, ceiling.energy_kwh, float(ceiling.violations),
                      ceiling.share(len(specs)), np.stack(ceiling.macros),
                      np.asarray(ceiling.scores),
                      np.stack(ceiling.observations) if keep else None)
    return out


class StudentSupervisor:
    """A softmax policy over the macro state (linear, or one tanh hidden layer of
    ``hidden`` units), fitted to the clairvoyant supervisor's rollout scores by minimising
    the expected regret ``sum_i p_i (max_j s_j - s_i)`` (cost-sensitive classification;
    L2 on the weights); acts greedily. Weights are kept as numpy (cheap to ship to workers)."""

    name = "student"

    def __init__(self, macros: np.ndarray, scores: np.ndarray, hidden: int = 0,
                 l2: float = 1e-3, steps: int = 2000, seed: int = 0) -> None:
        import torch

        torch.manual_seed(seed)
        self.mean = macros.mean(axis=0)
        self.std = macros.std(axis=0) + 1e-6
        x = torch.tensor((macros - self.mean) / self.std, dtype=torch.float32)
        regret = scores.max(axis=1, keepdims=True) - scores
        r = torch.tensor(regret / max(regret.mean(), 1e-9), dtype=torch.float32)
        n_in, n_out = x.shape[1], scores.shape[1]
        layers = [torch.nn.Linear(n_in, n_out)] if hidden == 0 else \
            [torch.nn.Linear(n_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, n_out)]
        net = torch.nn.Sequential(*layers)
        opt = torch.optim.Adam(net.parameters(), lr=0.02 if hidden == 0 else 0.005)
        for _ in range(steps):
            p = torch.softmax(net(x), dim=1)
            l2_term = sum(m.weight.pow(2).sum() for m in net if isinstance(m, torch.nn.Linear))
            loss = (p * r).sum(dim=1).mean() + l2 * l2_term
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.layers = [(m.weight.detach().numpy().T.astype(np.float64),
                        m.bias.detach().numpy().astype(np.float64))
                       for m in net if isinstance(m, torch.nn.Linear)]
        self.train_regret = float((regret[np.arange(len(x)), self.pick(macros)]).mean())
        self.base_regret = float(regret[:, 0].mean())

    def pick(self, macros: np.ndarray) -> np.ndarray:
        h = (macros - self.mean) / self.std
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.tanh(h)
        return h.argmax(axis=1)

    def choose(self, macro: np.ndarray) -> int:
        return int(self.pick(np.asarray(macro, dtype=np.float64)[None])[0])


def _student_episodes(args: tuple) -> tuple[float, float, float, list[int]]:
    """(reward, kWh, violations, decisions per sub-agent) of the student supervisor."""
    from cloudrl.algorithms.hierarchical.policy import HierarchicalPolicy
    from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
    from cloudrl.evaluate import run_episode

    workload, interface, n_servers, specs, k, seed, student = args
    env = _env(workload, interface, n_servers)
    policy = HierarchicalPolicy(student, [make_sub_agent(s, interface) for s in specs], k,
                                interface)
    ep = run_episode(policy, env, seed)
    counts = np.bincount([i for _, i in policy.decisions], minlength=len(specs)).tolist()
    return (ep.episode_reward, ep.energy_kwh, ep.sla_violation_rate * ep.jobs_ended, counts)


def _base_episode(args: tuple) -> tuple[float, float, float]:
    from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
    from cloudrl.evaluate import run_episode

    workload, interface, n_servers, spec, seed = args
    env = _env(workload, interface, n_servers)
    ep = run_episode(make_sub_agent(spec, interface), env, seed)
    return (ep.episode_reward, ep.energy_kwh, ep.sla_violation_rate * ep.jobs_ended)


def distil(args: argparse.Namespace, specs: list[str], runs: list[dict],
           pool: ProcessPoolExecutor) -> None:
    """Fit the student on the train seeds' ceiling decisions; play it on validation seeds
    against every sub-agent alone (paired per seed)."""
    from cloudrl.protocol import seeds_for

    macros = np.concatenate([r["ceiling"][4] for r in runs])
    scores = np.concatenate([r["ceiling"][5] for r in runs])
    if args.save_decisions:
        seed_of = np.concatenate([[i] * len(r["ceiling"][4]) for i, r in enumerate(runs)])
        np.savez(args.save_decisions, macros=macros, scores=scores, seed_index=seed_of,
                 observations=np.concatenate([r["ceiling"][6] for r in runs]))
    student = StudentSupervisor(macros, scores, hidden=args.student_hidden)
    kind = "linear" if args.student_hidden == 0 else f"{args.student_hidden} hidden"
    print(f"\nstudent ({kind}, expected-regret loss) on {len(macros)} train decisions: mean "
          f"one-step regret {student.train_regret:.3f} vs always sub-agent 0: "
          f"{student.base_regret:.3f}")
    seeds = seeds_for("validation", args.distil)
    tasks = [(args.workload, args.interface, args.n_servers, specs, args.k, s, student)
             for s in seeds]
    played = list(pool.map(_student_episodes, tasks))
    mine = np.array([p[:3] for p in played])
    share = np.sum([p[3] for p in played], axis=0)
    print(f"validation seeds ({len(seeds)}): student {mine[:, 0].mean():.1f} reward, "
          f"{mine[:, 1].mean():.2f} kWh, {mine[:, 2].mean():.2f} violations; decisions "
          + ", ".join(f"{x / share.sum():.1%}" for x in share))
    for spec in specs:
        alone = np.array(list(pool.map(_base_episode, [
            (args.workload, args.interface, args.n_servers, spec, s) for s in seeds])))
        print(f"  student - {spec:52s} reward {_ci(mine[:, 0] - alone[:, 0]):>26s}  "
              f"kWh {_ci(mine[:, 1] - alone[:, 1]):>24s}")


def _ci(x: np.ndarray) -> str:
    from scipy import stats

    if len(x) < 2 or np.std(x) == 0:
        return f"{x.mean():+.2f} [{x.mean():+.2f}, {x.mean():+.2f}]"
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return f"{x.mean():+.2f} [{x.mean() - half:+.2f}, {x.mean() + half:+.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="poisson", choices=("poisson", "google_v2_like"))
    p.add_argument("--interface", default="branching", choices=("flat", "branching"))
    p.add_argument("--n-servers", type=int, default=50)
    p.add_argument("--seeds", type=int, default=10, help="train seeds 0..N-1")
    p.add_argument("--k", type=int, default=10, help="ticks per supervisor decision")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--distil", type=int, default=0, metavar="N_VAL",
                   help="also fit a student supervisor to the ceiling's decisions and play it "
                        "on N_VAL validation seeds (0: off)")
    p.add_argument("--futures", default="true", choices=("true", "resampled"),
                   help="the rollouts' future: the episode's real one (the ceiling) or "
                        "redrawn arrivals (what the present state alone is worth)")
    p.add_argument("--n-futures", type=int, default=1, help="redrawn futures per decision")
    p.add_argument("--rule", default="mean", choices=("mean", "consistent"))
    p.add_argument("--student-hidden", type=int, default=0,
                   help="hidden units of the student (0: linear)")
    p.add_argument("--save-decisions", default="", metavar="NPZ",
                   help="with --distil: write the ceiling's macro states, whole observations "
                        "and rollout scores")
    p.add_argument("--specialists", default=DEFAULT_SPECIALISTS,
                   help="sub-agent specs separated by ';' (the first is the rollout's base "
                        "and the rule's power specialist, the last its SLA specialist)")
    args = p.parse_args(argv)
    for name in ("n_servers", "seeds", "k", "workers", "n_futures"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("distil", "student_hidden"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    specs = [s.strip() for s in args.specialists.split(";") if s.strip()]
    if len(specs) < 2:
        p.error(f"--specialists: need at least 2 sub-agents, got {len(specs)}")
    try:
        from cloudrl.algorithms.hierarchical.sub_agents import check_spec

        for spec in specs:
            check_spec(spec)
    except ValueError as exc:
        p.error(f"--specialists: {exc}")

    from cloudrl.protocol import seeds_for

    futures = {"futures": args.futures, "n_futures": args.n_futures, "rule": args.rule}
    keep = bool(args.save_decisions)
    tasks = [(args.workload, args.interface, args.n_servers, specs, args.k, s, futures, keep)
             for s in seeds_for("train", args.seeds)]
    pool = ProcessPoolExecutor(args.workers)
    runs = list(pool.map(_episodes, tasks))
    rows = specs + ["rule supervisor", "ceiling"]
    print(f"{args.workload}, N={args.n_servers}, {args.interface}, k={args.k}, futures "
          f"{args.futures} (M={args.n_futures if args.futures == 'resampled' else 1}, "
          f"{args.rule}), train seeds 0..{args.seeds - 1}; per episode mean, and ceiling "
          "minus row per seed (mean [95% t-CI])")
    print(f"{'row':58s} {'reward':>9s} {'kWh':>7s} {'viol.':>6s}  "
          f"{'ceiling - row, reward':>26s}  {'kWh':>24s}")
    ceiling = np.array([r["ceiling"][:3] for r in runs])
    for row in rows:
        vals = np.array([r[row][:3] for r in runs])
        diff = ceiling - vals
        print(f"{row:58s} {vals[:, 0].mean():9.1f} {vals[:, 1].mean():7.2f} "
              f"{vals[:, 2].mean():6.2f}  {_ci(diff[:, 0]):>26s}  {_ci(diff[:, 1]):>24s}")
    share = np.mean([r["ceiling"][3] for r in runs], axis=0)
    print("ceiling's decisions per sub-agent: " +
          ", ".join(f"{s}: {x:.1%}" for s, x in zip(specs, share, strict=True)))
    if args.distil:
        distil(args, specs, runs, pool)
    pool.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
