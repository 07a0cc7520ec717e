"""``cloudrl serve`` (run the decision service) and ``cloudrl feedback export``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cloudrl.config_loader import ConfigError


def service_config(args: argparse.Namespace) -> Any:
    """The ServiceConfig of ``cloudrl serve``: defaults < ``--config`` YAML (a mapping of
    ServiceConfig fields, like the ``args`` in ``serve_apps/config.yaml``) <
    ``CLOUDRL__*`` env vars (``CLOUDRL__FAILURE_THRESHOLD=5``) < flags."""
    from cloudrl.config_loader import load_config
    from serve_apps.service_config import ServiceConfig

    overrides: dict[str, Any] = {}
    scenario_policy = _scenario_policy(args)
    checkpoint = None if scenario_policy == f"learned:{args.checkpoint}" else args.checkpoint
    if checkpoint or args.policy:
        overrides["policy"] = checkpoint or args.policy
    for key in ("canary", "canary_weight", "interface", "state_db"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    # with --scenario, --n-servers is the scenario's fleet; else the cluster policy's
    n_env = None if args.scenario else args.n_servers
    if n_env is not None or args.workload is not None:
        overrides["env"] = {k: v for k, v in (("n_servers", n_env),
                                              ("workload", args.workload)) if v is not None}
    scenario = {k: v for k, v in (("name", args.scenario), ("policy", scenario_policy),
                                  ("n_servers", args.n_servers if args.scenario else None))
                if v is not None}
    if args.site is not None:
        scenario.update(_site_serving(args))
    if scenario:
        overrides["scenario"] = scenario
    return load_config(ServiceConfig, args.config, overrides)


def is_scenario_checkpoint(path: str) -> bool:
    """A ``cloudrl scenarios distill`` checkpoint (``policy.json`` or ``policy.pt``), or a
    ``cloudrl train --scenario`` one (``cloudrl.json`` naming a scenario); not a cluster
    env's ``cloudrl train`` checkpoint."""
    import json
    from pathlib import Path

    p = Path(path)
    meta = p / "cloudrl.json"
    if meta.is_file():
        try:
            return bool(json.loads(meta.read_text()).get("scenario"))
        except (OSError, ValueError, AttributeError):
            return False
    return any((p / name).is_file() for name in ("policy.json", "policy.pt"))


def _scenario_policy(args: argparse.Namespace) -> str | None:
    """The scenario's controller: ``--scenario-policy``; ``learned`` takes its checkpoint
    from ``--checkpoint``; with ``--scenario`` and no ``--scenario-policy``, a
    ``--checkpoint`` that is a scenario checkpoint is the scenario's learned policy."""
    policy = args.scenario_policy
    if policy == "learned":
        if not args.checkpoint:
            raise ConfigError("--scenario-policy learned needs --checkpoint DIR (a checkpoint "
                              "of 'cloudrl scenarios distill', e.g. checkpoints/scarcity_spikes)")
        return f"learned:{args.checkpoint}"
    if policy is None and (args.scenario or args.site) and args.checkpoint and \
            is_scenario_checkpoint(args.checkpoint):
        return f"learned:{args.checkpoint}"
    return policy


def _site_serving(args: argparse.Namespace) -> dict[str, Any]:
    """``--site NAME``: the scenario service on that site's scenario (its fleet, workload
    and market); a bad name or split is one ConfigError line."""
    from cloudrl.sites.registry import get_site

    if args.scenario:
        raise ConfigError("--site: serves the site's own scenario; give --site or --scenario")
    if args.n_servers is not None:
        raise ConfigError("--n-servers: a site serves its own fleet (not with --site)")
    try:
        site = get_site(args.site)
    except ValueError as e:
        raise ConfigError(f"--site: {_one_line(str(e))}") from None
    if args.site_split not in site.splits:
        raise ConfigError(f"--site-split: {args.site_split!r} is not a split of {site.name} "
                          f"({', '.join(site.splits)})")
    return {"name": site.workload, "site": site.name, "split": args.site_split}


def check_policies(cfg: Any) -> None:
    """Load and smoke-test the policy (and canary) here, exactly as the service tests a
    canary, so a policy that does not load or does not answer is one line naming it and the
    cause (exit 2) before Ray starts."""
    from serve_apps.rollout import ShieldSettings, load_checked
    from serve_apps.runtime import PolicySpecError

    settings = ShieldSettings(cfg.model_timeout_s, cfg.failure_threshold, cfg.cooldown_s,
                              cfg.smoke_timeout_s)
    for field, spec in (("policy", cfg.policy), ("canary", cfg.canary)):
        if spec is None:
            continue
        try:
            shield = load_checked(spec, cfg.env, cfg.interface, settings)
        except PolicySpecError as e:
            cause = _one_line(str(e))
            named = cause if spec in cause else f"policy {spec!r}: {cause}"
            raise ConfigError(f"{field}: {named}") from None
        except Exception as e:  # noqa: BLE001 - any loader failure is the user's policy's
            raise ConfigError(f"{field}: policy {spec!r} does not load: "
                              f"{type(e).__name__}: {_one_line(str(e))}") from None
        shield._pool.shutdown(wait=False)
    if cfg.scenario is not None:
        check_scenario(cfg.scenario)


