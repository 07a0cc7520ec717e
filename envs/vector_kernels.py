"""Numba kernel of the batched simulator: one call steps B clusters by one tick each.

The state of B :class:`envs.sim.ClusterSim` instances lives in stacked arrays (see
``envs.vector_env``) and :func:`step_batch` does, per env, what the single env's
``step`` does in Python and small kernels: decode and check the action (flat or
branching), place jobs and toggle servers, draw power, finish jobs, tick wake-ups
down, drop expired jobs, enqueue arrivals, and build the next observation (macro
row, server rows, job rows, mask), the reward and the info terms.

Every float operation is the single env's, in the same order, so the same seed
and actions give bit-identical episodes (tests/test_vector_env.py checks that).
Running jobs are kept in start order, which reproduces the order in which the
single simulator's finish buckets release them (that order matters for the
float sums of used CPU and memory).
"""

from __future__ import annotations

import numba
import numpy as np

ACTIVE, ASLEEP, WAKING = 0, 1, 2
SLEEP_ONE, HOLD, WAKE_ONE = 0, 1, 2
_FIT_EPS = 1e-9
_EMA = 0.05

# columns of the per-env integer state ``ist``
(I_T, I_N_WAKING, I_PRIORITY, I_QLEN, I_NEXT_ARRIVAL, I_N_JOBS, I_N_WARM, I_RLEN,
 I_CLOCK_OFFSET) = range(9)
N_ISTATE = 9
# columns of the float parameters ``fpar`` and integer parameters ``ipar``
(P_TICK_SECONDS, P_PEAK_W, P_INV_PEAK_W, P_TOTAL_CPU, P_ALPHA, P_BETA, P_TOGGLE,
 P_INVALID, P_TIME_SCALE) = range(9)
(Q_WINDOW, Q_CAPACITY, Q_WAKE_DELAY, Q_EPISODE_LENGTH, Q_LEVELS, Q_PERIOD, Q_BRANCHING,
 Q_TIERS) = range(8)
# columns of the signal cost parameters ``spar`` and of the per-tick ``sig_cost`` rows
S_EXPORT_USD_PER_MWH, S_CARBON_USD_PER_KG, S_REWARD_PER_USD = range(3)
N_SPAR = 3
C_PRICE, C_CARBON, C_SOLAR_J = range(3)
# columns of the info outputs (the last three only with signals)
INFO_F = ("energy_kwh", "energy_norm", "r_energy", "r_sla", "r_toggle", "r_invalid",
          "energy_usd", "carbon_kg", "r_signal")
INFO_I = ("violations", "late", "dropped", "finished", "toggles", "placement_conflicts",
          "invalid_action")


@numba.njit(cache=True, inline="always")
def _refresh(dyn, pstate, s, cpu_cap, p_idle, p_span, expo, standby):  # pragma: no cover
    state = pstate[s]
    if state == ACTIVE:
        u = min(dyn[s, 0] / cpu_cap[s], 1.0)
        dyn[s, 7] = p_idle[s] + p_span[s] * u ** expo[s]
        dyn[s, 8] = 1.0 if dyn[s, 6] == 0 else 0.0
    elif state == WAKING:
        dyn[s, 7] = p_idle[s]
        dyn[s, 8] = 0.0
    else:
        dyn[s, 7] = standby[s]
        dyn[s, 8] = 1.0


@numba.njit(cache=True)
def _set_state(dyn, pstate, ist, s, state, cpu_cap, p_idle, p_span, expo,
               standby):  # pragma: no cover
    old = pstate[s]
    ist[I_N_WAKING] += (1 if state == WAKING else 0) - (1 if old == WAKING else 0)
    dyn[s, 2 + old] = 0.0
    dyn[s, 2 + state] = 1.0
    pstate[s] = state
    _refresh(dyn, pstate, s, cpu_cap, p_idle, p_span, expo, standby)


