"""cloudrl/connectors/stacked_batch.py: the lean env-runner pipelines sample exactly the
episodes RLlib's default pipelines sample (same seeds, same module, same RNG draws)."""

from __future__ import annotations

import numpy as np
import pytest
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from cloudrl.training import TrainConfig, build_algo_config

SMALL = {"n_servers": 5, "sim": {"episode_length": 20}}


def _episodes(algo: str, stacked: bool, explore: bool, steps: int = 75):
    cfg = TrainConfig(algo=algo, env=SMALL, envs_per_runner=3, hidden=8, run_seed=3,
                      stacked_connectors=stacked)
    runner = SingleAgentEnvRunner(config=build_algo_config(cfg))
    try:
        names = ([type(c).__name__ for c in runner._env_to_module.connectors],
                 [type(c).__name__ for c in runner._module_to_env.connectors])
        episodes = runner.sample(num_timesteps=steps, explore=explore)
        episodes += runner.sample(num_timesteps=steps, explore=explore)  # across autoresets
    finally:
        runner.stop()
    return names, episodes


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("algo,explore", [("ppo", True), ("ppo", False), ("bdq", True),
                                          ("dqn", True)])
def test_stacked_pipelines_sample_the_default_pipelines_episodes(algo, explore):
    (lean_e2m, lean_m2e), lean = _episodes(algo, stacked=True, explore=explore)
    (stock_e2m, stock_m2e), stock = _episodes(algo, stacked=False, explore=explore)
    assert lean_e2m == ["StackLatestObservations"] and lean_m2e == ["BatchedActionsToNumpy"]
    assert "BatchIndividualItems" in stock_e2m and "GetActions" in stock_m2e
    assert [len(e) for e in lean] == [len(e) for e in stock] and sum(map(len, lean)) >= 150
    assert any(e.is_done for e in lean)
    for x, y in zip(lean, stock, strict=True):
        _same(x.get_observations(), y.get_observations())
        _same(x.get_actions(), y.get_actions())
        _same(x.get_rewards(), y.get_rewards())
        assert x.is_terminated == y.is_terminated and x.is_truncated == y.is_truncated
        keys = set(x.extra_model_outputs)
        assert keys == set(y.extra_model_outputs)
        for key in keys - {"weights_seq_no"}:
            _same(x.get_extra_model_outputs(key), y.get_extra_model_outputs(key))
    if algo == "ppo":  # PPO's learner needs both; the stacked path must record them
        assert {Columns.ACTION_LOGP, Columns.ACTION_DIST_INPUTS} <= keys


def test_stacked_connectors_refuse_configs_they_do_not_cover():
    from cloudrl.connectors.stacked_batch import use_stacked_batch_connectors

    config = build_algo_config(TrainConfig(algo="ppo", env=SMALL, stacked_connectors=False))
    config.environment(normalize_actions=True)
    with pytest.raises(ValueError, match="normalize_actions"):
        use_stacked_batch_connectors(config)
    assert build_algo_config(TrainConfig(algo="hierarchical", env=SMALL)) \
        .add_default_connectors_to_env_to_module_pipeline is True  # multi-agent: RLlib's
    assert build_algo_config(TrainConfig(algo="gated_dqn", env=SMALL)) \
        .add_default_connectors_to_module_to_env_pipeline is True  # not a cluster env id


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("first,then", [(False, True),
                                        pytest.param(True, False, marks=pytest.mark.slow)])
def test_resume_across_the_connector_setting(tmp_path, first, then):
    """A checkpoint written with one connector setting resumes with the other (a run
    checkpointed before the stacked connectors existed goes on with them, and back)."""
    from cloudrl.training import train

    def cfg(stacked: bool, steps: int) -> TrainConfig:
        return TrainConfig(algo="ppo", env={**SMALL, "sim": {"episode_length": 20}},
                           envs_per_runner=2, hidden=8, env_steps=steps,
                           checkpoint_dir=str(tmp_path / "ckpt"), resume=True,
                           stacked_connectors=stacked,
                           hparams={"train_batch_size_per_learner": 40, "minibatch_size": 20,
                                    "num_epochs": 1})

    _, history = train(cfg(first, 40))
    _, resumed = train(cfg(then, 80))
    assert resumed[0]["env_steps"] > history[-1]["env_steps"]
    assert resumed[-1]["env_steps"] >= 80
