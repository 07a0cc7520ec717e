"""The release cap's gate from the logs (cloudrl.algorithms.model_es.gate)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.model_es import ModelESConfig, cap_gate, counts_ahead


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=5), st.integers(1, 6),
       st.integers(0, 10_000))
def test_counts_ahead_sums_each_episodes_next_periods(lengths, horizon, seed):
    rng = np.random.default_rng(seed)
    episodes = np.repeat(np.arange(len(lengths)), lengths)
    counts = rng.integers(0, 3, len(episodes)).astype(float)
    got = counts_ahead(counts, episodes, horizon)
    for i in range(len(counts)):
        j = i
        total = 0.0
        while j < len(counts) and j < i + horizon and episodes[j] == episodes[i]:
            total += counts[j]
            j += 1
        assert got[i] == total


def test_the_gate_finds_the_column_and_level_where_violations_start():
    rng = np.random.default_rng(0)
    n = 4000
    states = rng.random((n, 3))
    # violations follow column 2 only: none at or below 0.6, many above
    counts = ((states[:, 2] > 0.6) & (rng.random(n) < 0.5)).astype(float)
    episodes = np.arange(n)  # one-step episodes: the horizon adds nothing
    gate = cap_gate(states, counts, episodes, share=0.01, horizon=4)
    assert gate["column"] == 2
    # every violation-free state is freed, and past 0.6 only the 1% the share allows
    assert 0.6 <= gate["above"] <= 0.61
    assert gate["free_share"] == pytest.approx(np.mean(states[:, 2] <= gate["above"]))
    assert gate["violation_share"] <= 0.01


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.05, 0.2, 0.5]))
def test_the_gate_frees_the_most_states_any_column_can_within_the_share(seed, share):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    states = rng.integers(0, 5, (n, 3)).astype(float)  # ties, as in logged fractions
    counts = rng.integers(0, 3, n).astype(float)
    episodes = np.sort(rng.integers(0, 3, n))
    gate = cap_gate(states, counts, episodes, share, horizon=2)
    ahead = counts_ahead(counts, episodes, 2)
    total = ahead.sum()

    def carried(col, thr):
        free = states[:, col] <= thr
        return free.sum(), (ahead[free].sum() / total if total else 0.0)

    best = max(((carried(c, t)[0], -c) for c in range(3) for t in np.unique(states[:, c])
                if carried(c, t)[1] <= share + 1e-12), default=None)
    if best is None:
        assert gate is None
        return
    free, share_got = carried(gate["column"], gate["above"])
    assert share_got <= share + 1e-12 and share_got == pytest.approx(gate["violation_share"])
    assert (free, -gate["column"]) == best
    assert gate["free_share"] == pytest.approx(free / n)


def test_bad_shares_and_shapes_are_refused():
    s, c, e = np.zeros((4, 2)), np.zeros(4), np.zeros(4)
    for share in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="share must be in"):
            cap_gate(s, c, e, share)
    with pytest.raises(ValueError, match="do not match"):
        cap_gate(np.zeros((3, 2)), c, e, 0.1)
    with pytest.raises(ValueError, match="horizon"):
        counts_ahead(c, e, 0)
    with pytest.raises(ValueError, match="needs release_cap"):
        ModelESConfig(cap_gate=0.05)
    with pytest.raises(ValueError, match="cap_gate must be in"):
        ModelESConfig(cap_gate=1.0, release_cap=True)
