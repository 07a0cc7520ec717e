"""The batched cluster envs (envs.vector_env) against gymnasium's SyncVectorEnv of the single env.

Hypothesis draws random fleets, physics, queue sizes, both synthetic workloads, B and a
seed for an action driver that mixes feasible and masked actions; over several whole
episodes (so every sub-env autoresets at least twice) the batched env and
``SyncVectorEnv([single env] * B)`` with the same seeds and actions must return
bit-identical observations (masks included), rewards, terminations, truncations and
info dicts (values and ``_key`` masks), for both interfaces.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim_properties import google_configs, poisson_configs, sim_configs

import envs  # noqa: F401  (registers the ids)
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from envs.env_config import EnvConfig
from envs.registration import BRANCHING_ID, FLAT_ID, make_rllib_env
from envs.vector_env import ClusterBranchingVectorEnv, ClusterSchedulingVectorEnv

PROPS = settings(max_examples=12, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PAIRS = {"flat": (ClusterSchedulingVectorEnv, ClusterSchedulingEnv),
         "branching": (ClusterBranchingVectorEnv, ClusterBranchingEnv)}


def assert_same(got: dict, want: dict, where: str) -> None:
    assert set(got) == set(want), f"{where}: keys differ {set(got) ^ set(want)}"
    for key, value in want.items():
        assert np.asarray(got[key]).dtype == np.asarray(value).dtype, f"{where}: {key} dtype"
        assert np.array_equal(got[key], value), f"{where}: {key}\n{got[key]}\n{value}"


def random_actions(mask: np.ndarray, vec, rng: np.random.Generator, p_masked: float):
    """Per sub-env a feasible action, or with probability ``p_masked`` any in-space one."""
    mask = mask > 0
    if isinstance(vec, ClusterSchedulingVectorEnv):
        return np.array([rng.integers(len(m)) if rng.random() < p_masked
                         else rng.choice(np.flatnonzero(m)) for m in mask], dtype=np.int64)
    sizes = vec.single_action_space.nvec
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    acts = np.zeros((len(mask), len(sizes)), dtype=np.int64)
    for b, row in enumerate(mask):
        for br, (off, size) in enumerate(zip(offsets, sizes, strict=True)):
            ok = np.flatnonzero(row[off:off + size])
            acts[b, br] = rng.integers(size) if rng.random() < p_masked / 4 else rng.choice(ok)
    return acts


def run_both(interface: str, config: EnvConfig, n_envs: int, seed: int, steps: int,
             p_masked: float = 0.15) -> dict[str, int]:
    """Step both vector envs side by side; returns counts of what the run exercised."""
    vec_cls, single_cls = PAIRS[interface]
    vec = vec_cls(n_envs, config)
    ref = gym.vector.SyncVectorEnv([lambda: single_cls(config) for _ in range(n_envs)])
    assert vec.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"]
    assert vec.observation_space == ref.observation_space
    assert vec.action_space == ref.action_space
    obs, info = vec.reset(seed=seed)
    want_obs, want_info = ref.reset(seed=seed)
    assert_same(obs, want_obs, "reset obs")
    assert_same(info, want_info, "reset info")
    rng = np.random.default_rng(seed)
    seen = {"invalid": 0, "resets": 0}
    for t in range(steps):
        acts = random_actions(obs["action_mask"], vec, rng, p_masked)
        obs, rew, term, trunc, info = vec.step(acts)
        want = ref.step(acts)
        assert_same(obs, want[0], f"step {t} obs")
        assert np.array_equal(rew, want[1]), f"step {t} rewards {rew} {want[1]}"
        assert np.array_equal(term, want[2]) and np.array_equal(trunc, want[3]), f"step {t}"
        assert_same(info, want[4], f"step {t} info")
        seen["invalid"] += int(info.get("invalid_action", np.zeros(1)).sum())
        seen["resets"] += int(info.get("_episode_seed", np.zeros(1)).sum())
    return seen


@st.composite
def env_configs(draw) -> EnvConfig:
    sim = draw(sim_configs(max_servers=10, max_length=12))
    workload = draw(st.one_of(poisson_configs(), google_configs()))
    return EnvConfig(sim=sim, workload=workload)


@pytest.mark.parametrize("interface", ["flat", "branching"])
@PROPS
@given(config=env_configs(), n_envs=st.integers(1, 4), seed=st.integers(0, 2**20))
def test_vector_env_matches_sync_vector_env(interface, config, n_envs, seed):
    steps = 2 * config.sim.episode_length + 3  # two autoresets of every sub-env
    seen = run_both(interface, config, n_envs, seed, steps)
    assert seen["resets"] >= 2 * n_envs


@pytest.mark.parametrize("interface", ["flat", "branching"])
def test_default_fleet_with_masked_actions_matches(interface):
    """N=50 default physics over a 60-tick episode and a half: masked actions do occur."""
    config = EnvConfig.coerce({"n_servers": 50, "sim": {"episode_length": 60}})
    seen = run_both(interface, config, 3, seed=11, steps=95, p_masked=0.3)
    assert seen["invalid"] > 10 and seen["resets"] == 3


def test_reset_mask_and_seed_list_match_sync_vector_env():
    config = EnvConfig.coerce({"n_servers": 6, "sim": {"episode_length": 20}})
    vec = ClusterBranchingVectorEnv(3, config)
    ref = gym.vector.SyncVectorEnv([lambda: ClusterBranchingEnv(config) for _ in range(3)])
    assert_same(vec.reset(seed=[5, 6, 7])[0], ref.reset(seed=[5, 6, 7])[0], "seed list")
    hold = np.tile(np.asarray(ref.single_action_space.nvec) * 0, (3, 1))
    hold[:, :6] = ref.single_action_space.nvec[0] - 1  # defer every slot
    for _ in range(4):
        vec.step(hold)
        ref.step(hold)
    mask = np.array([False, True, False])
    obs, info = vec.reset(seed=[None, 42, None], options={"reset_mask": mask})
    want_obs, want_info = ref.reset(seed=[None, 42, None], options={"reset_mask": mask.copy()})
    assert_same(obs, want_obs, "masked reset obs")
    assert_same(info, want_info, "masked reset info")
    assert info["episode_seed"][1] == 42
    got, want = vec.step(hold), ref.step(hold)
    assert_same(got[0], want[0], "after masked reset")
    assert_same(got[4], want[4], "after masked reset info")


@pytest.mark.parametrize(("interface", "bad", "message"), [
    ("flat", np.array([0, 10**6]), "action of env 1: 1000000 outside Discrete"),
    ("flat", np.array([0.0, 1.0]), "actions must be integers"),
    ("flat", np.array([0, 1, 2]), r"actions must have shape \(2,\)"),
    ("branching", "out_of_range", "action of env 0: branch 0 = 99 outside"),
])
def test_out_of_space_actions_raise_one_clear_error(interface, bad, message):
    vec = PAIRS[interface][0](2, {"n_servers": 4})
    vec.reset(seed=0)
    if isinstance(bad, str):
        bad = np.ones(vec.action_space.shape, dtype=np.int64)
        bad[0, 0] = 99
    with pytest.raises(ValueError, match=message):
        vec.step(bad)


def test_registered_ids_have_vector_entry_points():
    """``gym.make_vec`` on the ids builds the batched envs (and honours ``config``)."""
    flat = gym.make_vec(FLAT_ID, num_envs=3, config={"n_servers": 7})
    branching = gym.make_vec(BRANCHING_ID, num_envs=2, vectorization_mode="vector_entry_point",
                             config={"n_servers": 5})
    assert isinstance(flat.unwrapped, ClusterSchedulingVectorEnv) and flat.num_envs == 3
    assert flat.single_action_space.n == 8 * 7 + 7 + 1
    assert isinstance(branching.unwrapped, ClusterBranchingVectorEnv)
    assert branching.single_observation_space["servers"].shape[0] == 5
    sync = gym.make_vec(FLAT_ID, num_envs=2, vectorization_mode="sync", config={"n_servers": 7})
    assert isinstance(sync, gym.vector.SyncVectorEnv)


def test_rllib_creator_builds_the_vector_env_with_reward_scale():
    """RLlib's vector entry point passes ``num_envs`` in the env config."""
    cfg = {"n_servers": 6, "sim": {"episode_length": 5}}
    vec = make_rllib_env(ClusterSchedulingEnv, {**cfg, "reward_scale": 0.01, "num_envs": 2})
    plain = make_rllib_env(ClusterSchedulingEnv, {**cfg, "num_envs": 2})
    single = make_rllib_env(ClusterSchedulingEnv, cfg)
    assert isinstance(vec.unwrapped, ClusterSchedulingVectorEnv) and vec.num_envs == 2
    assert isinstance(single, ClusterSchedulingEnv)
    vec.reset(seed=1)
    plain.reset(seed=1)
    wait = np.full(2, plain.single_action_space.n - 1)
    scaled, raw = vec.step(wait)[1], plain.step(wait)[1]
    assert np.array_equal(scaled, raw * 0.01) and (raw < 0).all()


