"""The RLlib side of the hierarchy: PPO on the supervisor in a ``MultiRLModule``.

``HierarchicalPPOConfig`` is a ``PPOConfig`` (algorithm class ``PPO``) whose
``training(...)`` also takes the hierarchy (``sub_agents``, ``k``,
``supervisor_hidden``). :meth:`HierarchicalPPOConfig.to_hierarchy` (run by the
row's configure hook after ``cloudrl.training.build_algo_config``) moves the
cluster env config under ``envs.hierarchical_env.HierarchicalClusterEnv``
(``cloudrl/Hierarchical-v0``) with the frozen sub-agents embedded in it, maps
agent ids to modules with ``policy_mapping_fn`` in one ``MultiRLModuleSpec``
(the supervisor: ``models.hierarchical.SupervisorPPOTorchRLModule``; its model
config records the sub-agents, ``k`` and the interface for the checkpoint), trains
the supervisor, and logs the cluster totals and the decision share of each
sub-agent (``HierarchyMetricsCallback``). The interface is the wrapped env's (flat
for ``hierarchical``, branching for ``hierarchical_branching``).

Checkpoint sub-agents are frozen inside the env by default. With
``embed_sub_agents=False`` or ``co_train=True`` each (masked PPO) checkpoint
sub-agent ``i`` is an RLlib agent ``sub_<i>`` with its own module (loaded from the
checkpoint) in the ``MultiRLModule``; ``policies_to_train`` holds it only under
``co_train`` (heuristic sub-agents stay embedded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModule, RLModuleSpec

from cloudrl.algorithms.hierarchical.hparams import checkpoint_meta
from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
from cloudrl.callbacks import WINDOW, episode_totals
from envs.hierarchical_env import SUPERVISOR, sub_agent_id
from envs.registration import BRANCHING_ID, HIERARCHICAL_ID
from models.hierarchical import SupervisorPPOTorchRLModule


def agent_to_module(agent_id: str, episode: Any = None, **kwargs: Any) -> str:
    """``policy_mapping_fn``: each agent (supervisor, external ``sub_<i>``) has its module."""
    return agent_id


class HierarchicalPPOConfig(PPOConfig):
    """``PPOConfig`` plus the hierarchy's settings; see the module docstring."""

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class)
        self.sub_agents: list[str] = ["power_aware", "sjf"]
        self.k = 10
        self.supervisor_hidden = 64
        self.co_train = False
        self.embed_sub_agents = True
        self.hierarchy_interface = "flat"

    def training(self, *, sub_agents: Any = NotProvided, k: Any = NotProvided,
                 supervisor_hidden: Any = NotProvided, co_train: Any = NotProvided,
                 embed_sub_agents: Any = NotProvided, **kwargs: Any) -> HierarchicalPPOConfig:
        super().training(**kwargs)
        if co_train is not NotProvided:
            self.co_train = bool(co_train)
        if embed_sub_agents is not NotProvided:
            self.embed_sub_agents = bool(embed_sub_agents)
        if sub_agents is not NotProvided:
            self.sub_agents = list(sub_agents)
        if k is not NotProvided:
            self.k = int(k)
        if supervisor_hidden is not NotProvided:
            self.supervisor_hidden = int(supervisor_hidden)
        return self

    def hierarchy(self) -> dict[str, Any]:
        return {"sub_agents": list(self.sub_agents), "k": self.k,
                "interface": self.hierarchy_interface, "co_train": self.co_train}

    def external_sub_agents(self) -> list[int]:
        """Indices of the sub-agents that act as RLlib agents with their own modules."""
        if self.embed_sub_agents and not self.co_train:
            return []
        return [i for i, spec in enumerate(self.sub_agents) if checkpoint_meta(spec)]

    def to_hierarchy(self) -> HierarchicalPPOConfig:
        """Wrap the configured cluster env in the hierarchy (idempotent)."""
        if self.env == HIERARCHICAL_ID:
            return self
        self.hierarchy_interface = "branching" if self.env == BRANCHING_ID else "flat"
        cluster = dict(self.env_config)
        scale = float(cluster.pop("reward_scale", None) or 1.0)
        external = self.external_sub_agents()
        self.environment(HIERARCHICAL_ID)
        self.env_config = {**self.hierarchy(), "env": cluster, "reward_scale": scale,
                           "sub_agent_factory": make_sub_agent, "external": external}
        subs = {sub_agent_id(i): sub_agent_module_spec(self.sub_agents[i]) for i in external}
        self.multi_agent(policies={SUPERVISOR, *subs}, policy_mapping_fn=agent_to_module,
                         policies_to_train=[SUPERVISOR, *(subs if self.co_train else [])])
        supervisor = RLModuleSpec(module_class=SupervisorPPOTorchRLModule, model_config={
            "hidden": self.supervisor_hidden, "hierarchy": self.hierarchy()})
        self.rl_module(rl_module_spec=MultiRLModuleSpec(
            rl_module_specs={SUPERVISOR: supervisor, **subs}))
        self.callbacks(HierarchyMetricsCallback)
        return self


def sub_agent_module_spec(checkpoint: str) -> RLModuleSpec:
    """The RLModuleSpec of a checkpoint sub-agent's module, its weights loaded from it."""
    from cloudrl.algorithms.specs import spec_of
    from cloudrl.checkpoint_policy import MODULE_SUBDIR, read_meta

    meta = read_meta(checkpoint)
    path = Path(checkpoint) / MODULE_SUBDIR
    module = RLModule.from_checkpoint(str(path))
    return RLModuleSpec(module_class=spec_of(meta["algo"]).module(),
                        model_config=dict(module.model_config),
                        load_state_path=str(path))


class HierarchyMetricsCallback(RLlibCallback):
    """Cluster totals (as ``ClusterMetricsCallback``) and each sub-agent's decision share."""

    def on_episode_end(self, *, episode, prev_episode_chunks=None, metrics_logger=None,
                       **kwargs) -> None:
        if metrics_logger is None:
            return
        chunks = [c.agent_episodes[SUPERVISOR] for c in
                  [*(prev_episode_chunks or []), episode] if SUPERVISOR in c.agent_episodes]
        totals = episode_totals(chunks)
        ended = totals["finished"] + totals["dropped"]
        values = {"energy_kwh": totals["energy_kwh"],
                  "sla_violation_rate": totals["violations"] / ended if ended else 0.0,
                  "toggles": totals["toggles"], "invalid_actions": totals["invalid_action"]}
        for key, value in values.items():
            metrics_logger.log_value(("cluster", key), value, reduce="mean", window=WINDOW)
        picks = [info["sub_agent"] for c in chunks for info in c.get_infos()
                 if info and "sub_agent" in info]
        if picks:
            space = getattr(chunks[-1], "action_space", None)
            m = max(max(picks) + 1, int(getattr(space, "n", 0)))
            for i in range(m):
                metrics_logger.log_value(("hierarchy", f"share_sub_{i}"),
                                         picks.count(i) / len(picks), reduce="mean",
                                         window=WINDOW)
