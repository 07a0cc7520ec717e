"""``cloudrl scenarios``: list the named scenarios, evaluate controllers on one, measure
the headroom a forecast MPC and a clairvoyant oracle find over the tuned heuristic."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cloudrl.scenarios.overrides import ScenarioInputError, load_variant
from cloudrl.scenarios.params import policy_params
from envs.scenario.catalog import UnknownScenarioError, describe, load_scenario, scenario_names


def _cmd_list(args: argparse.Namespace) -> int:
    width = max(len(n) for n in scenario_names())
    for name, text in describe():
        print(f"{name:{width}s}  {text}")
    return 0


def _cmd_headroom(args: argparse.Namespace) -> int:
    from cloudrl.scenarios.headroom import format_rows, measure

    names = args.scenario or [n for n in scenario_names() if n != "tiny"]
    cfgs = [load_scenario(n) for n in names]  # unknown names fail before any work
    rows = []
    for cfg in cfgs:
        row = measure(cfg, n_seeds=args.n_seeds, tune_samples=args.tune_samples,
                      tune_seeds=args.tune_seeds, mpc_samples=args.mpc_samples,
                      workers=args.workers)
        rows.append(row)
        if not args.no_log:
            from cloudrl.scenarios.report import log_to_mlflow

            log_to_mlflow(row, args.tracking_uri)
        if args.plot_dir:
            from cloudrl.protocol import test_seeds
            from cloudrl.scenarios.report import plot_episode
            from cloudrl.scenarios.runner import ControllerSpec

            specs = [ControllerSpec("signal_aware", row.heuristic_params, "heuristic"),
                     ControllerSpec("mpc", row.mpc_params, "mpc"),
                     ControllerSpec("oracle", {}, "oracle")]
            plot_episode(cfg, specs, test_seeds(1)[0],
                         Path(args.plot_dir) / f"headroom_{cfg.name}.png")
        print(format_rows([row]).splitlines()[-1] if len(rows) > 1 else format_rows([row]),
              flush=True)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": " ".join(["cloudrl", *sys.argv[1:]]),
                                   "scenarios": [r.to_json() for r in rows]}, indent=2))
        print(f"wrote {out}")
    if args.markdown:
        from cloudrl.scenarios.headroom import format_markdown

        md = Path(args.markdown)
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(format_markdown(rows) + "\n")
        print(f"wrote {md}")
    return 0


def evaluate_scenario(args: argparse.Namespace) -> int:
    """The table of ``cloudrl scenarios evaluate`` (also ``cloudrl evaluate --scenario``)."""
    import numpy as np

    from cloudrl.protocol import seeds_for
    from cloudrl.scenarios.runner import KINDS, ControllerSpec, checkpoint_kind, run_controllers

    n_servers = getattr(args, "n_servers", None)
    if n_servers is not None and not 1 <= n_servers <= 4096:
        return _fail(f"--n-servers {n_servers}: expected 1..4096 servers")
    # another fleet size keeps the scenario's utilization (the load scales with the fleet)
    try:
        overrides, cfg = load_variant(args.scenario, getattr(args, "override", None),
                                      n_servers=n_servers)
    except ScenarioInputError as e:
        return _fail(str(e))
    try:
        params = policy_params(args.params) if args.params else None
    except ValueError as e:
        return _fail(str(e))
    if params is None:  # a published checkpoint carries the parameters it was measured against
        params = _reference_params(args.checkpoint or [])
    params = params or {}
    kinds = [ALIASES.get(k, k) for k in (args.policy or ["signal_aware", "mpc", "oracle",
                                                         "run_at_once"])]
    policies = [k for k in KINDS if k not in CHECKPOINT_KINDS]
    for k in kinds:
        if k not in policies:
            hint = " (a learned policy comes with --checkpoint DIR)" \
                if k in CHECKPOINT_KINDS else ""
            raise UnknownScenarioError(f"--policy {k!r}: valid: {', '.join(policies)}{hint}")
    # a rounded controller takes its own entry, else the one of the controller it rounds
    specs = [ControllerSpec(k, params.get(k, params.get(k.removesuffix("_rounded"), {})))
             for k in kinds]
    for spec in specs:  # bad parameters fail here, in one line, before any episode
        try:
            spec.build()
        except (ValueError, TypeError) as e:
            own = spec.kind in params or not spec.kind.endswith("_rounded")
            key = spec.kind if own else f"{spec.kind.removesuffix('_rounded')} (for {spec.kind})"
            return _fail(f"--params {key}: {e}")
    for n, path in enumerate(args.checkpoint or []):
        try:
            kind = checkpoint_kind(path)
        except ValueError as e:
            return _fail(str(e))
        label = "learned" if len(args.checkpoint) == 1 else f"learned{n}"
        specs.append(ControllerSpec(kind, {"checkpoint": str(path)}, label))
        print(f"{label}: {path}")
    budget = getattr(args, "sla_budget", None)
    if budget is not None and not all(0.0 <= b <= 1.0 for b in budget):
        return _fail(f"--sla-budget {budget[0]:g} {budget[1]:g}: two violation rates in [0, 1] "
                     f"(latency-critical, batch)")
    seeds = list(seeds_for(args.split, args.n_seeds))
    res = run_controllers(cfg, specs, seeds, args.workers, desc="episodes")
    cols = ("cost_usd", "energy_usd", "carbon_usd", "sla_usd", "energy_kwh", "carbon_kg",
            "sla_lc", "sla_batch", "decide_ms")
    variant = f" with --override {json.dumps(overrides)}" if overrides else ""
    print(f"{cfg.name}{variant}: N={cfg.fleet.n_servers}, {args.n_seeds} {args.split} seeds, "
          f"mean per episode")
    print(f"{'policy':14s}" + "".join(f"{c:>12s}" for c in cols))
    for spec, r in zip(specs, res, strict=True):
        print(f"{spec.name:14s}" + "".join(f"{np.mean([m[c] for m in r]):12.4f}" for c in cols))
    within = None
    if budget is not None:
        within = {spec.name: _within_budget(r, budget) for spec, r in zip(specs, res,
                                                                           strict=True)}
        print(f"share of seeds within the SLA budget (latency-critical <= {100 * budget[0]:g}%, "
              f"batch <= {100 * budget[1]:g}% violations per episode):")
        for name, w in within.items():
            print(f"{name:14s} LC {w['lc']:6.0%}   batch {w['batch']:6.0%}   both "
                  f"{w['both']:6.0%}")
    comparisons = _learned_vs_references(specs, res)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "command": " ".join(["cloudrl", *sys.argv[1:]]), "scenario": cfg.name,
            "override": overrides,
            "split": args.split, "seeds": seeds, "comparisons": comparisons,
            **({"sla_budget": list(budget), "within_budget": within} if within else {}),
            "policies": {s.name: {"kind": s.kind, "params": s.params, "per_seed": r}
                         for s, r in zip(specs, res, strict=True)}}, indent=2))
        print(f"wrote {out}")
    return 0


def _within_budget(episodes: list[dict], budget: list[float]) -> dict[str, float]:
    """The share of episodes within each class's violation-rate budget, and within both."""
    import numpy as np

    lc = np.array([m["sla_lc"] for m in episodes]) <= budget[0]
    batch = np.array([m["sla_batch"] for m in episodes]) <= budget[1]
    return {"lc": float(lc.mean()), "batch": float(batch.mean()),
            "both": float((lc & batch).mean())}


