"""Frozen sub-agents of the hierarchy, built from a spec string.

A spec is a heuristic name (``power_aware``, the power specialist; ``sjf`` or
``round_robin``, SLA-leaning ones) or the path of a checkpoint written by
``cloudrl train`` (e.g. a BDQ or masked PPO trained with a high energy or a high
violation weight), run greedily with its mask applied again after the module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloudrl.policy import Interface


def check_spec(spec: str) -> str:
    """``spec`` if it names a heuristic or a checkpoint directory, else a ValueError."""
    from cloudrl.checkpoint_policy import is_checkpoint
    from cloudrl.heuristics import HEURISTICS

    if spec in HEURISTICS or is_checkpoint(spec):
        return spec if spec in HEURISTICS else str(Path(spec).resolve())
    raise ValueError(f"sub-agent {spec!r} is neither a heuristic ({', '.join(sorted(HEURISTICS))})"
                     " nor a cloudrl checkpoint directory")


def make_sub_agent(spec: str, interface: Interface) -> Any:
    """The policy of ``spec`` acting on ``interface`` (``act(obs)``, ``reset()``, ``name``)."""
    from cloudrl.checkpoint_policy import CheckpointPolicy, is_checkpoint
    from cloudrl.heuristics import HEURISTICS, make_heuristic

    if spec in HEURISTICS:
        return make_heuristic(spec, interface)
    if is_checkpoint(spec):
        policy = CheckpointPolicy(spec, mode="greedy")
        if policy.interface != interface:
            raise ValueError(f"sub-agent {spec} acts on the {policy.interface} interface, "
                             f"the hierarchy on {interface}")
        return policy
    check_spec(spec)  # raises, naming the valid specs
    raise AssertionError("unreachable")
