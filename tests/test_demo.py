"""``cloudrl demo``: trains the gated DQN over the power-aware heuristic, compares, points to
the headline."""

from __future__ import annotations

from typing import Any

import pytest

import cloudrl.cli as cli


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake_sweep(args: Any) -> int:
        seen["overrides"] = args._overrides
        return seen.get("sweep_code", 0)

    def fake_compare(args: Any) -> int:
        seen["compared"] = args.experiment
        return 0

    monkeypatch.setattr(cli, "_cmd_sweep", fake_sweep)
    monkeypatch.setattr(cli, "_cmd_compare", fake_compare)
    return seen


def test_demo_trains_gated_dqn_in_whole_episodes_and_prints_the_headline(captured, capsys):
    from cloudrl.config_loader import load_config
    from cloudrl.sweep import SweepConfig

    assert cli.main(["demo", "--env-steps", "2000", "--n-seeds", "5", "--skip-scenario"]) == 0
    out = capsys.readouterr().out
    overrides = captured["overrides"]
    assert overrides["algos"] == ["gated_dqn"] and overrides["n_servers"] == 15
    # 1,000 ticks / 5 ticks per decision = 200 decisions; 8 envs -> multiples of 1,600
    assert overrides["env_steps"] == 3200 and "rounded up to 3200" in out
    hp = overrides["hparams"]["gated_dqn"]
    assert hp["decision_every"] == 5 and hp["epsilon"] == [[0, 0.5], [1600, 0.02]]
    cfg = load_config(SweepConfig, None, overrides)  # the sweep accepts them as typed hparams
    assert cfg.interfaces() == ["branching"] and cfg.eval_seeds == 5
    assert captured["compared"] == "cloudrl-demo"
    assert "cloudrl headline --config experiments/configs/headline.yaml" in out.splitlines()[-1]


def test_demo_keeps_a_whole_budget_and_the_sweeps_exit_code(captured, capsys):
    captured["sweep_code"] = 1
    assert cli.main(["demo", "--env-steps", "4800", "--skip-scenario"]) == 1
    out = capsys.readouterr().out
    assert captured["overrides"]["env_steps"] == 4800 and "rounded" not in out
    assert "compared" not in captured and "cloudrl headline" in out


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_demo_end_to_end_at_a_tiny_size(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert cli.main(["demo", "--n-servers", "4", "--env-steps", "1600", "--n-seeds", "2",
                     "--tracking-uri", uri, "--skip-scenario"]) == 0
    out = capsys.readouterr().out
    assert "gated_dqn" in out and "power_aware" in out and "cloudrl headline" in out
