"""The decision service over real HTTP on a real Serve app on localhost."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudrl.cli import main
from cloudrl.feedback import FeedbackStore
from cloudrl.heuristics import make_heuristic
from envs.cluster_env import ClusterBranchingEnv
from serve_apps.schemas import ClusterState
from serve_apps.state import state_of, to_snapshot

N_SERVERS = 12
TOKEN = "test-token-123456"
TINY_PPO = {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1}

pytestmark = pytest.mark.usefixtures("ray_session")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Client:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body: object = None, token: str | None = None,
             raw: bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"content-type": "application/json", **(headers or {})}
        if token:
            hdrs["authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.base + path, data=data, headers=hdrs, method=method)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


def _config(db: str) -> dict:
    return {"policy": "heuristic:power_aware", "interface": "branching",
            "env": {"n_servers": N_SERVERS, "workload": "poisson"}, "state_db": db,
            "auth_token": TOKEN, "failure_threshold": 2, "cooldown_s": 1.0,
            "model_timeout_s": 0.5, "num_cpus": 0.0, "max_body_bytes": 200_000}


def _deploy(cfg: dict) -> None:
    from ray import serve

    from serve_apps.app import build_app
    serve.run(build_app(cfg), name="cloudrl", route_prefix="/")


def start_service(db_dir, make_config):
    """Serve on a free port with ``make_config(db)``; yields (client, db), then shuts down."""
    from ray import serve

    port = _free_port()
    db = str(db_dir / "state.db")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _deploy(make_config(db))
    yield Client(port), db
    serve.shutdown()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    yield from start_service(tmp_path_factory.mktemp("serve"), _config)


def _state(seed: int, steps: int) -> dict:
    env = ClusterBranchingEnv({"n_servers": N_SERVERS, "workload": "poisson"})
    policy = make_heuristic("ffd", "branching")
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        obs, *_ = env.step(policy.act(obs))
    return state_of(env.sim)


def _local_obs(body: dict) -> dict:
    env = ClusterBranchingEnv({"n_servers": N_SERVERS, "workload": "poisson"})
    state = ClusterState.model_validate(body)
    return env.observe_snapshot(to_snapshot(state, env.sim.fleet, env.config.sim))


def _feasible(raw: list[int], obs: dict) -> bool:
    mask, offset = obs["action_mask"] > 0, 0
    sizes = [N_SERVERS + 1] * 8 + [3] * 3 + [4]
    for d, size in enumerate(sizes):
        if not mask[offset + raw[d]]:
            return False
        offset += size
    return len(raw) == len(sizes)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), steps=st.integers(0, 200),
       priority=st.integers(0, 3), rate=st.floats(0, 5))
def test_decide_returns_the_in_process_feasible_action(service, seed, steps, priority, rate):
    client, _ = service
    body = {**_state(seed, steps), "priority_level": priority, "arrival_rate": rate}
    status, out = client.call("POST", "/v1/decide", body)
    assert status == 200, out
    obs = _local_obs(body)
    raw = out["action"]["raw"]
    assert _feasible(raw, obs)
    expected = make_heuristic("power_aware", "branching").act(obs)
    assert raw == [int(x) for x in expected]  # the service's observation is the env's
    assert out["answered_by"] == "model" and out["policy_version"] == "v1"
    assert all(p["job"] < len(body["jobs"]) and p["server"] < N_SERVERS
               for p in out["action"]["placements"])
    assert [p["tier"] for p in out["action"]["power"]] == ["efficient", "standard",
                                                           "performance"]
    assert out["latency_ms"] > 0


BAD_INPUTS = [
    ("wrong type", {"servers": "many"}, "servers"),
    ("missing field", {"jobs": []}, "servers"),
    ("NaN", b'{"servers": [{"tier": "standard", "used_cpu_cores": NaN}]}',
     "servers[0].used_cpu_cores"),
    ("inf", b'{"servers": [{"tier": "standard", "used_mem_gib": Infinity}]}',
     "servers[0].used_mem_gib"),
    ("negative capacity", {"servers": [{"tier": "standard", "used_cpu_cores": -1}]},
     "servers[0].used_cpu_cores"),
    ("unknown field", {"servers": [{"tier": "standard", "gpus": 2}]}, "servers[0].gpus"),
]


@pytest.mark.parametrize(("name", "body", "field"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_answers_422_naming_the_field(service, name, body, field):
    client, _ = service
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, out = client.call("POST", "/v1/decide", raw=raw)
    assert status == 422, out
    assert any(e["field"].startswith(field) for e in out["errors"]), out


def test_malformed_json_answers_400_naming_the_body(service):
    client, _ = service
    for raw in (b'{"servers": [', b'{"tick": 3,, "servers": []}'):
        status, out = client.call("POST", "/v1/decide", raw=raw)
        assert status == 400 and out["errors"][0]["field"] == "body", out
        assert "not valid JSON" in out["error"]


def test_states_that_do_not_fit_the_policy_answer_422(service):
    client, _ = service
    body = _state(1, 10)
    too_many_servers = {**body, "servers": body["servers"] + body["servers"][:1]}
    too_many_jobs = {**body, "jobs": [{"cpu_cores": 1, "mem_gib": 1, "duration": 5,
                                       "deadline": 20}] * 65}
    over_capacity = json.loads(json.dumps(body))
    over_capacity["servers"][0].update(used_cpu_cores=1000.0, n_running=3)
    for bad, field in ((too_many_servers, "servers"), (too_many_jobs, "jobs"),
                       (over_capacity, "servers[0].used_cpu_cores")):
        status, out = client.call("POST", "/v1/decide", bad)
        assert status == 422 and out["errors"][0]["field"] == field, out


def test_oversized_body_answers_413_and_stores_nothing(service):
    client, db = service
    before = FeedbackStore(db).count()
    big = {"pairs": [{"a": {"trajectory_id": "x" * 200}, "b": {"trajectory_id": "y"},
                      "preferred": "a", "note": "n" * 4000}] * 100}
    status, out = client.call("POST", "/v1/feedback", big, token=TOKEN)
    assert status == 413 and "larger than" in out["error"]
    assert FeedbackStore(db).count() == before


def test_rollout_and_feedback_need_the_bearer_token(service):
    client, db = service
    pair = {"pairs": [{"a": {"trajectory_id": "t1"}, "b": {"trajectory_id": "t2"},
                       "preferred": "a"}]}
    for token in (None, "wrong-token-000"):
        assert client.call("POST", "/v1/rollout", {"action": "rollback"}, token)[0] == 401
        assert client.call("POST", "/v1/feedback", pair, token)[0] == 401
    assert FeedbackStore(db).count() == 0


def test_concurrent_callers_are_batched(service):
    client, _ = service
    body = _state(3, 50)
    before = client.call("GET", "/v1/policy")[1]["stable"]["counters"]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: client.call("POST", "/v1/decide", body), range(64)))
    assert all(status == 200 for status, _ in results)
    assert len({json.dumps(out["action"]["raw"]) for _, out in results}) == 1
    after = client.call("GET", "/v1/policy")[1]["stable"]["counters"]
    requests = after["requests"] - before.get("requests", 0)
    batches = after["batches"] - before.get("batches", 0)
    assert requests == 64 and batches < requests


def test_decide_batch_answers_each_state_like_decide(service):
    client, _ = service
    states = [_state(seed, 30 + seed) for seed in range(5)]
    status, out = client.call("POST", "/v1/decide/batch", {"states": states})
    assert status == 200 and len(out["decisions"]) == 5
    for state, decision in zip(states, out["decisions"], strict=True):
        single = client.call("POST", "/v1/decide", state)[1]
        assert decision["action"]["raw"] == single["action"]["raw"]
    bad = [states[0], {**states[1], "servers": states[1]["servers"][:3]}]
    status, out = client.call("POST", "/v1/decide/batch", {"states": bad})
    assert status == 422 and out["errors"][0]["field"] == "states[1].servers", out
    status, out = client.call("POST", "/v1/decide/batch", {"states": [states[0]] * 33})
    assert status == 422 and out["errors"][0]["field"] == "states"


def test_canary_split_sticky_routing_promote_and_rollback(service):
    client, _ = service
    status, out = client.call("POST", "/v1/rollout", {"action": "canary",
                                                      "policy": "heuristic:ffd", "weight": 0.3},
                              token=TOKEN)
    assert status == 200 and out["canary"]["version"] == "v2", out
    body = _state(2, 30)
    versions = [client.call("POST", "/v1/decide", body)[1]["policy_version"]
                for _ in range(300)]
    share = versions.count("v2") / len(versions)
    assert 0.21 < share < 0.39, share  # 0.3 +- 4 standard errors
    sticky = {client.call("POST", "/v1/decide", {**body, "routing_key": "tenant-7"})[1]
              ["policy_version"] for _ in range(20)}
    assert len(sticky) == 1
    report = client.call("GET", "/v1/policy")[1]
    assert report["canary"]["weight"] == 0.3 and report["stable"]["weight"] == pytest.approx(0.7)
    assert client.call("POST", "/v1/rollout", {"action": "weight"}, token=TOKEN)[0] == 422
    status, out = client.call("POST", "/v1/rollout", {"action": "promote"}, token=TOKEN)
    assert status == 200 and out["stable"]["version"] == "v2" and out["canary"] is None
    assert client.call("POST", "/v1/decide", body)[1]["policy"] == "ffd"
    client.call("POST", "/v1/rollout", {"action": "canary", "policy": "heuristic:sjf",
                                        "weight": 1.0}, token=TOKEN)
    assert client.call("POST", "/v1/decide", body)[1]["policy_version"] == "v3"
    status, out = client.call("POST", "/v1/rollout", {"action": "rollback"}, token=TOKEN)
    assert status == 200 and out["canary"] is None
    assert client.call("POST", "/v1/decide", body)[1]["policy_version"] == "v2"
    status, out = client.call("POST", "/v1/rollout", {"action": "canary",
                                                      "policy": "heuristic:nope"}, token=TOKEN)
    assert status == 422 and out["errors"][0]["field"] == "policy"


@pytest.mark.parametrize(("fault", "reason"), [("raising", "error"), ("nan", "nan"),
                                               ("infeasible", "infeasible")])
def test_failing_model_is_answered_by_the_fallback_and_opens_the_breaker(service, fault,
                                                                         reason):
    client, _ = service
    status, out = client.call("POST", "/v1/rollout", {
        "action": "canary", "policy": f"python:serve_apps.faults:{fault}", "weight": 1.0},
        token=TOKEN)
    assert status == 200, out
    version = out["canary"]["version"]
    early, late = _state(4, 20), {**_state(4, 20), "tick": 700}
    first = client.call("POST", "/v1/decide", early)[1]
    assert first["answered_by"] == "model" and first["policy_version"] == version
    answers = [client.call("POST", "/v1/decide", late)[1] for _ in range(4)]
    assert [a["fallback_reason"] for a in answers] == [reason, reason] + ["breaker_open"] * 2
    for answer in answers:
        assert answer["answered_by"] == "fallback" and _feasible(answer["action"]["raw"],
                                                                 _local_obs(late))
    counters = client.call("GET", "/v1/policy")[1]["canary"]["counters"]
    assert counters["breaker"] == "open" and counters[f"fallback_{reason}"] == 2
    assert counters["fallback_breaker_open"] == 2
    time.sleep(1.2)  # cooldown: half-open, a good answer closes the breaker
    assert client.call("POST", "/v1/decide", early)[1]["answered_by"] == "model"
    assert client.call("GET", "/v1/policy")[1]["canary"]["counters"]["breaker"] == "closed"
    client.call("POST", "/v1/rollout", {"action": "rollback"}, token=TOKEN)


def test_checkpoint_policy_is_served(service, tmp_path):
    client, _ = service
    out_dir = tmp_path / "ppo"
    assert main(["train", "--algo", "ppo", "--n-servers", str(N_SERVERS), "--env-steps", "64",
                 "--hparams", json.dumps(TINY_PPO), "--out", str(out_dir)]) == 0
    status, out = client.call("POST", "/v1/rollout", {"action": "canary",
                                                      "policy": str(out_dir), "weight": 1.0},
                              token=TOKEN)
    assert status == 200 and out["canary"]["interface"] == "flat", out
    body = _state(5, 40)
    answer = client.call("POST", "/v1/decide", body)[1]
    assert answer["answered_by"] == "model" and answer["policy"].startswith("ppo:")
    raw = answer["action"]["raw"]
    from envs.cluster_env import ClusterSchedulingEnv
    env = ClusterSchedulingEnv({"n_servers": N_SERVERS, "workload": "poisson"})
    obs = env.observe_snapshot(to_snapshot(ClusterState.model_validate(body), env.sim.fleet,
                                           env.config.sim))
    assert isinstance(raw, int) and obs["action_mask"][raw] > 0
    # finite but absurd rates would make the model's scores NaN: refused before the model,
    # so they can never open the breaker for everyone else
    for _ in range(4):
        status, out = client.call("POST", "/v1/decide", {**body, "arrival_rate": 1e308})
        assert status == 422 and out["errors"][0]["field"] == "arrival_rate", out
    counters = client.call("GET", "/v1/policy")[1]["canary"]["counters"]
    assert counters["breaker"] == "closed" and counters.get("fallback_nan", 0) == 0
    assert client.call("POST", "/v1/decide", body)[1]["answered_by"] == "model"
    # checkpoint paths are shown to token holders only
    public = json.dumps(client.call("GET", "/v1/policy")[1])
    assert str(out_dir) not in public and "ppo:" in public
    private = client.call("GET", "/v1/policy", token=TOKEN)[1]
    assert private["canary"]["spec"] == str(out_dir)
    client.call("POST", "/v1/rollout", {"action": "rollback"}, token=TOKEN)


def test_feedback_is_stored_deduplicated_and_survives_a_restart(service, tmp_path):
    client, db = service
    trajectory = {"steps": [{"state": _state(6, 5), "action": [N_SERVERS] * 8 + [1, 1, 1, 0],
                             "reward": -1.5}]}
    pairs = {"pairs": [{"a": {"trajectory": trajectory}, "b": {"trajectory_id": "ep-9"},
                        "preferred": "a", "operator": "ops-1"},
                       {"a": {"trajectory_id": "ep-1"}, "b": {"trajectory_id": "ep-2"},
                        "preferred": "equal"}]}
    status, out = client.call("POST", "/v1/feedback", pairs, token=TOKEN)
    assert status == 200 and out["stored"] == 2 and out["duplicates"] == 0
    bad = {"pairs": [pairs["pairs"][0], {"a": {"trajectory_id": "x"}, "preferred": "a"}]}
    status, out = client.call("POST", "/v1/feedback", bad, token=TOKEN)
    assert status == 422 and out["errors"][0]["field"] == "pairs[1].b"
    stable = client.call("GET", "/v1/policy")[1]["stable"]["version"]
    _deploy({**_config(db), "routing_seed": 1})  # a new replica on the same database
    swapped = {"pairs": [{"a": {"trajectory_id": "ep-9"}, "b": {"trajectory": trajectory},
                          "preferred": "b"}]}
    status, out = client.call("POST", "/v1/feedback", swapped, token=TOKEN)
    assert status == 200 and out == {"stored": 0, "duplicates": 1, "ids": []}
    assert client.call("GET", "/v1/policy")[1]["stable"]["version"] == stable
    export = tmp_path / "pairs.jsonl"
    assert main(["feedback", "export", "--db", db, "--out", str(export)]) == 0
    rows = [json.loads(line) for line in export.read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["operator"] == "ops-1"
    assert rows[0]["a"]["trajectory"]["steps"][0]["reward"] == -1.5
    assert np.isclose(rows[0]["a"]["trajectory"]["steps"][0]["state"]["tick"], 5)


@contextlib.contextmanager
def serve_command(args: list[str], port: int, env: dict[str, str] | None = None,
                  cwd: str | None = None):
    """``cloudrl serve ARGS --port PORT`` in a subprocess, its own local Ray; yields a
    client once ``/healthz`` answers (up to 240 s), then stops it with SIGINT (the command
    shuts Serve and its Ray down), killing it after 90 s."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", **(env or {})}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "cloudrl", "serve", *args, "--port",
                             str(port)], env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client, deadline = Client(port), time.time() + 240
        while time.time() < deadline:
            try:
                if client.call("GET", "/healthz")[0] == 200:
                    break
            except (OSError, ValueError):  # not up, or Serve's proxy's plain-text 404/503
                pass
            assert proc.poll() is None, "cloudrl serve exited"
            time.sleep(2)
        yield client
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_cloudrl_serve_command_answers_decisions(tmp_path):
    args = ["--policy", "heuristic:ffd", "--n-servers", str(N_SERVERS), "--workload", "poisson",
            "--state-db", str(tmp_path / "state.db")]
    with serve_command(args, _free_port()) as client:
        status, out = client.call("POST", "/v1/decide", _state(7, 20))
        assert status == 200 and out["policy"] == "ffd", out
