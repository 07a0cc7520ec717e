"""Serving the distilled (learned) scenario policy: ``learned:DIR`` on ``/v1/scenario/decide``.

``ServedLearnedController.decide_view`` on the simulator's own ``ObservedView`` is
``LearnedController.decide(sim)`` bit for bit (observation, action, controls) on every
decision of an episode. The served path from a request body (``ScenarioState`` ->
``view_of`` -> ``observed_view_of`` -> ``decide_view``) takes the same action on every
decision, its controls equal up to the last bit (a request sends the simulator's
rounding-error negatives, -1e-17 cores, as 0). ``cloudrl serve`` serves the committed
``checkpoints/scarcity_spikes`` over real HTTP with the server-side decision time in
every answer; another scenario's, a missing or a broken checkpoint is one line and exit
2; hostile states stay 4xx.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.distill.policy import (
    ObservedView,
    load_controller,
    load_served_controller,
    observed_view,
    view_observation,
)
from cloudrl.cli import build_parser, main
from cloudrl.serve_cli import service_config
from envs.scenario.catalog import load_scenario
from envs.scenario.control import plan_view
from envs.scenario.env import observe
from envs.scenario.sim import ScenarioSim
from serve_apps.scenario_config import ScenarioServing
from serve_apps.scenario_schemas import MAX_FORECAST, MAX_POOL, ScenarioState
from serve_apps.scenario_service import ScenarioService
from serve_apps.scenario_state import observed_view_of, state_of, view_of
from serve_apps.state import StateError
from tests.support import served_episode
from tests.test_serve import Client, _deploy
from tests.test_serve_scenario import _port

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "scarcity_spikes"
CKPT = str(ROOT / "checkpoints" / SCENARIO)
POLICY = f"learned:{CKPT}"
TOKEN = "learned-token-12345"


def _request(sim: ScenarioSim) -> ScenarioState:
    """``sim``'s present as a client sends it: JSON text, parsed by the service's model."""
    return ScenarioState.model_validate_json(json.dumps(state_of(sim)))


_SERVICE: list[ScenarioService] = []


def _service() -> ScenarioService:
    if not _SERVICE:
        _SERVICE.append(ScenarioService(ScenarioServing(name=SCENARIO, policy=POLICY)))
    return _SERVICE[0]


def _sim_at(seed: int, decisions: int) -> ScenarioSim:
    """``sim`` after ``decisions`` decisions of the learned policy on episode ``seed``."""
    sim = ScenarioSim(load_scenario(SCENARIO))
    sim.reset(seed)
    ctrl = load_controller(CKPT)
    ctrl.reset(sim)
    while decisions > 0 or sim.t % sim.cfg.decision_ticks:
        if sim.t % sim.cfg.decision_ticks == 0:
            sim.set_controls(*ctrl.decide(sim))
            decisions -= 1
        sim.tick()
    return sim


def _feasible(out: dict, fleet: float) -> bool:
    return (0.0 <= out["release_util"] <= 2.0 and 0.0 <= out["ready_cores"] <= fleet
            and math.isfinite(out["release_util"]) and math.isfinite(out["ready_cores"]))


# ------------------------------------------------------------------ in process, no Ray
def test_the_served_path_decides_as_the_simulator_over_an_episode():
    """Every decision of one scarcity_spikes episode: the service's path from the request
    body gives the in-simulator controller's controls (==) from its observation (==)."""
    service = _service()
    sim = ScenarioSim(load_scenario(SCENARIO))
    sim.reset(101)
    in_sim = load_controller(CKPT)
    in_sim.reset(sim)

    def check(state, want, out) -> None:
        view = observed_view_of(view_of(state, service.sim), state)
        # equal but for the simulator's running sums a rounding error below 0
        # (-1e-17 queued cores), which a request sends as 0 (state_of)
        np.testing.assert_allclose(view_observation(service.sim, view),
                                   observe(sim, plan_view(sim)), rtol=0, atol=1e-12)
        assert not out.fallback and out.reason is None and out.policy == "learned"
        # the same action; its ready cores add the now-cores the request rounds up
        # from -1e-17 to 0, so they may differ in the last bit
        assert service.controller.greedy_action(view_observation(service.sim, view)) \
            == service.controller.greedy_action(observe(sim, plan_view(sim))), sim.t
        assert out.release_util == want[0], sim.t
        assert out.ready_cores == pytest.approx(want[1], rel=1e-12, abs=1e-9), sim.t
        assert out.decide_ms > 0 and out.controller_ms > 0

    assert served_episode(service, sim, in_sim.decide, check) == \
        sim.n_ticks // sim.cfg.decision_ticks
    info = service.info()
    assert info["requires_hour_of_week"] is True
    assert 0 < info["controller_ms_p50"] <= info["decide_ms_p50"] * 1.5