# what a user of the cluster envs calls the heuristic: on a scenario it is the signal-aware
# rule on top of power_aware
ALIASES = {"power_aware": "signal_aware", "heuristic": "signal_aware"}
REFERENCES = "references.json"


def _reference_params(checkpoints: list[str]) -> dict | None:
    """The tuned heuristic's and MPC's parameters that ``headline --publish`` stored beside
    the first checkpoint that has them (``references.json``), announced; else None."""
    for path in checkpoints:
        ref = Path(path) / REFERENCES
        if ref.is_file():
            data = json.loads(ref.read_text())
            print(f"signal_aware and mpc parameters from {ref} ({data.get('source', '')})")
            return {k: data[k] for k in ("signal_aware", "mpc") if k in data}
    return None


CHECKPOINT_KINDS = ("learned", "rllib")


def _fail(message: str) -> int:
    print(f"cloudrl: {message}", file=sys.stderr)
    return 2


def _learned_vs_references(specs: list, res: list[list[dict[str, float]]]) -> list[dict]:
    """Paired (by seed) cost differences of each learned policy against the heuristic and
    the MPC, in $ and in % of the heuristic's mean cost, printed and returned; and the
    decision times (median over episodes of each episode's p50 / p99)."""
    import numpy as np

    from cloudrl.scenarios.runner import paired_ci

    cost = {s.name: np.array([m["cost_usd"] for m in r]) for s, r in zip(specs, res, strict=True)}
    heur = next((s.name for s in specs if s.kind == "signal_aware"), None)
    refs = [s.name for s in specs
            if s.kind in ("signal_aware", "mpc", "mpc_rounded", "signal_aware_rounded")]
    out = []
    for s, r in zip(specs, res, strict=True):
        if s.kind not in CHECKPOINT_KINDS:
            continue
        p50 = float(np.median([m.get("decide_p50_ms", np.nan) for m in r]))
        p99 = float(np.median([m.get("decide_p99_ms", np.nan) for m in r]))
        print(f"{s.name}: decide p50 {p50:.3f} ms, p99 {p99:.3f} ms per decision (batch 1, "
              f"in-process)")
        for ref in refs:
            d, lo, hi = paired_ci(cost[s.name], cost[ref])
            row = {"policy": s.name, "vs": ref, "diff_usd": d, "ci95_usd": [lo, hi],
                   "decide_p50_ms": p50, "decide_p99_ms": p99}
            if heur is not None:
                base = float(cost[heur].mean())
                row["diff_pct_of_heuristic"] = 100 * d / base
                row["ci95_pct_of_heuristic"] = [100 * lo / base, 100 * hi / base]
            pct = ""
            if heur is not None:
                lo_p, hi_p = row["ci95_pct_of_heuristic"]
                pct = (f"  ({row['diff_pct_of_heuristic']:+.1f}% [{lo_p:+.1f}, {hi_p:+.1f}] "
                       f"of the heuristic)")
            print(f"{s.name} - {ref}: {d:+.2f} $ [{lo:+.2f}, {hi:+.2f}]{pct}")
            out.append(row)
    for s, r in zip(specs, res, strict=True):
        if s.kind in ("mpc", "mpc_rounded") and any("solve_p50_ms" in m for m in r):
            print(f"{s.name}: solve p50 {np.median([m['solve_p50_ms'] for m in r]):.1f} ms, "
                  f"p99 {np.median([m['solve_p99_ms'] for m in r]):.1f} ms per re-plan")
    return out


