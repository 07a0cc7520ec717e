"""What one side of a pair shows: per-tick series by name, summary numbers, observations.

A segment *view* is JSON: ``policy``, ``source``, ``scenario``, ``seed``, ``start``,
``length`` (ticks), ``tick_seconds``, ``series`` (name -> one number per tick, ``null``
where unknown) and ``summary`` (name -> number). The page draws a panel for every group
of series the segment carries, so a plain workload's segment shows what it has and a
scenario's segment shows more:

* ``grid_kw`` (and ``solar_kw``): power drawn from the grid, kW;
* ``price`` ($/MWh), ``carbon`` (gCO2/kWh): the signal, when the episode has one;
* ``queue`` or ``queue:<class>``: jobs waiting (per job class when known);
* ``sla`` or ``sla:<class>``: SLA violations per tick;
* ``servers:<state>``: servers in each power state (active, asleep, waking, ... ).

From a recorded episode the series come from the post-step observations (grid draw =
``power_frac`` x the fleet's peak power, queue = ``queue_fill`` x queue capacity, power
states from the server rows) and from each step's ``info``: ``violations`` -> ``sla``,
``energy_kwh``; and, when a scenario reports them, ``price``, ``carbon`` (or
``carbon_intensity``), ``grid_kw``, ``solar_kw``, ``queue_<class>``,
``violations_<class>`` and ``servers_<state>`` (these replace the derived ones).

The observations the reward model reads (``macro``, ``servers``, ``jobs``: T+1 each,
``actions``: T) and the teacher statistics travel with the segment as a compressed
``npz`` blob (:func:`pack_obs`), so the export writes the reward model's pair dataset.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envs.observation import MACRO_TAIL, S

MAX_TICKS = 5000
INFO_SCALARS = {"price": "price", "carbon": "carbon", "carbon_intensity": "carbon",
                "grid_kw": "grid_kw", "solar_kw": "solar_kw"}
INFO_GROUPS = (("queue_", "queue:"), ("violations_", "sla:"), ("servers_", "servers:"))
SERIES_NAME = re.compile(r"^[a-z_]+(:[A-Za-z0-9_.-]{1,40})?$")
STAT_KEYS = ("sla_violations", "overload", "slowdown_spread", "energy_kwh")


@dataclass
class EnvMeta:
    """What turns observations into operator units: fleet peak, queue size, tick, tiers."""

    peak_kw: float
    queue_capacity: int
    tick_seconds: float
    n_tiers: int
    scenario: str = ""

    @classmethod
    def of_env(cls, env: Any, scenario: str = "") -> EnvMeta:
        fleet, sim = env.sim.fleet, env.config.sim
        return cls(peak_kw=float(fleet.p_max.sum()) / 1000.0,
                   queue_capacity=int(sim.queue_capacity), tick_seconds=float(sim.tick_seconds),
                   n_tiers=int(fleet.n_tiers),
                   scenario=scenario or str(getattr(env.config.workload, "kind", "")))


@dataclass
class SegmentRecord:
    """A segment ready for the store: a stable key, its view, its observations."""

    key: str
    view: dict[str, Any]
    obs: dict[str, np.ndarray] | None = None
    stats: dict[str, float] = field(default_factory=dict)


def _clean(values: Sequence[float]) -> list[float | None]:
    out: list[float | None] = []
    for v in values:
        f = float(v)
        out.append(round(f, 4) if math.isfinite(f) else None)
    return out


def series_from_observations(macro: np.ndarray, servers: np.ndarray, meta: EnvMeta
                             ) -> dict[str, list[float | None]]:
    """Grid draw, queue length and servers by power state, one value per observation."""
    base = 4 * meta.n_tiers
    power_frac = macro[:, base + MACRO_TAIL.index("power_frac")]
    queue_fill = macro[:, base + MACRO_TAIL.index("queue_fill")]
    active = servers[..., S["is_active"]] > 0.5
    asleep = servers[..., S["is_asleep"]] > 0.5
    waking = servers[..., S["is_waking"]] > 0.5
    return {"grid_kw": _clean(power_frac * meta.peak_kw),
            "queue": _clean(np.rint(queue_fill * meta.queue_capacity)),
            "servers:active": _clean(active.sum(-1)),
            "servers:asleep": _clean(asleep.sum(-1)),
            "servers:waking": _clean(waking.sum(-1))}


def series_from_infos(infos: Sequence[Mapping[str, Any]]) -> dict[str, list[float | None]]:
    """Per-step info values as series (missing in a step: None)."""
    names: dict[str, str] = {}
    for info in infos:
        for key in info or {}:
            if key in INFO_SCALARS:
                names[key] = INFO_SCALARS[key]
            elif key == "violations":
                names[key] = "sla"
            else:
                for prefix, group in INFO_GROUPS:
                    if key.startswith(prefix) and len(key) > len(prefix):
                        names[key] = group + key[len(prefix):]
    out: dict[str, list[float | None]] = {}
    for key, name in names.items():
        values = []
        for info in infos:
            v = (info or {}).get(key)
            values.append(float(v) if isinstance(v, int | float | np.number) else math.nan)
        if SERIES_NAME.match(name):
            out[name] = _clean(values)
    return out


def merge_series(derived: dict[str, list], reported: dict[str, list]) -> dict[str, list]:
    """Reported series win; a reported per-class queue or power-state group replaces the
    derived total or states."""
    out = dict(derived)
    if any(k.startswith("queue:") for k in reported):
        out.pop("queue", None)
    if any(k.startswith("servers:") for k in reported):
        for k in [k for k in out if k.startswith("servers:")]:
            out.pop(k)
    out.update(reported)
    return out


def _mean(values: Sequence[float | None]) -> float:
    finite = [v for v in values if v is not None]
    return float(np.mean(finite)) if finite else math.nan


def _sum(values: Sequence[float | None]) -> float:
    finite = [v for v in values if v is not None]
    return float(np.sum(finite)) if finite else math.nan


def summarize(series: Mapping[str, Sequence[float | None]], tick_seconds: float,
              energy_kwh: float | None = None) -> dict[str, float | None]:
    """The numbers under a segment's plots (None where the segment cannot say)."""
    hours = tick_seconds / 3600.0
    energy = energy_kwh if energy_kwh is not None else _sum(series.get("grid_kw", [])) * hours
    sla_keys = [k for k in series if k == "sla" or k.startswith("sla:")]
    sla = (_sum(series["sla"]) if "sla" in series
           else sum(_sum(series[k]) for k in sla_keys) if sla_keys else math.nan)
    queue_keys = [k for k in series if k == "queue" or k.startswith("queue:")]
    queue = [sum(v or 0.0 for v in vals) for vals in zip(*(series[k] for k in queue_keys),
                                                         strict=True)] if queue_keys else []
    out: dict[str, float | None] = {
        "energy_kwh": energy, "sla_violations": sla,
        "mean_queue": _mean(queue), "max_queue": max(queue) if queue else math.nan,
        "mean_active_servers": _mean(series.get("servers:active", [])),
    }
    for name, unit_mean in (("price", "mean_price"), ("carbon", "mean_carbon")):
        if name in series:
            out[unit_mean] = _mean(series[name])
    if "price" in series and "grid_kw" in series:
        cost = [(p or 0.0) * (g or 0.0) * hours / 1000.0
                for p, g in zip(series["price"], series["grid_kw"], strict=True)]
        out["energy_cost"] = float(np.sum(cost))
    for k in sla_keys:
        if k != "sla":
            out[f"sla_violations:{k.split(':', 1)[1]}"] = _sum(series[k])
    return {k: (round(v, 4) if v is not None and math.isfinite(v) else None)
            for k, v in out.items()}


