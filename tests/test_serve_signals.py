"""``/v1/decide`` on a policy that observes exogenous signals (price, carbon, solar, forecasts).

* The observation the service builds from a request equals the env's own, bit for bit: a
  real env with signals is stepped, each state is sent through JSON (``env_state_of``) and
  observed the service's way (``ServedPolicy.observe``).
* Over real HTTP on Serve (its own Ray temp dir when this module starts Ray; ports
  8731-8739): the documented example, states of real episodes (the in-process action of the
  env's own observation, always feasible), a schema-driven fuzz whose accepted states all get
  actions feasible under the service's own mask, broken signals (wrong forecast lengths,
  NaN/inf, negative carbon or solar, missing or unexpected fields) answered 422 naming the
  field and never 5xx, a policy without signals that refuses them, and a checkpoint trained
  with signals served as a canary.
* ``cloudrl serve --config serve_apps/signals_service.yaml`` answers the documented request
  (slow).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudrl.cli import main
from cloudrl.heuristics import make_heuristic
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from serve_apps.runtime import ServedPolicy
from serve_apps.schemas import DecideRequest
from serve_apps.service_config import ServiceConfig
from serve_apps.state import StateError, env_state_of, signals_of
from tests.support import free_port
from tests.test_serve import Client, _deploy, serve_command

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "serve_apps" / "signals_service.yaml"
SERVING_DOC = ROOT / "docs" / "tasks" / "serving-signals.md"
PORTS = range(8731, 8740)
TOKEN = "signals-token-123456"
TINY_PPO = {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1}
SOLAR = {"solar_kwp": 2.0, "solar_source": "synthetic"}


def _service_env() -> dict:
    """The env of the documented signals service (serve_apps/signals_service.yaml)."""
    return yaml.safe_load(CONFIG.read_text())["env"]


def _json(body: dict) -> dict:
    return json.loads(json.dumps(body))


# ------------------------------------------------------------ observation equality
OBS_CASES = {
    "default signals (60 s ticks, 1440-tick forecasts)": ({}, {"episode_length": 70}),
    "solar, forecast error 0.3, 300 s ticks": ({**SOLAR, "forecast_error": 0.3},
                                              {"tick_seconds": 300, "episode_length": 80}),
    "perfect forecasts, 2 h ticks (forecast issued every tick)": (
        {"forecast_error": 0.0, "horizon_hours": 5}, {"tick_seconds": 7200,
                                                      "episode_length": 40}),
    "the documented service": (None, None),
}


@pytest.mark.parametrize("env_cls", [ClusterBranchingEnv, ClusterSchedulingEnv])
@pytest.mark.parametrize("case", list(OBS_CASES))
def test_service_observation_is_the_envs_bit_for_bit(env_cls, case):
    signals, sim = OBS_CASES[case]
    cfg = _service_env() if signals is None else {"n_servers": 8, "workload": "poisson",
                                                  "sim": sim, "signals": signals}
    env = env_cls(cfg)
    interface = "branching" if env_cls is ClusterBranchingEnv else "flat"
    served = ServedPolicy("heuristic:power_aware", "v1", env.config, interface)
    actor = make_heuristic("ffd", interface)
    for seed in (0, 7):
        obs, _ = env.reset(seed=seed)
        for t in range(env.config.sim.episode_length + 1):
            body = _json(env_state_of(env))
            assert len(body["signals"]["price_fc"]) == served.signals.horizon_ticks
            got = served.observe(DecideRequest.model_validate(body))
            for key in obs:
                assert got[key].dtype == obs[key].dtype, (case, t, key)
                assert np.array_equal(got[key], obs[key]), (case, seed, t, key)
            if t < env.config.sim.episode_length:
                obs, *_ = env.step(actor.act(obs))


def test_policy_without_signals_refuses_them_and_with_signals_requires_them():
    plain = ServedPolicy("heuristic:power_aware", "v1", ServiceConfig(
        env={"n_servers": 6, "workload": "poisson"}).env, "branching")
    env = ClusterBranchingEnv(_service_env())
    env.reset(seed=1)
    body = _json(env_state_of(env))
    body["servers"] = [{"tier": plain.fleet.tier_names[t]} for t in plain.fleet.tier.tolist()]
    with pytest.raises(StateError) as err:
        plain.observe(DecideRequest.model_validate(body))
    assert err.value.field == "signals" and "leave signals out" in err.value.message
    body.pop("signals")
    assert plain.observe(DecideRequest.model_validate(body))["macro"].shape == \
        plain.probe_obs["macro"].shape
    with_signals = ServedPolicy("heuristic:power_aware", "v1", env.config, "branching")
    with pytest.raises(StateError) as err:
        with_signals.observe(DecideRequest.model_validate(_json(env_state_of(env)) | {
            "signals": None}))
    assert err.value.field == "signals" and "observes signals" in err.value.message


def test_signals_of_needs_a_reset_env_with_signals():
    with pytest.raises(ValueError, match="no signals"):
        signals_of(ClusterBranchingEnv({"n_servers": 4}))


# ------------------------------------------------------------ the service over HTTP
def _port() -> int:
    return free_port(PORTS)


def _service_config(db: str) -> dict:
    cfg = yaml.safe_load(CONFIG.read_text())
    return {**cfg, "state_db": db, "auth_token": TOKEN, "num_cpus": 0.0,
            "failure_threshold": 2, "cooldown_s": 1.0, "model_timeout_s": 2.0}


@pytest.fixture(scope="module")
def own_ray():
    """This module's Ray (its own temp dir) unless a Ray session is already up."""
    import ray

    if ray.is_initialized():
        yield
        return
    temp = tempfile.mkdtemp(prefix="crl-sig-")  # short: Ray's socket paths have a limit
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def service(own_ray, tmp_path_factory):
    """(client of the signals service on /, client of a policy without signals on
    /plain/), on one Serve instance."""
    from ray import serve

    from serve_apps.app import build_app

    db_dir = tmp_path_factory.mktemp("serve_signals")
    port = _port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        _deploy(_service_config(str(db_dir / "state.db")))
        plain = {"policy": "heuristic:power_aware", "env": {"n_servers": 6,
                                                          "workload": "poisson"},
                 "state_db": str(db_dir / "plain.db"), "num_cpus": 0.0}
        serve.run(build_app(plain), name="plain", route_prefix="/plain")
        client = Client(port)
        yield client, PrefixedClient(port, "/plain")
    finally:
        serve.shutdown()


