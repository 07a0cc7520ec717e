"""The compiled and re-seeded pieces that make an episode's signals cheaper give numpy's own
values bit for bit (the recorded runs of ``tests/test_env_signals.py`` pin the whole
outputs to a tolerance; these pin the pieces, on more inputs than the records cover)."""

from __future__ import annotations

import numpy as np
import pytest

from envs.signals.config import SignalConfig
from envs.signals.forecast import Forecaster, error_paths
from envs.signals.make import make_signals
from envs.signals.seeding import entropy_words, pcg64_state, seeded_rng
from envs.signals.timebase import (
    _calendar_kernel,
    interp_into,
    interp_slopes,
    mod24_into,
)

MASK64 = 2**64 - 1


def _entropies():
    rng = np.random.default_rng(2024)
    cases = [((0, 1), ()), ((MASK64 - 2, 5), ()), ((2**32 - 1, 2), ()), ((2**32, 3), ()),
             ((123, 4), (0,)), ((123, 4), (2,)), ((2**63 + 5, 0xF0CA57), ()), (7, ()),
             ((5,), (1, 2)), ((2**70, 1), (2**40,)), ((0, 0, 0, 0, 0), (3,))]
    for _ in range(300):
        ent = tuple(int(x) * int(m) for x, m in zip(rng.integers(0, 2**63, 3),
                                                       rng.integers(1, 3, 3), strict=True))
        ent = ent[:int(rng.integers(1, 4))]
        key = tuple(int(x) for x in rng.integers(0, 2**33, int(rng.integers(0, 3))))
        cases.append((ent, key))
    return cases


def test_seeded_generators_are_in_numpys_seed_sequence_state():
    for entropy, key in _entropies():
        seq = np.random.SeedSequence(entropy, spawn_key=key)
        want = np.random.PCG64(seq).state["state"]
        assert pcg64_state(entropy, key) == (want["state"], want["inc"]), (entropy, key)
        assert entropy_words(entropy, key).dtype == np.uint32
        got = seeded_rng(entropy, key, slot=99).standard_normal(7)
        assert np.array_equal(got, np.random.default_rng(seq).standard_normal(7))


def test_seeded_spawned_children_are_numpys_children():
    for seed in (0, 1, 2**63 + 5, MASK64):
        children = np.random.SeedSequence([seed, 4]).spawn(3)
        for i, child in enumerate(children):
            want = np.random.default_rng(child).random(5)
            assert np.array_equal(seeded_rng((seed, 4), (i,), slot=7).random(5), want)


def test_a_slot_is_re_seeded_and_slots_are_independent():
    a = seeded_rng((1, 2), slot=1)
    b = seeded_rng((3, 4), slot=2)
    first = a.random(3)
    assert np.array_equal(seeded_rng((1, 2), slot=1).random(3), first)
    assert np.array_equal(b.random(3), np.random.default_rng([3, 4]).random(3))


def test_interp_and_mod24_match_numpy_bit_for_bit():
    from envs.signals.carbon import _PROFILE_FP, _PROFILE_XP
    from envs.signals.price import _FP_WEEKDAY, _FP_WEEKEND, _XP

    rng = np.random.default_rng(5)
    grid = np.arange(-0.5, 24.6, 0.5)
    x = np.concatenate([rng.uniform(-1.0, 25.0, 20000), grid, np.nextafter(grid, -np.inf),
                        np.nextafter(grid, np.inf), [np.nan, np.inf, -np.inf, 0.0, -0.0],
                        np.mod(np.arange(0.0, 3 * 86400.0, 7.3), 86400.0) / 3600.0])
    uneven_xp = np.sort(rng.uniform(-3.0, 30.0, 9))
    uneven_fp = rng.normal(size=9)
    for xp, fp in ((_XP, _FP_WEEKDAY), (_XP, _FP_WEEKEND), (_PROFILE_XP, _PROFILE_FP),
                   (uneven_xp, uneven_fp)):
        for size in (x.size, 1, 5, 25):
            out = np.empty(size)
            interp_into(x[:size], xp, fp, interp_slopes(xp, fp), out)
            assert np.array_equal(out, np.interp(x[:size], xp, fp), equal_nan=True)
    for h in (rng.uniform(0.0, 24.0, 1000), np.array([0.0, 24.0, 23.999999999, -0.0, 25.5,
                                                      -1.0, 48.0, 1e-300])):
        out = np.empty(h.size)
        mod24_into(h, out)
        want = np.mod(h, 24.0)
        assert np.array_equal(out, want) and np.array_equal(np.signbit(out), np.signbit(want))


@pytest.mark.parametrize("kind", ["random", "near_days", "near_weeks", "edges"])
def test_calendar_without_fmod_matches_numpy_mod(kind):
    rng = np.random.default_rng(11)
    day, week = 86400.0, 7 * 86400.0
    if kind == "random":
        x = rng.uniform(0.0, 4e9, 50000)
    elif kind == "near_days":
        m = np.arange(1.0, 40000.0) * day
        x = np.concatenate([m, np.nextafter(m, 0.0), np.nextafter(m, np.inf)])
    elif kind == "near_weeks":
        m = np.arange(1.0, 6000.0) * week - 3 * day
        x = np.concatenate([m, np.nextafter(m, 0.0), np.nextafter(m, np.inf)])
    else:
        x = np.array([5e-324, 1e-300, 0.5, 2.0**53 - 259201.0, 2.0**52 + 0.5, 1e15 + 0.25])
    for arr in (x, np.concatenate([x, [-5.0]])):  # the second takes numpy.mod's path
        out = np.empty((2, arr.size))
        _calendar_kernel(arr, 6.0, out)
        hour = np.mod(arr, day) / 3600.0
        how = np.mod(arr + 3 * day, week) / 3600.0

        def step(v):
            return np.clip((v + 3.0) / 6.0, 0.0, 1.0)

        weekend = step(how - 120.0) - step(how - 168.0) + 1.0 - step(how)
        assert np.array_equal(out[0], hour) and np.array_equal(out[1], weekend)
        assert np.array_equal(np.signbit(out[0]), np.signbit(hour))


def test_error_paths_are_the_forecasters_first_rows():
    series = make_signals(SignalConfig(), 500, 60.0, 3)
    full = Forecaster(series, 3).paths
    for rows in (1, 2, 3):
        assert np.array_equal(error_paths(3, 500, 60.0, rows), full[:rows])
    rng = np.random.default_rng([3, 0xF0CA57])
    steps = rng.standard_normal((3, 499)) * np.sqrt(60.0 / 86400.0)
    assert np.array_equal(full[:, 1:], np.cumsum(steps, axis=1)) and not full[:, 0].any()
    assert error_paths(3, 1, 60.0).shape == (3, 1)
