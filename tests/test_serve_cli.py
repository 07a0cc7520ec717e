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