def check_scenario(scenario: Any) -> None:
    """Build the scenario service here (scenario, controller, one decision on the example
    request), so a controller that does not load or cannot be served from a request is one
    line naming it (exit 2) before Ray starts."""
    import asyncio

    from serve_apps.scenario_schemas import ScenarioState
    from serve_apps.scenario_service import ScenarioPolicyError, ScenarioService

    try:
        service = ScenarioService(scenario)
    except ScenarioPolicyError as e:
        raise ConfigError(f"scenario.policy: {_one_line(str(e))}") from None
    example = ScenarioState.model_validate(service.info()["example"])
    out = asyncio.run(service.decide(example))
    service._pool.shutdown(wait=False)
    if out.fallback:
        raise ConfigError(f"scenario.policy: {scenario.policy!r} does not answer the example "
                          f"state of {scenario.name}: {out.reason}")


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _cmd_serve(args: argparse.Namespace) -> int:
    import time

    cfg = service_config(args)
    check_policies(cfg)  # before Ray: a broken policy is one line, not a replica crash loop

    from ray import serve

    from cloudrl.ray_utils import init_ray
    from serve_apps.app import build_app

    init_ray()
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_app(cfg), name="cloudrl", route_prefix="/")
    print(f"cloudrl decision service on http://{args.host}:{args.port}/v1/decide "
          f"(policy {cfg.policy}); Ctrl-C stops it", flush=True)
    if cfg.scenario is not None:
        what = f"site {cfg.scenario.site}" if cfg.scenario.site else \
            f"scenario {cfg.scenario.name}"
        print(f"{what} ({cfg.scenario.policy}) on "
              f"http://{args.host}:{args.port}/v1/scenario/decide", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0


def _cmd_feedback_export(args: argparse.Namespace) -> int:
    from cloudrl.feedback import export_jsonl

    if args.format == "pairs":  # the preference-pair dataset (cloudrl.alignment)
        from cloudrl.alignment.cli import cmd_operator_pairs

        return cmd_operator_pairs(args)
    out = args.out or "results/feedback.jsonl"
    try:
        n = export_jsonl(args.db or "results/serve/state.db", out)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    print(json.dumps({"pairs": n, "out": out}))
    return 0


def register(sub: Any) -> None:
    sv = sub.add_parser("serve", help="run the Ray Serve decision service on a checkpoint "
                                      "or heuristic")
    sv.add_argument("--config", metavar="YAML", help="ServiceConfig fields (CLOUDRL__* env "
                                                   "vars and flags override)")
    sv.add_argument("--checkpoint", help="trained checkpoint dir (from cloudrl train); with "
                    "--scenario-policy learned (or --scenario and a scenario checkpoint "
                    "dir): the scenario's learned policy (from cloudrl scenarios distill)")
    sv.add_argument("--policy", help="or heuristic:NAME / python:MODULE:FACTORY "
                                     "(default heuristic:power_aware)")
    sv.add_argument("--canary", help="second policy version at start")
    sv.add_argument("--canary-weight", type=float, help="canary traffic share (default 0.1)")
    sv.add_argument("--interface", choices=("flat", "branching"),
                    help="interface of a heuristic policy (default branching)")
    sv.add_argument("--n-servers", type=int, help="fleet size of a heuristic policy; with "
                    "--scenario, the scenario's fleet (its load scales with it)")
    sv.add_argument("--workload", help="workload of a heuristic policy's env")
    sv.add_argument("--scenario", help="also serve this scenario on /v1/scenario/decide "
                                       "(cloudrl scenarios list)")
    sv.add_argument("--site", help="also serve this real site's scenario on "
                    "/v1/scenario/decide (cloudrl sites list); --checkpoint: its policy from "
                    "cloudrl sites train")
    sv.add_argument("--site-split", default="temporal", help="the site's split (default "
                    "temporal): the service's state is built on its test part")
    sv.add_argument("--scenario-policy", help="the scenario's controller: signal_aware "
                    "(default), mpc, learned (with --checkpoint DIR), learned:DIR or "
                    "python:MODULE:FACTORY")
    sv.add_argument("--state-db", help="SQLite file (default results/serve/state.db)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.set_defaults(func=_cmd_serve)

    fb = sub.add_parser("feedback", help="operator feedback pairs stored by the service")
    fb_sub = fb.add_subparsers(dest="feedback_command", required=True)
    ex = fb_sub.add_parser("export", help="write the stored ranked pairs as JSON lines")
    ex.add_argument("--db", help="the service's state_db (default results/serve/state.db)")
    ex.add_argument("--out", help="the JSON lines file (default: results/feedback.jsonl); "
                    "with --format pairs a directory (default: results/align/operator_pairs)")
    ex.add_argument("--format", choices=("jsonl", "pairs"), default="jsonl",
                    help="pairs: pairs with inline trajectories as the preference-pair "
                         "dataset (parquet), the schema teacher pairs use")
    ex.add_argument("--config", metavar="YAML", help="pairs: AlignConfig file (env, "
                    "record.interface, pairs.segment_length, operator.cut)")
    ex.add_argument("--segment-length", type=int, help="pairs: steps per segment")
    ex.add_argument("--n-servers", type=int, help="pairs: the operators' fleet size")
    ex.set_defaults(func=_cmd_feedback_export)