# --------------------------------------------------------------------------- RLlib
TINY_HPARAMS = {
    "ppo": {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1},
    "dqn": {"train_batch_size_per_learner": 16, "num_steps_sampled_before_learning_starts": 64},
    "bdq": {"train_batch_size_per_learner": 16, "num_steps_sampled_before_learning_starts": 64},
    "appo": {"train_batch_size_per_learner": 64},
    "impala": {"train_batch_size_per_learner": 64},
    "apex_bdq": {"train_batch_size_per_learner": 16,
                 "num_steps_sampled_before_learning_starts": 100, "num_cpus_per_replay_shard": 0},
}
SMALL = {"n_servers": 5, "sim": {"episode_length": 20}}


def test_train_config_runs_the_batched_env_only_where_it_applies():
    from cloudrl.training import TrainConfig, build_algo_config

    def mode(**kwargs):
        return str(build_algo_config(TrainConfig(env=SMALL, **kwargs)).gym_env_vectorize_mode)

    assert mode(algo="ppo") == mode(algo="bdq") == "vector_entry_point"
    assert mode(algo="ppo", batched_env=False) == "sync"
    assert mode(algo="gated_dqn") == "sync"  # its env is the gated controller
    assert mode(algo="hierarchical") == "sync"  # multi-agent