class PrefixedClient(Client):
    def __init__(self, port: int, prefix: str) -> None:
        super().__init__(port)
        self.base += prefix


def _env_at(seed: int, steps: int) -> tuple[ClusterBranchingEnv, dict]:
    """The documented service's env ``steps`` ticks into episode ``seed`` (power_aware)."""
    env = ClusterBranchingEnv(_service_env())
    policy = make_heuristic("power_aware", "branching")
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        obs, *_ = env.step(policy.act(obs))
    return env, obs


def _feasible(raw: list[int], mask: np.ndarray, sizes: list[int]) -> bool:
    offset = 0
    if len(raw) != len(sizes):
        return False
    for d, size in enumerate(sizes):
        if not (0 <= raw[d] < size and mask[offset + raw[d]] > 0):
            return False
        offset += size
    return True


def _doc_example() -> dict:
    """The ``/v1/decide`` request with signals that docs/tasks/serving-signals.md shows."""
    text = SERVING_DOC.read_text()
    m = re.search(r"<!-- signals-example -->\s*```json\n(.*?)```", text, re.S)
    assert m, "docs/tasks/serving-signals.md: no json block after <!-- signals-example -->"
    return json.loads(m.group(1))


def _shorter(body: dict) -> None:
    body["signals"]["price_fc"] = body["signals"]["price_fc"][:6]


def _nan(body: dict) -> None:
    body["signals"]["carbon_fc"][2] = math.nan


def _negative(body: dict) -> None:
    body["signals"]["carbon_now"] = -5.0


def _no_signals(body: dict) -> None:
    body.pop("signals")


def _no_solar(body: dict) -> None:
    body["signals"].pop("solar_fc_kw")


# the error examples docs/tasks/serving-signals.md shows: each edit of the example, and its field
DOC_ERRORS = [(_shorter, "signals.price_fc"), (_nan, "signals.carbon_fc[2]"),
              (_negative, "signals.carbon_now"), (_no_signals, "signals"),
              (_no_solar, "signals.solar_fc_kw")]


def test_the_documented_request_is_decided_and_its_errors_are_as_documented(service):
    client, _ = service
    example = _doc_example()
    status, out = client.call("POST", "/v1/decide", example)
    assert status == 200 and out["answered_by"] == "model", out
    layout = client.call("GET", "/v1/fleet")[1]
    assert layout["signals"]["horizon_ticks"] == len(example["signals"]["price_fc"]) == 8
    assert client.call("POST", "/v1/decide", layout["example"])[0] == 200
    doc = SERVING_DOC.read_text()
    for edit, field in DOC_ERRORS:
        body = json.loads(json.dumps(example))
        edit(body)
        raw = json.dumps(body, allow_nan=True).encode()
        status, out = client.call("POST", "/v1/decide", raw=raw)
        assert (status, out["errors"][0]["field"]) == (422, field), (edit.__name__, out)
        assert f"`{out['error']}`" in doc, f"the docs do not show: {out['error']}"


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), steps=st.integers(0, 192))
def test_states_of_real_episodes_get_the_in_process_feasible_action(service, seed, steps):
    client, _ = service
    env, obs = _env_at(seed, steps)
    body = env_state_of(env)
    status, out = client.call("POST", "/v1/decide", body)
    assert status == 200 and out["answered_by"] == "model", out
    raw = out["action"]["raw"]
    assert _feasible(raw, obs["action_mask"], env.branch_sizes)
    want = make_heuristic("power_aware", "branching").act(obs)
    assert raw == [int(a) for a in want]
    status, batch = client.call("POST", "/v1/decide/batch", {"states": [body, body]})
    assert status == 200 and [d["action"]["raw"] for d in batch["decisions"]] == [raw, raw]


