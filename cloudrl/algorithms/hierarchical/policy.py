"""The hierarchy as one cloudrl ``Policy`` on the cluster env (evaluation and serving).

Every ``k`` ticks (starting at tick 0) the supervisor picks a sub-agent from the
observation's ``macro`` vector; the sub-agent acts on this tick and the next
``k - 1``. The same schedule as ``envs.hierarchical_env.HierarchicalClusterEnv``, so
an episode of this policy is the env's episode under the same supervisor decisions.
``decided_by`` names the sub-agent behind the latest action; ``decisions`` lists
``(tick, sub-agent index)`` of the episode's supervisor decisions.

A checkpoint of ``cloudrl train --algo hierarchical`` loads with
:meth:`HierarchicalPolicy.from_checkpoint`: the supervisor module
(``learner_group/learner/rl_module/supervisor``) and, from its model config, the
sub-agent specs, ``k`` and the interface; a sub-agent that was an RLlib agent of the
hierarchy (``rl_module/sub_<i>``, co-trained or frozen) acts with that saved module.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.algorithms.hierarchical.sub_agents import make_sub_agent
from cloudrl.algorithms.hierarchical.supervisors import ModuleSupervisor
from cloudrl.checkpoint_policy import CheckpointPolicy, read_meta
from cloudrl.policy import Interface
from envs.env_config import EnvConfig
from envs.hierarchical_env import SUPERVISOR, sub_agent_id

SUPERVISOR_SUBDIR = Path("learner_group") / "learner" / "rl_module" / SUPERVISOR


class HierarchicalPolicy:
    """Supervisor + sub-agents; ``act`` returns the active sub-agent's action."""

    def __init__(self, supervisor: Any, sub_agents: Sequence[Any], k: int,
                 interface: Interface = "flat", name: str = "hierarchical",
                 sub_agent_names: Sequence[str] | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.supervisor, self.sub_agents, self.k = supervisor, list(sub_agents), k
        self.interface, self.name = interface, name
        self.sub_agent_names = list(sub_agent_names or
                                    [getattr(p, "name", str(i)) for i, p in
                                     enumerate(self.sub_agents)])
        self.env_config: EnvConfig | None = None
        self.path: Path | None = None
        self.reset()

    def reset(self) -> None:
        self._tick, self.active = 0, 0
        self.decisions: list[tuple[int, int]] = []
        for policy in self.sub_agents:
            policy.reset()
        if hasattr(self.supervisor, "reset"):
            self.supervisor.reset()

    def choose(self, obs: dict[str, np.ndarray]) -> int:
        """The supervisor's pick for ``obs`` (an index into the sub-agents)."""
        i = int(self.supervisor.choose(np.asarray(obs["macro"], dtype=np.float32)))
        if not 0 <= i < len(self.sub_agents):
            raise ValueError(f"supervisor picked sub-agent {i} of {len(self.sub_agents)}")
        return i

    def act(self, obs: dict[str, np.ndarray]) -> int | np.ndarray:
        if self._tick % self.k == 0:
            self.active = self.choose(obs)
            self.decisions.append((self._tick, self.active))
        self._tick += 1
        return self.sub_agents[self.active].act(obs)

    @property
    def decided_by(self) -> str:
        """Name of the sub-agent behind the latest action."""
        return self.sub_agent_names[self.active]

    def check_env(self, env_cfg: EnvConfig) -> None:
        """Refuse an env whose spaces differ from the one the supervisor was trained on."""
        if self.env_config is not None:
            CheckpointPolicy.check_env(self, env_cfg)  # type: ignore[arg-type]
        for policy in self.sub_agents:
            if hasattr(policy, "check_env"):
                policy.check_env(env_cfg)

    @classmethod
    def from_checkpoint(cls, path: str | Path, mode: str = "greedy",
                        sample_seed: int = 0) -> HierarchicalPolicy:
        """The trained hierarchy in ``path`` (``mode``: the supervisor's, greedy or sample)."""
        from ray.rllib.core.rl_module.rl_module import RLModule

        path = Path(path).resolve()
        meta = read_meta(path)
        module = RLModule.from_checkpoint(str(path / SUPERVISOR_SUBDIR))
        module.eval()
        hierarchy = dict(module.model_config)["hierarchy"]
        interface = hierarchy.get("interface", meta["interface"])
        specs = list(hierarchy["sub_agents"])
        subs = []
        for i, spec in enumerate(specs):
            sub = make_sub_agent(spec, interface)
            saved = path / SUPERVISOR_SUBDIR.parent / sub_agent_id(i)
            if saved.is_dir():  # its module as trained (or kept frozen) in the hierarchy
                sub.module = RLModule.from_checkpoint(str(saved))
                sub.module.eval()
            subs.append(sub)
        policy = cls(ModuleSupervisor(module, greedy=mode != "sample", seed=sample_seed),
                     subs, int(hierarchy["k"]),
                     interface, name=f"hierarchical:{path.name}",
                     sub_agent_names=[Path(s).name for s in specs])
        policy.env_config = EnvConfig.model_validate(meta["env"])
        policy.path = path
        return policy
