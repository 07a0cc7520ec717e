"""Action distributions of the cloudrl RLModules.

``GumbelMaxCategorical``: RLlib's ``TorchCategorical`` with a cheaper ``sample()``.
``torch.distributions.Categorical.sample`` builds the softmax and calls
``torch.multinomial``, which on CPU costs ~0.5 ms for a (32, 451) batch of logits -- a
fifth of an env runner's step on the flat cluster env. The Gumbel-max trick draws from
the same distribution: ``argmax(logits + G)`` with ``G = -log(-log(U))`` i.i.d. standard
Gumbel is distributed as ``softmax(logits)`` (one uniform, two logs and an argmax per
entry). Masked logits (~``FLOAT_MIN``) stay below every feasible logit after adding the
noise, so an infeasible action is never drawn.

It is the *exploration* class of masked PPO (the env runners' acting path); the learner
trains with RLlib's ``TorchCategorical``, so the PPO loss is unchanged. For acting it
also builds the torch distribution more cheaply: ``torch.distributions.Categorical``
normalises its logits as ``logits - logits.logsumexp(-1)``, and on CPU ``exp`` of the
masked entries (~``FLOAT_MIN``) takes a slow path: constructing it took ~180 us for a
(32, 451) batch at one thread. :class:`_LogSoftmaxCategorical` normalises with a fused
``log_softmax`` instead (equal to within float rounding, ~1e-6): ~37 us. ``logp`` and
``entropy`` are torch's on those logits.
"""

from __future__ import annotations

import torch
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical


class _LogSoftmaxCategorical(torch.distributions.Categorical):
    """``torch.distributions.Categorical`` of logits normalised by ``log_softmax`` (no
    argument validation, as RLlib's ``TorchCategorical``)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = torch.log_softmax(logits, dim=-1)
        self._param = self.logits
        self._num_events = self.logits.size()[-1]
        batch_shape = self.logits.size()[:-1] if self.logits.ndimension() > 1 else torch.Size()
        torch.distributions.Distribution.__init__(self, batch_shape, validate_args=False)


class GumbelMaxCategorical(TorchCategorical):
    """``TorchCategorical`` sampled by the Gumbel-max trick (same distribution)."""

    def _get_torch_distribution(self, logits=None, probs=None, **kwargs):
        if logits is None or kwargs:
            return super()._get_torch_distribution(logits=logits, probs=probs, **kwargs)
        return _LogSoftmaxCategorical(logits)

    def sample(self, *, sample_shape=None) -> torch.Tensor:
        logits = self._dist.logits  # normalised log-probabilities
        shape = (torch.Size(sample_shape) if sample_shape is not None else torch.Size()) \
            + logits.shape
        uniform = torch.rand(shape, dtype=logits.dtype, device=logits.device)
        gumbel = uniform.clamp_(min=torch.finfo(logits.dtype).tiny).log_().neg_().log_().neg_()
        return (logits + gumbel).argmax(dim=-1)
