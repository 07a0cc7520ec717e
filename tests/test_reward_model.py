"""Phase 2 reward model: Bradley-Terry loss, accuracy, calibration, the reward net, and the
Ray Train + DeepSpeed ZeRO-2 trainer (recovers a known linear reward; partitions the
optimizer state across 2 workers; checkpoint loads without DeepSpeed; MLflow run)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.bradley_terry import bt_loss, calibration, pair_accuracy
from cloudrl.alignment.reward_model import (
    RewardModelConfig,
    RewardNetSpec,
    load_pairs,
    load_reward_model,
    member_gaps,
    net_spec,
    preference_metrics,
    rank_shard,
    split_indices,
    synthetic_linear_pairs,
    synthetic_transition_pairs,
    train_reward_model,
)
from cloudrl.data.pairs import PairArrays, PairDataError, Segment, pair_row, write_pairs
from models.reward_net import RewardEnsemble, RewardNet, build_reward_ensemble, obs_space_from_dims

TINY_NET = RewardNetSpec(macro_hiddens=[16], row_hiddens=[16], hidden=32, head_hiddens=[32])


# ----------------------------------------------------------------------------- Bradley-Terry


def test_bt_loss_matches_hand_computation_including_ties():
    ra = torch.tensor([2.0, 2.0, 2.0, 0.0])
    rb = torch.tensor([0.0, 0.0, 0.0, 0.0])
    y = torch.tensor([1.0, 0.0, 0.5, 0.5])
    # -log sigmoid(2) = log(1 + e^-2); -log sigmoid(-2) = log(1 + e^2); a tie averages them
    lo, hi = math.log1p(math.exp(-2.0)), math.log1p(math.exp(2.0))
    expected = torch.tensor([lo, hi, 0.5 * (lo + hi), math.log(2.0)])
    got = bt_loss(ra, rb, y, reduction="none")
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert bt_loss(ra, rb, y).item() == pytest.approx(expected.mean().item(), rel=1e-6)
    assert bt_loss(ra, rb, y, reduction="sum").item() == pytest.approx(expected.sum().item(),
                                                                        rel=1e-6)
    # the gradient of the tie w.r.t. R_a is sigmoid(delta) - y
    ra_g = torch.tensor([2.0], requires_grad=True)
    bt_loss(ra_g, torch.zeros(1), torch.tensor([0.5])).backward()
    assert ra_g.grad.item() == pytest.approx(1 / (1 + math.exp(-2.0)) - 0.5, rel=1e-6)


def test_bt_loss_is_finite_for_huge_gaps():
    ra, rb = torch.tensor([1000.0, -1000.0]), torch.zeros(2)
    loss = bt_loss(ra, rb, torch.tensor([0.0, 0.0]), reduction="none")
    torch.testing.assert_close(loss, torch.tensor([1000.0, 0.0]))
    with pytest.raises(ValueError, match="reduction"):
        bt_loss(ra, rb, torch.zeros(2), reduction="avg")


@settings(max_examples=50, deadline=None)
@given(st.floats(-30, 30), st.floats(-30, 30), st.sampled_from([0.0, 0.5, 1.0]))
def test_bt_loss_swapping_sides_and_label_is_the_same_loss(ra, rb, y):
    a, b = torch.tensor([ra], dtype=torch.float64), torch.tensor([rb], dtype=torch.float64)
    one = bt_loss(a, b, torch.tensor([y], dtype=torch.float64))
    swapped = bt_loss(b, a, torch.tensor([1 - y], dtype=torch.float64))
    assert one.item() == pytest.approx(swapped.item(), rel=1e-9, abs=1e-12)
    # never below the label's entropy (the minimum, reached at sigmoid(delta) = y)
    entropy = 0.0 if y in (0.0, 1.0) else math.log(2.0)
    assert one.item() >= entropy - 1e-9


def test_pair_accuracy_excludes_ties_and_counts_a_coin_flip_as_wrong():
    prob = np.array([0.9, 0.2, 0.7, 0.5, 0.6])
    label = np.array([1.0, 0.0, 0.0, 1.0, 0.5])
    assert pair_accuracy(prob, label) == pytest.approx(0.5)  # right, right, wrong, 0.5 wrong
    assert math.isnan(pair_accuracy(np.array([0.9]), np.array([0.5])))


def test_calibration_on_a_hand_case():
    prob = np.array([0.05, 0.15, 0.12, 0.95, 0.85, 1.0])
    label = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    cal = calibration(prob, label, n_bins=10)
    assert cal.counts.tolist() == [1, 2, 0, 0, 0, 0, 0, 0, 1, 2]  # 1.0 in the last bin
    assert cal.mean_pred[1] == pytest.approx(0.135)
    assert cal.mean_label[1] == pytest.approx(0.5)
    assert math.isnan(cal.mean_pred[2])
    # ECE = sum_b n_b / n * |pred_b - label_b|
    expected = (1 * 0.05 + 2 * 0.365 + 1 * 0.15 + 2 * abs(0.975 - 1.0)) / 6
    assert cal.ece == pytest.approx(expected)
    perfect = calibration(np.array([0.25, 0.25, 0.25, 0.25]), np.array([1.0, 0.0, 0.0, 0.0]), 4)
    assert perfect.ece == pytest.approx(0.0)
    with pytest.raises(ValueError, match="predictions"):
        calibration(np.zeros(3), np.zeros(2))


# ----------------------------------------------------------------------------- reward net


def test_reward_net_segment_return_is_the_sum_of_step_rewards_and_row_order_free():
    torch.manual_seed(0)
    space = obs_space_from_dims(4, 5, 3, 2, 3)
    net = RewardNet(space, TINY_NET.encoder(), (8,))
    obs = {"macro": torch.randn(6, 7, 4), "servers": torch.randn(6, 7, 5, 3),
           "jobs": torch.randn(6, 7, 2, 3)}
    steps = net(obs)
    assert steps.shape == (6, 7)
    torch.testing.assert_close(net.segment_return(obs), steps.sum(-1))
    shuffled = dict(obs, servers=obs["servers"][:, :, torch.randperm(5)])
    torch.testing.assert_close(net(shuffled), steps, rtol=1e-5, atol=1e-6)


def test_ensemble_members_differ_and_predict_reports_their_spread():
    torch.manual_seed(0)
    ens = RewardEnsemble(obs_space_from_dims(4, 5, 3, 2, 3), 3, TINY_NET.encoder(), (8,))
    obs = {"macro": torch.randn(10, 4), "servers": torch.randn(10, 5, 3),
           "jobs": torch.randn(10, 2, 3)}
    per_member = ens(obs)
    assert per_member.shape == (3, 10)
    mean, std = ens.predict(obs)
    torch.testing.assert_close(mean, per_member.mean(0))
    torch.testing.assert_close(std, per_member.std(0, unbiased=False))
    assert float(std.min()) > 0.0  # independently initialised members disagree
    with pytest.raises(ValueError, match="ensemble size"):
        RewardEnsemble(obs_space_from_dims(4, 5, 3, 2, 3), 0)


def test_transition_net_sums_rewards_of_consecutive_observation_pairs():
    from models.reward_net import TransitionFeatures

    torch.manual_seed(0)
    space = obs_space_from_dims(15, 5, 3, 2, 3)
    net = RewardNet(space, TINY_NET.encoder(), (8,),
                    transition_features=TransitionFeatures(violation_rate=11, ema=0.05))
    assert net.transition
    obs = {"macro": torch.randn(6, 8, 15), "servers": torch.randn(6, 8, 5, 3),
           "jobs": torch.randn(6, 8, 2, 3)}
    steps = net(obs)
    assert steps.shape == (6, 7)  # 8 observations, 7 transitions
    for t in (0, 3, 6):
        one = net.reward({k: v[:, t] for k, v in obs.items()},
                         {k: v[:, t + 1] for k, v in obs.items()})
        torch.testing.assert_close(steps[:, t], one)
    torch.testing.assert_close(net.segment_return(obs), steps.sum(-1))
    with pytest.raises(ValueError, match="needs the observation before"):
        net.reward(None, {k: v[:, 0] for k, v in obs.items()})


def test_transition_features_recover_the_env_step_violations_exactly():
    """On a real rollout the derived column equals info["violations"] at every step: the
    layout index and the EMA weight are the simulator's (a change to either fails here)."""
    from cloudrl.heuristics import make_heuristic
    from cloudrl.policy import make_env
    from envs import sim
    from models.reward_net import TransitionFeatures

    env = make_env({"n_servers": 3, "sim": {"episode_length": 150}}, "flat")
    policy = make_heuristic("round_robin")
    policy.reset()
    obs, _ = env.reset(seed=0)
    macros, violations = [obs["macro"]], []
    for _ in range(150):
        obs, _, _, _, info = env.step(policy.act(obs))
        macros.append(obs["macro"])
        violations.append(info["violations"])
    assert sum(violations) > 20 and np.count_nonzero(violations) > 10  # the test can fail
    spec = net_spec(RewardModelConfig(), {"macro_dim": macros[0].shape[0], "n_servers": 3,
                                          "server_dim": 16, "k_slots": 2, "job_dim": 7})
    feats = TransitionFeatures(**spec["transition_features"])
    assert feats.ema == sim._EMA
    macro = torch.as_tensor(np.stack(macros))
    got = feats.violations(macro[:-1], macro[1:]).numpy()
    np.testing.assert_allclose(got, violations, atol=1e-3)
    # the post-step EMA level alone does not give them (what a state reward sees)
    level = macro[1:, feats.violation_rate].numpy()
    assert np.abs(level - np.asarray(violations)).max() > 0.5