@numba.njit(cache=True)
def _toggle(dyn, pstate, ist, s, wake_delay, cpu_cap, p_idle, p_span, expo,
            standby):  # pragma: no cover
    state = pstate[s]
    if state == ACTIVE and dyn[s, 6] == 0:
        _set_state(dyn, pstate, ist, s, ASLEEP, cpu_cap, p_idle, p_span, expo, standby)
    elif state == ASLEEP:
        if wake_delay == 0:
            _set_state(dyn, pstate, ist, s, ACTIVE, cpu_cap, p_idle, p_span, expo, standby)
        else:
            dyn[s, 5] = wake_delay
            _set_state(dyn, pstate, ist, s, WAKING, cpu_cap, p_idle, p_span, expo, standby)
    else:
        return False
    return True


@numba.njit(cache=True)
def _place(dyn, pstate, ist, queue, slot, s, window, job_cpu, job_mem, job_dur, run_job,
           run_end, run_srv, cpu_cap, mem_cap, p_idle, p_span, expo, standby):  # pragma: no cover
    qlen = ist[I_QLEN]
    if slot < 0 or slot >= min(qlen, window):
        return False
    if s < 0 or s >= dyn.shape[0] or pstate[s] != ACTIVE:
        return False
    j = queue[slot]
    if job_cpu[j] > cpu_cap[s] - dyn[s, 0] + _FIT_EPS or \
            job_mem[j] > mem_cap[s] - dyn[s, 1] + _FIT_EPS:
        return False
    for i in range(slot, qlen - 1):
        queue[i] = queue[i + 1]
    ist[I_QLEN] = qlen - 1
    dyn[s, 0] += job_cpu[j]
    dyn[s, 1] += job_mem[j]
    dyn[s, 6] += 1
    _refresh(dyn, pstate, s, cpu_cap, p_idle, p_span, expo, standby)
    r = ist[I_RLEN]
    run_job[r] = j
    run_end[r] = ist[I_T] + job_dur[j]
    run_srv[r] = s
    ist[I_RLEN] = r + 1
    return True


@numba.njit(cache=True)
def _sort_queue(queue, qlen, level, levels, job_arrival, job_latest):  # pragma: no cover
    """Stable order by (key, job id): the single sim's ``np.lexsort((ids, key))``."""
    if qlen < 2:
        return
    w = level / max(1, levels - 1)
    keys = np.empty(qlen)
    for i in range(qlen):
        j = queue[i]
        keys[i] = (1.0 - w) * job_arrival[j] + w * job_latest[j]
    for i in range(1, qlen):
        k, j = keys[i], queue[i]
        p = i - 1
        while p >= 0 and (keys[p] > k or (keys[p] == k and queue[p] > j)):
            keys[p + 1] = keys[p]
            queue[p + 1] = queue[p]
            p -= 1
        keys[p + 1] = k
        queue[p + 1] = j


