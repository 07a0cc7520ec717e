"""The typed configuration of an IQL run (every default runs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IQLConfig:
    """Knobs of implicit Q-learning with advantage-weighted extraction.

    ``expectile``: the upper expectile V(s) fits of Q(s, a) over the data's actions (0.5:
    the data's mean, SARSA; towards 1: the best supported action). ``beta``: the
    inverse temperature of the extraction weights ``exp(beta * A)``, ``A`` in units of
    the mean absolute per-step reward (the reward is divided by it before training),
    capped at ``max_weight``. ``penalty``: per class, $ added to each step's cost per
    violation beyond the env's own SLA price (0: the env's prices alone). ``critic``,
    ``extract`` and ``support``: how the values are learned and how the policy is read off
    them (the learner's docstring). ``horizon``: the paired critic's returns stop that
    many decisions after each step.
    """

    run_seed: int = 0
    gamma: float = 0.99
    expectile: float = 0.8
    beta: float = 3.0
    max_weight: float = 100.0
    hiddens: tuple[int, ...] = (256, 256)
    policy_hiddens: tuple[int, ...] = (128, 128)
    critic_steps: int = 20_000
    policy_steps: int = 20_000
    batch_size: int = 256
    lr: float = 3e-4
    polyak: float = 0.005
    penalty: tuple[float, ...] = (0.0, 0.0)
    critic: str = "expectile"  # "expectile" (IQL's) or "paired" (see the learner)
    extract: str = "awr"  # "awr" or "support" (see cloudrl.algorithms.iql.learner)
    support: float = 0.3
    # critic "paired": the return counts this many decisions from each step (None: to the
    # episode's end); a shorter horizon drops what the siblings' divergence adds later
    horizon: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"IQLConfig.gamma must be in (0, 1), got {self.gamma}")
        if not 0.5 <= self.expectile < 1.0:
            raise ValueError(f"IQLConfig.expectile must be in [0.5, 1), got {self.expectile}")
        if not self.beta >= 0:
            raise ValueError(f"IQLConfig.beta must be >= 0, got {self.beta}")
        for name in ("critic_steps", "policy_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"IQLConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.critic not in ("expectile", "paired"):
            raise ValueError(f"IQLConfig.critic must be expectile or paired, got "
                             f"{self.critic!r}")
        if self.extract not in ("awr", "support"):
            raise ValueError(f"IQLConfig.extract must be awr or support, got {self.extract!r}")
        if not 0.0 < self.support <= 1.0:
            raise ValueError(f"IQLConfig.support must be in (0, 1], got {self.support}")
        if self.horizon is not None and (self.horizon < 1 or self.critic != "paired"):
            raise ValueError(f"IQLConfig.horizon must be >= 1 and needs critic 'paired', got "
                             f"{self.horizon} with critic {self.critic!r}")
        if any(p < 0 for p in self.penalty):
            raise ValueError(f"IQLConfig.penalty must be >= 0, got {self.penalty}")
