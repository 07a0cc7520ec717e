"""A trained :class:`models.scenario_policy.ScenarioPolicyModule` as a scenario controller,
and its checkpoint on disk.

:class:`LearnedController` observes exactly as the env does (:func:`envs.scenario.env.
observe` of the online :class:`~envs.scenario.control.PlanView`), takes the module's
greedy action and sets the env's controls for it; it records the wall time of each
decision (view + observation + forward, batch 1, in-process) in ``decide_times``. The
forward runs on ``threads`` torch intra-op threads (default 1; the process setting is
restored after each decision): at batch 1 more threads only add synchronisation, and on
a loaded 2-core machine 2 threads measured 4.5-5 ms p50 per forward against 0.12 ms on
one.

:class:`ServedLearnedController` is the same controller deciding from a view (the Serve
endpoint's path, ``cloudrl serve --scenario NAME --scenario-policy learned --checkpoint
DIR``): :func:`envs.scenario.env.observe` reads two things beyond a ``PlanView`` (the hour
of the week and the fleet by power state), which an :class:`ObservedView` carries; from
one, :meth:`~ServedLearnedController.decide_view` computes the observation the env would,
bit for bit (:func:`view_observation`), and the same greedy action and controls as
:meth:`~LearnedController.decide` on the simulator in that state.

A checkpoint is a directory: ``policy.pt`` (the module's ``state_dict``), ``policy.json``
(module class, ``model_config``, observation size, action branches, scenario, training
config) and, from the command that wrote it, ``manifest.json``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from cloudrl.algorithms.distill.actions import (
    action_controls,
    check_ready_margins,
    check_release_levels,
)
from envs.scenario.control import PlanView, plan_view
from envs.scenario.env import OBS_NAMES, READY_MARGINS, RELEASE_LEVELS, observe
from envs.scenario.sim import ACTIVE, BOOTING, OFF, RESUMING, SUSPENDED, ScenarioSim
from envs.signals.series import SignalSeries
from models.scenario_policy import ReleaseCappedPolicyModule, ScenarioPolicyModule

WEIGHTS = "policy.pt"
SPEC = "policy.json"


class CheckpointError(ValueError):
    """A checkpoint directory that is missing, incomplete or does not fit the env."""


def build_module(hiddens: tuple[int, ...], n_release: int = len(RELEASE_LEVELS),
                 n_ready: int = len(READY_MARGINS), release_cap: bool = False,
                 cap_gate: dict[str, Any] | None = None) -> ScenarioPolicyModule:
    """A fresh module for the scenario env's observation space and its action branches
    (``n_release`` release levels and ``n_ready`` ready margins: the env's unless the
    policy has grids of its own); ``release_cap``: a
    :class:`~models.scenario_policy.ReleaseCappedPolicyModule` (an anchor network beside
    it caps its release level); ``cap_gate`` (``{"column", "above"}``, with
    ``release_cap`` only): the cap holds only where that observation column is above
    ``above``."""
    if cap_gate is not None and not release_cap:
        raise ValueError("build_module: cap_gate needs release_cap")
    cls = ReleaseCappedPolicyModule if release_cap else ScenarioPolicyModule
    model_config: dict[str, Any] = {"hiddens": list(hiddens)}
    if cap_gate is not None:
        model_config["cap_gate"] = {"column": int(cap_gate["column"]),
                                    "above": float(cap_gate["above"])}
    return cls(
        observation_space=gym.spaces.Box(-10.0, 10.0, (len(OBS_NAMES),), np.float32),
        action_space=gym.spaces.MultiDiscrete([n_release, n_ready]),
        model_config=model_config)


class LearnedController:
    """Plays a module greedily; see the module docstring."""

    clairvoyant = False

    def __init__(self, module: ScenarioPolicyModule, name: str = "learned",
                 threads: int | None = 1,
                 release_levels: tuple[float, ...] = RELEASE_LEVELS,
                 ready_margins: tuple[float, ...] = READY_MARGINS) -> None:
        if list(module.branch_sizes) != [len(release_levels), len(ready_margins)]:
            raise ValueError(f"the module has {module.branch_sizes} release and ready "
                             f"actions, the grids {len(release_levels)} and "
                             f"{len(ready_margins)} levels")
        self.module = module.eval()
        self.name = name
        self.threads = threads
        self.release_levels = tuple(release_levels)
        self.ready_margins = tuple(ready_margins)
        self.decide_times: list[float] = []

    def reset(self, sim: ScenarioSim) -> None:
        self.decide_times = []

    def greedy_action(self, obs: np.ndarray) -> tuple[int, int]:
        """The module's greedy action for one observation, on ``threads`` threads."""
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                a = self.module.greedy(torch.from_numpy(obs)[None])[0]
        finally:
            torch.set_num_threads(before)
        return int(a[0]), int(a[1])

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        t0 = time.perf_counter()
        v = plan_view(sim)
        out = action_controls(v, self.greedy_action(observe(sim, v)), self.release_levels,
                              self.ready_margins)
        self.decide_times.append(time.perf_counter() - t0)
        return out


