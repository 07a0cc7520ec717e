"""`cloudrl train` end to end: RLlib on the train seeds, checkpoint, test-seed evaluation."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cloudrl.checkpoint_policy import CheckpointPolicy, is_checkpoint, read_meta
from cloudrl.cli import main
from cloudrl.protocol import TRAIN_SEEDS
from cloudrl.training import TrainConfig, build_algo_config, flat_metrics
from envs.cluster_env import ClusterSchedulingEnv

TINY_PPO = {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1}


def test_train_config_uses_only_train_seeds_and_scales_reward():
    cfg = TrainConfig(env={"n_servers": 5}, reward_scale=0.5)
    env_cfg = cfg.train_env_config()
    assert tuple(env_cfg["seed_pool"]) == TRAIN_SEEDS
    assert env_cfg["reward_scale"] == 0.5
    algo_cfg = build_algo_config(cfg)
    assert algo_cfg.env_config["seed_pool"] == env_cfg["seed_pool"]
    assert algo_cfg.num_envs_per_env_runner == cfg.envs_per_runner


def test_flat_metrics_reads_the_small_key_set():
    result = {"env_runners": {"num_env_steps_sampled_lifetime": 128, "episode_return_mean": -3.0,
                              "cluster": {"energy_kwh": 1.5, "sla_violation_rate": 0.25}},
              "learners": {"default_policy": {"policy_loss": 0.1, "ignored": 9.0}}}
    assert flat_metrics(result) == {"env_steps": 128.0, "episode_return_mean": -3.0,
                                    "energy_kwh": 1.5, "sla_violation_rate": 0.25,
                                    "policy_loss": 0.1}


def test_flat_metrics_drops_episode_metrics_of_an_iteration_without_episode_ends():
    nan = float("nan")
    result = {"env_runners": {"num_env_steps_sampled_lifetime": 2016, "episode_return_mean": nan,
                              "cluster": {"energy_kwh": nan, "sla_violation_rate": nan}},
              "learners": {"default_policy": {"qf_loss": 0.5}}}
    assert flat_metrics(result) == {"env_steps": 2016.0, "qf_loss": 0.5}


@pytest.mark.usefixtures("ray_session")
def test_cli_train_then_evaluate_checkpoint(tmp_path, capsys, monkeypatch):
    # --eval-seeds writes its table under results/ of the current directory: the tmp dir
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "ppo"
    code = main(["train", "--algo", "ppo", "--n-servers", "5", "--episode-length", "50",
                 "--env-steps", "64", "--hparams", json.dumps(TINY_PPO), "--out", str(out),
                 "--eval-seeds", "2"])
    assert code == 0
    assert is_checkpoint(out)
    assert [p.suffix for p in sorted((tmp_path / "results").glob("eval_ppo_*"))] == [
        ".csv", ".json"]
    meta = read_meta(out)
    assert meta["algo"] == "ppo" and meta["interface"] == "flat"
    assert meta["env"]["sim"]["fleet"]["n_servers"] == 5
    text = capsys.readouterr().out
    assert "iter   1" in text and "ppo:ppo" in text and "power_aware" in text

    policy = CheckpointPolicy(out, mode="greedy")
    env = ClusterSchedulingEnv(policy.env_config)
    obs, _ = env.reset(seed=1_000_000)
    for _ in range(30):  # greedy, feasible, deterministic
        action = policy.act(obs)
        assert obs["action_mask"][action] == 1.0
        assert action == policy.act(obs)
        obs, _, _, _, info = env.step(action)
        assert not info["invalid_action"]

    sampler = CheckpointPolicy(out)  # PPO default: sample the masked distribution
    assert sampler.stochastic and not CheckpointPolicy(out, mode="greedy").stochastic

    def rollout() -> list[int]:
        obs, _ = env.reset(seed=1_000_001)
        sampler.reset()
        actions = []
        for _ in range(40):
            a = sampler.act(obs)
            assert obs["action_mask"][a] == 1.0
            actions.append(a)
            obs = env.step(a)[0]
        return actions

    first = rollout()
    assert rollout() == first  # reseeded at reset: seed-exact episodes
    assert len(set(first)) > 1
    with pytest.raises(ValueError, match="mode"):
        CheckpointPolicy(out, mode="best")
    with pytest.raises(ValueError, match="n_servers=5"):
        policy.check_env(ClusterSchedulingEnv({"n_servers": 6}).config)
    assert np.isfinite(policy.scores(obs)[obs["action_mask"] > 0]).all()


def test_cli_train_rejects_bad_hparams_json(capsys):
    assert main(["train", "--hparams", "{not json"]) == 2
    assert "--hparams is not valid JSON" in capsys.readouterr().err


def test_apex_bdq_needs_remote_actors_and_a_cluster_that_fits_them():
    with pytest.raises(ValueError, match="num_env_runners: apex_bdq"):
        TrainConfig(algo="apex_bdq")
    cfg = TrainConfig(algo="apex_bdq", num_env_runners=2)
    assert cfg.interface() == "branching"
    assert build_algo_config(cfg).num_replay_shards == 2


@pytest.mark.usefixtures("ray_session")
def test_oversized_actor_request_fails_fast_naming_the_knobs():
    from cloudrl.config_loader import ConfigError
    from cloudrl.training import check_cluster_fits

    cfg = TrainConfig(algo="apex_bdq", num_env_runners=2)  # 2 runners + 2 shards at 1 CPU
    with pytest.raises(ConfigError, match="need 4 CPUs, the Ray cluster has 2"):
        check_cluster_fits(build_algo_config(cfg))
    fits = TrainConfig(algo="apex_bdq", num_env_runners=2,
                       hparams={"num_cpus_per_replay_shard": 0})
    check_cluster_fits(build_algo_config(fits))
    remote = TrainConfig(algo="apex_bdq", num_env_runners=2, num_learners=1,
                         hparams={"num_cpus_per_replay_shard": 0})  # + 1 learner actor
    with pytest.raises(ConfigError, match="need 3 CPUs.*lower num_env_runners or num_learners"):
        check_cluster_fits(build_algo_config(remote))


@pytest.mark.usefixtures("ray_session")
def test_cli_train_apex_bdq_then_evaluate(tmp_path, capsys, monkeypatch):
    # --eval-seeds writes its table under results/ of the current directory: the tmp dir
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "apex"
    hparams = {"train_batch_size_per_learner": 16, "num_steps_sampled_before_learning_starts": 100,
               "num_cpus_per_replay_shard": 0}
    code = main(["train", "--algo", "apex_bdq", "--num-env-runners", "2", "--n-servers", "5",
                 "--episode-length", "50", "--env-steps", "300", "--hparams",
                 json.dumps(hparams), "--out", str(out), "--eval-seeds", "2"])
    assert code == 0 and is_checkpoint(out)
    table = capsys.readouterr().out
    assert "apex_bdq:apex" in table and "interface branching" in table


@pytest.mark.usefixtures("ray_session")
def test_resume_continues_the_env_step_counter_from_the_last_checkpoint(tmp_path, capsys):
    out = tmp_path / "ppo"
    base = ["train", "--algo", "ppo", "--n-servers", "5", "--episode-length", "50",
            "--hparams", json.dumps(TINY_PPO), "--out", str(out), "--checkpoint-every", "1"]
    assert main([*base, "--env-steps", "128"]) == 0
    first = [int(x) for x in re.findall(r"env_steps\s+(\d+)", capsys.readouterr().out)]
    assert first[-1] >= 128
    assert main([*base, "--env-steps", "256", "--resume"]) == 0
    resumed = [int(x) for x in re.findall(r"env_steps\s+(\d+)", capsys.readouterr().out)]
    assert resumed[0] > first[-1]  # counted on from the checkpoint, not from zero
    assert resumed[-1] >= 256 and len(resumed) < len(first) + 3


# The hyperparameter defaults of every algorithm as they were before the algorithm table
# (copied from the old ``training._*_defaults`` functions): the README's measured results
# depend on them. E env steps, R env runners.
E, R = 30_000, 3
DQN_DEFAULTS = {
    "lr": 5e-4, "gamma": 0.99, "train_batch_size_per_learner": 64, "double_q": True,
    "dueling": False, "n_step": 3, "target_network_update_freq": 1000,
    "num_steps_sampled_before_learning_starts": 2000,  # min(2000, E // 5)
    "epsilon": [[0, 1.0], [15_000, 0.05]],  # [[0, 1], [max(1, E // 2), 0.05]]
    "replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 100_000,
                             "alpha": 0.6, "beta": 0.4},
    "grad_clip": 10.0}
BDQ_DEFAULTS = {k: v for k, v in DQN_DEFAULTS.items() if k not in ("double_q", "dueling")}
IMPALA_DEFAULTS = {
    "lr": 3e-4, "gamma": 0.99, "train_batch_size_per_learner": 800, "entropy_coeff": 0.01,
    "vf_loss_coeff": 0.5, "grad_clip": 1.0, "vtrace_clip_rho_threshold": 1.0,
    "vtrace_clip_pg_rho_threshold": 1.0, "timeout_s_sampler_manager": 0.1}
TODAYS_DEFAULTS = {
    "ppo": {"lr": 3e-4, "gamma": 0.99, "lambda_": 0.95, "train_batch_size_per_learner": 2000,
            "minibatch_size": 250, "num_epochs": 4, "entropy_coeff": 0.01, "clip_param": 0.2,
            "vf_loss_coeff": 0.5, "vf_clip_param": 100.0, "grad_clip": 1.0},
    "dqn": DQN_DEFAULTS,
    "bdq": BDQ_DEFAULTS,
    "impala": IMPALA_DEFAULTS,
    "appo": {**IMPALA_DEFAULTS, "clip_param": 0.2, "use_kl_loss": False,
             "circular_buffer_num_batches": 8, "circular_buffer_iterations_per_batch": 2,
             "target_network_update_freq": 2},
    "apex_bdq": {**{k: v for k, v in BDQ_DEFAULTS.items() if k != "epsilon"},
                 "num_replay_shards": 2},  # min(2, R)
}


@pytest.mark.parametrize("algo", sorted(TODAYS_DEFAULTS))
def test_each_algorithms_rllib_config_gets_the_documented_defaults(algo):
    cfg = TrainConfig(algo=algo, env_steps=E, num_env_runners=R)
    config = build_algo_config(cfg)
    for key, value in TODAYS_DEFAULTS[algo].items():
        got = getattr(config, key)
        if key == "replay_buffer_config":
            got = {k: got[k] for k in value}
        assert got == value, key
    if algo in ("bdq", "apex_bdq"):
        assert config.double_q is True  # BDQConfig's own double-Q target


@pytest.mark.parametrize("algo", sorted(TODAYS_DEFAULTS))
def test_the_algorithm_tables_defaults_are_todays_values(algo):
    from cloudrl.algorithms.hparams import RunShape
    from cloudrl.algorithms.specs import ALGORITHMS

    assert ALGORITHMS[algo].training_kwargs({}, RunShape(E, R)) == TODAYS_DEFAULTS[algo]
    assert TrainConfig(algo=algo, env_steps=E, num_env_runners=R).training_kwargs() == \
        TODAYS_DEFAULTS[algo]


def test_run_dependent_defaults_follow_the_budget_and_the_runners():
    small = TrainConfig(algo="dqn", env_steps=1000).training_kwargs()
    assert small["num_steps_sampled_before_learning_starts"] == 200
    assert small["epsilon"] == [[0, 1.0], [500, 0.05]]
    assert TrainConfig(algo="apex_bdq", num_env_runners=1).training_kwargs()[
        "num_replay_shards"] == 1
    given = TrainConfig(algo="dqn", hparams={"epsilon": [[0, 0.5], [10, 0.0]]})
    assert given.training_kwargs()["epsilon"] == [[0, 0.5], [10, 0.0]]


def test_hparams_are_typed_per_algorithm_and_errors_name_the_key():
    from pydantic import ValidationError

    cfg = TrainConfig(algo="dqn", hparams={"lr": "1e-4", "replay_buffer_config":
                                           {"capacity": 5000}})
    assert cfg.hparams == {"lr": 1e-4, "replay_buffer_config": {"capacity": 5000}}
    kwargs = cfg.training_kwargs()
    assert kwargs["lr"] == 1e-4 and kwargs["replay_buffer_config"] == {
        "type": "PrioritizedEpisodeReplayBuffer", "capacity": 5000, "alpha": 0.6, "beta": 0.4}
    cases = [("ppo", {"lr": -1.0}, "hparams.lr"),
             ("ppo", {"learning_rate": 1}, "hparams.learning_rate"),
             ("dqn", {"replay_buffer_config": {"capacity": "big"}},
              "hparams.replay_buffer_config.capacity"),
             ("ppo", {"double_q": True}, "hparams.double_q"),  # a DQN key, not PPO's
             ("apex_bdq", {"epsilon": 0.1}, "hparams.epsilon")]  # Ape-X: per-actor epsilon
    for algo, hparams, where in cases:
        runners = 1 if algo == "apex_bdq" else 0
        with pytest.raises(ValidationError) as info:
            TrainConfig(algo=algo, num_env_runners=runners, hparams=hparams)
        locs = [".".join(map(str, e["loc"])) for e in info.value.errors()]
        assert locs == [where], (algo, hparams)


def test_apex_bdq_hparams_take_the_alignment_heads_settings_like_bdq(tmp_path):
    from pydantic import ValidationError

    given = {"alignment_weight": 0.1, "alignment_pairs": str(tmp_path / "pairs"),
             "alignment_batch": 8, "alignment_trunk_grad_scale": 0.5}
    cfg = TrainConfig(algo="apex_bdq", num_env_runners=1, hparams=given)
    kwargs = cfg.training_kwargs()
    assert {k: kwargs[k] for k in given} == given
    assert kwargs["num_replay_shards"] == 1
    config = build_algo_config(cfg)  # ApexBDQConfig takes them as BDQConfig's
    assert (config.alignment_weight, config.alignment_batch) == (0.1, 8)
    for hparams, where in [({"alignment_weight": -0.1}, "hparams.alignment_weight"),
                           ({"alignment_batch": 0}, "hparams.alignment_batch"),
                           ({"alignment_wieght": 0.1}, "hparams.alignment_wieght")]:
        with pytest.raises(ValidationError) as info:
            TrainConfig(algo="apex_bdq", num_env_runners=1, hparams=hparams)
        assert [".".join(map(str, e["loc"])) for e in info.value.errors()] == [where]


def test_cli_train_hparams_json_keeps_working_and_bad_keys_exit_2(capsys, monkeypatch):
    import cloudrl.training as training
    from cloudrl.algorithms.specs import ALGOS
    from cloudrl.cli import build_parser

    seen = {}

    def fake_train(cfg, on_iteration=None):
        seen["lr"] = build_algo_config(cfg).lr
        return "ckpt", []

    monkeypatch.setattr(training, "train", fake_train)
    monkeypatch.setattr("cloudrl.ray_utils.init_ray", lambda *a, **k: None)
    assert main(["train", "--hparams", '{"lr": 1e-4}']) == 0
    assert seen["lr"] == 1e-4
    assert main(["train", "--algo", "dqn", "--hparams", '{"lr": 1e-4, "n_stepz": 2}']) == 2
    err = capsys.readouterr().err
    assert "hparams.n_stepz" in err and "Traceback" not in err
    train_parser = build_parser()._subparsers._group_actions[0].choices["train"]
    algo_action = next(a for a in train_parser._actions if a.dest == "algo")
    assert tuple(algo_action.choices) == ALGOS
