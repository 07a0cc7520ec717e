"""Serving a scenario: ``POST /v1/scenario/decide`` over real HTTP on a small Serve app.

The service takes the signals, forecasts, load, fleet by power state and held batch pool
of a scenario state, answers the configured controller's controls (the same numbers as
the controller in process on the same ``PlanView``), never answers an infeasible control
(clamped; the signal-aware rule, then a safe constant, when the controller raises,
hangs or returns NaN) and answers hostile states with a 4xx naming the field.
"""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudrl.cli import main
from cloudrl.heuristics.signal_aware import SignalAwareDeferral
from cloudrl.mpc.forecast_mpc import ForecastMPC
from envs.scenario.catalog import load_scenario
from envs.scenario.control import plan_view
from envs.scenario.sim import ScenarioSim
from serve_apps import scenario_faults as faults
from serve_apps.scenario_config import ScenarioServing
from serve_apps.scenario_schemas import MAX_FORECAST, MAX_POOL, MAX_PRICE, ScenarioState
from serve_apps.scenario_service import ScenarioService
from serve_apps.scenario_state import state_of, view_of
from tests.support import free_port
from tests.test_serve import Client, _deploy

SCENARIO = "tiny"
TOKEN = "scenario-token-1234"
PORTS = range(18400, 18500)


def _port() -> int:
    return free_port(PORTS)


def _config(db: str, policy: str = "mpc", timeout_s: float = 2.0) -> dict:
    return {"policy": "heuristic:power_aware", "env": {"n_servers": 8, "workload": "poisson"},
            "state_db": db, "auth_token": TOKEN, "decide_requires_token": True,
            "num_cpus": 0.0, "max_body_bytes": 400_000,
            "scenario": {"name": SCENARIO, "policy": policy, "decide_timeout_s": timeout_s}}


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    from ray import serve

    db = str(tmp_path_factory.mktemp("serve_scenario") / "state.db")
    port = _port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _deploy(_config(db))
    yield Client(port), db
    serve.shutdown()


def _sim_at(seed: int, ticks: int) -> ScenarioSim:
    """The tiny scenario ``ticks`` into episode ``seed`` under the signal-aware rule."""
    sim = ScenarioSim(load_scenario(SCENARIO))
    sim.reset(seed)
    rule = SignalAwareDeferral()
    rule.reset(sim)
    for _ in range(ticks):
        if sim.t % sim.cfg.decision_ticks == 0:
            sim.set_controls(*rule.decide(sim))
        sim.tick()
    return sim


def _post(client: Client, body: object, token: str | None = TOKEN, raw: bytes | None = None
          ) -> tuple[int, dict]:
    return client.call("POST", "/v1/scenario/decide", body, token=token, raw=raw)


def _feasible(out: dict, fleet: float, max_release: float = 2.0) -> bool:
    return (0.0 <= out["release_util"] <= max_release and 0.0 <= out["ready_cores"] <= fleet
            and math.isfinite(out["release_util"]) and math.isfinite(out["ready_cores"]))


# ------------------------------------------------------------------ in process, no Ray
def test_request_round_trips_to_the_controllers_plan_view():
    sim = _sim_at(3, 47)
    state = ScenarioState.model_validate_json(json.dumps(state_of(sim)))
    got, want = view_of(state, sim), plan_view(sim)
    assert len(want.pool_cores) > 0  # the pool is exercised, not empty
    for name in want.__dataclass_fields__:
        assert np.array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name))), \
            name


@settings(max_examples=40, deadline=None)
@given(price=st.floats(-20_000, 20_000), carbon=st.floats(0, 5000),
       fault=st.sampled_from([faults.RAISE_PRICE, faults.NAN_PRICE, faults.WILD_PRICE, None]),
       tick=st.integers(0, 10**6))
def test_the_shield_never_answers_an_infeasible_control(price, carbon, fault, tick):
    service = _shielded()
    body = {**_BODY, "price_now": price if fault is None else fault, "carbon_now": carbon,
            "tick": tick}
    out = asyncio.run(service.decide(ScenarioState.model_validate(body)))
    assert _feasible(out.model_dump(), service.sim.fleet_cores)
    if fault in (faults.RAISE_PRICE, faults.NAN_PRICE):
        assert out.fallback and out.policy == "signal_aware" and out.reason
    if fault == faults.WILD_PRICE:  # 50 and -3 or 10x the fleet: clamped to the bounds
        assert not out.fallback and "clamped" in out.reason
        assert out.release_util == 2.0 and out.ready_cores in (0.0, service.sim.fleet_cores)


