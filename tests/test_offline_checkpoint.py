"""The committed offline agent (checkpoints/offline/scarcity_spikes): it loads as the gated
release-capped policy its manifest describes, and replays its published test episodes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from cloudrl.algorithms.distill.policy import LearnedController, load_checkpoint
from envs.scenario.catalog import load_scenario
from envs.scenario.control import run_episode
from envs.scenario.sim import ScenarioSim

CKPT = Path(__file__).resolve().parents[1] / "checkpoints" / "offline" / "scarcity_spikes"


def manifest() -> dict:
    return json.loads((CKPT / "manifest.json").read_text())


def test_it_is_the_gated_capped_policy_of_its_manifest():
    policy, spec = load_checkpoint(CKPT)
    m = manifest()
    assert type(policy).__name__ == "ReleaseCappedPolicyModule"
    assert policy.cap_gate == (m["cap_gate"]["column"], m["cap_gate"]["above"])
    assert spec["model_config"]["cap_gate"]["name"] == "committed"
    assert spec["config"]["offline_model"]["cap_gate"] == 0.05
    # above the gate the release never passes the clone kept inside it as its anchor
    obs = torch.randn(3000, 34)
    own = super(type(policy), policy).greedy(obs)
    anchor = policy.anchor_logits(policy.anchor_trunk(obs))[:, :6].argmax(-1)
    played = policy.greedy(obs)
    hot = obs[:, 26] > policy.cap_gate[1]
    assert (played[hot, 0] <= anchor[hot]).all()
    assert torch.equal(played[~hot, 0], own[~hot, 0])
    # the median run's claim as the manifest records it
    within = m["test"]["within_budget"]["model"]["both"]
    assert m["median_run"] == "run2" and within >= 0.95
    assert m["test"]["means"]["model"]["cost_usd"] < m["test"]["means"]["mpc"]["cost_usd"]


def test_the_evaluate_command_of_the_manifest_parses():
    from cloudrl.cli import build_parser

    argv = shlex.split(manifest()["evaluate_command"])[1:]
    args = build_parser().parse_args(argv)
    assert args.checkpoint == ["checkpoints/offline/scarcity_spikes"]
    assert [float(x) for x in args.sla_budget] == pytest.approx(
        [manifest()["budgets"]["lc"], manifest()["budgets"]["batch"]])


@pytest.mark.parametrize("k", [0, 17])
def test_it_replays_its_published_test_episodes(k):
    m = manifest()
    seed = m["test"]["seeds"][k]
    sim = ScenarioSim(load_scenario("scarcity_spikes"))
    res = run_episode(sim, LearnedController(load_checkpoint(CKPT)[0], "offline"), seed)
    assert res.metrics["cost_usd"] == pytest.approx(m["test"]["per_seed"]["cost_usd"][k],
                                                    rel=1e-9)
    assert res.metrics["violations_lc"] == m["test"]["per_seed"]["violations_lc"][k]
