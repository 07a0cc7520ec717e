"""``cloudrl loop retrain``: feedback watermark, reward model drift, and a challenger that is
registered only when it is no worse than the champion on the validation seeds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cloudrl.cli import main
from cloudrl.loop import registry

ENV = {"n_servers": 6}


def make_checkpoint(out: Path, algo: str, seed: int = 0, hidden: int = 16,
                    env: dict | None = None) -> Path:
    """A real cloudrl checkpoint of ``algo`` with freshly initialised weights (no training):
    the RLModule RLlib builds for the env, saved where ``cloudrl train`` saves it."""
    import torch
    from ray.tune.registry import ENV_CREATOR, _global_registry

    from cloudrl.checkpoint_policy import MODULE_SUBDIR
    from cloudrl.training import TrainConfig, build_algo_config, write_meta

    cfg = TrainConfig(algo=algo, env=env or ENV, hidden=hidden, run_seed=seed)
    config = build_algo_config(cfg)
    creator = _global_registry.get(ENV_CREATOR, config.env)
    torch.manual_seed(seed)
    module = config.get_rl_module_spec(env=creator(config.env_config)).build()
    module.save_to_path(str(out / MODULE_SUBDIR))
    write_meta(out, cfg)
    return out


def operator_pairs(n: int, interface: str, seed0: int = 0, steps: int = 6,
                   env_config: dict | None = None) -> list[dict]:
    """Simulated operator judgements: two heuristics from the same state, the one with the
    larger true env reward over the segment preferred (trajectories as the service gets)."""
    from cloudrl.heuristics import make_heuristic
    from cloudrl.policy import make_env
    from serve_apps.state import state_of

    names = ("power_aware", "round_robin", "ffd", "sjf")
    pairs = []
    for i in range(n):
        sides = []
        for name in (names[0], names[1 + i % 3]):
            env = make_env(env_config or ENV, interface)
            policy = make_heuristic(name, interface)
            obs, _ = env.reset(seed=seed0 + i)
            policy.reset()
            body, total = [], 0.0
            for _ in range(steps):
                action = policy.act(obs)
                body.append({"state": state_of(env.sim),
                             "action": np.asarray(action).tolist()})
                obs, reward, *_ = env.step(action)
                total += reward
            sides.append(({"steps": body}, total))
        (a, ra), (b, rb) = sides if i % 2 else sides[::-1]
        preferred = "a" if ra > rb else "b" if rb > ra else "equal"
        pairs.append({"a": {"trajectory": a}, "b": {"trajectory": b}, "preferred": preferred,
                      "operator": "sim"})
    return pairs


def add_feedback(db: Path, pairs: list[dict]) -> list[int]:
    from cloudrl.feedback import FeedbackStore

    store = FeedbackStore(db)
    ids, _ = store.add_pairs(pairs, policy_version="v1")
    store.close()
    return ids


def test_bad_flags_exit_2_naming_the_flag(capsys, tmp_path):
    cases = [(["--env-steps", "0"], "--env-steps"), (["--val-seeds", "51"], "--val-seeds"),
             (["--tolerance", "-1"], "--tolerance"), (["--mix", "2"], "--mix"),
             (["--hparams", "[1]"], "--hparams"), (["--recent-weight", "x"], "--recent-weight"),
             (["--bogus", "1"], "--bogus")]
    for argv, flag in cases:
        with pytest.raises(SystemExit) as exc:
            main(["loop", "retrain", *argv])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and flag in err and len(err.strip().splitlines()) == 1, err
    # a missing feedback database and a candidate that is no checkpoint: one line, exit 2
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["loop", "retrain", "--feedback-db", str(tmp_path / "none.db"),
                 "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "--feedback-db" in err and "none.db" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "fb.db").write_bytes(b"")
    assert main(["loop", "retrain", "--feedback-db", str(tmp_path / "fb.db"),
                 "--candidate", str(tmp_path), "--tracking-uri", uri]) == 2
    assert "--candidate" in capsys.readouterr().err


@pytest.mark.slow
def test_challenger_registered_only_when_no_worse_on_validation(tmp_path, capsys):
    """Champion: an (untrained) gated DQN, which acts through the power-aware controller.
    A copy of it is no worse and is registered as challenger; a real flat DQN checkpoint
    with untrained weights places and toggles at random: worse on every validation seed,
    so it is not registered. Feedback rows are consumed once (the watermark moves)."""
    from cloudrl.loop.retrain import pending_feedback, watermark

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    champion = make_checkpoint(tmp_path / "gated", "gated_dqn")
    bad = make_checkpoint(tmp_path / "dqn", "dqn")
    twin = tmp_path / "twin"
    shutil.copytree(champion, twin)
    v_champ = registry.register_policy(champion, eval_table={}, lineage={}, tracking_uri=uri,
                                       aliases=(registry.CHAMPION,))
    db = tmp_path / "state.db"
    first = add_feedback(db, operator_pairs(12, "branching"))
    assert pending_feedback(db, uri) == 12 and watermark(uri) == 0
    common = ["--feedback-db", str(db), "--tracking-uri", uri, "--out", str(tmp_path / "w"),
              "--val-seeds", "3", "--eval-ticks", "120", "--reward-epochs", "5"]

    assert main(["loop", "retrain", *common, "--candidate", str(bad)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["decision"] == "rejected", out
    assert out["candidate_reward_mean"] < out["champion_reward_mean"]
    assert out["new_rows"] == [first[0], first[-1]] and out["pairs"]["new_pairs"] == 12
    assert [v.version for v in registry.versions(registry.POLICY_MODEL, tracking_uri=uri)] \
        == [v_champ]
    assert registry.alias_version(registry.POLICY_MODEL, "challenger", tracking_uri=uri) is None
    # the reward model was trained and registered; no drift yet (there was no model)
    rm = registry.get_version(registry.REWARD_MODEL, "champion", tracking_uri=uri)
    assert rm.lineage["feedback_rows"] == [first[0], first[-1]]
    assert "drift_accuracy" not in out["reward"] and watermark(uri) == first[-1]
    assert pending_feedback(db, uri) == 0

    # nothing new: nothing happens
    assert main(["loop", "retrain", *common, "--candidate", str(twin)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["decision"] \
        == "no_new_feedback"

    second = add_feedback(db, operator_pairs(8, "branching", seed0=100))
    assert main(["loop", "retrain", *common, "--candidate", str(twin)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["decision"] == "registered", out
    assert out["candidate_reward_mean"] == out["champion_reward_mean"]  # same weights
    assert out["new_rows"] == [second[0], second[-1]] and out["pairs"]["old_pairs"] == 12
    assert 0.0 <= out["reward"]["drift_accuracy"] <= 1.0  # the first model on the new pairs
    chall = registry.get_version(registry.POLICY_MODEL, "challenger", tracking_uri=uri)
    assert chall.version == out["challenger_version"] == v_champ + 1
    assert chall.lineage["parent_version"] == v_champ
    assert chall.lineage["feedback_rows"] == [second[0], second[-1]]
    assert chall.eval_table["validation"]["seeds"] == [500_000, 500_001, 500_002]
    assert registry.get_version(registry.REWARD_MODEL, "champion",
                                tracking_uri=uri).lineage["parent_version"] == rm.version


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_retrain_fine_tunes_the_champion_on_the_learned_reward(tmp_path):
    """The whole job without --candidate: reward model from the feedback, the champion PPO
    fine-tuned from its own weights on the learned reward (phase 3), both validated; the
    decision follows the validation rewards."""
    import torch

    from cloudrl.checkpoint_policy import MODULE_SUBDIR, read_meta
    from cloudrl.loop.retrain import RetrainConfig, retrain

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    champion = make_checkpoint(tmp_path / "ppo", "ppo")
    registry.register_policy(champion, eval_table={}, lineage={}, tracking_uri=uri,
                             aliases=(registry.CHAMPION,))
    db = tmp_path / "state.db"
    add_feedback(db, operator_pairs(10, "flat"))
    cfg = RetrainConfig(feedback_db=str(db), tracking_uri=uri, out=str(tmp_path / "w"),
                        env_steps=128, val_seeds=2, eval_ticks=60, reward_epochs=3,
                        hparams={"train_batch_size_per_learner": 64, "minibatch_size": 32,
                                 "num_epochs": 1})
    result = retrain(cfg, log=lambda *_: None)
    cand = Path(result.candidate)
    assert read_meta(cand)["algo"] == "ppo" and cand.is_relative_to(tmp_path / "w")

    def weights(path: Path) -> dict:
        from ray.rllib.core.rl_module.rl_module import RLModule

        return RLModule.from_checkpoint(str(path / MODULE_SUBDIR)).state_dict()

    before, after = weights(champion), weights(cand)
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it was trained
    val = result.validation
    no_worse = val["candidate"]["reward_mean"] >= val["champion"]["reward_mean"]
    assert result.decision == ("registered" if no_worse else "rejected")
    assert (registry.alias_version(registry.POLICY_MODEL, "challenger", tracking_uri=uri)
            is not None) == no_worse
    assert result.reward_version is not None and result.pairs["new_pairs"] == 10
