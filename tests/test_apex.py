"""cloudrl.algorithms.apex_bdq: Ape-X BDQ (async env runners, replay shard actors, one learner)."""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

from cloudrl.algorithms.apex_bdq import (
    APEX_RESULTS,
    ApexBDQ,
    ApexBDQConfig,
    ReplayShard,
    runner_epsilon,
)
from cloudrl.algorithms.apex_bdq.actor_side import TRANSITION_KEYS, NStepAssembler, initial_td_abs
from cloudrl.algorithms.bdq import BDQConfig, BDQTorchLearner
from cloudrl.algorithms.bdq.bdq_learner import DISCOUNTS
from cloudrl.replay import DeviceReplayBuffer, ReplayConfig
from envs.cluster_env import ClusterBranchingEnv
from envs.registration import BRANCHING_ID, register_rllib_envs
from models.bdq import BDQTorchRLModule
from tests.test_bdq import TINY_MODEL, ToyBranchingBandit, train_until_optimal

ENV_CONFIG = {"n_servers": 5, "sim": {"episode_length": 50}, "seed_pool": [0, 1, 2]}
N_STEP = 3


# -- pure parts -----------------------------------------------------------------------------

def test_runner_epsilons_follow_apex_formula() -> None:
    eps = [runner_epsilon(i, 8) for i in range(8)]
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    for i, e in enumerate(eps):
        assert e == pytest.approx(0.4 ** (1 + 7 * i / 7))
    assert all(a > b for a, b in zip(eps, eps[1:], strict=False))  # decreasing in i
    assert runner_epsilon(0, 1) == pytest.approx(0.4)
    assert runner_epsilon(2, 3, epsilon=0.5, alpha=1.0) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        runner_epsilon(3, 3)


def test_config_validation_and_learner_hook() -> None:
    ok = ApexBDQConfig().environment(BRANCHING_ID).env_runners(num_env_runners=2)
    assert ok.algo_class is ApexBDQ and ok.td_errors_on_device
    assert not BDQConfig().td_errors_on_device  # plain BDQ: priorities via the metrics
    assert BDQConfig().training(device_replay=True).td_errors_on_device
    bundles = ApexBDQ.default_resource_request(
        ok.training(num_replay_shards=2, num_cpus_per_replay_shard=0.5)).bundles
    assert bundles[-2:] == [{"CPU": 0.5}, {"CPU": 0.5}]  # Tune reserves the shards too
    for bad in (ApexBDQConfig().env_runners(num_env_runners=0),
                ApexBDQConfig().env_runners(num_env_runners=1).training(num_replay_shards=2),
                ApexBDQConfig().training(broadcast_interval=0),
                ApexBDQConfig().training(apex_epsilon=1.5),
                ApexBDQConfig().training(replay_shard_capacity=16)):  # < batch 32
        with pytest.raises(ValueError):
            bad.validate()
    remote = ApexBDQConfig().environment(BRANCHING_ID).learners(num_learners=2)
    remote.validate()  # remote / DDP learners: priorities come back through the metrics
    assert not remote.td_errors_on_device


# -- the shard, in-process ------------------------------------------------------------------

@pytest.fixture(scope="module")
def env() -> ClusterBranchingEnv:
    return ClusterBranchingEnv(ENV_CONFIG)


def module_spec(env: ClusterBranchingEnv) -> RLModuleSpec:
    return RLModuleSpec(module_class=BDQTorchRLModule, observation_space=env.observation_space,
                        action_space=env.action_space, model_config=TINY_MODEL)


def make_shard(env: ClusterBranchingEnv, capacity: int = 64) -> ReplayShard:
    cfg = ReplayConfig(capacity=capacity, gamma=0.9)
    return ReplayShard(0, 2, cfg, env.observation_space, env.action_space)