def _cmd_distill(args: argparse.Namespace) -> int:
    from cloudrl.algorithms.distill.command import train_to_dir
    from cloudrl.algorithms.distill.config import DistillConfig
    from cloudrl.mpc.forecast_mpc import MPCConfig

    if args.n_servers is not None and not 1 <= args.n_servers <= 4096:
        return _fail(f"--n-servers {args.n_servers}: expected 1..4096 servers")
    try:
        _, cfg = load_variant(args.scenario, None, n_servers=args.n_servers)
    except ScenarioInputError as e:
        return _fail(str(e))
    try:
        mpc_params = json.loads(args.mpc_params) if args.mpc_params else {}
        MPCConfig(**mpc_params)
        extra = {}
        if args.init_checkpoint:  # a fine-tune: the start's own hidden sizes and grids
            from cloudrl.algorithms.distill.policy import fine_tune_fields

            extra = fine_tune_fields(args.init_checkpoint)
        from cloudrl.algorithms.distill.actions import FINE_READY_MARGINS, FINE_RELEASE_LEVELS

        for flag, key, grid in (("fine_release", "release_levels", FINE_RELEASE_LEVELS),
                                ("fine_ready", "ready_margins", FINE_READY_MARGINS)):
            if getattr(args, flag):
                if args.init_checkpoint and extra[key] != tuple(grid):
                    raise ValueError(f"--{flag.replace('_', '-')}: the --init-checkpoint "
                                     f"has another grid")
                extra[key] = grid
        sim_mpc_params = None
        if args.teacher == "sim_mpc":
            from cloudrl.scenarios.yardstick import SIM_MPC_TUNED

            sim_mpc_params = {**SIM_MPC_TUNED, **json.loads(args.sim_mpc_params or "{}")}
        elif args.sim_mpc_params:
            raise ValueError("--sim-mpc-params needs --teacher sim_mpc")
        dc = DistillConfig(run_seed=args.run_seed, mpc_params=mpc_params,
                           sim_mpc_params=sim_mpc_params, n_expert_seeds=args.expert_seeds,
                           dagger_rounds=args.dagger_rounds,
                           dagger_seeds_per_round=args.dagger_seeds, n_val_seeds=args.val_seeds,
                           **extra)
    except (ValueError, TypeError) as e:
        return _fail(f"distill: {e}")
    train_to_dir(cfg, dc, args.out, args.expert_cache,
                 command=" ".join(["cloudrl", *sys.argv[1:]]))
    return 0


