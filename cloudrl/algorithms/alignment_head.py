"""The preference-alignment head's learner side, shared by the BDQ and masked-PPO learners.

While the agent learns, the learner adds ``alignment_weight * BT`` to its loss, where BT is
the Bradley-Terry loss (:func:`cloudrl.algorithms.bradley_terry.bt_loss`) of the module's
alignment head (``models.alignment_head``) on a minibatch of ``alignment_batch`` ranked
segment pairs. The pairs are a dataset on disk (``cloudrl.data.pairs``),
read once per learner onto its device and sampled with the learner's own seeded numpy
generator (``config.seed``, and the learner index for multi-learner setups).
``alignment_trunk_grad_scale`` multiplies the preference gradient reaching the shared
trunk (0: the head learns on a frozen view, the critic's trunk gets none of it).

Weight 0 or no pairs is plain BDQ / PPO, bit for bit: nothing is read or sampled, no RNG
is drawn from, the head's graph is never built (its parameters get no gradient, which
RLlib's optimizer step skips). Logged per module: ``alignment/bt_loss`` and
``alignment/pair_accuracy`` (share of decided pairs the head ranks right).

Settings live on the algorithm config (``BDQConfig``, ``MaskedPPOConfig``):
``training(alignment_pairs=..., alignment_weight=..., alignment_batch=...,
alignment_trunk_grad_scale=...)``; :func:`configure_alignment` and
:func:`validate_alignment` are the shared pieces of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cloudrl.algorithms.bradley_terry import bt_loss
from cloudrl.data.pairs import PairArrays, PairDataError, pair_files, read_pairs

BT_LOSS_KEY = "alignment/bt_loss"
PAIR_ACCURACY_KEY = "alignment/pair_accuracy"
OBS_PARTS = ("macro", "servers", "jobs")


@dataclass(frozen=True)
class AlignmentSettings:
    """The four alignment hyperparameters of an algorithm config."""

    pairs: str | None = None
    weight: float = 0.0
    batch: int = 32
    trunk_grad_scale: float = 1.0

    @property
    def active(self) -> bool:
        """Whether the learner adds the preference loss at all."""
        return self.weight > 0.0 and self.pairs is not None


DEFAULTS = AlignmentSettings()
FIELDS = {"alignment_pairs": "pairs", "alignment_weight": "weight",
          "alignment_batch": "batch", "alignment_trunk_grad_scale": "trunk_grad_scale"}


def init_alignment(config: Any) -> None:
    """Put the defaults on an algorithm config (from its ``__init__``)."""
    for attr, name in FIELDS.items():
        setattr(config, attr, getattr(DEFAULTS, name))


def configure_alignment(config: Any, values: dict[str, Any]) -> None:
    """Apply the ``training(alignment_...=...)`` arguments that were given (not NotProvided)."""
    from ray.rllib.algorithms.algorithm_config import NotProvided

    casts = {"alignment_pairs": lambda v: None if v is None else str(v),
             "alignment_weight": float, "alignment_batch": int,
             "alignment_trunk_grad_scale": float}
    for attr, value in values.items():
        if value is not NotProvided:
            setattr(config, attr, casts[attr](value))


def settings_of(config: Any) -> AlignmentSettings:
    """The settings on ``config`` (defaults for a config without them)."""
    return AlignmentSettings(**{name: getattr(config, attr, getattr(DEFAULTS, name))
                                for attr, name in FIELDS.items()})


def validate_alignment(config: Any) -> None:
    """``config._value_error`` (RLlib's one-line ValueError) for bad alignment settings."""
    s = settings_of(config)
    if not (s.weight >= 0.0 and np.isfinite(s.weight)):
        config._value_error(f"alignment_weight must be >= 0, got {s.weight}")
    if s.batch < 1:
        config._value_error(f"alignment_batch must be >= 1, got {s.batch}")
    if not (s.trunk_grad_scale >= 0.0 and np.isfinite(s.trunk_grad_scale)):
        config._value_error(f"alignment_trunk_grad_scale must be >= 0, "
                            f"got {s.trunk_grad_scale}")
    if s.weight > 0.0 and s.pairs is None:
        config._value_error("alignment_weight > 0 needs alignment_pairs (a pair dataset "
                            "directory, see cloudrl.data.pairs)")
    if s.active:
        try:
            pair_files(s.pairs)
        except PairDataError as exc:
            config._value_error(f"alignment_pairs: {exc}")


def head_model_config(config: Any) -> dict[str, Any]:
    """The ``model_config`` entry that gives the module a head when alignment is active."""
    return {"alignment_head": True} if settings_of(config).active else {}


class PairSampler:
    """A pair dataset on a device, sampled with its own generator.

    ``obs`` stacks both sides' post-step observations (:func:`post_step_obs`):
    ``obs[part]`` is (P, 2, T, ...) with side A at index 0.
    """

    def __init__(self, pairs: PairArrays, device: torch.device | str, seed: int,
                 obs_space: Any | None = None, where: str = "alignment_pairs") -> None:
        if len(pairs) == 0:
            raise PairDataError(f"{where}: the dataset has no pairs")
        if obs_space is not None:
            check_pair_shapes(pairs, obs_space, where)
        a, b = post_step_obs(pairs, "a"), post_step_obs(pairs, "b")
        self.obs = {part: torch.as_tensor(np.stack([a[part], b[part]], axis=1),
                                          dtype=torch.float32, device=device)
                    for part in OBS_PARTS}
        self.label = torch.tensor(pairs.label, dtype=torch.float32, device=device)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def sample(self, n: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``n`` pairs (without replacement when there are enough): obs (n, 2, T, ...), label."""
        idx = self.rng.choice(len(self), size=n, replace=n > len(self))
        index = torch.as_tensor(idx, device=self.label.device)
        return {k: v[index] for k, v in self.obs.items()}, self.label[index]


def post_step_obs(pairs: PairArrays, side: str) -> dict[str, np.ndarray]:
    """Side ``side``'s T post-step observations ``{part: (P, T, ...)}``: the states the
    teacher's statistics are counted on, also when the segments hold T+1 observations
    (transition segments; their first one is the state before the first action)."""
    obs = pairs.obs[side]
    t = int(pairs.shape.get("segment_length", obs["macro"].shape[1]))
    return {part: obs[part][:, -t:] for part in OBS_PARTS}


def check_pair_shapes(pairs: PairArrays, obs_space: Any, where: str) -> None:
    """A PairDataError naming the shape field that differs from the env's observations."""
    expect = {"macro_dim": obs_space["macro"].shape[-1],
              "n_servers": obs_space["servers"].shape[-2],
              "server_dim": obs_space["servers"].shape[-1],
              "k_slots": obs_space["jobs"].shape[-2], "job_dim": obs_space["jobs"].shape[-1]}
    for name, want in expect.items():
        if int(pairs.shape[name]) != int(want):
            raise PairDataError(f"{where}: field {name}: the pairs have {pairs.shape[name]}, "
                                f"the env's observations {want}")


def load_sampler(path: str | Path, device: torch.device | str, seed: int,
                 obs_space: Any | None = None) -> PairSampler:
    """Read and validate the dataset at ``path`` into a :class:`PairSampler`."""
    return PairSampler(read_pairs(path), device, seed, obs_space, where=str(path))


def preference_loss(module: Any, obs: dict[str, torch.Tensor], label: torch.Tensor,
                    trunk_grad_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """BT loss of the module's segment scores on pairs (obs (n, 2, T, ...)), and accuracy.

    Both sides go through the head in one pass. Accuracy: share of decided pairs (label
    != 0.5) whose higher-scored side is the preferred one (NaN without decided pairs).
    """
    scores = module.alignment_scores(obs, trunk_grad_scale)  # (n, 2)
    score_a, score_b = scores[:, 0], scores[:, 1]
    loss = bt_loss(score_a, score_b, label)
    with torch.no_grad():
        decided = label != 0.5
        correct = torch.where(label > 0.5, score_a > score_b, score_b > score_a)
        accuracy = correct[decided].float().mean() if bool(decided.any()) else torch.tensor(
            float("nan"), device=label.device)
    return loss, accuracy


def _sampler(learner: Any, module_id: str, module: Any, config: Any,
             settings: AlignmentSettings) -> PairSampler:
    """The learner's sampler of ``module_id``, read on first use and kept on the learner."""
    samplers = learner.__dict__.setdefault("_alignment_samplers", {})
    if module_id not in samplers:
        if getattr(module, "alignment_head", None) is None:
            raise ValueError(f"alignment_weight > 0 but the RLModule {module_id!r} has no "
                             f"alignment head (model_config['alignment_head'] was overridden)")
        seed = int(config.seed or 0) * 1000 + int(getattr(learner, "_learner_index", 0))
        samplers[module_id] = load_sampler(settings.pairs, learner._device, seed,
                                           module.observation_space)
    return samplers[module_id]


def add_alignment_loss(learner: Any, module_id: str, config: Any,
                       loss: torch.Tensor) -> torch.Tensor:
    """For a TorchLearner's ``compute_loss_for_module``: ``loss + weight * BT`` (and the
    metrics) when alignment is active on ``config``; ``loss`` itself, untouched, otherwise."""
    settings = settings_of(config)
    if not settings.active:
        return loss
    module = learner.module[module_id].unwrapped()
    obs, label = _sampler(learner, module_id, module, config, settings).sample(settings.batch)
    bt, accuracy = preference_loss(module, obs, label, settings.trunk_grad_scale)
    learner.metrics.log_dict({BT_LOSS_KEY: bt, PAIR_ACCURACY_KEY: accuracy},
                             key=module_id, window=1)
    return loss + settings.weight * bt