def rows(env: ClusterBranchingEnv, n: int, seed: int, stream: int = 0,
         terminated_last: bool = False) -> dict[str, Any]:
    """Single-step rows as ``episodes_to_transitions`` makes them (random observations)."""
    space = env.observation_space
    space.seed(seed)
    obs = [space.sample() for _ in range(n + 1)]
    stack = {k: np.stack([o[k] for o in obs]).astype(np.float32) for k in obs[0]}
    stack["action_mask"] = np.ones_like(stack["action_mask"])
    rng = np.random.default_rng(seed)
    terminated = np.zeros(n, dtype=bool)
    terminated[-1] = terminated_last
    return {"obs": {k: v[:-1] for k, v in stack.items()},
            "next_obs": {k: v[1:] for k, v in stack.items()},
            "action": rng.integers(0, np.asarray(env.branch_sizes), size=(n, len(
                env.branch_sizes))).astype(np.int64),
            "reward": rng.normal(size=n).astype(np.float32), "terminated": terminated,
            "truncated": np.zeros(n, dtype=bool), "stream_id": np.full(n, stream)}


def one_step(batch: dict[str, Any], gamma: float = 0.9) -> dict[str, Any]:
    """Rows as complete 1-step transitions (the layout a shard stores)."""
    n = len(batch["reward"])
    return {"obs": batch["obs"], "next_obs": batch["next_obs"], "actions": batch["action"],
            "rewards": batch["reward"], "dones": batch["terminated"].astype(np.float32),
            "discounts": np.full(n, gamma, dtype=np.float32)}


def learner_td(module: BDQTorchRLModule, transitions: dict[str, Any]) -> torch.Tensor:
    """The learner's own per-sample priorities (BDQTorchLearner, device-TD path)."""
    stub = types.SimpleNamespace(device_td_errors={}, metrics=None)
    stub.metrics = types.SimpleNamespace(log_dict=lambda *a, **k: None)
    batch = {"obs": transitions["obs"], "new_obs": transitions["next_obs"],
             "actions": transitions["actions"], "rewards": transitions["rewards"],
             "terminateds": transitions["dones"], DISCOUNTS: transitions["discounts"]}
    config = ApexBDQConfig().training(gamma=0.9)
    with torch.no_grad():
        fwd = module.forward_train(batch)
        BDQTorchLearner.compute_loss_for_module(stub, module_id="m", config=config,
                                                batch=batch, fwd_out=fwd)
    return stub.device_td_errors["m"]


def by_reward(transitions: dict[str, Any]) -> dict[str, Any]:
    order = torch.argsort(torch.as_tensor(transitions["rewards"]))
    return {k: ({kk: torch.as_tensor(vv)[order] for kk, vv in v.items()}
                if isinstance(v, dict) else torch.as_tensor(v)[order])
            for k, v in transitions.items()}


def test_actor_assembles_the_same_windows_as_the_learner_replay(env) -> None:
    """Pushed in pieces (and in chunks), two interleaved streams give exactly the n-step
    transitions one DeviceReplayBuffer makes of all rows at once."""
    parts = [rows(env, 4, seed=1, stream=0), rows(env, 3, seed=2, stream=1),
             rows(env, 5, seed=3, stream=0, terminated_last=True),
             rows(env, 6, seed=4, stream=1)]
    assembler = NStepAssembler(env.observation_space, len(env.branch_sizes), N_STEP, 0.9,
                               num_streams=2, capacity=4)  # chunks of 4 rows
    got = [assembler.push(p) for p in parts]
    assert got[0] is not None and len(got[0]["rewards"]) == 2  # 2 rows wait for windows
    assert assembler.push(None) is None
    reference = DeviceReplayBuffer(
        ReplayConfig(capacity=64, n_step=N_STEP, gamma=0.9, num_streams=2),
        env.observation_space, action_shape=(len(env.branch_sizes),))
    whole = {k: ({kk: np.concatenate([p[k][kk] for p in parts]) for kk in parts[0][k]}
                 if isinstance(parts[0][k], dict) else np.concatenate([p[k] for p in parts]))
             for k in parts[0]}
    stored = int(reference.add(whole))
    mine = by_reward({k: (torch.cat([g[k] for g in got if g]) if not isinstance(got[0][k], dict)
                          else {kk: torch.cat([g[k][kk] for g in got if g])
                                for kk in got[0][k]}) for k in got[0]})
    theirs = by_reward(reference.transitions(torch.arange(stored)))
    # stream 0 ends (all 9 windows complete); stream 1 stays open (its last 2 rows wait)
    assert len(mine["rewards"]) == stored == 9 + 7
    for key in TRANSITION_KEYS:
        torch.testing.assert_close(mine[key], theirs[key])


