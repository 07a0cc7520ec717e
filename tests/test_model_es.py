"""The input-driven model and the policy search in it (cloudrl.algorithms.model_es)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from cloudrl.algorithms.model_es import (
    InputDrivenModel,
    ModelESConfig,
    input_columns,
    logged_counts,
    model_rollout,
    search,
)


def test_input_columns_are_those_every_episode_of_a_seed_shares():
    rng = np.random.default_rng(0)
    by_seed = {}
    for seed in range(3):
        inputs = rng.normal(size=(11, 2))
        eps = []
        for _ in range(3):
            o = np.concatenate([inputs, rng.normal(size=(11, 1)), np.zeros((11, 1))], 1)
            eps.append(o)
        by_seed[seed] = eps
    by_seed[1][2][5, 3] = 1.0  # one step of one episode of one seed moves column 3
    assert input_columns(by_seed).tolist() == [True, True, False, False]
    by_seed[7] = [np.zeros((11, 4))]  # a seed with one episode compares nothing
    assert input_columns(by_seed).tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match="two logged episodes"):
        input_columns({0: [np.zeros((3, 2))]})


def toy_data(n_days=30, steps=24, seed=0):
    """Column 0: a price (an input); column 1: a fleet level the action raises or lowers.
    Cost per period: price x (1 + level)."""
    rng = np.random.default_rng(seed)
    obs, acts, costs, nxt, days = [], [], [], [], []
    for _ in range(n_days):
        price = rng.uniform(0.5, 2.0, steps + 1)
        level = np.zeros(steps + 1)
        a = rng.integers(0, 2, steps)
        for t in range(steps):
            level[t + 1] = np.clip(level[t] + (0.2 if a[t] else -0.2), 0.0, 1.0)
        o = np.stack([price, level], 1).astype(np.float32)
        obs.append(o[:-1])
        nxt.append(o[1:])
        acts.append(a)
        costs.append(price[:-1] * (1 + level[:-1]))
        days.append(o)
    return (np.concatenate(obs), np.concatenate(acts), np.concatenate(costs),
            np.concatenate(nxt), np.stack(days))


def fitted(run_seed=0, steps=600):
    obs, acts, costs, nxt, days = toy_data()
    cfg = ModelESConfig(run_seed=run_seed, members=3, hiddens=(32, 32), model_steps=steps,
                        model_batch=128, model_lr=3e-3)
    model = InputDrivenModel(np.array([True, False]), 2, cfg)
    model.fit(obs, acts, costs, nxt, log=lambda s: None)
    return model, (obs, acts, costs, nxt, days)


@pytest.fixture(scope="module")
def toy_model():
    return fitted()


def test_the_model_learns_the_endogenous_state_and_the_cost_and_stays_in_range(toy_model):
    model, (obs, acts, costs, nxt, _) = toy_model
    test = toy_data(seed=1)
    r2 = model.held_out_r2(test[0], test[1], test[2], test[3])
    assert r2["cost"] > 0.9 and r2["d1"] > 0.9
    far = torch.tensor([[1.0, 50.0], [1.0, -50.0]])
    state, _, spread, extra = model.step(far, torch.tensor([1, 0]))
    assert state.min() >= obs[:, 1].min() - 1e-6 and state.max() <= obs[:, 1].max() + 1e-6
    assert (spread >= 0).all() and extra.shape == (2, 0)


def test_fitting_is_a_function_of_the_run_seed():
    a, _ = fitted(run_seed=3, steps=50)
    b, _ = fitted(run_seed=3, steps=50)
    c, _ = fitted(run_seed=4, steps=50)
    flat = [torch.cat([p.flatten() for p in m.parameters()]) for m in a.members]
    assert all(torch.equal(x, torch.cat([p.flatten() for p in y.parameters()]))
               for x, y in zip(flat, b.members, strict=True))
    assert not torch.equal(flat[0], torch.cat([p.flatten() for p in c.members[0].parameters()]))


class TwoActions(nn.Module):
    """A policy over the toy's two actions, leaning to the dear one to start with."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Linear(2, 2)
        with torch.no_grad():
            self.logits.weight.zero_()
            self.logits.bias.copy_(torch.tensor([0.0, 0.05]))

    @torch.no_grad()
    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.logits(obs).argmax(-1)[:, None]


