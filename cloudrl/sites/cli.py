"""``cloudrl sites``: list, show, add, headroom, evaluate and report real sites.

* ``list`` / ``show NAME``: the shipped and added sites, a site's splits and data span;
* ``add NAME --prices FILE --carbon FILE [--timezone TZ] [--publish HH:MM]
  [--currency-rate R]``: validate two CSV files and store the site (:mod:`.byo`);
* ``headroom --site NAME [--split S]``: tune, select and test (:mod:`.headroom`), raw
  results to ``--out``;
* ``evaluate --site NAME``: each forecaster's error by lead on the test period;
* ``train --site NAME [--split S] [--headroom RAW.json] [--publish DIR]``: the site's
  learned policy by the scenario headline's pipeline (:mod:`.train`), tested beside the
  headroom run's controllers on the same windows;
* ``report RAW.json ... --json FILE --md FILE``: the results page from raw results;
* ``designs`` (:mod:`.designs_cli`) and ``yardstick RAW.json`` (:mod:`.yardstick_cli`).

Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fail(msg: str) -> int:
    print(f"cloudrl sites: {msg}", file=sys.stderr)
    return 2


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sites", help="real sites: real prices and carbon, market-true "
                              "forecasts, a temporal split; add your own from two CSVs")
    acts = p.add_subparsers(dest="sites_command", required=True,
                            metavar="{list,show,add,headroom,train,evaluate,report,designs,yardstick}")
    ls = acts.add_parser("list", help="the shipped and added sites")
    ls.set_defaults(func=run_list)
    sh = acts.add_parser("show", help="a site's data span, market and splits")
    sh.add_argument("name")
    sh.set_defaults(func=run_show)
    add = acts.add_parser("add", help="add a site from a price CSV and a carbon CSV")
    add.add_argument("name")
    add.add_argument("--prices", required=True, metavar="FILE",
                     help="CSV: timestamp,price_usd_per_mwh (hourly)")
    add.add_argument("--carbon", required=True, metavar="FILE",
                     help="CSV: timestamp,carbon_g_per_kwh (hourly)")
    add.add_argument("--timezone", default="UTC", help="the market's IANA time zone")
    add.add_argument("--publish", default="12:00", metavar="HH:MM",
                     help="local time the next day's prices are published")
    add.add_argument("--currency-rate", type=float, default=1.0, metavar="R",
                     help="US dollars per unit of the prices' currency")
    add.add_argument("--force", action="store_true", help="replace an added site")
    add.set_defaults(func=run_add)
    hr = acts.add_parser("headroom", help="tuned heuristic vs forecast MPC vs fluid oracle "
                         "on the test windows")
    hr.add_argument("--site", required=True)
    hr.add_argument("--split", default="temporal")
    hr.add_argument("--per-season", type=int, default=None, metavar="K",
                    help="test windows per season, evenly spaced (default: every window)")
    hr.add_argument("--tune-samples", type=int, default=6)
    hr.add_argument("--tune-seeds", type=int, default=4)
    hr.add_argument("--workers", type=int, default=2)
    hr.add_argument("--checkpoint", default=None, help="a learned policy to test beside")
    hr.add_argument("--reuse", default=None, metavar="RAW.json", help="an earlier raw "
                    "result of this site and split: keep its tuning, selection, windows and "
                    "controllers; play only the controllers it lacks")
    hr.add_argument("--out", default=None, metavar="JSON",
                    help="raw results file (default: none written)")
    hr.set_defaults(func=run_headroom)
    tr = acts.add_parser("train", help="the site's learned policy: distil the MPC + ES on the "
                         "train period, select on validation, test on the test windows")
    tr.add_argument("--site", required=True)
    tr.add_argument("--split", default="temporal")
    tr.add_argument("--headroom", default=None, metavar="RAW.json", help="a headroom run of "
                    "this site and split: its heuristic, windows and rows are reused (default: "
                    "tune and play them here)")
    tr.add_argument("--teacher", choices=("mpc", "rule", "both"), default="mpc",
                    help="what is distilled before the ES fine-tune: the forecast MPC "
                    "(default), the site's tuned signal-aware rule, or both (validation "
                    "picks among the four checkpoints)")
    tr.add_argument("--expert-seeds", type=int, default=None)
    tr.add_argument("--dagger-rounds", type=int, default=None)
    tr.add_argument("--es-iterations", type=int, default=None)
    tr.add_argument("--es-pairs", type=int, default=None)
    tr.add_argument("--val-seeds", type=int, default=None,
                    help="validation-period episodes per candidate (default 6)")
    tr.add_argument("--per-season", type=int, default=None, metavar="K",
                    help="test windows per season without --headroom (default 25)")
    tr.add_argument("--workers", type=int, default=1)
    tr.add_argument("--tiny", action="store_true", help="smoke size: 1 expert seed, no "
                    "DAgger, 1 ES iteration, 1 validation episode, 1 test window per season")
    tr.add_argument("--out-dir", default="results/sites/train", help="training runs go to "
                    "OUT_DIR/SITE-SPLIT/")
    tr.add_argument("--out", default=None, metavar="JSON",
                    help="raw results with the learned row (default: none written)")
    tr.add_argument("--publish", default=None, metavar="DIR",
                    help="copy the selected checkpoint and its per-window test costs here")
    tr.set_defaults(func=run_train)
    ev = acts.add_parser("evaluate", help="forecast error by lead on the test period")
    ev.add_argument("--site", required=True)
    ev.add_argument("--split", default="temporal")
    ev.add_argument("--out", default=None, metavar="JSON",
                    help="forecast errors as JSON (default: none written)")
    ev.set_defaults(func=run_evaluate)
    rep = acts.add_parser("report", help="docs/results/sites.{json,md} from raw results")
    rep.add_argument("raw", nargs="+", metavar="RAW.json")
    rep.add_argument("--json", required=True, dest="json_out", metavar="FILE")
    rep.add_argument("--md", required=True, dest="md_out", metavar="FILE")
    rep.add_argument("--yardstick", metavar="FILE", help="the `cloudrl sites yardstick` "
                     "JSON: its sim-MPC, hindsight and bound join each site's row")
    rep.set_defaults(func=run_report)
    from cloudrl.sites.designs_cli import add_parser as add_designs

    add_designs(acts)  # ``designs``: which site design leaves room for planning
    from cloudrl.sites.yardstick_cli import add_parser as add_yardstick

    add_yardstick(acts)  # ``yardstick``: the sim-MPC, hindsight oracle and bound
    return p


def _site(name: str):
    from cloudrl.sites.registry import get_site

    return get_site(name)


def run_list(args: argparse.Namespace) -> int:
    from cloudrl.sites.registry import all_sites, sites_dir

    try:
        sites = all_sites()
    except (ValueError, OSError) as e:
        return _fail(f"{sites_dir()}: {str(e).splitlines()[0]}")
    for s in sites.values():
        print(f"{s.name:12s} {'shipped' if s.builtin else 'added':8s} {s.description}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from envs.signals.real import load_table

    try:
        s = _site(args.name)
    except ValueError as e:
        return _fail(str(e))
    t = load_table(s.signals_path)
    print(f"site {s.name}: {s.description}")
    print(f"  data {t.times[0]} .. {t.end} UTC, {t.n_rows} rows ({s.signals_path})")
    print(f"  price mean {t.price.mean():.1f} min {t.price.min():.1f} max {t.price.max():.1f}"
          f" $/MWh; carbon mean {t.carbon.mean():.1f} gCO2/kWh")
    print(f"  market {s.timezone}, next day's prices published {s.publish_local} local; "
          f"workload and fleet of scenario {s.workload}")
    from cloudrl.sites.scenario import site_scenario
    from cloudrl.sites.splits import episode_windows

    for name, sp in s.splits.items():
        cfg = site_scenario(s, name, "test", carbon_model="seasonal_naive")
        need = cfg.signal_ticks * cfg.tick_seconds
        n = len(episode_windows(s, name, need, cfg.days))
        print(f"  split {name}: train {sp.train}, validation {sp.validation}, "
              f"test {sp.test} ({n} test windows of {cfg.days:g} days, each needing "
              f"{need / 86400:.2f} days of signal)")
    return 0


def run_add(args: argparse.Namespace) -> int:
    from cloudrl.sites.byo import SiteInputError, add_site

    try:
        site = add_site(args.name, args.prices, args.carbon, args.timezone, args.publish,
                        args.currency_rate, force=args.force)
    except SiteInputError as e:
        for line in e.lines:
            print(f"cloudrl sites add: {line}", file=sys.stderr)
        return 2
    print(f"added site {site.name}: {site.signals_path}")
    for name, sp in site.splits.items():
        print(f"  split {name}: train {sp.train}, validation {sp.validation}, test {sp.test}")
    return 0


def run_headroom(args: argparse.Namespace) -> int:
    from cloudrl.sites.headroom import measure, summarise

    try:
        site = _site(args.site)
        if args.split not in site.splits:
            return _fail(f"--split: {args.split!r} is not a split of {site.name} "
                         f"({', '.join(site.splits)})")
    except ValueError as e:
        return _fail(str(e))
    for flag, v, lo, hi in (("--per-season", args.per_season, 1, 10_000),
                            ("--tune-samples", args.tune_samples, 1, 1000),
                            ("--tune-seeds", args.tune_seeds, 1, 50),
                            ("--workers", args.workers, 1, 1024)):
        if v is not None and not lo <= v <= hi:
            return _fail(f"{flag}: {v} is outside {lo}..{hi}")
    reuse = None
    if args.reuse:
        try:
            reuse = json.loads(Path(args.reuse).read_text())
            if (reuse["site"], reuse["split"]) != (site.name, args.split):
                return _fail(f"--reuse: {args.reuse} holds {reuse['site']} {reuse['split']}, "
                             f"not {site.name} {args.split}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            return _fail(f"--reuse: {args.reuse}: {str(e).splitlines()[0]}")
    raw = measure(site, args.split, args.per_season, args.tune_samples, args.tune_seeds,
                  args.workers, args.checkpoint, reuse=reuse)
    s = summarise(raw)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(raw, indent=1))
    n = len(raw["windows"])
    print(f"{site.name} {args.split}: {n} test windows, heuristic = "
          f"{raw['selection']['selected']} (chosen on validation)")
    for name, m in s["means"].items():
        d = s["diff_vs_heuristic"].get(name, {}).get("cost_pct")
        ci = f"  {d[0]:+.1f}% [{d[1]:+.1f}, {d[2]:+.1f}] vs heuristic" if d else ""
        print(f"  {name:14s} ${m['cost_usd']:8.2f} (energy {m['energy_usd']:.2f}, carbon "
              f"{m['carbon_usd']:.2f}, SLA lc {m['sla_lc_usd']:.2f}, SLA batch "
              f"{m['sla_batch_usd']:.2f}){ci}")
    return 0


def run_train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from cloudrl.sites.train import TINY, TrainSize, publish, train_site

    try:
        site = _site(args.site)
    except ValueError as e:
        return _fail(str(e))
    if args.split not in site.splits:
        return _fail(f"--split: {args.split!r} is not a split of {site.name} "
                     f"({', '.join(site.splits)})")
    size = TINY if args.tiny else TrainSize()
    for flag, field, lo, hi in (("--expert-seeds", "expert_seeds", 1, 40),
                                ("--dagger-rounds", "dagger_rounds", 0, 5),
                                ("--es-iterations", "es_iterations", 1, 200),
                                ("--es-pairs", "es_pairs", 1, 64),
                                ("--val-seeds", "val_seeds", 1, 50),
                                ("--per-season", "per_season", 1, 10_000)):
        v = getattr(args, field)
        if v is None:
            continue
        if not lo <= v <= hi:
            return _fail(f"{flag}: {v} is outside {lo}..{hi}")
        size = replace(size, **{field: v})
    if size.expert_seeds + size.dagger_rounds * size.dagger_seeds > 50:
        return _fail(f"--expert-seeds + --dagger-rounds x {size.dagger_seeds}: more than the "
                     f"50 train seeds")
    if not 1 <= args.workers <= 64:
        return _fail(f"--workers: {args.workers} is outside 1..64")
    reuse = None
    if args.headroom:
        try:
            reuse = json.loads(Path(args.headroom).read_text())
            if (reuse["site"], reuse["split"]) != (site.name, args.split):
                return _fail(f"--headroom: {args.headroom} holds {reuse['site']} "
                             f"{reuse['split']}, not {site.name} {args.split}")
            reuse.pop("train", None)
            reuse["per_window"].pop("learned", None)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return _fail(f"--headroom: {args.headroom}: {str(e).splitlines()[0]}")
    raw = train_site(site, args.split, Path(args.out_dir) / f"{site.name}-{args.split}", size,
                     reuse, args.workers, teacher=args.teacher)
    command = "cloudrl sites " + " ".join(sys.argv[sys.argv.index("train"):]) \
        if "train" in sys.argv else f"cloudrl sites train --site {site.name}"
    raw["train"]["command"] = command
    raw["train"]["headroom"] = args.headroom
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(raw, indent=1))
        print(f"wrote {args.out}")
    if args.publish:
        print(f"published {publish(raw, args.publish, command)}")
    from cloudrl.sites.headroom import summarise

    s = summarise(raw)
    tr = raw["train"]
    print(f"{site.name} {args.split}: selected {tr['selected']} on validation "
          f"({', '.join(f'{k} {v:.2f}' for k, v in tr['validation_cost'].items())}); "
          f"{len(raw['windows'])} test windows; wall {tr['wall_s']['total']:.0f} s")
    for name in ("heuristic", "mpc", "learned"):
        m = s["means"][name]
        d = s["diff_vs_heuristic"].get(name, {}).get("cost_pct")
        ci = f"  {d[0]:+.1f}% [{d[1]:+.1f}, {d[2]:+.1f}] vs heuristic" if d else ""
        print(f"  {name:10s} ${m['cost_usd']:8.2f} (energy {m['energy_usd']:.2f}, carbon "
              f"{m['carbon_usd']:.2f}, SLA lc {m['sla_lc_usd']:.2f}, SLA batch "
              f"{m['sla_batch_usd']:.2f}){ci}")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from cloudrl.sites.forecast_eval import evaluate_forecasts, format_errors

    try:
        site = _site(args.site)
    except ValueError as e:
        return _fail(str(e))
    res = evaluate_forecasts(site, args.split)
    print(format_errors(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from cloudrl.sites.report import write_report

    try:
        raws = [json.loads(Path(p).read_text()) for p in args.raw]
    except (OSError, ValueError) as e:
        return _fail(f"report: {str(e).splitlines()[0]}")
    ladders = None
    if args.yardstick:
        try:
            ladders = json.loads(Path(args.yardstick).read_text())
            if not isinstance(ladders, dict):
                raise ValueError("not a JSON object of site/split ladders")
        except (OSError, ValueError) as e:
            return _fail(f"report: --yardstick {args.yardstick}: {str(e).splitlines()[0]}")
    write_report(raws, Path(args.json_out), Path(args.md_out), list(args.raw), ladders,
                 args.yardstick)
    print(f"wrote {args.json_out} and {args.md_out}")
    return 0
