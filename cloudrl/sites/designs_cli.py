"""``cloudrl sites designs``: sweep site designs on a site's test windows (:mod:`.designs`)
and write the JSON and the results page (:mod:`.designs_page`).

Bad input is one line on stderr and exit code 2; nothing is written then.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _fail(msg: str) -> int:
    print(f"cloudrl sites designs: {msg}", file=sys.stderr)
    return 2


def add_parser(acts: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from cloudrl.sites.designs import DESIGNS

    p = acts.add_parser("designs", help="which site design leaves room for planning: tuned "
                        "rule vs tuned MPC vs fluid oracle vs lower bound per design")
    p.add_argument("--site", required=True)
    p.add_argument("--split", default="temporal")
    p.add_argument("--designs", default=None, metavar="A,B",
                   help=f"comma-separated designs (default: all: {', '.join(DESIGNS)})")
    p.add_argument("--windows", type=int, default=8, metavar="N",
                   help="test windows, stratified by season (default 8)")
    p.add_argument("--tune-points", type=int, default=6, metavar="K",
                   help="search points per family, the defaults first (default 6)")
    p.add_argument("--tune-seeds", type=int, default=2, metavar="S",
                   help="validation seeds per point (default 2)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--carbon-model", default="seasonal_naive",
                   choices=("seasonal_naive", "gbt"))
    p.add_argument("--no-bound", action="store_true", help="skip the lower bound")
    p.add_argument("--json", required=True, dest="json_out", metavar="F")
    p.add_argument("--md", required=True, dest="md_out", metavar="F")
    p.add_argument("--render", action="store_true",
                   help="run nothing: write --md again from the results in --json")
    p.add_argument("--merge", action="store_true",
                   help="keep the other sites already in --json (this site's entry is "
                        "replaced) and write the page for all of them")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from cloudrl.sites.designs import DESIGNS, DesignError, parse_designs, scenario, sweep
    from cloudrl.sites.designs_page import add_summaries, load, write
    from cloudrl.sites.registry import get_site

    try:
        site = get_site(args.site)
    except ValueError as e:
        return _fail(f"--site: {str(e).splitlines()[0]}")
    if args.split not in site.splits:
        return _fail(f"--split: {args.split!r} is not a split of {site.name} "
                     f"({', '.join(site.splits)})")
    for flag, v, lo, hi in (("--windows", args.windows, 1, 400),
                            ("--tune-points", args.tune_points, 1, 200),
                            ("--tune-seeds", args.tune_seeds, 1, 50),
                            ("--workers", args.workers, 1, 1024)):
        if not lo <= v <= hi:
            return _fail(f"{flag}: {v} is outside {lo}..{hi}")
    try:
        designs = parse_designs(args.designs)
        for d in designs:  # every override applies before anything runs
            scenario(site, args.split, "test", d, None, args.carbon_model)
    except DesignError as e:
        return _fail(str(e))
    json_out, md_out = Path(args.json_out), Path(args.md_out)
    if args.render:
        try:
            sites = {k: add_summaries(v) for k, v in load(json_out).items()}
            if not sites:
                return _fail(f"--render: {json_out} does not exist")
        except (OSError, ValueError, KeyError) as e:
            return _fail(f"--render: {str(e).splitlines()[0]}")
        write(sites, json_out, md_out)
        print(f"wrote {md_out} from {json_out}")
        return 0
    try:
        before = load(json_out) if args.merge else {}
    except (OSError, ValueError) as e:
        return _fail(f"--merge: {str(e).splitlines()[0]}")
    others = {k: v for k, v in before.items() if k != site.name}
    # the same site run with the same settings: keep its other designs and its windows
    prev = before.get(site.name)
    same = prev is not None and prev["split"] == args.split and \
        prev["carbon_model"] == args.carbon_model and prev["size"] == {
            "windows": prev["size"]["windows"], "tune_points": args.tune_points,
            "tune_seeds": args.tune_seeds, "workers": args.workers} and \
        len(prev["windows"]) <= args.windows
    keep = {k: v for k, v in prev["designs"].items() if k not in {d.name for d in designs}} \
        if same else {}
    commands = [*prev.get("commands", [prev.get("command")]), _command(args)] if same \
        else [_command(args)]

    def save(raw: dict) -> None:
        raw["commands"] = commands
        done = {**keep, **raw["designs"]}
        order = list(DESIGNS)
        raw["designs"] = {k: done[k] for k in sorted(done, key=order.index)}
        write({**others, site.name: add_summaries(raw)}, json_out, md_out)

    from cloudrl.sites.splits import Window

    raw = sweep(site, args.split, designs, args.windows, args.tune_points, args.tune_seeds,
                args.workers, args.carbon_model, not args.no_bound, on_design=save,
                windows=[Window(**w) for w in prev["windows"]] if same else None)
    save(raw)
    for name, d in raw["designs"].items():
        pct = d["result"]["vs_rule_pct"]
        m = d["result"]["means"]
        line = (f"{site.name} {name:10s} rule ${m['rule']['cost_usd']:7.2f}  MPC "
                f"{pct['mpc'][0]:+5.1f}%  oracle {pct['oracle'][0]:+5.1f}% "
                f"[{pct['oracle'][1]:+.1f}, {pct['oracle'][2]:+.1f}]")
        if "bound" in pct:
            line += f"  bound {pct['bound'][0]:+5.1f}%"
        print(line)
    print(f"wrote {json_out} and {md_out}")
    return 0


def _command(args: argparse.Namespace) -> str:
    parts = ["cloudrl sites designs", f"--site {args.site}"]
    if args.split != "temporal":
        parts.append(f"--split {args.split}")
    if args.designs:
        parts.append(f"--designs {args.designs}")
    parts += [f"--windows {args.windows}", f"--tune-points {args.tune_points}",
              f"--tune-seeds {args.tune_seeds}", f"--workers {args.workers}"]
    if args.carbon_model != "seasonal_naive":
        parts.append(f"--carbon-model {args.carbon_model}")
    if args.no_bound:
        parts.append("--no-bound")
    parts += [f"--json {args.json_out}", f"--md {args.md_out}"]
    if args.merge:
        parts.append("--merge")
    return " ".join(parts)