def make_view(*, series: dict[str, list], meta: EnvMeta, policy: str, source: str,
              seed: int, start: int, energy_kwh: float | None = None) -> dict[str, Any]:
    lengths = {len(v) for v in series.values()}
    if len(lengths) != 1:
        raise ValueError(f"series lengths differ: {sorted(lengths)}")
    length = lengths.pop()
    return {"policy": policy, "source": source, "scenario": meta.scenario, "seed": int(seed),
            "start": int(start), "length": length, "tick_seconds": meta.tick_seconds,
            "series": series, "summary": summarize(series, meta.tick_seconds, energy_kwh)}


def validate_view(view: Any, where: str = "segment") -> dict[str, Any]:
    """A view as the store keeps it; ValueError naming the field otherwise."""
    if not isinstance(view, Mapping):
        raise ValueError(f"{where}: not an object")
    series = view.get("series")
    if not isinstance(series, Mapping) or not series:
        raise ValueError(f"{where}.series: missing or empty")
    length = None
    for name, values in series.items():
        if not isinstance(name, str) or not SERIES_NAME.match(name):
            raise ValueError(f"{where}.series: name {name!r} is not 'name' or 'group:member'")
        if not isinstance(values, list) or not 1 <= len(values) <= MAX_TICKS:
            raise ValueError(f"{where}.series.{name}: a list of 1..{MAX_TICKS} numbers")
        if length is not None and len(values) != length:
            raise ValueError(f"{where}.series.{name}: {len(values)} ticks, others have {length}")
        length = len(values)
        for i, v in enumerate(values):
            if v is not None and (not isinstance(v, int | float) or not math.isfinite(v)):
                raise ValueError(f"{where}.series.{name}[{i}]: {v!r} is not a finite number")
    summary = view.get("summary", {})
    if not isinstance(summary, Mapping):
        raise ValueError(f"{where}.summary: not an object")
    return dict(view)


# ----------------------------------------------------------------------------- observations


def pack_obs(obs: Mapping[str, np.ndarray], stats: Mapping[str, float] | None = None) -> bytes:
    """Observations (and teacher statistics) as a compressed npz blob."""
    buf = io.BytesIO()
    arrays = {k: np.asarray(v) for k, v in obs.items()}
    arrays["stats"] = np.array([float((stats or {}).get(k, math.nan)) for k in STAT_KEYS])
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def unpack_obs(blob: bytes) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    with np.load(io.BytesIO(blob)) as data:
        arrays = {k: data[k] for k in data.files}
    stats_arr = arrays.pop("stats", np.full(len(STAT_KEYS), math.nan))
    return arrays, {k: float(v) for k, v in zip(STAT_KEYS, stats_arr, strict=True)}


# ----------------------------------------------------------------------------- strata


def situation(view: Mapping[str, Any]) -> str:
    """A coarse label of what a segment is living through (for stratified sampling)."""
    s = view.get("summary", {})
    classes = sorted(k.split(":", 1)[1] for k, v in s.items()
                     if k.startswith("sla_violations:") and (v or 0) > 0)
    if classes:
        return "violations:" + "+".join(classes)
    if (s.get("sla_violations") or 0) > 0:
        return "violations"
    if (s.get("max_queue") or 0) >= 1:
        return "queued"
    return "calm"


def stratum_of(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """Scenario and the worse situation of the two sides: ``poisson/violations``."""
    order = {"calm": 0, "queued": 1}
    worst = max((situation(a), situation(b)), key=lambda x: order.get(x, 2))
    return f"{a.get('scenario') or 'unknown'}/{worst}"
