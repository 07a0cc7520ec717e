"""Drift in an operator's labels: a model of the older labels predicts the newest ones
worse than its own held-out labels when the trade-off moved, and as well when it did not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cloudrl.scenarios.runner import ControllerSpec
from cloudrl.scenarios.tuning import heuristic_space
from cloudrl.steer.trace import record_many
from envs.scenario.catalog import load_scenario


@pytest.fixture(scope="module")
def pool():
    rng = np.random.default_rng(21)
    specs = [ControllerSpec("signal_aware", heuristic_space(rng)) for _ in range(12)]
    rows = record_many(load_scenario("tiny"), specs, [7, 8], workers=1)
    return {f"s{i}-{k}": t for i, row in enumerate(rows) for k, t in enumerate(row)}


def _labels(traces, pairs, first, second):
    out = []
    for i, (a, b) in enumerate(pairs):
        u = first if i < len(pairs) // 2 or second is None else second
        out.append({"a": a, "b": b, "label": 1.0 if u(traces[a]) < u(traces[b]) else 0.0,
                    "at": float(i)})
    return out


def test_a_model_of_the_older_labels_sees_the_switch(pool):
    from cloudrl.steer.reward import drift_forward
    from cloudrl.steer.utilities import UTILITIES

    keys = list(pool)
    pairs = list(itertools.combinations(keys, 2))
    pairs = [pairs[i] for i in np.random.default_rng(3).permutation(len(pairs))[:240]]
    # two utilities that disagree on most of these pairs, the first one learnable from
    # 168 labels (hour_carbon disagrees more with smooth_controls but is learned worse)
    a_name, b_name = "class_fairness", "smooth_controls"
    pref = {n: np.array([UTILITIES[n](pool[a]) < UTILITIES[n](pool[b]) for a, b in pairs])
            for n in (a_name, b_name)}
    agree = float((pref[a_name] == pref[b_name]).mean())
    assert agree < 0.7, (a_name, b_name, agree)
    kw = {"recent_fraction": 0.3, "steps": 150, "members": 1, "seed": 2}
    same = drift_forward(pool, _labels(pool, pairs, UTILITIES[a_name], None), **kw)
    moved = drift_forward(pool, _labels(pool, pairs, UTILITIES[a_name], UTILITIES[b_name]),
                          **kw)
    assert same["recent_labels"] == moved["recent_labels"] == 72
    assert same["older_labels"] == 168
    assert same["older_heldout_accuracy"] > 0.75 and 0.02 < same["standard_error"] < 0.2
    assert same["accuracy_change"] > -0.1, same
    assert moved["accuracy_change"] <= -0.1, moved
    assert moved["accuracy_change"] < same["accuracy_change"] - 0.05, (same, moved)
