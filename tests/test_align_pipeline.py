"""The alignment pipeline end to end at tiny size: record -> pairs -> bc -> reward -> train,
each phase an MLflow run nested under one parent; the phase-3 checkpoint evaluates like any
other; bad links between phases are one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cloudrl.cli import main


def tiny_config(tmp: Path) -> dict:
    net = {"hidden": 16, "macro_hiddens": [16], "row_hiddens": [16], "head_hiddens": [16]}
    return {
        "env": {"n_servers": 5, "sim": {"episode_length": 50}},
        "record": {"policies": ["power_aware", "round_robin"], "episodes": 1,
                   "out": str(tmp / "demos")},
        "pairs": {"episodes": str(tmp / "demos"), "n_pairs": 24, "segment_length": 5,
                  "out": str(tmp / "pairs")},
        "bc": {"demos": str(tmp / "demos"), "epochs": 1, "batch_size": 32, "hidden": 16,
               "num_workers": 1, "out": str(tmp / "bc"),
               "storage_path": str(tmp / "ray_train")},
        "reward": {"data": str(tmp / "pairs"), "epochs": 2, "batch_size": 8, "num_workers": 1,
                   "net": net, "storage_path": str(tmp / "ray_train")},
        "train": {"env_steps": 100, "reward_model": str(tmp / "reward"),
                  "pairs": str(tmp / "pairs"), "bc_module": str(tmp / "bc"),
                  "anchor_coeff": 0.1, "hidden": 16, "envs_per_runner": 1,
                  "requery": {"every": 1, "pairs": 4, "epochs": 1},
                  "hparams": {"train_batch_size_per_learner": 100, "minibatch_size": 50,
                              "num_epochs": 1},
                  "out": str(tmp / "policy")},
        "pipeline": {"tracking_uri": f"sqlite:///{tmp / 'mlflow.db'}", "eval_seeds": 2},
    }


@pytest.mark.usefixtures("ray_session")
def test_pipeline_end_to_end_tiny(tmp_path):
    from cloudrl import tracking
    from cloudrl.alignment.cli import AlignConfig
    from cloudrl.alignment.pipeline import PHASES, run_pipeline
    from cloudrl.checkpoint_policy import CheckpointPolicy, is_checkpoint

    cfg = AlignConfig.model_validate(tiny_config(tmp_path))
    out = run_pipeline(cfg)
    ckpt = Path(out["train"]["checkpoint"])
    assert is_checkpoint(ckpt) and (ckpt / "phase3.json").is_file()
    assert CheckpointPolicy(ckpt).interface == "flat"  # what evaluate and serve load
    assert out["train"]["env_steps"] >= 100 and out["train"]["labels_requeried"] > 0
    assert out["train"]["test_episode_reward"] is not None  # evaluated on test seeds
    assert (tmp_path / "reward" / "reward_model.pt").is_file()

    client = tracking.make_client(cfg.pipeline.tracking_uri)
    exp = client.get_experiment_by_name(cfg.pipeline.experiment)
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    parent = out["mlflow_run"]
    assert set(runs) == {"pipeline", "reward_model", "bc", *PHASES} - {"reward"}
    for name, run in runs.items():
        if name != "pipeline":
            assert run.data.tags.get("mlflow.parentRunId") == parent, name
    artifacts = [a.path for a in client.list_artifacts(runs["reward_model"].info.run_id)]
    assert "calibration.png" in artifacts
    assert "val_accuracy" in runs["reward_model"].data.metrics
    assert "test/episode_reward_mean" in runs["train"].data.metrics


def test_pipeline_bad_link_is_one_line_exit_2(tmp_path, capsys):
    raw = tiny_config(tmp_path)
    raw["train"]["pairs"] = str(tmp_path / "elsewhere")
    path = tmp_path / "align.yaml"
    path.write_text(yaml.safe_dump(raw))
    code = main(["align", "pipeline", "--config", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "train.pairs" in err[0] and "pairs.out" in err[0]


def test_train_without_reward_model_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["align", "train", "--mix", "1.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "train.mix" in err[0]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_pipeline_real_size_from_align_yaml(tmp_path):
    """experiments/configs/align.yaml as shipped (N=15, 1,000 pairs, 20k PPO steps), outputs
    in tmp."""
    import json

    from cloudrl.alignment.cli import AlignConfig
    from cloudrl.alignment.pipeline import run_pipeline
    from cloudrl.config_loader import load_config

    shipped = Path(__file__).parents[1] / "experiments" / "configs" / "align.yaml"
    cfg = load_config(AlignConfig, shipped)
    raw = json.loads(json.dumps(cfg.model_dump(mode="json")).replace(
        '"results/align/', f'"{tmp_path}/'))
    raw["pipeline"]["tracking_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    raw["bc"]["storage_path"] = raw["reward"]["storage_path"] = str(tmp_path / "ray_train")
    out = run_pipeline(AlignConfig.model_validate(raw))
    assert out["reward"]["final"]["val_accuracy"] > 0.6
    assert out["train"]["labels_requeried"] > 0
    assert out["train"]["test_episode_reward"] is not None
