"""Learner connector piece: the per-step ``cost`` of each step's infos as a batch column,
the whole episode's cost (``episode_cost``, when the data loader put it there) and
whether the episode feeds the behaviour head (``support_episode``, 1 when absent)."""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2

from cloudrl.data.offline import COST_KEY

COSTS = "costs"  # the train batch column
EPISODE_COSTS = "episode_costs"  # the cost of the episode the step belongs to (0: unknown)
SUPPORT_EPISODES = "support_episodes"  # 1: the step's episode feeds the behaviour head


class AddCostsFromInfos(ConnectorV2):
    """``batch["costs"]``: ``infos[t + 1]["cost"]`` for every step t of every episode.

    Works on whole episodes and on the 1-step episodes RLlib's ``OfflinePreLearner``
    samples (their infos are [info before, info after] the step).
    """

    def __call__(self, *, rl_module: Any, batch: dict[str, Any], episodes: list[Any],
                 explore: bool | None = None, shared_data: dict | None = None,
                 **kwargs: Any) -> Any:
        for ep in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            n = len(ep)
            infos = [ep.get_infos(t + 1) for t in range(n)]
            costs = np.asarray([float(i[COST_KEY]) for i in infos], dtype=np.float32)
            totals = np.asarray([float(i.get("episode_cost", 0.0)) for i in infos],
                                dtype=np.float32)
            self.add_n_batch_items(batch, COSTS, items_to_add=costs, num_items=n,
                                   single_agent_episode=ep)
            self.add_n_batch_items(batch, EPISODE_COSTS, items_to_add=totals, num_items=n,
                                   single_agent_episode=ep)
            support = np.asarray([float(i.get("support_episode", 1.0)) for i in infos],
                                 dtype=np.float32)
            self.add_n_batch_items(batch, SUPPORT_EPISODES, items_to_add=support,
                                   num_items=n, single_agent_episode=ep)
        return batch
