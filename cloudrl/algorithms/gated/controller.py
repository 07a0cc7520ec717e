"""The power-aware heuristic as a gated controller: P presets of its knobs.

A preset changes the base :class:`PowerAwareConfig` (the tuned heuristic's parameters,
``heuristic``): numeric knobs by additive offsets, clipped at 0 (e.g. ``{"spare_floor":
-0.25, "lead_ticks": -1}`` keeps less spare capacity awake, ``{"hysteresis": 100}`` sleeps
no server this tick, ``{"tier_weight": -100}`` places on the most loaded server whatever
its tier); the placement knobs ``job_order`` and ``priority_level`` by value (e.g.
``{"job_order": "size"}`` places the largest jobs first). Preset 0 is always the base
itself (no changes), so the constant choice 0 is the heuristic, tick for tick. One
:class:`PowerAwareConsolidation` runs every preset (only its config changes), so its
running estimates (mean job size) are the same whichever preset the agent picks.

``make_controller({"heuristic": {...}, "presets": [{...}, ...]})`` is the factory the
gated env (:mod:`envs.gated_env`) resolves from ``env_config["controller"]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields, replace
from typing import Any

import numpy as np

from cloudrl.heuristics.power_aware import PowerAwareConfig, PowerAwareConsolidation

CONTROLLER_PATH = "cloudrl.algorithms.gated.controller:make_controller"
NUMERIC_KNOBS = ("spare_floor", "spare_frac", "lead_ticks", "hysteresis", "tier_weight",
                 "size_prior")
PLACEMENT_KNOBS = ("job_order", "priority_level")  # set by value, not offset
JOB_ORDERS = ("viable", "slack", "fifo", "size")
NO_SLEEP = 100.0  # a hysteresis offset no spare capacity reaches: nothing sleeps

# Around the tuned point: leaner and leaner headroom, more headroom ("wake one more": a
# whole largest machine of extra spare), and "no sleeping this tick".
DEFAULT_PRESETS: tuple[dict[str, float], ...] = (
    {},
    {"spare_floor": -0.25, "lead_ticks": -1.0},
    {"spare_floor": -0.5, "lead_ticks": -2.0, "hysteresis": -0.5},
    {"spare_floor": 0.5, "lead_ticks": 1.0},
    {"spare_floor": 1.0},
    {"hysteresis": NO_SLEEP},
)
# Placement presets (experiments/benchmarks/bench_headline_recipe.py, "Placement presets"): the job
# order and tier preference that were the per-seed best constants on train seeds.
PLACEMENT_PRESETS: tuple[dict[str, float | int | str], ...] = (
    {},
    {"job_order": "size"},
    {"job_order": "fifo"},
    {"tier_weight": 3.0},
    {"tier_weight": -100.0},
    {"tier_weight": 10.0, "job_order": "size", "priority_level": 0},
)


def _check_value(i: int, key: str, value: Any) -> float | int | str:
    where = f"presets[{i}].{key}"
    if key == "job_order":
        if value not in JOB_ORDERS:
            raise ValueError(f"{where}: expected one of {', '.join(JOB_ORDERS)}, got {value!r}")
        return str(value)
    if key == "priority_level":
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or value != int(value) or value < -1:
            raise ValueError(f"{where}: expected an integer >= -1, got {value!r}")
        return int(value)
    if key not in NUMERIC_KNOBS:
        raise ValueError(f"{where}: not a numeric PowerAwareConfig knob "
                         f"({', '.join(NUMERIC_KNOBS)}) or placement knob "
                         f"({', '.join(PLACEMENT_KNOBS)})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def check_presets(presets: Sequence[Mapping[str, Any]]) -> list[dict[str, float | int | str]]:
    """The presets as dicts of numeric offsets and placement values; a ValueError names a
    bad knob or value."""
    out = []
    for i, preset in enumerate(presets):
        out.append({k: _check_value(i, k, v) for k, v in preset.items()})
    if not out:
        raise ValueError("presets: need at least one")
    return out


def preset_configs(base: PowerAwareConfig, presets: Sequence[Mapping[str, Any]]
                   ) -> list[PowerAwareConfig]:
    """``base`` shifted by each preset's offsets (clipped at 0) with its placement values
    set; preset 0 is ``base``."""
    configs = [base]
    for preset in check_presets(presets)[1:]:
        configs.append(replace(base, **{
            k: v if k in PLACEMENT_KNOBS else max(0.0, getattr(base, k) + v)
            for k, v in preset.items()}))
    return configs


def heuristic_config(heuristic: Mapping[str, Any] | None) -> PowerAwareConfig:
    """A PowerAwareConfig from a dict of its fields; a ValueError names an unknown one."""
    known = {f.name for f in fields(PowerAwareConfig)}
    unknown = sorted(set(heuristic or {}) - known)
    if unknown:
        raise ValueError(f"heuristic.{unknown[0]}: not a PowerAwareConfig field "
                         f"({', '.join(sorted(known))})")
    return PowerAwareConfig(**dict(heuristic or {}))


class PresetController:
    """Runs the power-aware heuristic with the preset the agent chose (branching actions)."""

    def __init__(self, base: PowerAwareConfig | None = None,
                 presets: Sequence[Mapping[str, Any]] = DEFAULT_PRESETS) -> None:
        self.base = base or PowerAwareConfig()
        self.configs = preset_configs(self.base, presets)
        self.n_choices = len(self.configs)
        self.heuristic = PowerAwareConsolidation("branching", self.base)

    def reset(self) -> None:
        self.heuristic.reset()

    def act(self, obs: dict[str, np.ndarray], choice: int) -> np.ndarray:
        self.heuristic.config = self.configs[choice]
        return self.heuristic.act(obs)

    def describe(self) -> list[dict[str, float | int | str]]:
        """The headroom and placement knobs of every preset (for logs and reports)."""
        keys = (*NUMERIC_KNOBS[:5], *PLACEMENT_KNOBS)
        return [{k: asdict(c)[k] for k in keys} for c in self.configs]


def make_controller(config: Mapping[str, Any]) -> PresetController:
    """``{"heuristic": PowerAwareConfig fields, "presets": [changes, ...]}`` -> controller."""
    cfg = dict(config)
    presets = cfg.pop("presets", None)
    heuristic = cfg.pop("heuristic", None)
    if cfg:
        raise ValueError(f"controller config: unknown key {sorted(cfg)[0]!r} "
                         "(expected heuristic, presets)")
    return PresetController(heuristic_config(heuristic),
                            DEFAULT_PRESETS if presets is None else presets)