def save_checkpoint(module: ScenarioPolicyModule, out: str | Path, hiddens: tuple[int, ...],
                    extra: dict[str, Any],
                    release_levels: tuple[float, ...] = RELEASE_LEVELS,
                    ready_margins: tuple[float, ...] = READY_MARGINS) -> Path:
    """Write ``module`` (its ``policy.json`` records grids other than the env's)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(module.state_dict(), out / WEIGHTS)
    cls = type(module)
    model_config: dict[str, Any] = {"hiddens": list(hiddens)}
    if isinstance(module, ReleaseCappedPolicyModule):
        model_config["release_cap"] = True
        if module.cap_gate is not None:
            column, above = module.cap_gate
            model_config["cap_gate"] = {"column": column, "name": OBS_NAMES[column],
                                        "above": above}
    spec = {"module": f"{cls.__module__}.{cls.__name__}",
            "model_config": model_config, "obs_names": list(OBS_NAMES),
            "action_nvec": [len(release_levels), len(ready_margins)], **extra}
    if tuple(release_levels) != tuple(RELEASE_LEVELS):
        spec["release_levels"] = [float(x) for x in release_levels]
    if tuple(ready_margins) != tuple(READY_MARGINS):
        spec["ready_margins"] = [float(x) for x in ready_margins]
    (out / SPEC).write_text(json.dumps(spec, indent=2))
    return out


def load_checkpoint(path: str | Path) -> tuple[ScenarioPolicyModule, dict[str, Any]]:
    """The module and its ``policy.json``; a missing or mismatched checkpoint is a
    :class:`CheckpointError` naming the path and what is wrong."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"--checkpoint {path}: no such directory")
    for name in (WEIGHTS, SPEC):
        if not (p / name).is_file():
            raise CheckpointError(f"--checkpoint {path}: missing {name} (write one with "
                                  f"'cloudrl scenarios distill')")
    try:
        spec = json.loads((p / SPEC).read_text())
        hiddens = tuple(int(h) for h in spec["model_config"]["hiddens"])
        capped = spec["model_config"].get("release_cap", False)
        gate = spec["model_config"].get("cap_gate")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"--checkpoint {path}: {SPEC} is malformed ({e})") from None
    if not isinstance(capped, bool):
        raise CheckpointError(f"--checkpoint {path}: {SPEC}: model_config.release_cap must "
                              f"be true or false, got {capped!r}")
    if gate is not None:
        gate = _cap_gate_of(gate, capped, f"--checkpoint {path}: {SPEC}")
    try:
        levels, margins = release_levels_of(spec), ready_margins_of(spec)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"--checkpoint {path}: {SPEC}: {e}") from None
    if spec.get("obs_names") != list(OBS_NAMES) or \
            spec.get("action_nvec") != [len(levels), len(margins)]:
        raise CheckpointError(f"--checkpoint {path}: trained for another observation or "
                              f"action layout than this env's")
    module = build_module(hiddens, len(levels), len(margins), release_cap=capped,
                          cap_gate=gate)
    try:
        module.load_state_dict(torch.load(p / WEIGHTS, map_location="cpu", weights_only=True))
    except (RuntimeError, OSError, EOFError) as e:
        raise CheckpointError(f"--checkpoint {path}: {WEIGHTS} does not load "
                              f"({str(e).splitlines()[0]})") from None
    return module.eval(), spec