def test_cluster_envs_skip_rllib_action_normalization():
    """Discrete/MultiDiscrete actions need no unsquashing; RLlib's connector would only
    deep-copy them every step. Other envs keep RLlib's default."""
    from cloudrl.training import TrainConfig, build_algo_config

    def normalize(**kwargs):
        return build_algo_config(TrainConfig(env=SMALL, **kwargs)).normalize_actions

    assert normalize(algo="ppo") is False and normalize(algo="bdq") is False
    assert normalize(algo="ppo", batched_env=False) is False
    assert normalize(algo="gated_dqn") is True


def test_rllib_env_runner_explores_masked_ppo_on_the_batched_env():
    """Exploring masked PPO through the env runner (no action normalization, no mode
    toggle): every sampled action is one the observation's mask allowed."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from cloudrl.training import TrainConfig, build_algo_config

    cfg = TrainConfig(algo="ppo", env=SMALL, envs_per_runner=3, hidden=8)
    runner = SingleAgentEnvRunner(config=build_algo_config(cfg))
    episodes = runner.sample(num_timesteps=60, explore=True)
    checked = 0
    for episode in episodes:
        masks = episode.get_observations()["action_mask"]
        for t, action in enumerate(episode.get_actions()):
            assert masks[t][int(action)] == 1.0
            checked += 1
    assert checked >= 60
    runner.stop()


def test_rllib_env_runner_samples_the_batched_env():
    """RLlib's own env runner builds the batched env from the registered name and samples
    whole episodes from it (reward scaled, cluster infos present)."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from cloudrl.training import TrainConfig, build_algo_config

    cfg = TrainConfig(algo="bdq", env=SMALL, envs_per_runner=3, hidden=8, reward_scale=0.5)
    runner = SingleAgentEnvRunner(config=build_algo_config(cfg))
    assert isinstance(runner.env.unwrapped, ClusterBranchingVectorEnv)
    episodes = runner.sample(num_episodes=3, random_actions=True)
    done = [e for e in episodes if e.is_done]
    assert len(done) >= 3 and all(len(e) == 20 for e in done)
    infos = done[0].get_infos()
    assert "episode_seed" in infos[0] and "energy_kwh" in infos[1]
    raw = sum(float(i["r_energy"] + i["r_sla"] + i["r_toggle"] + i["r_invalid"])
              for i in infos[1:])
    assert done[0].get_return() == pytest.approx(0.5 * raw)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algo", sorted(TINY_HPARAMS))
def test_each_algorithm_trains_an_iteration_on_the_batched_env(algo):
    from cloudrl.training import TrainConfig, build_algo_config, env_steps_of

    runners = 1 if algo == "apex_bdq" else 0
    cfg = TrainConfig(algo=algo, env=SMALL, envs_per_runner=4, hidden=16,
                      num_env_runners=runners, hparams=TINY_HPARAMS[algo])
    algorithm = build_algo_config(cfg).build_algo()
    try:
        result = algorithm.train()
        kinds = algorithm.env_runner_group.foreach_env_runner(
            lambda r: type(r.env.unwrapped).__name__ if r.env is not None else None,
            local_env_runner=runners == 0)
        runner_classes = algorithm.env_runner_group.foreach_env_runner(
            lambda r: type(r).__name__, local_env_runner=runners == 0)
        assert "BatchedSingleAgentEnvRunner" in runner_classes
        want = (ClusterBranchingVectorEnv if cfg.interface() == "branching"
                else ClusterSchedulingVectorEnv).__name__
        assert want in kinds
        assert env_steps_of(result) > 0
    finally:
        algorithm.stop()