def test_a_failing_fallback_answers_the_safe_constant():
    service = _shielded()
    service.fallback = faults.Raising()
    body = {**_BODY, "price_now": faults.RAISE_PRICE}
    out = asyncio.run(service.decide(ScenarioState.model_validate(body)))
    assert out.fallback and out.policy == "safe_constant" and "fallback failed" in out.reason
    assert (out.release_util, out.ready_cores) == (0.0, service.sim.fleet_cores)


def test_a_larger_fleet_is_served_as_the_rule_decides_on_it():
    """``scenario.n_servers`` (``cloudrl serve --scenario NAME --n-servers N``) serves the
    scenario on another fleet: its info, its example and its answers are that fleet's."""
    from cloudrl.cli import build_parser
    from cloudrl.serve_cli import service_config

    base = load_scenario(SCENARIO).fleet.n_servers
    big = load_scenario(SCENARIO, n_servers=4 * base)
    assert big == load_scenario(SCENARIO, {"fleet": {"n_servers": 4 * base}})
    service = ScenarioService(ScenarioServing(name=SCENARIO, policy="signal_aware",
                                              n_servers=4 * base))
    sim = ScenarioSim(big)
    sim.reset(2)
    assert service.sim.fleet_cores == sim.fleet_cores > ScenarioSim(load_scenario(SCENARIO)
                                                                    ).fleet_cores
    assert service.info()["fleet_cores"] == sim.fleet_cores
    rule = SignalAwareDeferral()
    rule.reset(sim)
    for _ in range(3 * big.decision_ticks):
        if sim.t % big.decision_ticks == 0:
            out = asyncio.run(service.decide(ScenarioState.model_validate(state_of(sim))))
            want = rule.decide_view(plan_view(sim))
            assert not out.fallback and (out.release_util, out.ready_cores) == \
                pytest.approx(want, rel=1e-9, abs=1e-12)
            sim.set_controls(*want)
        sim.tick()
    parser = build_parser()
    cfg = service_config(parser.parse_args(["serve", "--scenario", SCENARIO,
                                            "--n-servers", str(4 * base)]))
    assert cfg.scenario.n_servers == 4 * base and cfg.env.sim.fleet.n_servers != 4 * base
    with pytest.raises(ValueError, match="n_servers"):
        ScenarioServing(name=SCENARIO, n_servers=5000)


_SHIELDED: list[ScenarioService] = []
_BODY = state_of(_sim_at(3, 47))  # with held batch jobs in its pool


def _shielded() -> ScenarioService:
    if not _SHIELDED:
        _SHIELDED.append(ScenarioService(ScenarioServing(
            name=SCENARIO, policy="python:serve_apps.scenario_faults:by_price")))
    return _SHIELDED[0]


