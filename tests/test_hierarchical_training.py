"""The hierarchical supervisor under RLlib: PPO on the supervisor in a MultiRLModule,
checkpoint round trip, evaluation through the protocol, and CLI errors."""

from __future__ import annotations

import numpy as np
import pytest

from cloudrl.algorithms.hierarchical.hparams import HierarchicalHparams
from cloudrl.training import TrainConfig, build_algo_config, write_meta
from envs.hierarchical_env import SUPERVISOR

ENV = {"n_servers": 6, "sim": {"episode_length": 50}}
HP = {"sub_agents": ["power_aware", "sjf"], "k": 5, "train_batch_size_per_learner": 100,
      "minibatch_size": 50, "num_epochs": 1, "supervisor_hidden": 16}


def tiny_config(tmp_path, **hp) -> TrainConfig:
    return TrainConfig(algo="hierarchical", env=ENV, env_steps=100, envs_per_runner=1,
                       checkpoint_dir=str(tmp_path / "hier"), hparams={**HP, **hp})


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    """One PPO iteration on the supervisor, saved; the trained module's logits kept."""
    tmp_path = tmp_path_factory.mktemp("hier")
    cfg = tiny_config(tmp_path)
    algo = build_algo_config(cfg).build_algo()
    try:
        result = algo.train()
        module = algo.get_module(SUPERVISOR)
        macros = np.random.default_rng(0).random((4, module.observation_space.shape[0]),
                                                 dtype=np.float32)
        import torch

        with torch.no_grad():
            logits = module.forward_inference(
                {"obs": torch.from_numpy(macros)})["action_dist_inputs"].numpy()
        path = tmp_path / "hier"
        algo.save_to_path(str(path))
        write_meta(path, cfg)
        modules = set(algo.env_runner.module.keys())  # the runner's MultiRLModule
    finally:
        algo.stop()
    return {"path": path, "macros": macros, "logits": logits, "result": result,
            "modules": modules, "cfg": cfg}


def test_only_the_supervisor_is_a_module_and_it_learns(trained) -> None:
    assert trained["modules"] == {SUPERVISOR}
    learner = trained["result"]["learners"][SUPERVISOR]
    assert np.isfinite(learner["total_loss"])
    shares = trained["result"]["env_runners"]["hierarchy"]
    assert set(shares) == {"share_sub_0", "share_sub_1"}
    assert sum(shares.values()) == pytest.approx(1.0)


def test_checkpoint_round_trip(trained) -> None:
    from cloudrl.algorithms.hierarchical.policy import HierarchicalPolicy
    from cloudrl.checkpoint_policy import is_checkpoint, load_policy

    path = trained["path"]
    assert is_checkpoint(path)
    policy = load_policy(path)
    assert isinstance(policy, HierarchicalPolicy)
    assert policy.k == 5 and policy.sub_agent_names == ["power_aware", "sjf"]
    logits = np.stack([policy.supervisor.logits(m) for m in trained["macros"]])
    np.testing.assert_allclose(logits, trained["logits"], rtol=0, atol=1e-6)
    assert [policy.supervisor.choose(m) for m in trained["macros"]] == \
        list(np.argmax(trained["logits"], axis=1))


def test_restored_algorithm_has_the_same_supervisor(trained) -> None:
    import torch

    algo = build_algo_config(trained["cfg"]).build_algo()
    try:
        algo.restore_from_path(str(trained["path"]))
        module = algo.get_module(SUPERVISOR)
        with torch.no_grad():
            logits = module.forward_inference(
                {"obs": torch.from_numpy(trained["macros"])})["action_dist_inputs"].numpy()
    finally:
        algo.stop()
    np.testing.assert_allclose(logits, trained["logits"], rtol=0, atol=1e-6)


