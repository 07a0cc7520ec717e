"""Frozen sub-agents of the hierarchy, built from a spec string.

A spec is a heuristic name (``power_aware``, the power specialist; ``sjf`` or
``round_robin``, SLA-leaning ones), optionally with constructor settings
(``power_aware:spare_floor=3,lead_ticks=6``: more headroom, an SLA-leaning
consolidator), or the path of a checkpoint written by
``cloudrl train`` (e.g. a BDQ or masked PPO trained with a high energy or a high
violation weight), run greedily with its mask applied again after the module.
"""

from __future__ import annotations

from typing import Any

from cloudrl.algorithms.hierarchical.hparams import check_spec as check_heuristic_or_path
from cloudrl.algorithms.hierarchical.hparams import heuristic_spec
from cloudrl.policy import Interface


def check_spec(spec: str) -> str:
    """``spec`` if it names a heuristic or a checkpoint directory, else a ValueError."""
    from cloudrl.checkpoint_policy import is_checkpoint

    return check_heuristic_or_path(spec, is_checkpoint)


def make_sub_agent(spec: str, interface: Interface) -> Any:
    """The policy of ``spec`` acting on ``interface`` (``act(obs)``, ``reset()``, ``name``)."""
    from cloudrl.checkpoint_policy import CheckpointPolicy, is_checkpoint
    from cloudrl.heuristics import make_heuristic

    parsed = heuristic_spec(spec)
    if parsed is not None:
        policy = make_heuristic(parsed[0], interface, **parsed[1])
        policy.name = spec
        return policy
    if is_checkpoint(spec):
        policy = CheckpointPolicy(spec, mode="greedy")
        if policy.interface != interface:
            raise ValueError(f"sub-agent {spec} acts on the {policy.interface} interface, "
                             f"the hierarchy on {interface}")
        return policy
    check_spec(spec)  # raises, naming the valid specs
    raise AssertionError("unreachable")
