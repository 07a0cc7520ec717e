"""Registers the cluster envs as gymnasium ids and as RLlib env names (same strings).

``import envs`` does both: the gymnasium ids at once, the RLlib names as soon as
``ray.tune.registry`` (RLlib's env registry) is loaded, at once if it already is.
Deferring keeps ``import envs`` free of Ray (Tune alone takes seconds to import,
and the simulator, the heuristics and the CLI's evaluate do not need it), while
stock RLlib code such as ``PPOConfig().environment("cloudrl/ClusterScheduling-v0",
env_config={...})`` finds the names: RLlib imports the registry before it looks
them up. Without the RLlib names, RLlib would fall back to
``gym.make(id, **env_config)``, which the envs do not accept.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

import gymnasium as gym

FLAT_ID = "cloudrl/ClusterScheduling-v0"
BRANCHING_ID = "cloudrl/ClusterBranching-v0"
GATED_ID = "cloudrl/GatedController-v0"  # Discrete choice of a controller setting
HIERARCHICAL_ID = "cloudrl/Hierarchical-v0"  # RLlib only: envs.hierarchical_env (multi-agent)
SCENARIO_ID = "cloudrl/Scenario-v0"  # a named scenario, branching controls (envs.scenario.env)
SCENARIO_FLAT_ID = "cloudrl/ScenarioFlat-v0"  # the same, one Discrete action
_ENTRY_POINTS = {
    SCENARIO_ID: "envs.scenario.env:ScenarioEnv",
    SCENARIO_FLAT_ID: "envs.scenario.env:ScenarioFlatEnv",
    FLAT_ID: "envs.cluster_env:ClusterSchedulingEnv",
    BRANCHING_ID: "envs.cluster_env:ClusterBranchingEnv",
    GATED_ID: "envs.gated_env:GatedControllerEnv",
}
# natively batched envs (envs.vector_env): gym.make_vec's default for these ids
_VECTOR_ENTRY_POINTS = {
    FLAT_ID: "envs.vector_env:ClusterSchedulingVectorEnv",
    BRANCHING_ID: "envs.vector_env:ClusterBranchingVectorEnv",
}


def register_gymnasium_envs() -> None:
    """``gym.make("cloudrl/ClusterScheduling-v0", config={...})`` after this (idempotent)."""
    for env_id, entry_point in _ENTRY_POINTS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point,
                         vector_entry_point=_VECTOR_ENTRY_POINTS.get(env_id),
                         disable_env_checker=True)


class _ScaledReward(gym.RewardWrapper):
    """Multiplies rewards by a constant (learning-side scaling; ``info`` keeps raw terms)."""

    def __init__(self, env: gym.Env, scale: float) -> None:
        super().__init__(env)
        self.scale = scale

    def reward(self, reward: float) -> float:
        return reward * self.scale


class _ScaledVectorReward(gym.vector.VectorRewardWrapper):
    """:class:`_ScaledReward` of a vector env."""

    def __init__(self, env: gym.vector.VectorEnv, scale: float) -> None:
        super().__init__(env)
        self.scale = scale

    def rewards(self, rewards):
        return rewards * self.scale


def make_rllib_env(env_cls: type[gym.Env], env_config: Mapping[str, Any]
                   ) -> gym.Env | gym.vector.VectorEnv:
    """An env from an RLlib ``EnvContext``; an optional ``reward_scale`` key wraps it.

    With a ``num_envs`` key (RLlib's ``gym_env_vectorize_mode="vector_entry_point"``
    passes it) the result is a vector env: the batched one of ``envs.vector_env``
    for the two cluster interfaces, else a ``SyncVectorEnv`` of ``env_cls``."""
    cfg = dict(env_config)
    scale = cfg.pop("reward_scale", None)
    num_envs = cfg.pop("num_envs", None)
    if num_envs is None:
        env = env_cls(cfg)
        return _ScaledReward(env, float(scale)) if scale not in (None, 1.0) else env
    from envs import vector_env

    vec_cls = vector_env.VECTOR_OF.get(env_cls)
    vec = vec_cls(int(num_envs), cfg) if vec_cls is not None else \
        gym.vector.SyncVectorEnv([lambda: env_cls(cfg) for _ in range(int(num_envs))])
    return _ScaledVectorReward(vec, float(scale)) if scale not in (None, 1.0) else vec


def register_rllib_envs() -> None:
    """``AlgorithmConfig().environment("cloudrl/ClusterScheduling-v0", env_config=...)``."""
    from ray.tune.registry import register_env

    from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
    from envs.gated_env import GatedControllerEnv

    register_env(FLAT_ID, lambda ctx: make_rllib_env(ClusterSchedulingEnv, ctx))
    register_env(BRANCHING_ID, lambda ctx: make_rllib_env(ClusterBranchingEnv, ctx))
    register_env(GATED_ID, lambda ctx: make_rllib_env(GatedControllerEnv, ctx))
    register_env(HIERARCHICAL_ID, _hierarchical_env)
    register_env(SCENARIO_ID, _scenario_env)
    register_env(SCENARIO_FLAT_ID, _scenario_flat_env)


def _scenario_env(env_config: Mapping[str, Any]) -> Any:
    from envs.scenario.env import ScenarioEnv

    return ScenarioEnv(dict(env_config))


def _scenario_flat_env(env_config: Mapping[str, Any]) -> Any:
    from envs.scenario.env import ScenarioFlatEnv

    return ScenarioFlatEnv(dict(env_config))


def _hierarchical_env(env_config: Mapping[str, Any]) -> Any:
    from envs.hierarchical_env import HierarchicalClusterEnv

    return HierarchicalClusterEnv(env_config)


RLLIB_REGISTRY = "ray.tune.registry"


class _AfterFirstImport:
    """A ``sys.meta_path`` finder that calls ``callback`` once ``name`` has been executed.

    It finds the module's spec with the other finders and wraps that spec's (fresh,
    per-import) loader's ``exec_module``; it removes itself on first use.
    """

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            callback()

        spec.loader.exec_module = exec_then_call  # type: ignore[method-assign]
        return spec


def register_rllib_envs_when_loaded() -> None:
    """Register the RLlib names now if RLlib's registry is loaded, else right after it is."""
    if RLLIB_REGISTRY in sys.modules:
        register_rllib_envs()
    elif not any(isinstance(f, _AfterFirstImport) and f.name == RLLIB_REGISTRY
                 for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterFirstImport(RLLIB_REGISTRY, register_rllib_envs))
