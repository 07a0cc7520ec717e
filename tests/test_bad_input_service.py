"""The decision service's HTTP edges, in process: authentication before validation, deep
nesting, OPTIONS/Allow, the published fleet layout, and a schema-driven fuzz of /v1/decide.

The FastAPI app of ``serve_apps.app`` runs in this process (Starlette's TestClient, no Ray):
the deployment class is built directly and handed to the routes as Serve's replica context
would. Routes, middleware, validation and the decision path (shield, batching) are the
deployed ones.
"""

from __future__ import annotations

import json
import time
import types
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings

TOKEN = "bad-input-token-0001"
N_SERVERS = 12
PROTECTED = [("POST", "/v1/rollout"), ("GET", "/v1/rollout"), ("POST", "/v1/feedback")]


def in_process_service(config: dict):
    """(TestClient, service) of the DecisionService deployment of ``config``, in process."""
    import ray.serve
    from fastapi.testclient import TestClient

    from serve_apps.app import DecisionService

    cls = next(c for c in DecisionService.func_or_class.__mro__[1:]
               if c.__name__ == "DecisionService")
    service = cls.__new__(cls)
    cls.__init__(service, config)
    context = types.SimpleNamespace(servable_object=service, _deployment_config=types.
                                    SimpleNamespace(max_ongoing_requests=256))
    ray.serve.get_replica_context = lambda: context  # what the routes' `self` comes from
    app = cls.__init__.__globals__["api"]  # the app the class's routes are mounted on
    return TestClient(app, raise_server_exceptions=False), service


def reset_batch_queues(cls) -> None:
    """Drop the batch queues the in-process run created on ``cls``'s ``@serve.batch``
    methods. They live with the decorated functions, i.e. on the class; a queue left behind
    cannot be pickled, and a later test that deploys the class on Serve would fail."""
    from ray.serve.batching import _LazyBatchQueueWrapper

    for name in dir(cls):
        setter = getattr(getattr(cls, name, None), "set_max_batch_size", None)
        wrapper = getattr(setter, "__self__", None)
        if isinstance(wrapper, _LazyBatchQueueWrapper):
            wrapper._queue = None


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    import ray.serve

    original = ray.serve.get_replica_context
    config = {"policy": "heuristic:power_aware", "interface": "branching",
              "env": {"n_servers": N_SERVERS, "workload": "poisson"},
              "state_db": str(tmp_path_factory.mktemp("bad_input") / "state.db"),
              "auth_token": TOKEN, "max_body_bytes": 2_000_000}
    test_client, service = in_process_service(config)
    try:
        with test_client:  # one event loop for every request: Serve's batch queue lives on it
            yield test_client
    finally:
        ray.serve.get_replica_context = original
        reset_batch_queues(type(service))
        app = type(service).__init__.__globals__["api"]
        app.__dict__.pop("openapi", None)  # the instance's bound method (and its sqlite store)
        app.openapi_schema = None


def _decide_body(client) -> dict:
    body = client.get("/v1/fleet").json()["example"]
    body["jobs"] = [{"cpu_cores": 2.0, "mem_gib": 4.0, "duration": 10, "deadline": 30}]
    return body


# ------------------------------------------------------------ authentication before validation
def _bodies(client) -> dict[str, bytes | None]:
    nested = b'{"a": ' * 3000 + b"1" + b"}" * 3000
    return {
        "no body": None,
        "valid-looking rollout": json.dumps({"action": "rollback"}).encode(),
        "wrong types": json.dumps({"action": 5, "weight": "heavy", "pairs": 3}).encode(),
        "unknown fields": json.dumps({"nope": True}).encode(),
        "empty object": b"{}",
        "truncated JSON": b'{"action": ',
        "not UTF-8": b'{"action": "\x80\x81"}',
        "deeply nested": nested,
        "a decide body": json.dumps(_decide_body(client)).encode(),
    }


@pytest.mark.parametrize(("method", "path"), PROTECTED)
@pytest.mark.parametrize("token", [None, "wrong-token-000000", "", "Basic " + TOKEN])
def test_unauthenticated_requests_get_401_whatever_the_body(client, method, path, token):
    for name, raw in _bodies(client).items():
        headers = {"content-type": "application/json"}
        if token is not None:
            headers["authorization"] = token if token.startswith("Basic") else f"Bearer {token}"
        response = client.request(method, path, content=raw, headers=headers)
        assert response.status_code == 401, (name, response.text)
        out = response.json()
        assert out["errors"][0]["field"] == "authorization", (name, out)
        assert "missing or wrong bearer token" in out["error"]
        assert response.headers["www-authenticate"] == "Bearer"
        assert "action" not in response.text and "pairs" not in response.text  # no schema


