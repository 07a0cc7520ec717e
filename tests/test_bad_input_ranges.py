"""Every number of the env, sim, fleet, workload and service configs has a documented range;
values outside it are refused naming the field and the bound; inside it, accumulated
quantities stay finite; episodes too large for ``sim.limits`` are refused before any
allocation.

The property test draws configs at the extremes of every accepted range (each field at its
lower bound, its upper bound or in between; Poisson, google_v2_like and trace replay) and
steps both envs under numpy's ``errstate(raise)``: per-step reward, its terms, the episode
sums and the energy stay finite, and the episode's cost stays within the bound the ranges
imply. A drawn config may only be refused by the work-size guard (about 40% are; 200
examples: 58% simulated). Job counts are kept simulatable by drawing ``sim.limits`` small
and fleets of at most 256 servers; the largest limits and fleets are covered by the
analytic bound (:func:`cost_bound`) evaluated at the maximum of every range.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import annotated_types as at
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from cloudrl.config_loader import ConfigError, build_config
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from envs.env_config import EnvConfig
from envs.sim_config import FleetConfig, SimConfig, TierConfig, WorkLimits
from envs.workloads import (
    DeadlineConfig,
    GoogleV2LikeConfig,
    PoissonConfig,
    TraceReplayConfig,
    WorkSizeError,
    make_workload,
)
from envs.workloads.google_trace import parse_task_events, save_trace
from envs.workloads.work_size import episode_work
from serve_apps.schemas import AutoPlan, ClusterState, PendingJob, ServerState, Signals
from serve_apps.service_config import ServiceConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "reference" / "input-ranges.md"
SAMPLE = Path(__file__).parent / "fixtures" / "google_v2_task_events_sample.csv.gz"
MODELS: list[type[BaseModel]] = [TierConfig, FleetConfig, SimConfig, WorkLimits, PoissonConfig,
                                 GoogleV2LikeConfig, DeadlineConfig, TraceReplayConfig,
                                 ServiceConfig, ServerState, PendingJob, ClusterState, Signals,
                                 AutoPlan]


def bounds(model: type[BaseModel], name: str) -> tuple[float | None, float | None, bool]:
    """(lower, upper, upper is exclusive) of a field's ``Field`` constraints."""
    lo = hi = None
    open_hi = False
    for c in model.model_fields[name].metadata:
        if isinstance(c, at.Ge):
            lo = c.ge
        elif isinstance(c, at.Gt):
            lo = c.gt
        elif isinstance(c, at.Le):
            hi = c.le
        elif isinstance(c, at.Lt):
            hi, open_hi = c.lt, True
    return lo, hi, open_hi


def numeric_fields(model: type[BaseModel]) -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        text = str(info.annotation)
        if name.endswith("seed") and model is ServiceConfig or name == "kind":
            continue
        if re.search(r"\b(int|float)\b", text) and "list" not in text:
            out.append(name)
    return out


# ------------------------------------------------------------------ every number has a range
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_numeric_field_has_both_bounds_and_is_documented(model):
    doc = DOC.read_text()
    for name in numeric_fields(model):
        lo, hi, _ = bounds(model, name)
        assert lo is not None and hi is not None, f"{model.__name__}.{name} has no range"
        assert lo < hi
        assert re.search(rf"`[^`]*\b{name}\b[^`]*`", doc), \
            f"{model.__name__}.{name} missing from {DOC.name}"


