"""``cloudrl sites yardstick RAW.json``: the sim-MPC, the hindsight oracle and the lower
bound on a season-stratified subset of a site's test windows (:mod:`.yardstick`), paired by
window with the raw result's heuristic, fluid MPC, fluid oracle and learned policy.

The JSON holds one entry per site and split (``--json`` keeps the others). Bad input is one
line on stderr and exit code 2; nothing is written then.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fail(msg: str) -> int:
    print(f"cloudrl sites yardstick: {msg}", file=sys.stderr)
    return 2


def add_parser(acts: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = acts.add_parser("yardstick", help="the sim-MPC, hindsight oracle and lower bound on "
                        "a site's test windows, paired with a raw result's controllers")
    p.add_argument("raw", metavar="RAW.json", help="a `cloudrl sites headroom` or `train` "
                   "result (its windows, seeds and per-window costs)")
    p.add_argument("--per-season", type=int, default=5, metavar="K",
                   help="windows per season, evenly spaced (default 5)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--json", required=True, dest="json_out", metavar="F",
                   help="write (or update) the site/split entry of this file")
    p.set_defaults(func=run)
    return p


def load_raw(path: str) -> dict:
    """A raw site result, or a ValueError naming the file and what is missing."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a raw site result (a JSON object)")
    for key in ("site", "split", "windows", "per_window"):
        if key not in raw:
            raise ValueError(f"{path}: not a raw site result (no {key!r})")
    if "heuristic" not in raw["per_window"]:
        raise ValueError(f"{path}: per_window has no 'heuristic' row")
    return raw


def run(args: argparse.Namespace) -> int:
    from cloudrl.sites.registry import get_site
    from cloudrl.sites.yardstick import format_markdown, measure

    if not 1 <= args.per_season <= 100:
        return _fail(f"--per-season: {args.per_season} is outside 1..100")
    if not 1 <= args.workers <= 1024:
        return _fail(f"--workers: {args.workers} is outside 1..1024")
    try:
        raw = load_raw(args.raw)
        site = get_site(raw["site"])
    except ValueError as e:
        return _fail(str(e).splitlines()[0])
    if raw["split"] not in site.splits:
        return _fail(f"{args.raw}: split {raw['split']!r} is not a split of {site.name}")
    out_path = Path(args.json_out)
    try:
        data = json.loads(out_path.read_text()) if out_path.exists() else {}
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        return _fail(f"--json: {out_path}: {str(e).splitlines()[0]}")
    out = measure(raw, args.per_season, args.workers)
    out["raw"] = args.raw
    out["command"] = (f"cloudrl sites yardstick {args.raw} --per-season {args.per_season} "
                      f"--workers {args.workers} --json {args.json_out}")
    data[f"{raw['site']}/{raw['split']}"] = out
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")
    print(f"{site.name} {raw['split']}: {out['n_windows']} of {out['n_windows_in_raw']} test "
          f"windows, bound below every controller: {out['bound_below_every_controller']}")
    print(format_markdown(out))
    print(f"wrote {out_path}")
    return 0
