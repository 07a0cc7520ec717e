"""A served policy version: its env (for observations), its model and the decision format.

A policy spec is one of
* a checkpoint directory written by ``cloudrl train`` (PPO, DQN, BDQ; the interface and
  env come from its ``cloudrl.json``; served greedily);
* ``heuristic:NAME`` (``power_aware``, ``ffd``, ...), on the service's env and interface;
* ``models:/cloudrl-policy@champion`` or ``models:/cloudrl-policy/3``: a registered
  checkpoint (``cloudrl.loop.registry``), loaded from its registered directory;
* ``python:MODULE:FACTORY``: ``FACTORY(env_config, interface)`` returns an object with
  ``name``, ``interface`` and ``act_batch(observations) -> actions`` (or ``act(obs)``),
  the extension point for custom policies.

A spec that cannot be loaded (unknown name, non-callable factory, a factory that fails
or returns no policy, an unreadable checkpoint) raises :class:`PolicySpecError` naming the
problem. ``observe`` turns a request state into the observation through the env's own
path (``observe_snapshot``); ``act_batch`` runs the model on many observations at once
and raises :class:`NonFiniteOutput` when the model's scores are NaN/inf; ``describe``
gives the structured form of an action; ``smoke_observations`` and ``check_actions`` are
what a new version must answer correctly before it is served (see ``serve_apps.shield``).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.algorithms.specs import spec_of
from cloudrl.checkpoint_policy import (
    META_FILE,
    CheckpointPolicy,
    is_checkpoint,
    load_policy,
    read_meta,
)
from cloudrl.heuristics import make_heuristic
from cloudrl.policy import Interface
from cloudrl.serving.schemas import ClusterState, Decision, Placement, PowerCommand
from cloudrl.serving.state import (
    StateError,
    observe_with_signals,
    signal_layout,
    signal_row,
    to_snapshot,
)
from envs.cluster_env import SLEEP_ONE, WAKE_ONE, ClusterBranchingEnv, ClusterSchedulingEnv
from envs.env_config import EnvConfig
from envs.observation import J, S


class NonFiniteOutput(RuntimeError):
    """The model produced NaN or inf scores."""


def non_finite(action: Any) -> bool:
    """True when a numeric action holds NaN or inf."""
    try:
        arr = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return not np.isfinite(arr).all()


class PolicySpecError(ValueError):
    """A policy spec that cannot be loaded; the message says why."""


@dataclass
class _CheckpointModel:
    """A checkpoint's module, batched and greedy."""

    policy: CheckpointPolicy

    @property
    def name(self) -> str:
        return self.policy.name

    def act_batch(self, observations: list[dict[str, np.ndarray]]) -> list[Any]:
        scores = self.policy.scores_batch(observations)
        actions = []
        for row, obs in zip(scores, observations, strict=True):
            finite = np.isfinite(row) if self.policy.interface == "branching" else \
                np.isfinite(row[obs["action_mask"] > 0])
            if not finite.all():
                raise NonFiniteOutput(f"{self.name}: non-finite scores")
            actions.append(self.policy.greedy_action(row, obs))
        return actions


@dataclass
class _SequentialModel:
    """A policy with only ``act(obs)`` (heuristics), applied row by row."""

    policy: Any

    @property
    def name(self) -> str:
        return str(getattr(self.policy, "name", type(self.policy).__name__))

    def act_batch(self, observations: list[dict[str, np.ndarray]]) -> list[Any]:
        out = []
        reset = getattr(self.policy, "reset", None)
        for obs in observations:
            if callable(reset):
                reset()
            out.append(self.policy.act(obs))
        return out


def _heuristic_model(name: str, interface: Interface) -> _SequentialModel:
    try:
        return _SequentialModel(make_heuristic(name, interface))
    except ValueError as e:
        raise PolicySpecError(str(e)) from None


def _python_model(target: str, env_config: EnvConfig, interface: Interface) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise PolicySpecError(f"python:{target}: cannot import ({e})") from None
    if not callable(factory):
        raise PolicySpecError(f"python:{target} is a {type(factory).__name__}, not callable: "
                              "give a factory FACTORY(env_config, interface)")
    try:
        model = factory(env_config, interface)
    except Exception as e:  # noqa: BLE001 - any failure of user code is a bad spec
        raise PolicySpecError(f"python:{target}(env_config, interface) failed: "
                              f"{type(e).__name__}: {e}") from None
    if callable(getattr(model, "act_batch", None)):
        return model
    if callable(getattr(model, "act", None)):
        return _SequentialModel(model)
    raise PolicySpecError(f"python:{target} returned a {type(model).__name__}, which has "
                          "neither act_batch(observations) nor act(obs)")


