"""The production loop's model registry: MLflow Model Registry round trip, aliases, resolve."""

from __future__ import annotations

import json

import pytest

from cloudrl.loop import registry


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    """One SQLite registry for the module (creating its tables takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('registry') / 'mlflow.db'}"


def _checkpoint(path, marker: str):
    (path / "sub").mkdir(parents=True)
    (path / "cloudrl.json").write_text(json.dumps({"marker": marker}))
    (path / "sub" / "weights.bin").write_bytes(marker.encode() * 100)
    return path


def test_round_trip_with_aliases_eval_table_and_lineage(uri, tmp_path):
    a = _checkpoint(tmp_path / "a", "first")
    b = _checkpoint(tmp_path / "b", "second")
    table = {"validation": {"reward_mean": -2268.5, "n_seeds": 10}, "policy": "ppo"}
    lineage = {"feedback_ids": [1, 40], "train_seeds": [0, 49], "parent": None}
    v1 = registry.register_policy(a, eval_table=table, lineage=lineage, tracking_uri=uri,
                                  aliases=(registry.CHAMPION,))
    v2 = registry.register_policy(b, eval_table={"validation": {"reward_mean": -2000.0}},
                                  lineage={"parent": v1}, tracking_uri=uri)
    assert v2 == v1 + 1
    registry.set_alias(registry.POLICY_MODEL, registry.CHALLENGER, v2, tracking_uri=uri)

    champ = registry.resolve("models:/cloudrl-policy@champion", tracking_uri=uri)
    chall = registry.resolve("models:/cloudrl-policy@challenger", tracking_uri=uri)
    # the registered copies, not the originals, with the same content
    assert champ != a and json.loads((champ / "cloudrl.json").read_text())["marker"] == "first"
    assert (chall / "sub" / "weights.bin").read_bytes() == b"second" * 100
    assert registry.resolve(f"models:/cloudrl-policy/{v2}", tracking_uri=uri) == chall
    got = registry.get_version(registry.POLICY_MODEL, "champion", tracking_uri=uri)
    assert (got.version, got.eval_table, got.lineage) == (v1, table, lineage)
    assert got.aliases == ("champion",)

    # promote: the champion alias moves, the old version keeps its files
    registry.set_alias(registry.POLICY_MODEL, registry.CHAMPION, v2, tracking_uri=uri)
    assert registry.resolve("models:/cloudrl-policy@champion", tracking_uri=uri) == chall
    by_version = {v.version: v.aliases for v in registry.versions(registry.POLICY_MODEL,
                                                                  tracking_uri=uri)}
    assert by_version[v1] == () and by_version[v2] == ("challenger", "champion")
    registry.delete_alias(registry.POLICY_MODEL, registry.CHALLENGER, tracking_uri=uri)
    assert registry.alias_version(registry.POLICY_MODEL, "challenger", tracking_uri=uri) is None
    assert registry.alias_version(registry.POLICY_MODEL, "champion", tracking_uri=uri) == v2


def test_reward_models_have_their_own_registered_model(uri, tmp_path):
    rm = _checkpoint(tmp_path / "rm", "reward")
    v = registry.register_reward_model(rm, eval_table={"pair_accuracy": 0.93},
                                       lineage={"feedback_ids": [3, 9]}, tracking_uri=uri,
                                       aliases=("champion",))
    path = registry.resolve("models:/cloudrl-reward-model@champion", tracking_uri=uri)
    assert (path / "sub" / "weights.bin").read_bytes() == b"reward" * 100
    assert registry.get_version(registry.REWARD_MODEL, v, tracking_uri=uri).eval_table == {
        "pair_accuracy": 0.93}
    assert registry.versions("no-such-model", tracking_uri=uri) == []


def test_plain_paths_pass_through_and_bad_references_name_what_is_wrong(uri, tmp_path):
    assert registry.resolve(tmp_path / "x") == tmp_path / "x"
    assert registry.parse_uri("models:/m@champion") == ("m", "champion", None)
    assert registry.parse_uri("models:/m/12") == ("m", None, 12)
    for bad in ("models:/m", "models:/m/abc", "models:/@x"):
        with pytest.raises(registry.RegistryError, match="expected models:/NAME@ALIAS"):
            registry.resolve(bad, tracking_uri=uri)
    with pytest.raises(registry.RegistryError, match="no alias 'nobody'"):
        registry.resolve("models:/cloudrl-policy@nobody", tracking_uri=uri)
    with pytest.raises(registry.RegistryError, match="no version 999"):
        registry.resolve("models:/cloudrl-policy/999", tracking_uri=uri)
    with pytest.raises(registry.RegistryError, match="to version 999"):
        registry.set_alias(registry.POLICY_MODEL, "champion", 999, tracking_uri=uri)
    with pytest.raises(registry.RegistryError, match="not a directory"):
        registry.register_policy(tmp_path / "missing", eval_table={}, lineage={},
                                 tracking_uri=uri)
    with pytest.raises(registry.RegistryError, match="eval_table: not JSON"):
        registry.register_policy(tmp_path, eval_table={"x": object()}, lineage={},
                                 tracking_uri=uri)


def test_the_service_loads_a_policy_by_registry_uri(uri, tmp_path, monkeypatch):
    """serve_apps.runtime resolves models:/NAME@ALIAS through the registry the environment
    names ($MLFLOW_TRACKING_URI), as a replica does; the alias is read at load time."""
    from envs.env_config import EnvConfig
    from serve_apps.runtime import PolicySpecError, ServedPolicy
    from tests.test_loop_retrain import ENV, make_checkpoint

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    flat = make_checkpoint(tmp_path / "dqn_a", "dqn", seed=1)
    gated = make_checkpoint(tmp_path / "gated_b", "gated_dqn", seed=2)
    v_flat = registry.register_policy(flat, eval_table={}, lineage={}, aliases=("champion",))
    v_gated = registry.register_policy(gated, eval_table={}, lineage={})
    env = EnvConfig.model_validate(ENV)

    served = ServedPolicy("models:/cloudrl-policy@champion", "v1", env, "branching")
    assert served.spec == "models:/cloudrl-policy@champion"
    assert served.name == "dqn:checkpoint" and served.interface == "flat"  # from the checkpoint
    assert served.path == str(registry.resolve(f"models:/cloudrl-policy/{v_flat}"))
    obs = served.probe_obs
    (action,) = served.model.act_batch([obs])
    assert served.is_feasible(action, obs)

    registry.set_alias(registry.POLICY_MODEL, "champion", v_gated)
    moved = ServedPolicy("models:/cloudrl-policy@champion", "v2", env, "flat")
    assert moved.interface == "branching" and moved.name == "gated_dqn:checkpoint"
    assert ServedPolicy(f"models:/cloudrl-policy/{v_flat}", "v3", env, "flat").interface == "flat"
    with pytest.raises(PolicySpecError, match="no alias 'gone'"):
        ServedPolicy("models:/cloudrl-policy@gone", "v4", env, "flat")


def test_register_command_prints_the_uri_and_refuses_a_non_checkpoint(uri, tmp_path, capsys):
    from cloudrl.cli import main

    ck = tmp_path / "ck"
    (ck / "learner_group" / "learner" / "rl_module" / "default_policy").mkdir(parents=True)
    (ck / "cloudrl.json").write_text('{"algo": "dqn"}')
    assert main(["loop", "register", str(ck), "--alias", "challenger", "--tracking-uri", uri,
                 "--eval-table", '{"reward_mean": -5.0}']) == 0
    printed = capsys.readouterr().out.strip()
    version = registry.alias_version(registry.POLICY_MODEL, "challenger", tracking_uri=uri)
    assert printed == f"models:/cloudrl-policy/{version} @challenger"
    assert registry.get_version(registry.POLICY_MODEL, version,
                                tracking_uri=uri).eval_table == {"reward_mean": -5.0}
    (tmp_path / "plain").mkdir()
    assert main(["loop", "register", str(tmp_path / "plain"), "--tracking-uri", uri]) == 2
    assert "not a cloudrl checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["loop", "register", str(ck), "--eval-table", "[1]"])
    assert exc.value.code == 2 and "--eval-table" in capsys.readouterr().err