def _cap_gate_of(gate: Any, capped: bool, where: str) -> dict[str, Any]:
    """A checkpoint's ``model_config.cap_gate``, checked: an object with an observation
    ``column`` (an index of this env's observation whose ``name``, when given, matches)
    and a finite ``above``, on a release-capped policy only."""
    if not capped:
        raise CheckpointError(f"{where}: model_config.cap_gate needs release_cap true")
    if not isinstance(gate, dict):
        raise CheckpointError(f"{where}: model_config.cap_gate must be an object, got "
                              f"{gate!r}")
    column, above = gate.get("column"), gate.get("above")
    if isinstance(column, bool) or not isinstance(column, int) or \
            not 0 <= column < len(OBS_NAMES):
        raise CheckpointError(f"{where}: model_config.cap_gate.column must be an "
                              f"observation index 0..{len(OBS_NAMES) - 1}, got {column!r}")
    if "name" in gate and gate["name"] != OBS_NAMES[column]:
        raise CheckpointError(f"{where}: model_config.cap_gate.name {gate['name']!r} is not "
                              f"observation column {column} ({OBS_NAMES[column]!r})")
    if isinstance(above, bool) or not isinstance(above, (int, float)) or \
            not math.isfinite(above):
        raise CheckpointError(f"{where}: model_config.cap_gate.above must be a finite "
                              f"number, got {above!r}")
    return {"column": column, "above": float(above)}


def release_levels_of(spec: dict[str, Any]) -> tuple[float, ...]:
    """The release grid a checkpoint's ``policy.json`` records (the env's when none)."""
    levels = spec.get("release_levels")
    return RELEASE_LEVELS if levels is None else check_release_levels(tuple(levels))


def ready_margins_of(spec: dict[str, Any]) -> tuple[float, ...]:
    """The ready margins a checkpoint's ``policy.json`` records (the env's when none)."""
    margins = spec.get("ready_margins")
    return READY_MARGINS if margins is None else check_ready_margins(tuple(margins))


def fine_tune_fields(path: str | Path) -> dict[str, Any]:
    """The :class:`~cloudrl.algorithms.distill.config.DistillConfig` fields of a fine-tune
    of the checkpoint at ``path``: the start itself, its hidden sizes and its action grids
    (``None`` where it uses the env's)."""
    spec = load_checkpoint(path)[1]
    if spec["model_config"].get("release_cap"):
        raise CheckpointError(f"--init-checkpoint {path}: a release-capped policy (an offline "
                              f"model search's) cannot be fine-tuned; start from its "
                              f"'start' clone")
    levels, margins = spec.get("release_levels"), spec.get("ready_margins")
    return {"init_checkpoint": str(path), "hiddens": tuple(spec["model_config"]["hiddens"]),
            "release_levels": None if levels is None else tuple(levels),
            "ready_margins": None if margins is None else tuple(margins)}


def load_controller(path: str | Path, name: str = "learned") -> LearnedController:
    module, spec = load_checkpoint(path)
    return LearnedController(module, name, release_levels=release_levels_of(spec),
                             ready_margins=ready_margins_of(spec))


# ---------------------------------------------------------------------- deciding from a view
FLEET_STATES = ("active", "suspended", "off", "resuming", "booting")
_STATE_CODES = np.array([ACTIVE, SUSPENDED, OFF, RESUMING, BOOTING], dtype=np.int8)


@dataclass(frozen=True, eq=False)
class ObservedView(PlanView):
    """A :class:`PlanView` plus the two things :func:`envs.scenario.env.observe` reads from
    the simulator beyond it: the hour of the week at tick ``t`` (the observation's time of
    week) and the fleet's cores by power state (:data:`FLEET_STATES`; the view sums
    suspended with resuming and resuming with booting). Every controller that reads a
    ``PlanView`` reads it unchanged."""

    hour_of_week: float | None = None
    fleet_by_state: tuple[float, float, float, float, float] | None = None


def observed_view(sim: ScenarioSim) -> ObservedView:
    """The :class:`ObservedView` of ``sim`` now (what a request for this state carries)."""
    v = plan_view(sim)
    by_state = tuple(float(sim.cores[sim.state == code].sum()) for code in _STATE_CODES)
    return ObservedView(**{f.name: getattr(v, f.name) for f in fields(PlanView)},
                        hour_of_week=float(sim.signals.hour_of_week(sim.t)),
                        fleet_by_state=by_state)  # type: ignore[arg-type]