@dataclass
class _HierarchicalModel:
    """A hierarchical checkpoint: per state the supervisor picks a sub-agent, which acts
    (a served state has no history, so every state is a supervisor decision); also says
    which sub-agent decided (``act_batch_explained``)."""

    policy: Any

    @property
    def name(self) -> str:
        return self.policy.name

    def act_batch_explained(self, observations: list[dict[str, np.ndarray]]
                            ) -> tuple[list[Any], list[str]]:
        actions, deciders = [], []
        for obs in observations:
            self.policy.reset()
            actions.append(self.policy.act(obs))
            deciders.append(self.policy.decided_by)
        return actions, deciders

    def act_batch(self, observations: list[dict[str, np.ndarray]]) -> list[Any]:
        return self.act_batch_explained(observations)[0]


def _checkpoint_model(spec: str) -> tuple[Any, EnvConfig, Interface]:
    try:
        if spec_of(read_meta(spec)["algo"]).policy_loader is not None:
            policy = load_policy(spec, mode="greedy")
            return _HierarchicalModel(policy), policy.env_config, policy.interface
        checkpoint = CheckpointPolicy(spec, mode="greedy")
    except json.JSONDecodeError as e:
        raise PolicySpecError(f"checkpoint {spec}: {META_FILE} is not valid JSON ({e}); "
                              "empty or truncated?") from None
    except Exception as e:  # noqa: BLE001 - a broken checkpoint is a bad spec, not a 500
        raise PolicySpecError(f"checkpoint {spec}: cannot load ({type(e).__name__}: "
                              f"{e})") from None
    return _CheckpointModel(checkpoint), checkpoint.env_config, checkpoint.interface


def _registry_path(spec: str) -> str:
    """A registry URI's local checkpoint directory (``cloudrl.loop.registry.resolve``; the
    tracking URI is ``$MLFLOW_TRACKING_URI`` or ``./mlflow.db``), any other spec unchanged."""
    from cloudrl.loop.registry import RegistryError, is_registry_uri, resolve

    if not is_registry_uri(spec):
        return spec
    try:
        return str(resolve(spec))
    except RegistryError as e:
        raise PolicySpecError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - an unreachable store is a bad spec, not a 500
        raise PolicySpecError(f"{spec}: registry lookup failed ({type(e).__name__}: "
                              f"{e})") from None