def test_a_stream_reused_for_a_new_episode_does_not_join_the_dead_ones_windows(env) -> None:
    assembler = NStepAssembler(env.observation_space, len(env.branch_sizes), N_STEP, 0.9,
                               num_streams=2)
    assert assembler.push(rows(env, 4, seed=5, stream=0)) is not None  # 2 rows wait
    assert len(assembler.push(rows(env, 4, seed=6, stream=1))["rewards"]) == 2
    assembler.discard([0])  # stream 0's episode will never continue
    new = rows(env, 3, seed=7, stream=0)
    got = assembler.push(new)
    assert len(got["rewards"]) == 1  # only the new episode's first window
    torch.testing.assert_close(got["obs"]["macro"][0], torch.as_tensor(new["obs"]["macro"][0]))
    # Stream 1's waiting rows survive and complete with its next row.
    assert len(assembler.push(rows(env, 1, seed=8, stream=1))["rewards"]) == 1


def test_actor_priorities_are_the_learners_when_target_equals_online(env) -> None:
    """The runner's inference-only module (no target net) gives the learner's priorities
    whenever the target network equals the online one; in general it differs."""
    torch.manual_seed(0)
    learner_module = module_spec(env).build()
    learner_module.make_target_networks()  # a copy of the online network
    runner_spec = module_spec(env)
    runner_spec.inference_only = True
    runner_module = runner_spec.build()
    runner_module.set_state(learner_module.get_state(inference_only=True))
    assembler = NStepAssembler(env.observation_space, len(env.branch_sizes), N_STEP, 0.9,
                               num_streams=1)
    transitions = assembler.push(rows(env, 9, seed=5, terminated_last=True))
    mine = initial_td_abs(runner_module, transitions, gamma=0.9)
    assert mine.shape == (9,) and not torch.allclose(mine, mine[0].expand_as(mine))
    torch.testing.assert_close(mine, learner_td(learner_module, transitions))
    with torch.no_grad():
        for p in learner_module._target_advantage_heads.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert not torch.allclose(mine, learner_td(learner_module, transitions))


def test_shard_stores_transitions_with_the_actors_priorities(env) -> None:
    shard = make_shard(env)
    first = one_step(rows(env, 6, seed=1))
    stats = shard.add(first)  # no priorities given: the maximum so far (1)
    assert stats["stored"] == 6 and stats["initial_priorities"] == 0
    assert torch.equal(shard.priorities(), torch.ones(6, dtype=torch.float64))
    td = np.linspace(0.5, 3.0, 5).astype(np.float32)
    stats = shard.add(one_step(rows(env, 5, seed=2)), td)
    assert stats["stored"] == 11 and stats["initial_priorities"] == 5
    prio = (torch.as_tensor(td).double() + shard.config.eps) ** shard.config.alpha
    torch.testing.assert_close(shard.priorities()[6:], prio)
    stored = shard.buffer.transitions(torch.arange(6))
    for key in ("rewards", "dones", "discounts"):
        torch.testing.assert_close(stored[key], torch.as_tensor(first[key]))
    torch.testing.assert_close(stored["actions"], torch.as_tensor(first["actions"]))
    torch.testing.assert_close(stored["next_obs"]["macro"],
                               torch.as_tensor(first["next_obs"]["macro"]))
    # More than the ring holds in one call: the last capacity transitions stay.
    small = make_shard(env, capacity=4)
    stats = small.add(one_step(rows(env, 7, seed=3)), np.arange(7, dtype=np.float32))
    assert stats["size"] == 4 and stats["stored"] == 4
    torch.testing.assert_close(small.priorities(), (torch.arange(3, 7).double()
                                                    + small.config.eps) ** small.config.alpha)


