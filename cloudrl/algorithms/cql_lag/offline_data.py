"""``LocalEpisodeData``: RLlib's ``OfflineData`` for a dataset that fits in the driver.

RLlib's default ``OfflineData`` streams the parquet files through Ray Data into
``OfflinePreLearner`` actors; with whole 1,000-step episodes per row every new pass
starts a new actor pool with an empty episode buffer, and on a 2-core machine a single
update batch took seconds. This subclass keeps the same pieces - the packed
``SingleAgentEpisode`` rows of ``offline_data(input_=..., input_read_episodes=True)``,
an ``OfflinePreLearner`` (its episode buffer, its 1-step sampling, the algorithm's
learner connector) and the ``MultiAgentBatch`` it hands the learner - but runs the
pre-learner in the driver: the files are read once with pyarrow, every episode goes
into the pre-learner's buffer on the first ``sample``, and each ``sample`` draws
``train_batch_size_per_learner`` fresh transitions from all of them. Every step's infos
also get the total cost of its episode (``episode_cost``), so the learner can tell the
transitions of episodes within the budget (the behaviour head's "safe" support), and
whether the episode feeds the behaviour head (``support_episode``: with ``support_top``
< 1, only the highest-return share of the support episodes, :func:`support_episodes`).

Use it with ``offline_data(offline_data_class=LocalEpisodeData)`` (``CQLLagConfig``'s
default) and a local learner (``num_learners=0``).
"""

from __future__ import annotations

from typing import Any

from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.offline.offline_data import OfflineData
from ray.rllib.offline.offline_prelearner import OfflinePreLearner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils import unflatten_dict

from cloudrl.data.episodes import ITEM_COLUMN, pack_episode
from cloudrl.data.offline import DatasetError, episode_cost, read_dataset

EPISODE_COST_KEY = "episode_cost"  # the whole episode's cost, in every step's infos
SUPPORT_KEY = "support_episode"  # 1.0: the episode feeds the behaviour head


def with_episode_cost(ep: Any, support: bool = True) -> Any:
    """``ep`` with ``infos[t]["episode_cost"]`` = the sum of its per-step costs and
    ``infos[t]["support_episode"]`` = ``support``, every t."""
    total = episode_cost(ep)
    for t in range(len(ep) + 1):
        info = ep.get_infos(t)
        info[EPISODE_COST_KEY] = total
        info[SUPPORT_KEY] = float(support)
    return ep


def support_episodes(episodes: list[Any], budget: float | None, safe_only: bool,
                     top: float) -> list[bool]:
    """Which episodes feed the behaviour head: those within ``budget`` (``safe_only``;
    all when none is), of them the ``top`` share with the highest return (at least one;
    ties at the cut-off kept)."""
    costs = [episode_cost(ep) for ep in episodes]
    pool = [i for i, c in enumerate(costs)
            if not safe_only or budget is None or c <= budget + 1e-6]
    pool = pool or list(range(len(episodes)))
    if top >= 1:
        chosen = set(pool)
    else:
        returns = sorted((float(episodes[i].get_return()) for i in pool), reverse=True)
        cut = returns[max(1, int(round(top * len(pool)))) - 1]
        chosen = {i for i in pool if float(episodes[i].get_return()) >= cut}
    return [i in chosen for i in range(len(episodes))]


class LocalEpisodeData(OfflineData):
    """In-driver ``OfflineData``: all episodes in one ``OfflinePreLearner``'s buffer."""

    def __init__(self, config: Any) -> None:  # noqa: D107 - no Ray Data, see module doc
        self.config = config
        self.is_multi_agent = config.is_multi_agent
        self.path = config.input_ if isinstance(config.input_, list) else [config.input_]
        self.data_read_batch_size = config.input_read_batch_size
        self.iter_batches_kwargs: dict[str, Any] = {}
        self.map_batches_kwargs: dict[str, Any] = {}
        self.learner_handles = None
        self.module_spec = None
        self.spaces = None
        self.locality_hints = None
        self.batch_iterators = None
        self.data_is_mapped = False
        self.items: list[bytes] = []
        episodes = [ep for path in self.path  # validates every file (DatasetError names it)
                    for ep in read_dataset(path)]
        if not episodes:
            raise DatasetError(f"{self.path}: no episodes")
        budget = getattr(config, "cost_budget", None)
        marks = support_episodes(episodes, budget, getattr(config, "support_data", "all")
                                 == "safe", float(getattr(config, "support_top", 1.0)))
        self.steps = sum(len(ep) for ep in episodes)
        for ep, mark in zip(episodes, marks, strict=True):
            self.items.append(pack_episode(with_episode_cost(ep, mark)))
        self._prelearner: OfflinePreLearner | None = None

    def _build_prelearner(self) -> OfflinePreLearner:
        cfg = self.config.copy(copy_frozen=False)
        capacity = max(self.steps + 1, int(cfg.train_batch_size_per_learner) * 10)
        cfg.prelearner_buffer_kwargs = {**cfg.prelearner_buffer_kwargs, "capacity": capacity}
        spaces = self.spaces[INPUT_ENV_SPACES] if self.spaces else None
        kwargs = {"module_spec": self.module_spec} if self.module_spec is not None else {}
        return (cfg.prelearner_class or OfflinePreLearner)(config=cfg, spaces=spaces, **kwargs)

    def sample(self, num_samples: int, return_iterator: bool = False, num_shards: int = 1,
               module_state: dict[str, Any] | None = None) -> MultiAgentBatch:
        if return_iterator or num_shards > 1:
            raise ValueError("LocalEpisodeData serves a local learner (num_learners=0)")
        if self._prelearner is None:
            self._prelearner = self._build_prelearner()
            items = self.items  # first call: every episode into the buffer
        else:
            items = []
        self._prelearner.config.train_batch_size_per_learner = num_samples
        flat = self._prelearner({ITEM_COLUMN: items})
        batch = unflatten_dict(flat)
        return MultiAgentBatch(
            {mid: SampleBatch(data) for mid, data in batch.items()},
            env_steps=sum(len(next(iter(data.values()))) for data in batch.values()))