# broken signals: (edit of a valid request, the field the 422 names)
def _breakers(h: int) -> st.SearchStrategy:
    arrays = st.sampled_from(["price_fc", "carbon_fc", "solar_fc_kw"])
    bad_len = st.one_of(st.integers(1, h - 1), st.integers(h + 1, 3 * h))
    non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
    return st.one_of(
        st.tuples(st.just("length"), arrays, bad_len),
        st.tuples(st.just("non_finite"), st.sampled_from(
            ["price_now", "carbon_now", "solar_now_kw", "price_fc", "carbon_fc",
             "solar_fc_kw"]), non_finite),
        st.tuples(st.just("negative"), st.sampled_from(
            ["carbon_now", "solar_now_kw", "carbon_fc", "solar_fc_kw"]),
            st.floats(-1e6, -1e-6)),
        st.tuples(st.just("too_big"), st.sampled_from(["price_now", "carbon_now"]),
                  st.floats(1e5, 1e300)),
        st.tuples(st.just("missing"), st.sampled_from(
            ["signals", "price_now", "carbon_now", "price_fc", "carbon_fc", "solar_now_kw",
             "solar_fc_kw"]), st.none()),
        st.tuples(st.just("wrong_type"), st.sampled_from(["price_now", "price_fc",
                                                          "signals"]),
                  st.sampled_from(["12.5", True, None, [], {}])),
        st.tuples(st.just("unknown"), st.just("signals"), st.just("wind_kw")))


def _break(body: dict, kind: str, name: str, value: object, rng: np.random.Generator
           ) -> tuple[dict, str]:
    sig = body["signals"]
    if kind == "length":
        sig[name] = [float(sig[name][0])] * int(value)
        return body, f"signals.{name}"
    if name == "signals":
        if kind == "missing":
            body.pop("signals")
        elif kind == "unknown":
            sig[value] = 1.0
            return body, "signals.wind_kw"
        else:
            body["signals"] = value
        return body, "signals"
    if kind == "missing":
        sig.pop(name)
        return body, f"signals.{name}"
    if kind == "wrong_type" and name == "price_fc":
        body["signals"]["price_fc"] = value
        return body, "signals.price_fc"
    if isinstance(sig[name], list):
        i = int(rng.integers(len(sig[name])))
        sig[name][i] = value
        return body, f"signals.{name}[{i}]"
    sig[name] = value
    return body, f"signals.{name}"


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), steps=st.integers(0, 60), broken=_breakers(8),
       in_batch=st.booleans())
def test_broken_signals_answer_422_naming_the_field_never_5xx(service, seed, steps, broken,
                                                               in_batch):
    client, _ = service
    env, _ = _env_at(seed, steps)
    body, field = _break(env_state_of(env), *broken, np.random.default_rng(seed))
    path, prefix = "/v1/decide", ""
    if in_batch:
        good = env_state_of(env)
        body, path, prefix = {"states": [good, body]}, "/v1/decide/batch", "states[1]."
    status, out = client.call("POST", path, raw=json.dumps(body, allow_nan=True).encode())
    assert status == 422, (broken, out)
    fields = [e["field"] for e in out["errors"]]
    assert all(f.startswith(prefix + "signals") for f in fields), (broken, fields)
    assert any(f == prefix + field or f.startswith((prefix + field + ".", prefix + field + "["))
               for f in fields), (broken, fields)
    assert out["error"]


