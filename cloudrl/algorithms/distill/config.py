"""The typed configuration of a distillation run (every default runs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class DistillConfig:
    """Knobs of behaviour cloning + DAgger from the forecast MPC (or the sim-MPC, or the
    signal-aware rule).

    Seeds: expert episodes use TRAIN seeds ``0 .. n_expert_seeds-1``; each DAgger round
    plays ``dagger_seeds_per_round`` further TRAIN seeds drawn (by ``run_seed``) from the
    rest; the round kept is the one with the lowest mean cost on ``n_val_seeds``
    validation seeds. Test seeds are never touched. ``init_checkpoint``: start from that
    checkpoint's weights (a fine-tune; ``hiddens`` must match its own) and let it compete as round
    ``-1``, so a fine-tune that does not help on validation keeps the start.
    """

    run_seed: int = 0
    mpc_params: dict[str, Any] = field(default_factory=dict)  # MPCConfig fields
    hiddens: tuple[int, ...] = (128, 128)
    n_expert_seeds: int = 20
    dagger_rounds: int = 2
    dagger_seeds_per_round: int = 4
    n_val_seeds: int = 4
    bc_epochs: int = 60
    round_epochs: int = 30
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-5
    init_checkpoint: str | None = None
    # the teacher is the signal-aware rule at these parameters instead of the MPC
    heuristic_params: dict[str, Any] | None = None
    # the teacher is the plant-true sim-MPC at these SimMPCConfig fields (its fluid warm
    # start at ``mpc_params``) instead of the fluid MPC
    sim_mpc_params: dict[str, Any] | None = None
    # the policy's own grids of release levels and ready margins (None: the env's)
    release_levels: tuple[float, ...] | None = None
    ready_margins: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("n_expert_seeds", "n_val_seeds", "bc_epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"DistillConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.dagger_rounds < 0 or self.dagger_seeds_per_round < 0 or self.round_epochs < 0:
            raise ValueError("DistillConfig.dagger_rounds, dagger_seeds_per_round and "
                             "round_epochs must be >= 0")
        used = self.n_expert_seeds + self.dagger_rounds * self.dagger_seeds_per_round
        if used > 50:
            raise ValueError(f"DistillConfig: {used} train seeds needed (expert + DAgger), "
                             f"only 50 exist")
        if self.heuristic_params is not None and (self.mpc_params or self.sim_mpc_params):
            raise ValueError("DistillConfig: one teacher: mpc_params or heuristic_params")
        if self.sim_mpc_params is not None:
            from cloudrl.mpc.sim_mpc import SimMPCConfig

            if "mpc" in self.sim_mpc_params:
                raise ValueError("DistillConfig.sim_mpc_params: the warm start's knobs are "
                                 "mpc_params, not sim_mpc_params['mpc']")
            SimMPCConfig(**self.sim_mpc_params, mpc=self.mpc_params)  # fields and ranges
        if self.release_levels is not None:
            from cloudrl.algorithms.distill.actions import check_release_levels

            object.__setattr__(self, "release_levels",
                               check_release_levels(tuple(self.release_levels)))
        if self.ready_margins is not None:
            from cloudrl.algorithms.distill.actions import check_ready_margins

            object.__setattr__(self, "ready_margins",
                               check_ready_margins(tuple(self.ready_margins)))
        if self.lr <= 0 or not self.hiddens:
            raise ValueError("DistillConfig.lr must be > 0 and hiddens non-empty")

    @property
    def levels(self) -> tuple[float, ...]:
        """The release grid the policy acts on."""
        from envs.scenario.env import RELEASE_LEVELS

        return RELEASE_LEVELS if self.release_levels is None else self.release_levels

    @property
    def margins(self) -> tuple[float, ...]:
        """The ready margins the policy acts on."""
        from envs.scenario.env import READY_MARGINS

        return READY_MARGINS if self.ready_margins is None else self.ready_margins

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hiddens"] = list(self.hiddens)
        for k in ("release_levels", "ready_margins"):
            if getattr(self, k) is not None:
                d[k] = list(getattr(self, k))
        return d
