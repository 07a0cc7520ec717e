"""The train / validation / held-out test seed protocol.

Episodes for learning draw only from ``TRAIN_SEEDS`` (0..49). Checkpoint
selection and early stopping use ``validation_seeds()`` (500,000..500,049),
disjoint from both. Reported results use ``test_seeds()``: the same count
offset by 1,000,000, never seen in training or selection. The fleet comes from
the fixed ``FleetConfig.fleet_seed`` (0), identical across runs, so policies
are compared on the same hardware.
"""

from __future__ import annotations

from typing import Literal, get_args

N_SEEDS = 50
TEST_SEED_OFFSET = 1_000_000
VALIDATION_SEED_OFFSET = 500_000
TRAIN_SEEDS: tuple[int, ...] = tuple(range(N_SEEDS))

Split = Literal["train", "validation", "test"]
SPLITS: tuple[str, ...] = get_args(Split)


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= N_SEEDS:
        raise ValueError(f"n_seeds must be an integer in [1, {N_SEEDS}], got {n!r}")


def test_seeds(n: int = N_SEEDS) -> tuple[int, ...]:
    """The first ``n`` held-out test seeds."""
    _check_n(n)
    return tuple(TEST_SEED_OFFSET + i for i in range(n))


def validation_seeds(n: int = N_SEEDS) -> tuple[int, ...]:
    """The first ``n`` validation seeds (checkpoint selection, early stopping)."""
    _check_n(n)
    return tuple(VALIDATION_SEED_OFFSET + i for i in range(n))


def train_seeds(n: int = N_SEEDS) -> tuple[int, ...]:
    """The first ``n`` training seeds."""
    _check_n(n)
    return TRAIN_SEEDS[:n]


def seeds_for(split: Split, n: int = N_SEEDS) -> tuple[int, ...]:
    """The first ``n`` seeds of ``split`` ('train', 'validation' or 'test')."""
    if split == "test":
        return test_seeds(n)
    if split == "validation":
        return validation_seeds(n)
    if split == "train":
        return train_seeds(n)
    raise ValueError(f"split must be one of {', '.join(map(repr, SPLITS))}, got {split!r}")
