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


def gated_pair(seed: int, column: int, above: float):
    capped, own, anchor = capped_pair(seed)
    gated = build_module((16, 16), release_cap=True,
                         cap_gate={"column": column, "above": above})
    gated.load_state_dict(capped.state_dict())
    return gated, own, anchor


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 33), st.floats(-1.5, 1.5))
def test_a_gated_cap_holds_only_above_the_threshold(seed, column, above):
    gated, own, anchor = gated_pair(seed, column, above)
    obs = torch.randn(256, 34, generator=torch.Generator().manual_seed(seed))
    a, o, r = gated.greedy(obs), own.greedy(obs), anchor.greedy(obs)
    hot = obs[:, column] > above
    assert torch.equal(a[hot, 0], torch.minimum(o[hot, 0], r[hot, 0]))
    assert torch.equal(a[~hot, 0], o[~hot, 0])
    assert torch.equal(a[:, 1], o[:, 1])


def test_a_gated_checkpoint_round_trips_and_a_bad_gate_is_one_clear_error(tmp_path):
    gated, _, _ = gated_pair(4, 26, 0.42)
    save_checkpoint(gated, tmp_path / "g", (16, 16), {"scenario": "tiny"})
    loaded, spec = load_checkpoint(tmp_path / "g")
    assert spec["model_config"]["cap_gate"] == {"column": 26, "name": "committed",
                                                "above": 0.42}
    assert loaded.cap_gate == (26, 0.42)
    obs = torch.randn(400, 34)
    assert torch.equal(loaded.greedy(obs), gated.greedy(obs))
    for bad, match in [({"column": 34, "above": 0.1}, "column must be"),
                       ({"column": True, "above": 0.1}, "column must be"),
                       ({"column": 26, "name": "price_now", "above": 0.1}, "is not"),
                       ({"column": 26, "above": "high"}, "above must be"),
                       ({"column": 26, "above": float("nan")}, "above must be"),
                       ([26, 0.1], "must be an object")]:
        spec["model_config"]["cap_gate"] = bad
        (tmp_path / "g" / "policy.json").write_text(json.dumps(spec))
        with pytest.raises(CheckpointError, match=match):
            load_checkpoint(tmp_path / "g")
    spec["model_config"].update(release_cap=False, cap_gate={"column": 26, "above": 0.1})
    (tmp_path / "g" / "policy.json").write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match="needs release_cap"):
        load_checkpoint(tmp_path / "g")
    with pytest.raises(ValueError, match="needs release_cap"):
        build_module((16, 16), cap_gate={"column": 26, "above": 0.1})