@numba.njit(cache=True)
def observe_one(dyn, ist, fema, queue, job_cpu, job_mem, job_arrival, job_dur, job_latest,
                cpu_cap, mem_cap, tier, static, flag_scale, tier_norm, sin_tab, cos_tab,
                fpar, ipar, macro, servers, jobs, mask):  # pragma: no cover
    """Write one env's observation rows and its bool mask (the single env's rules)."""
    n = dyn.shape[0]
    n_tiers = ipar[Q_TIERS]
    window = ipar[Q_WINDOW]
    time_scale = fpar[P_TIME_SCALE]
    t = ist[I_T]
    tf = float(t)
    qlen = ist[I_QLEN]
    m = min(qlen, window)
    tier_sums = np.zeros((5, n_tiers))
    watts = 0.0
    for s in range(n):
        used_cpu = dyn[s, 0]
        for c in range(static.shape[1]):
            servers[s, c] = static[s, c]
        servers[s, 2] = cpu_cap[s] - used_cpu
        servers[s, 3] = mem_cap[s] - dyn[s, 1]
        servers[s, 4] = used_cpu / cpu_cap[s]
        for c in range(5):
            servers[s, 5 + c] = dyn[s, 2 + c] * flag_scale[c]
        k = tier[s]
        tier_sums[0, k] += used_cpu
        tier_sums[1, k] += dyn[s, 2]
        tier_sums[2, k] += dyn[s, 3]
        tier_sums[3, k] += dyn[s, 4]
        if dyn[s, 2] > 0.0 and dyn[s, 6] == 0.0:
            tier_sums[4, k] += 1.0
    branching = ipar[Q_BRANCHING] != 0
    row = n + 1 if branching else n
    mask[:] = False
    jobs[:, :] = 0.0
    for i in range(m):
        j = queue[i]
        cpu = job_cpu[j]
        mem = job_mem[j]
        any_fit = False
        for s in range(n):
            ok = dyn[s, 2] > 0.0 and cpu <= cpu_cap[s] - dyn[s, 0] + _FIT_EPS \
                and mem <= mem_cap[s] - dyn[s, 1] + _FIT_EPS
            mask[i * row + s] = ok
            any_fit = any_fit or ok
        jobs[i, 0] = 1.0
        jobs[i, 1] = cpu
        jobs[i, 2] = mem
        jobs[i, 3] = float(job_dur[j]) / time_scale
        jobs[i, 4] = (tf - float(job_arrival[j])) / time_scale
        jobs[i, 5] = (float(job_latest[j]) - tf) / time_scale
        jobs[i, 6] = 1.0 if any_fit else 0.0
    if branching:
        for k in range(window):
            mask[k * row + n] = True
        base = window * row
        for tt in range(n_tiers):
            mask[base + 3 * tt] = tier_sums[4, tt] > 0
            mask[base + 3 * tt + 1] = True
            mask[base + 3 * tt + 2] = tier_sums[2, tt] > 0
        for level in range(ipar[Q_LEVELS]):
            mask[base + 3 * n_tiers + level] = True
    else:
        kn = window * n
        for s in range(n):
            mask[kn + s] = dyn[s, 8] > 0
        mask[kn + n] = True
    for s in range(n):
        watts += dyn[s, 7]
    # macro: per-tier aggregates, then the tail of envs.observation.MACRO_TAIL
    p = 0
    for r in range(4):
        for tt in range(n_tiers):
            macro[p] = tier_sums[r, tt] * tier_norm[r, tt]
            p += 1
    q_mean = q_max = q_cpu = 0.0
    if qlen:
        arrival_sum = 0.0
        arrival_min = float(job_arrival[queue[0]])
        cpu_sum = 0.0
        for i in range(qlen):
            j = queue[i]
            a = float(job_arrival[j])
            arrival_sum += a
            arrival_min = min(arrival_min, a)
            cpu_sum += job_cpu[j]
        q_mean = (tf - arrival_sum / qlen) / time_scale
        q_max = (tf - arrival_min) / time_scale
        q_cpu = cpu_sum / fpar[P_TOTAL_CPU]
    asleep = 0.0
    for tt in range(n_tiers):
        asleep += tier_sums[2, tt]
    phase = (t + ist[I_CLOCK_OFFSET]) % ipar[Q_PERIOD]
    macro[p] = qlen / ipar[Q_CAPACITY]
    macro[p + 1] = q_mean
    macro[p + 2] = q_max
    macro[p + 3] = q_cpu
    macro[p + 4] = fema[0]
    macro[p + 5] = watts * fpar[P_INV_PEAK_W]
    macro[p + 6] = asleep / n
    macro[p + 7] = fema[1]
    macro[p + 8] = sin_tab[phase]
    macro[p + 9] = cos_tab[phase]
    macro[p + 10] = t / ipar[Q_EPISODE_LENGTH]