def _cmd_es(args: argparse.Namespace) -> int:
    from cloudrl.algorithms.distill.policy import CheckpointError, load_checkpoint
    from cloudrl.algorithms.es.command import train_to_dir
    from cloudrl.algorithms.es.config import ESConfig
    from cloudrl.scenarios import gated_es

    cfg = load_scenario(args.scenario)
    rllib = gated_es.is_rllib_checkpoint(args.init_checkpoint)
    try:
        ec = ESConfig(**{k: getattr(args, k) for k in (
            "run_seed", "iterations", "pairs", "seeds_per_candidate", "sigma", "lr",
            "eval_every", "n_val_seeds", "params", "workers")})
        if rllib:
            gated_es.check_start(args.init_checkpoint, ec.params)
            gated_es.check_out(args.init_checkpoint, args.out)
        else:
            load_checkpoint(args.init_checkpoint)
    except (ValueError, TypeError, CheckpointError) as e:
        return _fail(f"es: {e}")
    command = " ".join(["cloudrl", *sys.argv[1:]])
    if rllib:
        gated_es.train_to_dir(cfg, args.init_checkpoint, ec, args.out, command=command)
    else:
        train_to_dir(cfg, args.init_checkpoint, ec, args.out, command=command)
    return 0


def _cmd_scenario_headline(args: argparse.Namespace) -> int:
    from cloudrl.scenarios.headline import ScenarioHeadlineConfig, run_scenario_headline, tiny

    for flag in ("config", "reuse", "name"):
        if getattr(args, flag, None):
            return _fail(f"headline --scenario: --{flag} belongs to the cluster-env headline; "
                         f"use --params-from to reuse tuned parameters")
    try:  # an unknown name or a bad override fails before any work
        override, _ = load_variant("tiny" if args.tiny else args.scenario,
                                   getattr(args, "override", None))
    except ScenarioInputError as e:
        return _fail(str(e))
    kw = {k: getattr(args, k) for k in ("n_test_seeds", "n_val_seeds", "tune_samples",
                                         "tune_seeds", "mpc_samples", "params_from",
                                         "publish", "headline_json", "workers",
                                         "tracking_uri", "rl_env_steps", "expert_seeds",
                                         "dagger_rounds", "dagger_seeds",
                                         "distill_val_seeds", "es_iterations", "es_pairs",
                                         "es_params", "safe_sla_weight")
          if getattr(args, k) is not None}
    if args.run_seeds is not None:
        kw["run_seeds"] = tuple(args.run_seeds)
    if args.families is not None:
        kw["families"] = tuple(args.families)
    kw["out_dir"] = args.out_dir or "results/headline_scenario"
    if override:
        kw["override"] = override
    try:
        cfg = ScenarioHeadlineConfig(scenario=args.scenario, log=not args.no_log, **kw)
        if args.tiny:
            cfg = tiny(cfg)
    except ValueError as e:
        return _fail(str(e))
    out = run_scenario_headline(cfg)
    print("\n" + out.table)
    if cfg.tiny:
        print("\nthis was a smoke run (--tiny): 'tiny' scenario, 3 test seeds; its numbers "
              "say the pipeline runs, not how good the policy is")
    for path in out.paths:
        print(f"wrote {path}")
    if out.run_id:
        print(f"MLflow run {out.run_id} (experiment 'cloudrl-headline')")
    return 0


