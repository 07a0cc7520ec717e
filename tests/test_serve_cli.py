"""``cloudrl serve --config``: YAML < CLOUDRL__* env vars < flags, errors naming the field."""

from __future__ import annotations

import pytest

from cloudrl.cli import build_parser, main
from cloudrl.serve_cli import service_config


@pytest.fixture(autouse=True)
def _no_cloudrl_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("CLOUDRL__"):
            monkeypatch.delenv(key)


def test_serve_config_file_env_vars_and_flags_layer(tmp_path, monkeypatch):
    path = tmp_path / "serve.yaml"
    path.write_text("policy: heuristic:ffd\nenv: {n_servers: 12, workload: poisson}\n"
                    "failure_threshold: 5\ncooldown_s: 2.0\nstate_db: from-file.db\n")
    monkeypatch.setenv("CLOUDRL__COOLDOWN_S", "3.5")
    args = build_parser().parse_args(["serve", "--config", str(path), "--state-db", "flag.db"])
    cfg = service_config(args)
    assert cfg.policy == "heuristic:ffd" and cfg.env.sim.fleet.n_servers == 12
    assert cfg.failure_threshold == 5 and cfg.cooldown_s == 3.5 and cfg.state_db == "flag.db"


@pytest.mark.parametrize(("yaml_text", "field"), [("failure_threshold: 0\n", "failure_threshold"),
                                                  ("no_such_field: 1\n", "no_such_field")])
def test_bad_serve_config_exits_2_naming_the_field(tmp_path, capsys, yaml_text, field):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml_text)
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------ the stable policy at start-up
BROKEN_STABLE = {
    "raises on every state": ("python:serve_apps.faults:broken", "injected model failure"),
    "NaN actions": ("python:serve_apps.faults:nan_always", "smoke test"),
    "forbidden actions": ("python:serve_apps.faults:infeasible_always", "smoke test"),
    "no answer in time": ("python:serve_apps.faults:hangs", "no answer within 0.5 s"),
    "factory with other arguments": ("python:math:sqrt", "TypeError"),
    "returns no policy": ("python:builtins:slice", "act_batch"),
    "unknown heuristic": ("heuristic:no_such_rule", "unknown heuristic"),
    "missing checkpoint": ("{tmp}/no/such/checkpoint", "not a checkpoint directory"),
    "directory without cloudrl.json": ("{tmp}", "no cloudrl.json"),
}


@pytest.mark.parametrize("case", list(BROKEN_STABLE))
def test_serve_smoke_tests_the_stable_policy_before_ray_starts(tmp_path, capsys, monkeypatch,
                                                               case):
    import cloudrl.ray_utils

    def no_ray(*_, **__):
        raise AssertionError("Ray started for a policy that fails its start-up check")

    monkeypatch.setattr(cloudrl.ray_utils, "init_ray", no_ray)
    spec, cause = BROKEN_STABLE[case]
    spec = spec.format(tmp=tmp_path)
    path = tmp_path / "serve.yaml"
    path.write_text("smoke_timeout_s: 0.5\n")
    code = main(["serve", "--config", str(path), "--policy", spec,
                 "--state-db", str(tmp_path / "state.db")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("cloudrl: policy: ") and spec in lines[0], err
    assert cause in lines[0], err


def test_serve_checks_the_canary_at_start_up_too(tmp_path, capsys, monkeypatch):
    import cloudrl.ray_utils

    monkeypatch.setattr(cloudrl.ray_utils, "init_ray", lambda *_, **__: 1 / 0)
    code = main(["serve", "--policy", "heuristic:ffd", "--canary",
                 "python:serve_apps.faults:broken", "--state-db", str(tmp_path / "s.db")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("cloudrl: canary: ") and "smoke test" in err, err


def test_a_policy_that_passes_is_served_from_the_checked_config(tmp_path, monkeypatch):
    """A good stable policy passes the check and the command goes on to start Ray."""
    import cloudrl.ray_utils

    class Started(Exception):
        pass

    def started(*_, **__):
        raise Started

    monkeypatch.setattr(cloudrl.ray_utils, "init_ray", started)
    with pytest.raises(Started):
        main(["serve", "--policy", "heuristic:ffd", "--state-db", str(tmp_path / "s.db")])
