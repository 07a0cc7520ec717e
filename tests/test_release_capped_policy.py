"""The release-capped scenario policy (models.scenario_policy.ReleaseCappedPolicyModule):
its greedy action, its checkpoint, and what the searches move."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.distill.policy import (
    CheckpointError,
    build_module,
    fine_tune_fields,
    load_checkpoint,
    save_checkpoint,
)
from cloudrl.algorithms.es.algorithm import tuned_parameters
from cloudrl.algorithms.model_es.search import searched


def capped_pair(seed: int):
    torch.manual_seed(seed)
    own, anchor = build_module((16, 16)), build_module((16, 16))
    for p in [*own.parameters(), *anchor.parameters()]:
        with torch.no_grad():
            p.normal_(0.0, 1.0)
    capped = build_module((16, 16), release_cap=True)
    capped.load_state_dict(own.state_dict(), strict=False)
    capped.set_anchor(anchor)
    return capped, own, anchor


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000))
def test_release_is_the_lower_of_the_two_and_ready_the_policys_own(seed):
    capped, own, anchor = capped_pair(seed)
    obs = torch.randn(256, 34, generator=torch.Generator().manual_seed(seed))
    a, o, r = capped.greedy(obs), own.greedy(obs), anchor.greedy(obs)
    assert torch.equal(a[:, 0], torch.minimum(o[:, 0], r[:, 0]))
    assert torch.equal(a[:, 1], o[:, 1])


def test_a_capped_policy_with_its_own_weights_as_anchor_plays_as_the_plain_one():
    _, own, _ = capped_pair(1)
    capped = build_module((16, 16), release_cap=True)
    capped.load_state_dict(own.state_dict(), strict=False)
    capped.set_anchor(own)
    obs = torch.randn(512, 34)
    assert torch.equal(capped.greedy(obs), own.greedy(obs))


def test_the_checkpoint_round_trips_and_is_not_a_fine_tune_start(tmp_path):
    capped, _, _ = capped_pair(2)
    save_checkpoint(capped, tmp_path / "c", (16, 16), {"scenario": "tiny"})
    loaded, spec = load_checkpoint(tmp_path / "c")
    assert type(loaded).__name__ == "ReleaseCappedPolicyModule"
    assert spec["model_config"] == {"hiddens": [16, 16], "release_cap": True}
    obs = torch.randn(300, 34)
    assert torch.equal(loaded.greedy(obs), capped.greedy(obs))
    with pytest.raises(CheckpointError, match="release-capped"):
        fine_tune_fields(tmp_path / "c")
    spec["model_config"]["release_cap"] = "yes"
    (tmp_path / "c" / "policy.json").write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match="release_cap must be true or false"):
        load_checkpoint(tmp_path / "c")


def test_searches_move_the_policys_own_weights_never_the_anchors():
    capped, _, _ = capped_pair(3)
    own = {id(p) for p in [*capped.trunk.parameters(), *capped.logits.parameters()]}
    for params in (searched(capped), tuned_parameters(capped, "all")):
        assert {id(p) for p in params} == own
    plain = build_module((16, 16))
    assert len(searched(plain)) == len(list(plain.parameters()))
