"""Named scenarios: small YAML files beside this module, loaded into :class:`ScenarioConfig`.

``scenario_names()`` lists them, ``load_scenario(name, **overrides)`` reads one (an
unknown name is an error that lists the valid ones), ``describe()`` gives each name
with its one-line description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from envs.scenario.config import ScenarioConfig

CATALOG = Path(__file__).with_name("catalog")


class UnknownScenarioError(ValueError):
    """A scenario name that is not in the catalog."""


def scenario_names() -> list[str]:
    return sorted(p.stem for p in CATALOG.glob("*.yaml"))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_scenario(name: str, overrides: dict[str, Any] | None = None,
                  n_servers: int | None = None) -> ScenarioConfig:
    """The named scenario, with ``overrides`` merged into its YAML (nested dicts merge);
    ``n_servers`` is another fleet size (the load scales with it, utilization stays)."""
    if n_servers:
        overrides = _merge(dict(overrides or {}), {"fleet": {"n_servers": n_servers}})
    path = CATALOG / f"{name}.yaml"
    if not path.is_file():
        raise UnknownScenarioError(
            f"unknown scenario {name!r}; valid: {', '.join(scenario_names())}")
    data = yaml.safe_load(path.read_text()) or {}
    return ScenarioConfig.model_validate(_merge(data, overrides or {}))


def describe() -> list[tuple[str, str]]:
    return [(n, load_scenario(n).description) for n in scenario_names()]
