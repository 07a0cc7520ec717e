"""Numba kernels for the single env's per-tick hot path: observation, power sums, checks.

One call (:func:`observe_env`) computes what would otherwise take ~40 small numpy
calls (each a microsecond of dispatch): the server rows, the visible-job rows,
the macro row and the action mask, with the batched env's code. Compiled once and cached
on disk (``cache=True``), so Ray workers reuse the compiled code.
"""

from __future__ import annotations

import numba
import numpy as np

from envs import vector_kernels as vk

_FIT_EPS = 1e-9


@numba.njit(cache=True)
def observe_env(dyn, queue, job_cpu, job_mem, job_arrival, job_dur, job_latest, t,
                clock_offset, arrival_ema, violation_ema, cpu_cap, mem_cap, tier, static,
                flag_scale, tier_norm, sin_tab, cos_tab, fpar, ipar):  # pragma: no cover
    """The whole observation of one env in one call: ``(macro, servers, jobs, bool mask,
    float32 mask)``, fresh arrays each call.

    The rules are the batched env's (``envs.vector_kernels.observe_one``, the same code);
    ``queue`` is every pending job id in service order, ``fpar``/``ipar`` the parameter
    rows of ``envs.vector_kernels`` (``Q_BRANCHING`` picks the mask layout).
    """
    n = dyn.shape[0]
    window = ipar[vk.Q_WINDOW]
    n_tiers = ipar[vk.Q_TIERS]
    if ipar[vk.Q_BRANCHING] != 0:
        mask_size = window * (n + 1) + 3 * n_tiers + ipar[vk.Q_LEVELS]
    else:
        mask_size = window * n + n + 1
    ist = np.zeros(vk.N_ISTATE, dtype=np.int64)
    ist[vk.I_T] = t
    ist[vk.I_QLEN] = queue.shape[0]
    ist[vk.I_CLOCK_OFFSET] = clock_offset
    fema = np.empty(2)
    fema[0] = arrival_ema
    fema[1] = violation_ema
    macro = np.empty(4 * n_tiers + 11, dtype=np.float32)
    servers = np.empty((n, static.shape[1]), dtype=np.float32)
    jobs = np.empty((window, 7), dtype=np.float32)
    mask = np.empty(mask_size, dtype=np.bool_)
    vk.observe_one(dyn, ist, fema, queue, job_cpu, job_mem, job_arrival, job_dur, job_latest,
                   cpu_cap, mem_cap, tier, static, flag_scale, tier_norm, sin_tab, cos_tab,
                   fpar, ipar, macro, servers, jobs, mask)
    return macro, servers, jobs, mask, mask.astype(np.float32)


@numba.njit(cache=True)
def tick_sums(dyn, cpu_cap):  # pragma: no cover - compiled
    """(total watts, CPU used on active servers, CPU capacity of active servers)."""
    watts = 0.0
    used = 0.0
    cap = 0.0
    for s in range(dyn.shape[0]):
        watts += dyn[s, 7]
        if dyn[s, 2] > 0.0:
            used += dyn[s, 0]
            cap += cpu_cap[s]
    return watts, used, cap


@numba.njit(cache=True)
def check_branching(action, sizes, offsets, mask):  # pragma: no cover - compiled
    """-1: in space and feasible; -2: in space but a sub-action is masked; b >= 0: branch b
    is out of range."""
    for b in range(sizes.shape[0]):
        if action[b] < 0 or action[b] >= sizes[b]:
            return b
    for b in range(sizes.shape[0]):
        if not mask[offsets[b] + action[b]]:
            return -2
    return -1


def warm_up() -> None:
    """Compile (or load from the on-disk cache) before the first timed step."""
    dyn = np.zeros((1, 9))
    dyn[0, 2] = 1.0
    ones, ids = np.ones(1), np.zeros(1, dtype=np.int64)
    fpar, ipar = np.ones(9), np.ones(8, dtype=np.int64)
    ipar[vk.Q_TIERS] = 1
    for branching in (0, 1):
        ipar[vk.Q_BRANCHING] = branching
        observe_env(dyn, ids, ones, ones, ids, ids, ids, 0, 0, 0.0, 0.0, ones, ones, ids,
                    np.zeros((1, 13), dtype=np.float32), np.ones(5), np.ones((4, 1)), ones,
                    ones, fpar, ipar)
    tick_sums(dyn, ones)
    sizes = np.array([2, 3, 1], dtype=np.int64)
    check_branching(np.zeros(3, dtype=np.int64), sizes, np.array([0, 2, 5]),
                    np.ones(6, dtype=np.bool_))
