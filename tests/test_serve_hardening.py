"""The decision service under hostile or broken input, over real HTTP: hostile bodies,
floods, broken models, restarts.

One app per module, with Serve's health check every 0.5 s so that a canary which breaks
at run time is caught within seconds: broken canaries are refused or dropped and never
take the replica down; absurd or overflowing values, wrong types and bad policy specs
answer 4xx in the documented error format; the OpenAPI schema carries the fleet's rules.
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from serve_apps.rollout import SCHEMA
from tests.test_serve import (
    N_SERVERS,
    TOKEN,
    Client,
    _config,
    _deploy,
    _state,
    start_service,
)

pytestmark = pytest.mark.usefixtures("ray_session")
HEALTH_PERIOD_S = 0.5


ROLLBACK_TIMEOUTS = 4  # the service's canary_rollback_timeouts (default 3)


def _hconfig(db: str) -> dict:
    return {**_config(db), "health_check_period_s": HEALTH_PERIOD_S,
            "health_check_timeout_s": 10.0, "canary_rollback_timeouts": ROLLBACK_TIMEOUTS}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    yield from start_service(tmp_path_factory.mktemp("serve_hardening"), _hconfig)


def _stored(db: str) -> dict:
    with sqlite3.connect(db) as conn:
        return json.loads(conn.execute("SELECT state FROM rollout WHERE id = 1").fetchone()[0])


def _body() -> dict:
    body = _state(8, 25)
    body["jobs"] = [{"cpu_cores": 1.0, "mem_gib": 1.0, "duration": 5, "deadline": 20,
                     "age": 1}] + body["jobs"][:3]
    return body


def _stable_requests(client: Client) -> int:
    return client.call("GET", "/v1/policy")[1]["stable"]["counters"].get("requests", 0)


# ------------------------------------------------------------------ item 1: broken canaries
def test_broken_canary_is_refused_by_its_smoke_test_and_never_persisted(service):
    client, db = service
    status, out = client.call("POST", "/v1/rollout", {
        "action": "canary", "policy": "python:serve_apps.faults:broken", "weight": 0.1},
        token=TOKEN)
    assert status == 422, out
    assert out["errors"][0]["field"] == "policy" and "smoke test" in out["error"], out
    assert "injected model failure" in out["error"]
    assert _stored(db)["canary"] is None
    assert client.call("GET", "/v1/policy")[1]["canary"] is None
    time.sleep(4 * HEALTH_PERIOD_S)
    assert client.call("GET", "/healthz")[0] == 200
    status, out = client.call("POST", "/v1/decide", _body())
    assert status == 200 and out["answered_by"] == "model" and out["policy_version"] == "v1"


def test_canary_that_breaks_at_run_time_is_dropped_and_the_replica_stays_up(service):
    client, db = service
    for _ in range(3):
        assert client.call("POST", "/v1/decide", _body())[0] == 200
    served = _stable_requests(client)
    status, out = client.call("POST", "/v1/rollout", {
        "action": "canary", "policy": "python:serve_apps.faults:breaks_later", "weight": 0.5},
        token=TOKEN)
    assert status == 200 and out["canary"]["spec"].endswith("breaks_later"), out
    deadline, report = time.time() + 20, out
    while report["canary"] is not None and time.time() < deadline:
        assert client.call("GET", "/healthz")[0] == 200
        time.sleep(HEALTH_PERIOD_S / 2)
        report = client.call("GET", "/v1/policy")[1]
    assert report["canary"] is None, report  # dropped by the health check, not failed on
    assert _stored(db)["canary"] is None
    # the same replica serves on: its counters were not reset by a restart
    assert _stable_requests(client) >= served
    status, out = client.call("POST", "/v1/decide", _body())
    assert status == 200 and out["answered_by"] == "model"
    assert out["policy_version"] == report["stable"]["version"]
    status, out = client.call("POST", "/v1/rollout", {"action": "rollback"}, token=TOKEN)
    assert status == 422 and "no canary" in out["error"]  # reachable, nothing to roll back


def _late_body() -> dict:
    """A state in the second half of the horizon, where the fault policies misbehave."""
    body = _body()
    body["tick"] = body["time_of_day_tick"] = 730  # of the default 1,000-tick episode
    return body


def test_a_hanging_canary_is_rolled_back_after_its_timeouts(service):
    """A canary put on by hand (no automatic plan) whose model sleeps past the decision
    deadline (``faults:slow``: 3 s against ``model_timeout_s`` 0.5 s) on late states: every
    one of its decisions is the fallback's, its breaker opens after 2 timeouts and half-opens
    every 1 s, and its 4th timed-out decision rolls it back; then the stable model answers."""
    from serve_apps.faults import SLOW_SECONDS

    client, db = service
    status, out = client.call("POST", "/v1/rollout", {
        "action": "canary", "policy": "python:serve_apps.faults:slow", "weight": 1.0},
        token=TOKEN)
    assert status == 200 and out["auto"] is None, out
    version = out["canary"]["version"]
    on_canary, deadline = [], time.time() + 90
    while time.time() < deadline:
        status, out = client.call("POST", "/v1/decide", _late_body())
        assert status == 200, out
        if out["policy_version"] != version:
            break
        on_canary.append(out)
    assert out["policy_version"] != version and out["answered_by"] == "model", out
    assert all(a["answered_by"] == "fallback" for a in on_canary), on_canary
    reasons = [a["fallback_reason"] for a in on_canary]
    assert set(reasons) <= {"timeout", "breaker_open"}, reasons
    assert reasons.count("timeout") == ROLLBACK_TIMEOUTS and reasons[-1] == "timeout", reasons
    assert all(a["latency_ms"] < 1000 * SLOW_SECONDS for a in on_canary)  # nobody waited
    assert client.call("GET", "/v1/policy")[1]["canary"] is None
    assert _stored(db)["canary"] is None
    last = client.call("GET", "/v1/rollout", token=TOKEN)[1]["history"][-1]
    assert last["event"] == "rolled_back" and last["version"] == version, last
    assert last["reason"].startswith(f"automatic: {ROLLBACK_TIMEOUTS} decisions timed out")


def test_restart_drops_a_persisted_canary_that_fails(service, tmp_path):
    client, db = service
    old = str(tmp_path / "state.db")
    with sqlite3.connect(old) as conn:  # what a service before the smoke test could persist
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO rollout (id, state) VALUES (1, ?)", (json.dumps({
            "configured_policy": "heuristic:power_aware", "next": 3,
            "stable": {"version": "v1", "spec": "heuristic:power_aware"},
            "canary": {"version": "v2", "spec": "python:serve_apps.faults:broken"},
            "weight": 0.5}),))
    try:
        _deploy(_hconfig(old))
        assert client.call("GET", "/healthz")[0] == 200
        assert client.call("GET", "/v1/policy")[1]["canary"] is None
        assert _stored(old)["canary"] is None and _stored(old)["stable"]["version"] == "v1"
        time.sleep(4 * HEALTH_PERIOD_S)
        status, out = client.call("POST", "/v1/decide", _body())
        assert status == 200 and out["answered_by"] == "model" and out["policy_version"] == "v1"
    finally:
        _deploy(_hconfig(db))


# ------------------------------------------------------------------ item 2: absurd values
@pytest.mark.parametrize(("field", "value"), [("arrival_rate", 1e308), ("violation_rate", 1e300),
                                              ("arrival_rate", 10_001.0)])
def test_implausible_rates_are_refused_and_never_reach_the_model(service, field, value):
    client, _ = service
    before = client.call("GET", "/v1/policy")[1]["stable"]["counters"]
    for _ in range(4):
        status, out = client.call("POST", "/v1/decide", {**_body(), field: value})
        assert status == 422 and out["errors"][0]["field"] == field, out
    after = client.call("GET", "/v1/policy")[1]["stable"]["counters"]
    assert after.get("requests", 0) == before.get("requests", 0)
    assert after["breaker"] == "closed"
    status, out = client.call("POST", "/v1/decide", {**_body(), field: 10_000.0})
    assert status == 200 and out["answered_by"] == "model"  # the documented upper bound


# ------------------------------------------------------------------ item 3: integer bounds
def _set(path: str, value: int):
    def apply(body: dict) -> None:
        node: dict = body
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[part] if not part.isdigit() else node[int(part)]  # type: ignore[index]
        node[parts[-1]] = value
    return apply


INT_FIELDS = ["tick", "time_of_day_tick", "priority_level", "jobs.0.duration",
              "jobs.0.deadline", "jobs.0.age", "servers.0.wake_left", "servers.0.n_running"]


def _field_name(path: str) -> str:
    out = ""
    for part in path.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


@pytest.mark.parametrize("value", [2**63, 2**63 - 1, 10**9 + 1], ids=["2^63", "2^63-1", "1e9+1"])
@pytest.mark.parametrize("path", INT_FIELDS)
def test_integers_out_of_range_answer_422_on_both_decide_endpoints(service, path, value):
    client, _ = service
    body = _body()
    _set(path, value)(body)
    field = _field_name(path)
    status, out = client.call("POST", "/v1/decide", body)
    assert status == 422 and out["errors"][0]["field"] == field, out
    status, out = client.call("POST", "/v1/decide/batch", {"states": [_body(), body]})
    assert status == 422 and out["errors"][0]["field"] == f"states[1].{field}", out


# ------------------------------------------------------------------ item 4: bad policy specs
def _checkpoint(tmp_path, meta: str, module_files: bool = False) -> str:
    from cloudrl.checkpoint_policy import META_FILE, MODULE_SUBDIR

    (tmp_path / MODULE_SUBDIR).mkdir(parents=True)
    (tmp_path / META_FILE).write_text(meta)
    if module_files:
        for name in ("module_state.pt", "class_and_ctor_args.pkl", "metadata.json"):
            (tmp_path / MODULE_SUBDIR / name).write_bytes(b"")
    return str(tmp_path)


GOOD_META = json.dumps({"algo": "ppo", "interface": "branching",
                        "env": {"n_servers": N_SERVERS, "workload": "poisson"}})
BAD_SPECS = {
    "factory with other arguments": (lambda _: "python:math:sqrt", "python:math:sqrt"),
    "not callable": (lambda _: "python:math:pi", "not callable"),
    "returns no policy": (lambda _: "python:builtins:slice", "act_batch"),
    "empty cloudrl.json": (lambda p: _checkpoint(p, ""), "cloudrl.json"),
    "truncated cloudrl.json": (lambda p: _checkpoint(p, GOOD_META[:30]), "cloudrl.json"),
    "empty module files": (lambda p: _checkpoint(p, GOOD_META, module_files=True),
                           "cannot load"),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_bad_policy_spec_answers_422_naming_the_problem(service, tmp_path, case):
    client, db = service
    make, fragment = BAD_SPECS[case]
    spec = make(tmp_path)
    status, out = client.call("POST", "/v1/rollout", {"action": "canary", "policy": spec},
                              token=TOKEN)
    assert status == 422, out
    assert out["errors"][0]["field"] == "policy" and fragment in out["error"], out
    assert _stored(db)["canary"] is None


# ------------------------------------------------------------------ item 5: strict types, format
@pytest.mark.parametrize(("path", "value"), [
    ("jobs.0.cpu_cores", "2"), ("jobs.0.cpu_cores", True), ("tick", "5"), ("tick", 5.5),
    ("servers.0.used_mem_gib", "0"), ("jobs.0.duration", False), ("arrival_rate", "1")])
def test_wrong_types_are_refused(service, path, value):
    client, _ = service
    body = _body()
    _set(path, value)(body)
    status, out = client.call("POST", "/v1/decide", body)
    assert status == 422 and out["errors"][0]["field"] == _field_name(path), out


@pytest.mark.parametrize(("method", "path", "raw", "token", "status", "field"), [
    ("POST", "/v1/rollout", b'{"action": "rollback"}', None, 401, "authorization"),
    ("POST", "/v1/feedback", json.dumps({"pairs": [{
        "a": {"trajectory_id": "t1"}, "b": {"trajectory_id": "t2"}, "preferred": "a"}]}).encode(),
     "wrong-token-000", 401, "authorization"),
    ("POST", "/v1/decide", b'{"servers": "\x80\x81 not utf-8"}', None, 400, "body"),
    ("POST", "/v1/decide", b'{"servers": [', None, 400, "body"),
    ("POST", "/v1/decide", b'{"servers": []}', None, 422, "servers"),
    ("GET", "/v1/nowhere", None, None, 404, "path"),
])
def test_every_error_has_the_documented_format(service, method, path, raw, token, status,
                                               field):
    client, _ = service
    got, out = client.call(method, path, raw=raw, token=token)
    assert got == status, out
    assert set(out) == {"error", "errors"} and out["error"], out
    assert out["errors"][0]["field"] == field and out["errors"][0]["message"], out


# ------------------------------------------------------------------ item 6: masked, OpenAPI
def test_openapi_schema_states_the_fleet_and_exactly_one_rules(service):
    client, _ = service
    status, schema = client.call("GET", "/openapi.json")
    assert status == 200
    comps = schema["components"]["schemas"]
    for name in ("DecideRequest", "ClusterState"):
        props = comps[name]["properties"]
        assert props["servers"]["minItems"] == props["servers"]["maxItems"] == N_SERVERS
        assert props["jobs"]["maxItems"] == 64
        assert props["priority_level"]["maximum"] == 3
        assert props["arrival_rate"]["maximum"] == 10_000
        assert props["tick"]["maximum"] == 10**9
    tiers = comps["ServerState"]["properties"]["tier"]
    assert set(tiers["enum"]) == {"efficient", "standard", "performance"}
    assert comps["DecideBatchRequest"]["properties"]["states"]["maxItems"] == 32
    one_of = comps["TrajectoryRef"]["oneOf"]
    assert sorted(tuple(s["required"]) for s in one_of) == [("trajectory",),
                                                            ("trajectory_id",)]
    rollout = comps["RolloutRequest"]["oneOf"]
    needs = {s["properties"]["action"]["const"]: s.get("required", []) for s in rollout}
    assert needs["canary"] == ["action", "policy"] and needs["weight"] == ["action", "weight"]
    assert needs["rollback"] == ["action"]
