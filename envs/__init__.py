"""Cluster simulator, workloads and traces, gymnasium envs and their registration.

Importing the package registers the envs' gymnasium ids and their RLlib env names
(the same strings; the RLlib ones once Ray Tune's registry is loaded, see
``envs.registration``).
"""

from envs.registration import (
    BRANCHING_ID,
    FLAT_ID,
    register_gymnasium_envs,
    register_rllib_envs,
    register_rllib_envs_when_loaded,
)

register_gymnasium_envs()
register_rllib_envs_when_loaded()

__all__ = ["BRANCHING_ID", "FLAT_ID", "register_gymnasium_envs", "register_rllib_envs"]
