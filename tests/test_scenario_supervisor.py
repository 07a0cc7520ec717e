"""The hierarchical supervisor on the scenarios (cloudrl/scenarios/supervisor.py): branching
leaves the episode untouched, the hindsight choice is the cheapest from the same state,
the supervisor with a fixed choice is that sub-agent, and the command on ``tiny``."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from cloudrl.cli import main
from cloudrl.scenarios.supervisor import (
    AGENT_NAMES,
    BASE,
    FixedChoice,
    MLPPolicy,
    branch_scores,
    hindsight_episode,
    play,
    run_supervised,
    segment_ticks,
    sub_agents,
    train_classifier,
)
from envs.scenario.catalog import load_scenario
from envs.scenario.control import run_episode
from envs.scenario.sim import ScenarioSim

SEED = 1_000_000


@pytest.fixture(scope="module")
def tiny():
    return load_scenario("tiny")


def _started(cfg, seed=SEED, ticks=40):
    sim = ScenarioSim(cfg)
    sim.reset(seed)
    ctrls = sub_agents()
    for c in ctrls:
        c.reset(sim)
    play(sim, ctrls[BASE], ticks)
    return sim, ctrls


def test_branch_does_not_disturb_the_original(tiny) -> None:
    sim, ctrls = _started(tiny)
    ref, ref_ctrls = copy.deepcopy((sim, ctrls))
    seg = segment_ticks(tiny, 2.0)
    branch_scores(sim, ctrls, seg, "rollout")
    assert sim.t == ref.t and sim.stats.summary() == ref.stats.summary()
    play(sim, ctrls[BASE], None)
    play(ref, ref_ctrls[BASE], None)
    assert sim.stats.summary() == ref.stats.summary()


def test_branching_is_deterministic(tiny) -> None:
    sim, ctrls = _started(tiny)
    seg = segment_ticks(tiny, 2.0)
    a = branch_scores(sim, ctrls, seg, "segment")[:2]
    b = branch_scores(sim, ctrls, seg, "segment")[:2]
    assert a == b


@pytest.mark.parametrize("lookahead", ["segment", "rollout"])
def test_each_hindsight_choice_is_the_cheapest_from_the_same_state(tiny, lookahead) -> None:
    ep = hindsight_episode(tiny, SEED, 2.0, lookahead)
    assert len(ep.segments) >= 3
    for s in ep.segments:
        assert s.scores[s.choice] <= min(s.scores) + 1e-9
        if lookahead == "segment":
            assert s.scores == s.seg_costs
    # the segment costs the real episode paid are the chosen branches' costs
    assert sum(s.seg_costs[s.choice] for s in ep.segments) == pytest.approx(
        ep.metrics["cost_usd"], abs=1e-6)


def test_rollout_ceiling_never_costs_more_than_its_base(tiny) -> None:
    ep = hindsight_episode(tiny, SEED, 2.0, "rollout")
    base = run_supervised(tiny, FixedChoice(BASE), SEED, 2.0)
    assert ep.metrics["cost_usd"] <= base.metrics["cost_usd"] + 1e-6


def test_one_sub_agent_ceiling_and_fixed_supervisor_are_that_sub_agent(tiny) -> None:
    direct = run_episode(ScenarioSim(tiny), sub_agents(("mpc",))[0], SEED).metrics
    alone = hindsight_episode(tiny, SEED, 2.0, "segment", names=("mpc",)).metrics
    fixed = run_supervised(tiny, FixedChoice(AGENT_NAMES.index("mpc")), SEED, 2.0).metrics
    assert alone == direct
    assert fixed == direct


def test_classifier_learns_a_separable_label_and_numpy_inference_matches() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 34))
    y = (x[:, 0] > 0).astype(np.int64) * 3
    pol = train_classifier(x, y, 4, run_seed=0, epochs=200)
    assert isinstance(pol, MLPPolicy)
    acc = np.mean([pol(o) == t for o, t in zip(x, y, strict=True)])
    assert acc > 0.95


def test_segment_ticks_are_whole_decision_periods(tiny) -> None:
    d = tiny.decision_ticks
    assert segment_ticks(tiny, 4.0) % d == 0
    assert segment_ticks(tiny, 0.001) == d
    with pytest.raises(ValueError):
        segment_ticks(tiny, 0.0)


def test_command_on_tiny(tmp_path, capsys) -> None:
    out = tmp_path / "sup.json"
    rc = main(["scenarios", "supervise", "--scenario", "tiny", "--n-seeds", "2",
               "--train-seeds", "2", "--run-seed", "0", "--segment-hours", "3",
               "--workers", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "hindsight ceiling" in text and "learned supervisor" in text
    doc = json.loads(out.read_text())
    assert set(doc["per_seed"]) == {*AGENT_NAMES, "ceiling", "learned"}
    assert len(doc["per_seed"]["ceiling"]) == 2


@pytest.mark.parametrize("argv", [
    ["--segment-hours", "0"], ["--n-seeds", "0"], ["--train-seeds", "51"],
    ["--lookahead", "global"], ["--segment-hours", "x"]])
def test_bad_args_exit_2_with_one_line(argv, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["scenarios", "supervise", "--scenario", "tiny", *argv]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err


def test_unknown_scenario_exits_2(capsys) -> None:
    assert main(["scenarios", "supervise", "--scenario", "nope"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