def test_the_search_finds_the_cheaper_action_in_the_model(toy_model):
    model, (*_, days) = toy_model
    traces = torch.as_tensor(days)
    cfg = ModelESConfig(iterations=30, pairs=4, sigma=0.05, lr=0.02, traces_per_iteration=6,
                        eval_every=5, penalty=0.0)
    start = TwoActions()
    before, _, _ = model_rollout(model, [start], traces[20:], lambda a: a[:, 0])
    policy, history, kept = search(start, model, traces[:20], traces[20:], cfg,
                                   lambda a: a[:, 0], log=lambda s: None)
    after, _, _ = model_rollout(model, [policy], traces[20:], lambda a: a[:, 0])
    assert history[0]["iteration"] == 0 and history[0]["held_cost"] == pytest.approx(
        float(before[0]))
    assert kept > 0 and float(after[0]) < float(before[0]) - 1.0
    # the policy now takes the cheap action (0) on most held-out states
    acts = policy.greedy(traces[20:].reshape(-1, 2))
    assert float((acts == 0).float().mean()) > 0.9


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 1000), st.floats(0.0, 5.0))
def test_the_kept_iteration_is_the_lowest_held_out_objective(toy_model, seed, penalty):
    model, (*_, days) = toy_model
    traces = torch.as_tensor(days)
    cfg = ModelESConfig(run_seed=seed, iterations=4, pairs=2, sigma=0.05, lr=0.02,
                        traces_per_iteration=3, eval_every=2, penalty=penalty)
    policy, history, kept = search(TwoActions(), model, traces[:20], traces[20:], cfg,
                                   lambda a: a[:, 0], log=lambda s: None)
    best = min(history, key=lambda h: (h["held_objective"], h["iteration"]))
    assert kept == best["iteration"]
    c, s, _ = model_rollout(model, [policy], traces[20:], lambda a: a[:, 0])
    assert float(c[0] + penalty * s[0]) == pytest.approx(best["held_objective"], rel=1e-5)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="iterations"):
        ModelESConfig(iterations=0)
    with pytest.raises(ValueError, match="penalty"):
        ModelESConfig(penalty=-1.0)
    with pytest.raises(ValueError, match="sigma"):
        ModelESConfig(sigma=0.0)
    with pytest.raises(ValueError, match="dual_lr"):
        ModelESConfig(dual_lr=0.0)
    with pytest.raises(ValueError, match="members"):
        ModelESConfig(members=1.5)
    with pytest.raises(ValueError, match="every column is an input"):
        InputDrivenModel(np.array([True, True]), 2, ModelESConfig())
    model = InputDrivenModel(np.array([True, False]), 2, ModelESConfig(model_steps=1))
    with pytest.raises(ValueError, match="actions outside"):
        model.fit(np.zeros((4, 2)), np.array([0, 1, 2, 0]), np.zeros(4), np.zeros((4, 2)))


def test_the_constrained_search_keeps_the_predicted_violations_at_the_starts_level():
    """The cheap action (0) also runs the fleet into violations (level below 0.3): on the
    cost alone the search takes it and predicts more violations; constrained, the kept
    policy predicts no more than the start on the held-out days."""
    obs, acts, costs, nxt, days = toy_data(n_days=40)
    viol = (obs[:, 1] < 0.3).astype(float)[:, None]
    cfg = ModelESConfig(members=3, hiddens=(32, 32), model_steps=600, model_batch=128,
                        model_lr=3e-3, iterations=30, pairs=4, sigma=0.05, lr=0.02,
                        traces_per_iteration=6, eval_every=5, penalty=0.0, dual_lr=0.5)
    model = InputDrivenModel(np.array([True, False]), 2, cfg, n_extra=1)
    model.fit(obs, acts, costs, nxt, log=lambda s: None, extra=viol)
    traces = torch.as_tensor(days)

    def start():  # leans to the dear action that keeps the level up
        p = TwoActions()
        with torch.no_grad():
            p.logits.bias.copy_(torch.tensor([0.0, 0.3]))
        return p

    _, _, e0 = model_rollout(model, [start()], traces[30:], lambda a: a[:, 0])
    free, _, _ = search(start(), model, traces[:30], traces[30:],
                        ModelESConfig(**{**cfg.to_dict(), "constrained": False}),
                        lambda a: a[:, 0], log=lambda s: None)
    _, _, e_free = model_rollout(model, [free], traces[30:], lambda a: a[:, 0])
    held, history, kept = search(start(), model, traces[:30], traces[30:], cfg,
                                 lambda a: a[:, 0], log=lambda s: None)
    _, _, e_held = model_rollout(model, [held], traces[30:], lambda a: a[:, 0])
    assert float(e_free[0, 0]) > float(e0[0, 0]) + 1.0  # the cost alone buys violations
    assert float(e_held[0, 0]) <= float(e0[0, 0]) + 1e-6
    row = next(h for h in history if h["iteration"] == kept)
    assert row["feasible"] and all(h["feasible"] == (h["held_extra"][0] <= e0[0, 0] + 1e-6)
                                   for h in history)
    assert max(h.get("multipliers", [0.0])[0] for h in history) > 0.0
    with pytest.raises(ValueError, match="extra targets"):
        model.fit(obs, acts, costs, nxt, log=lambda s: None)


