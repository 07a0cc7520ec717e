"""models/distributions.py: Gumbel-max sampling draws from the same categorical."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.utils.torch_utils import FLOAT_MIN

from models.distributions import GumbelMaxCategorical


def test_gumbel_max_frequencies_match_the_softmax_and_skip_masked_actions():
    torch.manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, FLOAT_MIN, -1.0, 2.0, FLOAT_MIN]])
    n = 200_000
    draws = GumbelMaxCategorical.from_logits(logits.expand(n, -1)).sample()
    freq = np.bincount(draws.numpy(), minlength=6) / n
    probs = torch.softmax(logits[0], -1).numpy()
    assert freq[2] == freq[5] == 0.0
    # binomial std <= sqrt(0.25 / n) = 0.0011; 0.006 is > 5 std
    np.testing.assert_allclose(freq, probs, atol=0.006)


def test_logp_entropy_and_sample_shape_are_torch_categoricals():
    torch.manual_seed(1)
    logits = torch.randn(5, 7)
    ours, ref = GumbelMaxCategorical.from_logits(logits), TorchCategorical.from_logits(logits)
    actions = torch.randint(0, 7, (5,))
    torch.testing.assert_close(ours.logp(actions), ref.logp(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    assert ours.sample(sample_shape=(3,)).shape == (3, 5)
    assert ours.sample().dtype == torch.int64


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=2, max_size=40).filter(any),
       st.integers(0, 2**31 - 1))
def test_a_masked_action_is_never_sampled(feasible, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.tensor(feasible)
    logits = torch.where(mask, torch.randn(len(feasible), generator=gen) * 30, FLOAT_MIN)
    torch.manual_seed(seed)
    draws = GumbelMaxCategorical.from_logits(logits.expand(256, -1)).sample()
    assert bool(mask[draws].all())


def test_masked_ppo_explores_with_gumbel_max_and_trains_with_torch_categorical():
    import gymnasium as gym

    from models.masked_ppo import MaskedPPOTorchRLModule

    space = gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (4,)),
                             "servers": gym.spaces.Box(-1, 1, (2, 3)),
                             "jobs": gym.spaces.Box(-1, 1, (1, 3)),
                             "macro": gym.spaces.Box(-1, 1, (2,))})
    module = MaskedPPOTorchRLModule(observation_space=space,
                                    action_space=gym.spaces.Discrete(4),
                                    model_config={"encoder": {"hidden": 8}})
    assert module.get_exploration_action_dist_cls() is GumbelMaxCategorical
    assert module.get_train_action_dist_cls() is TorchCategorical