@numba.njit(cache=True)
def step_batch(active, actions, dyn, pstate, ist, fema, queue, job_cpu, job_mem,
               job_arrival, job_deadline, job_dur, job_latest, run_job, run_end,
               run_srv, cpu_cap, mem_cap, p_idle, p_span, expo, standby, tier, static, flag_scale,
               tier_norm, sin_tab, cos_tab, fpar, ipar, mask, macro, servers, jobs,
               mask_f32, rewards, done, info_f, info_i, sig_on, sig_cost, sig_feat,
               spar):  # pragma: no cover
    """Advance every env with ``active[b]`` by one tick under ``actions[b]``.

    ``mask[b]`` is read as the mask of the previous observation (the validity of
    the action) and overwritten with the new one. The action is assumed in space
    (the caller checks ranges).

    With ``sig_on``: ``sig_cost[b, t]`` is (price $/MWh, carbon gCO2/kWh, solar joules) of
    tick ``t`` of env ``b``'s episode, ``sig_feat[b, t]`` the signal columns appended to
    the macro row at tick ``t``, ``spar`` the ``S_*`` parameters; the step's dollar cost
    enters the reward and the ``energy_usd``/``carbon_kg``/``r_signal`` info columns
    (``envs.cluster_env._ClusterEnvBase._reward``, the same operations)."""
    n_envs = dyn.shape[0]
    n = dyn.shape[1]
    window = ipar[Q_WINDOW]
    wake_delay = ipar[Q_WAKE_DELAY]
    branching = ipar[Q_BRANCHING] != 0
    n_tiers = ipar[Q_TIERS]
    for b in range(n_envs):
        if not active[b]:
            continue
        d = dyn[b]
        ps = pstate[b]
        st = ist[b]
        q = queue[b]
        jc = job_cpu[b]
        jm = job_mem[b]
        jd = job_dur[b]
        rj = run_job[b]
        re = run_end[b]
        rs = run_srv[b]
        mk = mask[b]
        a = actions[b]
        invalid = False
        conflicts = 0
        toggles = 0
        # ---- the action
        if branching:
            for br in range(a.shape[0]):
                off = br * (n + 1) if br < window else \
                    window * (n + 1) + 3 * (br - window) if br < window + n_tiers else \
                    window * (n + 1) + 3 * n_tiers
                if not mk[off + a[br]]:
                    invalid = True
                    break
            if not invalid:
                m = min(st[I_QLEN], window)
                win = q[:m].copy()
                for slot in range(m):
                    server = a[slot]
                    if server < n:
                        idx = 0
                        while q[idx] != win[slot]:
                            idx += 1
                        if not _place(d, ps, st, q, idx, server, window, jc, jm, jd, rj, re, rs,
                                      cpu_cap, mem_cap, p_idle, p_span, expo, standby):
                            conflicts += 1
                for tt in range(n_tiers):
                    dec = a[window + tt]
                    if dec == HOLD:
                        continue
                    pick = -1
                    if dec == SLEEP_ONE:
                        for s in range(n):
                            if tier[s] == tt and ps[s] == ACTIVE and d[s, 6] == 0:
                                pick = s
                    else:
                        for s in range(n):
                            if tier[s] == tt and ps[s] == ASLEEP:
                                pick = s
                                break
                    if pick >= 0 and _toggle(d, ps, st, pick, wake_delay, cpu_cap, p_idle,
                                             p_span, expo, standby):
                        toggles += 1
                    else:
                        conflicts += 1
                level = a[a.shape[0] - 1]
                if level != st[I_PRIORITY]:
                    st[I_PRIORITY] = level
                    _sort_queue(q, st[I_QLEN], level, ipar[Q_LEVELS], job_arrival[b],
                                job_latest[b])
        else:
            act = a[0]
            if not mk[act]:
                invalid = True
            else:
                kn = window * n
                if act < kn:
                    _place(d, ps, st, q, act // n, act % n, window, jc, jm, jd, rj, re, rs,
                           cpu_cap, mem_cap, p_idle, p_span, expo, standby)
                elif act < kn + n and _toggle(d, ps, st, act - kn, wake_delay, cpu_cap,
                                              p_idle, p_span, expo, standby):
                    toggles += 1
        # ---- the tick (envs.sim.ClusterSim.advance)
        total_w = 0.0
        for s in range(n):
            total_w += d[s, 7]
        energy = total_w * fpar[P_TICK_SECONDS]
        t_now = st[I_T]
        t = t_now + 1
        st[I_T] = t
        finished = 0
        late = 0
        keep = 0
        n_warm = st[I_N_WARM]
        for r in range(st[I_RLEN]):
            j = rj[r]
            if re[r] != t:
                rj[keep] = j
                re[keep] = re[r]
                rs[keep] = rs[r]
                keep += 1
                continue
            s = rs[r]
            d[s, 6] -= 1
            if d[s, 6] == 0:
                d[s, 0] = 0.0
                d[s, 1] = 0.0
            else:
                d[s, 0] -= jc[j]
                d[s, 1] -= jm[j]
            _refresh(d, ps, s, cpu_cap, p_idle, p_span, expo, standby)
            if j < n_warm:
                continue
            finished += 1
            if t > job_deadline[b, j]:
                late += 1
        st[I_RLEN] = keep
        if st[I_N_WAKING]:
            for s in range(n):
                if ps[s] == WAKING:
                    d[s, 5] -= 1
                    if d[s, 5] <= 0:
                        _set_state(d, ps, st, s, ACTIVE, cpu_cap, p_idle, p_span, expo,
                                   standby)
        qlen = st[I_QLEN]
        kept = 0
        for i in range(qlen):
            j = q[i]
            if job_deadline[b, j] > t:
                q[kept] = j
                kept += 1
        dropped = qlen - kept
        st[I_QLEN] = kept
        start = end = st[I_NEXT_ARRIVAL]
        n_jobs = st[I_N_JOBS]
        arrivals = 0
        while end < n_jobs and job_arrival[b, end] <= t:
            end += 1
        if end != start:
            st[I_NEXT_ARRIVAL] = end
            arrivals = end - start
            admitted = min(ipar[Q_CAPACITY] - kept, arrivals)
            for i in range(admitted):
                q[kept + i] = start + i
            st[I_QLEN] = kept + admitted
            dropped += arrivals - admitted
            if st[I_PRIORITY] and admitted:
                _sort_queue(q, st[I_QLEN], st[I_PRIORITY], ipar[Q_LEVELS], job_arrival[b],
                            job_latest[b])
        fema[b, 0] += _EMA * (arrivals - fema[b, 0])
        fema[b, 1] += _EMA * (late + dropped - fema[b, 1])
        # ---- reward and info (envs.cluster_env._ClusterEnvBase._reward)
        energy_norm = total_w / fpar[P_PEAK_W]
        violations = late + dropped
        r_energy = fpar[P_ALPHA] * energy_norm
        r_sla = fpar[P_BETA] * violations
        r_toggle = fpar[P_TOGGLE] * toggles
        r_invalid = fpar[P_INVALID] if invalid else 0.0
        if sig_on:
            price = sig_cost[b, t_now, C_PRICE]
            solar_j = sig_cost[b, t_now, C_SOLAR_J]
            grid_j = energy - solar_j if energy > solar_j else 0.0
            export_j = solar_j - energy if solar_j > energy else 0.0
            grid_kwh = grid_j / 3.6e6
            energy_usd = grid_kwh * price / 1000.0 - \
                export_j / 3.6e6 * spar[S_EXPORT_USD_PER_MWH] / 1000.0
            carbon_kg = grid_kwh * sig_cost[b, t_now, C_CARBON] / 1000.0
            cost_usd = energy_usd + carbon_kg * spar[S_CARBON_USD_PER_KG]
            r_signal = spar[S_REWARD_PER_USD] * cost_usd
            rewards[b] = -(r_energy + r_sla + r_toggle + r_invalid + r_signal)
            info_f[b, 6] = energy_usd
            info_f[b, 7] = carbon_kg
            info_f[b, 8] = -r_signal
        else:
            rewards[b] = -(r_energy + r_sla + r_toggle + r_invalid)
        info_f[b, 0] = energy / 3.6e6
        info_f[b, 1] = energy_norm
        info_f[b, 2] = -r_energy
        info_f[b, 3] = -r_sla
        info_f[b, 4] = -r_toggle
        info_f[b, 5] = -r_invalid
        info_i[b, 0] = violations
        info_i[b, 1] = late
        info_i[b, 2] = dropped
        info_i[b, 3] = finished
        info_i[b, 4] = toggles
        info_i[b, 5] = conflicts
        info_i[b, 6] = 1 if invalid else 0
        done[b] = t >= ipar[Q_EPISODE_LENGTH]
        observe_one(d, st, fema[b], q, jc, jm, job_arrival[b], jd, job_latest[b], cpu_cap,
                    mem_cap, tier, static, flag_scale, tier_norm, sin_tab, cos_tab, fpar,
                    ipar, macro[b], servers[b], jobs[b], mk)
        if sig_on:
            n_sig = sig_feat.shape[2]
            base = macro.shape[1] - n_sig
            for c in range(n_sig):
                macro[b, base + c] = sig_feat[b, t, c]
        for i in range(mk.shape[0]):
            mask_f32[b, i] = 1.0 if mk[i] else 0.0


