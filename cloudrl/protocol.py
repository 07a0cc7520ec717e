"""The 50 train / 50 held-out test seed protocol.

Episodes for learning draw only from ``TRAIN_SEEDS`` (0..49). Reported
results use ``test_seeds()``: the same count offset by 1,000,000, never seen
in training. The fleet comes from the fixed ``FleetConfig.fleet_seed`` (0),
identical across runs, so policies are compared on the same hardware.
"""

from __future__ import annotations

from typing import Literal

N_SEEDS = 50
TEST_SEED_OFFSET = 1_000_000
TRAIN_SEEDS: tuple[int, ...] = tuple(range(N_SEEDS))

Split = Literal["train", "test"]


def test_seeds(n: int = N_SEEDS) -> tuple[int, ...]:
    """The first ``n`` held-out test seeds."""
    if not 1 <= n <= N_SEEDS:
        raise ValueError(f"n_seeds must be in [1, {N_SEEDS}], got {n}")
    return tuple(TEST_SEED_OFFSET + i for i in range(n))


def train_seeds(n: int = N_SEEDS) -> tuple[int, ...]:
    """The first ``n`` training seeds."""
    if not 1 <= n <= N_SEEDS:
        raise ValueError(f"n_seeds must be in [1, {N_SEEDS}], got {n}")
    return TRAIN_SEEDS[:n]


def seeds_for(split: Split, n: int = N_SEEDS) -> tuple[int, ...]:
    if split == "test":
        return test_seeds(n)
    if split == "train":
        return train_seeds(n)
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