@pytest.mark.parametrize(("scenario", "seed"), [("tiny", 4), (SCENARIO, 102)])
def test_decide_view_is_decide_bit_for_bit_over_an_episode(scenario, seed):
    """From the simulator's own ObservedView: the same observation, action and controls
    (==) as the in-simulator controller on every decision of an episode."""
    served, in_sim = load_served_controller(CKPT), load_controller(CKPT)
    sim = ScenarioSim(load_scenario(scenario))
    sim.reset(seed)
    served.reset(ScenarioSim(load_scenario(scenario)))  # static parts only
    in_sim.reset(sim)
    n = 0
    while not sim.done:
        if sim.t % sim.cfg.decision_ticks == 0:
            v = observed_view(sim)
            assert np.array_equal(view_observation(served._static, v),
                                  observe(sim, plan_view(sim))), sim.t
            want = in_sim.decide(sim)
            assert served.decide_view(v) == want, sim.t
            sim.set_controls(*want)
            n += 1
        sim.tick()
    assert n == len(in_sim.decide_times) > 0


def test_the_request_carries_the_simulators_observed_view():
    sim = _sim_at(5, 40)
    got = observed_view_of(view_of(_request(sim), sim), _request(sim))
    want = observed_view(sim)
    assert isinstance(got, ObservedView) and len(want.pool_cores) > 0
    for name in want.__dataclass_fields__:  # the rounding-error negatives arrive as 0
        assert np.allclose(np.asarray(getattr(got, name), dtype=float),
                           np.asarray(getattr(want, name), dtype=float), rtol=0, atol=1e-9), name


def test_a_plain_plan_view_is_refused_naming_what_is_missing():
    ctrl = load_served_controller(CKPT, SCENARIO)
    sim = _sim_at(1, 3)
    ctrl.reset(sim)
    with pytest.raises(ValueError, match="hour_of_week and fleet_by_state"):
        ctrl.decide_view(plan_view(sim))
    assert ctrl.decide_view(observed_view(sim)) == load_controller(CKPT).decide(sim)


def test_a_state_without_hour_of_week_is_a_422_not_a_fallback():
    body = state_of(_sim_at(2, 10))
    del body["hour_of_week"]
    with pytest.raises(StateError) as e:
        asyncio.run(_service().decide(ScenarioState.model_validate(body)))
    assert e.value.field == "hour_of_week"


# ------------------------------------------------------------------ cloudrl serve flags
def _broken(tmp_path: Path, how: str) -> str:
    d = tmp_path / how
    if how == "missing":
        return str(d)
    shutil.copytree(CKPT, d)
    if how == "no_weights":
        (d / "policy.pt").unlink()
    elif how == "bad_json":
        (d / "policy.json").write_text("{not json")
    elif how == "bad_weights":
        (d / "policy.pt").write_bytes(b"not a torch file")
    elif how == "other_layout":
        spec = json.loads((d / "policy.json").read_text())
        (d / "policy.json").write_text(json.dumps({**spec, "obs_names": ["a", "b"]}))
    elif how == "bad_levels":
        spec = json.loads((d / "policy.json").read_text())
        (d / "policy.json").write_text(json.dumps({**spec, "release_levels": [0.5, 0.1]}))
    return str(d)


@pytest.mark.parametrize(("how", "words"), [
    ("missing", "no such directory"), ("no_weights", "missing policy.pt"),
    ("bad_json", "policy.json is malformed"), ("bad_weights", "does not load"),
    ("other_layout", "another observation or action layout"),
    ("bad_levels", "release_levels"),
])
def test_a_missing_or_broken_checkpoint_is_one_line_exit_2(capsys, tmp_path, how, words):
    path = _broken(tmp_path, how)
    assert main(["serve", "--scenario", SCENARIO, "--scenario-policy", "learned",
                 "--checkpoint", path, "--port", "18499"]) == 2
    err = capsys.readouterr().err
    assert words in err and path in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ["--scenario", "price_peak", "--scenario-policy", "learned", "--checkpoint", CKPT],
    ["--scenario", "price_peak", "--checkpoint", CKPT],
    ["--scenario", "carbon_shift", "--scenario-policy", POLICY],
    ["--scenario-policy", "learned", "--checkpoint", CKPT],  # the default scenario
])
def test_a_checkpoint_of_another_scenario_is_one_line_exit_2(capsys, argv):
    assert main(["serve", *argv, "--port", "18499"]) == 2
    err = capsys.readouterr().err
    assert "trained on scenario 'scarcity_spikes', not" in err
    assert "serve it with --scenario scarcity_spikes" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_learned_without_a_checkpoint_is_one_line_exit_2(capsys):
    assert main(["serve", "--scenario", SCENARIO, "--scenario-policy", "learned"]) == 2
    err = capsys.readouterr().err
    assert "--scenario-policy learned needs --checkpoint DIR" in err
    assert len(err.strip().splitlines()) == 1


