"""numpy ``Generator`` objects seeded like ``default_rng(SeedSequence(entropy, spawn_key))``,
at a fraction of the cost.

Building a :class:`numpy.random.SeedSequence` and a ``PCG64`` from it takes some 20 us
(its Python-level coercions; ``spawn`` another ~20 us per child), and an episode's signals
seed seven or eight generators. :func:`seeded_rng` computes the same state: the
SeedSequence's entropy words, its pool (``mix_entropy``) and its ``generate_state(4,
uint64)`` in one compiled pass (the algorithm of numpy's ``bit_generator.pyx``, O'Neill's
``seed_seq`` variant, which numpy keeps stable across releases), then PCG64's seeding
(``pcg64_set_seed``: two steps of the 128-bit LCG) with Python integers, and loads it into
a generator kept per thread and per ``slot`` (``bit_generator.state = ...``). The states are
checked against numpy's own in ``tests/test_env_signals_speed.py``.

A slot's generator is re-seeded by the next call with that slot in the same thread: use it
before then (the signal builders draw everything inside one call).
"""

from __future__ import annotations

import threading

import numba
import numpy as np

_MASK32 = 0xFFFFFFFF
_MASK128 = (1 << 128) - 1
# PCG64's 128-bit LCG multiplier (PCG_DEFAULT_MULTIPLIER_128)
_PCG_MULT = (0x2360ED051FC65DA4 << 64) | 0x4385DF649FCCF645
POOL_SIZE = 4

_local = threading.local()


def _int_words(n: int) -> list[int]:
    """numpy's ``_int_to_uint32_array``: the 32-bit words of ``n >= 0``, least significant
    first (``[0]`` for 0)."""
    if n < 0:
        raise ValueError("expected a non-negative integer")
    if n == 0:
        return [0]
    words = []
    while n > 0:
        words.append(n & _MASK32)
        n >>= 32
    return words


def entropy_words(entropy: tuple[int, ...] | list[int] | int,
                  spawn_key: tuple[int, ...] = ()) -> np.ndarray:
    """The assembled entropy of ``SeedSequence(entropy, spawn_key=spawn_key)`` as uint32
    words (its ``get_assembled_entropy``): the entropy's words, padded with zeros to the
    pool size when there is a spawn key, then the spawn key's words."""
    ints = [entropy] if isinstance(entropy, int) else list(entropy)
    run = [w for v in ints for w in _int_words(int(v))]
    if spawn_key:
        if len(run) < POOL_SIZE:
            run += [0] * (POOL_SIZE - len(run))
        run += [w for v in spawn_key for w in _int_words(int(v))]
    return np.array(run, dtype=np.uint32)


@numba.njit(cache=True)
def _hashmix(value, hash_const):  # pragma: no cover (compiled)
    value = np.uint32(value ^ hash_const[0])
    hash_const[0] = np.uint32(hash_const[0] * np.uint32(0x931E8875))
    value = np.uint32(value * hash_const[0])
    return np.uint32(value ^ (value >> np.uint32(16)))


@numba.njit(cache=True)
def _mix(x, y):  # pragma: no cover (compiled)
    result = np.uint32(np.uint32(np.uint32(0xCA01F9DD) * x)
                       - np.uint32(np.uint32(0x4973F715) * y))
    return np.uint32(result ^ (result >> np.uint32(16)))


@numba.njit(cache=True)
def _generate_state(entropy, out):  # pragma: no cover (compiled)
    """``out`` (8 uint32 words): ``generate_state(8)`` of the SeedSequence whose assembled
    entropy is ``entropy`` (uint32 words), pool size 4."""
    hash_const = np.empty(1, dtype=np.uint32)
    hash_const[0] = np.uint32(0x43B0D7E5)
    pool = np.empty(POOL_SIZE, dtype=np.uint32)
    n = entropy.shape[0]
    for i in range(POOL_SIZE):
        pool[i] = _hashmix(entropy[i] if i < n else np.uint32(0), hash_const)
    for i_src in range(POOL_SIZE):
        for i_dst in range(POOL_SIZE):
            if i_src != i_dst:
                pool[i_dst] = _mix(pool[i_dst], _hashmix(pool[i_src], hash_const))
    for i_src in range(POOL_SIZE, n):
        for i_dst in range(POOL_SIZE):
            pool[i_dst] = _mix(pool[i_dst], _hashmix(entropy[i_src], hash_const))
    h = np.uint32(0x8B51F9DD)
    for i_dst in range(out.shape[0]):
        v = np.uint32(pool[i_dst % POOL_SIZE] ^ h)
        h = np.uint32(h * np.uint32(0x58F38DED))
        v = np.uint32(v * h)
        out[i_dst] = np.uint32(v ^ (v >> np.uint32(16)))


def pcg64_state(entropy: tuple[int, ...] | list[int] | int,
                spawn_key: tuple[int, ...] = ()) -> tuple[int, int]:
    """(state, inc) of ``PCG64(SeedSequence(entropy, spawn_key=spawn_key))``."""
    w = np.empty(8, dtype=np.uint32)
    _generate_state(entropy_words(entropy, spawn_key), w)
    v = [int(x) for x in w.tolist()]
    # generate_state(4, uint64): the words in pairs, little-endian
    seed_hi, seed_lo = v[0] | (v[1] << 32), v[2] | (v[3] << 32)
    inc_hi, inc_lo = v[4] | (v[5] << 32), v[6] | (v[7] << 32)
    initstate = (seed_hi << 64) | seed_lo
    inc = (((inc_hi << 64) | inc_lo) << 1 | 1) & _MASK128
    state = inc  # 0 * mult + inc
    state = (state + initstate) & _MASK128
    state = (state * _PCG_MULT + inc) & _MASK128
    return state, inc


def seeded_rng(entropy: tuple[int, ...] | list[int] | int, spawn_key: tuple[int, ...] = (),
               slot: int = 0) -> np.random.Generator:
    """This thread's generator for ``slot``, in the state of
    ``np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=spawn_key))``."""
    gens = getattr(_local, "gens", None)
    if gens is None:
        gens = _local.gens = {}
    rng = gens.get(slot)
    if rng is None:
        rng = gens[slot] = np.random.Generator(np.random.PCG64(0))
    state, inc = pcg64_state(entropy, spawn_key)
    rng.bit_generator.state = {"bit_generator": "PCG64",
                               "state": {"state": state, "inc": inc},
                               "has_uint32": 0, "uinteger": 0}
    return rng