def test_transition_reward_recovers_violations_a_state_reward_cannot_see():
    """Synthetic transition pairs ranked by hidden per-step violations (visible only as the
    change of the violation EMA) plus a small server term: the transition net ranks
    held-out pairs >= 0.9 after 10 epochs; the same net without the transition column (a
    state reward on the post-step observations) stays < 0.7."""
    from cloudrl.alignment.requery import finetune
    from cloudrl.data.pairs import PairArrays

    pairs, counts = synthetic_transition_pairs(1000, seed=0)
    assert pairs.transitions and counts.shape == (1000, 2, 8)

    def part(idx):
        return PairArrays(label=pairs.label[idx],
                          obs={s: {k: v[idx] for k, v in pairs.obs[s].items()} for s in "ab"},
                          meta={k: v[idx] for k, v in pairs.meta.items()}, shape=pairs.shape)

    train, held_out = part(np.arange(600)), part(np.arange(600, 1000))
    acc = {}
    for on in (True, False):
        torch.manual_seed(0)
        cfg = RewardModelConfig(net=TINY_NET.model_copy(update={"transition_features": on}))
        model = build_reward_ensemble(net_spec(cfg, pairs.shape))
        assert model.transition == on
        finetune(model, train, epochs=10, batch_size=32, lr=3e-3, seed=0)
        metrics, _ = preference_metrics(member_gaps(model, held_out), held_out.label)
        acc[on] = metrics["val_accuracy"]
    assert acc[True] >= 0.9, acc
    assert acc[False] < 0.7, acc


