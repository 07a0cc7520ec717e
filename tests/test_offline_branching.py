"""The offline constrained agent on the branching interface: per-branch losses by hand,
the per-branch module, and ``cloudrl offline record|train|evaluate`` end to end."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from cloudrl.algorithms.cql_lag.losses import constrained_q_losses
from cloudrl.cli import main


def _huber(x: float) -> float:
    return 0.5 * x * x if abs(x) < 1 else abs(x) - 0.5


def _branching_batch(**over):
    """One transition, two branches of 2 and 3 sub-actions (padding at [0, 2])."""
    t = torch.tensor
    b = dict(
        qr=t([[[1.0, 2.0, 0.0], [0.0, 1.0, 3.0]]], requires_grad=True),
        qc=t([[[0.0, 1.0, 0.0], [2.0, 0.0, 1.0]]], requires_grad=True),
        qr_next=t([[[0.0, 1.0, 0.0], [5.0, 0.0, 0.0]]]),
        qc_next=t([[[0.0, 4.0, 0.0], [0.0, 0.0, 0.0]]]),
        qr_target_next=t([[[2.0, 6.0, 9.0], [4.0, 8.0, 8.0]]]),
        qc_target_next=t([[[1.0, 3.0, 9.0], [0.5, 2.0, 2.0]]]),
        feasible=t([[[True, True, False], [True, True, True]]]),
        next_feasible=t([[[True, True, False], [True, True, True]]]),
        actions=t([[1, 0]]), rewards=t([1.0]), costs=t([1.0]), terminateds=t([0.0]),
        lagrange=0.5, gamma=0.9, cql_alpha=1.0)
    b.update(over)
    return b


def test_branching_losses_match_a_hand_computation():
    terms = constrained_q_losses(**_branching_batch())
    # next sub-actions: branch 0 argmax(0 - 0, 1 - 2) = 0, branch 1 argmax(5, 0, 0) = 0;
    # joint target Q = mean(2, 4) = 3 (reward), mean(1, 0.5) = 0.75 (cost)
    y_r, y_c = 1.0 + 0.9 * 3.0, 1.0 + 0.9 * 0.75
    # Q of the data action per branch: Q_r (2, 0), Q_c (1, 2); both regress to the target
    assert terms.td_reward.item() == pytest.approx((_huber(2 - y_r) + _huber(0 - y_r)) / 2)
    assert terms.td_cost.item() == pytest.approx((_huber(1 - y_c) + _huber(2 - y_c)) / 2)
    # CQL per branch over its valid sub-actions (padding out), averaged over branches
    cql = ((math.log(math.e + math.e ** 2) - 2.0)
           + (math.log(1 + math.e + math.e ** 3) - 0.0)) / 2
    assert terms.cql_reward.item() == pytest.approx(cql)
    # policy: branch 0 argmax(1 - 0, 2 - 0.5) = 1 (Q_c 1), branch 1 argmax(-1, 1, 2.5) = 2
    # (Q_c 1): cost estimate (1 - 0.9) * mean(1, 1)
    assert terms.cost_estimate.item() == pytest.approx(0.1)
    assert terms.total.item() == pytest.approx(terms.td_reward.item()
                                               + terms.td_cost.item() + cql)


def test_one_branch_is_the_flat_form():
    """D = 1: the branching losses equal the flat ones on the same numbers."""
    flat = dict(qr=torch.tensor([[1.0, 2.0, 0.5]]), qc=torch.tensor([[0.0, 1.0, 2.0]]),
                qr_next=torch.tensor([[0.0, 1.0, 3.0]]), qc_next=torch.tensor([[0.0, 4.0, 0.0]]),
                qr_target_next=torch.tensor([[2.0, 5.0, 7.0]]),
                qc_target_next=torch.tensor([[0.5, 1.0, 1.0]]),
                feasible=torch.tensor([[True, True, False]]),
                next_feasible=torch.tensor([[True, False, True]]),
                actions=torch.tensor([1]), rewards=torch.tensor([1.0]),
                costs=torch.tensor([1.0]), terminateds=torch.tensor([0.0]), lagrange=0.3,
                gamma=0.9, cql_alpha=0.7, bc_logits=torch.tensor([[0.2, 0.1, 0.0]]),
                next_bc_logits=torch.tensor([[0.0, 0.0, 1.0]]), support_threshold=0.5)
    branched = {k: (v.unsqueeze(1) if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
                for k, v in flat.items()}
    branched["actions"] = flat["actions"].unsqueeze(1)
    a, b = constrained_q_losses(**flat), constrained_q_losses(**branched)
    for name in ("total", "td_reward", "td_cost", "cql_reward", "cost_estimate", "bc"):
        assert getattr(a, name).item() == pytest.approx(getattr(b, name).item()), name


class _Spaces:
    observation_space = gym.spaces.Dict({
        "macro": gym.spaces.Box(-1, 1, (2,), np.float32),
        "servers": gym.spaces.Box(0, 1, (2, 1), np.float32),
        "jobs": gym.spaces.Box(0, 1, (1, 1), np.float32),
        "action_mask": gym.spaces.Box(0, 1, (5,), np.float32)})
    action_space = gym.spaces.MultiDiscrete([3, 2])


def test_the_branching_module_acts_per_branch_on_valid_supported_sub_actions():
    from models.cql_lag_branching import CQLLagBranchingTorchRLModule

    module = CQLLagBranchingTorchRLModule(
        observation_space=_Spaces.observation_space, action_space=_Spaces.action_space,
        model_config={"encoder": {"hidden": 8}, "head_hiddens": [8]})
    # layout (D=2, max_n=3): branch 0 = entries 0..2, branch 1 = entries 3..4 (5 padding)
    with torch.no_grad():
        for name, bias in (("qr_head", [0.0, 1.0, 2.0, 1.0, 0.0, 9.0]),
                           ("qc_head", [0.0] * 6),
                           ("bc_head", [0.0, 0.0, -5.0, 0.0, 0.0, 0.0])):
            last = getattr(module, name)[-1]
            last.weight.zero_()
            last.bias.copy_(torch.tensor(bias))
    obs = {"macro": torch.zeros(1, 2), "servers": torch.zeros(1, 2, 1),
           "jobs": torch.zeros(1, 1, 1), "action_mask": torch.ones(1, 5)}

    def act(tau: float, mask=None) -> list[int]:
        module.support_threshold.fill_(tau)
        o = dict(obs, action_mask=mask if mask is not None else obs["action_mask"])
        return module.forward_inference({"obs": o})["actions"][0].tolist()

    assert act(0.0) == [2, 0]  # best Q per branch; padding (Q 9) never picked
    assert act(0.5) == [1, 0]  # sub-action 2 is unsupported (π_b ~ 0.003)
    assert act(0.0, torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])) == [1, 1]  # masked out
    with torch.no_grad():
        scores = module.compute_q_values({"obs": obs})["qf_preds"][0].numpy()
    assert scores.shape == (2, 3)  # (branches, largest branch): the layout serving reads
    assert scores[0].argmax() == 2 and scores[1, :2].argmax() == 0


TINY = ["--n-servers", "3", "--episode-length", "20", "--no-mlflow"]


def test_record_train_evaluate_on_the_branching_interface(tmp_path, capsys):
    data, ck = tmp_path / "data", tmp_path / "ck"
    assert main(["offline", "record", *TINY, "--interface", "branching", "--policy",
                 "power_aware", "--policy", "ffd", "--epsilon", "0", "--epsilon", "0.3",
                 "--episodes", "1", "--out", str(data)]) == 0
    assert "branching" in capsys.readouterr().out
    small = tmp_path / "small.yaml"
    small.write_text("train: {hidden: 8, train_batch_size: 64, minibatch_size: 32}\n")
    assert main(["offline", "train", *TINY, "--config", str(small), "--data", str(data),
                 "--iterations", "3", "--out", str(ck)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["checkpoint"] == str(ck.resolve()) and last["lagrange"] > 0
    meta = json.loads((ck / "cloudrl.json").read_text())
    assert meta["algo"] == "cql_lag" and meta["interface"] == "branching"
    # BC / MARWIL train the flat PPO module: refused on a branching dataset, one line
    assert main(["offline", "train", *TINY, "--data", str(data), "--algo", "bc"]) == 2
    err = capsys.readouterr().err
    assert "train.algo" in err and len(err.strip().splitlines()) == 1
    # the stock evaluation and the offline one load it on its interface
    assert main(["evaluate", "--checkpoint", str(ck), "--n-seeds", "2", "--workers", "1",
                 "--quiet", "--out", str(tmp_path / "ev")]) == 0
    assert "cql_lag:ck" in capsys.readouterr().out
    assert main(["offline", "evaluate", "--no-mlflow", "--checkpoint", str(ck), "--policy",
                 "power_aware", "--n-seeds", "2", "--out", str(tmp_path / "off")]) == 0
    rows = json.loads((tmp_path / "off.json").read_text())["rows"]
    assert [r["policy"] for r in rows] == ["cql_lag:ck", "power_aware"]
    # a flat checkpoint evaluated on the branching interface is one line, exit 2
    flat_data, flat_ck = tmp_path / "flat", tmp_path / "flat_ck"
    assert main(["offline", "record", *TINY, "--policy", "ffd", "--episodes", "1",
                 "--out", str(flat_data)]) == 0
    assert main(["offline", "train", *TINY, "--config", str(small), "--data", str(flat_data),
                 "--iterations", "1", "--out", str(flat_ck)]) == 0
    capsys.readouterr()
    assert main(["offline", "evaluate", "--no-mlflow", "--checkpoint", str(flat_ck),
                 "--checkpoint", str(ck), "--n-seeds", "1",
                 "--out", str(tmp_path / "mixed")]) == 2
    err = capsys.readouterr().err
    assert "interface" in err and len(err.strip().splitlines()) == 1