def test_shard_drops_stale_priority_updates(env) -> None:
    shard = make_shard(env, capacity=16)
    shard.add(one_step(rows(env, 16, seed=3)))
    reply = shard.sample(8)
    assert shard.sample(17)["batch"] is None  # fewer transitions than the batch
    indices, stamps = reply["batch"]["indices"], reply["stamps"]
    assert reply["incarnation"] == shard.incarnation
    # A wrong incarnation (the shard restarted since it was sampled) changes nothing.
    assert shard.update_priorities(indices, stamps, torch.ones(8), "old") == 0
    # Overwrite slots 0..5 (ring of 16): samples from there are stale.
    shard.add(one_step(rows(env, 6, seed=4)))
    fresh = indices >= 6
    before = shard.priorities().clone()
    td = torch.full((8,), 3.0)
    applied = shard.update_priorities(indices, stamps, td, shard.incarnation)
    assert applied == int(fresh.sum())
    after = shard.priorities()
    target = (3.0 + shard.config.eps) ** shard.config.alpha
    assert torch.allclose(after[indices[fresh]], torch.tensor(target, dtype=torch.float64))
    assert torch.equal(after[:6], before[:6])  # the overwritten slots keep their priority
    assert shard.stats()["stale_priorities"] == 8 + int((~fresh).sum())


def test_shard_state_round_trip(env) -> None:
    shard = make_shard(env, capacity=16)
    shard.add(one_step(rows(env, 10, seed=9)), np.arange(10, dtype=np.float32))
    copy = make_shard(env, capacity=16)
    copy.set_state(shard.get_state())
    assert len(copy.buffer) == 10 and torch.equal(copy.priorities(), shard.priorities())
    assert torch.equal(copy._stamps, shard._stamps)


# -- Ape-X runs on Ray ----------------------------------------------------------------------

def apex_config(**training: Any) -> ApexBDQConfig:
    register_rllib_envs()
    settings = {"num_replay_shards": 2, "replay_shard_capacity": 1000,
                "num_cpus_per_replay_shard": 0.25, "broadcast_interval": 2,
                "n_step": N_STEP, "train_batch_size_per_learner": 16,
                "num_steps_sampled_before_learning_starts": 32,
                "target_network_update_freq": 32, **training}
    return (
        ApexBDQConfig()
        .environment(BRANCHING_ID, env_config=ENV_CONFIG)
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5,
                     num_envs_per_env_runner=1, rollout_fragment_length=16)
        .reporting(min_sample_timesteps_per_iteration=64)
        .training(**settings)
        .rl_module(model_config=TINY_MODEL)
        .debugging(seed=0)
    )


def shard_stats(algo: ApexBDQ) -> list[dict[str, Any]]:
    return ray.get([h.stats.remote() for h in algo.replay_shards()])


def env_steps(result: dict[str, Any]) -> int:
    return int(result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME])


def train_until(algo: ApexBDQ, done, max_iterations: int = 20) -> dict[str, Any]:
    for _ in range(max_iterations):
        result = algo.train()
        if done(result):
            return result
    raise AssertionError(f"condition not reached in {max_iterations} iterations: "
                         f"{result.get(APEX_RESULTS)}")


def learner_weights(algo: ApexBDQ) -> dict[str, torch.Tensor]:
    module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def runner_handles(algo: ApexBDQ) -> dict[int, Any]:
    return dict(algo.env_runner_group.foreach_env_runner(
        lambda r: (r.worker_index, ray.get_runtime_context().current_actor),
        local_env_runner=False))


