"""The preference-alignment head: a per-step score on a policy's shared representation.

An auxiliary head (seed design) on the representation the policy's own heads read (the
BDQ trunk output, the masked-PPO encoder output): a small MLP maps each step's
representation to a scalar score, and a segment's score is the sum over its T steps, so
two segments A and B compare by Bradley-Terry, P(A preferred) = sigmoid(S_A - S_B)
(the loss lives with the learners, ``cloudrl.algorithms.alignment_head``).

Between the trunk and the head sits :func:`scale_grad` (identity forward, gradient times
``trunk_grad_scale`` backward): 1 lets the preference loss shape the shared
representation fully, 0 trains the head on a frozen view of it (the critic's trunk gets
no preference gradient at all), values in between interpolate.

A module opts in through ``model_config["alignment_head"]`` (``{"hiddens": [64]}``,
``{"hidden": 64}`` for one layer, or ``True`` for the defaults); without the key the
module has no head and no extra parameters, so existing checkpoints load unchanged.
The head is built last, with the global torch RNG forked, so building it draws nothing
from the RNG the rest of the module (or anything after it) initialises from: the other
parameters are the same with and without a head.

torch only; imports nothing from ``cloudrl``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from models.encoders import head

ALIGNMENT_HEAD = "alignment_head"  # the model_config key and the module attribute
DEFAULT_ALIGNMENT_HIDDENS = (64,)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the incoming gradient by ``scale`` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:  # noqa: D102
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: D102
        return grad * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` forward; the gradient flowing back through it is multiplied by ``scale``."""
    return _ScaleGrad.apply(x, float(scale))


def alignment_head_hiddens(model_config: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The head's hidden widths from ``model_config["alignment_head"]``; None: no head.

    Accepts ``None``/``False`` (no head), ``True`` (defaults), ``{"hidden": w}``,
    ``{"hiddens": [w, ...]}``; anything else is a ValueError naming the key.
    """
    raw = model_config.get(ALIGNMENT_HEAD)
    if raw is None or raw is False:
        return None
    if raw is True:
        return DEFAULT_ALIGNMENT_HIDDENS
    if not isinstance(raw, Mapping):
        raise ValueError(f"model_config['{ALIGNMENT_HEAD}'] must be a dict such as "
                         f"{{'hidden': 64}}, got {raw!r}")
    unknown = set(raw) - {"hidden", "hiddens"}
    if unknown:
        raise ValueError(f"model_config['{ALIGNMENT_HEAD}']: unknown keys {sorted(unknown)}; "
                         f"known: hidden, hiddens")
    if "hidden" in raw and "hiddens" in raw:
        raise ValueError(f"model_config['{ALIGNMENT_HEAD}']: give hidden or hiddens, not both")
    widths = (raw["hidden"],) if "hidden" in raw else tuple(raw.get(
        "hiddens", DEFAULT_ALIGNMENT_HIDDENS))
    if any(not isinstance(w, int) or isinstance(w, bool) or w <= 0 for w in widths):
        raise ValueError(f"model_config['{ALIGNMENT_HEAD}']: widths must be positive "
                         f"integers, got {list(widths)}")
    return tuple(widths)


class AlignmentHead(nn.Module):
    """MLP from the representation to one score per step: (..., dim) -> (...)."""

    def __init__(self, in_dim: int, hiddens: tuple[int, ...] = DEFAULT_ALIGNMENT_HIDDENS,
                 activation: str = "relu") -> None:
        super().__init__()
        self.net = head(in_dim, hiddens, 1, activation, out_std=0.1)

    def forward(self, rep: torch.Tensor) -> torch.Tensor:
        return self.net(rep).squeeze(-1)


class AlignmentHeadMixin:
    """For RLModules with a shared representation: builds and scores with the head.

    The module implements :meth:`alignment_representation` (observations with leading
    batch dims -> (..., dim)) and calls :meth:`build_alignment_head` at the END of
    ``setup``; it lists :data:`ALIGNMENT_HEAD` among its non-inference attributes.
    """

    alignment_head: AlignmentHead | None

    def build_alignment_head(self, model_config: Mapping[str, Any], in_dim: int,
                             activation: str) -> None:
        """The head if ``model_config`` asks for one (not on inference-only copies)."""
        hiddens = alignment_head_hiddens(model_config)
        if hiddens is None or getattr(self, "inference_only", False):
            self.alignment_head = None
            return
        with torch.random.fork_rng(devices=[]):  # draws nothing from the caller's RNG
            self.alignment_head = AlignmentHead(in_dim, hiddens, activation)

    def alignment_representation(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The shared representation the head reads, (..., dim)."""
        raise NotImplementedError

    def alignment_scores(self, obs: Mapping[str, torch.Tensor],
                         trunk_grad_scale: float = 1.0) -> torch.Tensor:
        """Segment scores: observations (B, T, ...) -> the sum of T step scores, (B,).

        The trunk's gradient from these scores is multiplied by ``trunk_grad_scale``.
        """
        if self.alignment_head is None:
            raise ValueError(f"{type(self).__name__} has no alignment head; set "
                             f"model_config['{ALIGNMENT_HEAD}'] (e.g. {{'hidden': 64}})")
        rep = self.alignment_representation(obs)
        if trunk_grad_scale == 0.0:
            rep = rep.detach()  # same as a zero scale, without the trunk's backward pass
        elif trunk_grad_scale != 1.0:
            rep = scale_grad(rep, trunk_grad_scale)
        return self.alignment_head(rep).sum(-1)
