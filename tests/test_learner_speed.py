"""Learner speed: the faster BDQ learner computes what the old one computed.

The old forward passes and RLlib's stock optimizer path live on as
``cloudrl.algorithms.bdq.reference``; here both learners get the same weights and the
same replay batch and must agree on loss, gradients and parameters after k updates. The
benchmark ``experiments/benchmarks/bench_learner.py`` runs at a tiny size.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.rllib.algorithms.dqn.dqn_learner import QF_NEXT_PREDS, QF_PREDS, QF_TARGET_NEXT_PREDS
from ray.rllib.core import DEFAULT_MODULE_ID
from torch import nn

from cloudrl.algorithms.bdq import BDQConfig
from cloudrl.algorithms.bdq.reference import (
    ReferenceBDQConfig,
    reference_branch_feasibility,
    reference_seq,
)
from envs.cluster_env import ClusterBranchingEnv
from models.bdq import branch_feasibility, fused_heads
from models.encoders import head, mlp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"))
import bench_learner  # noqa: E402

TINY = bench_learner.BenchConfig(n_servers=5, hidden=16, capacity=400)


@pytest.fixture(scope="module")
def env() -> ClusterBranchingEnv:
    return ClusterBranchingEnv({"n_servers": TINY.n_servers})


@pytest.fixture(scope="module")
def batch(env: ClusterBranchingEnv) -> dict[str, Any]:
    buffer = bench_learner.filled_buffer(env, TINY, seed=5)
    sample = buffer.sample(48, generator=torch.Generator().manual_seed(1))
    cols = bench_learner.replay_columns(sample, TINY.n_step).policy_batches[DEFAULT_MODULE_ID]
    return dict(cols.items())


def learner_pair(env: ClusterBranchingEnv, **training: Any) -> tuple[Any, Any]:
    """(new, reference) learners with identical weights."""
    learners = []
    for config_class in (BDQConfig, ReferenceBDQConfig):
        config = config_class().training(device_replay=True, **training)
        learners.append(bench_learner.build_learner(
            config, config.get_default_rl_module_spec().module_class, env, TINY))
    new, ref = learners
    ref.module[DEFAULT_MODULE_ID].load_state_dict(new.module[DEFAULT_MODULE_ID].state_dict())
    return new, ref


def loss_and_grads(learner: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, dict]:
    fwd = learner.module.forward_train({DEFAULT_MODULE_ID: batch})
    loss = learner.compute_losses(fwd_out=fwd, batch={DEFAULT_MODULE_ID: batch})
    grads = learner.compute_gradients(loss)
    named = dict(learner.module[DEFAULT_MODULE_ID].named_parameters())
    by_param = {id(p): n for n, p in named.items()}
    return loss[DEFAULT_MODULE_ID].detach(), {
        by_param[id(learner._params[pid])]: g.clone() for pid, g in grads.items()}


@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5), seed=st.integers(0, 99),
       density=st.sampled_from([0.0, 0.3, 1.0]))
@settings(max_examples=40, deadline=None)
def test_branch_feasibility_gather_matches_the_loop(sizes: list[int], seed: int,
                                                    density: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(7, sum(sizes), generator=gen) < density).float()
    cpu = torch.device("cpu")
    assert torch.equal(branch_feasibility(mask, sizes, 7, cpu),
                       reference_branch_feasibility(mask, sizes, 7, cpu))
    assert torch.equal(branch_feasibility(None, sizes, 3, cpu),
                       reference_branch_feasibility(None, sizes, 3, cpu))


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_mlp_relu_in_place_same_values_and_gradients(activation: str) -> None:
    """ReLU runs in place on its Linear's output (one allocation and pass fewer per
    layer); values and gradients equal the out-of-place network's."""
    torch.manual_seed(0)
    net = head(6, (16, 16), 3, activation)
    acts = [m for m in net if not isinstance(m, nn.Linear)]
    assert len(acts) == 2 and all(getattr(m, "inplace", False) == (activation == "relu")
                                  for m in acts)
    x = torch.randn(40, 6, requires_grad=True)
    out, ref = net(x), reference_seq(net, x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), [x, *net.parameters()])
    grads_ref = torch.autograd.grad((ref * w).sum(), [x, *net.parameters()])
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len(mlp(4, ())) == 0  # the empty MLP stays the identity


