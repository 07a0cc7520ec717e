"""The ``cloudrl`` command line: evaluate, train, sweep and compare policies, import traces."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from cloudrl import serve_cli, signals_cli, trace_import
from cloudrl.algorithms.specs import ALGOS
from cloudrl.alignment import cli as align_cli
from cloudrl.argparsing import CliParser
from cloudrl.config_loader import ConfigError, load_config
from cloudrl.deploy import cli as deploy_cli
from cloudrl.headline import cli as headline_cli
from cloudrl.labelling import cli as label_cli
from cloudrl.loop import cli as loop_cli
from cloudrl.offline import cli as offline_cli
from cloudrl.quiet import quiet_environment, quiet_library_logs
from cloudrl.scenarios import cli as scenarios_cli
from cloudrl.sites import cli as sites_cli
from cloudrl.steer import cli as steer_cli
from envs.scenario.catalog import UnknownScenarioError
from envs.workloads import WORKLOAD_KINDS
from envs.workloads.google_trace import TraceFileError, TraceFormatError

# Installed on import too: the evaluation pool's spawned workers re-import the console
# script, and with it this module, so they drop the same library noise as this process.
quiet_library_logs()


def _env_overrides(args: argparse.Namespace) -> dict[str, Any]:
    env: dict[str, Any] = {}
    if args.n_servers is not None:
        env["n_servers"] = args.n_servers
    if args.workload is not None:
        env["workload"] = {"kind": args.workload}
        if args.workload == "trace":
            if not args.trace:
                raise ConfigError(
                    "--workload trace needs --trace FILE (from `cloudrl trace import`)")
            _check_trace(args.trace, "--trace")
            env["workload"]["path"] = args.trace
    if args.episode_length is not None:
        env["sim"] = {"episode_length": args.episode_length}
    return env


def _check_trace(path: str, what: str) -> None:
    """A clear error now for a trace file that the envs could not replay later."""
    from envs.workloads.trace_replay import check_trace_file

    try:
        check_trace_file(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: {e}") from None


def _check_checkpoints(checkpoints: list[str], cfg: Any) -> None:
    """Each checkpoint fits the evaluation's interface and env (before any worker starts)."""
    from types import SimpleNamespace

    from cloudrl.checkpoint_policy import CheckpointPolicy, read_meta
    from envs.env_config import EnvConfig

    for path in checkpoints:
        try:
            meta = read_meta(path)
            if meta["interface"] != cfg.interface:
                raise ValueError(f"{path} acts on the {meta['interface']} interface, the "
                                 f"evaluation on {cfg.interface}")
            trained = SimpleNamespace(env_config=EnvConfig.model_validate(meta["env"]),
                                      path=Path(path))
            CheckpointPolicy.check_env(trained, cfg.env)  # type: ignore[arg-type]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"--checkpoint: {e}") from None


def _eval_out(cfg: Any, checkpoints: list[str], policies: list[str] | None) -> Path:
    """``results/eval_<run>_<workload>_n<N>_<interface>_<split><seeds>``, named by what ran:
    the checkpoints' dir names and the heuristics asked for (else ``heuristics``)."""
    names = [Path(c).resolve().name for c in checkpoints]
    names += [p for p in policies or [] if p != "all"]
    run = "+".join(names) or "heuristics"
    return Path(f"results/eval_{run}_{cfg.env.workload.kind}_n{cfg.env.sim.fleet.n_servers}"
                f"_{cfg.interface}_{cfg.split}{cfg.n_seeds}")


