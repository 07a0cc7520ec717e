"""Offline datasets: the cost column, ε-noised behaviour, summaries, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cloudrl.data.episodes import ITEM_COLUMN, pack_episode
from cloudrl.data.offline import COST_KEY, DatasetError, episode_cost, read_dataset
from cloudrl.offline.dataset import (
    CostInfo,
    EpsilonNoisy,
    action_coverage,
    random_valid_action,
    record_dataset,
    summarize,
)
from cloudrl.policy import make_env
from cloudrl.recording import record_episode

SMALL_ENV = {"n_servers": 4, "sim": {"episode_length": 30}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("offline_data")
    record_dataset(out, ["power_aware", "round_robin"], env_config=SMALL_ENV, episodes=2,
                   epsilons=[0.0, 0.5])
    return out


def test_every_step_carries_its_violations_as_cost(dataset):
    episodes = read_dataset(dataset)
    assert len(episodes) == 8  # 2 policies x 2 epsilons x 2 seeds
    for ep in episodes:
        assert ep.is_done and len(ep) == 30
        for t in range(len(ep)):
            info = ep.get_infos(t + 1)
            assert info[COST_KEY] == info["violations"] == info["late"] + info["dropped"]
    behaviours = {ep.custom_data["behaviour"] for ep in episodes}
    assert behaviours == {"power_aware", "power_aware+eps0.5", "round_robin",
                          "round_robin+eps0.5"}
    assert {ep.custom_data["episode_seed"] for ep in episodes} == {0, 1}


def test_record_then_read_gives_the_same_transitions(tmp_path):
    """Round trip: what the env produced is what the dataset holds, step for step."""
    env = CostInfo(make_env(SMALL_ENV, "flat"))
    from cloudrl.heuristics import make_heuristic

    pol = EpsilonNoisy(make_heuristic("ffd"), 0.3, seed=7)
    pol.seed(3)
    live = record_episode(env, pol, 3)
    record_dataset(tmp_path, ["ffd"], env_config=SMALL_ENV, episodes=1, seeds=[3],
                   epsilons=[0.3], noise_seed=7)
    (ep,) = read_dataset(tmp_path)
    assert len(ep) == len(live)
    np.testing.assert_array_equal(ep.get_actions(slice(0, len(ep))),
                                  live.get_actions(slice(0, len(live))))
    np.testing.assert_allclose(ep.get_rewards(slice(0, len(ep))),
                               live.get_rewards(slice(0, len(live))))
    for t in range(len(ep) + 1):
        for key in ("macro", "servers", "jobs", "action_mask"):
            np.testing.assert_array_equal(ep.get_observations(t)[key],
                                          live.get_observations(t)[key])
    assert episode_cost(ep) == sum(live.get_infos(t + 1)["violations"]
                                   for t in range(len(live)))


def test_epsilon_noise_takes_only_valid_actions_and_the_right_share():
    rng = np.random.default_rng(0)
    mask = np.array([0, 1, 0, 1, 1, 0], dtype=np.float32)
    draws = [random_valid_action(mask, rng) for _ in range(600)]
    assert set(draws) == {1, 3, 4}
    branch = np.array([1, 0, 1, 0, 0, 1, 1], dtype=np.float32)  # branches of 3 and 4
    acts = np.array([random_valid_action(branch, rng, [3, 4]) for _ in range(200)])
    assert set(acts[:, 0]) == {0, 2} and set(acts[:, 1]) == {2, 3}

    class Const:
        name, interface = "const", "flat"

        def reset(self):
            pass

        def act(self, obs):
            return 0

    noisy = EpsilonNoisy(Const(), 0.25, seed=1)
    noisy.seed(0)
    obs = {"action_mask": np.array([1, 1, 1, 1], dtype=np.float32)}
    acts = np.array([noisy.act(obs) for _ in range(4000)])
    # P(not 0) = 0.25 * 3/4
    assert abs((acts != 0).mean() - 0.1875) < 0.02
    with pytest.raises(ValueError, match="epsilon"):
        EpsilonNoisy(Const(), 1.5)


def test_summary_per_behaviour_and_coverage(dataset):
    episodes = read_dataset(dataset)
    s = summarize(episodes)
    rows = {r["policy"]: r for r in s["behaviours"]}
    assert s["episodes"] == 8 and s["steps"] == 240
    for name, r in rows.items():
        eps = [e for e in episodes if e.custom_data["behaviour"] == name]
        assert r["mean_return"] == pytest.approx(np.mean([e.get_return() for e in eps]))
        assert r["mean_cost"] == pytest.approx(np.mean([episode_cost(e) for e in eps]))
    # round robin never toggles; noise does
    assert 0 < s["coverage"]["toggle"] <= 1 and s["coverage"]["wait"] == 1.0


def test_action_coverage_counts_each_kind():
    k, n = 2, 3  # 6 placements, 3 toggles, wait
    cov = action_coverage(np.array([0, 0, 5, 6, 9]), "flat", k=k, n=n)
    assert cov == {"place": pytest.approx(2 / 6), "toggle": pytest.approx(1 / 3),
                   "wait": 1.0}
    cov = action_coverage(np.array([[0, 1], [2, 1], [0, 0]]), "branching", k=0, n=0,
                          branch_sizes=[4, 2])
    assert cov == {"branch_0": 0.5, "branch_1": 1.0}


def test_a_malformed_dataset_file_is_an_error_naming_the_file(tmp_path, dataset):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), bad)
    with pytest.raises(DatasetError, match="bad.parquet"):
        read_dataset(tmp_path)
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match="bad.parquet"):
        read_dataset(bad)
    pq.write_table(pa.table({ITEM_COLUMN: pa.array([b"\x00garbage"], pa.binary())}), bad)
    with pytest.raises(DatasetError, match=r"bad.parquet: row 0"):
        read_dataset(bad)
    # an episode without the cost column (recorded by `cloudrl align record`)
    plain = record_episode(make_env(SMALL_ENV, "flat"), _ffd(), 0)
    pq.write_table(pa.table({ITEM_COLUMN: pa.array([pack_episode(plain)], pa.binary())}), bad)
    with pytest.raises(DatasetError, match=r"bad.parquet: row 0: step 0: no 'cost'"):
        read_dataset(bad)
    with pytest.raises(DatasetError, match="missing: no such file"):
        read_dataset(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="empty: no .parquet"):
        read_dataset(tmp_path / "empty")


def _ffd():
    from cloudrl.heuristics import make_heuristic

    return make_heuristic("ffd")


def test_test_seeds_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a train seed"):
        record_dataset(tmp_path, ["ffd"], env_config=SMALL_ENV, episodes=1, seeds=[1_000_000])


def test_subsets_keep_the_episodes_asked_for_and_every_step_gets_its_episode_cost(
        dataset, tmp_path):
    from cloudrl.algorithms.cql_lag.offline_data import EPISODE_COST_KEY, with_episode_cost
    from cloudrl.offline.dataset import subset_dataset

    eps = read_dataset(dataset)
    costs = sorted(episode_cost(e) for e in eps)
    cut = costs[len(costs) // 2]
    safe = subset_dataset(dataset, tmp_path / "safe", max_cost=cut)
    assert safe["episodes"] == sum(c <= cut for c in costs)
    assert all(episode_cost(e) <= cut for e in read_dataset(tmp_path / "safe"))
    rest = subset_dataset(dataset, tmp_path / "rest", min_cost=cut + 1e-6,
                          drop_behaviours=["power_aware"])
    kept = read_dataset(tmp_path / "rest")
    assert len(kept) == rest["episodes"] == sum(
        episode_cost(e) > cut and not e.custom_data["behaviour"].startswith("power_aware")
        for e in eps)
    with pytest.raises(DatasetError, match="no episode"):
        subset_dataset(dataset, tmp_path / "none", max_cost=-1.0)
    ep = with_episode_cost(eps[0])
    assert {ep.get_infos(t)[EPISODE_COST_KEY] for t in range(len(ep) + 1)} == {
        episode_cost(ep)}
