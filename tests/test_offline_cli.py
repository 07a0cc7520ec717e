"""``cloudrl offline record|train|evaluate`` end to end, and RLlib's reader on the dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cloudrl.cli import main

TINY = ["--n-servers", "3", "--episode-length", "20", "--no-mlflow"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("offline") / "data"
    assert main(["offline", "record", *TINY, "--policy", "power_aware", "--policy", "ffd",
                 "--epsilon", "0", "--epsilon", "0.3", "--episodes", "2",
                 "--out", str(out)]) == 0
    return out


def test_record_prints_the_summary(data, capsys):
    from cloudrl.data.offline import read_dataset

    assert len(read_dataset(data)) == 8
    assert main(["offline", "record", *TINY, "--policy", "ffd", "--episodes", "1",
                 "--out", str(data.parent / "other")]) == 0
    out = capsys.readouterr().out
    assert "ffd" in out and "action coverage" in out


def test_the_rllib_pre_learner_batch_holds_recorded_transitions_and_costs(data):
    """record -> RLlib's OfflinePreLearner + the cql_lag learner connector -> the same
    (obs, action, reward, cost) as recorded."""
    from cloudrl.data.offline import read_dataset
    from cloudrl.offline.config import OfflineConfig
    from cloudrl.offline.train import build_config

    cfg = OfflineConfig.model_validate({"env": {"n_servers": 3, "sim": {"episode_length": 20}},
                                        "train": {"data": str(data), "hidden": 8,
                                                  "train_batch_size": 64}})
    algo = build_config(cfg, budget=1.0).build_algo()
    try:
        batch = algo.offline_data.sample(64)["default_policy"]
    finally:
        algo.stop()
    recorded = {}
    for ep in read_dataset(data):
        for t in range(len(ep)):
            key = (ep.get_observations(t)["servers"].astype(np.float32).tobytes(),
                   int(ep.get_actions(t)))
            recorded.setdefault(key, []).append((float(ep.get_rewards(t)),
                                                 float(ep.get_infos(t + 1)["cost"])))
    servers = np.asarray(batch["obs"]["servers"])
    assert len(servers) == 64 and "costs" in batch
    for i in range(64):
        key = (servers[i].astype(np.float32).tobytes(), int(batch["actions"][i]))
        # rewards may pass through float32 on the way: equal within its precision (rounding
        # to 5 digits both sides failed when a value sat on a rounding boundary)
        reward, cost = float(batch["rewards"][i]), float(batch["costs"][i])
        assert any(abs(reward - r) <= 1e-5 * max(1.0, abs(r)) and cost == c
                   for r, c in recorded[key]), (reward, cost, recorded[key])


def test_train_then_evaluate_the_checkpoint(data, tmp_path, capsys):
    small = tmp_path / "small.yaml"
    small.write_text("train: {hidden: 8, train_batch_size: 64, minibatch_size: 32}\n")
    ck = tmp_path / "ck"
    assert main(["offline", "train", *TINY, "--config", str(small), "--data", str(data),
                 "--iterations", "3", "--out", str(ck)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["checkpoint"] == str(ck.resolve())
    assert last["budget"] >= 0.5 and last["lagrange"] > 0
    assert last["cost_threshold"] == pytest.approx(last["budget"] / 20)
    meta = json.loads((ck / "cloudrl.json").read_text())
    assert meta["algo"] == "cql_lag" and meta["interface"] == "flat"
    # the stock evaluation loads it (as `cloudrl serve` does: CheckpointPolicy)
    assert main(["evaluate", "--checkpoint", str(ck), "--policy", "ffd", "--n-seeds", "2",
                 "--workers", "1", "--quiet", "--out", str(tmp_path / "ev")]) == 0
    assert "cql_lag:ck" in capsys.readouterr().out
    assert main(["offline", "evaluate", "--no-mlflow", "--checkpoint", str(ck), "--policy",
                 "ffd", "--n-seeds", "2", "--out", str(tmp_path / "off")]) == 0
    rows = json.loads((tmp_path / "off.json").read_text())["rows"]
    assert [r["policy"] for r in rows] == ["cql_lag:ck", "ffd"]
    for r in rows:
        assert r["normalized_cost"] == pytest.approx(r["cost"] / last["budget"])


def test_a_malformed_dataset_file_exits_2_naming_it(tmp_path, capsys):
    bad = tmp_path / "data"
    bad.mkdir()
    (bad / "episodes-x.parquet").write_bytes(b"garbage")
    assert main(["offline", "train", *TINY, "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "episodes-x.parquet" in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert main(["offline", "train", *TINY, "--data", str(bad), "--iterations", "0"]) == 2
    assert "train.iterations" in capsys.readouterr().err
