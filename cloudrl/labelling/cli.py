"""``cloudrl label ...``: the labelling app's commands.

* ``serve --db PATH [--host] [--port] [--gold-rate] [--timeout-s]``: the page and
  API (:mod:`.app`);
* ``operators add NAME [--admin]`` (prints the token once), ``operators list``,
  ``operators rotate NAME``, ``operators disable NAME``;
* ``enqueue``: pairs from ``--policy`` rollouts on ``--seeds`` (and an env config or
  workload), from ``--episodes DIR`` (recorded episodes), ``--from-feedback DB`` (the
  decision service's store) or ``--from-scenario NAME --controller KIND ...`` (the
  scenarios' signals, job classes and power states); ``--gold-fraction``,
  ``--reward-model`` for priorities;
* ``reprioritize --reward-model DIR``: re-score open pairs by the model's uncertainty;
* ``gold PAIR_ID a|b|equal|none``: set or clear a pair's known answer;
* ``stats``: queue, strata, per-operator gold accuracy and agreement, Krippendorff's
  alpha, Cohen's kappa (``--json`` for the raw report);
* ``export --out DIR``: the majority-vote pair dataset ``cloudrl align reward --data DIR``
  trains on;
* ``drift --reward-model DIR``: its accuracy on recent vs older labels.

Every command takes ``--db`` (default ``results/labelling/labels.db``). Bad input is one
line naming the field, exit code 2; a database that cannot be opened is one line too.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cloudrl.argparsing import CliParser
from cloudrl.config_loader import ConfigError

DEFAULT_DB = "results/labelling/labels.db"


def _db(args: argparse.Namespace, create: bool = True):
    from cloudrl.labelling.db import DatabaseError, connect

    try:
        return connect(args.db, create=create)
    except DatabaseError as e:
        raise ConfigError(f"--db: {e}") from None


def _env_config(args: argparse.Namespace) -> Any:
    from envs.env_config import EnvConfig

    raw: dict[str, Any] = {}
    if args.env_config:
        import yaml

        try:
            with open(args.env_config) as f:
                loaded = yaml.safe_load(f) or {}
        except OSError as e:
            raise ConfigError(f"--env-config: {args.env_config}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"--env-config: {args.env_config}: not YAML ({e})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"--env-config: {args.env_config}: not a mapping")
        raw = loaded.get("env", loaded)
    if args.n_servers is not None:
        raw["n_servers"] = args.n_servers
    if args.episode_length is not None:
        raw = {**raw, "sim": {**dict(raw.get("sim") or {}),
                              "episode_length": args.episode_length}}
    if args.workload:
        raw["workload"] = args.workload
    try:
        return EnvConfig.model_validate(raw)
    except ValueError as e:
        raise ConfigError(f"--env-config: {e}") from None


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part.strip()[1:]:
                lo, hi = part.split("-", 1)
                out.extend(range(int(lo), int(hi) + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not like 0,1,2 or 0-9") from None
    return out


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from cloudrl.labelling.app import ServeConfig, create_app
    from cloudrl.labelling.db import DatabaseError
    from cloudrl.labelling.queue import QueueConfig

    cfg = ServeConfig(db=args.db, host=args.host, port=args.port,
                      queue=QueueConfig(gold_rate=args.gold_rate,
                                        assignment_timeout_s=args.timeout_s),
                      quality=_quality(args),
                      rate_per_s=args.rate, rate_burst=args.burst, sync=args.sync)
    try:
        app = create_app(cfg)
    except DatabaseError as e:
        raise ConfigError(f"--db: {e}") from None
    print(json.dumps({"url": f"http://{args.host}:{args.port}/", "db": args.db}), flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                access_log=False)
    return 0


def _cmd_operators(args: argparse.Namespace) -> int:
    from cloudrl.labelling import tokens

    conn = _db(args)
    try:
        if args.op_command == "add":
            token = tokens.add_operator(conn, args.name, admin=args.admin)
            print(json.dumps({"operator": args.name, "admin": args.admin, "token": token}))
        elif args.op_command == "rotate":
            print(json.dumps({"operator": args.name, "token": tokens.rotate_token(
                conn, args.name)}))
        elif args.op_command == "disable":
            tokens.set_active(conn, args.name, False)
            print(json.dumps({"operator": args.name, "active": False}))
        else:
            for row in tokens.list_operators(conn):
                print(json.dumps(row))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return 0


def _cmd_enqueue(args: argparse.Namespace) -> int:
    from cloudrl.labelling import enqueue
    from cloudrl.labelling.queue import PairSpec, add_pairs
    from cloudrl.labelling.segments import EnvMeta

    sources = [bool(args.policy), bool(args.episodes), bool(args.from_feedback),
               bool(args.from_scenario)]
    if sum(sources) != 1:
        raise ConfigError("enqueue: give exactly one of --policy (rollouts), --episodes DIR, "
                          "--from-feedback DB or --from-scenario NAME")
    if args.from_scenario and not args.controller:
        raise ConfigError("enqueue: --from-scenario needs --controller KIND (repeatable, "
                          "e.g. run_at_once, signal_aware, mpc)")
    env_cfg = _env_config(args)
    conn = _db(args)
    skipped: dict[str, int] = {}
    try:
        if args.from_feedback:
            specs, skipped = enqueue.feedback_pairs(
                args.from_feedback, env_config=env_cfg, interface=args.interface,
                segment_length=args.segment_length, as_gold=args.feedback_as_gold,
                scenario=args.scenario or "feedback")
        elif args.from_scenario:
            from cloudrl.labelling.scenario_segments import scenario_segments

            try:
                segments = scenario_segments(args.from_scenario, args.controller,
                                             args.seeds or [0, 1], args.segment_length,
                                             args.stride)
            except ImportError as e:  # a scenario that needs an extra (pvlib: solar)
                why = ("its solar signal needs pvlib, the 'solar' extra: pip install "
                       "'cloudrl[solar]'") if "pvlib" in str(e) else str(e)
                raise ConfigError(f"--from-scenario {args.from_scenario}: {why}") from None
            pairs = enqueue.make_pairs(segments, args.pairs, seed=args.seed)
            specs = [PairSpec(a=a, b=b, source="scenario") for a, b in pairs]
        else:
            if args.policy:
                runs = enqueue.record_rollouts(args.policy, args.seeds or [0, 1],
                                               env_config=env_cfg, interface=args.interface,
                                               max_steps=args.max_steps)
            else:
                from cloudrl.data.episodes import read_episodes
                from cloudrl.policy import make_env

                env = make_env(env_cfg, args.interface)
                runs = [(env, ep) for ep in read_episodes(args.episodes)]
            segments = []
            for env, ep in runs:
                meta = EnvMeta.of_env(env, args.scenario or "")
                segments += enqueue.episode_segments(ep, meta, args.segment_length,
                                                     args.stride)
            if len(segments) < 2:
                raise ConfigError(f"--segment-length: {args.segment_length} leaves "
                                  f"{len(segments)} segment(s); need at least 2")
            pairs = enqueue.make_pairs(segments, args.pairs, seed=args.seed)
            specs = [PairSpec(a=a, b=b, source="rollout") for a, b in pairs]
        gold = enqueue.mark_gold(specs, args.gold_fraction, seed=args.seed) \
            if args.gold_fraction else sum(p.gold is not None for p in specs)
        added, dup = add_pairs(conn, specs, k=args.k)
        scored = None
        if args.reward_model:
            from cloudrl.labelling.active import score_open_pairs

            scored = score_open_pairs(conn, args.reward_model)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"enqueue: {e}") from None
    print(json.dumps({"added": added, "duplicates": dup, "gold": gold, "skipped": skipped,
                      "priorities": scored}))
    return 0


def _cmd_reprioritize(args: argparse.Namespace) -> int:
    from cloudrl.labelling.active import score_open_pairs

    conn = _db(args, create=False)
    try:
        print(json.dumps(score_open_pairs(conn, args.reward_model)))
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"--reward-model: {e}") from None
    return 0


def _cmd_gold(args: argparse.Namespace) -> int:
    from cloudrl.labelling.queue import set_gold

    conn = _db(args, create=False)
    answer = None if args.answer == "none" else args.answer
    try:
        set_gold(conn, args.pair_id, answer)
    except ValueError as e:
        raise ConfigError(f"gold: {e}") from None
    print(json.dumps({"pair_id": args.pair_id, "gold": answer}))
    return 0


def _quality(args: argparse.Namespace):
    from cloudrl.labelling.quality import QualityConfig

    return QualityConfig(min_gold_accuracy=args.min_gold_accuracy,
                         min_gold_labels=args.min_gold_labels)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _cmd_stats(args: argparse.Namespace) -> int:
    from cloudrl.labelling.quality import quality_report
    from cloudrl.labelling.queue import queue_counts, strata_counts

    conn = _db(args, create=False)
    report = {"queue": queue_counts(conn), "strata": strata_counts(conn),
              "quality": quality_report(conn, _quality(args))}
    if args.json:
        print(json.dumps(report))
        return 0
    q, qual = report["queue"], report["quality"]
    print(f"pairs {q['pairs']} (gold {q['gold_pairs']}, open {q['open_pairs']}, complete "
          f"{q['complete_pairs']}), labels {q['labels']} (skips {q['skips']}), open "
          f"assignments {q['open_assignments']}")
    print(f"Krippendorff's alpha {_fmt(qual['krippendorff_alpha'])}, Cohen's kappa (mean of "
          f"{len(qual['cohen_kappa_pairs'])} operator pairs) {_fmt(qual['cohen_kappa_mean'])}")
    cols = ("operator", "labels", "skips", "gold_answered", "gold_accuracy", "agreement",
            "median_time_s", "flagged")
    rows = [[_fmt(r[c]) for c in cols] for r in qual["operators"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    print("strata: " + ", ".join(f"{s['stratum']} served {s['served']} open {s['open']}"
                                 for s in report["strata"]))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from cloudrl.labelling.export import export_labels

    conn = _db(args, create=False)
    try:
        res = export_labels(conn, args.out, quality=_quality(args),
                            include_gold=not args.no_gold)
    except ValueError as e:
        raise ConfigError(f"export: {e}") from None
    print(json.dumps({"out": args.out, **res.as_dict()}))
    if res.written == 0:
        print("cloudrl: export: no labelled pairs to write", file=sys.stderr)
    return 0


def _cmd_drift(args: argparse.Namespace) -> int:
    from cloudrl.labelling.export import drift_report

    conn = _db(args, create=False)
    try:
        print(json.dumps(drift_report(conn, args.reward_model,
                                      recent_fraction=args.recent_fraction,
                                      quality=_quality(args))))
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"drift: {e}") from None
    return 0


# ----------------------------------------------------------------------------- parser


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1]")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port")
    return value


def _with_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=DEFAULT_DB, help=f"labelling database (default {DEFAULT_DB})")


def _with_quality(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-gold-accuracy", type=_fraction, default=0.7,
                   help="operators below this gold accuracy are flagged (default 0.7)")
    p.add_argument("--min-gold-labels", type=_positive, default=5,
                   help="gold answers needed before an operator can be flagged (default 5)")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``label ...`` to a CLI's subparsers."""
    label = subparsers.add_parser("label", help="operators label trajectory pairs in a web "
                                                "page; queue, quality, export")
    sub = label.add_subparsers(dest="label_command", required=True)

    sv = sub.add_parser("serve", help="serve the labelling page and API")
    _with_db(sv)
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    sv.add_argument("--port", type=_port, default=18100, help="default 18100")
    sv.add_argument("--gold-rate", type=_fraction, default=0.1,
                    help="share of each operator's tasks that are gold pairs (default 0.1)")
    sv.add_argument("--timeout-s", type=_positive_float, default=600.0,
                    help="an unanswered assignment returns to the queue after this (600)")
    sv.add_argument("--rate", type=_positive_float, default=2.0,
                    help="labels per second per operator (token bucket refill, default 2)")
    sv.add_argument("--burst", type=_positive, default=10, help="token bucket size (10)")
    sv.add_argument("--sync", choices=("full", "normal"), default="normal",
                    help="normal (default): an acknowledged label is in the write-ahead log "
                    "and survives a killed server, synced to disk at checkpoints; full: "
                    "synced at every label (survives a power cut too, slower)")
    sv.add_argument("--log-level", default="warning", choices=("critical", "error", "warning",
                                                               "info", "debug"))
    _with_quality(sv)
    sv.set_defaults(func=_cmd_serve)

    ops = sub.add_parser("operators", help="add, list, rotate or disable operators")
    ops_sub = ops.add_subparsers(dest="op_command", required=True)
    for name, text in (("add", "create an operator; prints the token once"),
                       ("rotate", "new token for an operator"),
                       ("disable", "the operator's token stops working"),
                       ("list", "operators (never tokens)")):
        p = ops_sub.add_parser(name, help=text)
        _with_db(p)
        if name != "list":
            p.add_argument("name")
        if name == "add":
            p.add_argument("--admin", action="store_true", help="may open the admin page, "
                           "stats and votes")
        p.set_defaults(func=_cmd_operators)

    en = sub.add_parser("enqueue", help="add pairs: rollouts of policies, recorded episodes "
                                        "or the feedback store")
    _with_db(en)
    en.add_argument("--policy", action="append", help="heuristic name or checkpoint dir "
                    "(repeatable): record rollouts on --seeds")
    en.add_argument("--seeds", type=_seeds, help="train seeds, e.g. 0-3 or 0,5 (default 0,1)")
    en.add_argument("--episodes", help="directory of recorded episodes (cloudrl align record)")
    en.add_argument("--from-feedback", metavar="DB", help="the decision service's state_db "
                    "(pairs posted to /v1/feedback)")
    en.add_argument("--from-scenario", metavar="NAME", help="a scenario of the catalog "
                    "(price/carbon signals, job classes, power states), run by --controller")
    en.add_argument("--controller", action="append", help="scenario controller kind "
                    "(repeatable): run_at_once, signal_aware, mpc, ...")
    en.add_argument("--feedback-as-gold", action="store_true",
                    help="use the stored preference of feedback pairs as their gold answer")
    en.add_argument("--env-config", metavar="YAML", help="env config (a file with an env: "
                    "section, or the env mapping itself): workload or scenario")
    en.add_argument("--workload", help="workload kind, e.g. poisson or google_v2_like")
    en.add_argument("--scenario", help="name shown and used for strata (default: the "
                    "workload kind)")
    en.add_argument("--n-servers", type=_positive, help="fleet size")
    en.add_argument("--episode-length", type=_positive, help="ticks per episode")
    en.add_argument("--max-steps", type=_positive, help="cut rollouts after this many steps")
    en.add_argument("--interface", choices=("flat", "branching"), default="flat")
    en.add_argument("--segment-length", type=_positive, default=25, help="ticks per side (25)")
    en.add_argument("--stride", type=_positive, help="ticks between segment starts "
                    "(default: the segment length)")
    en.add_argument("--pairs", type=_positive, default=100, help="pairs to add (default 100)")
    en.add_argument("--k", type=_positive, default=2, help="operators per pair (default 2)")
    en.add_argument("--gold-fraction", type=_fraction, default=0.0,
                    help="share of pairs given a known answer by the safety teacher")
    en.add_argument("--reward-model", help="reward model dir: priorities by its uncertainty")
    en.add_argument("--seed", type=int, default=0, help="pairing seed (default 0)")
    en.set_defaults(func=_cmd_enqueue)

    rp = sub.add_parser("reprioritize", help="re-score open pairs by a reward model's "
                                             "uncertainty")
    _with_db(rp)
    rp.add_argument("--reward-model", required=True, help="reward model directory")
    rp.set_defaults(func=_cmd_reprioritize)

    gd = sub.add_parser("gold", help="set or clear a pair's known answer")
    _with_db(gd)
    gd.add_argument("pair_id", type=_positive)
    gd.add_argument("answer", choices=("a", "b", "equal", "none"))
    gd.set_defaults(func=_cmd_gold)

    st = sub.add_parser("stats", help="queue, strata, gold accuracy, agreement, alpha, kappa")
    _with_db(st)
    _with_quality(st)
    st.add_argument("--json", action="store_true", help="the raw report as JSON")
    st.set_defaults(func=_cmd_stats)

    ex = sub.add_parser("export", help="majority-vote pairs as the reward model's pair "
                                       "dataset")
    _with_db(ex)
    _with_quality(ex)
    ex.add_argument("--out", required=True, help="output directory (parquet files)")
    ex.add_argument("--no-gold", action="store_true", help="leave gold pairs out")
    ex.set_defaults(func=_cmd_export)

    dr = sub.add_parser("drift", help="reward model accuracy on recent vs older labels")
    _with_db(dr)
    _with_quality(dr)
    dr.add_argument("--reward-model", required=True, help="reward model directory")
    dr.add_argument("--recent-fraction", type=_fraction, default=0.3,
                    help="newest share of labelled pairs counted as recent (0.3)")
    dr.set_defaults(func=_cmd_drift)
    return label


def main(argv: list[str] | None = None) -> int:
    """``python -m cloudrl.labelling ...``: the ``label`` commands alone (quick to start;
    ``cloudrl label ...`` is the same). Bad input: one line on stderr, exit code 2."""
    parser = CliParser(prog="cloudrl", description="cloudrl label: the "
                                     "labelling app (python -m cloudrl.labelling ...)")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["label", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except (ConfigError, FileNotFoundError) as e:
        line = " ".join(x.strip() for x in str(e).splitlines() if x.strip())
        print(f"cloudrl: {line}", file=sys.stderr)
        return 2
