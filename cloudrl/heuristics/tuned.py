"""Tuned heuristic parameters as a policy: validation of the parameters and the ``_tuned`` row.

``cloudrl tune-heuristic`` (:mod:`cloudrl.headline.tuning`, which runs the evaluations)
writes the parameters; ``cloudrl.evaluate`` and the service build the tuned policy here.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from cloudrl.heuristics.power_aware import PowerAwareConfig, PowerAwareConsolidation
from cloudrl.policy import Interface

TUNED_SUFFIX = "_tuned"  # the row of a heuristic run with tuned parameters


def power_aware_config(params: dict[str, Any]) -> PowerAwareConfig:
    """``PowerAwareConfig(**params)``; a ValueError names an unknown or bad parameter."""
    known = {f.name for f in fields(PowerAwareConfig)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown power_aware parameter {unknown[0]!r}; expected some of "
                         f"{sorted(known)}")
    try:
        return PowerAwareConfig(**params)
    except (TypeError, ValueError) as e:
        raise ValueError(str(e)) from None


def tuned_heuristic(base: str, params: dict[str, Any], interface: Interface
                    ) -> PowerAwareConsolidation:
    """The heuristic ``base`` with ``params``, named ``<base>_tuned`` (its table row)."""
    if base != "power_aware":
        raise ValueError(f"only power_aware has tunable parameters, got {base!r}")
    policy = PowerAwareConsolidation(interface, config=power_aware_config(params))
    policy.name = base + TUNED_SUFFIX
    return policy
