"""The automatic rollout controller: in process (breaker, promotion, pause, thresholds) and
over HTTP (token, bad bodies change nothing, ``cloudrl loop rollout`` exit codes)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from envs.env_config import EnvConfig
from serve_apps.rollout import Rollout
from serve_apps.rollout_controller import RolloutController, VersionSignals, sla_risk
from serve_apps.runtime import PolicySpecError, ServedPolicy
from serve_apps.schemas import AutoPlan, PendingJob
from serve_apps.shield import Outcome

ENV = EnvConfig.model_validate({"n_servers": 8, "workload": "poisson"})


def _observations(late: bool, n: int = 3) -> list[dict]:
    """States of the first (``late=False``) or second half of the horizon: the fault
    policies misbehave only on the latter."""
    policy = ServedPolicy("heuristic:power_aware", "v0", ENV, "branching")
    env, out = policy.env, []
    for seed in range(n):
        env.reset(seed=seed)
        for _ in range(520 if late else 3):
            env.step(policy.fallback.act_batch([env._observe()])[0])
        out.append(env._observe())
    return out


@pytest.fixture(scope="module")
def states():
    return _observations(late=False), _observations(late=True)


class Harness:
    """A rollout and its controller driven like the service drives them."""

    def __init__(self, db, failure_threshold: int = 3, seed: int = 0, timeout_s: float = 1.0,
                 max_timeouts: int = 3) -> None:
        from serve_apps.rollout import ShieldSettings

        self.rollout = Rollout("heuristic:power_aware", ENV, "branching", db_path=db,
                               seed=seed, shield=ShieldSettings(timeout_s=timeout_s,
                                                                failure_threshold=failure_threshold,
                                                                cooldown_s=1e9))
        self.controller = RolloutController(self.rollout, max_timeouts)
        self.answers: list[tuple[str, Outcome, dict]] = []

    def decide(self, obs: dict, latency_ms: float = 1.0, risk: float = 0.0) -> str | None:
        shield = self.rollout.route()
        outcome = asyncio.run(shield.decide([obs]))[0]
        self.answers.append((shield.policy.version, outcome, obs))
        return self.controller.observe(shield, outcome, latency_ms, risk)


@pytest.mark.parametrize(("fault", "window", "says"), [
    ("raising", 3, "circuit breaker opened"),  # failure_threshold failed batches
    ("nan", 3, "circuit breaker opened"),
    ("infeasible", 1, "1 infeasible actions attempted")])
def test_failing_canary_is_rolled_back_within_the_window(tmp_path, states, fault, window,
                                                         says):
    early, late = states
    h = Harness(tmp_path / "s.db", failure_threshold=3)
    plan = AutoPlan(promote_after=1000, min_decisions=1000)  # only the immediate signals
    version = h.controller.start(f"python:serve_apps.faults:{fault}", 1.0, plan)
    for obs in early * 3:  # the fault is planted in the second half of the horizon
        assert h.decide(obs) is None
    events = [h.decide(late[i % len(late)]) for i in range(window)]
    assert events == [None] * (window - 1) + ["rolled_back"]
    assert h.rollout.canary is None and h.rollout.stable.policy.version == "v1"
    for v, outcome, obs in h.answers:  # nothing infeasible was served meanwhile
        assert h.rollout.stable.policy.is_feasible(outcome.action, obs), (v, outcome)
    last = h.rollout.history()[-1]
    assert last["event"] == "rolled_back" and last["version"] == version
    assert last["reason"].startswith("automatic: ") and says in last["reason"]
    again = Rollout("heuristic:power_aware", ENV, "branching", db_path=tmp_path / "s.db")
    assert again.canary is None and again.history()[-1] == last  # persisted with its reason
    assert h.decide(late[0]) is None and h.answers[-1][0] == "v1"  # stable serves on


@pytest.mark.parametrize("auto", [False, True], ids=["by hand", "automatic plan"])
def test_hanging_canary_is_rolled_back_at_its_nth_timeout(tmp_path, states, auto):
    """``faults:slow`` sleeps past the decision deadline on late states. With or without an
    automatic plan, its 2nd timed-out decision (``max_timeouts`` 2, below the breaker's 5)
    rolls it back; decisions it answered in time never count."""
    early, late = states
    h = Harness(tmp_path / "s.db", failure_threshold=5, timeout_s=0.5, max_timeouts=2)
    plan = AutoPlan(promote_after=1000, min_decisions=1000) if auto else None
    version = h.controller.start("python:serve_apps.faults:slow", 1.0, plan)
    assert [h.decide(obs) for obs in early * 2] == [None] * 6  # answered in time
    assert [h.decide(late[i]) for i in range(2)] == [None, "rolled_back"]
    assert [o.reason for _, o, _ in h.answers[-2:]] == ["timeout", "timeout"]
    assert h.rollout.canary is None
    last = h.rollout.history()[-1]
    assert last["event"] == "rolled_back" and last["version"] == version
    assert last["reason"] == ("automatic: 2 decisions timed out (no answer from the model "
                              "within 0.5 s; canary_rollback_timeouts 2)")
    assert h.decide(late[2]) is None and h.answers[-1][0] == "v1"  # stable serves on


def test_timeouts_never_roll_back_when_the_limit_is_0(tmp_path, states):
    _, late = states
    h = Harness(tmp_path / "s.db", failure_threshold=100, timeout_s=0.5, max_timeouts=0)
    h.controller.start("python:serve_apps.faults:slow", 1.0, None)
    assert [h.decide(late[i % 3]) for i in range(4)] == [None] * 4
    assert h.rollout.canary is not None and h.rollout.canary.counters["fallback_timeout"] == 4


def test_infeasible_later_fails_on_early_states_too(tmp_path, states):
    """The soak's planted canary: after its smoke test it proposes forbidden actions on any
    tick, so its rollback does not depend on where the clusters are in their episodes (the
    tick-dependent ``infeasible`` fault passed a whole 1,000-decision canary window)."""
    from serve_apps.faults import GOOD_CALLS

    early, _ = states
    h = Harness(tmp_path / "s.db", failure_threshold=3)
    plan = AutoPlan(promote_after=1000, min_decisions=1000)
    h.controller.start("python:serve_apps.faults:infeasible_later", 1.0, plan)
    events = [h.decide(early[i % len(early)]) for i in range(GOOD_CALLS + 1)]
    assert "rolled_back" in events, events
    assert h.rollout.canary is None and h.rollout.stable.policy.version == "v1"
    for v, outcome, obs in h.answers:
        assert h.rollout.stable.policy.is_feasible(outcome.action, obs), (v, outcome)


def test_good_canary_is_promoted_after_n_canary_decisions(tmp_path, states):
    early, late = states
    h = Harness(tmp_path / "s.db", seed=3)
    version = h.controller.start("heuristic:ffd", 0.5, AutoPlan(promote_after=20,
                                                                 min_decisions=10))
    events = []
    while not events or events[-1] is None:
        events.append(h.decide((early + late)[len(events) % 6]))
    canary_decisions = sum(1 for v, *_ in h.answers if v == version)
    assert events[-1] == "promoted" and canary_decisions == 20
    assert len(events) > 25  # the stable version's decisions did not count
    assert h.rollout.stable.policy.version == version and h.rollout.canary is None
    assert [e["event"] for e in h.rollout.history()] == ["canary_started", "promoted"]
    assert h.rollout.history()[-1]["reason"].startswith("automatic: 20 canary decisions")


def test_pause_stops_the_clock_and_resume_restarts_it(tmp_path, states):
    early, _ = states
    h = Harness(tmp_path / "s.db")
    with pytest.raises(PolicySpecError, match="no automatic canary"):
        h.controller.pause()
    h.controller.start("heuristic:ffd", 1.0, AutoPlan(promote_after=10, min_decisions=5))
    assert [h.decide(early[0]) for _ in range(6)] == [None] * 6
    h.controller.pause("looking at the dashboards")
    with pytest.raises(PolicySpecError, match="already paused"):
        h.controller.pause()
    assert [h.decide(early[1]) for _ in range(30)] == [None] * 30  # past promote_after
    assert h.controller.counted == 6
    other = RolloutController(Rollout("heuristic:power_aware", ENV, "branching",
                                      db_path=tmp_path / "s.db"))  # another replica
    assert other.report()["paused"] and other.report()["counted"] == 6
    h.controller.resume()
    assert [h.decide(early[2]) for _ in range(4)] == [None] * 3 + ["promoted"]
    events = [(e["event"], e["reason"]) for e in h.rollout.history()]
    assert events[1] == ("paused", "looking at the dashboards; 6 canary decisions counted")
    assert [e for e, _ in events] == ["canary_started", "paused", "resumed", "promoted"]


def test_paused_canary_is_still_rolled_back_when_its_breaker_opens(tmp_path, states):
    _, late = states
    h = Harness(tmp_path / "s.db", failure_threshold=2)
    h.controller.start("python:serve_apps.faults:raising", 1.0, AutoPlan(promote_after=1))
    h.controller.pause()
    assert [h.decide(late[0]) for _ in range(2)] == [None, "rolled_back"]


@pytest.mark.parametrize(("signal", "says"), [
    ("fallback", "fallback rate 0.200 > 0.1"), ("latency", "latency p95"),
    ("risk", "predicted SLA risk")])
def test_rate_latency_and_sla_risk_thresholds_roll_back_after_min_decisions(
        tmp_path, states, signal, says):
    early, _ = states
    h = Harness(tmp_path / "s.db")
    plan = AutoPlan(promote_after=1000, min_decisions=10, max_fallback_rate=0.1,
                    max_intervention_rate=1.0, max_latency_p95_ms=50.0, max_sla_risk_excess=0.1)
    h.controller.start("heuristic:ffd", 1.0, plan)
    canary = h.rollout.canary
    stable = h.rollout.stable
    assert h.controller.observe(stable, Outcome(0, True), 1.0, 0.05) is None  # baseline risk
    events = []
    for i in range(10):
        by_model = not (signal == "fallback" and i % 5 == 0)
        outcome = Outcome(0, by_model, None if by_model else "breaker_open")
        events.append(h.controller.observe(canary, outcome,
                                           400.0 if signal == "latency" else 1.0,
                                           0.5 if signal == "risk" else 0.05))
    assert events == [None] * 9 + ["rolled_back"]  # judged from min_decisions on
    assert says in h.rollout.history()[-1]["reason"]


def test_sla_risk_counts_deferred_jobs_at_their_last_chance():
    jobs = [PendingJob(cpu_cores=1.0, mem_gib=1.0, duration=d, deadline=dl)
            for d, dl in ((5, 5), (5, 9), (3, 3), (4, 2))]
    assert sla_risk(jobs, []) == 0.5  # jobs 0 and 2 must start now; job 3 is lost anyway
    assert sla_risk(jobs, [0]) == 0.25 and sla_risk(jobs, [0, 2]) == 0.0
    assert sla_risk([], []) == 0.0
    signals = VersionSignals()
    for latency in range(1, 101):
        signals.add(Outcome(0, True), float(latency), 0.0)
    assert signals.latency_p95() == pytest.approx(95.05)


# ---------------------------------------------------------------- over HTTP (Serve)
TOKEN = "rollout-token-1234"
N_SERVERS = 8


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from tests.test_serve import start_service

    def config(db: str) -> dict:
        return {"policy": "heuristic:power_aware", "interface": "branching",
                "env": {"n_servers": N_SERVERS, "workload": "poisson"}, "state_db": db,
                "auth_token": TOKEN, "failure_threshold": 2, "cooldown_s": 60.0,
                "num_cpus": 0.0}

    yield from start_service(tmp_path_factory.mktemp("rollout"), config)


def _bodies() -> tuple[dict, dict]:
    from serve_apps.state import state_of

    early, late = [], []
    for obs_list, steps in ((early, 3), (late, 520)):
        policy = ServedPolicy("heuristic:power_aware", "v0", ENV, "branching")
        policy.env.reset(seed=1)
        for _ in range(steps):
            policy.env.step(policy.fallback.act_batch([policy.env._observe()])[0])
        obs_list.append(state_of(policy.env.sim))
    return early[0], late[0]


@pytest.mark.slow  # Serve's start takes ~40 s on the loaded 2-core machine
@pytest.mark.usefixtures("ray_session")
def test_rollout_endpoint_needs_the_token_and_bad_bodies_change_nothing(service):
    client, _ = service
    before = client.call("GET", "/v1/rollout", token=TOKEN)
    assert before[0] == 200 and before[1]["history"] == []
    assert client.call("GET", "/v1/rollout")[0] == 401
    for body, token, status in [
            ({"action": "canary", "policy": "heuristic:ffd", "auto": {}}, None, 401),
            ({"action": "pause"}, "wrong-token-123", 401),
            ({"action": "pause"}, TOKEN, 422),  # no canary to pause
            ({"action": "freeze"}, TOKEN, 422),
            ({"action": "canary", "policy": "heuristic:ffd",
              "auto": {"promote_after": 0}}, TOKEN, 422),
            ({"action": "canary", "policy": "heuristic:ffd",
              "auto": {"max_fallback_rate": "high"}}, TOKEN, 422),
            ({"action": "canary", "policy": "heuristic:ffd", "auto": {"bogus": 1}}, TOKEN, 422),
            ({"action": "pause", "policy": "heuristic:ffd"}, TOKEN, 422),
            ({"action": "promote", "reason": ""}, TOKEN, 422),
            ({"action": "canary", "policy": "heuristic:nope", "auto": {}}, TOKEN, 422)]:
        code, out = client.call("POST", "/v1/rollout", body, token=token)
        assert code == status, (body, out)
        assert out["error"] and out["errors"][0]["field"], out
    assert client.call("GET", "/v1/rollout", token=TOKEN) == before  # nothing changed


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_cloudrl_loop_rollout_promotes_a_good_canary_and_rolls_back_a_bad_one(
        service, monkeypatch, capsys):
    from cloudrl.loop.rollout import main as rollout_main

    client, _ = service
    early, late = _bodies()
    stop = threading.Event()

    def traffic() -> None:  # live traffic while the command waits
        i = 0
        while not stop.is_set():
            code, out = client.call("POST", "/v1/decide", late if i % 2 else early)
            assert code == 200, out
            i += 1

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("CLOUDRL_SERVE_TOKEN", TOKEN)
        url = client.base
        assert rollout_main(["--url", url, "--policy", "heuristic:ffd", "--weight", "0.5",
                             "--promote-after", "20", "--min-decisions", "10",
                             "--timeout", "120"]) == 0
        out = capsys.readouterr().out
        assert "promoted" in out and "20 canary decisions" in out
        assert rollout_main(["--url", url, "--policy", "python:serve_apps.faults:infeasible",
                             "--weight", "0.5", "--promote-after", "1000",
                             "--timeout", "120"]) == 1
        assert "infeasible actions attempted" in capsys.readouterr().out
    finally:
        stop.set()
        thread.join(timeout=30)
    report = client.call("GET", "/v1/rollout", token=TOKEN)[1]
    assert report["canary"] is None and report["stable"]["policy"] == "ffd"
    assert [e["event"] for e in report["history"]][-4:] == [
        "canary_started", "promoted", "canary_started", "rolled_back"]
    assert rollout_main(["--url", client.base, "--policy", "heuristic:ffd",
                         "--weight", "2"]) == 2
    monkeypatch.delenv("CLOUDRL_SERVE_TOKEN")
    assert rollout_main(["--url", client.base, "--policy", "heuristic:ffd"]) == 2
    assert "CLOUDRL_SERVE_TOKEN" in capsys.readouterr().err
