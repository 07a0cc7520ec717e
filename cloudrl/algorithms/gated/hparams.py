"""The gated controller's typed hyperparameters (``cloudrl train --algo gated_dqn``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from cloudrl.algorithms.dqn import DQNHparams
from cloudrl.algorithms.gated.controller import check_presets, heuristic_config


class GatedHparams(DQNHparams):
    """Masked Double DQN (dueling) over presets of the power-aware heuristic.

    ``heuristic``: the base PowerAwareConfig fields (the tuned heuristic; ``cloudrl
    headline`` puts the tuned parameters here); ``presets``: additive offsets of its
    numeric knobs per choice, preset 0 is the base (None: the default six);
    ``decision_every``: ticks one choice lasts.
    """

    heuristic: dict[str, Any] = Field(default_factory=dict)
    presets: list[dict[str, float | int | str]] | None = None
    decision_every: int = Field(default=1, ge=1)
    dueling: bool = True

    @field_validator("heuristic")
    @classmethod
    def _heuristic_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        heuristic_config(value)
        return value

    @field_validator("presets")
    @classmethod
    def _preset_changes(cls, value: list[dict[str, float | int | str]] | None
                        ) -> list[dict[str, float | int | str]] | None:
        return None if value is None else check_presets(value)