@pytest.mark.parametrize(("argv", "words"), [
    (["--scenario", "no_such"], "unknown scenario 'no_such'; valid: carbon_shift"),
    (["--scenario", SCENARIO, "--scenario-policy", "greedy"], "scenario.policy"),
    (["--scenario", SCENARIO, "--scenario-policy", "python:serve_apps.scenario_faults:raising"],
     "injected controller failure"),
])
def test_serve_refuses_a_bad_scenario_or_controller_in_one_line(capsys, argv, words):
    assert main(["serve", *argv, "--port", "18499"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("how", ["learned", "learned:", "detected"])
def test_serve_refuses_a_learned_checkpoint_of_another_scenario(capsys, how):
    """The committed scarcity_spikes checkpoint asked to serve tiny: one line, exit 2,
    however the checkpoint is named (the full matrix: tests/test_serve_scenario_learned.py)."""
    ckpt = "checkpoints/scarcity_spikes"
    argv = {"learned": ["--scenario-policy", "learned", "--checkpoint", ckpt],
            "learned:": ["--scenario-policy", f"learned:{ckpt}"],
            "detected": ["--checkpoint", ckpt]}[how]
    assert main(["serve", "--scenario", SCENARIO, *argv, "--port", "18499"]) == 2
    err = capsys.readouterr().err
    assert "trained on scenario 'scarcity_spikes', not 'tiny'" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ over HTTP
@pytest.mark.parametrize(("seed", "ticks"), [(0, 0), (2, 63), (5, 151)])
def test_valid_state_answers_the_controllers_own_controls(service, seed, ticks):
    client, _ = service
    sim = _sim_at(seed, ticks)
    status, out = _post(client, state_of(sim))
    assert status == 200, out
    mpc = ForecastMPC()
    mpc.reset(sim)
    release, ready = mpc.decide_view(plan_view(sim))
    assert out["policy"] == "mpc" and out["fallback"] is False and out["reason"] is None
    assert out["release_util"] == pytest.approx(release, rel=1e-9, abs=1e-12)
    assert out["ready_cores"] == pytest.approx(ready, rel=1e-9, abs=1e-12)
    assert _feasible(out, sim.fleet_cores) and out["decide_ms"] > 0


def test_scenario_info_publishes_what_a_client_needs(service):
    client, _ = service
    status, info = client.call("GET", "/v1/scenario")
    sim = ScenarioSim(load_scenario(SCENARIO))
    assert status == 200
    assert (info["horizon_ticks"], info["fleet_cores"], info["decision_ticks"]) == (
        sim.horizon_ticks, sim.fleet_cores, sim.cfg.decision_ticks)
    status, out = _post(client, info["example"])
    assert status == 200 and _feasible(out, sim.fleet_cores), out
    schema = client.call("GET", "/openapi.json")[1]
    body = schema["paths"]["/v1/scenario/decide"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("ScenarioState")
    published = schema["components"]["schemas"]["ScenarioState"]
    assert published["properties"]["carbon_now"]["minimum"] == 0
    price_fc = published["properties"]["price_fc"]
    assert (price_fc["minItems"], price_fc["maxItems"]) == (sim.cfg.decision_ticks,
                                                            sim.horizon_ticks)
    assert price_fc["items"]["minimum"] == -MAX_PRICE
    assert ScenarioState.model_validate(published["example"]).tick == 0


def test_no_token_is_401_before_the_body_is_read(service):
    client, _ = service
    for body in (_BODY, {"tick": "nonsense"}):
        status, out = _post(client, body, token=None)
        assert status == 401 and out["errors"][0]["field"] == "authorization", out
    assert _post(client, _BODY, token="wrong-token-12345")[0] == 401


def _mutations(horizon: int) -> st.SearchStrategy:
    n = len(_BODY["price_fc"])
    return st.sampled_from([
        ("carbon_now", lambda b: {**b, "carbon_now": -1.0}),
        ("solar_fc_kw[3]", lambda b: {**b, "solar_fc_kw": b["solar_fc_kw"][:3] + [-0.5]
                                      + b["solar_fc_kw"][4:]}),
        ("price_now", lambda b: {**b, "price_now": 1e9}),
        ("price_fc", lambda b: {**b, **{k: [1.0] * (horizon + 1) for k in (
            "price_fc", "carbon_fc", "solar_fc_kw")}, "load_fc": {
            "latency_critical": [1.0] * (horizon + 1), "batch": [1.0] * (horizon + 1)},
            "running": {"latency_critical": [1.0] * (horizon + 1),
                        "batch": [1.0] * (horizon + 1)}}),
        ("price_fc", lambda b: {**b, "price_fc": [1.0] * (MAX_FORECAST + 1)}),
        ("carbon_fc", lambda b: {**b, "carbon_fc": b["carbon_fc"][:n - 1]}),
        ("load_fc.batch", lambda b: {**b, "load_fc": {**b["load_fc"], "batch": [0.0]}}),
        ("pool.cores", lambda b: {**b, "pool": {"cores": [1.0] * (MAX_POOL + 1),
                                                "duration_ticks": [1], "latest_start_tick": [1]}}),
        ("pool.latest_start_tick", lambda b: {**b, "pool": {**b["pool"], "latest_start_tick":
                                                           b["pool"]["latest_start_tick"][1:]}}),
        ("fleet", lambda b: {**b, "fleet": {**b["fleet"], "active": b["fleet"]["active"] + 8}}),
        ("fleet.active", lambda b: {**b, "fleet": {**b["fleet"], "active": "all"}}),
        ("tick", lambda b: {**b, "tick": 1.5}),
        ("no_such", lambda b: {**b, "no_such": 1}),
        ("queued", lambda b: {**b, "queued": [1, 2]}),
        ("price_fc", lambda b: {**b, "price_fc": []}),
    ])


NAN_FIELDS = ("price_now", "carbon_now", "solar_now_kw")


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=st.data())
def test_hostile_states_answer_4xx_naming_the_field(service, case):
    client, _ = service
    horizon = ScenarioSim(load_scenario(SCENARIO)).horizon_ticks
    if case.draw(st.booleans(), label="nan"):
        field = case.draw(st.sampled_from(NAN_FIELDS), label="field")
        value = case.draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]), label="value")
        raw = json.dumps({**_BODY, field: 12345.678}).replace("12345.678", value).encode()
        status, out = _post(client, None, raw=raw)
    else:
        field, mutate = case.draw(_mutations(horizon), label="mutation")
        status, out = _post(client, mutate(_BODY))
    assert 400 <= status < 500, (field, status, out)
    if status == 422:
        assert out["errors"][0]["field"].startswith(field.split("[")[0]), (field, out)
    else:  # the largest arrays pass the body limit
        assert status == 413 and out["errors"][0]["field"] == "body"


