"""The typed configuration of an evolution-strategies fine-tune (every default runs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PARAM_SETS = ("head", "all")


@dataclass(frozen=True)
class ESConfig:
    """Knobs of the fine-tune on the true cost (see :mod:`cloudrl.algorithms.es`).

    Each iteration draws ``seeds_per_candidate`` TRAIN seeds (by ``run_seed``) and plays
    ``2 x pairs`` perturbed policies, ``theta +- sigma * eps_i``, on exactly those seeds
    (common random numbers: a pair differs only in its weights); the centred ranks of their
    mean costs weight the antithetic directions, and Adam takes a step of ``lr``. Every
    ``eval_every`` iterations the current weights are scored on ``n_val_seeds`` validation
    seeds; the start competes as iteration 0 and the lowest validation score is kept, so a
    fine-tune that does not help keeps the start. Test seeds are never touched.
    ``params``: ``head`` perturbs the logits layer only, ``all`` every weight.
    """

    run_seed: int = 0
    iterations: int = 20
    pairs: int = 8
    seeds_per_candidate: int = 4
    sigma: float = 0.02
    lr: float = 0.005
    eval_every: int = 5
    n_val_seeds: int = 10
    params: str = "head"
    workers: int | None = None

    def __post_init__(self) -> None:
        for name in ("iterations", "pairs", "seeds_per_candidate", "eval_every",
                     "n_val_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"ESConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.seeds_per_candidate > 50 or self.n_val_seeds > 50:
            raise ValueError("ESConfig: seeds_per_candidate and n_val_seeds must be <= 50 "
                             "(the seeds of a split)")
        if not self.sigma > 0 or not self.lr > 0:
            raise ValueError(f"ESConfig: sigma and lr must be > 0, got {self.sigma}, {self.lr}")
        if self.params not in PARAM_SETS:
            raise ValueError(f"ESConfig.params {self.params!r}; valid: {', '.join(PARAM_SETS)}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"ESConfig.workers must be >= 1, got {self.workers}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
