"""A trained RLlib checkpoint as a cloudrl Policy (greedy, masked, shielded).

Loads only the RLModule (``learner_group/learner/rl_module/default_policy``)
and the ``cloudrl.json`` written next to it by the trainer, which records
the algorithm, the interface and the env config the policy was trained for.
``act`` runs ``forward_inference`` on one observation and takes the best
feasible action; if the module ever proposes an infeasible one (it should
not: the modules mask), the mask wins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from envs.env_config import EnvConfig

MODULE_SUBDIR = Path("learner_group") / "learner" / "rl_module" / "default_policy"
META_FILE = "cloudrl.json"


def is_checkpoint(path: str | Path) -> bool:
    p = Path(path)
    return (p / META_FILE).is_file() and (p / MODULE_SUBDIR).is_dir()


def read_meta(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not is_checkpoint(p):
        raise ValueError(f"{p} is not a cloudrl checkpoint (expected {META_FILE} and "
                         f"{MODULE_SUBDIR}/ inside)")
    return json.loads((p / META_FILE).read_text())


class CheckpointPolicy:
    """Greedy policy of a trained checkpoint; ``name`` is ``<algo>:<checkpoint dir name>``."""

    def __init__(self, path: str | Path) -> None:
        import torch
        from ray.rllib.core.rl_module.rl_module import RLModule

        self.path = Path(path).resolve()
        self.meta = read_meta(self.path)
        self.interface = self.meta["interface"]
        self.env_config = EnvConfig.model_validate(self.meta["env"])
        self.name = f"{self.meta['algo']}:{self.path.name}"
        self.module = RLModule.from_checkpoint(str(self.path / MODULE_SUBDIR))
        self.module.eval()
        self._torch = torch
        torch.set_num_threads(1)

    def reset(self) -> None:
        """Stateless between episodes."""

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

    def scores(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Per-action scores (masked logits or Q-values) for one observation; for BDQ a
        (branches, max branch size) array of per-branch Q-values."""
        torch = self._torch
        batch = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)[None]) for k, v in obs.items()}
        with torch.no_grad():
            if hasattr(self.module, "compute_q_values"):
                out = self.module.compute_q_values({"obs": batch})["qf_preds"]
            else:
                out = self.module.forward_inference({"obs": batch})["action_dist_inputs"]
        return out[0].numpy()

    def act(self, obs: dict[str, np.ndarray]) -> int | np.ndarray:
        scores = self.scores(obs)
        mask = obs["action_mask"] > 0
        if self.interface == "flat":
            return int(np.argmax(np.where(mask, scores, -np.inf)))
        return self._act_branching(scores, mask, obs)

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