def test_evaluation_protocol_runs_the_checkpoint(trained) -> None:
    from cloudrl.checkpoint_policy import load_policy
    from cloudrl.evaluate import EvalConfig, evaluate, make_env, run_episode, summary_rows
    from cloudrl.protocol import seeds_for
    from envs.env_config import EnvConfig

    cfg = EvalConfig(env=ENV, policies=[str(trained["path"]), "power_aware"], n_seeds=2,
                     workers=1)
    results = evaluate(cfg, progress=False)
    rows = {r["policy"]: r for r in summary_rows(results)}
    assert set(rows) == {"hierarchical:hier", "power_aware"}
    direct = load_policy(trained["path"])
    env = make_env(EnvConfig.model_validate(ENV), "flat")
    mine = [r for r in results if r.policy == "hierarchical:hier"]
    for seed, r in zip(seeds_for("test", 2), mine, strict=True):
        assert run_episode(direct, env, seed).as_dict() == r.as_dict()
        assert [t for t, _ in direct.decisions] == list(range(0, 50, 5))


def test_hparams_validate_and_name_the_field() -> None:
    assert HierarchicalHparams().training_kwargs(_run())["sub_agents"] == ["power_aware", "sjf"]
    with pytest.raises(ValueError, match="sub-agent 'nope' is neither"):
        HierarchicalHparams(sub_agents=["nope"])
    with pytest.raises(ValueError, match="k"):
        HierarchicalHparams(k=0)
    with pytest.raises(ValueError, match="alignment"):
        HierarchicalHparams(alignment_weight=1.0)


def _run():
    from cloudrl.algorithms.hparams import RunShape

    return RunShape(env_steps=100)


@pytest.mark.parametrize("hparams, field", [
    ('{"sub_agents": ["nope"]}', "hparams.sub_agents"),
    ('{"k": 0}', "hparams.k"),
    ('{"sub_agents": []}', "hparams.sub_agents"),
])
def test_cli_bad_hparams_one_line_exit_2(hparams: str, field: str, capsys) -> None:
    from cloudrl.cli import main

    code = main(["train", "--algo", "hierarchical", "--hparams", hparams])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and field in err, err


def _served_states(policy, n: int = 6) -> list[dict]:
    """States along power_aware episodes (queues, asleep servers), as the service sees them."""
    env, out = policy.env, []
    for seed in range(n):
        obs, _ = env.reset(seed=seed)
        for _ in range(7 * seed):
            obs, *_ = env.step(policy.fallback.act_batch([obs])[0])
        out.append(obs)
    return out


class _Infeasible:
    """A broken sub-agent: always a masked-out action when there is one."""

    name = "broken"

    def reset(self) -> None:
        pass

    def act(self, obs):
        banned = np.flatnonzero(obs["action_mask"] == 0)
        return int(banned[0]) if banned.size else 0


def test_served_hierarchical_decisions_are_feasible_and_say_who_decided(trained) -> None:
    import asyncio

    from envs.env_config import EnvConfig
    from serve_apps.runtime import ServedPolicy
    from serve_apps.shield import Shield

    served = ServedPolicy(str(trained["path"]), "v1", EnvConfig(), "flat")
    assert served.interface == "flat" and served.env.n_servers == 6  # the checkpoint's env
    states = _served_states(served)
    shield = Shield(served, timeout_s=30.0)
    outcomes = asyncio.run(shield.decide(states))
    supervisor = served.model.policy.supervisor
    for obs, outcome in zip(states, outcomes, strict=True):
        assert outcome.by_model
        assert outcome.decided_by == ["power_aware", "sjf"][supervisor.choose(obs["macro"])]
        assert served.is_feasible(outcome.action, obs)
        served.describe(outcome.action, obs)
    # a sub-agent gone wrong: the shield answers with the fallback, still feasible
    served.model.policy.sub_agents[:] = [_Infeasible(), _Infeasible()]
    outcomes = asyncio.run(Shield(served, timeout_s=30.0).decide(states))
    assert any(not o.by_model for o in outcomes)
    for obs, outcome in zip(states, outcomes, strict=True):
        assert served.is_feasible(outcome.action, obs)
        assert (outcome.decided_by is None) == (not outcome.by_model)
        if not outcome.by_model:
            assert outcome.reason == "infeasible"
