"""The typed configuration of a model-based policy search (every default runs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ModelESConfig:
    """Knobs of the input-driven model and the search in it.

    Model: ``members`` networks of ``hiddens``, each ``model_steps`` Adam steps of
    ``model_batch`` logged transitions (their own bootstrap order, seeded by ``run_seed``
    and the member). Search: ``iterations`` of ``2 x pairs`` antithetic perturbations
    (``sigma``) of every policy weight, all candidates of an iteration played along the
    same ``traces_per_iteration`` logged days; the centred ranks of their penalised costs
    weight the directions and Adam steps ``lr``. ``penalty``: weight of the ensemble's
    disagreement on each period's cost (its standard deviation over members, summed over
    the day). ``held_out``: logged days kept out of the search that score every
    ``eval_every`` iterations; the lowest penalised cost there is kept, the start
    competing. ``constrained``: see the field's comment; the start always qualifies.
    """

    run_seed: int = 0
    members: int = 4
    hiddens: tuple[int, ...] = (256, 256)
    model_steps: int = 6000
    model_batch: int = 512
    model_lr: float = 1e-3
    iterations: int = 100
    pairs: int = 8
    sigma: float = 0.02
    lr: float = 0.005
    traces_per_iteration: int = 8
    held_out: int = 8
    eval_every: int = 5
    penalty: float = 3.0
    # the constraint: the model also predicts the logged per-class violation counts; a
    # multiplier per class rises while the candidates predict more than the start on the
    # same days (dual ascent, step ``dual_lr``), and an iteration is kept only if it
    # predicts no more of any class than the start on the held-out days
    constrained: bool = True
    dual_lr: float = 0.1
    # with ``constrained``, also hold the counts the model predicts at the *logged* states
    # (each policy's action there, one period ahead) at the start's level: the rollouts'
    # states are the model's means, smoother than the real queues that violations follow,
    # while the logged states are real; ``logged_batch`` rows of the search days' logged
    # transitions per iteration, every held-out row at the check
    logged_states: bool = False
    logged_batch: int = 4096
    # search a release-capped policy: the start's network stays beside it as an anchor and
    # the policy's release level never passes the anchor's (it may hold batch work back,
    # never release more); releasing more fills the servers large latency-critical jobs
    # need, a placement effect the model's aggregate columns cannot show
    release_cap: bool = False
    # with ``release_cap``, hold the cap only where the logs show latency-critical
    # violations: above the threshold of the one observation column under which the most
    # logged states fall while carrying at most this share of the LC violations logged in
    # the ``cap_gate_horizon`` periods after them (``model_es.gate``); 0: the cap
    # everywhere
    cap_gate: float = 0.0
    cap_gate_horizon: int = 4
    # model the logged placement state too (the most free cores on one server, the servers
    # with room for the largest job, the largest waiting LC job): columns the model steps
    # and its violation head reads, which the policy does not see
    placement: bool = False

    def __post_init__(self) -> None:
        for name in ("members", "model_steps", "model_batch", "iterations", "pairs",
                     "traces_per_iteration", "held_out", "eval_every", "logged_batch",
                     "cap_gate_horizon"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelESConfig.{name} must be an integer >= 1, got {v!r}")
        for name in ("sigma", "lr", "model_lr", "dual_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ModelESConfig.{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.cap_gate < 1.0:
            raise ValueError(f"ModelESConfig.cap_gate must be in [0, 1), got {self.cap_gate}")
        if self.cap_gate > 0 and not self.release_cap:
            raise ValueError("ModelESConfig.cap_gate needs release_cap (it gates the cap)")
        if not self.penalty >= 0:
            raise ValueError(f"ModelESConfig.penalty must be >= 0, got {self.penalty}")
        if not self.hiddens or any(h < 1 for h in self.hiddens):
            raise ValueError(f"ModelESConfig.hiddens must be positive sizes, got {self.hiddens}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
