"""Typed hyperparameters: the base of every algorithm's model (``cloudrl train --hparams``).

An algorithm's hyperparameters are a pydantic model whose fields are keyword arguments
of its RLlib ``AlgorithmConfig.training(...)``, with cloudrl's defaults. A field whose
default is ``None`` is not passed unless set, so RLlib's (or the algorithm config's)
own default applies; a few defaults depend on the run (the env-step budget, the number
of env runners) and are filled in by :meth:`Hparams.run_defaults`. Unknown keys and bad
types are errors that name the field (``hparams.lr``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class RunShape:
    """What run-dependent defaults depend on."""

    env_steps: int
    num_env_runners: int = 0


class Hparams(BaseModel):
    """Base of the per-algorithm hyperparameter models (extra keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    def run_defaults(self, run: RunShape) -> dict[str, Any]:
        """Defaults that depend on the run, for fields left at ``None``."""
        return {}

    def training_kwargs(self, run: RunShape) -> dict[str, Any]:
        """The ``AlgorithmConfig.training(**kwargs)`` of these hyperparameters on ``run``."""
        kwargs = self.model_dump(mode="json", exclude_none=True)
        for key, value in self.run_defaults(run).items():
            kwargs.setdefault(key, value)
        return kwargs


class AlignmentHparams(Hparams):
    """The preference-alignment head's settings (BDQ, PPO; see
    ``cloudrl.algorithms.alignment_head``). None keeps the algorithm config's default: no
    pairs, weight 0 (the plain algorithm, bit for bit), 32 pairs a step, scale 1."""

    alignment_pairs: str | None = Field(default=None, description="pair dataset directory")
    alignment_weight: float | None = Field(default=None, ge=0,
                                           description="weight of the BT loss; 0: off")
    alignment_batch: int | None = Field(default=None, ge=1, description="pairs per update")
    alignment_trunk_grad_scale: float | None = Field(
        default=None, ge=0, description="scale of the BT gradient into the shared trunk")
