"""A scripted operator: labels pairs through the labelling app's HTTP API by a hidden utility.

    CLOUDRL_LABEL_TOKEN=lbl_... python -m cloudrl.steer.operators --url http://127.0.0.1:18400 \\
        --utility hour_carbon --flip 0.1 --temperature 0.05 --equal 0.05 --skip 0.05 \\
        --max-labels 300 --seed 0

The operator fetches ``GET /api/next``, reads both sides' traces, and answers by
``POST /api/labels``:

* with probability ``skip``: ``skip`` ("can't tell"); else with probability ``equal``:
  ``equal``;
* else it prefers the left side with the Bradley-Terry probability
  ``sigmoid((U(right) - U(left)) / temperature)`` (U a cost: lower is better; a
  temperature of 0 always picks the lower cost), then flips the answer with probability
  ``flip``.

The utility (a name of :data:`cloudrl.steer.utilities.UTILITIES`; ``A>B@0.5`` switches
from A to B after half of ``max-labels``: drift) lives only in this process. It prints one
JSON line at the end: counts of labels, skips, equals, flips and the switch point.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np

from cloudrl.steer.names import utilities_of

TOKEN_ENV = "CLOUDRL_LABEL_TOKEN"


@dataclass(frozen=True)
class OperatorSpec:
    """Who labels and how: a name, its utility (``A`` or ``A>B@f`` drift), its noise."""

    name: str
    utility: str
    flip: float = 0.1
    temperature: float = 0.05
    equal: float = 0.05
    skip: float = 0.05

    def __post_init__(self) -> None:
        from cloudrl.labelling.tokens import NAME_RE

        if not NAME_RE.match(self.name):
            raise ValueError(f"operator name {self.name!r}: letters, digits, '_', '.', '-'")
        for field in ("flip", "equal", "skip"):
            v = getattr(self, field)
            if not 0.0 <= v <= 0.5:
                raise ValueError(f"operator {self.name}: {field} {v} is not in [0, 0.5]")
        if not self.temperature >= 0.0 or not math.isfinite(self.temperature):
            raise ValueError(f"operator {self.name}: temperature {self.temperature} < 0")
        utilities_of(self.utility)  # names checked without loading them

    @classmethod
    def parse(cls, text: str) -> OperatorSpec:
        """``NAME:UTILITY[:flip=0.1,temperature=0.05,equal=0.05,skip=0.05]``."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise ValueError(f"--operators {text!r}: expected NAME:UTILITY[:key=value,...]")
        kw: dict[str, float] = {}
        if len(parts) == 3 and parts[2]:
            for item in parts[2].split(","):
                key, _, value = item.partition("=")
                if key not in ("flip", "temperature", "equal", "skip"):
                    raise ValueError(f"--operators {text!r}: unknown setting {key!r} (flip, "
                                     "temperature, equal, skip)")
                try:
                    kw[key] = float(value)
                except ValueError:
                    raise ValueError(f"--operators {text!r}: {key}={value!r} is not a "
                                     "number") from None
        return cls(parts[0], parts[1], **kw)


def decide(u_left: float, u_right: float, spec: OperatorSpec, rng: np.random.Generator
           ) -> tuple[str, bool]:
    """(choice as shown, whether the answer was flipped)."""
    r = rng.random()
    if r < spec.skip:
        return "skip", False
    if r < spec.skip + spec.equal:
        return "equal", False
    gap = u_right - u_left
    if spec.temperature > 0:
        p_left = 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, gap / spec.temperature))))
    else:
        p_left = 1.0 if gap > 0 else 0.0 if gap < 0 else 0.5
    choice = "a" if rng.random() < p_left else "b"
    flipped = bool(rng.random() < spec.flip)
    if flipped:
        choice = "b" if choice == "a" else "a"
    return choice, flipped


def _call(url: str, token: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    for _ in range(100):
        req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                     headers={"authorization": f"Bearer {token}",
                                              "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 429:
                time.sleep(float(e.headers.get("retry-after", "1")))
                continue
            raise RuntimeError(f"{method} {path}: {e.code} {e.read()[:200]!r}") from None
    raise RuntimeError(f"{method} {path}: still rate-limited after 100 tries")


def run_operator(url: str, token: str, spec: OperatorSpec, max_labels: int, seed: int,
                 offset: int = 0, total: int = 0) -> dict[str, Any]:
    """Label until ``max_labels`` are stored or the queue has nothing left; the counts.
    ``offset``: labels this operator gave before; ``total``: over all rounds (the drift
    switch lies at its fraction of ``total``)."""
    from cloudrl.steer.trace import Trace
    from cloudrl.steer.utilities import utility

    first, second, at = utilities_of(spec.utility)
    u_first = utility(first)
    u_second = utility(second) if second else None
    switch = int(round(at * (total or offset + max_labels))) if second else None
    rng = np.random.default_rng([seed, offset])
    counts = {"operator": spec.name, "labels": 0, "skip": 0, "equal": 0, "decided": 0,
              "flipped": 0, "switch_at": switch}
    task = _call(url, token, "GET", "/api/next")["task"]
    while task is not None and counts["labels"] < max_labels:
        n = offset + counts["labels"]
        u = u_second if (u_second is not None and n >= switch) else u_first
        left = u(Trace.from_json(task["left"]["trace"]))
        right = u(Trace.from_json(task["right"]["trace"]))
        choice, flipped = decide(left, right, spec, rng)
        counts["labels"] += 1
        counts["skip" if choice == "skip" else "equal" if choice == "equal" else "decided"] += 1
        counts["flipped"] += int(flipped)
        task = _call(url, token, "POST", "/api/labels",
                     {"assignment_id": task["assignment_id"], "choice": choice,
                      "time_taken_ms": 1})["task"]
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cloudrl.steer.operators",
                                description="a scripted operator labelling over HTTP")
    p.add_argument("--url", required=True)
    p.add_argument("--name", default="operator")
    p.add_argument("--utility", required=True)
    p.add_argument("--flip", type=float, default=0.1)
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--equal", type=float, default=0.05)
    p.add_argument("--skip", type=float, default=0.05)
    p.add_argument("--max-labels", type=int, default=100)
    p.add_argument("--offset", type=int, default=0,
                   help="labels this operator gave in earlier rounds")
    p.add_argument("--total", type=int, default=0,
                   help="labels over all rounds (the drift switch point's base; default: "
                        "offset + max-labels)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    try:
        spec = OperatorSpec(args.name, args.utility, args.flip, args.temperature, args.equal,
                            args.skip)
        if not token:
            raise ValueError(f"${TOKEN_ENV}: the operator's token is not set")
        if args.max_labels < 0:
            raise ValueError(f"--max-labels {args.max_labels} < 0")
    except ValueError as e:
        print(f"operator: {e}", file=sys.stderr)
        return 2
    print(json.dumps(run_operator(args.url, token, spec, args.max_labels, args.seed,
                                  args.offset, args.total)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