def _path(model: type[BaseModel], name: str, value) -> dict:
    """An EnvConfig layer that sets ``model``'s field ``name`` to ``value``."""
    tier = {"name": "t", "cpu_cores": 16, "mem_gib": 64, "p_idle_w": 50, "p_max_w": 200}
    if model is TierConfig:
        return {"sim": {"fleet": {"tiers": [{**tier, name: value}]}}}
    if model is FleetConfig:
        return {"sim": {"fleet": {name: value}}}
    if model is SimConfig:
        return {"sim": {name: value}}
    if model is WorkLimits:
        return {"sim": {"limits": {name: value}}}
    if model is DeadlineConfig:
        return {"workload": {"kind": "poisson", "deadline": {name: value}}}
    kind = {PoissonConfig: "poisson", GoogleV2LikeConfig: "google_v2_like",
            TraceReplayConfig: "trace"}[model]
    extra = {"path": "no-such-trace.npz"} if kind == "trace" else {}
    return {"workload": {"kind": kind, **extra, name: value}}


ENV_MODELS = [TierConfig, FleetConfig, SimConfig, WorkLimits, PoissonConfig, GoogleV2LikeConfig,
              DeadlineConfig, TraceReplayConfig]
OUT_OF_RANGE = [(m, n) for m in ENV_MODELS for n in numeric_fields(m)]


def _outside(model, name) -> list:
    lo, hi, open_hi = bounds(model, name)
    integer = "int" in str(model.model_fields[name].annotation)
    below = lo - 1 if integer else lo - max(abs(lo) * 1e-6, 1e-9)
    above = hi if open_hi else (hi + 1 if integer else hi * (1 + 1e-6) + 1e-9)
    extremes = [2**63, -(2**63)] if integer else [1.7976931348623157e308, -1e308]
    return [below, above, *extremes]


@pytest.mark.parametrize(("model", "name"), OUT_OF_RANGE,
                         ids=[f"{m.__name__}.{n}" for m, n in OUT_OF_RANGE])
def test_values_outside_the_range_are_one_line_naming_the_field(model, name):
    for value in _outside(model, name):
        with pytest.raises(ConfigError) as err:
            build_config(EnvConfig, _path(model, name, value), source="test")
        message = str(err.value)
        assert "\n" not in message and f".{name}:" in message, message
        assert re.search(r"(greater|less) than", message), message


def test_the_reported_absurd_values_are_refused():
    for layer, field in (({"sim": {"alpha": 1.7e308}}, "sim.alpha"),
                         ({"sim": {"beta": 1e300}}, "sim.beta"),
                         ({"sim": {"fleet": {"tiers": [{"name": "x", "cpu_cores": 8,
                                                         "mem_gib": 8, "p_idle_w": 1,
                                                         "p_max_w": 2,
                                                         "power_exponent": 1e6}]}}},
                          "power_exponent")):
        with pytest.raises(ConfigError, match=re.escape(field)):
            build_config(EnvConfig, layer)


def test_defaults_and_every_range_end_of_the_defaults_validate():
    cfg = EnvConfig()
    assert cfg.sim.limits == WorkLimits() and cfg.sim.episode_length == 1000
    for model in (SimConfig, PoissonConfig, GoogleV2LikeConfig, DeadlineConfig):
        for name in numeric_fields(model):
            default = model.model_fields[name].default
            if default is None:
                continue
            lo, hi, open_hi = bounds(model, name)
            assert lo <= default and (default < hi if open_hi else default <= hi), (model, name)


# ------------------------------------------------------------------ work-size guards
@pytest.fixture(scope="module")
def sample_trace(tmp_path_factory) -> str:
    jobs, report = parse_task_events([SAMPLE])
    return str(save_trace(tmp_path_factory.mktemp("ranges") / "sample.npz", jobs, report))


@pytest.mark.parametrize(("env", "field"), [
    ({"workload": {"rate": 600}}, "workload.rate"),
    ({"workload": {"rate": 2.0}, "sim": {"episode_length": 200_000}}, "workload.rate"),
    ({"workload": {"kind": "google_v2_like", "rate": 50}, "sim": {"episode_length": 10_000}},
     "workload.rate"),
    ({"workload": {"load": None, "duration_mean": 1e9}}, "workload.load"),
    ({"n_servers": 4096, "workload": {"kind": "google_v2_like", "cpu_median": 0.001,
                                      "cpu_sigma": 0.0}}, "workload.load"),
    ({"sim": {"episode_length": 5000, "limits": {"max_episode_jobs": 1000}}}, "workload.rate"),
    ({"sim": {"limits": {"max_episode_bytes": 2**20}}, "workload": {"rate": 5}},
     "max_episode_bytes"),
])
def test_episodes_above_the_limits_are_refused_naming_the_field(env, field):
    with pytest.raises(ValidationError) as err:
        EnvConfig.model_validate(env)
    message = str(err.value)
    assert field in message and "sim.limits." in message, message