def extend_headline(head: argparse.ArgumentParser) -> None:
    """``cloudrl headline --scenario NAME``: the scenario form of the headline command."""
    plain = head.get_default("func")

    def dispatch(args: argparse.Namespace) -> int:
        return _cmd_scenario_headline(args) if args.scenario else plain(args)

    g = head.add_argument_group("scenario headline (with --scenario)")
    g.add_argument("--scenario", help="a named scenario (cloudrl scenarios list): tune the "
                                      "heuristic and the MPC, train the learned families on "
                                      "run seeds, select on validation seeds, claim the "
                                      "median run on the test seeds")
    g.add_argument("--n-test-seeds", type=int, help="test seeds (1..50; default 50)")
    g.add_argument("--n-val-seeds", type=int, help="validation seeds for selection (default 10)")
    g.add_argument("--tune-samples", type=int, help="heuristic random-search points (default 12)")
    g.add_argument("--tune-seeds", type=int, help="validation seeds for tuning (default 8)")
    g.add_argument("--mpc-samples", type=int, help="MPC random-search points (default 3)")
    g.add_argument("--params-from", metavar="JSON",
                   help="reuse the tuned parameters of a 'cloudrl scenarios headroom --json' "
                        "file instead of tuning")
    g.add_argument("--override", metavar="JSON",
                   help="a variant of the scenario: a JSON object merged into its definition "
                        "(as 'scenarios evaluate --override'); distilled families only, not "
                        "publishable")
    g.add_argument("--families", nargs="+",
                   help="learned families to train: distill, distill_default, distill_fine, "
                        "distill_fine_ready, each also with _es (then fine-tuned on the true "
                        "cost), bdq, dqn, ppo, gated_dqn, gated_dqn_safe, gated_dqn_margin "
                        "(gated_dqn with a margin over the rule picked on validation seeds; "
                        "default distill)")
    g.add_argument("--rl-env-steps", type=int, help="env steps per RLlib run (default 80640)")
    g.add_argument("--safe-sla-weight", type=float, metavar="W",
                   help="gated_dqn_safe: the SLA penalties times W in its training reward "
                        "(1..100; default 3)")
    g.add_argument("--expert-seeds", type=int,
                   help="train seeds the MPC plays for the distill families (default 20)")
    g.add_argument("--dagger-rounds", type=int, help="DAgger rounds per distill run (default 2)")
    g.add_argument("--dagger-seeds", type=int, help="train seeds per DAgger round (default 4)")
    g.add_argument("--distill-val-seeds", type=int,
                   help="validation seeds that pick a distill run's round (default 4)")
    g.add_argument("--es-iterations", type=int,
                   help="evolution-strategies iterations per *_es run (default 20)")
    g.add_argument("--es-pairs", type=int,
                   help="antithetic pairs per evolution-strategies iteration (default 8)")
    g.add_argument("--es-params",
                   help="what the evolution strategies move: head (the output layer, the "
                        "default) or all (every weight)")
    g.add_argument("--run-seeds", type=int, nargs="+", help="training run seeds (default 0 1 2)")
    g.add_argument("--publish", metavar="DIR", help="copy the claimed run's checkpoint here "
                                                    "(e.g. checkpoints/NAME)")
    g.add_argument("--headline-json", metavar="PATH",
                   help="insert the scenario's row into this JSON (e.g. "
                        "docs/results/headline.json)")
    g.add_argument("--workers", type=int, help="worker processes (default: CPUs)")
    g.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    head.set_defaults(func=dispatch)


