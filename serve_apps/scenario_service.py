"""The scenario controller behind ``POST /v1/scenario/decide``, and its shield.

:class:`ScenarioService` builds the deployed scenario's simulator once (the controllers
read its static parts: fleet, power draw, cost and signal settings), loads the configured
controller (:mod:`serve_apps.scenario_config`) and answers a :class:`ScenarioState` with
the two standing controls. The shield:

* the controller runs in a worker thread with ``decide_timeout_s``; an exception, a
  timeout or a non-finite or non-numeric answer is answered by the fallback, the
  signal-aware rule with its defaults; if that fails too, by the safe constant
  ``(0, fleet cores)``: release nothing beyond the work whose slack runs out (the
  executor releases it regardless) and keep every server ready;
* the answer is always clamped into its feasible range: ``release_util`` in
  ``[0, max_release_util]``, ``ready_cores`` in ``[0, fleet cores]``; ``reason`` says so;
* nothing the controller does becomes a 5xx: a state that does not fit the scenario is
  a 422 (:func:`serve_apps.scenario_state.view_of`) before the controller runs.

``decide_ms`` is the server-side time from the validated request to the answer, measured
in the replica for every policy; ``controller_ms`` the configured controller's
``decide_view`` alone, timed in its worker thread (the MPC: building and solving its LP;
the learned policy: its observation and forward pass). ``GET /v1/scenario`` reports both
as p50 and p99 over the replica's last 10,000 requests.

``learned:PATH`` serves a ``cloudrl scenarios distill`` checkpoint
(:class:`cloudrl.algorithms.distill.policy.ServedLearnedController`): it observes exactly
what the env observes in the same state, so it needs the request's ``hour_of_week`` (422
without it) and reads the fleet by power state; a checkpoint trained on another scenario
is refused when the service is built.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from envs.scenario.catalog import load_scenario
from envs.scenario.control import PlanView
from envs.scenario.sim import ScenarioSim
from serve_apps.scenario_config import ScenarioServing
from serve_apps.scenario_schemas import ScenarioDecision, ScenarioState
from serve_apps.scenario_state import observed_view_of, state_of, view_of

SAFE = "safe_constant"


class ScenarioPolicyError(ValueError):
    """A scenario policy that does not load or cannot be served."""


def load_controller(spec: str, params: dict[str, Any], scenario: str | None = None) -> Any:
    """The controller of ``spec`` (see :mod:`serve_apps.scenario_config`), not yet reset.
    With ``scenario``, a learned checkpoint trained on another scenario is refused."""
    if spec.startswith("learned:"):
        return _load_learned(spec.split(":", 1)[1], params, scenario)
    try:
        if spec == "signal_aware":
            from cloudrl.heuristics.signal_aware import SignalAwareConfig, SignalAwareDeferral

            ctrl: Any = SignalAwareDeferral(SignalAwareConfig.from_dict(params))
        elif spec == "mpc":
            from cloudrl.mpc.forecast_mpc import ForecastMPC, MPCConfig

            ctrl = ForecastMPC(MPCConfig(**params))
        elif spec.startswith("python:"):
            _, module, factory = spec.split(":")
            ctrl = getattr(importlib.import_module(module), factory)(**params)
        else:
            raise ScenarioPolicyError(f"policy {spec!r}: expected signal_aware, mpc, "
                                      f"learned:PATH or python:MODULE:FACTORY")
    except ScenarioPolicyError:
        raise
    except Exception as e:  # noqa: BLE001 - any loader failure names the policy
        raise ScenarioPolicyError(f"policy {spec!r} does not load: {type(e).__name__}: "
                                  f"{' '.join(str(e).split())}") from None
    if not callable(getattr(ctrl, "decide_view", None)):
        raise ScenarioPolicyError(
            f"policy {spec!r}: {type(ctrl).__name__} has no decide_view(view) (it decides "
            f"only from an in-process simulator), so the service cannot run it from a "
            f"request; serve signal_aware, mpc or learned:PATH")
    return ctrl


def _load_learned(path: str, params: dict[str, Any], scenario: str | None) -> Any:
    """The served learned controller of the checkpoint at ``path``; ScenarioPolicyError
    names the checkpoint and what is wrong (missing, broken, another scenario's)."""
    unknown = sorted(set(params) - {"threads"})
    if unknown:
        raise ScenarioPolicyError(f"policy 'learned:{path}': unknown params {unknown} (the "
                                  f"learned policy takes only 'threads')")
    if (Path(path) / "cloudrl.json").is_file():  # an RLlib checkpoint (cloudrl train)
        return _load_rllib(path, params, scenario)
    try:
        from cloudrl.algorithms.distill.policy import CheckpointError, load_served_controller
    except Exception as e:  # noqa: BLE001 - torch or the module does not import here
        raise ScenarioPolicyError(f"policy 'learned:{path}' does not load: "
                                  f"{type(e).__name__}: {' '.join(str(e).split())}") from None
    try:
        return load_served_controller(path, scenario, threads=params.get("threads", 1))
    except CheckpointError as e:
        raise ScenarioPolicyError(" ".join(str(e).split())) from None
    except Exception as e:  # noqa: BLE001 - any loader failure names the checkpoint
        raise ScenarioPolicyError(f"--checkpoint {path} does not load: {type(e).__name__}: "
                                  f"{' '.join(str(e).split())}") from None


def _load_rllib(path: str, params: dict[str, Any], scenario: str | None) -> Any:
    """The greedy controller of a ``cloudrl train --scenario`` checkpoint (e.g. the gated
    DQN), deciding from a request's view; ScenarioPolicyError names what is wrong."""
    try:
        from cloudrl.scenarios.rl_policy import RLCheckpointError, load_rl_controller

        ctrl = load_rl_controller(path, "learned", scenario)
    except RLCheckpointError as e:
        raise ScenarioPolicyError(" ".join(str(e).split())) from None
    except Exception as e:  # noqa: BLE001 - any loader failure names the checkpoint
        raise ScenarioPolicyError(f"--checkpoint {path} does not load: {type(e).__name__}: "
                                  f"{' '.join(str(e).split())}") from None
    ctrl.threads = params.get("threads", 1)
    return ctrl


def _timed(fn: Any, view: PlanView) -> tuple[Any, float]:
    """``fn(view)`` and its wall time in ms (in the calling worker thread)."""
    t0 = time.perf_counter()
    out = fn(view)
    return out, (time.perf_counter() - t0) * 1e3


def _percentiles(values: deque[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    arr = np.fromiter(values, dtype=float)
    return float(np.median(arr)), float(np.percentile(arr, 99))


def _pair(out: Any) -> tuple[float, float]:
    """Two finite floats, or ValueError."""
    release, ready = (float(x) for x in out)
    if not (math.isfinite(release) and math.isfinite(ready)):
        raise ValueError(f"non-finite controls ({release}, {ready})")
    return release, ready


def _served_scenario(cfg: ScenarioServing) -> tuple[Any, str]:
    """The scenario the service builds its state with, and the scenario name a learned
    checkpoint must have been trained on (a site's: its split's train part)."""
    if cfg.site is None:
        return load_scenario(cfg.name, n_servers=cfg.n_servers), cfg.name
    from cloudrl.sites.registry import get_site
    from cloudrl.sites.scenario import site_scenario

    site = get_site(cfg.site)
    return site_scenario(site, cfg.split, "test"), f"{site.name}-{cfg.split}-train"


class ScenarioService:
    """One replica's scenario controller with its shield (see the module docstring)."""

    def __init__(self, cfg: ScenarioServing) -> None:
        self.cfg = cfg
        self.scenario, trained_on = _served_scenario(cfg)
        self.sim = ScenarioSim(self.scenario)
        self.controller = load_controller(cfg.policy, cfg.params, trained_on)
        self.observed = bool(getattr(self.controller, "needs_observed_view", False))
        self.controller.reset(self.sim)
        from cloudrl.heuristics.signal_aware import SignalAwareDeferral

        self.fallback = SignalAwareDeferral()
        self.fallback.reset(self.sim)
        self.policy_name = cfg.policy.split(":", 1)[0] if cfg.policy.startswith("learned:") \
            else cfg.policy
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="scenario")
        self.decide_ms: deque[float] = deque(maxlen=10_000)
        self.controller_ms: deque[float] = deque(maxlen=10_000)
        self.counts = {"requests": 0, "fallbacks": 0, "clamped": 0}
        self._example = state_of(self.sim)  # the scenario's first tick on seed 0

    # ------------------------------------------------------------------ deciding
    def _fallback(self, view: PlanView) -> tuple[float, float, str, str | None]:
        try:
            release, ready = _pair(self.fallback.decide_view(view))
            return release, ready, "signal_aware", None
        except Exception as e:  # noqa: BLE001 - the constant answers whatever broke
            return 0.0, view.fleet_cores, SAFE, f"fallback failed: {type(e).__name__}: {e}"

    async def decide(self, state: ScenarioState) -> ScenarioDecision:
        start = time.perf_counter()
        view = view_of(state, self.sim)  # StateError: 422 naming the field
        if self.observed:
            view = observed_view_of(view, state)  # StateError without hour_of_week
        reason, controller_ms = None, None
        try:
            loop = asyncio.get_running_loop()
            out, controller_ms = await asyncio.wait_for(
                loop.run_in_executor(self._pool, _timed, self.controller.decide_view, view),
                self.cfg.decide_timeout_s)
            self.controller_ms.append(controller_ms)
            release, ready = _pair(out)
            policy, fallback = self.policy_name, False
        except TimeoutError:
            reason = f"timeout: {self.policy_name} took longer than {self.cfg.decide_timeout_s} s"
        except Exception as e:  # noqa: BLE001 - the shield answers any controller failure
            reason = f"error: {type(e).__name__}: {' '.join(str(e).split())}"[:300]
        if reason is not None:
            release, ready, policy, failed = self._fallback(view)
            fallback = True
            if failed:
                reason = f"{reason}; {failed}"[:500]
        release_c = float(np.clip(release, 0.0, self.cfg.max_release_util))
        ready_c = float(np.clip(ready, 0.0, view.fleet_cores))
        if (release_c, ready_c) != (release, ready):
            clamp = (f"clamped ({release:g}, {ready:g}) into [0, "
                     f"{self.cfg.max_release_util:g}] x [0, {view.fleet_cores:g}]")
            reason = clamp if reason is None else f"{reason}; {clamp}"
            self.counts["clamped"] += 1
        trimmed = getattr(self.controller, "solve_times", None)
        if isinstance(trimmed, list) and len(trimmed) > 1000:
            del trimmed[:-100]
        ms = (time.perf_counter() - start) * 1e3
        self.decide_ms.append(ms)
        self.counts["requests"] += 1
        self.counts["fallbacks"] += int(fallback)
        return ScenarioDecision(release_util=release_c, ready_cores=ready_c, policy=policy,
                                decide_ms=ms, controller_ms=controller_ms, fallback=fallback,
                                reason=reason)

    # ------------------------------------------------------------------ describing
    def info(self) -> dict[str, Any]:
        """What a client needs to build a valid request, and this replica's counters."""
        sc, sim = self.scenario, self.sim
        decide_p50, decide_p99 = _percentiles(self.decide_ms)
        controller_p50, controller_p99 = _percentiles(self.controller_ms)
        return {
            "scenario": sc.name, "description": sc.description, "policy": self.cfg.policy,
            "site": self.cfg.site, "market": _market(sc) if self.cfg.site else None,
            "fallback": "signal_aware", "horizon_ticks": sim.horizon_ticks,
            "decision_ticks": sc.decision_ticks, "tick_seconds": sc.tick_seconds,
            "episode_ticks": sc.episode_ticks, "fleet_cores": sim.fleet_cores,
            "largest_job_cores": sim.max_job_cores, "boot_ticks": sc.boot_ticks,
            "resume_ticks": sc.resume_ticks, "max_release_util": self.cfg.max_release_util,
            "decide_timeout_s": self.cfg.decide_timeout_s,
            "counters": dict(self.counts),
            "decide_ms_p50": decide_p50, "decide_ms_p99": decide_p99,
            "controller_ms_p50": controller_p50, "controller_ms_p99": controller_p99,
            "requires_hour_of_week": self.observed,
            "example": self._example,
        }


def _market(sc: Any) -> dict[str, Any]:
    """A site's market, as its scenario's signals hold it (publication time, time zone)."""
    m = sc.signals.market
    return m.model_dump(mode="json", exclude={"train_path"}) if m is not None else {}


def scenario_openapi(schema: dict[str, Any], service: ScenarioService) -> dict[str, Any]:
    """``schema`` with the served scenario's rules in the scenario state: every forecast
    array holds one decision period to one horizon of ticks, the fleet's cores, and a
    valid example body."""
    parts = schema.get("components", {}).get("schemas", {})
    state, per_class = parts.get("ScenarioState"), parts.get("PerClass")
    if state is None or per_class is None:
        return schema
    lo, hi = service.scenario.decision_ticks, service.sim.horizon_ticks
    arrays = [state["properties"][k] for k in ("price_fc", "carbon_fc", "solar_fc_kw")]
    arrays += list(per_class["properties"].values())
    for prop in arrays:
        prop["minItems"], prop["maxItems"] = lo, hi
    state["description"] = (f"{state.get('description', '')} Served scenario "
                            f"{service.scenario.name}: forecast arrays of {lo} to {hi} ticks "
                            f"(one length), fleet cores by state summing to "
                            f"{service.sim.fleet_cores:g}.").strip()
    state["example"] = service._example
    return schema