def test_episode_length_above_its_limit_names_the_limit():
    with pytest.raises(ValidationError, match=r"limits.max_episode_ticks \(1000000\)"):
        EnvConfig.model_validate({"sim": {"episode_length": 1_000_001}})
    cfg = EnvConfig.model_validate({"sim": {"episode_length": 1_000_001, "limits": {
        "max_episode_ticks": 2_000_000, "max_episode_jobs": 10_000_000}},
        "workload": {"rate": 0.001}})
    assert cfg.sim.episode_length == 1_000_001


def test_raising_the_limit_admits_the_same_episode():
    env = {"workload": {"rate": 600}}
    with pytest.raises(ValidationError):
        EnvConfig.model_validate(env)
    cfg = EnvConfig.model_validate({**env, "sim": {"limits": {"max_episode_jobs": 700_000}}})
    work = episode_work(cfg.sim, make_workload(cfg.workload, cfg.sim.tick_seconds))
    assert 600_000 <= work.jobs <= 700_000


@pytest.mark.parametrize(("time_scale", "accepted"), [(1.0, True), (0.001, True), (5.0, True),
                                                      (100.0, False), (1000.0, False)])
def test_trace_time_scale_is_guarded_before_reset(sample_trace, time_scale, accepted):
    env = {"workload": {"kind": "trace", "path": sample_trace, "time_scale": time_scale}}
    if not accepted:
        with pytest.raises(ValidationError, match=r"workload\.time_scale: an episode would "
                                                  r"create ~[\d,]+ jobs"):
            EnvConfig.model_validate(env)
        return
    sim = ClusterSchedulingEnv(env).sim
    assert len(sim.job_arrival) <= sim.cfg.limits.max_episode_jobs
    assert np.all(sim.job_duration >= 1)


def test_trace_durations_that_overflow_ticks_name_time_scale(tmp_path):
    from envs.workloads.google_trace import ImportReport, TraceJobs

    year = 365 * 86_400 * 10**6
    jobs = TraceJobs(np.array([0, 10]), np.array([5 * year, 10]), np.array([0.1, 0.1]),
                     np.array([0.1, 0.1]), span_us=6 * year)
    path = str(save_trace(tmp_path / "long.npz", jobs, ImportReport()))
    wl = {"kind": "trace", "path": path, "time_scale": 0.001}
    with pytest.raises(WorkSizeError, match=r"workload\.time_scale: 0\.001 with 0\.001 s "
                                            r"ticks makes the longest job"):
        make_workload(TraceReplayConfig(**wl), tick_seconds=0.001)
    clipped = make_workload(TraceReplayConfig(**wl, max_duration_ticks=1000), 0.001)
    assert clipped.duration_ticks.max() == 1000


def test_trace_files_with_absurd_durations_are_refused(tmp_path):
    from envs.workloads.google_trace import TraceJobs

    for duration, span in ((2**62, 2**62 + 5), (10, 2**62)):
        with pytest.raises(ValueError, match="10 years"):
            TraceJobs(np.array([0]), np.array([duration]), np.array([0.1]), np.array([0.1]),
                      span_us=span)


# ------------------------------------------------------------------ finite for every accepted
def cost_bound(sim: SimConfig, jobs: float, ticks: int) -> float:
    """Largest |return| the reward can reach in ``ticks`` ticks with ``jobs`` jobs: energy
    at most 1 per tick, each job violates at most once, at most one toggle per server per
    tick, one invalid-action penalty per tick."""
    n = sim.fleet.n_servers
    return ticks * (sim.alpha + sim.invalid_action_penalty + sim.toggle_penalty * n) \
        + sim.beta * jobs


