"""Traces as labelling segments: what the page draws, plus the trace an operator reads.

A segment is one whole episode of a controller on a train seed. Its view carries the
page's series (grid draw, signal, queues and SLA per class, active servers) and, under
``trace``, the full per-tick trace (:meth:`cloudrl.steer.trace.Trace.to_json`): what a
scripted operator reads to apply its own utility, as a person reads the plots.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import Any

import numpy as np

from cloudrl.labelling.queue import PairSpec, add_pairs
from cloudrl.labelling.segments import EnvMeta, SegmentRecord, make_view
from cloudrl.steer.trace import Trace


def segment_key(scenario: str, kind: str, params: dict[str, Any], seed: int) -> str:
    digest = hashlib.sha256(json.dumps([kind, params], sort_keys=True).encode()).hexdigest()
    return f"steer:{scenario}:{kind}:{digest[:12]}:{int(seed)}"


def segment_of(key: str, trace: Trace, scenario: str, kind: str, seed: int) -> SegmentRecord:
    t = trace.ticks
    hours = trace.tick_seconds / 3600.0
    series = {"grid_kw": t["grid_kwh"] / hours, "price": t["price"], "carbon": t["carbon"],
              "queue:lc": t["queued_lc"], "queue:batch": t["queued_batch"] + t["pool_cores"],
              "sla:lc": t["viol_lc"], "sla:batch": t["viol_batch"],
              "servers:active": np.rint(t["active"] * trace.toggles.shape[1])}
    meta = EnvMeta(peak_kw=0.0, queue_capacity=0, tick_seconds=trace.tick_seconds,
                   n_tiers=0, scenario=scenario)
    view = make_view(series={k: [round(float(x), 4) for x in v] for k, v in series.items()},
                     meta=meta, policy=kind, source="steer", seed=seed, start=0)
    view["summary"]["cost_usd"] = round(trace.cost_usd(), 4)
    view["units"] = {"queue": "cores"}
    view["trace"] = trace.to_json()
    return SegmentRecord(key=key, view=view)


def enqueue_pairs(conn: sqlite3.Connection, segments: dict[str, SegmentRecord],
                  pairs: list[tuple[str, str]], k: int, priority: float = 0.5) -> int:
    """Store ``pairs`` of segment keys, each for ``k`` operators; returns how many were new."""
    def stratum(a: str, b: str) -> str:
        kinds = sorted({segments[a].view["policy"], segments[b].view["policy"]})
        return f"{segments[a].view['scenario']}/{'+'.join(kinds)}"

    specs = [PairSpec(segments[a], segments[b], source="steer", priority=priority,
                      stratum=stratum(a, b)) for a, b in pairs]
    added, _ = add_pairs(conn, specs, k=k)
    return added
