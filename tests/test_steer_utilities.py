"""The stakes of the hidden utilities that bite on ``tiny``: afternoon carbon at 40x its
price, $3 per unit of change of the ready-cores target; and the ES knobs of the loop."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.scenarios.runner import ControllerSpec
from cloudrl.steer.trace import record_many
from envs.scenario.catalog import load_scenario


@pytest.fixture(scope="module")
def trace():
    """One tiny episode of the default heuristic (seed 7)."""
    return record_many(load_scenario("tiny"), [ControllerSpec("signal_aware", {})], [7])[0][0]


@settings(max_examples=30, deadline=None)
@given(frac=st.floats(0.0, 1.0), usd=st.floats(0.01, 5.0))
def test_afternoon_carbon_costs_forty_times_its_price(trace, frac, usd):
    from cloudrl.steer.utilities import hour_carbon

    hours = trace.ticks["hour"]
    peak = np.flatnonzero((hours >= 12.0) & (hours < 18.0))
    off = np.flatnonzero((hours < 12.0) | (hours >= 18.0))
    assert len(peak) and len(off)
    base = hour_carbon(trace)
    for idx, weight in ((peak, 40.0), (off, 1.0)):
        tr = copy.deepcopy(trace)
        tr.ticks["carbon_usd"][idx[int(frac * (len(idx) - 1))]] += usd
        assert hour_carbon(tr) - base == pytest.approx(weight * usd, rel=1e-9, abs=1e-9)
        # the cost itself counts every hour once: the learner's cost features cannot tell
        assert tr.cost_usd() - trace.cost_usd() == pytest.approx(usd, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(level=st.floats(0.0, 1.0), amp=st.floats(0.001, 0.5))
def test_smooth_controls_charges_three_dollars_per_unit_of_change(trace, level, amp):
    from cloudrl.steer.utilities import smooth_controls

    tr = copy.deepcopy(trace)
    n = tr.length
    tr.ticks["ready_cores"] = np.full(n, level)  # steady controls: the cost alone
    assert smooth_controls(tr) == pytest.approx(tr.cost_usd(), rel=1e-12)
    tr.ticks["ready_cores"] = level + amp * (np.arange(n) % 2)  # flip every tick
    assert smooth_controls(tr) - tr.cost_usd() == pytest.approx(3.0 * amp * (n - 1), rel=1e-9)


def test_the_loop_es_knobs_reach_the_search():
    from cloudrl.steer.loop import LoopConfig

    es = LoopConfig(es_iterations=5, es_lr=0.04, es_sigma=0.07, val_seeds=3).es(2)
    assert (es.iterations, es.lr, es.sigma, es.n_val_seeds, es.run_seed) == (
        5, 0.04, 0.07, 3, 2)
    for field in ("es_lr", "es_sigma"):
        with pytest.raises(ValueError, match=field.replace("_", "-")):
            LoopConfig(**{field: 0.0})