def test_the_bound_is_finite_at_the_maximum_of_every_range():
    hi = {n: bounds(SimConfig, n)[1] for n in ("alpha", "beta", "toggle_penalty",
                                               "invalid_action_penalty")}
    n_servers = bounds(FleetConfig, "n_servers")[1]
    ticks = bounds(WorkLimits, "max_episode_ticks")[1]
    jobs = bounds(WorkLimits, "max_episode_jobs")[1]
    worst = ticks * (hi["alpha"] + hi["invalid_action_penalty"]
                     + hi["toggle_penalty"] * n_servers) + hi["beta"] * jobs * 10
    assert math.isfinite(worst) and worst < 1e30
    joules = ticks * n_servers * bounds(TierConfig, "p_max_w")[1] * \
        bounds(SimConfig, "tick_seconds")[1]
    assert math.isfinite(joules) and joules < 1e30


def _value(draw, model, name, lo=None, hi=None):
    """A field's lower bound, upper bound or a value between (optionally narrowed)."""
    flo, fhi, open_hi = bounds(model, name)
    lo = flo if lo is None else max(flo, lo)
    hi = fhi if hi is None else min(fhi, hi)
    integer = "int" in str(model.model_fields[name].annotation)
    if integer:
        return draw(st.sampled_from([int(lo), int(hi)]) | st.integers(int(lo), int(hi)))
    top = math.nextafter(hi, -math.inf) if open_hi else hi
    bottom = math.nextafter(lo, math.inf) if isinstance(lo, (int, float)) and lo == 0 and \
        bounds(model, name)[0] == 0 and isinstance(
            next((c for c in model.model_fields[name].metadata if isinstance(c, at.Gt)), None),
            at.Gt) else lo
    return draw(st.sampled_from([float(bottom), float(top)]) | st.floats(bottom, top))


