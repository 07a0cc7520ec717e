"""The gated controller over the power-aware heuristic (``gated_dqn``): env, presets, training,
checkpoint, evaluation and serving."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from cloudrl.algorithms.gated.controller import (
    CONTROLLER_PATH,
    DEFAULT_PRESETS,
    NO_SLEEP,
    PLACEMENT_PRESETS,
    PresetController,
    make_controller,
    preset_configs,
)
from cloudrl.heuristics.power_aware import PowerAwareConfig, PowerAwareConsolidation
from envs.cluster_env import ClusterBranchingEnv
from envs.gated_env import GatedControllerEnv

ENV = {"n_servers": 10, "sim": {"episode_length": 120}}
TUNED = {"spare_floor": 0.8, "lead_ticks": 3.0, "hysteresis": 0.3}


def gated_env(**extra) -> GatedControllerEnv:
    return GatedControllerEnv({**ENV, "controller": CONTROLLER_PATH,
                               "controller_config": {"heuristic": TUNED}, **extra})


@pytest.mark.parametrize("workload", ["poisson", "google_v2_like"])
def test_constant_preset_zero_is_the_heuristic_tick_for_tick(workload: str) -> None:
    env = gated_env(workload=workload)
    ref_env = ClusterBranchingEnv({**ENV, "workload": workload})
    heuristic = PowerAwareConsolidation("branching", PowerAwareConfig(**TUNED))
    obs, _ = env.reset(seed=7)
    ref_obs, _ = ref_env.reset(seed=7)
    heuristic.reset()
    total = ref_total = 0.0
    done = False
    while not done:
        assert np.array_equal(obs["servers"], ref_obs["servers"])
        obs, reward, term, trunc, info = env.step(0)
        ref_obs, ref_reward, *_ , ref_info = ref_env.step(heuristic.act(ref_obs))
        assert reward == ref_reward and info["energy_kwh"] == ref_info["energy_kwh"]
        total, ref_total = total + reward, ref_total + ref_reward
        done = term or trunc
    assert env.sim.stats == ref_env.sim.stats and total == ref_total
    assert env.sim.stats.toggles > 0  # the heuristic did sleep/wake: the test can tell


def test_decision_every_sums_the_ticks_it_covers() -> None:
    every = gated_env(decision_every=7)
    single = gated_env()
    obs, _ = every.reset(seed=3)
    single.reset(seed=3)
    steps, done = 0, False
    while not done:
        choice = steps % every.n_choices
        _, reward, term, trunc, info = every.step(choice)
        ticks = min(7, 120 - 7 * steps)
        parts = [single.step(choice) for _ in range(ticks)]
        assert reward == pytest.approx(sum(p[1] for p in parts), rel=1e-12)
        assert info["energy_kwh"] == pytest.approx(sum(p[4]["energy_kwh"] for p in parts))
        assert info["toggles"] == sum(p[4]["toggles"] for p in parts)
        steps, done = steps + 1, term or trunc
    assert steps == -(-120 // 7) and every.sim.stats == single.sim.stats
    assert obs["action_mask"].shape == (len(DEFAULT_PRESETS),)


def test_presets_shift_the_base_knobs_and_clip_at_zero() -> None:
    base = PowerAwareConfig(**TUNED)
    configs = preset_configs(base, DEFAULT_PRESETS)
    assert configs[0] == base and len(configs) == len(DEFAULT_PRESETS)
    assert configs[2].spare_floor == pytest.approx(0.3) and configs[2].lead_ticks == 1.0
    assert configs[2].hysteresis == 0.0  # 0.3 - 0.5 clipped
    assert configs[4] == replace(base, spare_floor=1.8)
    assert configs[5].hysteresis == pytest.approx(0.3 + NO_SLEEP)
    # "no sleeping" preset: from a state where the heuristic sleeps, it holds instead
    env = ClusterBranchingEnv(ENV)
    obs, _ = env.reset(seed=0)
    controller = PresetController(base)
    k = obs["jobs"].shape[0]
    for _ in range(120):
        if (controller.act(obs, 0)[k:-1] == 0).any():
            break
        obs, *_ = env.step(controller.act(obs, 0))
    else:
        pytest.fail("the heuristic never slept a server")
    assert (controller.act(obs, 0)[k:-1] == 0).any()
    assert not (controller.act(obs, 5)[k:-1] == 0).any()


def test_placement_presets_set_the_placement_knobs_and_change_the_placement() -> None:
    base = PowerAwareConfig(**TUNED)  # tier_weight 10, job_order "viable", priority -1
    configs = preset_configs(base, PLACEMENT_PRESETS)
    assert configs[0] == base
    assert configs[1] == replace(base, job_order="size")
    assert configs[3].tier_weight == 13.0 and configs[4].tier_weight == 0.0  # offset, clipped
    assert configs[5] == replace(base, tier_weight=20.0, job_order="size", priority_level=0)
    # the controller acts as the heuristic with that preset's config, tick for tick
    controller = PresetController(base, PLACEMENT_PRESETS)
    env = ClusterBranchingEnv({**ENV, "workload": "google_v2_like"})
    obs, _ = env.reset(seed=1)
    k = obs["jobs"].shape[0]
    differs = 0
    for _ in range(120):
        for choice in (1, 5):
            ref = PowerAwareConsolidation("branching", configs[choice])
            ref._mean_job = list(controller.heuristic._mean_job)
            assert np.array_equal(ref.act(obs), controller.act(obs, choice))
        differs += not np.array_equal(controller.act(obs, 0)[:k], controller.act(obs, 1)[:k])
        obs, _, term, trunc, _ = env.step(controller.act(obs, 0))
        if term or trunc:
            break
    assert differs > 0  # "size" order placed differently from "viable" on some tick
    from cloudrl.training import TrainConfig

    cfg = TrainConfig(algo="gated_dqn", hparams={"presets": [dict(p) for p in PLACEMENT_PRESETS]})
    assert cfg.training_kwargs()["presets"][5] == {"tier_weight": 10.0, "job_order": "size",
                                                   "priority_level": 0}


def test_bad_controller_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"presets\[1\]\.tier: not a numeric"):
        make_controller({"presets": [{}, {"tier": 1.0}]})
    with pytest.raises(ValueError, match=r"presets\[1\]\.job_order: expected one of"):
        make_controller({"presets": [{}, {"job_order": "largest"}]})
    with pytest.raises(ValueError, match=r"presets\[2\]\.priority_level: expected an integer"):
        make_controller({"presets": [{}, {}, {"priority_level": 1.5}]})
    with pytest.raises(ValueError, match=r"presets\[1\]\.tier_weight: expected a finite"):
        make_controller({"presets": [{}, {"tier_weight": "high"}]})
    with pytest.raises(ValueError, match=r"heuristic\.spare: not a PowerAwareConfig field"):
        make_controller({"heuristic": {"spare": 1.0}})
    with pytest.raises(ValueError, match="unknown key 'preset'"):
        make_controller({"preset": []})
    from cloudrl.training import TrainConfig

    with pytest.raises(ValidationError, match=r"hparams\.heuristic"):
        TrainConfig(algo="gated_dqn", hparams={"heuristic": {"spare_flor": 1}})
    with pytest.raises(ValidationError, match=r"hparams\.decision_every"):
        TrainConfig(algo="gated_dqn", hparams={"decision_every": 0})
    cfg = TrainConfig(algo="gated_dqn", hparams={"heuristic": TUNED, "decision_every": 4})
    kwargs = cfg.training_kwargs()
    assert kwargs["heuristic"] == TUNED and kwargs["decision_every"] == 4
    assert cfg.interface() == "branching"


TINY_HP = {"train_batch_size_per_learner": 16, "n_step": 1,
           "num_steps_sampled_before_learning_starts": 16, "target_network_update_freq": 16,
           "heuristic": TUNED, "decision_every": 2}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Path:
    """One tiny ``cloudrl train --algo gated_dqn`` run (also evaluated on 2 test seeds)."""
    from cloudrl.cli import main

    out = tmp_path_factory.mktemp("gated") / "gated"
    assert main(["train", "--algo", "gated_dqn", "--n-servers", "4", "--episode-length", "40",
                 "--env-steps", "48", "--hparams", json.dumps(TINY_HP), "--out",
                 str(out)]) == 0
    return out


def test_one_training_run_trains_on_the_gated_env(checkpoint: Path) -> None:
    from cloudrl.checkpoint_policy import CheckpointPolicy, read_meta

    meta = read_meta(checkpoint)
    assert meta["algo"] == "gated_dqn" and meta["interface"] == "branching"
    policy = CheckpointPolicy(checkpoint)
    assert policy.gated and policy.module.action_space.n == len(DEFAULT_PRESETS)
    gate = policy.module.model_config["gate"]
    assert gate["controller_config"]["heuristic"] == TUNED and gate["decision_every"] == 2


def test_checkpoint_policy_runs_the_module_choice_through_the_heuristic(
        checkpoint: Path) -> None:
    from cloudrl.checkpoint_policy import CheckpointPolicy

    policy = CheckpointPolicy(checkpoint)
    env = ClusterBranchingEnv(policy.env_config)
    controller = make_controller({"heuristic": TUNED})
    obs, _ = env.reset(seed=1_000_000)
    policy.reset()
    for tick in range(12):
        if tick % 2 == 0:
            choice = int(np.argmax(policy.scores(obs)))
        expected = controller.act(obs, choice)
        action = policy.act(obs)
        assert np.array_equal(action, expected) and policy._gate.choice == choice
        obs, _, _, _, info = env.step(action)
        assert not info["invalid_action"]


def test_cli_evaluate_checkpoint_round_trip(checkpoint: Path, tmp_path: Path, capsys) -> None:
    from cloudrl.cli import main

    out = tmp_path / "eval"
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--policy", "power_aware",
                 "--n-seeds", "2", "--workers", "1", "--quiet", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "interface branching" in text and "gated_dqn:gated" in text
    saved = json.loads(out.with_suffix(".json").read_text())
    rows = {r["policy"]: r for r in saved["summary"]}
    assert rows["gated_dqn:gated"]["episodes"] == 2 and "power_aware" in rows
    episodes = [e for e in saved["episodes"] if e["policy"] == "gated_dqn:gated"]
    assert [e["seed"] for e in episodes] == [1_000_000, 1_000_001]
    assert all(e["invalid_actions"] == 0 and e["jobs_ended"] > 0 for e in episodes)


def test_served_decisions_are_feasible(checkpoint: Path) -> None:
    from serve_apps.runtime import ServedPolicy

    served = ServedPolicy(str(checkpoint), "v1", None, "branching")  # type: ignore[arg-type]
    assert served.interface == "branching"
    observations = served.smoke_observations()
    actions = served.model.act_batch(observations)
    assert served.check_actions(actions, observations) is None
    # one served state: a fresh controller with the module's preset for that state
    policy = served.model.policy
    for obs, action in zip(observations, actions, strict=True):
        choice = int(np.argmax(policy.scores(obs)))
        assert np.array_equal(action, make_controller({"heuristic": TUNED}).act(obs, choice))
