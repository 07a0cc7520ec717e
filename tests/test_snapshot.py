"""Snapshots: an observed state loaded into a fresh env gives the env's own observation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudrl.heuristics import make_heuristic
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from serve_apps.schemas import ClusterState
from serve_apps.state import StateError, state_of, to_snapshot

ENVS = {"flat": ClusterSchedulingEnv, "branching": ClusterBranchingEnv}


def _run(interface: str, workload: str, seed: int, steps: int):
    env = ENVS[interface]({"n_servers": 12, "workload": workload})
    policy = make_heuristic("power_aware", interface)
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        obs, *_ = env.step(policy.act(obs))
    return env, obs


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interface=st.sampled_from(["flat", "branching"]),
       workload=st.sampled_from(["poisson", "google_v2_like"]),
       seed=st.integers(0, 10_000), steps=st.integers(0, 120))
def test_snapshot_and_json_state_reproduce_the_env_observation(interface, workload, seed, steps):
    env, obs = _run(interface, workload, seed, steps)
    fresh = ENVS[interface]({"n_servers": 12, "workload": workload})
    direct = fresh.observe_snapshot(env.sim.snapshot())
    for key in obs:
        np.testing.assert_array_equal(direct[key], obs[key], err_msg=key)
    # through the service's JSON body: units converted to cores/GiB and back
    body = ClusterState.model_validate(json.loads(json.dumps(state_of(env.sim))))
    via_json = fresh.observe_snapshot(to_snapshot(body, fresh.sim.fleet, fresh.config.sim))
    for key in obs:
        np.testing.assert_allclose(via_json[key], obs[key], rtol=1e-6, atol=1e-6, err_msg=key)
    np.testing.assert_array_equal(via_json["action_mask"], obs["action_mask"])


def test_loaded_state_is_replaced_by_reset():
    env, _ = _run("flat", "poisson", 1, 30)
    fresh = ClusterSchedulingEnv({"n_servers": 12, "workload": "poisson"})
    reference, _ = fresh.reset(seed=5)
    fresh.observe_snapshot(env.sim.snapshot())
    again, _ = fresh.reset(seed=5)
    for key in reference:
        np.testing.assert_array_equal(again[key], reference[key])


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda b: b["servers"].pop(), "servers"),
    (lambda b: b["servers"][2].update(tier="no-such-tier"), "servers[2].tier"),
    (lambda b: b["servers"][0].update(used_cpu_cores=1e6, n_running=1),
     "servers[0].used_cpu_cores"),
    (lambda b: b.update(jobs=[{"cpu_cores": 1, "mem_gib": 1, "duration": 5, "deadline": 9}] * 65),
     "jobs"),
    (lambda b: b.update(priority_level=4), "priority_level"),  # 4 levels: 0-3
])
def test_state_that_does_not_fit_the_fleet_names_the_field(mutate, field):
    env, _ = _run("flat", "poisson", 2, 10)
    body = state_of(env.sim)
    mutate(body)
    with pytest.raises(StateError) as err:
        to_snapshot(ClusterState.model_validate(body), env.sim.fleet, env.config.sim)
    assert err.value.field == field


@pytest.mark.parametrize(("field", "value"), [
    ("tick", 10**9 + 1), ("job_deadline", np.array([2**62], dtype=np.int64)),
    ("job_age", np.array([-1], dtype=np.int64)), ("wake_left", None),
    ("n_running", None), ("clock_offset", -(10**9) - 1)])
def test_snapshot_out_of_range_is_refused_before_it_can_wrap(field, value):
    env, _ = _run("flat", "poisson", 3, 5)
    snap = env.sim.snapshot()
    if value is None:  # a per-server array with one absurd entry
        value = getattr(snap, field).copy()
        value[0] = 2**63 - 1
    if field.startswith("job_") and len(snap.job_age) == 0:
        pytest.skip("no pending job")
    if field.startswith("job_"):
        value = np.resize(value, len(snap.job_age))
    setattr(snap, field, value)
    fresh = ClusterSchedulingEnv({"n_servers": 12, "workload": "poisson"})
    with pytest.raises(ValueError, match=f"snapshot.{field}"):
        fresh.observe_snapshot(snap)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tick=st.integers(0, 10**9), rate=st.floats(0, 10_000), violations=st.floats(0, 10_000),
       deadline=st.integers(1, 10**9), age=st.integers(0, 10**9),
       duration=st.integers(1, 10**9), wake=st.integers(1, 10**9))
def test_any_state_inside_the_documented_ranges_gives_a_finite_observation(
        tick, rate, violations, deadline, age, duration, wake):
    env, _ = _run("branching", "poisson", 4, 10)
    body = state_of(env.sim)
    body.update(tick=tick, time_of_day_tick=tick, arrival_rate=rate, violation_rate=violations,
                jobs=[{"cpu_cores": 1.0, "mem_gib": 1.0, "duration": duration,
                       "deadline": deadline, "age": age}])
    body["servers"][0].update(power_state="waking", wake_left=wake, n_running=0,
                              used_cpu_cores=0.0, used_mem_gib=0.0)
    fresh = ClusterBranchingEnv({"n_servers": 12, "workload": "poisson"})
    obs = fresh.observe_snapshot(to_snapshot(ClusterState.model_validate(body), fresh.sim.fleet,
                                             fresh.config.sim))
    for key, value in obs.items():
        assert np.isfinite(value).all(), key
