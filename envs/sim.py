"""ClusterSim: the array-based cluster simulator shared by every env, heuristic and service.

State is numpy arrays (per-server power state, wake countdown, used CPU and
memory; a bounded pending queue of job ids; finish-time buckets for running
jobs), not one Python object per server. One :meth:`ClusterSim.advance` moves
time by one tick. Policies act through :meth:`place` and :meth:`toggle`
before the tick advances; both refuse (return False) what is infeasible.

Accounting, per tick ``t``:

1. actions taken at ``t`` (placements start at ``t``; toggles switch state);
2. power is drawn for the tick from the state after the actions:
   active ``P(u)``, waking ``P_idle``, asleep ``standby_fraction * P_idle``;
3. time moves to ``t+1``: jobs whose end tick is ``t+1`` finish (late if the
   end is past their deadline), waking countdowns tick down;
4. queued jobs whose deadline has come are dropped; arrivals of ``t+1`` join
   the queue, or are dropped when it is full.

An SLA violation is a late finish or a drop; the violation rate divides by
jobs that ended (finished or dropped), each counted once. Jobs pre-loaded by
the warm start are background load: they occupy capacity and draw power but
do not enter the SLA, slowdown or wait statistics.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from envs import kernels
from envs.fleet import Fleet
from envs.sim_config import SimConfig
from envs.snapshot import ClusterSnapshot
from envs.workloads.base import FleetCapacity, JobTable, Workload

ACTIVE, ASLEEP, WAKING = 0, 1, 2
DYN_COLS = ("used_cpu", "used_mem", "is_active", "is_asleep", "is_waking", "wake_left",
            "n_running", "watts", "toggleable")
(D_USED_CPU, D_USED_MEM, D_ACTIVE, D_ASLEEP, D_WAKING, D_WAKE_LEFT, D_N_RUNNING,
 D_WATTS, D_TOGGLEABLE) = range(len(DYN_COLS))
JOB_FEATS = ("cpu", "mem", "duration", "arrival", "latest_start")  # columns of job_feats
_STATE_FLAG = {ACTIVE: D_ACTIVE, ASLEEP: D_ASLEEP, WAKING: D_WAKING}
_FIT_EPS = 1e-9
_EMA = 0.05  # smoothing of the arrival-rate and violation estimates in the observation


@dataclass
class TickOutcome:
    """What happened in one tick; the env turns it into reward and ``info``."""

    energy_j: float
    energy_norm: float  # fleet power / fleet peak power, in [0, 1]
    finished: int
    late: int
    dropped: int
    toggles: int


@dataclass
class EpisodeStats:
    """Running totals of an episode (episode jobs only; pre-loaded jobs excluded)."""

    arrived: int = 0
    preloaded: int = 0
    finished: int = 0
    finished_preloaded: int = 0
    late: int = 0
    dropped: int = 0
    toggles: int = 0
    energy_j: float = 0.0
    slowdown_sum: float = 0.0
    util_sum: float = 0.0
    ticks: int = 0
    waits: list[int] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return self.late + self.dropped

    @property
    def violation_rate(self) -> float:
        ended = self.finished + self.dropped
        return self.violations / ended if ended else 0.0


class ClusterSim:
    """The cluster: fleet arrays, queue, running jobs, clock and counters."""

    def __init__(self, cfg: SimConfig, workload: Workload) -> None:
        self.cfg = cfg
        self.workload = workload
        self.fleet = Fleet.from_config(cfg.fleet)
        self.capacity = FleetCapacity(float(self.fleet.cpu_cap.sum()), self.fleet.n_servers)
        self._caps = np.stack([self.fleet.cpu_cap, self.fleet.mem_cap], axis=1)
        self._standby_w = cfg.standby_fraction * self.fleet.p_idle
        self._peak_w = float(self.fleet.p_max.sum())
        # Python-float copies of the fleet for the scalar paths (cheaper than numpy scalars).
        self._cpu_cap = self.fleet.cpu_cap.tolist()
        self._mem_cap = self.fleet.mem_cap.tolist()
        self._p_idle = self.fleet.p_idle.tolist()
        self._p_span = (self.fleet.p_max - self.fleet.p_idle).tolist()
        self._exponent = self.fleet.exponent.tolist()
        self._standby = self._standby_w.tolist()
        self.reset(0)

    def _bind_views(self) -> None:
        """The named per-server columns as views into ``dyn`` (writes go to both)."""
        self.used_cpu = self.dyn[:, D_USED_CPU]
        self.used_mem = self.dyn[:, D_USED_MEM]
        self.wake_left = self.dyn[:, D_WAKE_LEFT]
        self.n_running = self.dyn[:, D_N_RUNNING]
        self.watts = self.dyn[:, D_WATTS]

    def __deepcopy__(self, memo: dict) -> ClusterSim:
        """An independent copy mid-episode. numpy deep-copies a view as a separate array,
        which would cut ``used_cpu`` & co. off from ``dyn``; they are re-bound to the copy's
        ``dyn``. Attributes already in ``memo`` (e.g. shared fixed tables) are reused."""
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        for name, value in vars(self).items():
            setattr(twin, name, copy.deepcopy(value, memo))
        twin._bind_views()
        return twin

    def __setstate__(self, state: dict) -> None:
        """Unpickling: as for :meth:`__deepcopy__`, the column views are re-bound."""
        self.__dict__.update(state)
        self._bind_views()

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int) -> None:
        """Start the episode of ``seed``: same seed, same episode, bit for bit."""
        n = self.fleet.n_servers
        rng = np.random.default_rng(seed)
        self.t = 0
        # Per-server dynamic state lives in one matrix so observations read it in a few
        # vectorized calls; the named attributes below are column views into it.
        self.dyn = np.zeros((n, len(DYN_COLS)))
        self._bind_views()
        self.power_state = np.full(n, ACTIVE, dtype=np.int8)
        self.dyn[:, D_ACTIVE] = 1.0
        self.dyn[:, D_TOGGLEABLE] = 1.0
        self.dyn[:, D_WATTS] = self.fleet.p_idle
        self._n_waking = 0
        self._tick_toggles = 0
        self.priority_level = 0
        n_asleep = int(round(self.cfg.fleet.initially_asleep * n))
        for s in range(n - n_asleep, n):
            self._set_state(s, ASLEEP)
        self.arrival_ema = self.workload.offered_rate(self.capacity)
        self.violation_ema = 0.0
        self.stats = EpisodeStats()
        self._finish_at: dict[int, list[int]] = {}
        jobs = self.workload.generate(self.cfg.episode_length, rng, self.capacity)
        warm = self._warm_jobs(rng) if self.cfg.warm_start else JobTable.empty()
        self._load_jobs(warm, jobs)
        self._queue: list[int] = []
        self._place_warm(len(warm))
        self._next_arrival = len(warm)
        self._enqueue_arrivals()

    def _warm_jobs(self, rng: np.random.Generator) -> JobTable:
        """Steady-state running jobs: M/G/inf occupancy with length-biased residuals."""
        mean_running = self.workload.offered_rate(self.capacity) * \
            self.workload.mean_duration(self.capacity)
        n = int(rng.poisson(mean_running))
        if n == 0:
            return JobTable.empty()
        pool = self.workload.stationary_sample(3 * n, rng, self.capacity)
        weights = pool.duration / pool.duration.sum()
        pick = rng.choice(len(pool), size=n, p=weights)
        dur = pool.duration[pick]
        elapsed = (rng.random(n) * dur).astype(np.int64)  # in [0, dur - 1]
        order = np.argsort(-elapsed, kind="stable")  # sorted by (negative) arrival
        return JobTable(-elapsed[order], pool.cpu[pick][order], pool.mem[pick][order],
                        dur[order], pool.deadline[pick][order])

    def _load_jobs(self, warm: JobTable, jobs: JobTable) -> None:
        arrival = np.concatenate([warm.arrival, jobs.arrival]).astype(np.int64)
        self._set_job_arrays(arrival, np.concatenate([warm.cpu, jobs.cpu]),
                             np.concatenate([warm.mem, jobs.mem]),
                             np.concatenate([warm.duration, jobs.duration]),
                             arrival + np.concatenate([warm.deadline, jobs.deadline]))
        self.n_warm = len(warm)
        self.clock_offset = jobs.clock_offset

    def _set_job_arrays(self, arrival: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                        duration: np.ndarray, deadline: np.ndarray) -> None:
        """Job columns (absolute arrival and deadline ticks) and their scalar copies."""
        self.job_arrival = np.asarray(arrival, dtype=np.int64)
        self.job_cpu = np.asarray(cpu, dtype=np.float64)
        self.job_mem = np.asarray(mem, dtype=np.float64)
        self.job_duration = np.asarray(duration, dtype=np.int64)
        self.job_deadline = np.asarray(deadline, dtype=np.int64)
        self.job_latest_start = self.job_deadline - self.job_duration
        self.job_feats = np.stack([self.job_cpu, self.job_mem, self.job_duration,
                                   self.job_arrival, self.job_latest_start], axis=1)
        self.job_server = np.full(len(self.job_arrival), -1, dtype=np.int64)
        # Python lists for the scalar hot paths (finish, drop, place).
        self._arrival = self.job_arrival.tolist()
        self._deadline = self.job_deadline.tolist()
        self._duration = self.job_duration.tolist()
        self._jcpu = self.job_cpu.tolist()
        self._jmem = self.job_mem.tolist()
        self._server = [-1] * len(self._arrival)

    def _place_warm(self, n_warm: int) -> None:
        """First-fit-decreasing of pre-loaded jobs on active servers, up to 90% full."""
        if n_warm == 0:
            return
        headroom = 0.9
        for j in np.argsort(-self.job_cpu[:n_warm], kind="stable"):
            fits = (self.power_state == ACTIVE) & \
                (self.used_cpu + self.job_cpu[j] <= headroom * self.fleet.cpu_cap) & \
                (self.used_mem + self.job_mem[j] <= headroom * self.fleet.mem_cap)
            hit = np.flatnonzero(fits)
            if len(hit):
                self._start(int(j), int(hit[0]), start_tick=int(self.job_arrival[j]))
                self.stats.preloaded += 1

    def load_snapshot(self, snap: ClusterSnapshot) -> None:
        """Replace the state with an externally observed one (the decision service's path).

        The snapshot's servers get their power state, wake countdown, usage and job count;
        its pending jobs become the queue, in the given order. Running jobs are known only
        through usage and counts, so the loaded state is for observing, not for
        :meth:`advance` (nothing would ever finish); :meth:`reset` starts a normal episode.
        """
        n = self.fleet.n_servers
        snap.check(n)
        self.t = int(snap.tick)
        self.dyn[:] = 0.0
        self.used_cpu[:] = snap.used_cpu
        self.used_mem[:] = snap.used_mem
        self.n_running[:] = snap.n_running
        self.wake_left[:] = np.where(snap.power_state == WAKING, snap.wake_left, 0)
        self.power_state[:] = snap.power_state
        for state, col in _STATE_FLAG.items():
            self.dyn[:, col] = snap.power_state == state
        self._n_waking = int(np.sum(snap.power_state == WAKING))
        for s in range(n):
            self._refresh_server(s)
        self._tick_toggles = 0
        self.priority_level = int(snap.priority_level)
        self.arrival_ema = float(snap.arrival_rate)
        self.violation_ema = float(snap.violation_rate)
        self.stats = EpisodeStats()
        self._finish_at = {}
        self._set_job_arrays(self.t - snap.job_age, snap.job_cpu, snap.job_mem,
                             snap.job_duration, self.t + snap.job_deadline)
        self.n_warm = 0
        self.clock_offset = int(snap.clock_offset)
        self._queue = list(range(len(snap.job_age)))
        self._next_arrival = len(snap.job_age)

    def snapshot(self) -> ClusterSnapshot:
        """The current state as a snapshot (queue in service order); see :meth:`load_snapshot`."""
        queue = np.asarray(self.queue, dtype=np.int64)
        return ClusterSnapshot(
            tick=int(self.t), power_state=self.power_state.astype(np.int8),
            wake_left=self.wake_left.astype(np.int64), used_cpu=self.used_cpu.copy(),
            used_mem=self.used_mem.copy(), n_running=self.n_running.astype(np.int64),
            job_cpu=self.job_cpu[queue], job_mem=self.job_mem[queue],
            job_duration=self.job_duration[queue],
            job_deadline=self.job_deadline[queue] - self.t,
            job_age=self.t - self.job_arrival[queue],
            arrival_rate=float(self.arrival_ema), violation_rate=float(self.violation_ema),
            priority_level=int(self.priority_level), clock_offset=int(self.clock_offset))

    # ------------------------------------------------------------------ queries
    @property
    def queue(self) -> list[int]:
        """Pending job ids in the current service order (index 0 is served first)."""
        return self._queue

    def window(self) -> list[int]:
        """The first ``queue_window`` pending job ids: the slots a policy can place."""
        return self._queue[: self.cfg.queue_window]

    def free_cpu(self) -> np.ndarray:
        return self.fleet.cpu_cap - self.used_cpu

    def free_mem(self) -> np.ndarray:
        return self.fleet.mem_cap - self.used_mem

    def placement_mask(self) -> np.ndarray:
        """(K, N) bool: slot k's job fits on server n now (server active, CPU and memory).

        The env's hot path computes the same rule in ``envs.kernels.observe``; this is the
        plain numpy form for callers outside a step (tests, tools)."""
        mask = np.zeros((self.cfg.queue_window, self.fleet.n_servers), dtype=bool)
        window = self.window()
        if window:
            ids = np.asarray(window)
            mask[: len(ids)] = (
                (self.job_cpu[ids, None] <= self.free_cpu()[None, :] + _FIT_EPS)
                & (self.job_mem[ids, None] <= self.free_mem()[None, :] + _FIT_EPS)
                & (self.power_state == ACTIVE)[None, :]
            )
        return mask

    def toggle_mask(self) -> np.ndarray:
        """(N,) bool: server n can be put to sleep (active, idle) or woken (asleep)."""
        return self.dyn[:, D_TOGGLEABLE] > 0

    def power_draw(self) -> np.ndarray:
        """Per-server power in watts for the current state (maintained incrementally)."""
        return self.watts

    def _refresh_server(self, s: int) -> None:
        """Recompute server ``s``'s power draw and toggleability after any change to it."""
        state = self.power_state[s]
        dyn = self.dyn[s]
        if state == ACTIVE:
            u = min(dyn[D_USED_CPU] / self._cpu_cap[s], 1.0)
            dyn[D_WATTS] = self._p_idle[s] + self._p_span[s] * u ** self._exponent[s]
            dyn[D_TOGGLEABLE] = dyn[D_N_RUNNING] == 0
        elif state == WAKING:
            dyn[D_WATTS] = self._p_idle[s]
            dyn[D_TOGGLEABLE] = 0.0
        else:
            dyn[D_WATTS] = self._standby[s]
            dyn[D_TOGGLEABLE] = 1.0

    def _set_state(self, s: int, state: int) -> None:
        old = self.power_state[s]
        self._n_waking += int(state == WAKING) - int(old == WAKING)
        self.dyn[s, _STATE_FLAG[old]] = 0.0
        self.dyn[s, _STATE_FLAG[state]] = 1.0
        self.power_state[s] = state
        self._refresh_server(s)

    @property
    def running_jobs(self) -> int:
        return int(self.n_running.sum())

    # ------------------------------------------------------------------ actions
    def place(self, slot: int, server: int) -> bool:
        """Start the job in queue slot ``slot`` on ``server`` now. False if infeasible."""
        if not 0 <= slot < min(len(self._queue), self.cfg.queue_window):
            return False
        if not 0 <= server < self.fleet.n_servers or self.power_state[server] != ACTIVE:
            return False
        j = self._queue[slot]
        dyn = self.dyn[server]
        if self._jcpu[j] > self._cpu_cap[server] - dyn[D_USED_CPU] + _FIT_EPS or \
                self._jmem[j] > self._mem_cap[server] - dyn[D_USED_MEM] + _FIT_EPS:
            return False
        del self._queue[slot]
        self._start(j, server, self.t)
        self.stats.waits.append(self.t - self._arrival[j])
        return True

    def toggle(self, server: int) -> bool:
        """Sleep an idle active server, or wake an asleep one. False if infeasible."""
        if not 0 <= server < self.fleet.n_servers:
            return False
        state = self.power_state[server]
        if state == ACTIVE and self.n_running[server] == 0:
            self._set_state(server, ASLEEP)
        elif state == ASLEEP:
            if self.cfg.wake_delay == 0:
                self._set_state(server, ACTIVE)
            else:
                self.wake_left[server] = self.cfg.wake_delay
                self._set_state(server, WAKING)
        else:
            return False
        self._tick_toggles += 1
        return True

    def set_priority(self, level: int) -> None:
        """Queue order: 0 = FIFO ... L-1 = least slack first (latest start time)."""
        if not 0 <= level < self.cfg.priority_levels:
            raise ValueError(f"priority level {level} outside [0, {self.cfg.priority_levels})")
        if level != self.priority_level:
            self.priority_level = level
            self._sort_queue()

    def _start(self, j: int, server: int, start_tick: int) -> None:
        self.job_server[j] = server
        self._server[j] = server
        dyn = self.dyn[server]
        dyn[D_USED_CPU] += self._jcpu[j]
        dyn[D_USED_MEM] += self._jmem[j]
        dyn[D_N_RUNNING] += 1
        self._refresh_server(server)
        end = start_tick + self._duration[j]
        self._finish_at.setdefault(end, []).append(j)

    # ------------------------------------------------------------------ time
    def advance(self) -> TickOutcome:
        """Draw power for the current tick, then move time forward by one tick."""
        cfg, st = self.cfg, self.stats
        total_w, active_used, active_cap = kernels.tick_sums(self.dyn, self.fleet.cpu_cap)
        energy = total_w * cfg.tick_seconds
        st.util_sum += active_used / active_cap if active_cap else 0.0
        st.energy_j += energy
        st.ticks += 1
        toggles, self._tick_toggles = self._tick_toggles, 0
        st.toggles += toggles

        self.t += 1
        finished, late = self._finish_jobs()
        if self._n_waking:
            for srv in np.flatnonzero(self.power_state == WAKING).tolist():
                self.wake_left[srv] -= 1
                if self.wake_left[srv] <= 0:
                    self._set_state(srv, ACTIVE)
        dropped = self._drop_expired()
        arrivals_before = st.arrived
        dropped += self._enqueue_arrivals()
        self.arrival_ema += _EMA * (st.arrived - arrivals_before - self.arrival_ema)
        self.violation_ema += _EMA * (late + dropped - self.violation_ema)
        return TickOutcome(energy, total_w / self.fleet_peak_w, finished, late, dropped, toggles)

    @property
    def fleet_peak_w(self) -> float:
        return self._peak_w

    def _finish_jobs(self) -> tuple[int, int]:
        ids = self._finish_at.pop(self.t, None)
        if not ids:
            return 0, 0
        finished = late = 0
        st, t = self.stats, self.t
        for j in ids:
            s = self._server[j]
            dyn = self.dyn[s]
            dyn[D_N_RUNNING] -= 1
            if dyn[D_N_RUNNING] == 0:  # exact zero on empty servers: no float drift
                dyn[D_USED_CPU] = 0.0
                dyn[D_USED_MEM] = 0.0
            else:
                dyn[D_USED_CPU] -= self._jcpu[j]
                dyn[D_USED_MEM] -= self._jmem[j]
            self._refresh_server(s)
            if j < self.n_warm:
                st.finished_preloaded += 1
                continue
            finished += 1
            if t > self._deadline[j]:
                late += 1
            st.slowdown_sum += (t - self._arrival[j]) / self._duration[j]
        st.finished += finished
        st.late += late
        return finished, late

    def _drop_expired(self) -> int:
        t, deadline = self.t, self._deadline
        keep = [j for j in self._queue if deadline[j] > t]
        dropped = len(self._queue) - len(keep)
        if dropped:
            self._queue = keep
            self.stats.dropped += dropped
        return dropped

    def _enqueue_arrivals(self) -> int:
        """Arrivals of tick ``t`` join the queue; those beyond its capacity are dropped."""
        start = end = self._next_arrival
        arrival, n_jobs, t = self._arrival, len(self._arrival), self.t
        while end < n_jobs and arrival[end] <= t:
            end += 1
        if end == start:
            return 0
        self._next_arrival = end
        self.stats.arrived += end - start
        admitted = min(self.cfg.queue_capacity - len(self._queue), end - start)
        self._queue.extend(range(start, start + admitted))
        dropped = (end - start) - admitted
        self.stats.dropped += dropped
        if self.priority_level and admitted:
            self._sort_queue()
        return dropped

    def _sort_queue(self) -> None:
        if len(self._queue) < 2:
            return
        w = self.priority_level / max(1, self.cfg.priority_levels - 1)
        ids = np.asarray(self._queue)
        key = (1.0 - w) * self.job_arrival[ids] + w * self.job_latest_start[ids]
        self._queue = ids[np.lexsort((ids, key))].tolist()  # ties: arrival (id) order

    @property
    def done(self) -> bool:
        return self.t >= self.cfg.episode_length
