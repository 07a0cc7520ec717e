"""APPO and IMPALA (RLlib's own) on the flat cluster env with the masked actor-critic.

Fast: the masked target network, the algorithm configs, one training iteration
of each (APPO on one remote env runner, IMPALA sampling in the driver), the
``cloudrl train --algo appo`` -> checkpoint -> evaluate round trip, and a tiny
Tune sweep of both read back by ``cloudrl compare``.
"""

from __future__ import annotations

import csv
import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.utils import update_target_network
from ray.rllib.core.rl_module.apis import TARGET_NETWORK_ACTION_DIST_INPUTS
from ray.rllib.utils.torch_utils import FLOAT_MIN

from cloudrl.checkpoint_policy import CheckpointPolicy, is_checkpoint, read_meta
from cloudrl.cli import build_parser, main
from cloudrl.training import TrainConfig, build_algo_config, flat_metrics
from envs.cluster_env import ClusterSchedulingEnv
from models.masked_appo import MaskedAPPOTorchRLModule
from models.masked_ppo import MaskedPPOTorchRLModule

SMALL_ENV = {"n_servers": 5, "sim": {"episode_length": 50}}
BATCH = 64
# One env per runner, fragments of 32 steps: two sample() calls make one train batch.
TINY_RUNNERS = {"num_envs_per_env_runner": 1, "rollout_fragment_length": 32}
TINY_HP = {"train_batch_size_per_learner": BATCH}
LEARNER_KEYS = ("total_loss", "policy_loss", "vf_loss", "entropy")


def _tiny(algo: str, **kwargs: Any) -> TrainConfig:
    return TrainConfig(algo=algo, env=SMALL_ENV, envs_per_runner=1, hidden=16,
                       hparams=dict(TINY_HP), **kwargs)


# -- the masked APPO module, no Ray --------------------------------------------------------

@pytest.fixture(scope="module")
def env() -> ClusterSchedulingEnv:
    return ClusterSchedulingEnv({**SMALL_ENV, "seed_pool": [0]})


def _obs_batch(env: ClusterSchedulingEnv, steps: int = 12) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    rows = [obs]
    for _ in range(steps - 1):
        obs = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))[0]
        rows.append(obs)
    return {k: torch.as_tensor(np.stack([o[k] for o in rows])) for k in rows[0]}


def test_appo_target_logits_are_masked_and_lag_the_policy(env: ClusterSchedulingEnv) -> None:
    module = MaskedAPPOTorchRLModule(observation_space=env.observation_space,
                                     action_space=env.action_space,
                                     model_config={"encoder": {"hidden": 16},
                                                   "head_hiddens": [16]})
    module.make_target_networks()
    obs = _obs_batch(env)
    batch = {Columns.OBS: obs}
    feasible = obs["action_mask"] > 0.5
    assert (~feasible).any() and feasible.any(dim=-1).all()

    target = module.forward_target(batch)[TARGET_NETWORK_ACTION_DIST_INPUTS]
    main_logits = module.forward_train(batch)[Columns.ACTION_DIST_INPUTS]
    assert torch.allclose(target, main_logits)  # a fresh target is a copy of the actor
    assert (target[~feasible] < FLOAT_MIN / 2).all()
    assert torch.isfinite(torch.log_softmax(target, -1)[feasible]).all()
    probs = torch.softmax(target, -1)
    assert probs[~feasible].max() == 0.0

    with torch.no_grad():  # the actor moves; the target stays until it is updated
        for p in module.pi.parameters():
            p.add_(0.5)
    assert not torch.allclose(module.forward_target(batch)[TARGET_NETWORK_ACTION_DIST_INPUTS],
                              module.forward_train(batch)[Columns.ACTION_DIST_INPUTS])
    for main_net, target_net in module.get_target_network_pairs():
        update_target_network(main_net=main_net, target_net=target_net, tau=1.0)
    assert torch.allclose(module.forward_target(batch)[TARGET_NETWORK_ACTION_DIST_INPUTS],
                          module.forward_train(batch)[Columns.ACTION_DIST_INPUTS])
    assert {"_old_encoder", "_old_pi", "vf"} <= set(module.get_non_inference_attributes())
    assert not any(p.requires_grad for p in module._old_pi.parameters())


# -- configs, no Ray -----------------------------------------------------------------------

@pytest.mark.parametrize("algo,module_cls,learner", [
    ("appo", MaskedAPPOTorchRLModule, "APPOTorchLearner"),
    ("impala", MaskedPPOTorchRLModule, "IMPALATorchLearner")])
def test_algo_config_uses_the_masked_module_and_batch_sized_iterations(
        algo: str, module_cls: type, learner: str) -> None:
    cfg = TrainConfig(algo=algo, env=SMALL_ENV, hparams={"lr": 1e-3})
    assert cfg.interface() == "flat"
    config = build_algo_config(cfg)
    assert config.rl_module_spec.module_class is module_cls
    assert config.get_default_learner_class().__name__ == learner
    assert (config.num_env_runners, config.num_learners) == (0, 0)  # all in the driver
    assert config.lr == 1e-3 and config.vtrace
    assert config.timeout_s_sampler_manager == 0.1  # remote runners: wait, do not spin
    assert config.min_time_s_per_iteration == 0
    assert config.min_sample_timesteps_per_iteration == config.total_train_batch_size == 800
    config.validate()


