"""The hierarchical supervisor's typed hyperparameters (``cloudrl train --algo hierarchical``).

PPO's settings for the supervisor, plus the hierarchy itself: ``sub_agents`` (specs:
heuristic names or checkpoint directories, in the order of the supervisor's actions),
``k`` (ticks per supervisor decision), ``supervisor_hidden`` (MLP width) and
``co_train`` / ``embed_sub_agents`` (below). One supervisor step is ``k`` cluster ticks, so
``env_steps`` and the batch sizes count supervisor decisions (100 per 1,000-tick episode
at ``k=10``); with external sub-agents each of their ticks is an env step too. Ray-free.

Sub-agents are embedded in the env and frozen by default. ``embed_sub_agents: false``
makes checkpoint sub-agents RLlib agents (``sub_<i>``) whose modules sit next to the
supervisor's in the one ``MultiRLModule``, frozen unless ``co_train: true`` (which
implies external sub-agents and trains them with the supervisor); only masked PPO
checkpoints (``ppo``) can be modules of the PPO learner.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from cloudrl.algorithms.ppo import PPOHparams

META_FILE = "cloudrl.json"  # as cloudrl.checkpoint_policy (not imported: no cycle via specs)
MODULE_ALGOS = ("ppo",)  # checkpoint algorithms whose modules the PPO learner can train


class HierarchicalHparams(PPOHparams):
    """PPO on the supervisor; sub-agents frozen inside the env."""

    sub_agents: list[str] = Field(default_factory=lambda: ["power_aware", "sjf"],
                                  min_length=1, description="heuristic names or checkpoints")
    k: int = Field(default=10, ge=1, description="ticks per supervisor decision")
    supervisor_hidden: int = Field(default=64, ge=4)
    co_train: bool = Field(default=False, description="train checkpoint sub-agents too")
    embed_sub_agents: bool = Field(default=True, description="run sub-agents inside the env")
    train_batch_size_per_learner: int = Field(default=1000, ge=1)
    num_epochs: int = Field(default=8, ge=1)

    INTERFACE: ClassVar[str] = "flat"  # the row's interface (hierarchical_branching's)

    @field_validator("sub_agents")
    @classmethod
    def _known(cls, specs: list[str]) -> list[str]:
        checked = [check_spec(spec) for spec in specs]
        for spec in checked:
            meta = checkpoint_meta(spec)
            if meta is not None and meta.get("interface") != cls.INTERFACE:
                row = "hierarchical" if meta.get("interface") == "flat" else \
                    "hierarchical_branching"
                raise ValueError(f"sub-agent {spec} acts on the {meta.get('interface')} "
                                 f"interface, this hierarchy on {cls.INTERFACE} (use --algo "
                                 f"{row})")
        return checked

    @model_validator(mode="after")
    def _modules(self) -> HierarchicalHparams:
        if self.co_train or not self.embed_sub_agents:
            for spec in self.sub_agents:
                meta = checkpoint_meta(spec)
                if meta is not None and meta.get("algo") not in MODULE_ALGOS:
                    raise ValueError(f"sub-agent {spec} is a {meta.get('algo')} checkpoint: "
                                     "only masked PPO (ppo) sub-agents can be co-trained or "
                                     "external (co_train, embed_sub_agents)")
        return self

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
    """Whether ``spec`` is a directory holding cloudrl's meta file; False for a path the OS
    refuses (a name over 255 bytes, a NUL byte), which can be no checkpoint."""
    try:
        return (Path(spec) / META_FILE).is_file()
    except (OSError, ValueError):
        return False


def checkpoint_meta(spec: str) -> dict[str, Any] | None:
    """The cloudrl meta of checkpoint ``spec``; None for a heuristic spec."""
    if heuristic_spec(spec) is not None or not _has_meta(spec):
        return None
    return json.loads((Path(spec) / META_FILE).read_text())


class HierarchicalBranchingHparams(HierarchicalHparams):
    """The same hierarchy on the branching interface (e.g. over ``gated_dqn`` or BDQ
    sub-agents); ``cloudrl train --algo hierarchical_branching``."""

    INTERFACE: ClassVar[str] = "branching"


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
