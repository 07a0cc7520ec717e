"""Cluster simulator, workloads and traces, gymnasium envs and their registration."""

from envs.registration import BRANCHING_ID, FLAT_ID, register_gymnasium_envs

register_gymnasium_envs()

__all__ = ["BRANCHING_ID", "FLAT_ID", "register_gymnasium_envs"]
