"""The rollout over the gated env's presets (``cloudrl.algorithms.rollout``): independent env
copies, resampled futures that keep the past, preset scores that match playing the env, and
policy improvement over the base preset."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from cloudrl.algorithms.gated.controller import CONTROLLER_PATH
from cloudrl.algorithms.rollout import choose, clone_env, resample_future, rollout_scores
from envs.gated_env import GatedControllerEnv

ENV = {"n_servers": 10, "sim": {"episode_length": 150}}
PRESETS = [0, 1, 2, 5, 3, 4, 1, 2, 2, 5]  # varied presets: sleeps, wakes, no-sleep blocks


def gated(workload: str = "poisson") -> GatedControllerEnv:
    return GatedControllerEnv({**ENV, "workload": workload, "controller": CONTROLLER_PATH,
                               "decision_every": 3})


def state(env: GatedControllerEnv) -> tuple:
    sim = env.sim
    return (sim.t, sim.dyn.copy(), sim.power_state.copy(), list(sim.queue),
            sim.job_server.copy(), sim.job_arrival.copy(), copy.deepcopy(sim.stats),
            {k: list(v) for k, v in sim._finish_at.items()}, sim._next_arrival,
            list(env.controller.heuristic._mean_job), sim.arrival_ema)


def assert_same(a: tuple, b: tuple) -> None:
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y)
        else:
            assert x == y


def mid_episode(workload: str = "poisson", seed: int = 4, steps: int = 12) -> GatedControllerEnv:
    env = gated(workload)
    env.reset(seed=seed)
    for i in range(steps):
        env.step(PRESETS[i % len(PRESETS)])
    return env


def play(env: GatedControllerEnv, choices: list[int]) -> list[float]:
    return [env.step(c)[1] for c in choices]


@pytest.mark.parametrize("workload", ["poisson", "google_v2_like"])
def test_clone_is_independent_and_steps_like_the_original(workload: str) -> None:
    env = mid_episode(workload)
    before = state(env)
    twin = clone_env(env)
    twin_rewards = play(twin, PRESETS * 3)
    assert twin.sim.t > env.sim.t and twin.sim.stats.toggles > env.sim.stats.toggles
    assert_same(state(env), before)  # stepping the copy changed nothing in the original
    # the copy is exact: the original, stepped the same way, earns the same rewards
    assert play(env, PRESETS * 3) == twin_rewards
    assert_same(state(env), state(twin))
    # and its views are views (a plain deepcopy turns sim.used_cpu etc. into copies)
    assert np.shares_memory(twin.sim.n_running, twin.sim.dyn)


def test_plain_deepcopy_keeps_the_simulator_views_bound() -> None:
    """``ClusterSim.__deepcopy__`` re-binds used_cpu & co. to the copy's ``dyn`` (numpy
    alone deep-copies a view as a separate array, and the copy then diverges)."""
    env = mid_episode()
    plain = copy.deepcopy(env)
    for name in ("used_cpu", "used_mem", "wake_left", "n_running", "watts"):
        assert np.shares_memory(getattr(plain.sim, name), plain.sim.dyn)
        assert not np.shares_memory(getattr(plain.sim, name), env.sim.dyn)
    assert play(plain, PRESETS * 3) == play(env, PRESETS * 3)
    assert_same(state(env), state(plain))


def test_a_pickled_simulator_keeps_its_views_bound() -> None:
    import pickle

    env = mid_episode()
    sim = pickle.loads(pickle.dumps(env.sim))
    assert np.shares_memory(sim.used_cpu, sim.dyn) and np.shares_memory(sim.watts, sim.dyn)
    np.testing.assert_array_equal(sim.dyn, env.sim.dyn)


@pytest.mark.parametrize("workload", ["poisson", "google_v2_like"])
def test_resampled_copy_keeps_past_and_queue_and_changes_only_future_arrivals(
        workload: str) -> None:
    env = mid_episode(workload, steps=15)
    sim = env.sim
    k, t = sim._next_arrival, sim.t
    assert sim.queue and sim.running_jobs > 0  # there is a queue and running work to keep
    before = state(env)
    twin = clone_env(env)
    n_future = resample_future(twin.sim, np.random.default_rng(99))
    ts = twin.sim
    assert_same(state(env), before)  # the original keeps its true future
    assert n_future > 0 and len(ts.job_arrival) == k + n_future
    for name in ("job_arrival", "job_cpu", "job_mem", "job_duration", "job_deadline",
                 "job_server"):
        assert np.array_equal(getattr(ts, name)[:k], getattr(sim, name)[:k]), name
    assert ts._server[:k] == sim._server[:k] and ts.queue == sim.queue
    assert ts._finish_at == sim._finish_at and np.array_equal(ts.dyn, sim.dyn)
    assert np.all(ts.job_arrival[k:] > t) and np.all(np.diff(ts.job_arrival[k:]) >= 0)
    assert np.all(ts.job_deadline[k:] > ts.job_arrival[k:] + ts.job_duration[k:] - 1)
    assert ts.clock_offset == sim.clock_offset
    true_future = np.c_[sim.job_arrival[k:], sim.job_cpu[k:]]
    new_future = np.c_[ts.job_arrival[k:], ts.job_cpu[k:]]
    assert true_future.shape != new_future.shape or not np.array_equal(true_future, new_future)
    # same generator seed, same future (common random numbers across presets)
    again = clone_env(env)
    resample_future(again.sim, np.random.default_rng(99))
    assert np.array_equal(again.sim.job_cpu, ts.job_cpu)
    # the resampled copy runs on: its queue takes the new arrivals, the past jobs finish
    arrived = ts.stats.arrived
    play(twin, [0] * 10)
    assert ts.stats.arrived > arrived and ts.stats.finished >= sim.stats.finished


def test_true_future_score_of_preset_zero_is_what_the_env_then_earns() -> None:
    env = mid_episode(steps=10)
    scores = rollout_scores(env, horizon=7, futures="true", rngs=[np.random.default_rng(0)])
    assert scores.shape == (1, 6) and len(set(scores[0].round(9))) > 1  # presets differ
    # preset 0 for one decision, then ceil(7 / 3) = 3 more decisions of preset 0
    assert scores[0, 0] == pytest.approx(sum(play(env, [0, 0, 0, 0])), abs=1e-9)


def test_resampled_scores_share_futures_across_presets_and_differ_between_futures() -> None:
    env = mid_episode(steps=10)
    rngs = [np.random.default_rng([1, m]) for m in range(2)]
    scores = rollout_scores(env, horizon=30, futures="resampled", rngs=rngs)
    assert scores.shape == (2, 6) and not np.array_equal(scores[0], scores[1])
    again = rollout_scores(env, horizon=30, futures="resampled",
                           rngs=[np.random.default_rng([1, m]) for m in range(2)])
    assert np.array_equal(scores, again)  # the futures are set by the generators alone


@pytest.mark.parametrize(("scores", "mean", "consistent"), [
    ([[1.0, 1.0, 0.5]], 0, 0),                    # a tie goes to preset 0
    ([[0.0, 3.0, 1.0], [0.0, -1.0, 0.5]], 1, 2),  # best mean 1 loses once; 2 wins always
    ([[0.0, 3.0], [0.0, -1.0]], 1, 0),            # nothing beats preset 0 in every future
    ([[5.0, 1.0], [5.0, 2.0]], 0, 0),
])
def test_choose_mean_and_consistent(scores, mean, consistent) -> None:
    arr = np.asarray(scores)
    assert choose(arr, "mean") == mean and choose(arr, "consistent") == consistent


def test_rollout_scores_reject_bad_arguments() -> None:
    env = mid_episode(steps=2)
    with pytest.raises(ValueError, match="futures must be one of true, resampled"):
        rollout_scores(env, 5, "oracle", [np.random.default_rng(0)])
    with pytest.raises(ValueError, match="horizon must be >= 0"):
        rollout_scores(env, -1, "true", [np.random.default_rng(0)])
    with pytest.raises(ValueError, match="rule must be one of mean, consistent"):
        choose(np.zeros((1, 6)), "median")


# ---------------------------------------------------------------- one rollout episode


def episode(env: GatedControllerEnv, seed: int, horizon: int | None) -> tuple[float, np.ndarray]:
    """One episode's reward and preset counts: constant preset 0 (``horizon`` None) or the
    clairvoyant rollout with ``horizon`` ticks of preset 0 after each block."""
    env.reset(seed=seed)
    total, done = 0.0, False
    counts = np.zeros(env.n_choices, dtype=np.int64)
    while not done:
        choice = 0
        if horizon is not None:
            choice = choose(rollout_scores(env, horizon, "true", [np.random.default_rng(0)]))
        _, reward, term, trunc, _ = env.step(choice)
        total += reward
        counts[choice] += 1
        done = term or trunc
    return total, counts


def test_full_horizon_clairvoyant_rollout_never_loses_to_its_base_policy() -> None:
    """Policy improvement: with the true future and the base policy played to the episode
    end, the scores are the base policy's exact Q-values (deterministic simulator), so the
    rollout policy's episode reward is at least the base policy's on every seed."""
    env = GatedControllerEnv({"n_servers": 10, "workload": "poisson",
                              "sim": {"episode_length": 45}, "controller": CONTROLLER_PATH,
                              "decision_every": 3})
    for seed in (3,):
        base, base_counts = episode(env, seed, None)
        roll, roll_counts = episode(env, seed, 1000)
        assert roll_counts.sum() == base_counts.sum() == 15
        assert roll_counts[0] < 15  # it deviated from preset 0 ...
        assert roll >= base - 1e-9  # ... and never for the worse