def test_checkpoint_goes_to_the_scenario_only_when_it_is_a_scenario_checkpoint(tmp_path):
    parser = build_parser()

    def cfg(*argv: str):
        return service_config(parser.parse_args(["serve", *argv]))

    for argv in (["--scenario", SCENARIO, "--checkpoint", CKPT],
                 ["--scenario", SCENARIO, "--scenario-policy", "learned", "--checkpoint",
                  "checkpoints/scarcity_spikes"]):
        c = cfg(*argv)
        assert c.scenario.policy == POLICY and c.policy == "heuristic:power_aware", argv
    rllib = tmp_path / "rllib"
    rllib.mkdir()
    (rllib / "cloudrl.json").write_text("{}")
    c = cfg("--scenario", SCENARIO, "--checkpoint", str(rllib))
    assert c.policy == str(rllib) and c.scenario.policy == "signal_aware"
    c = cfg("--scenario", SCENARIO, "--scenario-policy", POLICY, "--checkpoint", str(rllib))
    assert c.policy == str(rllib) and c.scenario.policy == POLICY
    # a cloudrl train checkpoint of a scenario (e.g. the gated DQN) is that scenario's policy
    gated = tmp_path / "gated"
    gated.mkdir()
    (gated / "cloudrl.json").write_text(json.dumps({"algo": "gated_dqn", "scenario": SCENARIO}))
    c = cfg("--scenario", SCENARIO, "--checkpoint", str(gated))
    assert c.scenario.policy.startswith("learned:") and c.scenario.policy.endswith("gated")
    assert c.policy == "heuristic:power_aware"


# ------------------------------------------------------------------ over HTTP
@pytest.fixture(scope="module")
def served(ray_session, tmp_path_factory):
    from ray import serve

    db = str(tmp_path_factory.mktemp("serve_learned") / "state.db")
    port = _port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _deploy({"policy": "heuristic:power_aware", "env": {"n_servers": 8}, "state_db": db,
             "auth_token": TOKEN, "decide_requires_token": True, "num_cpus": 0.0,
             "max_body_bytes": 400_000, "scenario": {"name": SCENARIO, "policy": POLICY}})
    yield Client(port)
    serve.shutdown()


def _post(client: Client, body: object) -> tuple[int, dict]:
    return client.call("POST", "/v1/scenario/decide", body, token=TOKEN)


_BODY = state_of(_sim_at(3, 60))


@pytest.mark.parametrize(("seed", "decisions"), [(0, 0), (7, 90)])
def test_serve_answers_the_checkpoints_controls_with_its_decide_time(served, seed, decisions):
    sim = _sim_at(seed, decisions)
    status, out = _post(served, state_of(sim))
    assert status == 200, out
    assert out["policy"] == "learned" and out["fallback"] is False and out["reason"] is None
    release, ready = load_controller(CKPT).decide(sim)  # ready: up to the last bit
    assert out["release_util"] == release and out["ready_cores"] == pytest.approx(ready, 1e-12)
    assert out["decide_ms"] > 0 and 0 < out["controller_ms"] <= out["decide_ms"]


def test_scenario_info_reports_the_decide_and_controller_times(served):
    status, info = served.call("GET", "/v1/scenario")
    assert status == 200 and info["policy"] == POLICY and info["requires_hour_of_week"]
    for key in ("decide_ms_p50", "decide_ms_p99", "controller_ms_p50", "controller_ms_p99"):
        assert info[key] is not None and info[key] > 0, (key, info)
    status, out = _post(served, info["example"])
    assert status == 200 and out["policy"] == "learned", out


