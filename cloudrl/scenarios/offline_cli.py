"""``cloudrl scenarios offline``: log the tuned heuristic and the forecast MPC on TRAIN
seeds, train the offline constrained agent (CQL-Lag; ``--learner student`` budget-filtered
cloning; ``iql``; ``model``: the clone searched further in an input-driven model of the
logs) on those logs only, and play it against both on test seeds
(cloudrl/scenarios/offline_agent.py, offline_student.py, offline_iql.py,
offline_model.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fail(msg: str) -> int:
    print(f"cloudrl: scenarios offline: {msg}", file=sys.stderr)
    return 2


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (one line), or None."""
    from cloudrl.protocol import N_SEEDS

    if not 1 <= args.episodes <= N_SEEDS:
        return f"--episodes must be in 1..{N_SEEDS} (train seeds per behaviour), got " \
               f"{args.episodes}"
    if not 1 <= args.n_seeds <= N_SEEDS:
        return f"--n-seeds must be in 1..{N_SEEDS} (evaluation seeds), got {args.n_seeds}"
    if args.iterations < 1:
        return f"--iterations must be >= 1, got {args.iterations}"
    if not args.budget_fraction > 0:
        return f"--budget-fraction must be > 0, got {args.budget_fraction}"
    if any(not 0.0 < x <= 1.0 for x in args.noise or ()):
        return f"--noise levels must be in (0, 1], got {args.noise}"
    if any(not 0.0 < x <= 1.0 for x in args.window_noise or ()):
        return f"--window-noise levels must be in (0, 1], got {args.window_noise}"
    if (args.noise or args.window_noise) and args.data:
        return "--noise and --window-noise record new episodes; they cannot be used with --data"
    if args.epochs < 1:
        return f"--epochs must be >= 1, got {args.epochs}"
    if args.steps < 1:
        return f"--steps must be >= 1, got {args.steps}"
    if args.policy_steps is not None and args.policy_steps < 1:
        return f"--policy-steps must be >= 1, got {args.policy_steps}"
    if not 0.0 < args.gamma < 1.0:
        return f"--gamma must be in (0, 1), got {args.gamma}"
    if not 0.5 <= args.expectile < 1.0:
        return f"--expectile must be in [0.5, 1), got {args.expectile}"
    if not args.beta >= 0:
        return f"--beta must be >= 0, got {args.beta}"
    if any(not x >= 0 for x in args.penalty):
        return f"--penalty must be >= 0 $ per violation, got {args.penalty}"
    if args.budget_quantile is not None and not 0.0 < args.budget_quantile <= 1.0:
        return f"--budget-quantile must be in (0, 1], got {args.budget_quantile}"
    if args.budget_quantile is not None and args.data and args.learner == "cql_lag":
        return ("--budget-quantile with --data: cql_lag trains on the costs the data was "
                "written with; record anew, or use --learner student or iql")
    if args.horizon is not None and (args.horizon < 1 or args.critic != "paired"):
        return f"--horizon must be >= 1 and needs --critic paired, got {args.horizon}"
    if args.es_iterations < 1:
        return f"--es-iterations must be >= 1, got {args.es_iterations}"
    if args.model_steps < 1:
        return f"--model-steps must be >= 1, got {args.model_steps}"
    if not args.disagreement_weight >= 0:
        return f"--disagreement-weight must be >= 0, got {args.disagreement_weight}"
    if args.logged_states and args.unconstrained:
        return "--logged-states is a second constraint: it does not go with --unconstrained"
    if not 0.0 <= args.cap_gate < 1.0:
        return f"--cap-gate must be a share in (0, 1), or 0 for no gate, got {args.cap_gate}"
    if args.cap_gate > 0 and args.learner != "model":
        return "--cap-gate gates the model search's release cap: it needs --learner model"
    if args.held_out < 1:
        return f"--held-out must be >= 1 (logged train seeds), got {args.held_out}"
    if args.learner == "model" and args.held_out >= args.episodes and not args.data:
        return (f"--held-out {args.held_out} leaves none of the {args.episodes} train seeds "
                f"to the search")
    if not 0.0 < args.support <= 1.0:
        return f"--support must be in (0, 1], got {args.support}"
    if args.data and not (Path(args.data) / "dataset.json").is_file():
        return f"--data {args.data}: no dataset.json (a directory this command wrote)"
    if args.data:
        try:
            meta = json.loads((Path(args.data) / "dataset.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"--data {args.data}: dataset.json is not readable JSON ({e})"
        if not isinstance(meta, dict) or not isinstance(meta.get("budgets"), dict) or \
                not all(isinstance(meta["budgets"].get(c), (int, float)) for c in ("lc", "batch")):
            return f"--data {args.data}: dataset.json has no per-class budgets (lc, batch)"
    return None


def recorded_override(data: str) -> dict | None:
    """The scenario override a dataset directory was recorded under (None: the scenario
    as catalogued)."""
    return json.loads((Path(data) / "dataset.json").read_text()).get("override")


def _cmd_offline(args: argparse.Namespace) -> int:
    from cloudrl.scenarios.overrides import ScenarioInputError, load_variant

    problem = check_args(args)
    if problem:
        return _fail(problem)
    try:
        override, cfg = load_variant(args.scenario, args.override)
    except ScenarioInputError as e:  # worded as every scenario command words it
        print(f"cloudrl: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError, KeyError) as e:
        return _fail(str(e).splitlines()[0] if str(e) else repr(e))
    if args.data and recorded_override(args.data) != override:
        return _fail(f"--data {args.data} was recorded with --override "
                     f"{json.dumps(recorded_override(args.data))}, not "
                     f"{json.dumps(override)}: pass the same override")
    from cloudrl.algorithms.iql import IQLConfig
    from cloudrl.algorithms.model_es import ModelESConfig
    from cloudrl.scenarios.offline_agent import TrainSettings, format_table, run, to_json
    from cloudrl.scenarios.offline_student import StudentSettings

    out = Path(args.out or f"results/offline_scenarios/{cfg.name}")
    settings = TrainSettings(iterations=args.iterations, run_seed=args.run_seed,
                             budget_fraction=args.budget_fraction)
    student = StudentSettings(run_seed=args.run_seed, unsafe=args.unsafe, select=args.select,
                              epochs=args.epochs) if args.learner in ("student", "model") \
        else None
    model = ModelESConfig(run_seed=args.run_seed, iterations=args.es_iterations,
                          model_steps=args.model_steps, penalty=args.disagreement_weight,
                          held_out=args.held_out, constrained=not args.unconstrained,
                          logged_states=args.logged_states,
                          release_cap=args.release_cap or args.cap_gate > 0,
                          cap_gate=args.cap_gate, placement=args.placement) \
        if args.learner == "model" else None
    iql = IQLConfig(run_seed=args.run_seed, expectile=args.expectile, beta=args.beta,
                    gamma=args.gamma, critic_steps=args.steps,
                    policy_steps=args.policy_steps or args.steps,
                    penalty=tuple(args.penalty), critic=args.critic, extract=args.extract,
                    support=args.support, horizon=args.horizon) if args.learner == "iql" \
        else None
    res = run(cfg, episodes=args.episodes, n_seeds=args.n_seeds, out=out, settings=settings,
              workers=args.workers, data=args.data, student=student,
              noise=tuple(args.noise or ()), iql=iql, override=override,
              budget_quantile=args.budget_quantile,
              window_noise=tuple(args.window_noise or ()), split=args.split, model=model)
    label = args.learner
    print("\n" + format_table(res.evaluation, label))
    print(f"checkpoint: {res.checkpoint}; wall: " +
          ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in res.wall_s.items()))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"command": " ".join(["cloudrl", *sys.argv[1:]]), "scenario": cfg.name,
               "learner": args.learner, "override": override,
               "budget_quantile": args.budget_quantile,
               "episodes_per_behaviour": args.episodes, "run_seed": args.run_seed,
               "data": str(res.data), "checkpoint": str(res.checkpoint),
               "behaviours_train": res.behaviours, "last_metrics": res.metrics,
               "wall_s": res.wall_s, **to_json(res.evaluation)}
        path.write_text(json.dumps(doc, indent=1, default=float))
        print(f"wrote {path}")
    return 0


def add_offline_parser(ss: argparse._SubParsersAction) -> None:
    p = ss.add_parser("offline", help="offline constrained agent (CQL-Lag or budget-filtered "
                                      "cloning) trained only on logged heuristic and MPC "
                                      "episodes; vs both on test seeds")
    p.add_argument("--scenario", required=True)
    p.add_argument("--episodes", type=int, default=20,
                   help="train seeds each behaviour policy plays (1..50)")
    p.add_argument("--run-seed", type=int, default=0, help="training run seed")
    p.add_argument("--n-seeds", type=int, default=10, help="evaluation seeds (1..50)")
    p.add_argument("--split", choices=("test", "validation"), default="test",
                   help="the seeds the agent is evaluated on: test, or validation to choose "
                        "settings without touching the test seeds")
    p.add_argument("--iterations", type=int, default=300,
                   help="training iterations (1024 logged transitions each, 4 epochs of "
                        "256-transition updates)")
    p.add_argument("--budget-fraction", type=float, default=0.5,
                   help="the constraint's episode budget is 2 x this (the sum over the two "
                        "classes of violations / budgeted violations)")
    p.add_argument("--budget-quantile", type=float, default=None, metavar="Q",
                   help="per-class budgets: the larger behaviour's Q quantile of its "
                        "per-episode violation rates (0.95: what it keeps on 95%% of days) "
                        "instead of its mean rate")
    p.add_argument("--learner", choices=("cql_lag", "student", "iql", "model"),
                   default="cql_lag",
                   help="cql_lag (the constrained Q learner, flat actions), student "
                        "(per train seed, the cheapest logged episode within every class "
                        "budget, cloned into the scenario policy), iql (implicit "
                        "Q-learning on every logged decision, advantage-weighted into the "
                        "scenario policy) or model (the student's clone, then evolution "
                        "strategies in an input-driven model of the logs)")
    p.add_argument("--select", choices=("seed", "behaviour"), default="seed",
                   help="student: per train seed the best episode within budget (seed), or "
                        "every episode of the cheapest behaviour within budget (behaviour)")
    p.add_argument("--unsafe", choices=("closest", "drop"), default="closest",
                   help="student: a seed with no episode within budget gives its closest "
                        "one, or none")
    p.add_argument("--noise", type=float, nargs="+",
                   help="also record every behaviour on every seed once per level with that "
                        "share of random actions, logging the behaviour's own action")
    p.add_argument("--window-noise", type=float, nargs="+",
                   help="also record every behaviour on every seed once per level with that "
                        "share of two-hour windows shifted by a release and ready step "
                        "drawn per window, logging the behaviour's own action")
    p.add_argument("--epochs", type=int, default=60, help="student: cloning epochs")
    p.add_argument("--steps", type=int, default=20_000,
                   help="iql: critic updates (256 decisions each)")
    p.add_argument("--policy-steps", type=int, default=None,
                   help="iql: policy updates (default: as many as --steps)")
    p.add_argument("--gamma", type=float, default=0.99, help="iql: discount per decision")
    p.add_argument("--expectile", type=float, default=0.8,
                   help="iql: the expectile of Q over the data's actions that V fits")
    p.add_argument("--beta", type=float, default=3.0,
                   help="iql: inverse temperature of the advantage weights")
    p.add_argument("--penalty", type=float, nargs=2, default=[0.0, 0.0],
                   metavar=("LC", "BATCH"),
                   help="iql: $ per violation of each class added to the env's SLA price")
    p.add_argument("--critic", choices=("expectile", "paired"), default="expectile",
                   help="iql: IQL's expectile TD critic, or Monte Carlo returns less those of "
                        "the other logged episodes of the same seed (paired)")
    p.add_argument("--horizon", type=int, default=None,
                   help="iql --critic paired: each step's return counts this many decisions "
                        "(default: to the episode's end)")
    p.add_argument("--extract", choices=("awr", "support"), default="awr",
                   help="iql: advantage-weighted regression on the data's actions, or the "
                        "best-Q action within the behaviours' support (discrete BCQ)")
    p.add_argument("--support", type=float, default=0.3,
                   help="iql --extract support: an action is supported where the behaviour "
                        "clone gives it at least this share of its likeliest's probability")
    p.add_argument("--es-iterations", type=int, default=100,
                   help="model: evolution-strategies iterations in the model")
    p.add_argument("--model-steps", type=int, default=6000,
                   help="model: Adam steps per ensemble member (512 transitions each)")
    p.add_argument("--disagreement-weight", type=float, default=3.0,
                   help="model: weight of the ensemble's disagreement on the cost in the "
                        "search's objective")
    p.add_argument("--unconstrained", action="store_true",
                   help="model: search on the cost alone, without holding each class's "
                        "predicted violations at the clone's level")
    p.add_argument("--logged-states", action="store_true",
                   help="model: also hold each class's violations predicted at the logged "
                        "states (each policy's action there) at the clone's level")
    p.add_argument("--placement", action="store_true",
                   help="model: also model the logged placement state (free room per server, "
                        "the largest waiting LC job), which the policy does not see; needs "
                        "data recorded with it")
    p.add_argument("--release-cap", action="store_true",
                   help="model: the searched policy never releases more batch work than the "
                        "clone it starts from would (it may hold work back)")
    p.add_argument("--cap-gate", type=float, default=0.0, metavar="SHARE",
                   help="model: the release cap (implied) holds only above the threshold of "
                        "the observation column under which the most logged states fall "
                        "while carrying at most SHARE of the latency-critical violations "
                        "logged in the hour after them (e.g. 0.05); 0: the cap everywhere")
    p.add_argument("--held-out", type=int, default=8,
                   help="model: logged train seeds kept out of the search, which pick the "
                        "iteration kept")
    p.add_argument("--data", help="reuse a dataset directory this command wrote (its "
                                  "budgets too) instead of recording")
    p.add_argument("--override", metavar="JSON",
                   help="a JSON object merged into the scenario's definition (as 'scenarios "
                        "evaluate --override'), e.g. '{\"executor\": {\"lc_reserve_cores\": "
                        "32}}': recorded, trained and evaluated on that variant")
    p.add_argument("--out", help="output directory (default results/offline_scenarios/NAME)")
    p.add_argument("--workers", type=int, default=None, help="evaluation worker processes")
    p.add_argument("--json", help="write the table, per-seed metrics and wall times here")
    p.set_defaults(func=_cmd_offline)
