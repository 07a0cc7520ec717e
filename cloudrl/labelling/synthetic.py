"""Synthetic segments: valid views and observations without running the simulator.

For load tests and unit tests: each segment gets smooth random series (grid draw,
queue, SLA violations, servers by power state, optionally a price and carbon signal and
two job classes) and random observations of the env's shapes, so the export writes a
pair dataset the reward model accepts.
"""

from __future__ import annotations

import numpy as np

from cloudrl.labelling.segments import EnvMeta, SegmentRecord, make_view
from envs.observation import JOB_COLS, macro_size, server_features


def _walk(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    x = np.cumsum(rng.normal(0, (hi - lo) * 0.08, n)) + rng.uniform(lo, hi)
    return np.clip(x, lo, hi)


def synthetic_segments(n: int, *, length: int = 25, n_servers: int = 6, k_slots: int = 4,
                       n_tiers: int = 2, scenario: str = "synthetic", signal: bool = False,
                       classes: bool = False, policies: tuple[str, ...] = ("p0", "p1"),
                       seed: int = 0) -> list[SegmentRecord]:
    """``n`` segments; segment i has seed i // len(policies) and policy i % len(policies)."""
    rng = np.random.default_rng(seed)
    meta = EnvMeta(peak_kw=n_servers * 0.4, queue_capacity=64, tick_seconds=60.0,
                   n_tiers=n_tiers, scenario=scenario)
    out = []
    for i in range(n):
        series: dict[str, list] = {"grid_kw": _walk(rng, length, 0.5, meta.peak_kw).round(3)
                                   .tolist()}
        if signal:
            series["price"] = _walk(rng, length, -10, 180).round(2).tolist()
            series["carbon"] = _walk(rng, length, 120, 420).round(1).tolist()
        if classes:
            for c in ("latency", "batch"):
                series[f"queue:{c}"] = np.rint(_walk(rng, length, 0, 12)).tolist()
                series[f"sla:{c}"] = (rng.random(length) < 0.08).astype(float).tolist()
        else:
            series["queue"] = np.rint(_walk(rng, length, 0, 10)).tolist()
            series["sla"] = (rng.random(length) < 0.1).astype(float).tolist()
        active = np.rint(_walk(rng, length, 1, n_servers)).astype(int)
        waking = np.minimum(rng.integers(0, 2, length), n_servers - active)
        series["servers:active"] = active.astype(float).tolist()
        series["servers:waking"] = waking.astype(float).tolist()
        series["servers:asleep"] = (n_servers - active - waking).astype(float).tolist()
        policy = policies[i % len(policies)]
        view = make_view(series=series, meta=meta, policy=policy, source="synthetic",
                         seed=i // len(policies), start=0)
        obs = {"macro": rng.normal(0, 1, (length + 1, macro_size(n_tiers))).astype(np.float32),
               "servers": rng.uniform(0, 1, (length + 1, n_servers, server_features(n_tiers)))
               .astype(np.float32),
               "jobs": rng.uniform(0, 1, (length + 1, k_slots, len(JOB_COLS)))
               .astype(np.float32),
               "actions": rng.integers(0, n_servers, (length, 1)).astype(np.int64)}
        stats = {"sla_violations": float(view["summary"]["sla_violations"] or 0.0),
                 "energy_kwh": float(view["summary"]["energy_kwh"] or 0.0)}
        out.append(SegmentRecord(key=f"syn:{scenario}:{seed}:{i}", view=view, obs=obs,
                                 stats=stats))
    return out