def _int_in(low: int, high: int | None = None) -> Any:
    """An argparse type: an int in [low, high] (argparse names the option on error)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{value} is not {bounds}")
        return value

    parse.__name__ = "int"  # argparse's "invalid int value: 'x'"
    return parse


def _add_env_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="config file (CLOUDRL__* env vars override)")
    p.add_argument("--workload", choices=WORKLOAD_KINDS, help="workload kind (default poisson)")
    p.add_argument("--trace", metavar="NPZ", help="compact trace file for --workload trace")
    p.add_argument("--n-servers", type=int, help="fleet size (default 15)")
    p.add_argument("--episode-length", type=int, help="ticks per episode (default 1000)")
    p.add_argument("--interface", choices=("flat", "branching"), help="action interface")


def _cmd_evaluate(args: argparse.Namespace) -> int:
    if getattr(args, "scenario", None):  # a named scenario: its own controllers and table
        from types import SimpleNamespace

        return scenarios_cli.evaluate_scenario(SimpleNamespace(
            scenario=args.scenario, policy=args.policy, params=None,
            checkpoint=args.checkpoint, split=args.split or "test",
            n_seeds=args.n_seeds or 50, workers=args.workers, json=None,
            n_servers=args.n_servers))
    from cloudrl.evaluate import (
        EvalConfig,
        evaluate,
        format_table,
        summary_rows,
        write_results,
    )

    overrides: dict[str, Any] = {"env": _env_overrides(args)}
    checkpoints = getattr(args, "checkpoint", None) or []
    if checkpoints:
        # A checkpoint brings the env it was trained on; flags still override it.
        from cloudrl.checkpoint_policy import read_meta

        try:
            meta = read_meta(checkpoints[0])
        except (OSError, ValueError) as e:
            raise ConfigError(f"--checkpoint: {e}") from None
        overrides["env"] = {**meta["env"], **overrides["env"]}
        overrides.setdefault("interface", meta["interface"])
    for key in ("interface", "split", "n_seeds", "workers"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.policy or checkpoints:
        overrides["policies"] = checkpoints + (args.policy or ["all"])
    if getattr(args, "heuristic_params", None):  # a tuned heuristic: its own row, <name>_tuned
        from cloudrl.headline.tuning import load_tuned

        tuned = load_tuned(args.heuristic_params)
        overrides["heuristic_params"] = {tuned.heuristic: tuned.params}
        overrides["policies"] = overrides.get("policies", ["all"]) + [tuned.name]
    cfg = load_config(EvalConfig, args.config, overrides)
    _check_checkpoints(checkpoints, cfg)
    if cfg.env.workload.kind == "trace":
        _check_trace(cfg.env.workload.path, "env.workload.path")
    results = evaluate(cfg, progress=not args.quiet)
    rows = summary_rows(results)
    wl = cfg.env.workload.kind
    n = cfg.env.sim.fleet.n_servers
    print(f"\n{cfg.split} seeds: {cfg.n_seeds}, workload {wl}, N={n}, "
          f"interface {cfg.interface}, {cfg.env.sim.episode_length} ticks/episode")
    print(format_table(rows))
    out = Path(args.out) if args.out else _eval_out(cfg, checkpoints, args.policy)
    for path in write_results(results, rows, out, cfg):
        print(f"wrote {path}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import json

    from cloudrl.ray_utils import init_ray
    from cloudrl.training import TrainConfig, train

    scenario = getattr(args, "scenario", None)
    if scenario:  # a named scenario brings its own env: no cluster env flags
        given = [flag for flag, key in (("--workload", "workload"), ("--trace", "trace"),
                                        ("--n-servers", "n_servers"),
                                        ("--episode-length", "episode_length"))
                 if getattr(args, key) is not None]
        if given:
            raise ConfigError(f"--scenario trains on the scenario's own env; drop "
                              f"{' '.join(given)}")
        from envs.scenario.catalog import load_scenario

        load_scenario(scenario)  # an unknown name: one line listing the valid ones
    overrides: dict[str, Any] = {"scenario": scenario} if scenario else {
        "env": _env_overrides(args)}
    if scenario and getattr(args, "heuristic_params", None):
        from cloudrl.scenarios.rl_policy import heuristic_params

        try:  # the rule the gated DQN picks presets of, and the validation's reference
            overrides["scenario_heuristic"] = heuristic_params(args.heuristic_params, scenario)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if getattr(args, "sla_weight", None) is not None:
        if not scenario:
            raise ConfigError("--sla-weight goes with --scenario")
        overrides["scenario_sla_weight"] = args.sla_weight
    for key in ("algo", "env_steps", "num_env_runners", "num_learners", "run_seed",
                "num_gpus_per_learner", "checkpoint_every"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.hparams:
        try:
            overrides["hparams"] = json.loads(args.hparams)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--hparams is not valid JSON: {e}") from None
    if args.out:
        overrides["checkpoint_dir"] = args.out
    if args.resume:
        overrides["resume"] = True
    cfg = load_config(TrainConfig, args.config, overrides)
    if cfg.scenario is not None:
        return _train_scenario(cfg, args)
    init_ray()

    def report(it: int, m: dict[str, float]) -> None:
        if "episode_return_mean" in m:
            episodes = (f"return {m['episode_return_mean']:9.2f}  "
                        f"energy {m.get('energy_kwh', float('nan')):7.2f} kWh  "
                        f"viol {m.get('sla_violation_rate', float('nan')):.4f}")
        else:
            episodes = "(no episode ended this iteration)"
        print(f"iter {it:3d}  env_steps {int(m['env_steps']):7d}  {episodes}  "
              f"({m['wall_s']:.0f} s)", flush=True)

    path, _ = train(cfg, on_iteration=report)
    print(f"checkpoint: {path}")
    if args.eval_seeds:
        ns = argparse.Namespace(
            config=None, workload=None, trace=None, n_servers=None, episode_length=None,
            interface=None, split="test", n_seeds=args.eval_seeds, workers=None,
            policy=None, checkpoint=[str(path)], out=None, quiet=False)
        return _cmd_evaluate(ns)
    return 0


def compare_with_heuristic(scenario: str, checkpoints: dict[str, Any], seeds: list[int],
                           params: dict[str, Any] | None = None, workers: int | None = None
                           ) -> dict[str, list[dict[str, float]]]:
    """Per-seed metrics of the signal-aware heuristic (``"heuristic"``, with ``params``) and
    of each ``cloudrl train --scenario`` checkpoint (by its label) on ``seeds``, paired, with
    the scenario runner (the sweep's ``ScenarioEvaluator``)."""
    from cloudrl.scenarios.rl_policy import RLCheckpointError, read_scenario_meta
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers
    from envs.scenario.catalog import load_scenario

    for path in checkpoints.values():  # fails here, before any worker starts
        try:
            read_scenario_meta(path)
        except RLCheckpointError as e:
            raise ConfigError(str(e)) from None
    specs = [ControllerSpec("signal_aware", dict(params or {}), "heuristic")]
    specs += [ControllerSpec("rllib", {"checkpoint": str(path)}, label)
              for label, path in checkpoints.items()]
    res = run_controllers(load_scenario(scenario), specs, list(seeds), workers)
    return {spec.name: r for spec, r in zip(specs, res, strict=True)}


def _train_scenario(cfg: Any, args: argparse.Namespace) -> int:
    """``cloudrl train --scenario``: train (one MLflow run), then play the greedy policy and
    the signal-aware heuristic on validation seeds with the scenario runner; print the
    table and log it into the run."""
    from cloudrl.protocol import validation_seeds
    from cloudrl.ray_utils import init_ray
    from cloudrl.scenarios import rl_policy
    from cloudrl.training import train_logged

    try:
        params = rl_policy.heuristic_params(getattr(args, "heuristic_params", None),
                                            cfg.scenario)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    n_val = 5 if args.eval_seeds is None else args.eval_seeds
    if not 0 <= n_val <= 50:
        raise ConfigError(f"--eval-seeds {n_val}: expected 0..50 validation seeds")
    experiment = getattr(args, "experiment", None) or "cloudrl-train"
    init_ray()

    def report(it: int, m: dict[str, float]) -> None:
        episodes = (f"cost {m['cost_usd']:8.2f} $  {m.get('energy_kwh', 0.0):8.1f} kWh  "
                    f"{m.get('carbon_kg', 0.0):7.1f} kgCO2" if "cost_usd" in m
                    else "(no episode ended this iteration)")
        print(f"iter {it:3d}  env_steps {int(m['env_steps']):7d}  {episodes}  "
              f"({m['wall_s']:.0f} s)", flush=True)

    def validate(path: Path) -> dict[str, float]:
        if not n_val:
            return {}
        res = compare_with_heuristic(
            cfg.scenario, {cfg.algo: path}, list(validation_seeds(n_val)), params,
            getattr(args, "eval_workers", None))
        print(f"\n{cfg.scenario}: greedy {cfg.algo} vs the signal-aware heuristic "
              f"({'given parameters' if params else 'defaults'}) on {n_val} validation "
              f"seeds, mean per episode")
        print(rl_policy.format_table(res))
        return rl_policy.comparison_metrics(res, cfg.algo)

    path, _, run_id = train_logged(cfg, getattr(args, "tracking_uri", None), experiment,
                                   report, validate)
    print(f"checkpoint: {path}\nMLflow: run {run_id}, experiment {experiment!r}")
    return 0


def whole_episodes(env_steps: int, episode_length: int, parallel_envs: int) -> int:
    """``env_steps`` rounded up so that every vectorized env ends its last episode.

    RLlib reports an episode's return when the episode ends; a budget that stops the
    ``parallel_envs`` envs mid-episode leaves the end of the learning curve unlogged
    (30k steps with 8 envs of 1,000-tick episodes: the last point at 24k).
    """
    chunk = episode_length * parallel_envs
    return -(-env_steps // chunk) * chunk


# The demo's learned policy: the gated DQN over the power-aware heuristic (it picks one of
# the heuristic's presets every DEMO_DECISION_EVERY ticks; preset 0 is power_aware itself).
DEMO_DECISION_EVERY = 5
HEADLINE_NOTE = (
    "Where learning stands on this cluster workload: at full size (N=50 servers, 50 test "
    "seeds) no learned policy beats the tuned power_aware heuristic yet; the gated DQN that "
    "`cloudrl headline --config experiments/configs/headline.yaml` trains (60k decisions per "
    "workload, about 18 min on 2 cores) ties it (docs/results/headline.md). The scenario policies "
    "of part 1 are where learning wins.")


def demo_hparams(env_steps: int) -> dict[str, Any]:
    """The demo's gated_dqn hyperparameters for a budget of ``env_steps`` decisions."""
    return {"decision_every": DEMO_DECISION_EVERY, "gamma": 0.97,
            "epsilon": [[0, 0.5], [max(1, env_steps // 2), 0.02]],
            "num_steps_sampled_before_learning_starts": min(1000, env_steps // 5)}


def _cmd_demo(args: argparse.Namespace) -> int:
    """The README's main job: train the gated DQN over the power-aware heuristic on the train
    seeds, evaluate it and the four heuristics on the held-out test seeds (branching
    interface), log all of it to MLflow, print the table and where the headline stands."""
    from cloudrl.training import TrainConfig
    from envs.sim_config import SimConfig

    started = time.monotonic()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    quiet_environment()  # before Ray starts, so its workers inherit it
    if args.skip_scenario and args.skip_training:
        print("cloudrl: demo: --skip-scenario and --skip-training leave nothing to run",
              file=sys.stderr)
        return 2
    envs = TrainConfig.model_fields["envs_per_runner"].default
    ticks = SimConfig.model_fields["episode_length"].default
    steps = -(-ticks // DEMO_DECISION_EVERY)  # decisions per episode
    env_steps = whole_episodes(args.env_steps, steps, envs)
    if env_steps != args.env_steps:
        print(f"demo: --env-steps {args.env_steps} rounded up to {env_steps}: whole episodes "
              f"({steps} decisions of {DEMO_DECISION_EVERY} ticks) on each of the {envs} "
              f"vectorized envs, so the learning curve reaches the end of training", flush=True)
    overrides: dict[str, Any] = {
        "algos": ["gated_dqn"], "workloads": [args.workload], "run_seeds": [0],
        "n_servers": args.n_servers, "env_steps": env_steps, "eval_seeds": args.n_seeds,
        "experiment": args.experiment, "max_concurrent_trials": 1,
        "hparams": {"gated_dqn": demo_hparams(env_steps)}, "verbose": 0,
    }
    if args.tracking_uri:
        overrides["tracking_uri"] = args.tracking_uri
    ns = argparse.Namespace(config=None, algos=None, workloads=None, run_seeds=None,
                            n_servers=None, episode_length=None, env_steps=None,
                            eval_seeds=None, eval_workers=None, experiment=None,
                            tracking_uri=None, storage_path=None, max_concurrent_trials=None,
                            name=None, _overrides=overrides)
    if not args.skip_training:  # a bad training setting fails before the scenario part runs
        from cloudrl.sweep import SweepConfig

        load_config(SweepConfig, None, overrides)
    scenario = None
    if not args.skip_scenario:
        scenario = _demo_scenario(args)
        if scenario is None:
            return 2
    if args.skip_training:
        if scenario is not None and (args.report_md or args.report_img):
            _write_demo_report(args, None, time.monotonic() - started, load, scenario)
        return 0
    if not args.skip_scenario:
        print(f"[2/2] train gated_dqn over power_aware on {args.workload}, N={args.n_servers}, "
              f"and compare it with the heuristics", flush=True)
    code = _cmd_sweep(ns)
    compare = argparse.Namespace(experiment=args.experiment, tracking_uri=args.tracking_uri,
                                 out=None, sweep_id=None, no_log=False)
    code = code or _cmd_compare(compare)
    print(f"\n{HEADLINE_NOTE}")
    result = getattr(compare, "result", None)
    if not code and result is not None and (args.report_md or args.report_img):
        _write_demo_report(args, result, time.monotonic() - started, load, scenario)
    return code


def _demo_scenario(args: argparse.Namespace) -> Any:
    """The demo's first part: the committed learned policy of a headline scenario, live,
    against the tuned heuristic, the forecast MPC and the oracle on the test seeds (printed
    and logged to MLflow). None after a one-line error on stderr."""
    from cloudrl.scenarios.demo import format_table, run_scenario_demo, verdict
    from envs.scenario.catalog import UnknownScenarioError

    picture = args.scenario_img or f"results/demo/{args.scenario}_episode.png"
    print(f"[1/2] {args.scenario}: the committed learned policy against the tuned heuristic, "
          f"the forecast MPC and the clairvoyant oracle on {args.scenario_seeds} test seeds",
          flush=True)
    try:
        demo = run_scenario_demo(args.scenario, args.checkpoint, args.scenario_seeds,
                                 picture=picture)
    except (ValueError, UnknownScenarioError) as e:
        print(f"cloudrl: {e}", file=sys.stderr)
        return None
    print(format_table(demo))
    print(verdict(demo))
    print(f"one test episode (signal, grid draw of each policy, when deferrable work ran): "
          f"{demo.picture} ({demo.wall_s:.0f} s)\n", flush=True)
    _log_demo_scenario(args, demo)
    return demo


def _log_demo_scenario(args: argparse.Namespace, demo: Any) -> None:
    """One MLflow run in the demo's experiment: every row's means and paired differences."""
    from cloudrl import tracking

    client, run_id = tracking.open_run(args.tracking_uri, args.experiment,
                                       f"scenario-{demo.scenario}",
                                       {"kind": "demo-scenario", "scenario": demo.scenario})
    with tracking.finishing(client, run_id):
        tracking.log_params(client, run_id, {"checkpoint": demo.checkpoint,
                                             "n_test_seeds": demo.n_seeds})
        metrics: dict[str, float] = {}
        for row in demo.rows:
            who = row["policy"].split(" ")[0]
            metrics.update({f"{who}.{k}": v for k, v in row.items()
                            if isinstance(v, float)})
            if "vs_heuristic_pct" in row:
                metrics[f"{who}.vs_heuristic_pct"] = row["vs_heuristic_pct"][0]
        metrics["learned.vs_mpc_pct"] = demo.learned["vs_mpc_pct"][0]
        tracking.log_metrics(client, run_id, metrics)
        if demo.picture:
            tracking.log_artifacts(client, run_id, [demo.picture])


def _write_demo_report(args: argparse.Namespace, result: dict[str, Any] | None, wall_s: float,
                       load: tuple[float, ...] | None, scenario: Any = None) -> None:
    """The demo's tables as a markdown page and its picture (``--report-md``/``--report-img``)."""
    from cloudrl.compare import LEARNED_NOTE
    from cloudrl.demo_report import DemoReport, machine_line, today, write_report
    from cloudrl.evaluate import format_table

    sections, notes, figures = [], [], []
    page_dir = Path(args.report_md).parent if args.report_md else Path()
    if scenario is not None:
        from cloudrl.scenarios.demo import format_table as scenario_table
        from cloudrl.scenarios.demo import verdict

        heading = (f"{scenario.scenario}: the committed learned policy, live, "
                   f"{scenario.n_seeds} test seeds")
        sections.append((heading,
                         scenario_table(scenario, markdown=True) + "\n\n" + verdict(scenario)))
        notes += scenario.notes
        if scenario.picture:
            figures.append((heading, Path(os.path.relpath(scenario.picture, page_dir)).as_posix(),
                            f"{scenario.scenario}, one test episode: price and carbon; the grid "
                            f"draw of the learned policy, the heuristic, the MPC and the oracle; "
                            f"busy batch cores"))
    if result is not None:
        sections += [(result["titles"][group], format_table(rows, markdown=True))
                     for group, rows in result["tables"].items()]
        notes.append(LEARNED_NOTE)
        if args.report_img:
            figures.append(("", Path(os.path.relpath(args.report_img, page_dir)).as_posix(),
                            "Energy against SLA violation rate for each policy of the training "
                            "part, with 95% confidence bars"))
    flags = "" if args.n_servers == 15 and args.workload == "poisson" else \
        f" --workload {args.workload} --n-servers {args.n_servers}"
    report = DemoReport(title="What the demo prints", command=f"cloudrl demo{flags}",
                        sections=sections, notes=notes, figures=figures, wall_s=wall_s,
                        machine=machine_line(load), date=today())
    written = write_report(report, args.report_md) if args.report_md else []
    if args.report_img and result is not None:  # drawn from the same tables as the page
        from cloudrl.compare import pareto_plot

        Path(args.report_img).parent.mkdir(parents=True, exist_ok=True)
        written.append(pareto_plot(result["tables"], Path(args.report_img)))
    for path in written:
        print(f"wrote {path}")


def _scenario_sweep_args(args: argparse.Namespace) -> dict[str, Any]:
    """``cloudrl sweep --scenario NAME [--heuristic-params JSON]``: the SweepConfig keys."""
    from cloudrl.scenarios.rl_policy import heuristic_params

    scenario = getattr(args, "scenario", None)
    if not scenario:
        if getattr(args, "heuristic_params", None):
            raise ConfigError("--heuristic-params goes with --scenario")
        return {}
    given = [f"--{k.replace('_', '-')}" for k in ("workloads", "n_servers", "episode_length")
             if getattr(args, k, None) is not None]
    if given:
        raise ConfigError(f"--scenario sweeps the scenario's own env; drop {' '.join(given)}")
    from envs.scenario.catalog import load_scenario

    load_scenario(scenario)  # an unknown name: one line listing the valid ones
    try:
        params = heuristic_params(getattr(args, "heuristic_params", None), scenario)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return {"scenario": scenario, **({"scenario_heuristic": params} if params else {})}


def _scenario_quality(row: dict[str, Any]) -> str:
    """A scenario sweep row's test means: cost, energy, carbon, SLA per class."""
    return (f"cost {row['test/cost_usd_mean']:8.2f} $  {row['test/energy_kwh_mean']:8.1f} kWh  "
            f"{row['test/carbon_kg_mean']:7.1f} kgCO2  SLA LC {100 * row['test/sla_lc_mean']:.3f}%"
            f"  batch {100 * row['test/sla_batch_mean']:.3f}%")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from cloudrl.sweep import SweepConfig, experiment_dir, resume_sweep, run_sweep, saved_sweep

    overrides: dict[str, Any] = _scenario_sweep_args(args)
    for key in ("algos", "workloads", "run_seeds", "n_servers", "episode_length", "env_steps",
                "eval_seeds", "eval_workers", "experiment", "tracking_uri", "storage_path",
                "max_concurrent_trials", "name", "max_failures"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    resume = getattr(args, "resume", None)
    if resume:
        # The sweep's own config (saved in its experiment dir) is the only one that fits the
        # trials Tune restores; --storage-path only helps find the dir by name.
        given = [f"--{k.replace('_', '-')}".replace("scenario-heuristic", "heuristic-params")
                 for k in overrides if k != "storage_path"]
        given += ["--config"] if args.config else []
        if given:
            raise ConfigError(f"--resume continues a sweep with its saved config; drop "
                              f"{' '.join(given)}")
        exp = experiment_dir(resume, overrides.get("storage_path"))
        cfg = saved_sweep(exp)
        out = resume_sweep(exp, evaluate_scenario=compare_with_heuristic)
    else:
        overrides = {**getattr(args, "_overrides", {}), **overrides}
        cfg = load_config(SweepConfig, args.config, overrides)
        out = run_sweep(cfg, evaluate_scenario=compare_with_heuristic)
    print(f"\nsweep {out['sweep_id']}: {len(out['learned'])} trials evaluated on "
          f"{cfg.eval_seeds} test seeds, {len(out['heuristics'])} heuristic runs")
    for row in out["learned"]:
        restarts = f"  restarts {row['num_failures']}" if row["num_failures"] else ""
        quality = _scenario_quality(row) if cfg.scenario is not None else (
            f"energy {row['test/energy_kwh_mean']:8.2f} kWh  "
            f"SLA viol. {100 * row['test/sla_violation_rate_mean']:6.2f}%")
        print(f"  {row['policy']:4s} {row['workload']:15s} seed {row['run_seed']}  "
              f"env_steps {row['env_steps']:7d}  {quality}  "
              f"checkpoint {row['checkpoint']}{restarts}")
    for row in out["heuristics"] if cfg.scenario is not None else []:
        print(f"  heuristic {row['policy']} (the same test seeds)  {_scenario_quality(row)}")
    for trial in out["failed"]:
        print(f"  FAILED trial {trial}", file=sys.stderr)
    if out["failed"]:
        print(f"  retry them from their last checkpoints: "
              f"cloudrl sweep --resume {out['experiment_dir']}", file=sys.stderr)
    print(f"files (checkpoints, evaluations): {out['experiment_dir']}\n"
          f"MLflow: {out['tracking_uri']} experiment {out['experiment']!r}\n"
          f"compare: cloudrl compare --experiment {out['experiment']} "
          f"--tracking-uri {out['tracking_uri']}")
    return 1 if out["failed"] else 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from cloudrl.compare import LEARNED_NOTE, run_compare

    out_dir = args.out or str(Path("results") / "compare" / args.experiment)
    out = run_compare(args.experiment, args.tracking_uri, out_dir, args.sweep_id,
                      log_to_mlflow=not args.no_log)
    args.result = out  # the demo reads the tables back for its report
    for group, text in out["text"].items():
        print(f"\n{out['titles'][group]}  (sweep {', '.join(out['sweeps'])})")
        print(text)
    print(f"\n{LEARNED_NOTE}")
    for path in out["paths"]:
        print(f"wrote {path}")
    if out["run_id"]:
        print(f"logged to MLflow run {out['run_id']} ('compare')")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="cloudrl", description="Evaluate, train, sweep and compare "
                     "policies, import traces, serve decisions. Algorithms (train --algo, "
                     f"sweep --algos): {', '.join(ALGOS)}.")
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("evaluate", help="evaluate policies on the held-out test seeds")
    _add_env_args(ev)
    ev.add_argument("--policy", action="append",
                    help="heuristic name or 'all' (repeatable; default all)")
    ev.add_argument("--checkpoint", action="append",
                    help="trained checkpoint dir (repeatable); compared with --policy "
                         "(default: all heuristics)")
    ev.add_argument("--heuristic-params", metavar="JSON",
                    help="tuned parameters from cloudrl tune-heuristic: adds the row "
                         "<heuristic>_tuned (e.g. power_aware_tuned)")
    ev.add_argument("--split", choices=("test", "validation", "train"),
                    help="seed pool (default test)")
    ev.add_argument("--n-seeds", type=int, help="seeds to run (default 50)")
    ev.add_argument("--workers", type=int, help="worker processes (default 2)")
    ev.add_argument("--out", help="output path stem for .csv and .json (default: results/"
                    "eval_<checkpoint names or heuristics>_<workload>_n<N>_<interface>_"
                    "<split><n seeds>)")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.add_argument("--scenario", help="a named scenario (cloudrl scenarios list); --policy "
                                       "then takes signal_aware, mpc, oracle, run_at_once")
    ev.set_defaults(func=_cmd_evaluate)

    demo = sub.add_parser("demo", help="main job: a committed learned policy live against the "
                          "tuned heuristic, the MPC and the oracle on a headline scenario; then "
                          "train the gated DQN over power_aware and compare it with the "
                          "heuristics; all logged to MLflow")
    demo.add_argument("--workload", choices=WORKLOAD_KINDS[:2], default="poisson",
                      help="synthetic workload to train and evaluate on")
    demo.add_argument("--n-servers", type=_int_in(1, 4096), default=15, help="fleet size N")
    demo.add_argument("--env-steps", type=_int_in(1), default=9_600,
                      help="training budget in decisions (one per 5 ticks), rounded up to "
                           "whole 200-decision episodes on each of the 8 vectorized envs "
                           "(a multiple of 1,600)")
    demo.add_argument("--n-seeds", type=_int_in(1, 50), default=50,
                      help="held-out test seeds to evaluate on")
    demo.add_argument("--experiment", default="cloudrl-demo",
                      help="MLflow experiment; tables and plots go to "
                           "results/compare/<experiment>/")
    demo.add_argument("--tracking-uri",
                      help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else "
                           "sqlite:///$PWD/mlflow.db)")
    demo.add_argument("--report-md", metavar="FILE",
                      help="also write the printed tables as a markdown page, with the "
                           "command, duration and machine (e.g. docs/results/demo.md)")
    demo.add_argument("--report-img", metavar="FILE",
                      help="also draw the energy-vs-violations picture of the same tables there "
                           "(e.g. docs/img/demo.png)")
    demo.add_argument("--scenario", default="scarcity_spikes",
                      help="headline scenario whose committed checkpoint the first part "
                           "evaluates live (checkpoints/<scenario>)")
    demo.add_argument("--checkpoint", help="evaluate this checkpoint instead (a directory "
                                           "with references.json)")
    demo.add_argument("--scenario-seeds", type=_int_in(1, 50), default=50,
                      help="test seeds of the scenario part")
    demo.add_argument("--scenario-img", metavar="FILE",
                      help="the scenario part's episode picture (default "
                           "results/demo/<scenario>_episode.png)")
    demo.add_argument("--skip-scenario", action="store_true",
                      help="only the training part")
    demo.add_argument("--skip-training", action="store_true",
                      help="only the scenario part")
    demo.set_defaults(func=_cmd_demo)

    tr = sub.add_parser("train", help="train a masked PPO, DQN, APPO, IMPALA (flat) or BDQ "
                                      "(branching) policy on the train seeds")
    _add_env_args(tr)
    tr.add_argument("--algo", choices=ALGOS, help="algorithm (default ppo)")
    tr.add_argument("--env-steps", "--timesteps", dest="env_steps", type=int,
                    help="env-step budget (default 20000)")
    tr.add_argument("--num-env-runners", type=int, help="remote env runners (default 0)")
    tr.add_argument("--num-learners", type=int,
                    help="remote learner actors (default 0: learn in the driver)")
    tr.add_argument("--run-seed", type=int, help="run seed (default 0)")
    tr.add_argument("--num-gpus-per-learner", type=float,
                    help="GPUs for the learner (cluster; default 0 = CPU)")
    tr.add_argument("--hparams", help="JSON dict passed to AlgorithmConfig.training()")
    tr.add_argument("--out", help="checkpoint directory (default: results/checkpoints/"
                                  "<algo>_<workload>_n<N>_s<run seed>)")
    tr.add_argument("--checkpoint-every", type=int,
                    help="checkpoint every k iterations (default 0: at the end only)")
    tr.add_argument("--resume", action="store_true",
                    help="continue from the checkpoint in --out (e.g. after the driver died)")
    tr.add_argument("--eval-seeds", type=int,
                    help="after training, evaluate on this many test seeds vs the heuristics "
                         "(default 0; with --scenario: validation seeds, default 5)")
    tr.add_argument("--scenario", help="train on a named scenario (cloudrl scenarios list) "
                                       "with --algo ppo, dqn or bdq instead of a --workload; "
                                       "logged to MLflow, then played greedily against the "
                                       "signal-aware heuristic on validation seeds")
    tr.add_argument("--heuristic-params", metavar="JSON",
                    help="with --scenario: the signal-aware heuristic's parameters (a JSON "
                         "object or file; default its defaults)")
    tr.add_argument("--sla-weight", type=float, metavar="W",
                    help="with --scenario: multiply the SLA penalties by W in the training "
                         "reward only (0..100, default 1); evaluation keeps the scenario's "
                         "cost")
    tr.add_argument("--eval-workers", type=int,
                    help="with --scenario: processes for the validation (default: CPUs)")
    tr.add_argument("--experiment", help="with --scenario: MLflow experiment "
                                         "(default cloudrl-train)")
    tr.add_argument("--tracking-uri", help="with --scenario: MLflow tracking URI (default "
                                           "$MLFLOW_TRACKING_URI, else sqlite:///$PWD/mlflow.db)")
    tr.set_defaults(func=_cmd_train)

    sw = sub.add_parser("sweep", help="Ray Tune sweep: algos x run seeds x workloads, "
                                      "tracked in MLflow, evaluated on the test seeds")
    sw.add_argument("--config", metavar="YAML",
                    help="sweep file, e.g. experiments/configs/sweep_small.yaml")
    sw.add_argument("--algos", nargs="+", choices=ALGOS, help="default: ppo dqn")
    sw.add_argument("--workloads", nargs="+", choices=WORKLOAD_KINDS,
                    help="default: poisson google_v2_like")
    sw.add_argument("--run-seeds", nargs="+", type=int, help="training seeds (default 0)")
    sw.add_argument("--n-servers", type=int, help="fleet size (default 15)")
    sw.add_argument("--episode-length", type=int, help="ticks per episode (default 1000)")
    sw.add_argument("--env-steps", type=int, help="env-step budget per trial (default 20000)")
    sw.add_argument("--eval-seeds", type=int, help="test seeds per evaluation (default 50)")
    sw.add_argument("--eval-workers", type=int, help="evaluation processes (default 2)")
    sw.add_argument("--experiment", help="MLflow experiment (default cloudrl-sweep)")
    sw.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, "
                                           "else sqlite:///$PWD/mlflow.db)")
    sw.add_argument("--storage-path", help="Ray Tune storage (default results/tune)")
    sw.add_argument("--max-concurrent-trials", type=int, help="default 2")
    sw.add_argument("--name", help="Tune run name / sweep id (default <experiment>-<time>)")
    sw.add_argument("--max-failures", type=int,
                    help="restarts of a failed trial from its last checkpoint "
                         "(default 2; 0: none, -1: no limit)")
    sw.add_argument("--scenario", help="sweep on a named scenario (cloudrl scenarios list) "
                                       "instead of --workloads: --algos from ppo, dqn, bdq; "
                                       "trials and the signal-aware heuristic on the test seeds")
    sw.add_argument("--heuristic-params", metavar="JSON",
                    help="with --scenario: the signal-aware heuristic's parameters (a JSON "
                         "object or file; default its defaults)")
    sw.add_argument("--resume", metavar="EXPERIMENT",
                    help="continue a sweep whose driver died: its Tune experiment dir, or its "
                         "name (sweep id) under --storage-path; unfinished and errored trials "
                         "go on from their last checkpoints, then the evaluation")
    sw.set_defaults(func=_cmd_sweep)

    cmp = sub.add_parser("compare", help="table, Pareto plot and learning curves of a sweep, "
                                         "from MLflow")
    cmp.add_argument("--experiment", default="cloudrl-sweep", help="MLflow experiment")
    cmp.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, "
                                            "else sqlite:///$PWD/mlflow.db)")
    cmp.add_argument("--sweep-id", help="which sweep (default: the latest; 'all': every run)")
    cmp.add_argument("--out", help="output directory (default: results/compare/<experiment>)")
    cmp.add_argument("--no-log", action="store_true", help="do not log a 'compare' MLflow run")
    cmp.set_defaults(func=_cmd_compare)

    trace_import.register(sub)
    align_cli.register(sub)
    signals_cli.register(sub)
    scenarios_cli.register(sub)
    label_cli.register(sub)
    offline_cli.register(sub)
    serve_cli.register(sub)
    deploy_cli.register(sub)
    scenarios_cli.extend_headline(headline_cli.register(sub))
    loop_cli.register(sub)
    sites_cli.register(sub)
    steer_cli.register(sub)
    return parser


# What a user got wrong (a bad value, a missing or malformed file): one line, exit code 2.
USER_ERRORS = (ConfigError, FileNotFoundError, TraceFileError, TraceFormatError,
               UnknownScenarioError)


def _one_line(err: BaseException) -> str:
    """The error's message on one line (drops pydantic's "further information" links)."""
    lines = [line.strip() for line in str(err).splitlines()
             if line.strip() and "errors.pydantic.dev" not in line]
    return " ".join(lines) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_library_logs()
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        print(f"cloudrl: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
