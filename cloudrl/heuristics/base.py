"""Shared machinery of the heuristic policies: observation parsing and action assembly.

A heuristic reads only the observation dict (``servers``, ``jobs``, ``macro``,
``action_mask``), never the simulator, so the decision service can run it on
observations built from HTTP requests. Subclasses give the rule as hooks
(which job first, which server for it, optional power and priority choices);
:class:`HeuristicPolicy` turns the rule into an action of either interface:

* flat: one action per tick: the first placeable job in the rule's order on
  the rule's server, else a power toggle if the rule wants one, else wait;
* branching: every queue slot is filled in one tick with the same rule,
  against capacities tracked locally (:class:`JointPlan`) so the placements
  never conflict; slots where nothing fits are deferred.

Every chosen (sub-)action is checked against the mask; a masked one falls
back to wait / defer / hold / FIFO, which the envs always allow.
"""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar

import numpy as np

from cloudrl.policy import INTERFACES, Interface
from envs.cluster_env import HOLD
from envs.observation import SERVER_COLS, J, S

FIT_TOL = 1e-6  # capacity kept spare when jobs stack on one server within a tick (float32 obs)



def columns(names: tuple[str, ...], index: dict[str, int]) -> slice | list[int]:
    """Index of several named columns: a slice when they are adjacent (a cheap view)."""
    idx = [index[name] for name in names]
    if idx == list(range(idx[0], idx[0] + len(idx))):
        return slice(idx[0], idx[-1] + 1)
    return idx


_CPU, _MEM, _PRESENT = J["cpu"], J["mem"], J["present"]
_FREE = columns(("cpu_free", "mem_free"), S)


@lru_cache(maxsize=64)
def _branch_offsets(k: int, n: int, t: int) -> np.ndarray:
    """Offset of each branch of a branching action in the concatenated mask."""
    return np.concatenate([np.arange(k) * (n + 1), k * (n + 1) + np.arange(t) * 3,
                           [k * (n + 1) + 3 * t]])


class ObsView:
    """One observation split by name: layout (K, N, T, L) and the placement/power masks."""

    __slots__ = ("k", "n", "t", "levels", "servers", "jobs", "macro", "mask", "place_mask",
                 "toggle_mask", "tier_mask", "present", "_placeable")

    def __init__(self, obs: dict[str, np.ndarray], interface: Interface) -> None:
        servers, jobs = np.asarray(obs["servers"]), np.asarray(obs["jobs"])
        mask = np.asarray(obs["action_mask"]) > 0.5
        k, n = jobs.shape[0], servers.shape[0]
        t = servers.shape[1] - len(SERVER_COLS)
        self.k, self.n, self.t = k, n, t
        self.servers, self.jobs, self.macro, self.mask = servers, jobs, obs.get("macro"), mask
        self.present = jobs[:, _PRESENT] > 0.5
        self._placeable: np.ndarray | None = None
        if interface == "flat":
            if mask.shape != (k * n + n + 1,):
                raise ValueError(f"flat action_mask must have K*N+N+1 = {k * n + n + 1} "
                                 f"entries, got {mask.shape}")
            self.levels = 0
            self.place_mask = mask[:k * n].reshape(k, n)
            self.toggle_mask = mask[k * n:k * n + n]
            self.tier_mask = None
        else:
            self.levels = mask.shape[0] - k * (n + 1) - 3 * t
            if self.levels < 1:
                raise ValueError(f"branching action_mask too short ({mask.shape[0]}) for "
                                 f"K={k}, N={n}, T={t}")
            self.place_mask = mask[:k * (n + 1)].reshape(k, n + 1)[:, :n]
            self.toggle_mask = None
            self.tier_mask = mask[k * (n + 1):k * (n + 1) + 3 * t].reshape(t, 3)

    @property
    def placeable(self) -> np.ndarray:
        """(K,) bool: the slot's job fits on some server now (before this tick's placements)."""
        if self._placeable is None:
            self._placeable = self.place_mask.any(axis=1)
        return self._placeable

    @property
    def wait_action(self) -> int:
        return self.k * self.n + self.n