@pytest.mark.parametrize("widths", [(), (8,), (8, 6)])
def test_fused_heads_equal_each_head_padded(widths: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    sizes = [1, 5, 3, 5, 2]
    heads = [head(10, widths, n) for n in sizes]
    x = torch.randn(9, 10, requires_grad=True)
    fused = fused_heads(x, heads, sizes)
    loop = torch.stack([nn.functional.pad(h(x), (0, 5 - n))
                        for h, n in zip(heads, sizes, strict=True)], 1)
    torch.testing.assert_close(fused, loop, rtol=1e-5, atol=1e-6)
    weights = torch.randn_like(loop)
    grads_fused = torch.autograd.grad((fused * weights).sum(), [x, *heads[1].parameters()])
    grads_loop = torch.autograd.grad((loop * weights).sum(), [x, *heads[1].parameters()])
    for a, b in zip(grads_fused, grads_loop, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("double_q", "fused"), [(True, None), (False, None), (True, True)])
def test_loss_and_gradients_match_the_reference(env: ClusterBranchingEnv, batch: dict,
                                                double_q: bool, fused: bool | None) -> None:
    new, ref = learner_pair(env, double_q=double_q)
    new.module[DEFAULT_MODULE_ID].fused_heads = fused
    loss_new, grads_new = loss_and_grads(new, batch)
    loss_ref, grads_ref = loss_and_grads(ref, batch)
    torch.testing.assert_close(loss_new, loss_ref, rtol=1e-5, atol=1e-6)
    assert grads_new.keys() == grads_ref.keys() and len(grads_new) > 20
    for name, grad in grads_new.items():
        torch.testing.assert_close(grad, grads_ref[name], rtol=1e-4, atol=1e-6, msg=name)
    torch.testing.assert_close(new.device_td_errors[DEFAULT_MODULE_ID],
                               ref.device_td_errors[DEFAULT_MODULE_ID], rtol=1e-5, atol=1e-5)


def test_parameters_after_k_updates_match_the_reference(env: ClusterBranchingEnv,
                                                        batch: dict) -> None:
    new, ref = learner_pair(env)
    ts = {"num_env_steps_sampled_lifetime": 0}
    multi = bench_learner.replay_columns(
        {"obs": batch["obs"], "next_obs": batch["new_obs"], "actions": batch["actions"],
         "rewards": batch["rewards"], "dones": batch["terminateds"],
         "discounts": batch["discounts"], "weights": batch["weights"]}, TINY.n_step)
    initial = {k: v.clone() for k, v in ref.module[DEFAULT_MODULE_ID].state_dict().items()}
    for _ in range(3):
        new.update(batch=multi, timesteps=ts)
        ref.update(batch=multi, timesteps=ts)
    state_ref = ref.module[DEFAULT_MODULE_ID].state_dict()
    for name, value in new.module[DEFAULT_MODULE_ID].state_dict().items():
        torch.testing.assert_close(value, state_ref[name], rtol=1e-4, atol=1e-5, msg=name)
    moved = sum(not torch.equal(v, initial[k]) for k, v in state_ref.items())
    assert moved > 20  # the updates did change the weights


def test_next_state_passes_record_no_autograd_graph(env: ClusterBranchingEnv,
                                                    batch: dict) -> None:
    """Only Q(s, .) back-propagates: the next-state Qs (argmax pick, bootstrap) carry no
    graph, so backward runs over B observations, not 2B (failed with the original learner)."""
    new, _ = learner_pair(env)
    out = new.module[DEFAULT_MODULE_ID].forward_train(batch)
    assert out[QF_PREDS].requires_grad
    assert not out[QF_NEXT_PREDS].requires_grad and not out[QF_TARGET_NEXT_PREDS].requires_grad


def test_optimizer_is_fused_adam_and_nonfinite_gradients_are_zeroed(
        env: ClusterBranchingEnv) -> None:
    new, _ = learner_pair(env)
    optim = new.get_optimizer(DEFAULT_MODULE_ID)
    assert isinstance(optim, torch.optim.Adam) and optim.defaults["fused"] is True
    params = list(new._params.values())
    grads = {pid: torch.ones_like(p) for pid, p in new._params.items()}
    first = next(iter(grads))
    grads[first] = torch.full_like(grads[first], float("nan"))
    before = [p.detach().clone() for p in params]
    new.apply_gradients(grads)  # stock semantics: nan -> 0 (with a warning), then step
    assert torch.equal(new._params[first].grad, torch.zeros_like(grads[first]))
    assert all(torch.isfinite(p).all() for p in params)
    assert sum(not torch.equal(a, b) for a, b in zip(before, params, strict=True)) > 20


def test_bench_learner_runs_at_a_tiny_size(capsys: pytest.CaptureFixture[str]) -> None:
    results = bench_learner.run([16], bench_learner.ROWS, TINY, seconds=0.2, rounds=1,
                                profile_updates=1)
    assert [r["row"] for r in results] == list(bench_learner.ROWS)
    for r in results:
        assert r["updates"] >= 1 and r["updates_per_s"] > 0 and r["cpu_s_per_update"] > 0
        assert set(r["shares"]) == set(bench_learner.PHASES)
        assert sum(r["shares"].values()) == pytest.approx(1.0, abs=1e-6)
        assert r["shares"]["fwd+loss"] > 0 and r["shares"]["backward"] > 0
    table = bench_learner.format_results(results)
    assert "bdq / bdq-reference" in table and "16 dqn" in table
    with pytest.raises(SystemExit) as exc:
        bench_learner.main(["--batches", "512,x"])
    assert exc.value.code == 2
    assert "--batches" in capsys.readouterr().err
