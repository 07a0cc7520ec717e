"""CQL-Lagrangian fixes: BCQ's action filter, the BC head, the upward cost
penalty and the plain (saturating) dual ascent, each against a hand computation."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from cloudrl.algorithms.cql_lag.lagrange import LagrangeController
from cloudrl.algorithms.cql_lag.losses import constrained_q_losses, supported_actions
from tests.test_offline_cql_lag import _batch, _huber

LN = math.log


def test_the_filter_keeps_valid_actions_within_tau_of_the_most_likely():
    logits = torch.tensor([[LN(4.0), LN(1.0), 5.0], [0.0, 0.0, 0.0]])
    feasible = torch.tensor([[True, True, False], [True, True, True]])
    # s0 over its valid actions: π_b = (0.8, 0.2); the invalid action's big logit is out
    assert supported_actions(logits, feasible, 0.3).tolist() == [[True, False, False],
                                                                 [True, True, True]]
    # action 1 passes while 0.2 >= τ·0.8, i.e. τ <= 0.25
    assert supported_actions(logits, feasible, 0.2501).tolist()[0] == [True, False, False]
    assert supported_actions(logits, feasible, 0.2499).tolist()[0] == [True, True, False]
    assert supported_actions(logits, feasible, 0.0).tolist() == feasible.tolist()
    assert supported_actions(None, feasible, 0.9).tolist() == feasible.tolist()
    # τ = 1: only the mode (ties kept)
    assert supported_actions(logits, feasible, 1.0).tolist() == [[True, False, False],
                                                                 [True, True, True]]


def _bc_batch(**over):
    t = torch.tensor
    return _batch(bc_logits=t([[LN(4.0), LN(1.0), 5.0], [0.0, 0.0, 0.0]], requires_grad=True),
                  next_bc_logits=t([[LN(1.0), LN(4.0), 0.0], [0.0, 0.0, 0.0]]),
                  **{"support_threshold": 0.3, **over})


def test_the_filtered_losses_match_a_hand_computation():
    terms = constrained_q_losses(**_bc_batch())
    # s0': only action 1 is supported (π_b 0.8 vs 0.2): a' = 1 although argmax(qr' - λqc')
    #      over the valid ones is 0; targets 1 + 0.9*5 and 0 + 0.9*1; s1 terminal
    td_r = (_huber(1.0 - 5.5) + _huber(1.0 - (-1.0))) / 2
    td_c = (_huber(0.0 - 0.9) + _huber(0.0 - 1.0)) / 2
    cql_r = ((LN(math.e + math.e ** 2) - 1.0) + (LN(math.exp(0.5) + 1 + math.e) - 1.0)) / 2
    bc = (-LN(0.8) - LN(1 / 3)) / 2  # data actions 0 (π_b 0.8) and 2 (1/3)
    assert terms.td_reward.item() == pytest.approx(td_r)
    assert terms.td_cost.item() == pytest.approx(td_c)
    assert terms.bc.item() == pytest.approx(bc)
    assert terms.total.item() == pytest.approx(td_r + td_c + cql_r + bc)
    # the policy at s0 may only take action 0 (Q_c 0); at s1 action 2 (Q_c 0)
    assert terms.cost_estimate.item() == pytest.approx(0.0)
    assert terms.supported.item() == pytest.approx((1 + 3) / 2)
    half = constrained_q_losses(**_bc_batch(bc_weight=0.5))
    assert half.total.item() == pytest.approx(td_r + td_c + cql_r + 0.5 * bc)
    # without the filter (τ = 0) the policy at s0 takes action 1 (Q_c 1): as before
    free = constrained_q_losses(**_bc_batch(support_threshold=0.0))
    assert free.cost_estimate.item() == pytest.approx(0.1 * 0.5)


def test_the_upward_cost_penalty_raises_q_c_off_the_data():
    up = (LN(1 + math.exp(-1.0)) + 0.0 + LN(math.exp(-1.0) + 2) + 0.0) / 2
    base = constrained_q_losses(**_batch())
    pen = constrained_q_losses(**_batch(cost_upper_alpha=2.0))
    assert pen.cost_upper.item() == pytest.approx(up)
    assert pen.total.item() == pytest.approx(base.total.item() + 2.0 * up)
    b = _batch(cql_alpha=0.0, cost_upper_alpha=1.0)
    b["qr"] = b["qr"].detach()
    only_pen = constrained_q_losses(**b)
    (only_pen.total - only_pen.td_cost).backward()
    g = b["qc"].grad
    # gradient descent RAISES Q_c of the actions the data did not take (negative grad),
    # lowers it on the data action, and leaves invalid actions alone
    assert g[0, 1].item() < 0 and g[1, 0].item() < 0 and g[1, 1].item() < 0
    assert g[0, 0].item() > 0 and g[1, 2].item() > 0
    assert g[0, 2].item() == 0.0
    # the source's CQL on the cost head pushes the other way
    b2 = _batch(cql_alpha=0.0, cql_cost_alpha=1.0)
    b2["qr"] = b2["qr"].detach()
    abl = constrained_q_losses(**b2)
    (abl.total - abl.td_cost).backward()
    assert b2["qc"].grad[0, 1].item() > 0


def test_only_the_bc_head_learns_from_the_bc_term_and_the_filter_has_no_gradient():
    b = _bc_batch(cql_alpha=0.0)
    terms = constrained_q_losses(**b)
    terms.bc.backward()
    g = b["bc_logits"].grad
    # d/dlogits of mean CE: (softmax - onehot) / B over the valid actions
    assert g[0].tolist() == pytest.approx([(0.8 - 1) / 2, 0.2 / 2, 0.0])
    assert g[1].tolist() == pytest.approx([1 / 6, 1 / 6, (1 / 3 - 1) / 2])
    assert b["qr"].grad is None and b["qc"].grad is None


def test_plain_dual_ascent_is_unnormalised_and_saturates():
    plain = LagrangeController(mode="plain", init=1.0, lr=0.1, max_value=100.0)
    assert plain.update(3.0, 1.0) == pytest.approx(math.exp(0.2))  # raw error 2
    for _ in range(30):
        plain.update(30.0, 1.0)  # the cost scale sets the step: λ runs to its bound
    assert plain.value == pytest.approx(100.0)
    dual = LagrangeController(mode="dual", init=1.0, lr=0.1, max_value=100.0)
    for _ in range(30):
        dual.update(30.0, 1.0)
    assert dual.value == pytest.approx(math.exp(3.0))  # relative error clipped at 1


class _Box(gym.Env):
    observation_space = gym.spaces.Dict({
        "macro": gym.spaces.Box(0, 1, (2,), np.float32),
        "servers": gym.spaces.Box(0, 1, (1, 1), np.float32),
        "jobs": gym.spaces.Box(0, 1, (1, 1), np.float32),
        "action_mask": gym.spaces.Box(0, 1, (3,), np.float32)})
    action_space = gym.spaces.Discrete(3)


def test_the_module_acts_only_on_supported_actions():
    from models.cql_lag import CQLLagTorchRLModule

    module = CQLLagTorchRLModule(observation_space=_Box.observation_space,
                                 action_space=_Box.action_space,
                                 model_config={"encoder": {"hidden": 8}, "head_hiddens": [8]})
    with torch.no_grad():
        for name, bias in (("qr_head", [0.0, 1.0, 2.0]), ("qc_head", [0.0, 0.0, 0.0]),
                           ("bc_head", [LN(6.0), LN(3.0), LN(1.0)])):
            last = getattr(module, name)[-1]
            last.weight.zero_()
            last.bias.copy_(torch.tensor(bias))
    obs = {"macro": torch.zeros(1, 2), "servers": torch.zeros(1, 1, 1),
           "jobs": torch.zeros(1, 1, 1), "action_mask": torch.ones(1, 3)}

    def act(tau: float) -> int:
        module.support_threshold.fill_(tau)
        return int(module.forward_inference({"obs": obs})["actions"])

    # π_b = (0.6, 0.3, 0.1): τ = 0 takes the best Q (2), τ = 0.3 drops action 2,
    # τ = 0.6 keeps only the mode
    assert [act(0.0), act(0.3), act(0.6)] == [2, 1, 0]
    assert "support_threshold" in module.state_dict()  # checkpoints carry τ


def test_within_budget_share_and_its_wilson_interval():
    from cloudrl.offline.evaluation import within_budget

    assert within_budget([0, 1, 2, 3], 1.5) == 0.5
    lo, hi = within_budget([0, 1, 2, 3], 1.5, ci=True)
    assert (lo, hi) == (pytest.approx(0.1500, abs=1e-3), pytest.approx(0.8500, abs=1e-3))
    assert within_budget([0.0] * 20, 0.5, ci=True)[1] == 1.0


def test_the_behaviour_head_learns_from_the_safe_episodes_only():
    from types import SimpleNamespace

    from cloudrl.algorithms.cql_lag.cql_lag_learner import safe_steps

    batch = {"episode_costs": torch.tensor([0.0, 2.0, 5.0])}
    cfg = SimpleNamespace(support_data="safe", cost_budget=2.0)
    assert safe_steps(batch, cfg).tolist() == [True, True, False]
    assert safe_steps(batch, SimpleNamespace(support_data="all", cost_budget=2.0)) is None
    # no safe step in the batch: all of them (no feasible behaviour to clone)
    assert safe_steps(batch, SimpleNamespace(support_data="safe", cost_budget=-1.0)) is None
    # the masked BC term averages over the safe samples only
    b = _bc_batch(bc_mask=torch.tensor([True, False]))
    assert constrained_q_losses(**b).bc.item() == pytest.approx(-LN(0.8))


def test_support_top_keeps_the_highest_return_share_of_the_safe_episodes():
    from types import SimpleNamespace

    from cloudrl.algorithms.cql_lag.cql_lag_learner import safe_steps
    from cloudrl.algorithms.cql_lag.offline_data import support_episodes

    class _Ep:
        def __init__(self, ret: float, cost: float) -> None:
            self.ret, self.cost = ret, cost

        def get_return(self) -> float:
            return self.ret

        def __len__(self) -> int:
            return 1

        def get_infos(self, t: int) -> dict:
            return {"cost": self.cost}

    # returns / costs: the best return (10) is over the budget of 1
    eps = [_Ep(10, 5), _Ep(8, 0), _Ep(6, 1), _Ep(4, 0), _Ep(2, 0)]
    assert support_episodes(eps, 1.0, True, 1.0) == [False, True, True, True, True]
    assert support_episodes(eps, 1.0, True, 0.5) == [False, True, True, False, False]
    assert support_episodes(eps, 1.0, True, 0.01) == [False, True, False, False, False]
    assert support_episodes(eps, 1.0, False, 0.4) == [True, True, False, False, False]
    # nothing within the budget: the top share of all of them
    assert support_episodes(eps, -1.0, True, 0.2) == [True, False, False, False, False]
    # the learner's BC mask follows the loader's marks when support_top < 1
    batch = {"episode_costs": torch.tensor([0.0, 0.0]),
             "support_episodes": torch.tensor([1.0, 0.0])}
    cfg = SimpleNamespace(support_data="safe", cost_budget=2.0, support_top=0.5)
    assert safe_steps(batch, cfg).tolist() == [True, False]
    cfg.support_top = 1.0
    assert safe_steps(batch, cfg).tolist() == [True, True]
