"""CQL-Lagrangian learner: losses by hand, λ's direction, a tiny constrained MDP."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from cloudrl.algorithms.cql_lag.lagrange import LagrangeController
from cloudrl.algorithms.cql_lag.losses import constrained_q_losses

# ----------------------------------------------------------------------------- losses


def _batch(**over):
    t = torch.tensor
    b = dict(
        qr=t([[1.0, 2.0, 0.0], [0.5, 0.0, 1.0]], requires_grad=True),
        qc=t([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0]], requires_grad=True),
        qr_next=t([[0.0, 1.0, 3.0], [0.0, 0.0, 0.0]]),
        qc_next=t([[0.0, 4.0, 0.0], [0.0, 0.0, 0.0]]),
        qr_target_next=t([[2.0, 5.0, 7.0], [9.0, 9.0, 9.0]]),
        qc_target_next=t([[0.5, 1.0, 1.0], [9.0, 9.0, 9.0]]),
        feasible=t([[True, True, False], [True, True, True]]),
        next_feasible=t([[True, True, False], [True, True, True]]),
        actions=t([0, 2]), rewards=t([1.0, -1.0]), costs=t([0.0, 1.0]),
        terminateds=t([0.0, 1.0]), lagrange=0.5, gamma=0.9, cql_alpha=1.0)
    b.update(over)
    return b


def _huber(x: float) -> float:
    return 0.5 * x * x if abs(x) < 1 else abs(x) - 0.5


def test_losses_match_a_hand_computation():
    terms = constrained_q_losses(**_batch())
    # s0: next action argmax_valid(qr' - 0.5 qc') = argmax(0, -1) = 0;
    #     targets 1 + 0.9*2 and 0 + 0.9*0.5
    # s1: terminal: targets are r and c
    td_r = (_huber(1.0 - 2.8) + _huber(1.0 - (-1.0))) / 2
    td_c = (_huber(0.0 - 0.45) + _huber(0.0 - 1.0)) / 2
    cql_r = ((math.log(math.e + math.e ** 2) - 1.0)
             + (math.log(math.exp(0.5) + 1 + math.e) - 1.0)) / 2
    assert terms.td_reward.item() == pytest.approx(td_r)
    assert terms.td_cost.item() == pytest.approx(td_c)
    assert terms.cql_reward.item() == pytest.approx(cql_r)  # the invalid action 2 of s0 is out
    assert terms.total.item() == pytest.approx(td_r + td_c + cql_r)
    # policy at s: argmax_valid(qr - 0.5 qc): s0 -> action 1 (Q_c 1), s1 -> action 2 (Q_c 0)
    assert terms.cost_estimate.item() == pytest.approx(0.1 * 0.5)


def test_cql_on_the_cost_head_is_the_ablation_and_scales_apply():
    cql_c = ((math.log(1 + math.e) - 0.0) + (math.log(math.e + 2) - 0.0)) / 2
    base = constrained_q_losses(**_batch())
    abl = constrained_q_losses(**_batch(cql_cost_alpha=2.0))
    assert abl.cql_cost.item() == pytest.approx(cql_c)
    assert abl.total.item() == pytest.approx(base.total.item() + 2.0 * cql_c)
    scaled = constrained_q_losses(**_batch(reward_scale=0.5, cost_scale=2.0))
    # s0 targets: 0.5*1 + 0.9*2 = 2.3 ; 2*0 + 0.9*0.5; s1: 0.5*-1, 2*1
    assert scaled.td_reward.item() == pytest.approx((_huber(1 - 2.3) + _huber(1 + 0.5)) / 2)
    assert scaled.td_cost.item() == pytest.approx((_huber(-0.45) + _huber(-2.0)) / 2)


def test_only_the_online_heads_get_gradients():
    b = _batch()
    constrained_q_losses(**b).total.backward()
    assert b["qr"].grad is not None and b["qc"].grad is not None
    # the invalid action of s0 gets no CQL gradient
    assert b["qr"].grad[0, 2].item() == 0.0


# ----------------------------------------------------------------------------- λ


@pytest.mark.parametrize("mode", ["dual", "pid"])
def test_lagrange_rises_above_the_threshold_and_falls_below(mode):
    ctl = LagrangeController(mode=mode, init=1.0, lr=0.1, kp=0.1, ki=0.05)
    values = [ctl.update(0.2, 0.1) for _ in range(20)]  # cost twice the threshold
    assert all(b > a for a, b in zip([1.0, *values], values, strict=False))
    top = values[-1]
    down = [ctl.update(0.0, 0.1) for _ in range(20)]  # no cost
    assert all(b < a for a, b in zip([top, *down], down, strict=False))
    assert down[-1] < top


@pytest.mark.parametrize("mode", ["dual", "pid"])
def test_lagrange_is_frozen_during_the_warmup_then_moves(mode):
    ctl = LagrangeController(mode=mode, init=0.5, lr=0.1, kp=0.1, ki=0.05, warmup=30)
    frozen = [ctl.update(0.0, 0.1) for _ in range(30)]  # an unconverged critic: Q_c = 0
    assert frozen == [0.5] * 30
    assert ctl.update(0.0, 0.1) < 0.5  # the 31st update is the first to move λ
    hot = LagrangeController(mode=mode, init=0.5, lr=0.1, kp=0.1, ki=0.05, warmup=3)
    assert [hot.update(0.2, 0.1) for _ in range(3)] == [0.5] * 3
    assert hot.update(0.2, 0.1) > 0.5
    with pytest.raises(ValueError, match="warmup"):
        LagrangeController(warmup=-1)


def test_the_default_config_freezes_lambda_for_its_warmup():
    from cloudrl.algorithms.cql_lag import CQLLagConfig

    cfg = CQLLagConfig()
    ctl = cfg.lagrange_controller()
    assert cfg.lagrange_warmup >= 100
    assert {ctl.update(0.0, 0.1) for _ in range(cfg.lagrange_warmup)} == {cfg.lagrange_init}


def test_default_target_update_is_polyak_every_update():
    from cloudrl.algorithms.cql_lag import CQLLagConfig
    from cloudrl.algorithms.cql_lag.cql_lag_learner import update_targets

    cfg = CQLLagConfig()
    torch.manual_seed(0)
    main, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    old = [p.detach().clone() for p in target.parameters()]
    assert update_targets([(main, target)], 1, cfg.target_network_update_freq, cfg.tau)
    assert 0 < cfg.tau < 1
    for p_main, p_old, p_new in zip(main.parameters(), old, target.parameters(), strict=True):
        expected = cfg.tau * p_main.detach() + (1 - cfg.tau) * p_old
        assert torch.allclose(p_new, expected, atol=1e-6)
        assert not torch.allclose(p_new, p_main)  # averaged, not copied
    # tau = 1 is a hard copy; off-period steps leave the target alone
    assert not update_targets([(main, target)], 3, 2, 1.0)
    assert update_targets([(main, target)], 4, 2, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(main.parameters(), target.parameters(),
                                                 strict=True))


def test_dual_ascent_is_bounded_and_its_step_does_not_depend_on_the_cost_scale():
    ctl = LagrangeController(init=1.0, lr=0.1, min_value=0.5, max_value=2.0)
    assert ctl.update(1e6, 1e-3) == pytest.approx(math.exp(0.1))  # relative error clipped at 1
    for _ in range(100):
        ctl.update(1e6, 1e-3)
    assert ctl.value == pytest.approx(2.0)
    for _ in range(100):
        ctl.update(0.0, 1e-3)
    assert ctl.value == pytest.approx(0.5)
    a, b = LagrangeController(init=1.0), LagrangeController(init=1.0)
    assert a.update(0.15, 0.1) == pytest.approx(b.update(150.0, 100.0))
    with pytest.raises(ValueError, match="mode"):
        LagrangeController(mode="sgd")
    with pytest.raises(ValueError, match="lagrange_min"):
        LagrangeController(init=0.0)


# ----------------------------------------------------------------------------- tiny CMDP


class TwoStateCMDP(gym.Env):
    """States A and B (one-hot ``macro``), i.i.d. each step; two actions.

    A: a0 -> r 1, c 1; a1 -> r 0.5, c 0.   B: a0 -> r 1, c 1; a1 -> r 0.1, c 0.
    Budget 0.5 per step: the constrained optimum is a1 in A, a0 in B (cost 0.5, reward
    0.75); unconstrained it is a0 everywhere (cost 1); a1 everywhere has cost 0, reward 0.3.
    """

    R = np.array([[1.0, 0.5], [1.0, 0.1]])
    C = np.array([[1.0, 0.0], [1.0, 0.0]])

    def __init__(self, config=None, length: int = 20) -> None:
        self.observation_space = gym.spaces.Dict({
            "macro": gym.spaces.Box(0, 1, (2,), np.float32),
            "servers": gym.spaces.Box(0, 1, (1, 1), np.float32),
            "jobs": gym.spaces.Box(0, 1, (1, 1), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (2,), np.float32)})
        self.action_space = gym.spaces.Discrete(2)
        self.length = length

    def _obs(self):
        macro = np.zeros(2, np.float32)
        macro[self.state] = 1
        return {"macro": macro, "servers": np.zeros((1, 1), np.float32),
                "jobs": np.zeros((1, 1), np.float32), "action_mask": np.ones(2, np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.state = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        r, c = self.R[self.state, action], self.C[self.state, action]
        self.t += 1
        self.state = int(self.np_random.integers(2))
        return self._obs(), float(r), False, self.t >= self.length, {"violations": float(c)}


class UniformPolicy:
    name, interface = "uniform", "flat"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        pass

    def act(self, obs):
        return int(self.rng.integers(2))


def cmdp_episodes(n: int = 40, length: int = 20):
    from cloudrl.offline.dataset import CostInfo
    from cloudrl.recording import record_episode

    env, pol = CostInfo(TwoStateCMDP(length=length)), UniformPolicy()
    return [record_episode(env, pol, seed) for seed in range(n)]


def _transitions(episodes):
    obs, nxt, act, rew, cost, term = [], [], [], [], [], []
    for ep in episodes:
        for t in range(len(ep)):
            obs.append(ep.get_observations(t))
            nxt.append(ep.get_observations(t + 1))
            act.append(int(ep.get_actions(t)))
            rew.append(float(ep.get_rewards(t)))
            cost.append(float(ep.get_infos(t + 1)["cost"]))
            term.append(0.0)

    def stack(rows):
        return {k: torch.tensor(np.stack([r[k] for r in rows])) for k in rows[0]}

    return (stack(obs), stack(nxt), torch.tensor(act), torch.tensor(rew),
            torch.tensor(cost), torch.tensor(term))


def train_on_cmdp(episodes, *, budget_per_step: float, updates: int = 300,
                  lagrange_max: float = 100.0, seed: int = 0):
    """The learner's update (same losses, controller, module) in a plain torch loop."""
    from ray.rllib.core.columns import Columns

    from models import cql_lag as M
    from models.cql_lag import CQLLagTorchRLModule

    torch.manual_seed(seed)
    env = TwoStateCMDP()
    module = CQLLagTorchRLModule(observation_space=env.observation_space,
                                 action_space=env.action_space,
                                 model_config={"encoder": {"hidden": 16, "macro_hiddens": [16],
                                                           "row_hiddens": [4]},
                                               "head_hiddens": [16]})
    module.make_target_networks()
    ctl = LagrangeController(init=min(0.1, lagrange_max), lr=0.05,
                             min_value=min(1e-3, lagrange_max), max_value=lagrange_max)
    opt = torch.optim.Adam(module.parameters(), lr=3e-3)
    obs, nxt, act, rew, cost, term = _transitions(episodes)
    gen = torch.Generator().manual_seed(seed)
    lambdas = []
    for step in range(updates):
        idx = torch.randint(len(act), (64,), generator=gen)
        fwd = module.forward_train({Columns.OBS: {k: v[idx] for k, v in obs.items()},
                                    Columns.NEXT_OBS: {k: v[idx] for k, v in nxt.items()}})
        terms = constrained_q_losses(
            qr=fwd[M.QR], qc=fwd[M.QC], qr_next=fwd[M.QR_NEXT], qc_next=fwd[M.QC_NEXT],
            qr_target_next=fwd[M.QR_TARGET_NEXT], qc_target_next=fwd[M.QC_TARGET_NEXT],
            feasible=fwd[M.FEASIBLE], next_feasible=fwd[M.NEXT_FEASIBLE], actions=act[idx],
            rewards=rew[idx], costs=cost[idx], terminateds=term[idx], lagrange=ctl.value,
            gamma=0.5, cql_alpha=0.1)
        opt.zero_grad()
        terms.total.backward()
        opt.step()
        module.lagrange.fill_(ctl.update(terms.cost_estimate.item(), budget_per_step))
        lambdas.append(ctl.value)
        if step % 20 == 0:
            for main, target in module.get_target_network_pairs():
                target.load_state_dict(main.state_dict())
    return module, lambdas


def greedy(module, state: int) -> int:
    env = TwoStateCMDP()
    env.state = state
    obs = {k: torch.tensor(v)[None] for k, v in env._obs().items()}
    with torch.no_grad():
        return int(module.compute_q_values({"obs": obs})["qf_preds"].argmax(-1))


@pytest.fixture(scope="module")
def cmdp_data():
    return cmdp_episodes()


def test_the_agent_finds_the_constrained_optimum_of_a_tiny_cmdp(cmdp_data):
    module, lambdas = train_on_cmdp(cmdp_data, budget_per_step=0.5)
    assert (greedy(module, 0), greedy(module, 1)) == (1, 0)  # a1 in A, a0 in B
    assert 0.5 < float(module.lagrange) < 0.9  # the λ range where that is the argmax
    # without the constraint (λ capped near 0) the same data gives a0 everywhere
    free, _ = train_on_cmdp(cmdp_data, budget_per_step=0.5, lagrange_max=0.01)
    assert (greedy(free, 0), greedy(free, 1)) == (0, 0)
    # a budget of 0 per step: a1 everywhere
    strict, _ = train_on_cmdp(cmdp_data, budget_per_step=1e-3)
    assert (greedy(strict, 0), greedy(strict, 1)) == (1, 1)