@numba.njit(cache=True)
def forecast_window_stats(truth, paths, error, horizon, every, out_mean,
                          out_min):  # pragma: no cover
    """Mean and minimum of the forecast over ticks ``t+1 .. t+horizon`` for every tick ``t``
    of ``out_mean``/``out_min`` (shape (rows, n_obs)), the forecast seen at ``t`` being the
    one issued at ``t0 = t - t % every`` (``1 <= every <= horizon``).

    The forecast of tick ``s`` issued at ``t0`` is ``envs.signals.forecast``'s, with the same
    operations: ``truth[s] * max(0, 1 + error * (paths[s] - paths[t0]))`` (``truth[s]``
    when ``error`` is 0), ``s`` clipped to the series' last tick. Per issue, the window
    ``[i, i + horizon)`` of its ``horizon + every - 1`` forecast values is a suffix of the
    first ``horizon`` (summed and minimised from the last value down) plus a prefix of the
    rest: O(horizon + every) per issue. The forecasts of four issues are computed into a
    buffer (a loop the compiler vectorises), then their four running sums advance
    together, one lead at a time, in registers: each sum adds in its own order, as one
    issue at a time would, but a sum no longer waits on the previous addition of the
    same issue alone."""
    rows, n = truth.shape
    n_obs = out_mean.shape[1]
    n_issue = (n_obs + every - 1) // every
    last = n_issue - 1
    width = horizon + every - 1
    ext = last * every + 1 + width  # ticks the forecasts reach, the series' last one held
    et = np.empty(ext)
    ep = np.empty(ext)
    buf = np.empty((4, width))
    suf_sum = np.empty((n_issue, every))
    suf_min = np.empty((n_issue, every))
    for r in range(rows):
        m = min(n, ext)
        for s in range(m):
            et[s] = truth[r, s]
            ep[s] = paths[r, s]
        for s in range(m, ext):
            et[s] = truth[r, n - 1]
            ep[s] = paths[r, n - 1]
        for k0 in range(0, n_issue, 4):
            # four issues' forecasts (the last issue repeated when fewer are left)
            for q in range(4):
                t0 = min(k0 + q, last) * every
                b = ep[t0]
                row = buf[q]
                # slices indexed by the loop counter: no negative-index fix-up, so the
                # compiler vectorises the loop
                ps = ep[t0 + 1:t0 + 1 + width]
                ts = et[t0 + 1:t0 + 1 + width]
                if error == 0.0:
                    for j in range(width):
                        row[j] = ts[j]
                else:
                    for j in range(width):
                        f = (ps[j] - b) * error + 1.0
                        row[j] = max(f, 0.0) * ts[j]
            b0, b1, b2, b3 = buf[0], buf[1], buf[2], buf[3]
            j = horizon - 1
            sa, sb, sc, sd = b0[j], b1[j], b2[j], b3[j]
            ma, mb, mc, md = sa, sb, sc, sd
            ka, kb, kc, kd = k0, min(k0 + 1, last), min(k0 + 2, last), min(k0 + 3, last)
            for j in range(horizon - 1, -1, -1):
                if j < horizon - 1:
                    fa, fb, fc, fd = b0[j], b1[j], b2[j], b3[j]
                    ma = min(ma, fa)
                    mb = min(mb, fb)
                    mc = min(mc, fc)
                    md = min(md, fd)
                    sa += fa
                    sb += fb
                    sc += fc
                    sd += fd
                if j < every:
                    suf_sum[ka, j] = sa
                    suf_min[ka, j] = ma
                    suf_sum[kb, j] = sb
                    suf_min[kb, j] = mb
                    suf_sum[kc, j] = sc
                    suf_min[kc, j] = mc
                    suf_sum[kd, j] = sd
                    suf_min[kd, j] = md
            for q in range(4):
                k = k0 + q
                if k > last:
                    break
                t0 = k * every
                row = buf[q]
                pre_min = np.inf
                pre_sum = 0.0
                for i in range(min(every, n_obs - t0)):
                    if i > 0:
                        f = row[horizon + i - 1]
                        pre_min = min(pre_min, f)
                        pre_sum += f
                    out_min[r, t0 + i] = min(suf_min[k, i], pre_min)
                    out_mean[r, t0 + i] = (suf_sum[k, i] + pre_sum) / horizon


