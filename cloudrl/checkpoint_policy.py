"""A trained RLlib checkpoint as a cloudrl Policy (masked, shielded).

Loads only the RLModule (``learner_group/learner/rl_module/default_policy``)
and the ``cloudrl.json`` written next to it by the trainer, which records
the algorithm (a row of ``cloudrl.algorithms.specs.ALGORITHMS``), the interface and
the env config the policy was trained for.
``act`` runs the module on one observation. Q-learners (DQN, BDQ) act
greedily. A PPO, APPO or IMPALA policy is stochastic by construction
(trained by sampling, with an entropy bonus), so by default it samples from
its masked action distribution with a generator reseeded at every ``reset``
(same episode seed, same episode); ``mode="greedy"`` takes the most probable
action instead.
The mask is applied again after the module, so an infeasible action can
never come out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.algorithms.specs import spec_of
from envs.env_config import EnvConfig

MODULE_SUBDIR = Path("learner_group") / "learner" / "rl_module" / "default_policy"
# a multi-agent checkpoint (the hierarchy) keeps its learned module under its agent's id
SUPERVISOR_SUBDIR = Path("learner_group") / "learner" / "rl_module" / "supervisor"
META_FILE = "cloudrl.json"


def is_checkpoint(path: str | Path) -> bool:
    """True when ``path`` is a directory holding a cloudrl checkpoint (its ``cloudrl.json``
    and the RLModule's directory). Any path the OS refuses to look at (a name too long, a
    NUL byte, no permission) is not one: False, never an OSError or ValueError."""
    try:
        p = Path(path)
        return (p / META_FILE).is_file() and ((p / MODULE_SUBDIR).is_dir()
                                              or (p / SUPERVISOR_SUBDIR).is_dir())
    except (OSError, ValueError):  # ENAMETOOLONG, EACCES, "embedded null byte"
        return False


def load_policy(path: str | Path, mode: str = "auto", sample_seed: int = 0) -> Any:
    """The policy of checkpoint ``path``: :class:`CheckpointPolicy`, or the row's
    ``policy_loader`` (``cloudrl.algorithms.specs``) for algorithms that have one."""
    from cloudrl.algorithms.specs import load

    loader = spec_of(read_meta(path)["algo"]).policy_loader
    if loader is None:
        return CheckpointPolicy(path, mode=mode, sample_seed=sample_seed)
    return load(loader).from_checkpoint(path, mode="greedy" if mode == "auto" else mode,
                                        sample_seed=sample_seed)


def read_meta(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not is_checkpoint(p):
        raise ValueError(f"{p} is not a cloudrl checkpoint (expected {META_FILE} and "
                         f"{MODULE_SUBDIR}/ inside)")
    return json.loads((p / META_FILE).read_text())


class CheckpointPolicy:
    """Greedy policy of a trained checkpoint; ``name`` is ``<algo>:<checkpoint dir name>``."""

    def __init__(self, path: str | Path, mode: str = "auto", sample_seed: int = 0) -> None:
        import torch
        from ray.rllib.core.rl_module.rl_module import RLModule

        self.path = Path(path).resolve()
        self.meta = read_meta(self.path)
        self.interface = self.meta["interface"]
        self.env_config = EnvConfig.model_validate(self.meta["env"])
        if mode not in ("auto", "greedy", "sample"):
            raise ValueError(f"mode must be 'auto', 'greedy' or 'sample', got {mode!r}")
        # Actor-critic algorithms' policies sample by default (``mode="auto"``).
        samples_by_default = spec_of(self.meta["algo"]).samples_actions
        self.stochastic = mode == "sample" or (mode == "auto" and samples_by_default)
        self.name = f"{self.meta['algo']}:{self.path.name}"
        self.sample_seed = sample_seed
        self._rng = np.random.default_rng(sample_seed)
        self.module = RLModule.from_checkpoint(str(self.path / MODULE_SUBDIR))
        self.module.eval()
        self._torch = torch
        torch.set_num_threads(1)
        self._gate = _Gate.of(self.module)

    @property
    def gated(self) -> bool:
        """The module picks a preset of a controller (``gated_dqn``), which acts."""
        return self._gate is not None

    def reset(self) -> None:
        """Reseed the sampling generator: evaluation episodes stay seed-exact."""
        self._rng = np.random.default_rng(self.sample_seed)
        if self._gate is not None:
            self._gate.reset()

    def check_env(self, env_cfg: EnvConfig) -> None:
        """Refuse to run on an env whose spaces differ from the one trained on."""
        trained, asked = self.env_config.sim, env_cfg.sim
        for field in ("queue_window", "priority_levels"):
            if getattr(trained, field) != getattr(asked, field):
                raise ValueError(f"checkpoint {self.path.name} was trained with "
                                 f"sim.{field}={getattr(trained, field)}, "
                                 f"env has {getattr(asked, field)}")
        if trained.fleet.n_servers != asked.fleet.n_servers:
            raise ValueError(f"checkpoint {self.path.name} was trained for "
                             f"n_servers={trained.fleet.n_servers}, env has "
                             f"{asked.fleet.n_servers}")
        # the signals add macro columns (solar ones only with solar): their layout must match;
        # other signal settings (price level, source, forecast error) change no space
        from envs.observation import signal_cols

        was, has = self.env_config.signals, env_cfg.signals
        if signal_cols(was) != signal_cols(has):
            raise ValueError(f"checkpoint {self.path.name} was trained with "
                             f"signals={_signals_desc(was)}, env has "
                             f"signals={_signals_desc(has)} (the macro row differs)")

    def scores(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Per-action scores (masked logits or Q-values) for one observation; for BDQ a
        (branches, max branch size) array of per-branch Q-values."""
        return self.scores_batch([obs])[0]

    def scores_batch(self, observations: list[dict[str, np.ndarray]]) -> np.ndarray:
        """:meth:`scores` of many observations in one forward pass (leading batch axis)."""
        torch = self._torch
        if self._gate is not None:
            observations = [self._gate.observation(o) for o in observations]
        batch = {k: torch.from_numpy(np.stack([np.asarray(o[k], dtype=np.float32)
                                               for o in observations]))
                 for k in observations[0]}
        with torch.no_grad():
            if hasattr(self.module, "compute_q_values"):
                out = self.module.compute_q_values({"obs": batch})["qf_preds"]
            else:
                out = self.module.forward_inference({"obs": batch})["action_dist_inputs"]
        return out.numpy()

    def greedy_action(self, scores: np.ndarray, obs: dict[str, np.ndarray]) -> int | np.ndarray:
        """The best feasible action under ``scores`` (one row of :meth:`scores_batch`)."""
        if self._gate is not None:  # one served state: a fresh controller, no history
            return self._gate.served_action(scores, obs)
        mask = obs["action_mask"] > 0
        if self.interface == "flat":
            return int(np.argmax(np.where(mask, scores, -np.inf)))
        return self._act_branching(scores, mask, obs)

    def act(self, obs: dict[str, np.ndarray]) -> int | np.ndarray:
        if self._gate is not None:
            return self._gate.act(obs, self.scores)
        scores = self.scores(obs)
        if self.interface != "flat" or not self.stochastic:
            return self.greedy_action(scores, obs)
        masked = np.where(obs["action_mask"] > 0, scores, -np.inf)
        probs = np.exp(masked - masked.max())
        return int(self._rng.choice(len(probs), p=probs / probs.sum()))

    @staticmethod
    def _act_branching(scores: np.ndarray, mask: np.ndarray,
                       obs: dict[str, np.ndarray]) -> np.ndarray:
        """Per-branch argmax over feasible sub-actions; ``scores`` is (D, max branch size)."""
        from cloudrl.policy import branch_layout

        k, n, t, levels = branch_layout(obs)
        sizes = [n + 1] * k + [3] * t + [levels]
        action = np.empty(len(sizes), dtype=np.int64)
        offset = 0
        for d, size in enumerate(sizes):
            branch_mask = mask[offset:offset + size]
            action[d] = int(np.argmax(np.where(branch_mask, scores[d, :size], -np.inf)))
            offset += size
        return action


