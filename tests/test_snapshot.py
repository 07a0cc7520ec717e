"""Snapshots: an observed state loaded into a fresh env gives the env's own observation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudrl.heuristics import make_heuristic
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from envs.snapshot import snapshot_of
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
    direct = fresh.observe_snapshot(snapshot_of(env.sim))
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
    fresh.observe_snapshot(snapshot_of(env.sim))
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
    (lambda b: b.update(priority_level=99), "priority_level"),
])
def test_state_that_does_not_fit_the_fleet_names_the_field(mutate, field):
    env, _ = _run("flat", "poisson", 2, 10)
    body = state_of(env.sim)
    mutate(body)
    with pytest.raises(StateError) as err:
        to_snapshot(ClusterState.model_validate(body), env.sim.fleet, env.config.sim)
    assert err.value.field == field