def test_old_pair_files_for_a_transition_net_are_one_line_naming_file_and_column(tmp_path):
    """Pairs written before transition segments (no obs_steps column, T observations) still
    read; training the default (transition) net on them names the file and the column."""
    pairs, _ = synthetic_transition_pairs(8, seed=0)
    rows = []
    for i in range(len(pairs)):
        seg = {s: Segment(*(pairs.obs[s][p][i, 1:] for p in ("macro", "servers", "jobs")),
                          pairs.obs[s]["actions"][i]) for s in ("a", "b")}
        rows.append(pair_row(f"p{i}", "teacher", float(pairs.label[i]), seg["a"], seg["b"]))
    (tmp_path / "old").mkdir()
    table = pa.Table.from_pylist(rows).drop_columns(["obs_steps"])
    pq.write_table(table, tmp_path / "old" / "teacher-old.parquet")
    cfg = RewardModelConfig(data=str(tmp_path / "old"), net=TINY_NET, num_workers=1)
    read, _ = load_pairs(cfg)
    assert not read.transitions and read.obs["a"]["macro"].shape == (8, 8, 15)
    with pytest.raises(PairDataError) as err:
        train_reward_model(cfg)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'old' / 'teacher-old.parquet'}: field obs_steps: "
                          "missing column")
    assert "needs 9" in msg and "\n" not in msg
    # a state net trains on them (the check passes; no Ray needed to see that)
    from cloudrl.alignment.reward_model import check_obs_layout

    off = cfg.model_copy(update={"net": TINY_NET.model_copy(
        update={"transition_features": False})})
    check_obs_layout(read, net_spec(off, read.shape), cfg.data)


# ----------------------------------------------------------------------------- data plumbing