ARRAYS = ("price_fc", "carbon_fc", "solar_fc_kw", "load_fc.batch", "running.latency_critical")


def test_random_states_are_decided_feasibly_or_refused_with_4xx(service):
    """Random ticks, horizons, decision periods, signal values and array contents: every
    answer is a feasible decision or a 422 naming a field; both occur."""
    client, _ = service
    fleet = ScenarioSim(load_scenario(SCENARIO)).fleet_cores
    statuses: dict[int, int] = {}
    maybe = st.one_of(st.none(), st.integers(-1, 10**9 + 5))

    @settings(max_examples=50, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(tick=st.integers(-1, 10**9 + 5), ticks_left=maybe,
           decision=st.one_of(st.none(), st.integers(0, 130)),
           scalar=st.sampled_from(["price_now", "carbon_now", "solar_now_kw"]),
           value=st.floats(-3e4, 3e4), array=st.sampled_from(ARRAYS),
           length=st.sampled_from([None, None, 0, 4, 119, 121, 1000]),
           fill=st.floats(-1.0, 3e4))
    def fuzz(tick, ticks_left, decision, scalar, value, array, length, fill) -> None:
        body = json.loads(json.dumps(_BODY))
        body.update({"tick": tick, "ticks_left": ticks_left, "decision_ticks": decision,
                     scalar: value})
        head, _, tail = array.partition(".")
        if length is not None:
            if tail:
                body[head][tail] = [fill] * length
            else:
                body[head] = [fill] * length
        status, out = _post(client, body)
        statuses[status] = statuses.get(status, 0) + 1
        assert status in (200, 422), (status, out)
        if status == 200:
            assert _feasible(out, fleet), out
        else:
            assert out["errors"][0]["field"] != "body", out

    fuzz()
    assert statuses.get(200, 0) > 0 and statuses.get(422, 0) > 0, statuses


def test_a_failing_controller_is_answered_by_the_fallback(service):
    client, db = service
    _deploy(_config(db, "python:serve_apps.scenario_faults:by_price", timeout_s=0.5))
    sim = _sim_at(4, 90)
    body = state_of(sim)
    rule = SignalAwareDeferral()
    rule.reset(sim)
    for price, why in ((faults.RAISE_PRICE, "injected controller failure"),
                       (faults.NAN_PRICE, "non-finite"), (faults.SLOW_PRICE, "timeout")):
        status, out = _post(client, {**body, "price_now": price})
        assert status == 200, out
        assert out["fallback"] is True and out["policy"] == "signal_aware" and why in \
            out["reason"], out
        view = view_of(ScenarioState.model_validate({**body, "price_now": price}), sim)
        want = rule.decide_view(view)
        assert (out["release_util"], out["ready_cores"]) == pytest.approx(want, rel=1e-9)
        assert _feasible(out, sim.fleet_cores)
    status, out = _post(client, {**body, "price_now": faults.WILD_PRICE})
    assert status == 200 and out["fallback"] is False and "clamped" in out["reason"], out
    assert _feasible(out, sim.fleet_cores) and out["release_util"] == 2.0
    status, info = client.call("GET", "/v1/scenario")
    assert info["counters"]["fallbacks"] == 3 and info["counters"]["clamped"] == 1, info
