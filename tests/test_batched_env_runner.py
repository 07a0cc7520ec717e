"""cloudrl/env_runners/batched_runner.py: the runner that records batched steps returns
exactly the episodes (and episode metrics) of RLlib's SingleAgentEnvRunner."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from cloudrl.env_runners.batched_runner import BatchedSingleAgentEnvRunner
from cloudrl.training import TrainConfig, build_algo_config

SMALL = {"n_servers": 5, "sim": {"episode_length": 20}}


def _runner(runner_cls, algo: str, lookback: int | None = None, **cfg_kw):
    cfg = TrainConfig(algo=algo, env=SMALL, envs_per_runner=3, hidden=8, run_seed=3,
                      batched_runner=False, **cfg_kw)
    config = build_algo_config(cfg)
    if lookback is not None:
        config.env_runners(episode_lookback_horizon=lookback)
    return runner_cls(config=config)


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, list) and a and isinstance(a[0], dict):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        x, y = np.asarray(a), np.asarray(b)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def assert_same_episodes(ours, theirs) -> None:
    """Equal chunk by chunk: every buffer with its lookback, flags, t, ids' pattern."""
    assert [len(e) for e in ours] == [len(e) for e in theirs]
    ids_ours, ids_theirs = {}, {}
    for x, y in zip(ours, theirs, strict=True):
        assert x.is_numpy and y.is_numpy
        assert (x.t_started, x.t, x.is_terminated, x.is_truncated) == \
            (y.t_started, y.t, y.is_terminated, y.is_truncated)
        assert ids_ours.setdefault(x.id_, len(ids_ours)) == \
            ids_theirs.setdefault(y.id_, len(ids_theirs))
        for name in ("observations", "actions", "rewards", "infos"):
            bx, by = getattr(x, name), getattr(y, name)
            assert bx.lookback == by.lookback, name
            _same(bx.data, by.data)
        assert x.extra_model_outputs.keys() == y.extra_model_outputs.keys()
        for key, buffer in x.extra_model_outputs.items():
            assert buffer.lookback == y.extra_model_outputs[key].lookback
            _same(buffer.data, y.extra_model_outputs[key].data)
        assert x.get_return() == pytest.approx(y.get_return())


def _run(runner_cls, algo, calls, explore=True, lookback=None, **kw):
    runner = _runner(runner_cls, algo, lookback=lookback, **kw)
    try:
        episodes = []
        for steps in calls:
            episodes += runner.sample(num_timesteps=steps, explore=explore)
        metrics = runner.get_metrics()
    finally:
        runner.stop()
    return episodes, metrics


@pytest.mark.parametrize("algo,explore", [("ppo", True), ("ppo", False), ("bdq", True),
                                          ("dqn", True)])
def test_batched_runner_returns_rllibs_episodes(algo, explore):
    # call sizes that end calls mid-episode, on an episode's last step and across resets
    calls = (75, 19, 60, 3, 57)
    ours, our_metrics = _run(BatchedSingleAgentEnvRunner, algo, calls, explore)
    theirs, their_metrics = _run(SingleAgentEnvRunner, algo, calls, explore)
    assert sum(e.is_done for e in ours) >= 6
    assert_same_episodes(ours, theirs)
    for key in ("num_env_steps_sampled", "num_episodes", "episode_return_mean",
                "episode_len_mean"):
        assert float(our_metrics[key]) == pytest.approx(float(their_metrics[key])), key
    assert float(our_metrics["cluster"]["energy_kwh"]) == \
        pytest.approx(float(their_metrics["cluster"]["energy_kwh"]))


@pytest.mark.parametrize("lookback", [0, 3])
def test_batched_runner_keeps_rllibs_lookback(lookback):
    calls = (21, 2, 40)
    ours, _ = _run(BatchedSingleAgentEnvRunner, "ppo", calls, lookback=lookback)
    theirs, _ = _run(SingleAgentEnvRunner, "ppo", calls, lookback=lookback)
    assert_same_episodes(ours, theirs)


def test_batched_runner_hands_over_to_rllibs_loop_and_back():
    """Calls the fast path does not cover (whole episodes, random actions) run RLlib's own
    loop; the next fast call goes on from where it stopped, as RLlib's would."""
    def run(runner_cls):
        runner = _runner(runner_cls, "ppo")
        try:
            out = runner.sample(num_timesteps=10, random_actions=True)
            out += runner.sample(num_timesteps=25)
            out += runner.sample(num_episodes=2)
            out += runner.sample(num_timesteps=31)
        finally:
            runner.stop()
        return out

    ours, theirs = run(BatchedSingleAgentEnvRunner), run(SingleAgentEnvRunner)
    assert [len(e) for e in ours] == [len(e) for e in theirs]
    for x, y in zip(ours, theirs, strict=True):  # random actions: only the shapes agree
        x.validate()
        assert (x.t_started, x.is_done, x.observations.lookback) == \
            (y.t_started, y.is_done, y.observations.lookback)
        assert x.extra_model_outputs.keys() == y.extra_model_outputs.keys()