def _mutations(horizon: int) -> st.SearchStrategy:
    n = len(_BODY["price_fc"])
    drop_how = {k: v for k, v in _BODY.items() if k != "hour_of_week"}
    return st.sampled_from([
        ("hour_of_week", lambda b: drop_how),
        ("hour_of_week", lambda b: {**b, "hour_of_week": 168.0}),
        ("hour_of_week", lambda b: {**b, "hour_of_week": -0.5}),
        ("hour_of_week", lambda b: {**b, "hour_of_week": "monday"}),
        ("carbon_now", lambda b: {**b, "carbon_now": -1.0}),
        ("price_now", lambda b: {**b, "price_now": 1e9}),
        ("price_fc", lambda b: {**b, **{k: [1.0] * (horizon + 1) for k in (
            "price_fc", "carbon_fc", "solar_fc_kw")}, "load_fc": {
            "latency_critical": [1.0] * (horizon + 1), "batch": [1.0] * (horizon + 1)},
            "running": {"latency_critical": [1.0] * (horizon + 1),
                        "batch": [1.0] * (horizon + 1)}}),
        ("price_fc", lambda b: {**b, "price_fc": [1.0] * (MAX_FORECAST + 1)}),
        ("carbon_fc", lambda b: {**b, "carbon_fc": b["carbon_fc"][:n - 1]}),
        ("pool.cores", lambda b: {**b, "pool": {"cores": [1.0] * (MAX_POOL + 1),
                                                "duration_ticks": [1], "latest_start_tick": [1]}}),
        ("fleet", lambda b: {**b, "fleet": {**b["fleet"], "active": b["fleet"]["active"] + 8}}),
        ("fleet.off", lambda b: {**b, "fleet": {**b["fleet"], "off": -1.0}}),
        ("tick", lambda b: {**b, "tick": 1.5}),
        ("no_such", lambda b: {**b, "no_such": 1}),
    ])


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=st.data())
def test_hostile_states_answer_4xx_naming_the_field(served, case):
    horizon = ScenarioSim(load_scenario(SCENARIO)).horizon_ticks
    field, mutate = case.draw(_mutations(horizon), label="mutation")
    status, out = _post(served, mutate(_BODY))
    assert 400 <= status < 500, (field, status, out)
    if status == 422:
        assert out["errors"][0]["field"].startswith(field), (field, out)
    else:  # the largest arrays pass the body limit
        assert status == 413 and out["errors"][0]["field"] == "body"


def test_random_states_are_decided_feasibly_by_the_policy_or_refused_with_422(served):
    """Random ticks, hours of week, decision periods, signal values and array contents, at
    most one of them out of its range: every answer is the learned policy's feasible
    decision (never the fallback: nothing a client sends makes it fail) or a 422 naming
    the field that is out of range; both occur."""
    fleet = ScenarioSim(load_scenario(SCENARIO)).fleet_cores
    n = len(_BODY["price_fc"])
    statuses: dict[int, int] = {}
    scalars = {"price_now": st.floats(-2e4, 2e4), "carbon_now": st.floats(0, 5e3),
               "solar_now_kw": st.floats(0, 1e7)}
    arrays = {"price_fc": st.floats(-2e4, 2e4), "carbon_fc": st.floats(0, 5e3),
              "solar_fc_kw": st.floats(0, 1e7), "load_fc.batch": st.floats(0, 1e6),
              "running.batch": st.floats(0, fleet)}
    bad = {"tick": st.sampled_from([-1, 10**9 + 1]),
           "ticks_left": st.sampled_from([0, -1]),
           "hour_of_week": st.sampled_from([None, -0.5, 168.0, 1e9]),
           "decision_ticks": st.sampled_from([0, n + 1]),
           "carbon_now": st.sampled_from([-1.0, 5e3 + 1]),
           "running.latency_critical": st.sampled_from([4, n + 1])}  # another length

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data(), broken=st.sampled_from([None, None, None, *bad]),
           tick=st.integers(0, 10**9), ticks_left=st.one_of(st.none(), st.integers(1, 10**9)),
           how=st.floats(0.0, 167.99), decision=st.one_of(st.none(), st.integers(1, n)),
           scalar=st.sampled_from(sorted(scalars)), array=st.sampled_from(sorted(arrays)))
    def fuzz(data, broken, tick, ticks_left, how, decision, scalar, array) -> None:
        body = json.loads(json.dumps(_BODY))
        body.update({"tick": tick, "ticks_left": ticks_left, "hour_of_week": how,
                     "decision_ticks": decision,
                     scalar: data.draw(scalars[scalar], label=scalar)})
        head, _, tail = array.partition(".")
        values = data.draw(st.lists(arrays[array], min_size=n, max_size=n), label=array)
        (body[head] if tail else body).__setitem__(tail or head, values)
        if broken == "running.latency_critical":
            body["running"]["latency_critical"] = [1.0] * data.draw(bad[broken], label=broken)
        elif broken is not None:
            body[broken] = data.draw(bad[broken], label=broken)
        status, out = _post(served, body)
        statuses[status] = statuses.get(status, 0) + 1
        assert status == (200 if broken is None else 422), (broken, status, out)
        if status == 200:
            assert _feasible(out, fleet) and out["policy"] == "learned", out
            assert out["fallback"] is False, out
        else:
            # a decision period longer than the forecasts is the forecasts' field
            fields = ("decision_ticks", "price_fc") if broken == "decision_ticks" else (broken,)
            assert out["errors"][0]["field"].startswith(fields), (broken, out)

    fuzz()
    assert statuses.get(200, 0) > 0 and statuses.get(422, 0) > 0, statuses
