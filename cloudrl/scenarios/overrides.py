"""``--override`` of the scenario commands: a JSON object merged into a scenario's
definition (``evaluate``, ``headline``, ``offline``), and the one place those commands load
a scenario variant and turn what is wrong with it into one line.

Validating a scenario also checks what an episode of it would build (the expected job count
against ``max_jobs``, a ``csv`` signal file's rows and its coverage of the episode), so a
bad variant fails here, before any worker starts; a signal file's error reads exactly as
``cloudrl signals check`` prints it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError


class ScenarioInputError(ValueError):
    """A scenario variant that cannot run; the message is one line naming what is wrong."""


def scenario_overrides(text: str | None) -> dict[str, Any] | None:
    """``--override``: a JSON object merged into the scenario's YAML before validation (the
    catalog's keys, nested objects merge), e.g. ``{"executor": {"spare_cores_frac": 0.2}}``.
    A ValueError names what is wrong; the merged config is validated by the caller."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--override: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--override: expected a JSON object of scenario keys, got "
                         f"{type(value).__name__}")
    return value


def scenario_error_line(err: ValidationError, source: str) -> str:
    """One line for a scenario that does not validate: a signal file's own message as it is
    (the file, its line and its column header); a whole-scenario check (``max_jobs``, the
    signal file's coverage) as ``source: message``; field errors as the config loader
    words them."""
    from envs.signals.csv_import import SignalFileError

    errors = err.errors()
    for e in errors:
        exc = (e.get("ctx") or {}).get("error")
        if isinstance(exc, SignalFileError):
            return str(exc)
    if errors and all(not e["loc"] and e["type"] == "value_error" for e in errors):
        return "; ".join(f"{source}: {e['msg'].removeprefix('Value error, ')}"
                         for e in errors)
    from cloudrl.config_loader import format_validation_error

    return format_validation_error(err, source)


def load_variant(name: str, override: str | None,
                 n_servers: int | None = None) -> tuple[dict[str, Any] | None, Any]:
    """(the parsed ``--override``, the validated scenario) of ``name``; ScenarioInputError
    (one line) for bad JSON or a variant that does not validate, UnknownScenarioError for
    an unknown name."""
    from envs.scenario.catalog import load_scenario

    try:
        overrides = scenario_overrides(override)
    except ValueError as e:
        raise ScenarioInputError(str(e)) from None
    source = "--override" if overrides else "--n-servers" if n_servers else "the catalog"
    try:
        return overrides, load_scenario(name, overrides, n_servers=n_servers)
    except ValidationError as e:
        raise ScenarioInputError(scenario_error_line(e, source)) from None