@st.composite
def extreme_envs(draw, trace_path: str) -> dict:
    tiers = []
    for i in range(draw(st.integers(1, 3))):
        p_idle = _value(draw, TierConfig, "p_idle_w")
        tiers.append({"name": f"t{i}", "cpu_cores": _value(draw, TierConfig, "cpu_cores"),
                      "mem_gib": _value(draw, TierConfig, "mem_gib"), "p_idle_w": p_idle,
                      "p_max_w": _value(draw, TierConfig, "p_max_w", lo=max(p_idle, 1e-9)),
                      "power_exponent": _value(draw, TierConfig, "power_exponent"),
                      "share": _value(draw, TierConfig, "share")})
    limits = {"max_episode_ticks": draw(st.integers(1, 20_000)),
              "max_episode_jobs": draw(st.integers(1, 2_000))}
    ticks = _value(draw, SimConfig, "episode_length", hi=limits["max_episode_ticks"])
    window = _value(draw, SimConfig, "queue_window")
    sim = {"fleet": {"n_servers": _value(draw, FleetConfig, "n_servers", hi=256),
                     "tiers": tiers, "fleet_seed": _value(draw, FleetConfig, "fleet_seed"),
                     "initially_asleep": _value(draw, FleetConfig, "initially_asleep")},
           "episode_length": ticks, "queue_window": window,
           "queue_capacity": _value(draw, SimConfig, "queue_capacity", lo=window),
           "limits": limits, "warm_start": draw(st.booleans())}
    for name in ("tick_seconds", "standby_fraction", "wake_delay", "alpha", "beta",
                 "toggle_penalty", "invalid_action_penalty", "priority_levels",
                 "diurnal_period"):
        sim[name] = _value(draw, SimConfig, name)
    kind = draw(st.sampled_from([PoissonConfig, GoogleV2LikeConfig, TraceReplayConfig]))
    slack_low = _value(draw, DeadlineConfig, "slack_low")
    deadline = {"slack_low": slack_low,
                "slack_high": _value(draw, DeadlineConfig, "slack_high", lo=slack_low),
                "min_slack": _value(draw, DeadlineConfig, "min_slack")}
    if kind is TraceReplayConfig:
        clip = draw(st.none() | st.integers(1, 10**9))
        return {"sim": sim, "workload": {
            "kind": "trace", "path": trace_path, "deadline": deadline,
            "time_scale": _value(draw, kind, "time_scale"), "max_duration_ticks": clip}}
    # arrivals that fit the limit: the upper end of rate's accepted range for this episode
    rate_hi = max(limits["max_episode_jobs"] / ticks / 2, 1e-6)
    workload = {"kind": kind.model_fields["kind"].default,
                "rate": _value(draw, kind, "rate", hi=rate_hi),
                "load": draw(st.none() | st.sampled_from([1e-9, 2.0]) | st.floats(1e-9, 2.0)),
                "duration_mean": _value(draw, kind, "duration_mean"),
                "max_duration": _value(draw, kind, "max_duration"), "deadline": deadline}
    names = (["cpu_low", "mem_ratio_low", "duration_sigma"] if kind is PoissonConfig else
             ["cpu_median", "cpu_sigma", "mem_to_cpu_median", "mem_to_cpu_sigma",
              "duration_sigma", "diurnal_amplitude", "diurnal_period", "burst_factor",
              "burst_enter_prob", "burst_mean_length"])
    for name in names:
        workload[name] = _value(draw, kind, name)
    if kind is PoissonConfig:
        workload["cpu_high"] = _value(draw, kind, "cpu_high", lo=workload["cpu_low"])
        workload["mem_ratio_high"] = _value(draw, kind, "mem_ratio_high",
                                            lo=workload["mem_ratio_low"])
    return {"sim": sim, "workload": workload}


STEPS = 12


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), branching=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_accumulated_quantities_stay_finite_at_the_extremes_of_every_range(sample_trace, data,
                                                                           branching, seed):
    env = data.draw(extreme_envs(sample_trace), label="env")
    try:
        cfg = EnvConfig.model_validate(env)
    except ValidationError as err:  # only the work-size guard may refuse an in-range config
        message = str(err)
        assert err.error_count() == 1 and ("sim.limits." in message or  # too much work, or
                                           "set workload.max_duration_ticks" in message), message
        event("refused by the work-size guard")
        return
    event("simulated")
    cls = ClusterBranchingEnv if branching else ClusterSchedulingEnv
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        e = cls(cfg)
        obs, _ = e.reset(seed=seed)
        rng = np.random.default_rng(seed)
        total, ticks = 0.0, 0
        for _ in range(STEPS):
            if branching:
                action = e.action_space.sample()
            else:
                feasible = np.flatnonzero(e.action_mask)
                action = int(rng.choice(feasible)) if rng.random() < 0.9 else \
                    int(rng.integers(e.action_space.n))
            obs, reward, _, truncated, info = e.step(action)
            ticks += 1
            assert math.isfinite(reward)
            for key in ("r_energy", "r_sla", "r_toggle", "r_invalid", "energy_kwh"):
                assert math.isfinite(info[key]), (key, info)
            total += reward
            assert all(np.all(np.isfinite(v)) for v in obs.values())
            if truncated:
                break
    stats = e.sim.stats
    assert math.isfinite(total) and math.isfinite(stats.energy_j) and stats.energy_j >= 0
    jobs = len(e.sim.job_arrival)
    assert abs(total) <= cost_bound(cfg.sim, jobs, ticks) * (1 + 1e-9) + 1e-9
    peak = float(e.sim.fleet.p_max.sum()) * cfg.sim.tick_seconds * ticks
    assert stats.energy_j <= peak * (1 + 1e-9)
