"""The single env's episodes stay what they were before the step was optimized.

Seeded runs with random actions (masked ones included) are compared with the runs recorded
(``tests/fixtures/recorded/single_episodes.npz``) by the code whose sha256 digests matched
those taken before the single env's observation moved into one numba call: observations,
masks and info keys exactly, float values to the tolerance of ``tests/recorded.py`` (float
bits differ across CPUs' SIMD paths). Any change to what an episode shows a policy fails
it. If a change of behaviour is intended, re-record with ``python -m
tests.fixtures.record_values`` and say so in the commit.
"""

import numpy as np
import pytest

from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from tests.recorded import Trace, assert_matches

CASES = (
    {"n_servers": 20},
    {"n_servers": 9, "workload": "google_v2_like",
     "sim": {"wake_delay": 0, "queue_window": 4, "diurnal_period": 97}},
)


def episode_trace(cls, cfg, steps=150) -> Trace:
    """A seeded run with random (mostly feasible, sometimes masked) actions as a Trace."""
    tr = Trace()
    env = cls(cfg)
    rng = np.random.default_rng(1)
    obs, _ = env.reset(seed=3)
    for _ in range(steps):
        for key in sorted(obs):
            tr.add(key, obs[key])
        mask = env.action_mask
        tr.add("mask", mask)
        if cls is ClusterSchedulingEnv:
            a = int(rng.integers(env.n_actions)) if rng.random() < 0.1 \
                else int(rng.choice(np.flatnonzero(mask)))
        else:
            a = np.array([int(rng.choice(np.flatnonzero(m))) if rng.random() > 0.05
                          else int(rng.integers(len(m))) for m in env.branch_masks()])
        obs, reward, terminated, truncated, info = env.step(a)
        tr.add("reward", np.float64(reward))
        for key in sorted(info):
            tr.add(f"info.{key}", np.float64(info[key]))
    return tr


KEYS = [(ClusterSchedulingEnv, 0), (ClusterSchedulingEnv, 1),
        (ClusterBranchingEnv, 0), (ClusterBranchingEnv, 1)]


def case_key(cls, case) -> str:
    return f"{cls.__name__}-{case}"


@pytest.mark.parametrize(("cls", "case"), KEYS, ids=lambda v: getattr(v, "__name__", v))
def test_episode_matches_the_recorded_run(cls, case):
    assert_matches(episode_trace(cls, CASES[case]), "single_episodes", case_key(cls, case))


def test_observation_arrays_are_fresh_each_step():
    """Returned observations never alias state a later step writes into."""
    env = ClusterSchedulingEnv({"n_servers": 20})
    obs, _ = env.reset(seed=0)
    kept = {key: value.copy() for key, value in obs.items()}
    env.step(env.wait_action)
    env.step(env.wait_action)
    for key, value in kept.items():
        np.testing.assert_array_equal(obs[key], value)