@numba.njit(cache=True)
def signal_features(price, carbon, solar, fc_mean, fc_min, price_scale, carbon_scale, peak_kw,
                    out):  # pragma: no cover
    """The macro signal columns of every tick (``envs.observation.signal_cols``) into the
    float32 ``out`` (n_obs, 6 or 8 with solar): ``price / price_scale``, ``carbon /
    carbon_scale``, the forecast means and minima minus the value now over the same scales,
    and with solar ``solar / peak_kw`` and its forecast mean over ``peak_kw``; float64
    arithmetic rounded once to float32, as numpy's ``astype`` rounds."""
    for t in range(out.shape[0]):
        p = price[t]
        c = carbon[t]
        out[t, 0] = p / price_scale
        out[t, 1] = c / carbon_scale
        out[t, 2] = (fc_mean[0, t] - p) / price_scale
        out[t, 3] = (fc_min[0, t] - p) / price_scale
        out[t, 4] = (fc_mean[1, t] - c) / carbon_scale
        out[t, 5] = (fc_min[1, t] - c) / carbon_scale
        if out.shape[1] > 6:
            out[t, 6] = solar[t] / peak_kw
            out[t, 7] = fc_mean[2, t] / peak_kw


@numba.njit(cache=True)
def observe_env_signals(dyn, queue, job_cpu, job_mem, job_arrival, job_dur, job_latest, t,
                        clock_offset, arrival_ema, violation_ema, cpu_cap, mem_cap, tier,
                        static, flag_scale, tier_norm, sin_tab, cos_tab, fpar, ipar,
                        sig_row):  # pragma: no cover
    """``envs.kernels.observe_env`` (the single env's observation in one call) with the
    signal columns ``sig_row`` appended to the macro row: ``(macro, servers, jobs, bool
    mask, float32 mask)``, fresh arrays."""
    n = dyn.shape[0]
    window = ipar[Q_WINDOW]
    n_tiers = ipar[Q_TIERS]
    if ipar[Q_BRANCHING] != 0:
        mask_size = window * (n + 1) + 3 * n_tiers + ipar[Q_LEVELS]
    else:
        mask_size = window * n + n + 1
    ist = np.zeros(N_ISTATE, dtype=np.int64)
    ist[I_T] = t
    ist[I_QLEN] = queue.shape[0]
    ist[I_CLOCK_OFFSET] = clock_offset
    fema = np.empty(2)
    fema[0] = arrival_ema
    fema[1] = violation_ema
    base = 4 * n_tiers + 11
    macro = np.empty(base + sig_row.shape[0], dtype=np.float32)
    servers = np.empty((n, static.shape[1]), dtype=np.float32)
    jobs = np.empty((window, 7), dtype=np.float32)
    mask = np.empty(mask_size, dtype=np.bool_)
    observe_one(dyn, ist, fema, queue, job_cpu, job_mem, job_arrival, job_dur, job_latest,
                cpu_cap, mem_cap, tier, static, flag_scale, tier_norm, sin_tab, cos_tab,
                fpar, ipar, macro, servers, jobs, mask)
    for c in range(sig_row.shape[0]):
        macro[base + c] = sig_row[c]
    return macro, servers, jobs, mask, mask.astype(np.float32)
