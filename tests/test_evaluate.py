"""Evaluation protocol, metrics summary and the `cloudrl evaluate` CLI end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cloudrl.cli import main
from cloudrl.config_loader import ConfigError, env_overrides, load_config
from cloudrl.evaluate import EvalConfig, evaluate, summary_rows
from cloudrl.metrics import summarize
from cloudrl.protocol import TEST_SEED_OFFSET, TRAIN_SEEDS, seeds_for
from cloudrl.protocol import test_seeds as held_out_seeds  # not collected as a test
from envs.env_config import EnvConfig


def test_seed_protocol_is_disjoint_and_offset():
    assert tuple(range(50)) == TRAIN_SEEDS
    assert held_out_seeds() == tuple(range(TEST_SEED_OFFSET, TEST_SEED_OFFSET + 50))
    assert not set(TRAIN_SEEDS) & set(held_out_seeds())
    assert seeds_for("test", 2) == (1_000_000, 1_000_001)
    with pytest.raises(ValueError, match="n_seeds"):
        held_out_seeds(51)


def test_summarize_mean_and_t_interval():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s.mean == 2.5 and s.n == 4
    # t(0.975, 3) = 3.182446; sd = 1.290994
    assert s.ci95 == pytest.approx(3.182446 * 1.290994 / 2.0, rel=1e-5)
    assert summarize([5.0]).ci95 == 0.0
    assert math.isnan(summarize([]).mean)


def _small_eval(**kw) -> EvalConfig:
    env = {"n_servers": 15, "workload": "poisson", "sim": {"episode_length": 120}}
    return EvalConfig(env=EnvConfig.model_validate(env), n_seeds=2, workers=1, **kw)


def test_evaluate_is_seed_exact_and_parallel_matches_serial():
    serial = evaluate(_small_eval(policies=["ffd", "power_aware"]), progress=False)
    again = evaluate(_small_eval(policies=["ffd", "power_aware"]), progress=False)
    assert serial == again
    parallel = evaluate(_small_eval(policies=["ffd", "power_aware"]).model_copy(
        update={"workers": 2}), progress=False)
    assert sorted(parallel, key=lambda r: (r.policy, r.seed)) == \
        sorted(serial, key=lambda r: (r.policy, r.seed))
    assert {r.seed for r in serial} == {1_000_000, 1_000_001}
    assert all(r.invalid_actions == 0 for r in serial)
    rows = {r["policy"]: r for r in summary_rows(serial)}
    ffd = [r.energy_kwh for r in serial if r.policy == "ffd"]
    assert rows["ffd"]["energy_kwh_mean"] == pytest.approx(np.mean(ffd))
    assert rows["ffd"]["episodes"] == 2


def test_default_policies_expand_to_every_heuristic():
    from cloudrl.heuristics import HEURISTICS

    assert EvalConfig().policies == list(HEURISTICS)
    assert EvalConfig(policies=["ffd", "all"]).policies == \
        ["ffd"] + [h for h in HEURISTICS if h != "ffd"]


def test_unknown_policy_names_the_value():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        _small_eval(policies=["nope"])


def test_cli_evaluate_end_to_end(tmp_path, capsys):
    out = tmp_path / "eval"
    code = main(["evaluate", "--policy", "round_robin", "--policy", "power_aware",
                 "--workload", "google_v2_like", "--n-servers", "15", "--n-seeds", "2",
                 "--episode-length", "100", "--workers", "1", "--out", str(out), "--quiet"])
    assert code == 0
    text = capsys.readouterr().out
    assert "round_robin" in text and "power_aware" in text and "SLA viol. rate" in text
    data = json.loads((tmp_path / "eval.json").read_text())
    assert [r["policy"] for r in data["summary"]] == ["round_robin", "power_aware"]
    assert len(data["episodes"]) == 4
    assert data["config"]["env"]["workload"]["kind"] == "google_v2_like"
    lines = (tmp_path / "eval.csv").read_text().splitlines()
    assert lines[0].startswith("policy,seed,energy_kwh") and len(lines) == 5


def test_cli_bad_config_field_is_named(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("env:\n  sim:\n    alpah: 3\n")
    assert main(["evaluate", "--config", str(cfg), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "env.sim.alpah" in err and "bad.yaml" in err


def test_yaml_and_env_overrides_layer(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env:\n  sim:\n    alpha: 2.0\n    beta: 10\nn_seeds: 3\n")
    environ = {"CLOUDRL__ENV__SIM__BETA": "7.5", "OTHER": "x"}
    assert env_overrides(environ) == {"env": {"sim": {"beta": 7.5}}}
    loaded = load_config(EvalConfig, cfg, {"workers": 1}, environ=environ)
    assert loaded.env.sim.alpha == 2.0
    assert loaded.env.sim.beta == 7.5
    assert loaded.n_seeds == 3 and loaded.workers == 1
    with pytest.raises(ConfigError, match="n_seeds"):
        load_config(EvalConfig, None, {"n_seeds": 0}, environ={})


def test_cli_trace_import_then_evaluate_replays_the_trace(tmp_path, capsys):
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "google_v2_task_events_sample.csv.gz"
    npz = tmp_path / "trace.npz"
    assert main(["trace", "import", str(fixture), "--out", str(npz)]) == 0
    out = tmp_path / "eval"
    assert main(["evaluate", "--workload", "trace", "--trace", str(npz), "--policy", "ffd",
                 "--n-servers", "15", "--n-seeds", "2", "--episode-length", "60",
                 "--workers", "1", "--out", str(out), "--quiet"]) == 0
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["config"]["env"]["workload"]["path"] == str(npz)
    assert data["summary"][0]["episodes"] == 2
    # the fixture's jobs arrive in the window and some of them end
    assert sum(e["jobs_ended"] for e in data["episodes"]) > 0
    assert main(["evaluate", "--workload", "trace", "--quiet"]) == 2
    assert "--trace FILE" in capsys.readouterr().err