class _WeekClock:
    """The signals' calendar at one tick, from its hour of the week (``time_features``)."""

    def __init__(self, hour_of_week: float) -> None:
        self._how = float(hour_of_week)

    def hour_of_day(self, t: int) -> float:
        return float(np.mod(self._how, 24.0))

    def hour_of_week(self, t: int) -> float:
        return self._how

    time_features = SignalSeries.time_features


class _ViewSim:
    """What :func:`observe` reads from a simulator, rebuilt from an :class:`ObservedView`
    and the scenario's static parts (fleet, power draw, episode length): the calendar from
    ``hour_of_week``, the fleet by power state as one entry per state, and the committed
    cores as the running jobs' cores now plus the queued cores."""

    def __init__(self, static: ScenarioSim, v: ObservedView) -> None:
        self.cfg, self.n_ticks = static.cfg, static.n_ticks
        self.fleet_cores = static.fleet_cores
        self.p_idle, self.p_span = static.p_idle, static.p_span
        self.t = v.t
        self.signals = _WeekClock(v.hour_of_week)  # type: ignore[arg-type]
        self.cores = np.asarray(v.fleet_by_state, dtype=float)
        self.state = _STATE_CODES
        running_now = float(v.running[0, 0] + v.running[1, 0]) if v.running.shape[1] else 0.0
        self._committed = running_now + float(v.queued[0]) + float(v.queued[1])

    def committed_cores(self) -> float:
        return self._committed


def view_observation(static: ScenarioSim, v: PlanView) -> np.ndarray:
    """The env's observation (:func:`observe`) of the state ``v`` describes, on the scenario
    of ``static`` (only its static parts are read). ``v`` must be an :class:`ObservedView`
    with ``hour_of_week`` and ``fleet_by_state``; ValueError names what is missing."""
    missing = [name for name in ("hour_of_week", "fleet_by_state")
               if getattr(v, name, None) is None]
    if missing:
        raise ValueError(f"the learned policy observes {' and '.join(missing)} besides the "
                         f"plan view (pass an ObservedView)")
    return observe(_ViewSim(static, v), v)  # type: ignore[arg-type]


class ServedLearnedController(LearnedController):
    """:class:`LearnedController` that also decides from a view (the Serve endpoint's path):
    :meth:`decide_view` takes the same observation (:func:`view_observation`, i.e.
    :func:`observe` of the state), the same greedy action and the same controls as
    :meth:`decide` on the simulator in that state. ``reset(sim)`` gives it the scenario's
    static parts; decisions from a view are not recorded in ``decide_times`` (the service
    times its own)."""

    needs_observed_view = True  # the service sends an ObservedView (hour_of_week required)

    def __init__(self, module: ScenarioPolicyModule, name: str = "learned",
                 threads: int | None = 1, scenario: str | None = None,
                 release_levels: tuple[float, ...] = RELEASE_LEVELS,
                 ready_margins: tuple[float, ...] = READY_MARGINS) -> None:
        super().__init__(module, name, threads, release_levels, ready_margins)
        self.scenario = scenario
        self._static: ScenarioSim | None = None

    def reset(self, sim: ScenarioSim) -> None:
        super().reset(sim)
        self._static = sim

    def decide_view(self, view: PlanView) -> tuple[float, float]:
        if self._static is None:
            raise RuntimeError("reset(sim) first: the controller reads the scenario's fleet")
        return action_controls(view, self.greedy_action(view_observation(self._static, view)),
                               self.release_levels, self.ready_margins)


def load_served_controller(path: str | Path, scenario: str | None = None,
                           name: str = "learned", threads: int | None = 1
                           ) -> ServedLearnedController:
    """The checkpoint at ``path`` as a :class:`ServedLearnedController`. With ``scenario``,
    a checkpoint trained on another scenario is a :class:`CheckpointError` (one that names
    no scenario in its ``policy.json`` is served on any)."""
    module, spec = load_checkpoint(path)
    trained = spec.get("scenario")
    if scenario is not None and trained is not None and trained != scenario:
        raise CheckpointError(f"--checkpoint {path}: trained on scenario {trained!r}, not "
                              f"{scenario!r} (serve it with --scenario {trained})")
    return ServedLearnedController(module, name, threads, trained or scenario,
                                   release_levels_of(spec), ready_margins_of(spec))
