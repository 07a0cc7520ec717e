"""``--override`` of the scenario commands: a JSON object merged into a scenario's
definition (``evaluate``, ``headline``, ``offline``)."""

from __future__ import annotations

import json
from typing import Any


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
