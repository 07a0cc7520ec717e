"""``cloudrl scenarios align-reserve``: the alignment head picks the executor's reserve for
large latency-critical jobs, on validation seeds, and the test compares the policy with it
against the same policy without it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cloudrl import cli
from cloudrl.scenarios.reserve_head import ReserveHeadConfig, with_reserve
from cloudrl.scenarios.runner import ControllerSpec, run_controllers
from envs.scenario.catalog import load_scenario


def test_with_reserve_sets_only_the_reserve_and_refuses_one_the_fleet_cannot_hold():
    tiny = load_scenario("tiny")
    cfg = with_reserve(tiny, 16)
    assert cfg.executor.lc_reserve_cores == 16.0
    assert cfg.model_dump(exclude={"executor"}) == tiny.model_dump(exclude={"executor"})
    with pytest.raises(ValueError, match="--grid 100: lc_reserve_cores 100 is more than"):
        with_reserve(tiny, 100)


def test_config_puts_the_policy_without_the_head_in_the_grid_and_refuses_bad_values():
    assert ReserveHeadConfig(grid=(16, 32)).grid == (0.0, 16.0, 32.0)
    for bad, needle in (({"grid": (-1.0,)}, "--grid"), ({"grid": (float("nan"),)}, "--grid"),
                        ({"n_val_seeds": 0}, "--n-val-seeds"), ({"noise": 0.6}, "--noise"),
                        ({"head_weight": float("inf")}, "--head-weight"),
                        ({"n_comparisons": 1}, "--comparisons"), ({"run_seeds": ()}, "run seed"),
                        ({"lc_bound": 2.0}, "--lc-bound")):
        with pytest.raises(ValueError, match=needle):
            ReserveHeadConfig(**bad)


@pytest.mark.parametrize("argv, needle", [
    (["--grid", "100"], "--grid 100: lc_reserve_cores 100 is more than"),
    (["--grid", "8", "nan"], "--grid"),
    (["--checkpoint", "/no/such"], "--checkpoint /no/such"),
    (["--checkpoint", "checkpoints"], "policy.pt"),
    (["--n-test-seeds", "51"], "--n-test-seeds"),
    (["--head-weight", "-1"], "--head-weight"),
])
def test_bad_arguments_exit_2_with_one_line_and_write_nothing(argv, needle, capsys, tmp_path):
    cache, out = tmp_path / "c.json", tmp_path / "r.json"
    assert cli.main(["scenarios", "align-reserve", "--scenario", "tiny", "--cache", str(cache),
                     "--json", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not cache.exists() and not out.exists()


def test_align_reserve_on_tiny_picks_from_the_grid_by_the_learned_scores(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["scenarios", "align-reserve", "--scenario", "tiny", "--comparisons", "40",
                     "--run-seed", "0", "1", "--n-val-seeds", "3", "--n-test-seeds", "3",
                     "--grid", "8", "16", "--pool-heuristic", "4", "--pool-mpc", "1",
                     "--pool-seeds", "1", "--workers", "1", "--cache",
                     str(tmp_path / "c.json"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "test, with the head - without it (reserve 0)" in text
    res = json.loads(out.read_text())
    assert res["config"]["grid"] == [0.0, 8.0, 16.0]
    assert set(res["validation"]) == {"0", "8", "16"}
    for run in res["runs"]:
        scores = run["validation_scores"]
        # each pick is the best of its objective on the validation seeds (ties: the smaller)
        best_head = max(res["config"]["grid"], key=lambda r: (
            scores[f"{r:g}"]["reward_model"] + scores[f"{r:g}"]["head"], -r))
        best_model = max(res["config"]["grid"],
                         key=lambda r: (scores[f"{r:g}"]["reward_model"], -r))
        assert run["reserve_with_head"] == best_head
        assert run["reserve_reward_model_alone"] == best_model
        # the paired test difference is the difference of the two reserves' test means
        t = res["test"]
        d = run["test_reserve_with_head"]["violations_lc"][0]
        r = f"{run['reserve_with_head']:g}"
        assert d == pytest.approx(t[r]["violations_lc"] - t["0"]["violations_lc"])
        own = run["test_head_vs_reward_model_alone"]["violations_lc"][0]
        r0 = f"{run['reserve_reward_model_alone']:g}"
        assert own == pytest.approx(t[r]["violations_lc"] - t[r0]["violations_lc"])
        lo, hi = run["test_reserve_with_head"]["cost_usd"][1:]
        assert lo <= run["test_reserve_with_head"]["cost_usd"][0] <= hi


def test_the_reserve_zero_policy_is_the_default_executor_episode_for_episode():
    """'Without the head' is the policy on the scenario as published."""
    tiny = load_scenario("tiny")
    spec = ControllerSpec("signal_aware", {})
    plain = run_controllers(tiny, [spec], [0, 1], workers=1)[0]
    zero = run_controllers(with_reserve(tiny, 0), [spec], [0, 1], workers=1)[0]
    assert [m["cost_usd"] for m in plain] == [m["cost_usd"] for m in zero]
    assert np.isfinite([m["violations_lc"] for m in zero]).all()