def test_schema_driven_states_get_feasible_actions_never_5xx(service):
    """Schemathesis builds requests from the service's OpenAPI schema (which states the
    fleet and the signals it requires); every accepted one gets an action feasible under
    the mask of the service's own observation of that state."""
    import urllib.request

    import schemathesis
    from schemathesis import GenerationMode

    client, _ = service
    with urllib.request.urlopen(client.base + "/openapi.json", timeout=60) as resp:
        spec = json.loads(resp.read())
    sig = spec["components"]["schemas"]["Signals"]
    assert sig["properties"]["price_fc"]["minItems"] == 8 == \
        sig["properties"]["price_fc"]["maxItems"]
    assert "signals" in spec["components"]["schemas"]["DecideRequest"]["required"]
    assert {"solar_now_kw", "solar_fc_kw"} <= set(sig["required"])
    local = ServedPolicy("heuristic:power_aware", "local",
                         ServiceConfig.model_validate(yaml.safe_load(CONFIG.read_text())).env,
                         "branching")
    statuses: Counter[int] = Counter()
    answered: Counter[str] = Counter()
    schema = schemathesis.openapi.from_dict(spec)

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=schema["/v1/decide"]["POST"].as_strategy(GenerationMode.POSITIVE))
    def fuzz(case) -> None:
        status, out = client.call("POST", "/v1/decide", case.body)
        statuses[status] += 1
        assert status < 500, out
        if status == 200:
            answered[out["answered_by"]] += 1
            obs = local.observe(DecideRequest.model_validate(case.body))
            assert local.is_feasible(np.asarray(out["action"]["raw"]), obs), out

    fuzz()
    total = sum(statuses.values())
    print(f"schemathesis /v1/decide with signals: {dict(statuses)}, {dict(answered)}")
    assert total >= 20 and statuses[200] / total >= 0.5, statuses
    assert answered["model"] > 0, answered


def test_a_policy_without_signals_refuses_them_over_http(service):
    _, plain = service
    layout = plain.call("GET", "/v1/fleet")[1]
    assert layout["signals"] is None and "signals" not in layout["example"]
    body = _doc_example()
    status, out = plain.call("POST", "/v1/decide", body)
    assert status == 422 and out["errors"][0]["field"] == "signals", out
    assert "leave signals out" in out["error"]
    body.pop("signals")
    status, out = plain.call("POST", "/v1/decide", body)
    assert status == 200 and out["answered_by"] == "model", out


def test_checkpoint_trained_with_signals_is_served(service, tmp_path, monkeypatch):
    client, _ = service
    monkeypatch.chdir(tmp_path)  # the train command's side outputs stay in the tmp dir
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"algo": "ppo", "env": _service_env()}))
    out_dir = tmp_path / "ppo"
    assert main(["train", "--config", str(cfg), "--env-steps", "64", "--hparams",
                 json.dumps(TINY_PPO), "--out", str(out_dir)]) == 0
    status, out = client.call("POST", "/v1/rollout", {"action": "canary",
                                                      "policy": str(out_dir), "weight": 1.0},
                              token=TOKEN)
    assert status == 200, out
    try:
        env = ClusterSchedulingEnv(_service_env())
        heuristic = make_heuristic("power_aware", "flat")
        obs, _ = env.reset(seed=3)
        for t in range(30):
            status, answer = client.call("POST", "/v1/decide", env_state_of(env))
            assert status == 200 and answer["answered_by"] == "model", answer
            assert answer["policy"].startswith("ppo:")
            raw = answer["action"]["raw"]
            assert isinstance(raw, int) and obs["action_mask"][raw] > 0, (t, raw)
            obs, *_ = env.step(heuristic.act(obs))
        status, out = client.call("POST", "/v1/decide", {**env_state_of(env), "signals": None})
        assert status == 422 and out["errors"][0]["field"] == "signals"
        counters = client.call("GET", "/v1/policy")[1]["canary"]["counters"]
        assert counters.get("fallback", 0) == 0 and counters["breaker"] == "closed", counters
    finally:
        client.call("POST", "/v1/rollout", {"action": "rollback"}, token=TOKEN)
    # a service whose stable policy observes no signals refuses it as a canary
    from serve_apps.rollout import Rollout
    from serve_apps.runtime import PolicySpecError

    plain = Rollout("heuristic:power_aware", ServiceConfig(env={
        k: v for k, v in _service_env().items() if k != "signals"}).env, "flat",
        tmp_path / "plain.db")
    with pytest.raises(PolicySpecError, match="another fleet, queue or signals"):
        plain.load_canary(str(out_dir))


# ------------------------------------------------------------ the CLI
@pytest.mark.slow
def test_cloudrl_serve_with_a_signals_config_answers_the_documented_request(tmp_path):
    ray_tmp = tempfile.mkdtemp(prefix="crl-sigcli-")
    args = ["--config", str(CONFIG), "--state-db", str(tmp_path / "state.db")]
    try:
        with serve_command(args, _port(), {"RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(ROOT)},
                           cwd=str(tmp_path)) as client:
            status, out = client.call("POST", "/v1/decide", _doc_example())
            assert status == 200 and out["policy"] == "power_aware", out
            status, out = client.call("POST", "/v1/decide", {
                k: v for k, v in _doc_example().items() if k != "signals"})
            assert status == 422 and out["errors"][0]["field"] == "signals", out
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