class JointPlan:
    """The placements chosen so far this tick and the capacity they leave.

    A slot's feasible servers are the mask's, except on servers that already
    received a job this tick: there the job must fit in what is left, with
    :data:`FIT_TOL` to spare (observations are float32, the simulator float64).
    """

    __slots__ = ("view", "free", "touched", "placed")

    def __init__(self, view: ObsView) -> None:
        self.view = view
        self.free = view.servers[:, _FREE].T.astype(np.float64)  # (2, N): CPU, memory
        self.touched = np.zeros(view.n, dtype=bool)
        self.placed = 0

    @property
    def free_cpu(self) -> np.ndarray:
        return self.free[0]

    def feasible(self, slot: int) -> np.ndarray:
        row = self.view.place_mask[slot]
        if not self.placed:
            return row
        job = self.view.jobs[slot]
        fits = (job[_CPU] <= self.free[0] - FIT_TOL) & (job[_MEM] <= self.free[1] - FIT_TOL)
        return row & (fits | ~self.touched)

    def commit(self, slot: int, server: int) -> None:
        job = self.view.jobs[slot]
        self.free[0, server] -= job[_CPU]
        self.free[1, server] -= job[_MEM]
        self.touched[server] = True
        self.placed += 1


class HeuristicPolicy:
    """Base of the heuristics: implements the Policy protocol from rule hooks."""

    name: ClassVar[str] = "heuristic"
    toggles_power: ClassVar[bool] = False

    def __init__(self, interface: Interface = "flat") -> None:
        if interface not in INTERFACES:
            raise ValueError(f"interface must be one of {INTERFACES}, got {interface!r}")
        self.interface: Interface = interface
        self.reset()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(interface={self.interface!r})"

    def reset(self) -> None:
        """Forget per-episode state (called at episode start)."""

    def act(self, obs: dict[str, np.ndarray]) -> int | np.ndarray:
        view = ObsView(obs, self.interface)
        self._observe(view)
        if self.interface == "flat":
            return self._act_flat(view)
        return self._act_branching(view)

    # ---------------------------------------------------------------- rule hooks
    def _observe(self, view: ObsView) -> None:
        """Per-tick bookkeeping before any choice (running estimates)."""

    def _job_order(self, view: ObsView, flat: bool) -> np.ndarray:
        """Present slots in the order the rule serves them."""
        return np.flatnonzero(view.present)

    def _choose_server(self, view: ObsView, slot: int, feasible: np.ndarray,
                       plan: JointPlan) -> int:
        """A server among ``feasible`` (non-empty) for ``slot``: first fit by default."""
        return int(feasible.argmax())

    def _power_flat(self, view: ObsView) -> int | None:
        """Server to toggle on a tick with nothing to place, or None."""
        return None

    def _power_tiers(self, view: ObsView, plan: JointPlan) -> np.ndarray:
        """Per-tier decision (0 sleep one, 1 hold, 2 wake one) after the placements."""
        return np.full(view.t, HOLD, dtype=np.int64)

    def _priority(self, view: ObsView) -> int:
        """Queue priority level of the branching interface."""
        return 0

    # ---------------------------------------------------------------- assembly
    def _act_flat(self, view: ObsView) -> int:
        order = self._job_order(view, flat=True)
        if len(order):
            placeable = order[view.placeable[order]]
            if len(placeable):
                slot = int(placeable[0])
                server = self._choose_server(view, slot, view.place_mask[slot], JointPlan(view))
                return self._checked_flat(view, slot * view.n + server)
        server = self._power_flat(view)
        if server is not None:
            return self._checked_flat(view, view.k * view.n + int(server))
        return view.wait_action

    @staticmethod
    def _checked_flat(view: ObsView, action: int) -> int:
        return action if view.mask[action] else view.wait_action

    def _act_branching(self, view: ObsView) -> np.ndarray:
        k, n, t = view.k, view.n, view.t
        action = np.empty(k + t + 1, dtype=np.int64)
        action[:k] = n
        plan = JointPlan(view)
        for slot in self._job_order(view, flat=False):
            feasible = plan.feasible(slot)
            if feasible.any():
                server = self._choose_server(view, int(slot), feasible, plan)
                action[slot] = server
                plan.commit(int(slot), server)
        action[k:k + t] = self._power_tiers(view, plan)
        action[-1] = self._priority(view)
        return self._checked_branching(view, action)

    @staticmethod
    def _checked_branching(view: ObsView, action: np.ndarray) -> np.ndarray:
        k, n, t = view.k, view.n, view.t
        allowed = view.mask[_branch_offsets(k, n, t) + action]
        if allowed.all():
            return action
        fallback = np.concatenate([np.full(k, n), np.full(t, HOLD), [0]])
        return np.where(allowed, action, fallback)