def test_train_config_installs_the_runner_where_it_applies():
    def runner_cls(**kw):
        return build_algo_config(TrainConfig(env=SMALL, **kw)).env_runner_cls

    assert runner_cls(algo="ppo") is BatchedSingleAgentEnvRunner
    assert runner_cls(algo="bdq") is BatchedSingleAgentEnvRunner
    assert runner_cls(algo="ppo", batched_runner=False) is None
    assert runner_cls(algo="ppo", stacked_connectors=False) is None  # needs them
    assert runner_cls(algo="gated_dqn") is None       # not a cluster env id
    assert runner_cls(algo="hierarchical") is None    # multi-agent: RLlib's runner


def test_fast_path_only_where_it_is_exact():
    runner = _runner(BatchedSingleAgentEnvRunner, "ppo")
    try:
        assert runner._fast_path_reason(10, None, False) is None
        assert runner._fast_path_reason(None, 2, False) == "samples whole episodes"
        assert runner._fast_path_reason(10, None, True) == "random actions"
    finally:
        runner.stop()
    stock = _runner(BatchedSingleAgentEnvRunner, "ppo", stacked_connectors=False)
    try:
        assert "pipelines" in stock._fast_path_reason(10, None, False)
    finally:
        stock.stop()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.data())
def test_fast_info_lists_equal_gymnasiums(num_envs, data):
    """FastDictInfoToList makes the lists gymnasium's DictInfoToList makes (flat infos with
    shared or partial masks, nested infos, no infos)."""
    import gymnasium as gym
    from gymnasium.wrappers.vector import DictInfoToList

    from cloudrl.env_runners.info_list import FastDictInfoToList

    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs)
    ours, theirs = FastDictInfoToList(vec), DictInfoToList(vec)
    shared = np.ones(num_envs, dtype=bool)
    infos: dict = {}
    for key in data.draw(st.lists(st.sampled_from("abcdef"), unique=True, max_size=5)):
        kind = data.draw(st.sampled_from(["float", "int", "bool", "nested"]))
        if kind == "nested":
            infos[key] = {"x": np.arange(num_envs, dtype=float)}
        else:
            infos[key] = np.asarray(data.draw(st.lists(
                st.integers(0, 3), min_size=num_envs, max_size=num_envs))).astype(kind)
        mask = data.draw(st.sampled_from(["shared", "partial", "none"]))
        if mask == "shared":
            infos[f"_{key}"] = shared
        elif mask == "partial":
            infos[f"_{key}"] = np.asarray(data.draw(st.lists(
                st.booleans(), min_size=num_envs, max_size=num_envs)))
    got, want = ours._convert_info_to_list(infos), theirs._convert_info_to_list(infos)
    assert got == want
    assert [list(d) for d in got] == [list(d) for d in want]  # key order
    assert [[type(v) for v in d.values()] for d in got] == \
        [[type(v) for v in d.values()] for d in want]
    vec.close()


def test_chunks_own_their_data_as_rllibs_do():
    """A learner connector may rewrite a chunk's rewards in place (the learned-reward
    connector does): that must not reach the next chunk's lookback or any other chunk."""
    def run(runner_cls):
        runner = _runner(runner_cls, "ppo")
        try:
            first = runner.sample(num_timesteps=30)
            for episode in first:
                episode.rewards.data[:] = 999.0
                episode.observations.data["servers"][:] = -5.0
            return runner.sample(num_timesteps=30)
        finally:
            runner.stop()

    ours, theirs = run(BatchedSingleAgentEnvRunner), run(SingleAgentEnvRunner)
    assert_same_episodes(ours, theirs)
    assert all(999.0 not in e.rewards.data for e in ours)


@pytest.mark.parametrize("lookback", [1, 3])
def test_fast_call_after_rllibs_loop_equals_rllibs_episodes(monkeypatch, lookback):
    """A fast call that continues chunks RLlib's own loop left (their lookback is in the
    episode objects, not in recorded rows) returns RLlib's episodes exactly."""
    def run(runner_cls, rllib_calls):
        runner = _runner(runner_cls, "ppo", lookback=lookback)
        try:
            out = []
            for i, steps in enumerate((23, 17, 31, 9)):
                if i in rllib_calls:  # this call takes RLlib's loop
                    monkeypatch.setattr(runner, "_fast_path_reason", lambda *a: "test",
                                        raising=False)
                out += runner.sample(num_timesteps=steps)
                monkeypatch.undo()
            return out
        finally:
            runner.stop()

    theirs = run(SingleAgentEnvRunner, ())
    assert_same_episodes(run(BatchedSingleAgentEnvRunner, (1,)), theirs)
    assert_same_episodes(run(BatchedSingleAgentEnvRunner, (0, 2)), theirs)
