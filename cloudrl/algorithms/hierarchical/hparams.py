"""The hierarchical supervisor's typed hyperparameters (``cloudrl train --algo hierarchical``).

PPO's settings for the supervisor, plus the hierarchy itself: ``sub_agents`` (specs:
heuristic names or checkpoint directories, in the order of the supervisor's actions),
``k`` (ticks per supervisor decision) and ``supervisor_hidden`` (MLP width). One
supervisor step is ``k`` cluster ticks, so ``env_steps`` and the batch sizes count
supervisor decisions (100 per 1,000-tick episode at ``k=10``). Ray-free.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from cloudrl.algorithms.ppo import PPOHparams

META_FILE = "cloudrl.json"  # as cloudrl.checkpoint_policy (not imported: no cycle via specs)


class HierarchicalHparams(PPOHparams):
    """PPO on the supervisor; sub-agents frozen inside the env."""

    sub_agents: list[str] = Field(default_factory=lambda: ["power_aware", "sjf"],
                                  min_length=1, description="heuristic names or checkpoints")
    k: int = Field(default=10, ge=1, description="ticks per supervisor decision")
    supervisor_hidden: int = Field(default=64, ge=4)
    train_batch_size_per_learner: int = Field(default=1000, ge=1)
    num_epochs: int = Field(default=8, ge=1)

    @field_validator("sub_agents")
    @classmethod
    def _known(cls, specs: list[str]) -> list[str]:
        return [check_spec(spec) for spec in specs]

    @model_validator(mode="after")
    def _no_alignment(self) -> HierarchicalHparams:
        if any(getattr(self, f) is not None for f in AlignmentFields):
            raise ValueError("the alignment head is not available for the hierarchical "
                             "supervisor (alignment_* settings)")
        return self


def check_spec(spec: str, is_checkpoint: Callable[[str], bool] | None = None) -> str:
    """``spec`` if it names a heuristic (its settings valid), the resolved path if it is a
    checkpoint directory (``is_checkpoint``; default: it holds the cloudrl meta file),
    else a ValueError naming it."""
    from cloudrl.heuristics import HEURISTICS, make_heuristic

    parsed = heuristic_spec(spec)
    if parsed is not None:
        try:
            make_heuristic(parsed[0], "flat", **parsed[1])
        except TypeError as e:
            raise ValueError(f"sub-agent {spec!r}: {e}") from None
        return spec
    if (is_checkpoint or _has_meta)(spec):
        return str(Path(spec).resolve())
    raise ValueError(f"sub-agent {spec!r} is neither a heuristic ({', '.join(sorted(HEURISTICS))})"
                     " nor a cloudrl checkpoint directory")


def _has_meta(spec: str) -> bool:
    return (Path(spec) / META_FILE).is_file()


def heuristic_spec(spec: str) -> tuple[str, dict[str, float]] | None:
    """(name, settings) of a heuristic spec ``name[:key=value,...]``; None if not one."""
    from cloudrl.heuristics import HEURISTICS

    name, _, rest = spec.partition(":")
    if name not in HEURISTICS:
        return None
    settings: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError
            settings[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"sub-agent {spec!r}: settings must be key=number, got "
                             f"{item!r}") from None
    return name, settings


AlignmentFields = ("alignment_pairs", "alignment_weight", "alignment_batch",
                   "alignment_trunk_grad_scale")


def hierarchy_hook(config: Any) -> None:
    """The row's ``configure`` hook: turn the PPO config into the hierarchy's
    (``HierarchicalPPOConfig.to_hierarchy``; a method call, so no import here)."""
    config.to_hierarchy()
