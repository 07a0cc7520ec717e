"""The shield without Serve: breaker transitions, fallback reasons, feasibility, health."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import numpy as np
import pytest

from envs.env_config import EnvConfig
from serve_apps.runtime import PolicySpecError, ServedPolicy
from serve_apps.shield import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, Shield

ENV = EnvConfig.model_validate({"n_servers": 8, "workload": "poisson"})


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_threshold_half_opens_after_cooldown_and_closes_on_success():
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=10.0, clock=clock)
    for _ in range(2):
        breaker.record_failure()
        assert breaker.allow() and breaker.state == CLOSED
    breaker.record_failure()
    assert breaker.state == OPEN and not breaker.allow()
    clock.now = 9.9
    assert not breaker.allow()
    clock.now = 10.0
    assert breaker.allow() and breaker.state == HALF_OPEN
    breaker.record_failure()  # one failure while half-open re-opens at once
    assert breaker.state == OPEN and breaker.times_opened == 2
    clock.now = 25.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == CLOSED and breaker.consecutive_failures == 0


def _observations(policy: ServedPolicy, late: bool, n: int = 4) -> list[dict]:
    env = policy.env
    out = []
    for seed in range(n):
        env.reset(seed=seed)
        steps = 520 if late else 3
        for _ in range(steps):
            env.step(policy.fallback.act_batch([env._observe()])[0])
        out.append(env._observe())
    return out


@pytest.fixture(scope="module")
def late_obs():
    policy = ServedPolicy("heuristic:power_aware", "v0", ENV, "branching")
    return _observations(policy, late=True), _observations(policy, late=False)


@pytest.mark.parametrize(("fault", "reason"), [("raising", "error"), ("nan", "nan"),
                                               ("infeasible", "infeasible")])
def test_faulty_model_is_answered_by_the_fallback_with_feasible_actions(late_obs, fault, reason):
    late, early = late_obs
    policy = ServedPolicy(f"python:serve_apps.faults:{fault}", "v1", ENV, "branching")
    shield = Shield(policy, breaker=CircuitBreaker(failure_threshold=2, cooldown_s=1e9))
    outcomes = asyncio.run(shield.decide(early))
    assert all(o.by_model for o in outcomes)
    outcomes = asyncio.run(shield.decide(late))
    assert [o.reason for o in outcomes] == [reason] * len(late)
    for outcome, obs in zip(outcomes, late, strict=True):
        assert not outcome.by_model and policy.is_feasible(outcome.action, obs)
        assert np.array_equal(outcome.action, policy.fallback.act_batch([obs])[0])
    # a failed batch (infeasible actions included) counts on the breaker; 2 failures open it
    asyncio.run(shield.decide(late))
    assert shield.breaker.state == OPEN
    outcomes = asyncio.run(shield.decide(early))
    assert {o.reason for o in outcomes} == {"breaker_open"}
    report = shield.report()
    assert report["fallback"] == report["requests"] - report["model"]


def test_slow_model_times_out_to_the_fallback(late_obs):
    late, _ = late_obs
    policy = ServedPolicy("python:serve_apps.faults:slow", "v1", ENV, "branching")
    shield = Shield(policy, timeout_s=0.2)
    outcomes = asyncio.run(shield.decide(late[:1]))
    assert outcomes[0].reason == "timeout" and not outcomes[0].by_model


def test_masked_sub_actions_are_infeasible_and_the_mask_is_the_envs():
    policy = ServedPolicy("heuristic:ffd", "v1", ENV, "branching")
    obs = policy.probe_obs
    action = policy.model.act_batch([obs])[0]
    assert policy.is_feasible(action, obs)
    mask = obs["action_mask"] > 0
    blocked = int(np.flatnonzero(~mask[: ENV.sim.fleet.n_servers + 1])[0]) \
        if (~mask[: ENV.sim.fleet.n_servers + 1]).any() else None
    if blocked is not None:
        bad = np.array(action)
        bad[0] = blocked
        assert not policy.is_feasible(bad, obs)
    assert not policy.is_feasible(np.append(action, 0), obs)
    assert not policy.is_feasible(np.asarray(action, dtype=float), obs)


def test_health_probe_says_what_is_wrong_and_times_out():
    good = Shield(ServedPolicy("heuristic:power_aware", "v1", ENV, "flat"))
    bad = Shield(ServedPolicy("python:serve_apps.faults:broken", "v2", ENV, "flat"))
    assert asyncio.run(good.probe(5.0)) is None
    assert asyncio.run(bad.probe(5.0)) == "RuntimeError: injected model failure"
    hung = Shield(ServedPolicy("heuristic:power_aware", "v3", ENV, "flat"))
    hung._pool.submit(time.sleep, 1.0)  # the model thread is busy past the probe's limit
    assert "within 0.2 s" in asyncio.run(hung.probe(0.2))


@pytest.mark.parametrize(("spec", "says"), [
    ("heuristic:nope", "nope"), ("python:no.such.module:f", "cannot import"),
    ("/no/such/dir", "not a checkpoint"), ("something-else", "heuristic:NAME"),
    ("python:math:sqrt", "failed: TypeError"), ("python:math:pi", "not callable"),
    ("python:builtins:slice", "neither act_batch")])
def test_bad_policy_spec_is_a_clear_error(spec, says):
    with pytest.raises(PolicySpecError, match=says):
        ServedPolicy(spec, "v1", ENV, "flat")


@pytest.mark.parametrize(("fault", "error"), [("broken", "RuntimeError: injected"),
                                              ("raising", None), ("nan", None)])
def test_smoke_test_catches_models_that_fail_on_early_states(fault, error):
    shield = Shield(ServedPolicy(f"python:serve_apps.faults:{fault}", "v2", ENV, "branching"))
    result = shield.smoke_test(timeout_s=5.0)  # drills that fail late in the horizon pass
    assert result is None if error is None else result.startswith(error)


def _rollout(db, canary_spec: str):
    import json

    from serve_apps.rollout import SCHEMA, Rollout
    conn = sqlite3.connect(db)
    conn.execute(SCHEMA)
    conn.execute("INSERT INTO rollout (id, state) VALUES (1, ?)", (json.dumps({
        "configured_policy": "heuristic:power_aware", "next": 3,
        "stable": {"version": "v1", "spec": "heuristic:power_aware"},
        "canary": {"version": "v2", "spec": canary_spec}, "weight": 0.5}),))
    conn.commit()
    conn.close()
    return Rollout("heuristic:power_aware", ENV, "branching", db_path=db)


def test_persisted_canary_is_loaded_only_if_it_passes_its_smoke_test(tmp_path):
    good = _rollout(tmp_path / "good.db", "heuristic:ffd")
    assert good.canary is not None and good.canary.policy.name == "ffd"
    bad = _rollout(tmp_path / "bad.db", "python:serve_apps.faults:broken")
    assert bad.canary is None and bad.state["weight"] == 0.0
    assert _rollout_state(tmp_path / "bad.db")["canary"] is None  # the drop is persisted
    with pytest.raises(PolicySpecError, match="smoke test"):
        bad.start_canary("python:serve_apps.faults:broken", 0.5)
    assert bad.state["next"] == 3 and _rollout_state(tmp_path / "bad.db")["canary"] is None


def _rollout_state(db) -> dict:
    import json
    conn = sqlite3.connect(db)
    try:
        return json.loads(conn.execute("SELECT state FROM rollout").fetchone()[0])
    finally:
        conn.close()