def test_train_config_names_the_algorithms_and_flat_metrics_reads_impala_means() -> None:
    with pytest.raises(ValueError, match="'appo', 'impala', 'apex_bdq'"):
        TrainConfig(algo="a3c")
    impala = {"env_runners": {"num_env_steps_sampled_lifetime": 64},
              "learners": {"default_policy": {"pi_loss": -64.0, "mean_pi_loss": -1.0,
                                              "vf_loss": 32.0, "mean_vf_loss": 0.5,
                                              "total_loss": -0.7, "entropy": 2.0}}}
    assert flat_metrics(impala) == {"env_steps": 64.0, "policy_loss": -1.0, "vf_loss": 0.5,
                                    "total_loss": -0.7, "entropy": 2.0}


def test_sweep_config_accepts_appo_and_impala() -> None:
    from cloudrl.sweep import SweepConfig, check_algo_configs

    sweep = SweepConfig(algos=["appo", "impala"], n_servers=5,
                        hparams={"appo": {"clip_param": 0.3}, "impala": TINY_HP})
    check_algo_configs(sweep)
    assert sweep.interfaces() == ["flat"]
    assert sweep.train_config("appo", "poisson", 0).hparams == {"clip_param": 0.3}
    args = build_parser().parse_args(["sweep", "--algos", "appo", "impala"])
    assert args.algos == ["appo", "impala"]
    from cloudrl.config_loader import ConfigError, build_config
    with pytest.raises(ConfigError, match=r"hparams\.appo\.clip"):
        build_config(SweepConfig, {"algos": ["appo"], "hparams": {"appo": {"clip": 0.3}}})


# -- training with Ray ---------------------------------------------------------------------

@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("algo,runners", [("appo", 1), ("impala", 0)])
def test_one_iteration_samples_feasibly_and_learns(algo: str, runners: int) -> None:
    config = build_algo_config(_tiny(algo, num_env_runners=runners))
    algo_obj = config.env_runners(**TINY_RUNNERS).build_algo()
    try:
        result = algo_obj.train()
    finally:
        algo_obj.stop()
    metrics = flat_metrics(result)
    assert metrics["env_steps"] >= BATCH
    for key in LEARNER_KEYS:
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["entropy"] > 0
    # 50-tick episodes end inside the first 64 steps: the mask held on every step.
    assert metrics["invalid_actions"] == 0.0 and metrics["episode_return_mean"] < 0


@pytest.mark.usefixtures("ray_session")
def test_cli_train_appo_then_evaluate_checkpoint(tmp_path, capsys, monkeypatch) -> None:
    # --eval-seeds writes its table under results/ of the current directory: the tmp dir
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "appo"
    code = main(["train", "--algo", "appo", "--n-servers", "5", "--episode-length", "50",
                 "--env-steps", str(BATCH), "--hparams", json.dumps(TINY_HP),
                 "--out", str(out), "--eval-seeds", "2"])
    assert code == 0 and is_checkpoint(out)
    assert len(list((tmp_path / "results").glob("eval_appo_*.json"))) == 1
    meta = read_meta(out)
    assert (meta["algo"], meta["interface"]) == ("appo", "flat")
    text = capsys.readouterr().out
    assert "iter   1" in text and "appo:appo" in text and "power_aware" in text

    sampler = CheckpointPolicy(out)  # an actor-critic: samples its masked distribution
    assert sampler.stochastic and not CheckpointPolicy(out, mode="greedy").stochastic
    env = ClusterSchedulingEnv(sampler.env_config)

    def rollout() -> list[int]:
        obs, _ = env.reset(seed=1_000_000)
        sampler.reset()
        actions = []
        for _ in range(40):
            action = sampler.act(obs)
            assert obs["action_mask"][action] == 1.0
            actions.append(action)
            obs, _, _, _, info = env.step(action)
            assert not info["invalid_action"]
        return actions

    first = rollout()
    assert rollout() == first and len(set(first)) > 1
    # Acting needs no target copies: only the learner makes them.
    assert not hasattr(sampler.module, "_old_pi")


@pytest.mark.usefixtures("ray_session")
def test_tune_sweep_of_appo_and_impala_then_compare(tmp_path, capsys) -> None:
    import mlflow

    from cloudrl.sweep import SweepConfig, run_sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = SweepConfig(
        algos=["appo", "impala"], run_seeds=[0], workloads=["poisson"], n_servers=5,
        episode_length=50, env_steps=BATCH, hidden=16,
        hparams={"appo": TINY_HP, "impala": TINY_HP}, env_runners=TINY_RUNNERS,
        heuristics=["power_aware"], eval_seeds=2, eval_workers=1, experiment="test-appo",
        storage_path=str(tmp_path / "tune"), tracking_uri=uri, verbose=0)
    out = run_sweep(sweep)
    assert out["failed"] == []
    assert sorted(row["policy"] for row in out["learned"]) == ["appo", "impala"]
    for row in out["learned"]:
        assert is_checkpoint(row["checkpoint"]) and row["env_steps"] >= BATCH
        assert read_meta(row["checkpoint"])["algo"] == row["policy"]
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["test-appo"])
    learned = runs[runs["tags.kind"] == "learned"]
    assert set(learned["tags.interface"]) == {"flat"}
    assert learned["metrics.policy_loss"].notna().all()

    assert main(["compare", "--experiment", "test-appo", "--tracking-uri", uri,
                 "--out", str(tmp_path / "compare")]) == 0
    printed = capsys.readouterr().out
    assert "appo (1 run seed)" in printed and "impala (1 run seed)" in printed
    with (tmp_path / "compare" / "comparison.csv").open() as f:
        policies = {r["policy"] for r in csv.DictReader(f)}
    assert policies == {"power_aware", "appo (1 run seed)", "impala (1 run seed)"}
