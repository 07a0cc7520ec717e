"""Operator feedback recorded on an env with signals exports as preference pairs.

A trajectory is recorded from a real env with signals (each state as the service
receives it: ``serve_apps.state.env_state_of``, through JSON and ``POST /v1/feedback``'s
validate-and-store), exported with ``cloudrl.feedback.export_pairs``, and the exported
observations are the env's own, bit for bit (the service's observation path). A state
whose signals do not fit the env is one mismatch whose message names the field.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cloudrl.data.pairs import read_pairs
from cloudrl.feedback import FeedbackStore, export_pairs
from cloudrl.heuristics import make_heuristic
from cloudrl.policy import make_env
from envs.observation import signal_cols
from serve_apps.schemas import FeedbackRequest
from serve_apps.state import env_state_of

# 300 s ticks: a forecast is issued every 12 ticks, so the steps cover every position in
# the forecast window (the mean's summation order); solar adds the two solar columns
ENV = {"n_servers": 5, "workload": "poisson",
       "sim": {"tick_seconds": 300, "episode_length": 40},
       "signals": {"solar_kwp": 2.0, "solar_source": "synthetic", "horizon_hours": 3,
                   "forecast_error": 0.3}}
PLAIN = {"n_servers": 5, "workload": "poisson", "sim": {"episode_length": 40}}
SEG_T = 14


def _trajectory(env_config: dict, interface: str, seed: int, steps: int,
                policy_name: str = "power_aware"):
    """An inline trajectory body (JSON, as the service receives it) and the env's obs."""
    env, policy = make_env(env_config, interface), make_heuristic(policy_name, interface)
    obs, _ = env.reset(seed=seed)
    policy.reset()
    body, observations = [], []
    for _ in range(steps):
        action = np.asarray(policy.act(obs)).tolist()
        body.append({"state": env_state_of(env), "action": action})
        observations.append(obs)
        obs, *_ = env.step(action)
    return json.loads(json.dumps({"steps": body})), observations


def _store(db, pairs: list[dict]) -> None:
    """What POST /v1/feedback does with a body: validate, dump, store (serve_apps.app)."""
    request = FeedbackRequest.model_validate({"pairs": pairs})
    store = FeedbackStore(db)
    store.add_pairs([p.model_dump(mode="json", exclude_none=True) for p in request.pairs],
                    policy_version="v1")
    store.close()


@pytest.mark.parametrize("interface", ["flat", "branching"])
def test_a_signals_trajectory_exports_with_the_envs_observations(tmp_path, interface):
    traj_a, obs_a = _trajectory(ENV, interface, 3, SEG_T + 1)
    traj_b, obs_b = _trajectory(ENV, interface, 8, 5, "ffd")  # shorter: edge-padded
    db = tmp_path / "state.db"
    _store(db, [{"a": {"trajectory": traj_a}, "b": {"trajectory": traj_b}, "preferred": "a"}])
    result = export_pairs(db, tmp_path / "pairs", env_config=ENV, interface=interface,
                          segment_length=SEG_T)
    assert result.written == 1 and result.skipped == {}, result.as_dict()
    data = read_pairs(tmp_path / "pairs")
    assert data.shape["obs_steps"] == SEG_T + 1
    n_sig = len(signal_cols(make_env(ENV, interface).config.signals))
    assert n_sig == 8  # price, carbon and solar columns
    for side, observations in (("a", obs_a), ("b", obs_b)):
        for t in range(SEG_T + 1):
            expected = observations[min(t, len(observations) - 1)]
            for key in ("macro", "servers", "jobs"):
                np.testing.assert_array_equal(data.obs[side][key][0, t], expected[key],
                                              err_msg=f"{side} step {t} {key}")
    # the signal columns change along the trajectory (the test compares real signals)
    signal_part = data.obs["a"]["macro"][0, :, -n_sig:]
    assert np.all(np.ptp(signal_part[:, :6], axis=0) > 0)


def _drop_signals(traj: dict) -> None:
    del traj["steps"][2]["state"]["signals"]


def _short_forecast(traj: dict) -> None:
    traj["steps"][1]["state"]["signals"]["price_fc"].pop()


def _no_solar(traj: dict) -> None:
    for name in ("solar_now_kw", "solar_fc_kw"):
        del traj["steps"][0]["state"]["signals"][name]


