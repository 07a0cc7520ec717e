"""ScenarioSim: the cluster under prices, carbon, solar, job classes and power states.

One :meth:`ScenarioSim.tick` moves time by one tick under the controller's two
standing decisions (:meth:`ScenarioSim.set_controls`):

* ``release_util``: held batch work is released (earliest latest-start first) while
  the cores committed to running and queued jobs stay within this share of the
  fleet's cores. Batch jobs arrive into a *pool* and wait there until released; one
  is released regardless when its latest start comes within ``force_margin``.
* ``ready_cores``: servers kept *ready* (active, suspended or resuming) beyond this
  many cores are switched off; below it, off servers are booted.

A fixed power-aware executor does the rest every tick: best-fit placement (latency-
critical first, then released batch by latest start) on the most efficient tier's
fullest feasible server (with ``executor.lc_reserve_cores`` > 0, batch work leaves the
last active server of the largest tier with that many free cores to latency-critical
jobs); servers resumed, then booted, for waiting work and a spare;
idle servers beyond the spare suspended.

Accounting of tick ``t``:

1. arrivals of ``t`` join the run queue (latency-critical) or the pool (batch);
2. forced and controlled releases; placement; queued jobs past their deadline drop;
3. power moves (resume, boot, suspend, power off) take effect;
4. power is drawn for the tick from the state after the moves: active ``P(u)``,
   suspended and off a fraction of ``P_idle``, resuming and booting ``P_idle``; each
   suspend or shutdown adds its transition energy; facility power is ``PUE`` x IT;
   grid draw is facility minus solar (surplus exported or curtailed); the tick's
   cost is grid energy x price + carbon price x grid carbon (+ SLA penalties);
   with a demand charge (``cost.demand_usd_per_kw_month`` > 0), the tick that closes a
   demand block (``demand_block_ticks`` ticks from tick 0, the last one possibly shorter)
   averages the block's grid kW, and if that average is above the episode's peak so far it
   is charged ``(average - peak) x demand_usd_per_kw`` and becomes the peak: the charges
   sum to ``peak x demand_usd_per_kw``, the peak being the highest block average (metered,
   as ``stats.peak_kw``, with the charge off too);
5. time moves to ``t+1``: jobs ending then finish (late if past their deadline),
   countdowns of resuming and booting servers tick down.

Jobs arrive for ``days``; the episode then runs on (the *drain*) until every job's
deadline has passed, so at the end every job has finished or violated its SLA and no
work can be pushed past the horizon.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from envs.fleet import Fleet
from envs.scenario.config import BATCH, LATENCY_CRITICAL, ScenarioConfig
from envs.scenario.jobs import ClassJobs, expected_load, generate_jobs, hours_of_week
from envs.signals import SignalSeries, make_signals

ACTIVE, SUSPENDED, OFF, RESUMING, BOOTING = 0, 1, 2, 3, 4
STATE_NAMES = ("active", "suspended", "off", "resuming", "booting")
PLACEMENT_NAMES = ("free_max", "roomy_share", "lc_waiting_max")  # ScenarioSim.placement
_EPS = 1e-9
_TIER_WEIGHT = 10.0  # placement: most efficient tier first, then the fullest server


@dataclass
class ClassStats:
    arrived: int = 0
    finished: int = 0
    late: int = 0
    dropped: int = 0

    @property
    def violations(self) -> int:
        return self.late + self.dropped

    @property
    def violation_rate(self) -> float:
        ended = self.finished + self.dropped
        return self.violations / ended if ended else 0.0


@dataclass
class ScenarioStats:
    """Running totals of an episode; every cost term separately."""

    energy_kwh: float = 0.0  # facility energy
    grid_kwh: float = 0.0
    export_kwh: float = 0.0
    solar_used_kwh: float = 0.0
    energy_usd: float = 0.0  # grid energy bought minus export sold
    carbon_kg: float = 0.0
    carbon_usd: float = 0.0
    sla_usd: float = 0.0
    demand_usd: float = 0.0  # the demand charge: peak_kw x the prorated $/kW
    peak_kw: float = 0.0  # highest demand-block average of the grid draw so far
    transitions: int = 0
    transition_kwh: float = 0.0
    ticks: int = 0
    classes: list[ClassStats] = field(default_factory=lambda: [ClassStats(), ClassStats()])

    @property
    def cost_usd(self) -> float:
        return self.energy_usd + self.carbon_usd + self.sla_usd + self.demand_usd

    def summary(self) -> dict[str, float]:
        lc, batch = self.classes
        return {
            "cost_usd": self.cost_usd, "energy_usd": self.energy_usd,
            "carbon_usd": self.carbon_usd, "sla_usd": self.sla_usd,
            "demand_usd": self.demand_usd, "demand_peak_kw": self.peak_kw,
            "energy_kwh": self.energy_kwh, "grid_kwh": self.grid_kwh,
            "export_kwh": self.export_kwh, "carbon_kg": self.carbon_kg,
            "transitions": float(self.transitions), "transition_kwh": self.transition_kwh,
            "sla_lc": lc.violation_rate, "sla_batch": batch.violation_rate,
            "violations_lc": float(lc.violations), "violations_batch": float(batch.violations),
            "jobs_lc": float(lc.arrived), "jobs_batch": float(batch.arrived),
        }


@dataclass
class TickCost:
    """What one tick cost; the env sums these over a decision period."""

    cost_usd: float
    energy_usd: float
    carbon_usd: float
    sla_usd: float
    energy_kwh: float
    grid_kwh: float
    carbon_kg: float
    violations: tuple[int, int]
    demand_usd: float = 0.0


class ScenarioSim:
    """Fleet arrays, the run queue, the batch pool, running jobs, clock and signals."""

    def __init__(self, cfg: ScenarioConfig) -> None:
        self.cfg = cfg
        fleet = Fleet.from_config(cfg.fleet)
        largest = max(t.cpu_cores for t in cfg.fleet.tiers)
        self.fleet = fleet
        self.n = fleet.n_servers
        self.cores = fleet.cpu_cap * largest
        self.fleet_cores = float(self.cores.sum())
        self.max_job_cores = float(self.cores.max())
        self._largest = self.cores >= self.max_job_cores - _EPS  # the largest tier's servers
        self.p_idle = fleet.p_idle.copy()
        self.p_span = fleet.p_max - fleet.p_idle
        self.exponent = fleet.exponent.copy()
        self.wpc = fleet.p_max / self.cores  # watts per core at full load
        # executor orders: efficient first (resume/boot/place), least efficient first (sleep/off)
        self._eff_order = np.argsort(self.wpc, kind="stable")
        self._ineff_order = self._eff_order[::-1].copy()
        pw = cfg.power
        self._state_frac = np.array([0.0, pw.suspended_fraction, pw.off_fraction, 1.0, 1.0])
        self.arrival_ticks = cfg.n_ticks
        self.n_ticks = cfg.episode_ticks
        self.horizon_ticks = int(round(cfg.signals.horizon_hours * cfg.ticks_per_hour))
        self._block_ticks, self._demand_rate = cfg.demand_block_ticks, cfg.demand_usd_per_kw
        self.reset(0)

    # ------------------------------------------------------------------ reset
    def reset(self, seed: int) -> None:
        """Start the episode of ``seed``: same seed, same episode, bit for bit."""
        cfg = self.cfg
        self.seed = int(seed)
        rng = np.random.default_rng([self.seed, 0x5CE7])
        self.signals: SignalSeries = make_signals(
            cfg.signals, self.n_ticks + self.horizon_ticks + 1, cfg.tick_seconds, self.seed)
        self.start_hour_of_week = float(self.signals.hour_of_week0)
        self.hour_of_week = hours_of_week(cfg, self.start_hour_of_week,
                                          self.n_ticks + self.horizon_ticks + 1)
        self.jobs = generate_jobs(cfg, self.fleet_cores, self.max_job_cores,
                                  self.start_hour_of_week, self.arrival_ticks, rng)
        self._arrival = self.jobs.arrival.tolist()
        self._cls = self.jobs.cls.tolist()
        self._cores = self.jobs.cores.tolist()
        self._duration = self.jobs.duration.tolist()
        self._deadline = self.jobs.deadline.tolist()
        self._latest = (self.jobs.deadline - self.jobs.duration).tolist()
        self.job_start = np.full(len(self.jobs), -1, dtype=np.int64)
        self._server = [-1] * len(self.jobs)
        # expected busy cores per class and tick (what a load forecast predicts)
        self.expected_load = np.stack([
            expected_load(cfg, c, self.fleet_cores, self.hour_of_week) for c in cfg.classes])
        self.expected_load[:, self.arrival_ticks:] = 0.0  # no arrivals in the drain
        self.t = 0
        self.state = np.full(self.n, ACTIVE, dtype=np.int8)
        self.countdown = np.zeros(self.n, dtype=np.int64)
        self.suspended_at = np.zeros(self.n, dtype=np.int64)
        self.used = np.zeros(self.n)
        self.n_running = np.zeros(self.n, dtype=np.int64)
        self.run_queue: list[int] = []  # waiting to be placed: LC first, then batch by latest
        self.pool: deque[int] = deque()  # held batch jobs, in latest-start order
        self._finish_at: dict[int, list[int]] = {}
        self._next = 0
        self.release_util = 1.0
        self.ready_cores = self.fleet_cores
        self.stats = ScenarioStats()
        self.last = TickCost(0, 0, 0, 0, 0, 0, 0, (0, 0))
        self.queued_cores = 0.0
        self._block_kw = 0.0  # sum of the open demand block's per-tick grid kW
        self._block_n = 0

    # ------------------------------------------------------------------ copies for planners
    def clone(self) -> ScenarioSim:
        """A copy that ticks on independently of this one: the episode's read-only tables
        (jobs, signals, calendar, expected load, fleet) are shared, the mutable state is
        copied. Far cheaper than ``copy.deepcopy`` (planners roll many copies forward)."""
        new = copy.copy(self)
        for name in ("job_start", "state", "countdown", "suspended_at", "used", "n_running"):
            setattr(new, name, getattr(self, name).copy())
        new._server = list(self._server)
        new.run_queue = list(self.run_queue)
        new.pool = deque(self.pool)
        new._finish_at = {k: list(v) for k, v in self._finish_at.items()}
        new.stats = copy.deepcopy(self.stats)
        return new

    def with_future(self, future: ClassJobs, signals: SignalSeries | None = None
                    ) -> ScenarioSim:
        """A :meth:`clone` whose jobs not yet arrived (arriving at tick ``t`` or later) are
        ``future``'s instead (arrival ticks >= ``t``, sorted), and whose signal series is
        ``signals`` if given (any object with the three per-tick arrays): a planner's
        sampled or blanked future. The jobs that have arrived keep their ids."""
        if len(future) and int(future.arrival.min()) < self.t:
            raise ValueError(f"future: arrivals before tick {self.t}")
        new = self.clone()
        k = self._next
        past = self.jobs
        jobs = ClassJobs(*(np.concatenate([getattr(past, f)[:k], getattr(future, f)])
                           for f in ("arrival", "cls", "cores", "duration", "deadline")))
        new.jobs = jobs
        new._arrival = jobs.arrival.tolist()
        new._cls = jobs.cls.tolist()
        new._cores = jobs.cores.tolist()
        new._duration = jobs.duration.tolist()
        new._deadline = jobs.deadline.tolist()
        new._latest = (jobs.deadline - jobs.duration).tolist()
        new.job_start = np.concatenate([new.job_start[:k], np.full(len(future), -1, np.int64)])
        new._server = new._server[:k] + [-1] * len(future)
        if signals is not None:
            new.signals = signals
        return new

    # ------------------------------------------------------------------ controls
    def set_controls(self, release_util: float, ready_cores: float) -> None:
        """The controller's standing decisions (see the module docstring)."""
        if not np.isfinite(release_util) or release_util < 0:
            raise ValueError(f"release_util must be finite and >= 0, got {release_util}")
        if not np.isfinite(ready_cores) or ready_cores < 0:
            raise ValueError(f"ready_cores must be finite and >= 0, got {ready_cores}")
        self.release_util = float(release_util)
        self.ready_cores = float(ready_cores)

    @property
    def done(self) -> bool:
        return self.t >= self.n_ticks

    # ------------------------------------------------------------------ queries
    def pool_jobs(self) -> list[int]:
        return list(self.pool)

    def committed_cores(self) -> float:
        """Cores of running jobs plus jobs waiting in the run queue."""
        return float(self.used.sum()) + self.queued_cores

    def placement(self) -> np.ndarray:
        """What the aggregate observation leaves out and latency-critical violations follow
        (:data:`PLACEMENT_NAMES`): the most free cores on one active server and the share
        of servers that are active with room for the largest job (both over the largest
        server's cores or the server count), and the largest waiting latency-critical
        job's cores over the largest server's (0 if none waits)."""
        free = np.where(self.state == ACTIVE, self.cores - self.used, 0.0)
        big = self.max_job_cores
        lc = [self._cores[j] for j in self.run_queue if self._cls[j] == LATENCY_CRITICAL] \
            if self.run_queue else []
        return np.array([float(free.max(initial=0.0)) / big,
                         float((free >= big - _EPS).sum()) / self.n,
                         float(max(lc, default=0.0)) / big])

    def ready_mask(self) -> np.ndarray:
        s = self.state
        return (s == ACTIVE) | (s == SUSPENDED) | (s == RESUMING)

    def power_w(self) -> np.ndarray:
        """Per-server IT power for the current state."""
        s = self.state
        util = np.minimum(self.used / self.cores, 1.0)
        active = self.p_idle + self.p_span * util ** self.exponent
        return np.where(s == ACTIVE, active, self._state_frac[s] * self.p_idle)

    # ------------------------------------------------------------------ the tick
    def tick(self) -> TickCost:
        if self.done:
            raise RuntimeError("episode is over; call reset()")
        cfg, st, t = self.cfg, self.stats, self.t
        self._drops = [0, 0]
        self._arrive()
        self._release()
        self._place()
        dropped = self._drop_expired()
        trans_j = self._power_moves()
        # energy of the tick
        it_w = float(self.power_w().sum())
        facility_w = it_w * cfg.cost.pue + trans_j / cfg.tick_seconds
        hours = cfg.tick_seconds / 3600.0
        solar_w = float(self.signals.solar_kw[t]) * 1000.0
        grid_w = max(facility_w - solar_w, 0.0)
        export_w = max(solar_w - facility_w, 0.0)
        price = float(self.signals.price_usd_per_mwh[t])
        carbon = float(self.signals.carbon_g_per_kwh[t])
        export_price = float(cfg.signals.export_price_usd_per_mwh or 0.0)
        grid_kwh = grid_w * hours / 1000.0
        energy_usd = grid_kwh * price / 1000.0 - export_w * hours / 1e6 * export_price
        carbon_kg = grid_kwh * carbon / 1000.0
        carbon_usd = carbon_kg / 1000.0 * cfg.cost.carbon_usd_per_tonne
        st.energy_kwh += facility_w * hours / 1000.0
        st.grid_kwh += grid_kwh
        st.export_kwh += export_w * hours / 1000.0
        st.solar_used_kwh += min(solar_w, facility_w) * hours / 1000.0
        st.transition_kwh += trans_j / 3.6e6
        st.energy_usd += energy_usd
        st.carbon_kg += carbon_kg
        st.carbon_usd += carbon_usd
        st.ticks += 1
        demand_usd = self._meter(grid_w / 1000.0)
        # time moves on
        self.t += 1
        late = self._finish()
        self._count_down()
        viol = (late[0] + dropped[0], late[1] + dropped[1])
        sla_usd = viol[0] * cfg.cost.sla_usd[0] + viol[1] * cfg.cost.sla_usd[1]
        st.sla_usd += sla_usd
        self.last = TickCost(energy_usd + carbon_usd + sla_usd + demand_usd, energy_usd,
                             carbon_usd, sla_usd, facility_w * hours / 1000.0, grid_kwh,
                             carbon_kg, viol, demand_usd)
        return self.last

    def _meter(self, grid_kw: float) -> float:
        """The demand meter: adds this tick's grid kW to the open block; at the block's end
        (or the episode's) the charge of raising the peak to its average ($; 0 while the
        demand charge is off, the peak is metered regardless)."""
        self._block_kw += grid_kw
        self._block_n += 1
        if self._block_n < self._block_ticks and self.t + 1 < self.n_ticks:
            return 0.0
        avg = self._block_kw / self._block_n
        self._block_kw, self._block_n = 0.0, 0
        st = self.stats
        if avg <= st.peak_kw:
            return 0.0
        charge = (avg - st.peak_kw) * self._demand_rate
        st.peak_kw = avg
        st.demand_usd += charge
        return charge

    # ------------------------------------------------------------------ steps of a tick
    def _arrive(self) -> None:
        t, i, n_jobs = self.t, self._next, len(self._arrival)
        classes = self.stats.classes
        arrived_lc = False
        while i < n_jobs and self._arrival[i] <= t:
            c = self._cls[i]
            classes[c].arrived += 1
            if c == LATENCY_CRITICAL:
                self._enqueue(i)
                arrived_lc = True
            else:
                self.pool.append(i)
            i += 1
        self._next = i
        if arrived_lc:
            self._sort_queue()

    def _enqueue(self, j: int) -> None:
        if len(self.run_queue) >= self.cfg.queue_capacity:
            self.stats.classes[self._cls[j]].dropped += 1
            self._drops[self._cls[j]] += 1
            return
        self.run_queue.append(j)
        self.queued_cores += self._cores[j]

    def _sort_queue(self) -> None:
        cls, latest = self._cls, self._latest
        self.run_queue.sort(key=lambda j: (cls[j] != LATENCY_CRITICAL, latest[j]))

    def _release(self) -> None:
        pool = self.pool
        if not pool:
            return
        t = self.t
        force_by = t + self.cfg.minutes_to_ticks(self.cfg.executor.force_margin_min)
        budget = self.release_util * self.fleet_cores - self.committed_cores()
        released = False
        latest, cores = self._latest, self._cores
        while pool:
            j = pool[0]
            if latest[j] <= force_by or cores[j] <= budget + _EPS:
                pool.popleft()
                budget -= cores[j]
                self._enqueue(j)
                released = True
            else:
                break
        if released:
            self._sort_queue()

    def _place(self) -> None:
        q = self.run_queue
        if not q:
            return
        active = self.state == ACTIVE
        free = np.where(active, self.cores - self.used, -1.0)
        max_free = float(free.max())
        if max_free <= 0:
            return
        util = self.used / self.cores
        kept: list[int] = []
        cores, cls = self._cores, self._cls
        reserve = self.cfg.executor.lc_reserve_cores
        largest = self._largest
        for idx, j in enumerate(q):
            c = cores[j]
            if c > max_free + _EPS:
                kept.append(j)
                if max_free < 0.25:
                    kept.extend(q[idx + 1:])
                    break
                continue
            feasible = free >= c - _EPS
            if reserve > 0.0 and cls[j] != LATENCY_CRITICAL:
                roomy = largest & (free >= reserve - _EPS)
                if roomy.sum() <= 1:  # the last server with room for a large LC job
                    feasible &= ~roomy
                    if not feasible.any():
                        kept.append(j)
                        continue
            score = np.where(feasible, util + c / self.cores - _TIER_WEIGHT * self.wpc, -np.inf)
            s = int(score.argmax())
            self._start(j, s)
            free[s] -= c
            util[s] = self.used[s] / self.cores[s]
            max_free = float(free.max())
        self.run_queue = kept

    def _start(self, j: int, s: int) -> None:
        c = self._cores[j]
        self.used[s] += c
        self.n_running[s] += 1
        self.queued_cores -= c
        self._server[j] = s
        self.job_start[j] = self.t
        self._finish_at.setdefault(self.t + self._duration[j], []).append(j)

    def _drop_expired(self) -> tuple[int, int]:
        """Queued jobs that can no longer finish by their deadline are dropped."""
        dropped = self._drops
        t = self.t
        latest = self._latest
        if self.run_queue and min(latest[j] for j in self.run_queue) < t:
            keep = []
            for j in self.run_queue:
                if latest[j] < t:
                    c = self._cls[j]
                    dropped[c] += 1
                    self.stats.classes[c].dropped += 1
                    self.queued_cores -= self._cores[j]
                else:
                    keep.append(j)
            self.run_queue = keep
        return dropped[0], dropped[1]

    def _power_moves(self) -> float:
        """Resume/boot for waiting work and the spare, suspend idle servers, keep the ready
        pool at the controller's target. Returns the transition energy in joules."""
        cfg = self.cfg
        s, cores = self.state, self.cores
        pw = cfg.power
        trans_j = 0.0
        spare = cfg.executor.spare_cores_frac * self.fleet_cores
        waiting = self.queued_cores
        active = s == ACTIVE
        free = float((cores - self.used)[active].sum())
        coming = float(cores[(s == RESUMING) | (s == BOOTING)].sum())
        need = waiting + spare - free - coming
        unfit = self._largest_unfit()
        if unfit > 0:  # a waiting job fits no active or waking server: wake one it fits
            need -= self._wake_one(unfit)
        reserve = cfg.executor.lc_reserve_cores
        if reserve > 0.0 and not self._reserve_held(reserve):
            need -= self._wake_one(self.max_job_cores)  # room for a large LC job
        if need > _EPS:
            for srv in self._eff_order.tolist():
                if need <= _EPS:
                    break
                if s[srv] == SUSPENDED:
                    self._wake(srv, RESUMING, cfg.resume_ticks)
                    need -= cores[srv]
            for srv in self._eff_order.tolist():
                if need <= _EPS:
                    break
                if s[srv] == OFF:
                    self._wake(srv, BOOTING, cfg.boot_ticks)
                    need -= cores[srv]
        else:
            # after placement no waiting job fits any active server's free cores, so an idle
            # server is no use to them: suspend idle servers down to the spare
            room = free - spare
            keep = self._reserve_server(reserve) if reserve > 0.0 else -1
            for srv in self._ineff_order.tolist():
                if s[srv] == ACTIVE and self.n_running[srv] == 0 and srv != keep and \
                        cores[srv] <= room + _EPS:
                    s[srv] = SUSPENDED
                    self.suspended_at[srv] = self.t
                    room -= cores[srv]
                    trans_j += pw.suspend_seconds * self.p_idle[srv]
                    self.stats.transitions += 1
        # the ready pool: off beyond the target, boot below it
        ready = float(cores[self.ready_mask()].sum())
        if ready > self.ready_cores + _EPS:
            hold = cfg.minutes_to_ticks(cfg.executor.off_after_min)
            for srv in self._ineff_order.tolist():
                if s[srv] == SUSPENDED and self.t - self.suspended_at[srv] >= hold and \
                        ready - cores[srv] >= self.ready_cores - _EPS:
                    s[srv] = OFF
                    ready -= cores[srv]
                    trans_j += pw.shutdown_seconds * self.p_idle[srv]
                    self.stats.transitions += 1
        elif ready < self.ready_cores - _EPS:
            booting = float(cores[s == BOOTING].sum())
            short = self.ready_cores - ready - booting
            for srv in self._eff_order.tolist():
                if short <= _EPS:
                    break
                if s[srv] == OFF:
                    self._wake(srv, BOOTING, cfg.boot_ticks)
                    short -= cores[srv]
        return trans_j

    def _largest_unfit(self) -> float:
        """Cores of the largest waiting job that no active server has room for and no
        resuming or booting server could take (0 if none); a batch job does not count the
        server that holds the latency-critical reserve."""
        if not self.run_queue:
            return 0.0
        s = self.state
        room = np.where(s == ACTIVE, self.cores - self.used,
                        np.where((s == RESUMING) | (s == BOOTING), self.cores, 0.0))
        best = float(room.max())
        big = max(self._cores[j] for j in self.run_queue)
        reserve = self.cfg.executor.lc_reserve_cores
        keep = self._reserve_server(reserve) if reserve > 0.0 else -1
        if keep < 0:
            return big if big > best + _EPS else 0.0
        room[keep] = 0.0
        best_batch = float(room.max())
        cls = self._cls
        big_batch = max((self._cores[j] for j in self.run_queue if cls[j] != LATENCY_CRITICAL),
                        default=0.0)
        return max(big if big > best + _EPS else 0.0,
                   big_batch if big_batch > best_batch + _EPS else 0.0)

    def _reserve_server(self, reserve: float) -> int:
        """The active server of the largest tier that batch work must leave to latency-
        critical jobs: the only one with ``reserve`` free cores (-1 if there are several or
        none)."""
        roomy = np.flatnonzero((self.state == ACTIVE) & self._largest
                               & (self.cores - self.used >= reserve - _EPS))
        return int(roomy[0]) if len(roomy) == 1 else -1

    def _reserve_held(self, reserve: float) -> bool:
        """Whether a server of the largest tier has ``reserve`` free cores now, or is waking."""
        s = self.state
        largest = self._largest
        waking = (s == RESUMING) | (s == BOOTING)
        return bool(((largest & (s == ACTIVE) & (self.cores - self.used >= reserve - _EPS))
                     | (largest & waking)).any())

    def _wake_one(self, cores_needed: float) -> float:
        """Wake the most efficient server with ``cores_needed`` cores, suspended before off;
        its cores (0 if none is asleep)."""
        s, cores, cfg = self.state, self.cores, self.cfg
        for want in (SUSPENDED, OFF):
            hit = [srv for srv in self._eff_order.tolist()
                   if s[srv] == want and cores[srv] >= cores_needed - _EPS]
            if hit:
                self._wake(hit[0], RESUMING if want == SUSPENDED else BOOTING,
                           cfg.resume_ticks if want == SUSPENDED else cfg.boot_ticks)
                return float(cores[hit[0]])
        return 0.0

    def _wake(self, srv: int, state: int, ticks: int) -> None:
        self.stats.transitions += 1
        if ticks <= 0:
            self.state[srv] = ACTIVE
            return
        self.state[srv] = state
        self.countdown[srv] = ticks

    def _finish(self) -> tuple[int, int]:
        late = [0, 0]
        ids = self._finish_at.pop(self.t, None)
        if not ids:
            return 0, 0
        classes = self.stats.classes
        for j in ids:
            s = self._server[j]
            self.n_running[s] -= 1
            if self.n_running[s] == 0:
                self.used[s] = 0.0
            else:
                self.used[s] -= self._cores[j]
            c = self._cls[j]
            classes[c].finished += 1
            if self.t > self._deadline[j]:
                late[c] += 1
                classes[c].late += 1
        return late[0], late[1]

    def _count_down(self) -> None:
        waking = (self.state == RESUMING) | (self.state == BOOTING)
        if waking.any():
            self.countdown[waking] -= 1
            done = waking & (self.countdown <= 0)
            self.state[done] = ACTIVE

    # ------------------------------------------------------------------ for planners
    def pool_work(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cores, duration, latest start) of the held batch jobs, in pool order."""
        ids = np.fromiter(self.pool, dtype=np.int64, count=len(self.pool))
        return self.jobs.cores[ids], self.jobs.duration[ids], self.jobs.latest_start[ids]

    def running_profile(self, horizon: int) -> np.ndarray:
        """(2, horizon): cores per class still busy at ticks t..t+horizon-1 from jobs
        already running."""
        prof = np.zeros((2, horizon))
        for end, ids in self._finish_at.items():
            k = min(end - self.t, horizon)
            if k > 0:
                for j in ids:
                    prof[self._cls[j], :k] += self._cores[j]
        return prof

    def queued_cores_by_class(self) -> tuple[float, float]:
        lc = sum(self._cores[j] for j in self.run_queue if self._cls[j] == LATENCY_CRITICAL)
        return lc, self.queued_cores - lc

    def load_forecast(self, horizon: int) -> np.ndarray:
        """(2, horizon): forecast busy cores per class for ticks t+1..t+horizon: the expected
        load times (1 + noise), the noise growing with lead time like the signals'."""
        err = self.cfg.load_forecast_error
        truth = self.expected_load[:, self.t + 1:self.t + 1 + horizon]
        if err <= 0:
            return truth.copy()
        lead_h = np.arange(1, truth.shape[1] + 1) / self.cfg.ticks_per_hour
        rng = np.random.default_rng([self.seed, self.t, 0x10AD])
        # one smooth error path per forecast: a random level plus a slow drift
        z = rng.standard_normal((2, 2))
        noise = err * np.sqrt(lead_h / 24.0) * (z[:, :1] + 0.5 * z[:, 1:] * np.sin(lead_h / 6.0))
        return np.maximum(truth * (1.0 + noise), 0.0)


__all__ = ["ACTIVE", "BATCH", "BOOTING", "LATENCY_CRITICAL", "OFF", "RESUMING", "STATE_NAMES",
           "SUSPENDED", "ScenarioSim", "ScenarioStats", "TickCost"]