@pytest.mark.usefixtures("ray_session")
def test_apex_flow_two_runners_two_shards() -> None:
    algo = apex_config().build_algo()
    try:
        def enough(result):
            apex = result[APEX_RESULTS]
            versions = [r["weights_seq_no"] for r in algo.runner_reports.values()]
            return (apex["learner_updates"] >= 6 and len(versions) == 2 and min(versions) > 0
                    and min(s["priority_updates"] for s in shard_stats(algo)) > 0)

        result = train_until(algo, enough)
        apex = result[APEX_RESULTS]
        steps = env_steps(result)
        # Complete n-step transitions flowed into both shards, one runner each, every one
        # with the runner's initial priority; all acknowledged ones are stored.
        reports = algo.runner_reports
        for i, stats in enumerate(shard_stats(algo)):
            assert stats["shard_index"] == i and stats["size"] > 0
            assert stats["initial_priorities"] == stats["stored"] >= reports[i + 1]["rows_acked"]
            assert stats["priority_updates"] > 0 and stats["stale_priorities"] == 0
        # All sampled steps but the open windows (<= n - 1 per runner) and the last rollouts.
        assert steps >= sum(s["stored"] for s in shard_stats(algo)) - 2 * 2 * 16
        assert sum(s["stored"] for s in shard_stats(algo)) >= steps - 2 * 2 * 16
        # Priorities: computed per transition, then changed by the learner's |TD|.
        prios = ray.get(algo.replay_shards()[0].priorities.remote())
        assert prios.min() > 0 and not torch.allclose(prios, prios[0].expand_as(prios))
        # Runners: Ape-X epsilons per worker index, weights versions advancing.
        assert reports[1]["epsilon"] == pytest.approx(0.4)
        assert reports[2]["epsilon"] == pytest.approx(0.4 ** 8)
        versions = [r["weights_seq_no"] for r in reports.values()]
        assert 0 < min(versions) <= max(versions) <= apex["weights_version"]
        assert apex["weights_version"] == apex["learner_updates"] - apex[
            "learner_updates"] % 2  # broadcast every 2 learner updates
        # Learner: real updates on 16-sample batches; bounded replay ratio bookkeeping.
        assert apex["trained_samples"] == 16 * apex["learner_updates"]
        assert apex["priority_updates_sent"] == apex["learner_updates"]
        assert apex["replay_ratio"] == pytest.approx(apex["trained_samples"] / steps, rel=0.2)
        assert math.isfinite(float(result["learners"]["default_policy"]["qf_loss"]))
        assert apex["shard_restarts"] == 0 and apex["rows_lost_in_flight"] == 0
        previous = min(versions)
        result = algo.train()
        assert min(r["weights_seq_no"] for r in algo.runner_reports.values()) >= previous
    finally:
        algo.stop()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("num_learners", [1, 2])
