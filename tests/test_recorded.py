"""The tolerance comparison of recorded runs (``tests/recorded.py``) passes ulp-level noise,
as other CPUs' SIMD paths give, and fails on any change a test must see."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import recorded
from tests.recorded import Trace, assert_matches


def _trace(floats: list[np.ndarray], ints: np.ndarray, label: str = "x") -> Trace:
    tr = Trace()
    for i, a in enumerate(floats):
        tr.add(f"f{i}", a)
    tr.add("ints", ints)
    tr.add("label", label)
    return tr


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(recorded, "FIXTURES", tmp_path)
    return tmp_path


arrays = st.integers(1, 60).flatmap(lambda n: st.lists(
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=n, max_size=n))


@settings(max_examples=40, deadline=None)
@given(values=st.lists(arrays, min_size=1, max_size=4), ulps=st.integers(1, 64),
       seed=st.integers(0, 2**32 - 1))
def test_ulp_noise_passes_a_real_change_fails(tmp_path_factory, values, ulps, seed):
    kept, recorded.FIXTURES = recorded.FIXTURES, tmp_path_factory.mktemp("rec")
    try:
        _noise_and_change(values, ulps, seed)
    finally:
        recorded.FIXTURES = kept


def _noise_and_change(values, ulps, seed):
    floats = [np.array(v) for v in values]
    ints = np.arange(5)
    recorded.save("r", {"c": _trace(floats, ints)})
    rng = np.random.default_rng(seed)
    noisy = [a + rng.integers(-ulps, ulps + 1, a.size) * np.spacing(np.abs(a) + 1e-300)
             for a in floats]
    assert_matches(_trace(noisy, ints), "r", "c")  # SIMD-sized differences pass
    changed = [a.copy() for a in floats]
    k = int(rng.integers(len(changed)))
    i = int(rng.integers(changed[k].size))
    scale = max(np.abs(changed[k]).sum(), 1.0)
    changed[k][i] += 1e-6 * scale  # far below a cent on a dollar scale, far above ulps
    with pytest.raises(AssertionError, match=f"float array #{k} differs"):
        assert_matches(_trace(changed, ints), "r", "c")


def test_exact_parts_must_match(store):
    floats = [np.linspace(0.0, 3.0, 7)]
    recorded.save("r", {"c": _trace(floats, np.arange(4))})
    assert_matches(_trace(floats, np.arange(4)), "r", "c")
    for other in (_trace(floats, np.array([0, 1, 2, 4])),     # an integer
                  _trace(floats, np.arange(4), "y"),          # a string
                  _trace(floats, np.arange(4.0))):            # a dtype
        with pytest.raises(AssertionError):
            assert_matches(other, "r", "c")
    with pytest.raises(AssertionError, match="float arrays"):
        assert_matches(_trace(floats * 2, np.arange(4)), "r", "c")
    nan = [np.array([0.0, np.nan, 3.0, 1.0, 2.0, 2.0, 2.0])]
    with pytest.raises(AssertionError, match="exact part"):  # a NaN where a number was
        assert_matches(_trace(nan, np.arange(4)), "r", "c")


def test_a_reordering_that_keeps_the_sum_still_fails(store):
    a = np.array([1.0, 2.0, 3.0, 4.0])
    recorded.save("r", {"c": _trace([a], np.arange(2))})
    with pytest.raises(AssertionError, match="differs"):
        assert_matches(_trace([a[::-1].copy()], np.arange(2)), "r", "c")