def test_server_features_add_utilisation_and_the_overload_indicator():
    from envs.observation import SERVER_COLS, S
    from models.reward_net import ServerFeatures

    rows = np.zeros((1, 3, len(SERVER_COLS) + 2), np.float32)
    rows[0, :, S["mem_cap"]] = [1.0, 0.5, 0.0]
    rows[0, :, S["mem_free"]] = [0.5, 0.0, 0.0]     # memory use 0.5, 1.0, (no capacity) 0
    rows[0, :, S["cpu_util"]] = [0.95, 0.2, 0.3]
    feats = ServerFeatures(S["cpu_util"], S["mem_cap"], S["mem_free"], threshold=0.9)
    out = feats.augment(torch.from_numpy(rows)).numpy()
    assert out.shape == (1, 3, len(SERVER_COLS) + 4)
    np.testing.assert_allclose(out[0, :, -2], [0.95, 1.0, 0.3])
    np.testing.assert_array_equal(out[0, :, -1], [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(out[..., :-2], rows)
    # on by default for env-shaped rows, off for rows without the env's columns
    cfg = RewardModelConfig(data="x")
    shape = {"macro_dim": 5, "n_servers": 3, "server_dim": len(SERVER_COLS) + 2,
             "k_slots": 2, "job_dim": 7}
    spec = net_spec(cfg, shape)
    assert spec["server_features"]["threshold"] == 0.9
    net = build_reward_ensemble(spec)
    obs = {"macro": torch.zeros(4, 5), "servers": torch.from_numpy(rows).expand(4, 3, -1),
           "jobs": torch.zeros(4, 2, 7)}
    assert net(obs).shape == (1, 4)
    assert net_spec(cfg, {**shape, "server_dim": 3})["server_features"] is None
    off = cfg.model_copy(update={"net": RewardNetSpec(overload_features=False)})
    assert net_spec(off, shape)["server_features"] is None


def test_rank_shards_are_equal_disjoint_and_the_split_is_seeded():
    train, val = split_indices(103, 0.2, seed=3)
    assert len(val) == 21 and len(train) == 82 and not set(train) & set(val)
    assert np.array_equal(split_indices(103, 0.2, seed=3)[1], val)
    shards = [rank_shard(train, r, 3) for r in range(3)]
    assert {len(s) for s in shards} == {27}
    assert len(set(np.concatenate(shards))) == 81
    with pytest.raises(PairDataError, match="data: 1 pair"):
        split_indices(1, 0.2, seed=0)


def test_synthetic_reward_needs_the_micro_features():
    """The known reward is chosen so that a model blind to the server/job rows fails."""
    pairs, w = synthetic_linear_pairs(2000, seed=1)
    macro_only = {s: (pairs.obs[s]["macro"] @ w["macro"]).sum(-1) for s in ("a", "b")}
    blind = (macro_only["a"] > macro_only["b"]).astype(float)
    assert np.mean(blind == pairs.label) < 0.7
    assert set(np.unique(pairs.label)) == {0.0, 1.0}


def _write_parquet(pairs: PairArrays, out) -> None:
    rows = []
    for i in range(len(pairs)):
        seg = {s: Segment(*(pairs.obs[s][p][i] for p in ("macro", "servers", "jobs", "actions")),
                          episode_seed=i, policy="synthetic") for s in ("a", "b")}
        rows.append(pair_row(f"p{i}", "teacher", float(pairs.label[i]), seg["a"], seg["b"]))
    write_pairs(rows, out, rows_per_file=400)


def test_malformed_dataset_is_one_line_naming_file_and_field(tmp_path):
    pairs, _ = synthetic_linear_pairs(4, seed=0)
    _write_parquet(pairs, tmp_path / "ok")
    bad = pq.read_table(next((tmp_path / "ok").glob("*.parquet"))).drop_columns(["b_jobs"])
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(PairDataError) as err:
        load_pairs(RewardModelConfig(data=str(tmp_path / "bad.parquet")))
    msg = str(err.value)
    assert "bad.parquet" in msg and "b_jobs" in msg and "\n" not in msg
    with pytest.raises(PairDataError, match="data: no pair dataset"):
        load_pairs(RewardModelConfig())
    table = pa.table({"x": [1]})
    pq.write_table(table, tmp_path / "x.parquet")
    with pytest.raises(PairDataError, match="missing column"):
        load_pairs(RewardModelConfig(data=str(tmp_path / "x.parquet")))


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="zero_stage"):
        RewardModelConfig(zero_stage=5)
    with pytest.raises(ValueError, match="net"):
        RewardModelConfig(net={"activation": "swish"})
    with pytest.raises(ValueError, match="Extra inputs"):
        RewardModelConfig(epoch=3)


# ------------------------------------------------------------------------ Ray Train + DeepSpeed


def _run(tmp_path, num_workers: int, epochs: int, **extra):
    cfg = RewardModelConfig(data=str(tmp_path / "pairs"), num_workers=num_workers, epochs=epochs,
                            net=TINY_NET, batch_size=32, lr=3e-3, seed=0,
                            storage_path=str(tmp_path / "ray_train"),
                            tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", **extra)
    return cfg, train_reward_model(cfg)


def test_two_worker_zero2_partitions_optimizer_state_and_recovers_linear_reward(
        ray_session, tmp_path):
    """From parquet on disk, 2 Ray Train workers, ZeRO-2: each rank holds about half of the
    Adam moments (1 worker holds 2 x params), and the net ranks held-out pairs of a known
    linear reward (a model blind to the rows would score < 0.7; an untrained one ~0.5)."""
    pairs, _ = synthetic_linear_pairs(800, seed=0)
    _write_parquet(pairs, tmp_path / "pairs")
    cfg, res = _run(tmp_path, num_workers=2, epochs=8, eval_every=2)

    zero = res.zero
    assert zero["zero_stage"] == 2 and zero["world_size"] == 2
    params = zero["param_numel"]
    one_worker_state = 2 * params  # exp_avg + exp_avg_sq over every parameter
    per_rank = zero["opt_state_numel_per_rank"]
    assert len(per_rank) == 2
    for n in per_rank:  # half, up to DeepSpeed's alignment padding
        assert abs(n - one_worker_state / 2) <= 0.01 * one_worker_state
    assert sum(per_rank) >= one_worker_state

    assert [h["epoch"] for h in res.history] == [2, 4, 6, 8]  # eval_every=2
    # early stopping: the checkpoint (and final) is the lowest held-out loss evaluation
    assert res.final["val_loss"] == min(h["val_loss"] for h in res.history)
    assert sum(h["selected"] for h in res.history) >= 1
    assert res.final["val_accuracy"] >= 0.9
    assert res.final["train_loss"] < res.history[0]["train_loss"]
    assert 0.0 <= res.final["val_ece"] <= 0.2

    # the checkpoint is a plain state dict: loads without DeepSpeed, same predictions
    model = load_reward_model(res.checkpoint_dir)
    read, _ = load_pairs(cfg)
    _, val_idx = split_indices(len(read), cfg.val_fraction, cfg.seed)
    metrics, _ = preference_metrics(member_gaps(model, read, val_idx), read.label[val_idx])
    assert metrics["val_accuracy"] == pytest.approx(res.final["val_accuracy"])
    torch.manual_seed(123)
    untrained = build_reward_ensemble(net_spec(cfg, read.shape))
    control, _ = preference_metrics(member_gaps(untrained, read, val_idx), read.label[val_idx])
    assert control["val_accuracy"] < 0.75

    # the MLflow run: per-epoch metrics, the ZeRO read-back, the calibration plot
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["zero_stage"] == 2
    assert len(client.get_metric_history(res.run_id, "val_accuracy")) == 4
    assert "calibration.png" in {a.path for a in client.list_artifacts(res.run_id)}


@pytest.mark.slow
def test_one_worker_holds_the_whole_state_and_ensemble_reports_uncertainty(ray_session,
                                                                           tmp_path):
    pairs, _ = synthetic_linear_pairs(800, seed=0)
    _write_parquet(pairs, tmp_path / "pairs")
    _, res = _run(tmp_path, num_workers=1, epochs=12, ensemble_size=3)
    assert res.zero["zero_stage"] == 2
    (state,), params = res.zero["opt_state_numel_per_rank"], res.zero["param_numel"]
    assert 2 * params <= state <= 2 * params * 1.01  # all of it, up to alignment padding
    assert res.final["val_accuracy"] >= 0.9
    assert res.final["val_gap_std"] > 0.0
    assert load_reward_model(res.checkpoint_dir).size == 3
