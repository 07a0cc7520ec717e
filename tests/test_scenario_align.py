"""The RLHF phases on the scenarios: the safety-bound teacher, the alignment head and the
``cloudrl scenarios align`` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl import cli
from cloudrl.scenarios.align import AlignConfig
from cloudrl.scenarios.safety_head import SafetyHead, learn_head
from cloudrl.scenarios.steering import FEATURES, UTILITIES, safe_cost, sample_comparisons


def _metrics(**kw: float) -> dict[str, float]:
    m = {f: 0.0 for f in FEATURES}
    m.update(kw)
    return m


def test_safe_cost_charges_ten_dollars_per_step_above_each_class_bound():
    assert safe_cost(_metrics(cost_usd=80.0, sla_lc=0.0003, sla_batch=0.003)) == 80.0
    # LC 0.05%: 2 steps of 0.01 pp above 0.03%; batch 0.5%: 2 steps of 0.1 pp above 0.3%
    assert safe_cost(_metrics(cost_usd=80.0, sla_lc=0.0005, sla_batch=0.003)) == \
        pytest.approx(100.0)
    assert safe_cost(_metrics(cost_usd=80.0, sla_lc=0.0, sla_batch=0.005)) == \
        pytest.approx(100.0)
    assert UTILITIES["safe_cost"] is safe_cost


def test_the_teachers_bounds_move_where_it_starts_charging():
    from cloudrl.scenarios.align import teacher

    m = _metrics(cost_usd=80.0, sla_lc=0.0002, sla_batch=0.002)
    assert safe_cost(m) == 80.0  # under the default bounds
    # LC 0.02% is 1 step of 0.01 pp above a 0.01% bound; batch 0.2% 1 step above 0.1%
    assert safe_cost(m, {"sla_lc": 0.0001}) == pytest.approx(90.0)
    assert safe_cost(m, {"sla_lc": 0.0001, "sla_batch": 0.001}) == pytest.approx(100.0)
    assert teacher(AlignConfig()) is safe_cost
    assert teacher(AlignConfig(lc_bound=0.0001, batch_bound=0.001))(m) == pytest.approx(100.0)
    assert teacher(AlignConfig(batch_bound=0.001))(m) == pytest.approx(90.0)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 200), st.floats(0, 0.01), st.floats(0, 0.05), st.floats(0, 0.01),
       st.floats(0, 0.05))
def test_safe_cost_never_below_cost_and_monotone_in_each_class(cost, lc, batch, dlc, db):
    a = safe_cost(_metrics(cost_usd=cost, sla_lc=lc, sla_batch=batch))
    assert a >= cost - 1e-9
    assert safe_cost(_metrics(cost_usd=cost, sla_lc=lc + dlc, sla_batch=batch)) >= a - 1e-9
    assert safe_cost(_metrics(cost_usd=cost, sla_lc=lc, sla_batch=batch + db)) >= a - 1e-9


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.floats(-3, 3), min_size=6, max_size=6))
def test_the_head_never_scores_more_violations_higher(seed, raw):
    cols = [FEATURES.index("sla_lc"), FEATURES.index("sla_batch")]
    head = SafetyHead(cols, np.array([4e-4, 3e-3]), np.array([2e-4, 4e-3]), seed=seed)
    for p, v in zip(head.parameters(), np.reshape(raw, (3, 2)), strict=True):
        p.data[:] = p.data.new_tensor(v)
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 0.01, (20, len(FEATURES)))
    more = x.copy()
    more[:, cols] += rng.uniform(0, 0.01, (20, 2))
    assert (head.score(more) <= head.score(x) + 1e-6).all()


def test_the_head_learns_a_latency_critical_bound_from_noisy_comparisons():
    rng = np.random.default_rng(0)
    n = 120
    feats = np.zeros((n, len(FEATURES)))
    lc = rng.uniform(0, 0.001, n)
    feats[:, FEATURES.index("sla_lc")] = lc
    feats[:, FEATURES.index("sla_batch")] = rng.uniform(0, 0.002, n)  # below its bound
    u = np.array([safe_cost(_metrics(cost_usd=80.0, sla_lc=v)) for v in lc])
    comp = sample_comparisons(u, 1000, 0.1, np.random.default_rng(1))
    head, info = learn_head(feats, FEATURES, comp.a, comp.b, comp.label, comp.true_label,
                            seed=0)
    assert info["heldout_acc_true"] > 0.9
    # below the bound every episode costs the teacher the same; above it the head falls
    # faster than below (the hinge's shape)
    grid = np.zeros((3, len(FEATURES)))
    grid[:, FEATURES.index("sla_lc")] = [0.0, 0.0003, 0.001]
    s = head.score(grid)
    assert s[2] < s[1] <= s[0]
    assert (s[1] - s[2]) / 0.0007 > (s[0] - s[1]) / 0.0003


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="comparisons"):
        AlignConfig(n_comparisons=1001)
    with pytest.raises(ValueError, match="noise"):
        AlignConfig(noise=0.6)
    with pytest.raises(ValueError, match="head-weight"):
        AlignConfig(head_weight=-1)
    with pytest.raises(ValueError, match="es_iterations"):
        AlignConfig(es_iterations=0)
    with pytest.raises(ValueError, match="bc-dagger-rounds"):
        AlignConfig(bc_dagger_rounds=6)
    with pytest.raises(ValueError, match="58 train seeds"):
        AlignConfig(bc_expert_seeds=50, bc_dagger_rounds=2)


@pytest.mark.parametrize("argv", [
    ["--comparisons", "2000"],
    ["--noise", "0.9"],
    ["--n-test-seeds", "0"],
    ["--head-weight", "-0.5"],
    ["--es-iterations", "ten"],
    ["--lc-bound", "-0.001"],
    ["--batch-bound", "2"],
    ["--bc-dagger-rounds", "-1"],
])
def test_bad_arguments_exit_2_with_one_line_and_write_nothing(argv, capsys, tmp_path):
    try:
        code = cli.main(["scenarios", "align", "--scenario", "tiny", "--out",
                         str(tmp_path / "out"), "--cache", str(tmp_path / "c.json"), *argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "c.json").exists()


def test_unknown_scenario_exits_2(capsys, tmp_path):
    assert cli.main(["scenarios", "align", "--scenario", "no_such", "--out",
                     str(tmp_path / "out")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.slow
def test_align_runs_every_phase_on_tiny_and_reuses_its_runs(tmp_path, capsys):
    argv = ["scenarios", "align", "--scenario", "tiny", "--comparisons", "40",
            "--pool-heuristic", "3", "--pool-mpc", "1", "--pool-seeds", "1",
            "--n-test-seeds", "2", "--run-seed", "0", "--bc-expert-seeds", "1",
            "--bc-epochs", "2", "--es-iterations", "1", "--val-seeds", "1", "--workers", "1",
            "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "c.json"),
            "--json", str(tmp_path / "a.json")]
    assert cli.main(argv) == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    root = tmp_path / "out" / "tiny"
    for name in ("bc", "es-learned0", "es-head0", "es-true0"):
        assert (root / name / "policy.pt").exists()
    assert set(doc["policies"]) == {"heuristic", "bc", "learned0", "head0", "true0"}
    assert doc["median_run"] == "learned0"
    pairs = {(c["a"], c["b"], c["metric"]) for c in doc["comparisons"]}
    assert {("learned0", "true0", "utility"), ("head0", "learned0", "violations_lc"),
            ("bc", "heuristic", "utility"), ("learned0", "heuristic", "cost_usd"),
            ("true0", "heuristic", "utility")} <= pairs
    # the teacher's utility of each policy is safe_cost of its test episodes
    for p in doc["policies"].values():
        assert p["utility"] >= p["cost_usd"] - 1e-9
    rm = doc["reward_models"][0]
    assert rm["reward_model"]["n_train"] == 32 and "sla_lc_threshold" in rm["head"]
    out = capsys.readouterr().out
    assert "paired differences" in out
    # the same command again reuses every run
    assert cli.main(argv) == 0
    again = capsys.readouterr().out
    assert "BC: reusing" in again and again.count("reusing") == 4
    assert json.loads((tmp_path / "a.json").read_text())["policies"] == doc["policies"]


def test_bc_with_dagger_rounds_labels_the_clones_own_states(tmp_path):
    """``--bc-dagger-rounds``: each round adds the heuristic's labels on the states the clone
    reached (more rows than the demonstrations), and the start is the round validation kept."""
    from cloudrl.scenarios.align import behaviour_clone, teacher_params
    from envs.scenario.catalog import load_scenario

    scn = load_scenario("tiny")
    cfg = AlignConfig(scenario="tiny", bc_expert_seeds=1, bc_epochs=2, bc_dagger_rounds=1,
                      workers=1)
    lines: list[str] = []
    out = behaviour_clone(scn, cfg, teacher_params(scn, cfg), tmp_path / "bc", lines.append)
    rows = [int(ln.split(": ")[1].split()[0]) for ln in lines if ln.startswith("round ")]
    assert len(rows) == 2 and rows[1] > rows[0]
    assert (out / "policy.pt").exists() and any(ln.startswith("kept round") for ln in lines)
    # the same config again reuses it
    again: list[str] = []
    behaviour_clone(scn, cfg, teacher_params(scn, cfg), tmp_path / "bc", again.append)
    assert again and again[0].startswith("BC: reusing")
