"""The gated scenario env (envs/scenario/gated.py) and the signal-aware presets it gates
(cloudrl/algorithms/gated/scenario_presets.py): the constant choice 0 is the tuned rule,
episode for episode; presets stay inside each knob's range; bad presets and actions are
errors that name them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.gated.scenario_presets import (
    DEFAULT_SCENARIO_PRESETS,
    KNOB_RANGES,
    SCENARIO_CONTROLLER_PATH,
    make_scenario_controller,
    scenario_preset_configs,
)
from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral
from envs.scenario.catalog import load_scenario
from envs.scenario.control import run_episode
from envs.scenario.gated import GatedScenarioEnv
from envs.scenario.sim import ScenarioSim

PARAMS = {"quantile": 0.45, "ready_margin": 0.3, "release_util": 0.8}


def _gated(presets=None, **extra) -> GatedScenarioEnv:
    return GatedScenarioEnv({"scenario": "tiny", "controller": SCENARIO_CONTROLLER_PATH,
                             "controller_config": {"heuristic": PARAMS, "presets": presets},
                             **extra})


def _play(env: GatedScenarioEnv, seed: int, choose) -> tuple[float, dict]:
    obs, _ = env.reset(seed=seed)
    done, cost, k = False, 0.0, 0
    while not done:
        obs, reward, done, _, info = env.step(choose(k))
        cost -= reward
        k += 1
    return cost, info["episode"]


@pytest.mark.parametrize("seed", [0, 7])
def test_the_constant_choice_zero_is_the_tuned_rule_episode_for_episode(seed: int) -> None:
    cost, summary = _play(_gated(), seed, lambda k: 0)
    rule = run_episode(ScenarioSim(load_scenario("tiny")),
                       SignalAwareDeferral(SignalAwareConfig(**PARAMS)), seed)
    assert cost == pytest.approx(rule.metrics["cost_usd"], rel=1e-12)
    assert summary == rule.metrics


def test_a_preset_changes_the_episode_and_each_is_the_rule_at_its_knobs() -> None:
    env = _gated()
    assert env.action_space.n == len(DEFAULT_SCENARIO_PRESETS)
    costs = {}
    for choice in range(env.action_space.n):
        costs[choice], _ = _play(env, 3, lambda k, c=choice: c)
        shifted = scenario_preset_configs(SignalAwareConfig(**PARAMS),
                                          DEFAULT_SCENARIO_PRESETS)[choice]
        rule = run_episode(ScenarioSim(load_scenario("tiny")), SignalAwareDeferral(shifted), 3)
        assert costs[choice] == pytest.approx(rule.metrics["cost_usd"], rel=1e-12)
    assert len({round(c, 9) for c in costs.values()}) > 1  # the presets are different rules
    # switching presets mid-episode is allowed and plays a legal episode
    mixed, summary = _play(env, 3, lambda k: k % env.action_space.n)
    assert mixed > 0 and summary["cost_usd"] == pytest.approx(mixed)


@pytest.mark.parametrize("weight", [0.0, 3.0])
def test_the_sla_weight_reprices_violations_in_the_reward_only(weight: float) -> None:
    choose = lambda k: 0  # noqa: E731 - the rule itself, which violates on seed 1
    plain, summary = _play(_gated(), 1, choose)
    shaped, shaped_summary = _play(_gated(sla_weight=weight), 1, choose)
    assert summary["sla_usd"] > 0  # the seed has violations to reprice
    assert shaped_summary == summary  # the episode and its reported cost are the scenario's
    assert shaped == pytest.approx(plain + (weight - 1.0) * summary["sla_usd"], rel=1e-9)


def test_bad_presets_actions_and_configs_are_errors_that_name_them() -> None:
    with pytest.raises(ValueError, match=r"presets\[1\]\.bogus"):
        make_scenario_controller({"presets": [{}, {"bogus": 1.0}]})
    with pytest.raises(ValueError, match=r"presets\[0\]\.quantile"):
        make_scenario_controller({"presets": [{"quantile": float("nan")}]})
    with pytest.raises(ValueError, match="need at least one"):
        make_scenario_controller({"presets": []})
    with pytest.raises(ValueError, match="heuristic.nope"):
        make_scenario_controller({"heuristic": {"nope": 1}})
    with pytest.raises(ValueError, match="unknown key 'extra'"):
        make_scenario_controller({"extra": 1})
    with pytest.raises(ValueError, match="needs config"):
        GatedScenarioEnv({"scenario": "tiny"})
    for bad in (-1.0, 101.0, float("nan")):
        with pytest.raises(ValueError, match="sla_weight"):
            _gated(sla_weight=bad)
    env = _gated()
    env.reset(seed=0)
    for bad in (6, -1, 1.5, [0, 1]):
        with pytest.raises(ValueError, match="outside Discrete"):
            env.step(bad)


def test_the_masked_wrapper_offers_one_mask_entry_per_preset() -> None:
    from envs.scenario.env import MaskedScenarioEnv

    env = MaskedScenarioEnv({"scenario": "tiny", "interface": "gated",
                             "controller": SCENARIO_CONTROLLER_PATH,
                             "controller_config": {"presets": [{}, {"quantile": 0.1}]}})
    obs, _ = env.reset(seed=1)
    assert obs["action_mask"].shape == (2,) and env.observation_space.contains(obs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(sorted(KNOB_RANGES)),
                                st.floats(-1e3, 1e3, allow_nan=False), max_size=3),
                min_size=1, max_size=5))
def test_every_preset_is_a_valid_rule_inside_its_ranges(presets: list[dict]) -> None:
    base = SignalAwareConfig(**PARAMS)
    configs = scenario_preset_configs(base, presets)
    assert configs[0] == base and len(configs) == len(presets)
    for cfg, preset in zip(configs[1:], presets[1:], strict=True):
        for knob, (lo, hi) in KNOB_RANGES.items():
            value = getattr(cfg, knob)
            assert lo <= value <= hi
            if knob not in preset:
                assert value == getattr(base, knob)
            else:
                assert value == np.clip(getattr(base, knob) + preset[knob], lo, hi)