def test_apex_on_remote_learners_routes_every_priority_to_its_slot(num_learners: int) -> None:
    """One remote learner, or two DDP learners (gloo) that each take half of every batch:
    training runs, and each sample's |TD| (computed here from the learners' weights before
    the update) reaches the slot it was sampled from in the shard."""
    register_rllib_envs()
    config = apex_config(num_replay_shards=1, replay_shard_capacity=100_000).learners(
        num_learners=num_learners, num_cpus_per_learner=0.5 / num_learners)
    algo = config.build_algo()
    try:
        def enough(result):
            versions = [r["weights_seq_no"] for r in algo.runner_reports.values()]
            return result[APEX_RESULTS]["learner_updates"] >= 2 and bool(versions) and \
                min(versions) > 0

        result = train_until(algo, enough, max_iterations=30)
        apex = result[APEX_RESULTS]
        batch = 16 * num_learners  # train_batch_size_per_learner each
        assert config.total_train_batch_size == batch
        assert apex["trained_samples"] == batch * apex["learner_updates"]
        assert math.isfinite(float(result["learners"]["default_policy"]["qf_loss"]))
        shard = algo.replay_shards()[0]
        reply = ray.get(shard.sample.remote(batch))
        state = algo.learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}")[COMPONENT_LEARNER][
            COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
        module = module_spec(ClusterBranchingEnv(ENV_CONFIG)).build()
        module.make_target_networks()
        module.set_state(state)
        expected = learner_td(module, reply["batch"])
        algo._learn_on(0, reply, env_steps=env_steps(result))
        ray.get(algo._priority_refs)
        prios = ray.get(shard.priorities.remote())[reply["batch"]["indices"]]
        alpha = float(config.replay_buffer_config.get("alpha", 0.6))
        torch.testing.assert_close(prios.float(), ((expected + 1e-6) ** alpha).float(),
                                   rtol=1e-4, atol=1e-5)
        assert shard_stats(algo)[0]["stale_priorities"] == 0
    finally:
        algo.stop()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_apex_survives_a_killed_runner_and_a_killed_shard() -> None:
    algo = apex_config(replay_shard_capacity=400).build_algo()
    try:
        result = train_until(algo, lambda r: r[APEX_RESULTS]["learner_updates"] >= 2)
        old_runner = algo.runner_reports[1]["incarnation"]
        ray.kill(runner_handles(algo)[1], no_restart=False)
        steps = env_steps(result)
        result = train_until(algo, lambda r: algo.runner_reports[1]["incarnation"] != old_runner)
        apex = result[APEX_RESULTS]
        assert apex["runner_restarts"] >= 1
        assert algo.runner_reports[1]["epsilon"] == pytest.approx(0.4)  # re-applied
        assert env_steps(result) > steps

        killed = shard_stats(algo)[0]
        updates = apex["learner_updates"]
        ray.kill(algo.replay_shards()[0], no_restart=False)

        def recovered(result):
            try:
                stats = shard_stats(algo)[0]
            except ray.exceptions.RayError:  # calls fail while the actor restarts
                return False
            return (result[APEX_RESULTS]["shard_restarts"] >= 1 and stats["size"] > 0
                    and stats["incarnation"] != killed["incarnation"])

        result = train_until(algo, recovered)
        apex = result[APEX_RESULTS]
        # Lost: what the dead shard last reported holding, bounded by its capacity.
        assert 0 < apex["shard_transitions_lost"] <= 400
        assert shard_stats(algo)[0]["initial_priorities"] > 0  # runners feed the new one
        result = train_until(algo, lambda r: r[APEX_RESULTS]["learner_updates"] > updates + 4)
        assert env_steps(result) > steps
    finally:
        algo.stop()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_apex_checkpoint_resumes_steps_weights_and_shards(tmp_path: Path) -> None:
    algo = apex_config(checkpoint_replay_shards=True).build_algo()
    try:
        result = train_until(algo, lambda r: r[APEX_RESULTS]["learner_updates"] >= 2)
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        saved_steps = env_steps(result)
        saved_sizes = [s["size"] for s in shard_stats(algo)]
        saved_updates = result[APEX_RESULTS]["learner_updates"]
        weights = learner_weights(algo)
    finally:
        algo.stop()
    restored = ApexBDQ.from_checkpoint(path)
    try:
        assert isinstance(restored.config, ApexBDQConfig)
        assert [s["size"] for s in shard_stats(restored)] == saved_sizes
        for k, v in learner_weights(restored).items():
            torch.testing.assert_close(v, weights[k])
        # The local module (get_module) carries the restored weights too.
        for k, v in restored.get_module().state_dict().items():
            torch.testing.assert_close(v, weights[k])
        result = restored.train()
        assert env_steps(result) >= saved_steps + 64
        assert result[APEX_RESULTS]["learner_updates"] >= saved_updates
    finally:
        restored.stop()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_apex_bdq_learns_the_optimum_of_a_toy_branching_bandit() -> None:
    config = (
        ApexBDQConfig()
        .environment(ToyBranchingBandit)
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5,
                     num_envs_per_env_runner=4, rollout_fragment_length=8)
        .reporting(min_sample_timesteps_per_iteration=256)
        .training(num_replay_shards=2, replay_shard_capacity=5000,
                  num_cpus_per_replay_shard=0.25, broadcast_interval=4, max_replay_ratio=2.0,
                  apex_epsilon=0.8, apex_epsilon_alpha=1.0,
                  n_step=1, lr=2e-3, gamma=0.0, train_batch_size_per_learner=64,
                  num_steps_sampled_before_learning_starts=128,
                  target_network_update_freq=100)
        .rl_module(model_config={"encoder": {"hidden": 32, "macro_hiddens": [32],
                                             "row_hiddens": [8]},
                                 "trunk_hiddens": [32], "head_hiddens": [32]})
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        train_until_optimal(algo)
    finally:
        algo.stop()
