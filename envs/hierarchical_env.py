"""A supervisor over sub-agents on one cluster env, as an RLlib ``MultiAgentEnv``.

Every ``k`` ticks the agent ``"supervisor"`` observes the macro state of the
cluster (the ``macro`` vector of the observation: per-tier load and power
states, queue pressure, arrival rate, power draw, recent violation rate, time
of day and, when the env config has ``signals``, the signal columns at its end, so
the supervisor's observation space is the cluster env's ``macro`` space) and picks one
of ``m`` sub-agents (``Discrete(m)``). The chosen
sub-agent then acts on every tick until control returns to the supervisor,
after ``k`` ticks or at the end of the episode, whichever comes first.

Sub-agents come in two kinds, set per entry of ``config["sub_agents"]``:

* **embedded** (frozen, driven by the env): an object with ``act(obs)`` and
  ``reset()`` (a heuristic, a loaded checkpoint). The env runs its ``k`` ticks
  inside one supervisor step; the supervisor is then the only agent that acts
  through RLlib. A string entry is turned into such an object by
  ``config["sub_agent_factory"](spec, interface)`` when a factory is given.
* **external** (an RLlib agent ``"sub_<i>"``, e.g. a learned policy mapped by
  ``policy_mapping_fn`` in a ``MultiRLModule``, frozen or co-trained): a string
  entry without a factory, or one whose index is in ``config["external"]``. It
  receives the cluster observation on each of its ticks and acts through
  ``step({"sub_<i>": action})``.

Only the agent whose turn it is gets an observation, and ``step`` accepts an
action from that agent only (anything else is a ValueError). Rewards go to the
agent that acted: an external sub-agent gets each tick's reward; the
supervisor gets the sum of the rewards of its ``k`` ticks when control
returns (at the episode end, together with the final observation for both).
``reward_scale`` multiplies every reward (learning-side scaling; ``info``
keeps the raw terms). The supervisor's ``info`` holds the sums of the cluster
terms over its ticks (``energy_kwh``, ``violations``, ``finished``,
``dropped``, ``toggles``, ``invalid_action``, and with signals ``energy_usd``,
``carbon_kg``, ``r_signal``), the sub-agent that acted and the tick at which it took
over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from envs.env_config import EnvConfig

SUPERVISOR = "supervisor"
SUMMED_INFO = ("energy_kwh", "violations", "finished", "dropped", "toggles", "invalid_action")
SIGNAL_INFO = ("energy_usd", "carbon_kg", "r_signal")  # summed too when the env has signals


def sub_agent_id(index: int) -> str:
    return f"sub_{index}"


class HierarchicalClusterEnv(MultiAgentEnv):
    """Supervisor + sub-agents over a flat or branching cluster env (see module docstring).

    ``config`` keys: ``env`` (the cluster env config, an ``EnvConfig`` or its mapping),
    ``interface`` (``"flat"`` or ``"branching"``), ``k`` (ticks per supervisor decision,
    default 10), ``sub_agents`` (list, one entry per sub-agent, at least one),
    ``sub_agent_factory`` (optional callable ``(spec, interface) -> policy``),
    ``external`` (indices of string entries left to RLlib even with a factory),
    ``reward_scale`` (default 1).
    """

    def __init__(self, config: Mapping[str, Any] | None = None,
                 sub_agents: Sequence[Any] | None = None) -> None:
        super().__init__()
        cfg = dict(config or {})
        self.k = int(cfg.get("k", 10))
        if self.k < 1:
            raise ValueError(f"k must be >= 1 tick, got {self.k}")
        self.interface = cfg.get("interface", "flat")
        if self.interface not in ("flat", "branching"):
            raise ValueError(f"interface must be 'flat' or 'branching', got {self.interface!r}")
        env_cls = ClusterSchedulingEnv if self.interface == "flat" else ClusterBranchingEnv
        self.base = env_cls(EnvConfig.coerce(cfg.get("env")))
        self.reward_scale = float(cfg.get("reward_scale", 1.0))
        specs = list(sub_agents if sub_agents is not None else cfg.get("sub_agents") or [])
        if not specs:
            raise ValueError("sub_agents: give at least one sub-agent")
        factory: Callable[[Any, str], Any] | None = cfg.get("sub_agent_factory")
        external_ids = {int(i) for i in cfg.get("external") or ()}
        self.sub_agents: list[Any | None] = []  # the policy object, or None: external
        for i, spec in enumerate(specs):
            if isinstance(spec, str):
                embed = factory is not None and i not in external_ids
                self.sub_agents.append(factory(spec, self.interface) if embed else None)
            elif callable(getattr(spec, "act", None)):
                self.sub_agents.append(spec)
            else:
                raise ValueError(f"sub_agents: {spec!r} is neither a name nor a policy "
                                 "with act(obs)")
        self.m = len(self.sub_agents)
        external = [sub_agent_id(i) for i, p in enumerate(self.sub_agents) if p is None]
        self.agents = self.possible_agents = [SUPERVISOR, *external]
        # the base env's macro row, signal columns included when the env config has signals
        macro = self.base.observation_space["macro"]
        self._summed = SUMMED_INFO + (SIGNAL_INFO if self.base.n_signal else ())
        self.observation_spaces = {SUPERVISOR: macro,
                                   **{a: self.base.observation_space for a in external}}
        self.action_spaces = {SUPERVISOR: spaces.Discrete(self.m),
                              **{a: self.base.action_space for a in external}}
        self._obs: dict[str, np.ndarray] = {}
        self._active: int | None = None  # sub-agent in control; None: supervisor's turn
        self._ticks_left = 0
        self._acc: dict[str, float] = {}
        self._started_at = 0
        self._tick = 0

    @property
    def turn(self) -> str:
        """The agent whose action the next :meth:`step` expects."""
        return SUPERVISOR if self._active is None else sub_agent_id(self._active)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.base.reset(seed=seed, options=options)
        for policy in self.sub_agents:
            if policy is not None:
                policy.reset()
        self._obs, self._active, self._tick = obs, None, 0
        self._acted: set[int] = set()
        return {SUPERVISOR: obs["macro"]}, {SUPERVISOR: info}

    def step(self, action_dict: Mapping[str, Any]):
        turn = self.turn
        if set(action_dict) != {turn}:
            raise ValueError(f"it is {turn}'s turn; step got actions for {sorted(action_dict)}")
        if self._active is None:
            return self._take_over(action_dict[SUPERVISOR])
        return self._sub_tick(action_dict[turn])

    def _take_over(self, choice: Any) -> tuple:
        i = int(np.asarray(choice).reshape(()))
        if not 0 <= i < self.m:
            raise ValueError(f"supervisor action {i} outside Discrete({self.m})")
        self._active, self._ticks_left, self._started_at = i, self.k, self._tick
        self._acc = {"reward": 0.0, **dict.fromkeys(self._summed, 0.0)}
        policy = self.sub_agents[i]
        if policy is None:
            agent = sub_agent_id(i)
            return {agent: self._obs}, {}, _flags(False), _flags(False), {}
        while True:
            reward, done = self._tick_once(policy.act(self._obs))
            if done or self._ticks_left == 0:
                return self._hand_back(done, {})

    def _sub_tick(self, action: Any) -> tuple:
        reward, done = self._tick_once(action)
        agent = sub_agent_id(self._active)
        rewards = {agent: reward * self.reward_scale}
        if done or self._ticks_left == 0:
            return self._hand_back(done, rewards)
        return {agent: self._obs}, rewards, _flags(False), _flags(False), {}

    def _tick_once(self, action: Any) -> tuple[float, bool]:
        obs, reward, terminated, truncated, info = self.base.step(action)
        self._obs = obs
        self._tick += 1
        self._ticks_left -= 1
        self._acc["reward"] += reward
        for key in self._summed:
            self._acc[key] += float(info[key])
        return reward, bool(terminated or truncated)

    def _hand_back(self, done: bool, rewards: dict[str, float]) -> tuple:
        i = self._active
        acc = dict(self._acc)
        rewards = {**rewards, SUPERVISOR: acc.pop("reward") * self.reward_scale}
        info = {**acc, "sub_agent": i, "started_at": self._started_at,
                "ticks": self._tick - self._started_at}
        obs = {SUPERVISOR: self._obs["macro"]}
        if self.sub_agents[i] is None:
            self._acted.add(i)
        if done:  # every external sub-agent that acted gets the final observation
            obs.update({sub_agent_id(j): self._obs for j in sorted(self._acted)})
        self._active = None
        return obs, rewards, _flags(False), _flags(done), {SUPERVISOR: info}

    @property
    def cluster_obs(self) -> dict[str, np.ndarray]:
        """The latest observation of the cluster env (what a sub-agent acts on)."""
        return self._obs


def _flags(value: bool) -> dict[str, bool]:
    return {"__all__": value}
