"""Numba kernels for the per-tick hot path: feasibility and observation features.

One call computes what would otherwise take ~40 small numpy calls (each a
microsecond of dispatch): the (K, N) fit matrix, the per-server feature rows,
the visible-job rows and the per-tier aggregates. Compiled once and cached
on disk (``cache=True``), so Ray workers reuse the compiled code.
"""

from __future__ import annotations

import numba
import numpy as np

_FIT_EPS = 1e-9


@numba.njit(cache=True)
def observe(dyn, caps, static, queue_window, flag_scale, tier, n_tiers, queue, job_feats,
            t, time_scale):  # pragma: no cover - compiled
    """Fit matrix, server rows, job rows and per-tier sums for the current tick.

    ``dyn`` columns: used_cpu, used_mem, is_active, is_asleep, is_waking,
    wake_left, n_running (see envs.sim.DYN_COLS). Returns
    ``(fits (m, N) bool, servers (N, F) f32, jobs (K, 7) f32, tier_sums (5, T),
    queue_stats (3,))``; ``queue`` is every pending job id, its first
    ``queue_window`` the visible slots; queue stats are the sum and minimum of
    arrival ticks and the summed CPU demand of the whole queue, then the
    fleet's total power draw.
    with tier sums of used_cpu, is_active, is_asleep, is_waking and the count of
    idle active servers.
    """
    n = dyn.shape[0]
    window = queue[:queue_window]
    m = window.shape[0]
    servers = static.copy()
    tier_sums = np.zeros((5, n_tiers))
    for s in range(n):
        used_cpu = dyn[s, 0]
        used_mem = dyn[s, 1]
        servers[s, 2] = caps[s, 0] - used_cpu
        servers[s, 3] = caps[s, 1] - used_mem
        servers[s, 4] = used_cpu / caps[s, 0]
        for c in range(5):
            servers[s, 5 + c] = dyn[s, 2 + c] * flag_scale[c]
        k = tier[s]
        tier_sums[0, k] += used_cpu
        tier_sums[1, k] += dyn[s, 2]
        tier_sums[2, k] += dyn[s, 3]
        tier_sums[3, k] += dyn[s, 4]
        if dyn[s, 2] > 0.0 and dyn[s, 6] == 0.0:
            tier_sums[4, k] += 1.0
    fits = np.zeros((m, n), dtype=np.bool_)
    jobs = np.zeros((queue_window, 7), dtype=np.float32)
    for i in range(m):
        j = window[i]
        cpu = job_feats[j, 0]
        mem = job_feats[j, 1]
        any_fit = False
        for s in range(n):
            ok = dyn[s, 2] > 0.0 and cpu <= caps[s, 0] - dyn[s, 0] + _FIT_EPS \
                and mem <= caps[s, 1] - dyn[s, 1] + _FIT_EPS
            fits[i, s] = ok
            any_fit = any_fit or ok
        jobs[i, 0] = 1.0
        jobs[i, 1] = cpu
        jobs[i, 2] = mem
        jobs[i, 3] = job_feats[j, 2] / time_scale
        jobs[i, 4] = (t - job_feats[j, 3]) / time_scale
        jobs[i, 5] = (job_feats[j, 4] - t) / time_scale
        jobs[i, 6] = 1.0 if any_fit else 0.0
    queue_stats = np.zeros(4)  # sum of arrivals, min arrival, sum of CPU demand, total watts
    for s in range(n):
        queue_stats[3] += dyn[s, 7]
    if queue.shape[0]:
        queue_stats[1] = job_feats[queue[0], 3]
    for i in range(queue.shape[0]):
        j = queue[i]
        queue_stats[0] += job_feats[j, 3]
        queue_stats[1] = min(queue_stats[1], job_feats[j, 3])
        queue_stats[2] += job_feats[j, 0]
    return fits, servers, jobs, tier_sums, queue_stats


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
def branching_mask(fits, tier_sums, queue_window, n_servers, levels):  # pragma: no cover
    """Concatenated per-branch masks: K slot branches (N servers + defer), T tier branches
    (sleep one if an idle active server, hold, wake one if an asleep server), L levels."""
    n_tiers = tier_sums.shape[1]
    row = n_servers + 1
    mask = np.zeros(queue_window * row + 3 * n_tiers + levels, dtype=np.bool_)
    for k in range(queue_window):
        if k < fits.shape[0]:
            for s in range(n_servers):
                mask[k * row + s] = fits[k, s]
        mask[k * row + n_servers] = True
    base = queue_window * row
    for t in range(n_tiers):
        mask[base + 3 * t] = tier_sums[4, t] > 0
        mask[base + 3 * t + 1] = True
        mask[base + 3 * t + 2] = tier_sums[2, t] > 0
    for level in range(levels):
        mask[base + 3 * n_tiers + level] = True
    return mask


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
    observe(dyn, np.ones((1, 2)), np.zeros((1, 13), dtype=np.float32), 1, np.ones(5),
            np.zeros(1, dtype=np.int64), 1, np.zeros(1, dtype=np.int64), np.ones((1, 5)),
            0.0, 100.0)
    tick_sums(dyn, np.ones(1))
    fits = np.ones((1, 1), dtype=np.bool_)
    mask = branching_mask(fits, np.ones((5, 1)), 1, 1, 1)
    sizes = np.array([2, 3, 1], dtype=np.int64)
    check_branching(np.zeros(3, dtype=np.int64), sizes, np.array([0, 2, 5]), mask)