def register(sub: argparse._SubParsersAction) -> None:
    sc = sub.add_parser("scenarios", help="named scenarios with prices, carbon, solar, job "
                                          "classes and power states; their headroom")
    ss = sc.add_subparsers(dest="scenarios_cmd", required=True)
    ls = ss.add_parser("list", help="the named scenarios, one line each")
    ls.set_defaults(func=_cmd_list)
    hr = ss.add_parser("headroom", help="tuned heuristic vs forecast MPC vs clairvoyant oracle "
                                        "on the held-out test seeds")
    hr.add_argument("--scenario", action="append", help="a scenario name (repeatable; "
                                                        "default: all but 'tiny')")
    hr.add_argument("--n-seeds", type=int, default=50, help="test seeds (1..50)")
    hr.add_argument("--tune-samples", type=int, default=16,
                    help="random-search points for the heuristic (validation seeds)")
    hr.add_argument("--mpc-samples", type=int, default=4,
                    help="random-search points for the MPC (1: its defaults)")
    hr.add_argument("--tune-seeds", type=int, default=10, help="validation seeds for tuning")
    hr.add_argument("--workers", type=int, default=None, help="worker processes (default: CPUs)")
    hr.add_argument("--json", help="write the table as JSON to this path")
    hr.add_argument("--markdown", help="write the table as Markdown to this path")
    hr.add_argument("--plot-dir", help="save a picture of one test episode per scenario here")
    hr.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, "
                                           "else sqlite:///$PWD/mlflow.db)")
    hr.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    hr.set_defaults(func=_cmd_headroom)
    ev = ss.add_parser("evaluate", help="controllers on one scenario, mean cost terms")
    ev.add_argument("--scenario", required=True)
    ev.add_argument("--policy", action="append",
                    help="signal_aware | mpc | oracle | run_at_once | deadline_aware | "
                         "sim_mpc | sim_hindsight | mpc_rounded | signal_aware_rounded "
                         "(repeatable; default: the first four; a *_rounded policy plays "
                         "through the env's 24 actions; sim_mpc re-plans on rollouts of the "
                         "simulator, seconds per re-plan)")
    ev.add_argument("--params", help="policy name -> its parameters: a JSON object, or a "
                    "file holding one (e.g. a checkpoint's references.json)")
    ev.add_argument("--split", default="test", choices=("train", "validation", "test"))
    ev.add_argument("--n-seeds", type=int, default=10)
    ev.add_argument("--workers", type=int, default=None)
    ev.add_argument("--n-servers", type=int, help="another fleet size (1..4096; the load "
                                                  "scales with it, utilization stays)")
    ev.add_argument("--override", metavar="JSON",
                    help="a JSON object merged into the scenario's definition (its catalog "
                         "keys; nested objects merge), e.g. '{\"executor\": "
                         "{\"spare_cores_frac\": 0.2}}': the same controllers on a variant")
    ev.add_argument("--checkpoint", action="append",
                    help="a learned policy's checkpoint directory (from 'cloudrl scenarios "
                         "distill'; repeatable): played beside the others, with paired cost "
                         "differences against the heuristic and the MPC")
    ev.add_argument("--sla-budget", type=float, nargs=2, metavar=("LC", "BATCH"),
                    help="per-class SLA budgets, violation rates per episode (e.g. 0.000522 "
                         "0.005658): print the share of seeds each policy keeps within them")
    ev.add_argument("--json", help="write per-seed metrics and the comparisons to this path")
    ev.set_defaults(func=evaluate_scenario)
    ds = ss.add_parser("distill", help="train a learned policy by imitating the forecast MPC "
                                       "(behaviour cloning + DAgger on train seeds)")
    ds.add_argument("--scenario", required=True)
    ds.add_argument("--run-seed", type=int, default=0, help="training run seed")
    ds.add_argument("--out", required=True, help="checkpoint directory to write")
    ds.add_argument("--mpc-params", help="JSON object of MPCConfig fields for the expert")
    ds.add_argument("--teacher", choices=("mpc", "sim_mpc"), default="mpc",
                    help="the expert: the fluid forecast MPC, or the plant-true sim-MPC "
                         "(warm-started by that MPC; slow: ~30 s per episode)")
    ds.add_argument("--sim-mpc-params", help="with --teacher sim_mpc: JSON object of "
                                             "SimMPCConfig fields over the tuned ones")
    ds.add_argument("--expert-cache", help=".npz path: reuse (or write) the MPC's recorded "
                                           "train-seed episodes; same scenario, seeds and MPC "
                                           "parameters only")
    ds.add_argument("--expert-seeds", type=int, default=20, help="train seeds the MPC plays")
    ds.add_argument("--dagger-rounds", type=int, default=2)
    ds.add_argument("--dagger-seeds", type=int, default=4, help="train seeds per DAgger round")
    ds.add_argument("--val-seeds", type=int, default=4, help="validation seeds that pick the round")
    ds.add_argument("--fine-release", action="store_true",
                    help="the policy's own release grid in steps of 0.05 (21 levels) instead "
                         "of the env's six")
    ds.add_argument("--fine-ready", action="store_true",
                    help="the policy's own ready margins (9, from -0.5 to 1.0) instead of the "
                         "env's four")
    ds.add_argument("--n-servers", type=int, help="another fleet size (1..4096; the load scales "
                                                  "with it)")
    ds.add_argument("--init-checkpoint", help="fine-tune this checkpoint (e.g. one trained on "
                                              "a smaller fleet) instead of starting afresh; "
                                              "it competes as round -1")
    ds.set_defaults(func=_cmd_distill)
    es = ss.add_parser("es", help="fine-tune a learned policy on the true cost by evolution "
                                  "strategies (train seeds; the start competes on validation)")
    es.add_argument("--scenario", required=True)
    es.add_argument("--init-checkpoint", required=True,
                    help="the checkpoint to start from: a distilled policy ('cloudrl "
                         "scenarios distill') or a Q-network of 'cloudrl train --scenario' "
                         "(e.g. the gated DQN, played with its margin)")
    es.add_argument("--out", required=True, help="checkpoint directory to write")
    es.add_argument("--run-seed", type=int, default=0, help="seeds the perturbations and "
                                                            "the train seeds drawn")
    es.add_argument("--iterations", type=int, default=20)
    es.add_argument("--pairs", type=int, default=8, help="antithetic pairs per iteration")
    es.add_argument("--seeds-per-candidate", type=int, default=4,
                    help="train seeds every perturbed policy plays per iteration")
    es.add_argument("--sigma", type=float, default=0.02, help="perturbation scale")
    es.add_argument("--lr", type=float, default=0.005, help="Adam step size")
    es.add_argument("--eval-every", type=int, default=5,
                    help="iterations between validation scores")
    es.add_argument("--n-val-seeds", type=int, default=10,
                    help="validation seeds that pick the iteration kept")
    es.add_argument("--params", default="head", help="head (the logits layer, or the Q "
                                                     "head's last layer) or all")
    es.add_argument("--workers", type=int, default=None)
    es.set_defaults(func=_cmd_es)
    from cloudrl.scenarios.steer_cli import add_steer_parser

    add_steer_parser(ss)
    from cloudrl.scenarios.offline_cli import add_offline_parser

    add_offline_parser(ss)
    from cloudrl.scenarios.supervise_cli import add_supervise_parser

    add_supervise_parser(ss)
    from cloudrl.scenarios.align_cli import add_align_parser

    add_align_parser(ss)
    from cloudrl.scenarios.bound_cli import add_bound_parser

    add_bound_parser(ss)
    from cloudrl.scenarios.yardstick_cli import add_yardstick_parser

    add_yardstick_parser(ss)