def burst_data(n_days=40, steps=24, seed=0):
    """The toy plus column 2, a burst drawn afresh every period whatever the action (the
    model can only predict its mean): every period has 0.5 violations, and the cheap
    action (0) one more when the burst is above 0.85, which only the logged states show."""
    rng = np.random.default_rng(seed)
    obs, acts, costs, nxt, viol, days = [], [], [], [], [], []
    for _ in range(n_days):
        price = rng.uniform(0.5, 2.0, steps + 1)
        burst = rng.uniform(0.0, 1.0, steps + 1)
        level = np.zeros(steps + 1)
        a = rng.integers(0, 2, steps)
        for t in range(steps):
            level[t + 1] = np.clip(level[t] + (0.2 if a[t] else -0.2), 0.0, 1.0)
        o = np.stack([price, level, burst], 1).astype(np.float32)
        obs.append(o[:-1])
        nxt.append(o[1:])
        acts.append(a)
        costs.append(price[:-1] * (1 + level[:-1]))
        viol.append(0.5 + ((a == 0) & (burst[:-1] > 0.85)).astype(float))
        days.append(o)
    return (np.concatenate(obs), np.concatenate(acts), np.concatenate(costs),
            np.concatenate(nxt), np.concatenate(viol)[:, None], np.stack(days))


class ThreeColumns(TwoActions):
    """:class:`TwoActions` on the burst toy's three columns, leaning to the dear action."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Linear(3, 2)
        with torch.no_grad():
            self.logits.weight.zero_()
            self.logits.bias.copy_(torch.tensor([0.0, 0.3]))


def test_the_logged_state_constraint_sees_violations_the_rollouts_smooth_away():
    obs, acts, costs, nxt, viol, days = burst_data()
    cfg = ModelESConfig(members=3, hiddens=(32, 32), model_steps=800, model_batch=128,
                        model_lr=3e-3, iterations=30, pairs=4, sigma=0.05, lr=0.02,
                        traces_per_iteration=6, eval_every=5, penalty=0.0, dual_lr=0.5,
                        logged_batch=256)
    model = InputDrivenModel(np.array([True, False, False]), 2, cfg, n_extra=1)
    model.fit(obs, acts, costs, nxt, log=lambda s: None, extra=viol)
    traces = torch.as_tensor(days)
    split = 30 * 24
    logged = (torch.as_tensor(obs[:split]), torch.as_tensor(obs[split:]))

    def flat(a):
        return a[:, 0]

    # at the logged states the model tells the cheap action's violations apart
    cheap = logged_counts(model, [ThreeColumns()], logged[1], lambda a: a[:, 0] * 0)
    dear = logged_counts(model, [ThreeColumns()], logged[1], flat)
    assert float(cheap[0, 0]) > float(dear[0, 0]) + 0.1
    l0 = float(dear[0, 0])
    rollout_only, _, _ = search(ThreeColumns(), model, traces[:30], traces[30:], cfg, flat,
                                log=lambda s: None)
    both, history, kept = search(ThreeColumns(), model, traces[:30], traces[30:],
                                 ModelESConfig(**{**cfg.to_dict(), "logged_states": True}),
                                 flat, log=lambda s: None, logged=logged)
    blind = float(logged_counts(model, [rollout_only], logged[1], flat)[0, 0])
    held = float(logged_counts(model, [both], logged[1], flat)[0, 0])
    assert blind > l0 + 0.05  # the rollouts' constraint lets the cheap action through
    assert held <= l0 + 1e-6
    assert all(h["feasible"] == (h["held_extra"][0] <= history[0]["held_extra"][0] + 1e-9
                                 and h["held_logged_extra"][0] <= l0 + 1e-9)
               for h in history[1:])
    assert max(h["logged_multipliers"][0] for h in history[1:]) > 0.0
    with pytest.raises(ValueError, match="logged observations"):
        search(ThreeColumns(), model, traces[:30], traces[30:],
               ModelESConfig(**{**cfg.to_dict(), "logged_states": True}), flat,
               log=lambda s: None)


def test_the_policy_sees_only_its_own_columns_of_the_models_state(toy_model):
    """With ``policy_columns`` the model's extra state columns (here the fleet level) stay
    out of the policy's observation, in the rollouts and at logged states alike."""
    model, (obs, *_, days) = toy_model
    seen = []

    class PriceOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Linear(1, 2)

        @torch.no_grad()
        def greedy(self, o: torch.Tensor) -> torch.Tensor:
            seen.append(o.shape[1])
            return self.w(o).argmax(-1)[:, None]

    traces = torch.as_tensor(days)
    model_rollout(model, [PriceOnly()], traces[:3], lambda a: a[:, 0], policy_columns=1)
    logged_counts(model, [PriceOnly()], torch.as_tensor(obs[:50]), lambda a: a[:, 0],
                  policy_columns=1)
    assert seen and set(seen) == {1}
    with pytest.raises(RuntimeError):  # without it the policy gets both columns
        model_rollout(model, [PriceOnly()], traces[:3], lambda a: a[:, 0])