@pytest.mark.parametrize(("path", "raw", "field"), [
    ("/v1/rollout", b'{"action": 5}', "action"),
    ("/v1/rollout", b'{"action": "weight"}', "body"),
    ("/v1/feedback", b'{"pairs": []}', "pairs"),
])
def test_with_the_token_the_body_is_validated(client, path, raw, field):
    response = client.post(path, content=raw, headers={
        "authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == field


def test_a_token_holder_still_reaches_the_endpoint(client):
    response = client.get("/v1/rollout", headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and response.json()["stable"]["version"] == "v1"


# ------------------------------------------------------------ deep nesting
@pytest.mark.parametrize(("open_", "close", "depth"), [
    (b"[", b"]", 5_000), (b"[", b"]", 200_000), (b'{"servers": ', b"}", 5_000),
    (b'{"a": [', b"]}", 3_000)])
def test_deeply_nested_body_says_it_nests_too_deeply(client, open_, close, depth):
    raw = open_ * depth + b"0" + close * depth
    response = client.post("/v1/decide", content=raw,
                           headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text[:300]
    out = response.json()
    assert out["errors"][0]["field"] == "body"
    assert "nests arrays/objects too deeply" in out["error"] and "UTF-8" not in out["error"]


def test_moderately_nested_body_is_a_validation_error_naming_the_field(client):
    raw = b'{"servers": ' + b"[" * 50 + b"]" * 50 + b"}"
    response = client.post("/v1/decide", content=raw,
                           headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["errors"][0]["field"].startswith(
        "servers")


def test_a_body_that_is_not_utf8_still_says_so(client):
    response = client.post("/v1/decide", content=b'{"servers": "\xff\xfe"}',
                           headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not UTF-8 text" in response.json()["error"]


# ------------------------------------------------------------ OPTIONS and Allow
def _methods_by_path(client) -> dict[str, set[str]]:
    paths = client.get("/openapi.json").json()["paths"]
    return {path: {m.upper() for m in ops} for path, ops in paths.items()}


def test_options_lists_every_method_of_every_route(client):
    by_path = _methods_by_path(client)
    assert by_path["/v1/rollout"] == {"GET", "POST"}  # the route that used to show only POST
    for path, methods in by_path.items():
        response = client.options(path)
        assert response.status_code == 204, (path, response.text)
        allow = {m.strip() for m in response.headers["allow"].split(",")}
        assert allow == methods | {"OPTIONS"}, (path, allow)


@pytest.mark.parametrize("method", ["DELETE", "PUT", "PATCH"])
def test_a_method_the_path_does_not_take_is_405_with_the_full_allow(client, method):
    for path, methods in _methods_by_path(client).items():
        response = client.request(method, path)
        assert response.status_code == 405, (path, response.text)
        allow = {m.strip() for m in response.headers["allow"].split(",")}
        assert allow == methods | {"OPTIONS"}, (path, allow)
        out = response.json()
        assert out["errors"][0]["field"] == "method" and method in out["error"]


def test_unknown_paths_stay_404(client):
    for method in ("GET", "OPTIONS", "DELETE"):
        assert client.request(method, "/v1/nowhere").status_code == 404


# ------------------------------------------------------------ the fleet layout
def test_fleet_layout_matches_the_policy_and_its_example_is_accepted(client):
    from envs.env_config import EnvConfig
    from envs.fleet import Fleet

    fleet = Fleet.from_config(EnvConfig.coerce({"n_servers": N_SERVERS}).sim.fleet)
    layout = client.get("/v1/fleet").json()
    assert layout["n_servers"] == N_SERVERS == len(layout["servers"])
    assert [s["tier"] for s in layout["servers"]] == [fleet.tier_names[t] for t in fleet.tier]
    for s in layout["servers"]:
        tier = next(t for t in layout["tiers"] if t["name"] == s["tier"])
        assert (s["cpu_cores"], s["mem_gib"]) == (tier["cpu_cores"], tier["mem_gib"])
    assert sum(t["count"] for t in layout["tiers"]) == N_SERVERS
    assert layout["queue_capacity"] == 64 and layout["priority_levels"] == 4
    response = client.post("/v1/decide", json=layout["example"])
    assert response.status_code == 200 and response.json()["answered_by"] == "model"


def test_openapi_states_the_tier_and_capacity_at_each_index(client):
    layout = client.get("/v1/fleet").json()
    servers = client.get("/openapi.json").json()["components"]["schemas"]["DecideRequest"][
        "properties"]["servers"]
    assert servers["minItems"] == servers["maxItems"] == N_SERVERS
    assert len(servers["prefixItems"]) == N_SERVERS and servers["items"] is False
    for rule, server in zip(servers["prefixItems"], layout["servers"], strict=True):
        busy = rule["anyOf"][0]["properties"]
        assert busy["tier"]["const"] == server["tier"]
        assert busy["used_cpu_cores"]["maximum"] == server["cpu_cores"]
        assert busy["used_mem_gib"]["maximum"] == server["mem_gib"]


def test_a_state_off_the_published_layout_is_refused_naming_the_index(client):
    body = _decide_body(client)
    layout = client.get("/v1/fleet").json()
    other = next(t["name"] for t in layout["tiers"] if t["name"] != body["servers"][3]["tier"])
    body["servers"][3]["tier"] = other
    response = client.post("/v1/decide", json=body)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == \
        "servers[3].tier"
    body = _decide_body(client)
    body["servers"][5].update(n_running=1, used_cpu_cores=layout["servers"][5]["cpu_cores"] + 1)
    response = client.post("/v1/decide", json=body)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == \
        "servers[5].used_cpu_cores"


# ------------------------------------------------------------ schema-driven fuzzing
# Measured on this 12-server fleet: 100 of 100 generated /v1/decide bodies accepted (100%;
# 116 of 120 in an earlier run), 10 s on an idle 2-core machine, ~27 s on a loaded one.
# While integers written 5.0 (JSON Schema's integer, which generators use) were refused,
# 12 of 120 were (10%), every rejection naming a field the schema allowed. The floor (at
# least half accepted, no 5xx) leaves room for generator changes while proving the fuzzer
# reaches the decision logic; the bound on run time is the example count.
FUZZ_EXAMPLES = 100
MIN_ACCEPTED_SHARE = 0.5


def test_schemathesis_reaches_the_decision_logic(client):
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
    operation = schema["/v1/decide"]["POST"]
    statuses: Counter[int] = Counter()
    decided: Counter[str] = Counter()

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(GenerationMode.POSITIVE))
    def fuzz(case) -> None:
        response = client.post("/v1/decide", json=case.body)
        statuses[response.status_code] += 1
        assert response.status_code < 500, response.text
        if response.status_code == 200:
            decided[response.json()["answered_by"]] += 1

    start = time.perf_counter()
    fuzz()
    elapsed = time.perf_counter() - start
    total = sum(statuses.values())
    accepted = sum(n for code, n in statuses.items() if 200 <= code < 300)
    assert total >= FUZZ_EXAMPLES // 2, statuses
    print(f"schemathesis /v1/decide: {accepted}/{total} accepted in {elapsed:.1f} s")
    assert accepted / total >= MIN_ACCEPTED_SHARE, (statuses, elapsed)
    assert decided["model"] > 0, decided  # the policy answered, not only the fallback


def _post_raw(client, path: str, body, statuses: Counter) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    statuses[response.status_code] += 1
    assert response.status_code < 500, response.text


def test_schemathesis_negative_cases_never_get_5xx(client):
    """Bodies that break the schema on purpose (both decide endpoints) are 4xx, never 5xx."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
    statuses: Counter[int] = Counter()

    def fuzzer(path: str):
        @settings(max_examples=15, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=schema[path]["POST"].as_strategy(GenerationMode.NEGATIVE))
        def fuzz(case) -> None:
            _post_raw(client, path, case.body, statuses)
        return fuzz

    for path in ("/v1/decide", "/v1/decide/batch"):
        fuzzer(path)()
    assert sum(statuses.values()) >= 15, statuses
    assert all(400 <= code < 500 or code == 200 for code in statuses), statuses


def test_decide_behind_a_token_is_401_before_its_body_is_read(client):
    """With ``decide_requires_token`` the decide endpoints join the protected ones (the
    guard configured as a replica with that setting configures it)."""
    from serve_apps.app import protected_paths
    from serve_apps.http_guards import BearerAuth
    from serve_apps.service_config import ServiceConfig

    assert set(protected_paths(ServiceConfig())) == {"/v1/rollout", "/v1/feedback"}
    guarded = protected_paths(ServiceConfig(decide_requires_token=True))
    assert guarded["/v1/decide"] == guarded["/v1/decide/batch"] == {"POST"}
    saved = BearerAuth.token, dict(BearerAuth.protected)
    body = _decide_body(client)
    try:
        BearerAuth.configure(TOKEN, guarded)
        for path, raw in (("/v1/decide", b'{"servers": 5}'), ("/v1/decide", b"[[[["),
                          ("/v1/decide/batch", b'{"states": "x"}'),
                          ("/v1/decide", json.dumps(body).encode())):
            response = client.post(path, content=raw,
                                   headers={"content-type": "application/json"})
            assert response.status_code == 401, (path, raw, response.text)
        auth = {"authorization": f"Bearer {TOKEN}"}
        assert client.post("/v1/decide", json=body, headers=auth).status_code == 200
        assert client.post("/v1/decide", json={"servers": 5}, headers=auth).status_code == 422
        assert client.get("/v1/fleet").status_code == 200  # reads stay open
    finally:
        BearerAuth.configure(*saved)
    assert client.post("/v1/decide", json=body).status_code == 200
