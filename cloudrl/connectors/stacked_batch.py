"""A lean env-runner connector path for one single-agent, stateless RLModule.

RLlib's default pipelines treat every observation as an arbitrary nest: env-to-module
gathers each episode's latest observation as an individual item and batches the items
with dm-tree (``AddObservationsFromEpisodesToBatch`` -> ``BatchIndividualItems`` ->
``NumpyToTensor``, plus time-rank and state connectors that are no-ops here);
module-to-env unbatches the module output into per-episode items and re-lists them for
the vector env (``UnBatchToIndividualItems`` -> ``ListifyDataForVectorEnv``). On the
cluster env (a Dict observation, 32 envs) that per-item work was ~40% of sampling.

For a module without state, one agent and a Dict-of-arrays or array observation the
same result is one ``np.stack`` per observation key, and the module output can go to
the env runner as batched numpy arrays (the runner indexes them per env).

* :class:`StackLatestObservations` (env-to-module): ``{obs: {key: (B, ...) tensor}}``,
  row ``i`` = episode ``i``'s latest observation (or, from
  ``cloudrl.env_runners.batched_runner``, the env's batched observation as is).
* :class:`BatchedActionsToNumpy` (module-to-env): samples actions from the action
  distribution when the module returned only its inputs (RLlib's ``GetActions``
  semantics: exploration or inference distribution class, deterministic when not
  exploring, ``action_logp`` added), then every tensor to numpy, still batched.

``use_stacked_batch_connectors(config)`` installs both in place of the defaults.
Episodes are identical to the default pipelines' (tests/test_stacked_batch_connectors.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns


def _stack(items: list[Any]) -> Any:
    """Stack a list of same-structured observations (arrays or flat dicts of arrays)."""
    first = items[0]
    if isinstance(first, dict):
        return {key: torch.from_numpy(np.stack([item[key] for item in items]))
                for key in first}
    return torch.from_numpy(np.stack(items))


class StackLatestObservations(ConnectorV2):
    """Env-to-module: every episode's latest observation, stacked per key (batch dim only)."""

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list[Any],
                 explore: bool | None = None, shared_data: dict | None = None,
                 **kwargs: Any) -> Any:
        if Columns.OBS in batch:
            return batch
        batched = kwargs.get("batched_observations")
        if batched is not None:  # the env's batch as is (BatchedSingleAgentEnvRunner)
            batch[Columns.OBS] = ({key: torch.from_numpy(value) for key, value in batched.items()}
                                  if isinstance(batched, dict) else torch.from_numpy(batched))
        else:
            batch[Columns.OBS] = _stack([episode.get_observations(-1) for episode in episodes])
        return batch


class BatchedActionsToNumpy(ConnectorV2):
    """Module-to-env: actions (sampled here if needed) and the module's outputs as numpy."""

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list[Any],
                 explore: bool | None = None, shared_data: dict | None = None,
                 **kwargs: Any) -> Any:
        if Columns.ACTIONS not in batch and Columns.ACTION_DIST_INPUTS in batch:
            dist_cls = (rl_module.get_exploration_action_dist_cls() if explore
                        else rl_module.get_inference_action_dist_cls())
            dist = dist_cls.from_logits(batch[Columns.ACTION_DIST_INPUTS])
            if not explore:
                dist = dist.to_deterministic()
            actions = dist.sample()
            batch[Columns.ACTIONS] = actions
            if Columns.ACTION_LOGP not in batch:
                batch[Columns.ACTION_LOGP] = dist.logp(actions)
        return {key: value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
                for key, value in batch.items()}


def _env_to_module(env: Any = None, spaces: Any = None, device: Any = None) -> ConnectorV2:
    return StackLatestObservations()


def _module_to_env(env: Any = None, spaces: Any = None) -> ConnectorV2:
    return BatchedActionsToNumpy()


def use_stacked_batch_connectors(config: Any) -> Any:
    """Replace RLlib's default env-runner pipelines of ``config`` with the stacked ones.

    Only for single-agent configs whose module keeps no recurrent state and whose actions
    need no unsquashing or clipping (``normalize_actions``/``clip_actions`` off); the
    caller checks the module, this checks the rest and raises ``ValueError`` otherwise.
    """
    if config.is_multi_agent:
        raise ValueError("stacked batch connectors: single-agent configs only")
    if config.normalize_actions or config.clip_actions:
        raise ValueError("stacked batch connectors: normalize_actions and clip_actions "
                         "must be off (the actions go to the env as sampled)")
    config.env_runners(env_to_module_connector=_env_to_module,
                       module_to_env_connector=_module_to_env,
                       add_default_connectors_to_env_to_module_pipeline=False,
                       add_default_connectors_to_module_to_env_pipeline=False)
    return config