def _exists(path: str) -> bool:
    """``Path.exists`` that says False for a path the OS refuses to look at (a name too
    long, a NUL byte) instead of raising."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def _short(spec: str, limit: int = 120) -> str:
    """``spec`` cut to ``limit`` characters for an error line."""
    return spec if len(spec) <= limit else f"{spec[:limit]}... ({len(spec)} characters)"


class ServedPolicy:
    """One policy version: spec, model, env and decision formatting."""

    def __init__(self, spec: str, version: str, env_config: EnvConfig,
                 interface: Interface) -> None:
        self.spec, self.version = spec, version
        self.path = _registry_path(spec)  # models:/NAME@ALIAS or /VERSION -> its directory
        if spec.startswith("heuristic:"):
            self.model = _heuristic_model(spec.split(":", 1)[1], interface)
        elif spec.startswith("python:"):
            self.model = _python_model(spec.split(":", 1)[1], env_config, interface)
        elif is_checkpoint(self.path):
            self.model, env_config, interface = _checkpoint_model(self.path)
        elif _exists(self.path):
            raise PolicySpecError(f"{_short(spec)} is not a cloudrl checkpoint (no "
                                  "cloudrl.json)")
        else:
            raise PolicySpecError(f"policy {_short(spec)!r}: not a checkpoint directory, "
                                  "models:/NAME@ALIAS, heuristic:NAME or "
                                  "python:MODULE:FACTORY")
        self.interface: Interface = interface
        self.env_config = env_config
        env_cls = ClusterSchedulingEnv if interface == "flat" else ClusterBranchingEnv
        self.env = env_cls(env_config)
        self.fleet = self.env.sim.fleet
        self.signals = signal_layout(self.env)  # None: the policy observes no signals
        self.fallback = _heuristic_model("power_aware", interface)
        self.probe_obs, _ = self.env.reset(seed=0)

    @property
    def name(self) -> str:
        return str(getattr(self.model, "name", self.spec))

    def smoke_observations(self) -> list[dict[str, np.ndarray]]:
        """A few early-horizon observations of the policy's env (seeds 0-2, a few ticks in)."""
        out = [self.probe_obs]
        for seed in (1, 2):
            obs, _ = self.env.reset(seed=seed)
            for _ in range(3 * seed):
                obs, *_ = self.env.step(self.fallback.act_batch([obs])[0])
            out.append(obs)
        return out

    def check_actions(self, actions: Any, observations: list[dict[str, np.ndarray]]
                      ) -> str | None:
        """Why ``actions`` are not a valid answer to ``observations``, or None."""
        if not isinstance(actions, (list, tuple)) or len(actions) != len(observations):
            return f"expected a list of {len(observations)} actions, got {actions!r:.80}"
        for i, (action, obs) in enumerate(zip(actions, observations, strict=True)):
            if non_finite(action):
                return f"non-finite action {action!r:.80} for state {i}"
            if not self.is_feasible(action, obs):
                return f"infeasible (masked or out-of-space) action {action!r:.80} for state {i}"
        return None

    def fleet_signature(self) -> tuple[Any, ...]:
        """What a request must match: tier layout, queue capacity, priority levels and the
        signals (none, or their columns and forecast length)."""
        sim = self.env_config.sim
        signals = None if self.signals is None else (self.signals.columns,
                                                     self.signals.horizon_ticks)
        return (tuple(self.fleet.tier.tolist()), self.fleet.tier_names,
                sim.queue_capacity, sim.priority_levels, signals)

    def observe(self, state: ClusterState) -> dict[str, np.ndarray]:
        """The env's observation of ``state`` (raises StateError naming a bad field).

        A state that passed validation but still gives a non-finite observation is the
        caller's (422), so it never reaches the model or counts on its breaker. A policy
        with signals observes the request's ``signals`` (``cloudrl.serving.state.signal_row``)."""
        snapshot = to_snapshot(state, self.fleet, self.env_config.sim)
        row = signal_row(state.signals, self.signals, snapshot.tick)
        try:
            if row is None:
                obs = self.env.observe_snapshot(snapshot)
            else:
                obs = observe_with_signals(self.env, snapshot, row)
        except ValueError as e:
            raise StateError("body", str(e)) from None
        for key, value in obs.items():
            if not np.isfinite(value).all():
                raise StateError("body", f"the state gives a non-finite observation "
                                 f"({key}); a value is outside its documented range")
        return obs

    def is_feasible(self, action: Any, obs: dict[str, np.ndarray]) -> bool:
        """True when ``action`` is in the interface's space and allowed by the mask."""
        mask = obs["action_mask"] > 0
        try:
            arr = np.asarray(action)
            if arr.dtype.kind not in "iu":
                return False
            if self.interface == "flat":
                return arr.size == 1 and 0 <= int(arr) < mask.size and bool(mask[int(arr)])
            sizes = self.env.branch_sizes
            if arr.shape != (len(sizes),):
                return False
            offset = 0
            for d, size in enumerate(sizes):
                if not (0 <= arr[d] < size and mask[offset + arr[d]]):
                    return False
                offset += size
            return True
        except (TypeError, ValueError):
            return False

    def describe(self, action: Any, obs: dict[str, np.ndarray]) -> Decision:
        """The structured form of a feasible action, in request indices."""
        n, k = self.fleet.n_servers, self.env.queue_window
        if self.interface == "flat":
            a = int(np.asarray(action))
            if a < k * n:
                return Decision(raw=a, placements=[Placement(job=a // n, server=a % n)], power=[])
            if a < k * n + n:
                server = a - k * n  # the mask allows sleeping active servers, waking asleep
                command = "sleep" if obs["servers"][server, S["is_active"]] > 0 else "wake"
                return Decision(raw=a, placements=[],
                                power=[PowerCommand(server=server, command=command)])
            return Decision(raw=a, placements=[], power=[], wait=True)
        raw = [int(x) for x in np.asarray(action)]
        n_jobs = int((obs["jobs"][:, J["present"]] > 0).sum())
        placements = [Placement(job=slot, server=raw[slot]) for slot in range(min(k, n_jobs))
                      if raw[slot] < n]
        names = {SLEEP_ONE: "sleep_one", WAKE_ONE: "wake_one"}
        power = [PowerCommand(tier=self.fleet.tier_names[t], command=names.get(d, "hold"))
                 for t, d in enumerate(raw[k:k + self.fleet.n_tiers])]
        return Decision(raw=raw, placements=placements, power=power, priority_level=raw[-1])


__all__ = ["NonFiniteOutput", "PolicySpecError", "ServedPolicy", "non_finite"]
