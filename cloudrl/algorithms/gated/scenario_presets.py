"""The signal-aware heuristic as a gated scenario controller: P presets of its knobs.

On a scenario (``cloudrl train --scenario NAME --algo gated_dqn``) the gated DQN picks,
every decision period, one preset of the tuned signal-aware rule
(:mod:`cloudrl.heuristics.signal_aware`); the rule with that preset sets the two controls
(:mod:`envs.scenario.gated`). A preset shifts the base parameters by additive offsets,
clipped into each knob's valid range; preset 0 is the base itself, so the constant choice
0 is the tuned rule, period for period. The rule holds no state between decisions (its
``reset`` reads the scenario's constants), so every preset sees the same view whatever the
agent picked before.

``make_scenario_controller({"heuristic": {...}, "presets": [{...}, ...]})`` is the factory
the gated scenario env resolves from ``config["controller"]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields, replace
from typing import Any

import numpy as np

from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral
from envs.scenario.control import PlanView
from envs.scenario.sim import ScenarioSim

SCENARIO_CONTROLLER_PATH = "cloudrl.algorithms.gated.scenario_presets:make_scenario_controller"
# each knob's valid range (SignalAwareConfig's checks): offsets are clipped into it
KNOB_RANGES = {"quantile": (0.0, 1.0), "window_hours": (0.25, 168.0),
               "release_util": (0.0, 2.0), "ready_margin": (0.0, 5.0),
               "guard_hours": (0.0, 24.0)}
# Around the tuned point, one lever per preset: release in fewer / more periods (the price
# threshold's quantile), a smaller release at once, and more / less capacity kept ready
# ahead of the latency-critical peak.
DEFAULT_SCENARIO_PRESETS: tuple[dict[str, float], ...] = (
    {},
    {"quantile": -0.25},
    {"quantile": 0.25},
    {"release_util": -0.3},
    {"ready_margin": 0.5},
    {"ready_margin": -0.25},
)


def check_scenario_presets(presets: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """The presets as dicts of finite offsets of :data:`KNOB_RANGES`' knobs; a ValueError
    names a bad knob or value."""
    out: list[dict[str, float]] = []
    for i, preset in enumerate(presets):
        if not isinstance(preset, Mapping):
            raise ValueError(f"presets[{i}]: expected an object of knob offsets, got {preset!r}")
        checked = {}
        for key, value in preset.items():
            where = f"presets[{i}].{key}"
            if key not in KNOB_RANGES:
                raise ValueError(f"{where}: not a signal-aware knob "
                                 f"({', '.join(KNOB_RANGES)})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not np.isfinite(value):
                raise ValueError(f"{where}: expected a finite number, got {value!r}")
            checked[key] = float(value)
        out.append(checked)
    if not out:
        raise ValueError("presets: need at least one")
    return out


def scenario_preset_configs(base: SignalAwareConfig, presets: Sequence[Mapping[str, Any]]
                            ) -> list[SignalAwareConfig]:
    """``base`` shifted by each preset's offsets (clipped into range); preset 0 is ``base``."""
    configs = [base]
    for preset in check_scenario_presets(presets)[1:]:
        configs.append(replace(base, **{
            k: float(np.clip(getattr(base, k) + v, *KNOB_RANGES[k])) for k, v in preset.items()}))
    return configs


class SignalAwarePresets:
    """The signal-aware rule with the preset the agent chose (the scenario's controls)."""

    def __init__(self, base: SignalAwareConfig | None = None,
                 presets: Sequence[Mapping[str, Any]] = DEFAULT_SCENARIO_PRESETS) -> None:
        self.base = base or SignalAwareConfig()
        self.configs = scenario_preset_configs(self.base, presets)
        self.rules = [SignalAwareDeferral(c) for c in self.configs]
        self.n_choices = len(self.rules)

    def reset(self, sim: ScenarioSim) -> None:
        for rule in self.rules:
            rule.reset(sim)

    def controls(self, view: PlanView, choice: int) -> tuple[float, float]:
        return self.rules[choice].decide_view(view)

    def describe(self) -> list[dict[str, float]]:
        """Every preset's knobs (for logs and reports)."""
        return [asdict(c) for c in self.configs]


def make_scenario_controller(config: Mapping[str, Any]) -> SignalAwarePresets:
    """``{"heuristic": SignalAwareConfig fields, "presets": [offsets, ...]}`` -> controller."""
    cfg = dict(config)
    presets = cfg.pop("presets", None)
    heuristic = cfg.pop("heuristic", None) or {}
    if cfg:
        raise ValueError(f"controller config: unknown key {sorted(cfg)[0]!r} "
                         "(expected heuristic, presets)")
    known = {f.name for f in fields(SignalAwareConfig)}
    unknown = sorted(set(heuristic) - known)
    if unknown:
        raise ValueError(f"heuristic.{unknown[0]}: not a SignalAwareConfig field "
                         f"({', '.join(sorted(known))})")
    return SignalAwarePresets(SignalAwareConfig(**heuristic),
                              DEFAULT_SCENARIO_PRESETS if presets is None else presets)