@pytest.mark.parametrize(("env_config", "breaker", "where", "says"), [
    (ENV, _drop_signals, "a.steps[2].state.signals:", "observes signals: give signals"),
    (ENV, _short_forecast, "a.steps[1].state.signals.price_fc:",
     "35 values given, the policy's forecast horizon is 36 ticks"),
    (ENV, _no_solar, "a.steps[0].state.signals.solar_now_kw:", "missing"),
    (PLAIN, None, "a.steps[0].state.signals:", "leave signals out"),
], ids=["missing signals", "short forecast", "missing solar", "signals to a plain env"])
def test_signals_that_do_not_fit_the_env_are_one_mismatch_naming_the_field(
        tmp_path, env_config, breaker, where, says):
    traj, _ = _trajectory(ENV, "flat", 1, 4)
    if breaker is not None:
        breaker(traj)
    other, _ = _trajectory(env_config, "flat", 2, 4)
    db = tmp_path / "state.db"
    _store(db, [{"a": {"trajectory": traj}, "b": {"trajectory": other}, "preferred": "a"}])
    result = export_pairs(db, tmp_path / "pairs", env_config=env_config, segment_length=4)
    assert result.written == 0 and result.skipped == {"mismatch": 1}
    message = result.first_skip["mismatch"]
    assert message.startswith("pair 1: ") and "\n" not in message, message
    assert where in message and says in message, message
    assert message.count("signals") >= 1 and "observe_snapshot" not in message, message


# ------------------------------------------------------------ the OpenAPI schema of feedback
def _schema(env_config: dict) -> dict:
    """The service's OpenAPI schema for a policy on ``env_config`` (as ``/openapi.json``)."""
    from fastapi.openapi.utils import get_openapi

    from serve_apps.app import api
    from serve_apps.fleet_layout import fleet_openapi
    from serve_apps.runtime import ServedPolicy

    policy = ServedPolicy("heuristic:power_aware", "v1", make_env(env_config, "flat").config,
                          "flat")
    return fleet_openapi(get_openapi(title="t", version="1", routes=api.routes), policy, 32)


def _valid(schema: dict, component: str, body: dict) -> bool:
    from jsonschema import Draft202012Validator

    root = {"components": schema["components"],
            "$ref": f"#/components/schemas/{component}"}
    return Draft202012Validator(root).is_valid(body)


def test_feedback_states_in_the_schema_take_signals_as_the_endpoint_does():
    """``/v1/decide``'s schema requires the policy's signals; a feedback trajectory's state
    takes them as ``/v1/feedback`` does: optional, any forecast length (the export checks
    them). Every body below is accepted by the endpoint's model and by the schema."""
    with_signals, plain = _schema(ENV), _schema(PLAIN)
    traj, _ = _trajectory(ENV, "flat", 1, 3)
    without = json.loads(json.dumps(traj))
    del without["steps"][0]["state"]["signals"]
    without["steps"][1]["state"]["signals"] = None
    shorter = json.loads(json.dumps(traj))
    for name in ("price_fc", "carbon_fc", "solar_fc_kw"):
        shorter["steps"][0]["state"]["signals"][name].pop()
    del shorter["steps"][1]["state"]["signals"]["solar_now_kw"]
    del shorter["steps"][1]["state"]["signals"]["solar_fc_kw"]
    for schema in (with_signals, plain):
        comps = schema["components"]["schemas"]
        assert "signals" not in comps["ClusterState"].get("required", [])
        for body in (traj, without, shorter):
            request = {"pairs": [{"a": {"trajectory": body}, "b": {"trajectory_id": "t"},
                                  "preferred": "a"}]}
            FeedbackRequest.model_validate(request)  # what the endpoint accepts
            assert _valid(schema, "FeedbackRequest", request)
    # /v1/decide: the policy's rules (required, its horizon, its solar) stay in the schema
    state = traj["steps"][0]["state"]
    assert "signals" in with_signals["components"]["schemas"]["DecideRequest"]["required"]
    assert _valid(with_signals, "DecideRequest", state)
    assert not _valid(with_signals, "DecideRequest", without["steps"][0]["state"])
    assert not _valid(with_signals, "DecideRequest", shorter["steps"][0]["state"])
    assert "signals" not in plain["components"]["schemas"]["DecideRequest"]["properties"]
    assert not _valid(plain, "DecideRequest", state)
