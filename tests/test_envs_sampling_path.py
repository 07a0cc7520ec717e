"""The env runner's per-step module path: masked PPO and BDQ explore without RLlib's mode toggle.

RLlib's TorchRLModule.forward_exploration/forward_inference call ``eval()`` and then
``train()`` around every call (two walks over all submodules per env step). The masked PPO
module skips them; that is only behaviour-preserving while no layer depends on the mode,
which the first test checks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.torch import TorchRLModule

from envs.cluster_env import ClusterSchedulingEnv
from models.masked_ppo import MaskedPPOTorchRLModule

MODE_DEPENDENT = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._NormBase)


def _module_and_batch(**extra):
    env = ClusterSchedulingEnv({"n_servers": 6})
    torch.manual_seed(0)
    module = MaskedPPOTorchRLModule(observation_space=env.observation_space,
                                    action_space=env.action_space,
                                    model_config={"head_hiddens": [16], **extra})
    obs = [env.reset(seed=s)[0] for s in range(4)]
    batch = {Columns.OBS: {key: torch.as_tensor(np.stack([o[key] for o in obs]))
                           for key in obs[0]}}
    return module, batch


@pytest.mark.parametrize("extra", [{}, {"alignment_head": {"hidden": 8}}])
def test_masked_ppo_has_no_mode_dependent_layers(extra):
    module, _ = _module_and_batch(**extra)
    assert not [m for m in module.modules() if isinstance(m, MODE_DEPENDENT)]


@pytest.mark.parametrize("method", ["forward_exploration", "forward_inference"])
def test_masked_ppo_forward_skips_the_mode_toggle_and_matches_rllib(method, monkeypatch):
    module, batch = _module_and_batch()
    module.train()
    expected = getattr(TorchRLModule, method)(module, batch)[Columns.ACTION_DIST_INPUTS]
    calls = []
    monkeypatch.setattr(module, "train", lambda mode=True: calls.append(("train", mode)))
    monkeypatch.setattr(module, "eval", lambda: calls.append(("eval",)))
    out = getattr(module, method)(batch)[Columns.ACTION_DIST_INPUTS]
    assert calls == []
    assert module.training
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def _bdq_module_and_batch():
    from envs.cluster_env import ClusterBranchingEnv
    from models.bdq import BDQTorchRLModule

    env = ClusterBranchingEnv({"n_servers": 6})
    torch.manual_seed(0)
    module = BDQTorchRLModule(observation_space=env.observation_space,
                              action_space=env.action_space,
                              model_config={"encoder": {"hidden": 16}, "head_hiddens": [16]})
    obs = [env.reset(seed=s)[0] for s in range(4)]
    batch = {Columns.OBS: {key: torch.as_tensor(np.stack([o[key] for o in obs]))
                           for key in obs[0]}}
    return module, batch


def test_bdq_has_no_mode_dependent_layers():
    module, _ = _bdq_module_and_batch()
    assert not [m for m in module.modules() if isinstance(m, MODE_DEPENDENT)]


@pytest.mark.parametrize("method", ["forward_exploration", "forward_inference"])
def test_bdq_forward_skips_the_mode_toggle_and_matches_rllib(method, monkeypatch):
    module, batch = _bdq_module_and_batch()
    module.train()
    torch.manual_seed(1)  # exploration draws its random sub-actions from torch's generator
    expected = getattr(TorchRLModule, method)(module, batch)[Columns.ACTIONS]
    calls = []
    monkeypatch.setattr(module, "train", lambda mode=True: calls.append(("train", mode)))
    monkeypatch.setattr(module, "eval", lambda: calls.append(("eval",)))
    torch.manual_seed(1)
    out = getattr(module, method)(batch)[Columns.ACTIONS]
    assert calls == []
    assert module.training
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_bdq_acting_passes_use_the_fused_heads_with_the_per_head_q_values(monkeypatch):
    """forward_inference/forward_exploration run the heads fused on CPU (cheaper at an env
    runner's batch) with the fused weights cached; their Q-values are the per-head ones,
    also after the weights change in place (an optimizer step) or are loaded (set_state)."""
    import models.bdq as bdq

    module, batch = _bdq_module_and_batch()
    builds = []
    real = bdq.fused_weights
    monkeypatch.setattr(bdq, "fused_weights", lambda *a: builds.append(1) or real(*a))

    def both():
        with torch.no_grad():
            return (module.compute_q_values(batch)[bdq.QF_PREDS],  # learner/serving path
                    module.compute_q_values(batch, acting=True)[bdq.QF_PREDS])

    per_head, fused = both()
    torch.testing.assert_close(fused, per_head, rtol=1e-5, atol=1e-6)
    greedy = module.forward_inference(batch)[Columns.ACTIONS]
    torch.testing.assert_close(greedy, per_head.argmax(-1), rtol=0, atol=0)
    assert len(builds) == 1  # built once, reused by the second acting pass
    with torch.no_grad():
        for p in module.advantage_heads[3].parameters():
            p.add_(0.5)  # in place, as an optimizer step
    per_head2, fused2 = both()
    assert not torch.allclose(per_head2, per_head)
    torch.testing.assert_close(fused2, per_head2, rtol=1e-5, atol=1e-6)
    assert len(builds) == 2
    state = {k: v + 0.25 for k, v in module.state_dict().items()}
    module.load_state_dict(state)  # as a weight sync from the learner
    per_head3, fused3 = both()
    torch.testing.assert_close(fused3, per_head3, rtol=1e-5, atol=1e-6)
    first = next(m for m in module.value_head if isinstance(m, torch.nn.Linear))
    first.weight = torch.nn.Parameter(first.weight.detach() * 2)  # replaced, not in place
    per_head4, fused4 = both()
    assert not torch.allclose(per_head4, per_head3)
    torch.testing.assert_close(fused4, per_head4, rtol=1e-5, atol=1e-6)
    module.fused_heads = False  # the config switch turns it off for acting as well
    builds.clear()
    module.forward_exploration(batch)
    assert builds == []


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(1e-3, 1e4), st.floats(0.0, 1.0))
def test_mask_logits_is_the_log_clamp_formula_bit_for_bit(seed, scale, density):
    """``mask_logits`` skips ``log`` of the mask; the values are those of
    ``logits + clamp(log(mask), FLOAT_MIN)`` to the bit (rows with no feasible action too)."""
    from ray.rllib.utils.torch_utils import FLOAT_MIN

    from models.encoders import feasible_actions
    from models.masked_ppo import mask_logits

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 40, generator=gen) * scale
    logits[0, 0] = -0.0
    mask = (torch.rand(6, 40, generator=gen) < density).float()
    mask[1] = 0.0
    obs = {"action_mask": mask}
    formula = logits + torch.clamp(torch.log(feasible_actions(obs).to(logits.dtype)),
                                   min=FLOAT_MIN)
    out = mask_logits(logits, obs)
    assert torch.equal(out.view(torch.int32), formula.view(torch.int32))
