"""The seed protocol: train, validation and test seeds are disjoint, errors name the value."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloudrl.protocol import (
    N_SEEDS,
    SPLITS,
    TEST_SEED_OFFSET,
    TRAIN_SEEDS,
    VALIDATION_SEED_OFFSET,
    seeds_for,
    train_seeds,
    validation_seeds,
)
from cloudrl.protocol import (
    test_seeds as held_out_seeds,  # not collected as a test
)


def test_validation_seeds_are_500000_onwards():
    assert VALIDATION_SEED_OFFSET == 500_000
    assert validation_seeds(3) == (500_000, 500_001, 500_002)
    assert validation_seeds() == tuple(range(500_000, 500_050))
    assert seeds_for("validation", 2) == (500_000, 500_001)
    assert SPLITS == ("train", "validation", "test")


def test_existing_splits_unchanged():
    assert seeds_for("train") == TRAIN_SEEDS == tuple(range(50))
    assert seeds_for("test", 2) == (TEST_SEED_OFFSET, TEST_SEED_OFFSET + 1)


@given(st.integers(1, N_SEEDS), st.integers(1, N_SEEDS), st.integers(1, N_SEEDS))
def test_splits_pairwise_disjoint(n_train, n_val, n_test):
    tr, va = set(train_seeds(n_train)), set(validation_seeds(n_val))
    te = set(held_out_seeds(n_test))
    assert len(tr) == n_train and len(va) == n_val and len(te) == n_test
    assert not tr & va and not tr & te and not va & te


@given(st.sampled_from(SPLITS), st.integers(1, N_SEEDS))
def test_seeds_for_is_a_prefix_of_the_full_split(split, n):
    assert seeds_for(split, n) == seeds_for(split)[:n]


@pytest.mark.parametrize("n", [0, -1, N_SEEDS + 1, 2.5, True])
@pytest.mark.parametrize("fn", [train_seeds, validation_seeds, held_out_seeds])
def test_bad_counts_name_the_value(fn, n):
    with pytest.raises(ValueError, match=r"n_seeds must be an integer in \[1, 50\], got"):
        fn(n)


def test_unknown_split_names_it():
    msg = "split must be one of 'train', 'validation', 'test', got 'val'"
    with pytest.raises(ValueError, match=msg):
        seeds_for("val")  # type: ignore[arg-type]


def test_evaluate_cli_runs_on_validation_seeds(tmp_path, capsys):
    import json

    from cloudrl.cli import main

    code = main(["evaluate", "--split", "validation", "--n-seeds", "2", "--policy", "round_robin",
                 "--n-servers", "3", "--episode-length", "20", "--workers", "1", "--quiet",
                 "--out", str(tmp_path / "ev")])
    assert code == 0
    episodes = json.loads((tmp_path / "ev.json").read_text())["episodes"]
    assert [e["seed"] for e in episodes] == [500_000, 500_001]
    assert "validation seeds: 2" in capsys.readouterr().out