class _Gate:
    """A gated checkpoint's controller (``model_config["gate"]``, see ``envs.gated_env``):
    the module's argmax picks the preset every ``decision_every`` ticks, the controller
    turns it into the env action."""

    def __init__(self, gate: dict[str, Any]) -> None:
        from envs.gated_env import resolve_controller

        self.controller = resolve_controller(gate["controller"], gate.get("controller_config"))
        self._served = resolve_controller(gate["controller"], gate.get("controller_config"))
        self.n_choices = int(self.controller.n_choices)
        self.decision_every = int(gate.get("decision_every", 1))
        self.reset()

    @classmethod
    def of(cls, module: Any) -> _Gate | None:
        gate = (getattr(module, "model_config", None) or {}).get("gate")
        return cls(gate) if gate else None

    def reset(self) -> None:
        self.controller.reset()
        self._tick, self.choice = 0, 0

    def observation(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from envs.gated_env import gated_observation

        return gated_observation(obs, self.n_choices)

    def act(self, obs: dict[str, np.ndarray], scores: Any) -> np.ndarray:
        if self._tick % self.decision_every == 0:
            self.choice = int(np.argmax(scores(obs)))
        self._tick += 1
        return self.controller.act(obs, self.choice)

    def served_action(self, scores: np.ndarray, obs: dict[str, np.ndarray]) -> np.ndarray:
        self._served.reset()
        return self._served.act(obs, int(np.argmax(scores)))


def _signals_desc(signals: Any) -> str:
    """``None``, or the signal columns' kind (with or without solar), for :meth:`check_env`."""
    if signals is None:
        return "None"
    from envs.observation import signal_has_solar

    return f"{signals.source} ({'with' if signal_has_solar(signals) else 'no'} solar columns)"
