"""Steering the learned policy and rolling it out: ES on a per-trace objective keeps its
best validation point, the nested label rounds, the scenario canary's promotion and
rollback (in the replica and over real HTTP on Ray Serve), and the whole loop with
``--start`` and ``--canary``."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.steer.loop import _round_sizes
from envs.scenario.catalog import load_scenario
from serve_apps.scenario_canary import CanaryError, CanaryRequest, ScenarioRollout
from serve_apps.scenario_config import ScenarioServing
from serve_apps.scenario_schemas import ScenarioState
from serve_apps.scenario_service import ScenarioService
from serve_apps.scenario_state import state_of

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "checkpoints" / "steering" / "tiny_start"
TOKEN = "steer-canary-token-0042"


@given(st.integers(1, 1000), st.integers(1, 6), st.lists(st.integers(1, 999), max_size=3))
@settings(max_examples=60, deadline=None)
def test_round_sizes_hit_every_snapshot(total, rounds, snaps):
    snaps = tuple(s for s in snaps if s < total)
    sizes = _round_sizes(total, rounds, snaps)
    ends = np.cumsum(sizes)
    assert sum(sizes) == total and all(s > 0 for s in sizes)
    assert set(snaps) <= set(ends.tolist())
    assert len(sizes) <= rounds + len(snaps)


def test_es_on_a_trace_objective_keeps_its_best_validation_point(tmp_path):
    """The objective here is the share of ticks with every server active (a per-tick
    property, not the cost); the kept weights, replayed, score what the search recorded."""
    from cloudrl.algorithms.distill.policy import load_controller
    from cloudrl.protocol import validation_seeds
    from cloudrl.steer.finetune import SteerES, save_steered, steer_policy
    from cloudrl.steer.trace import record
    from envs.scenario.sim import ScenarioSim

    scn = load_scenario("tiny")

    def objective(trs):
        return np.array([float(t.ticks["active"].mean()) for t in trs])

    es = SteerES(iterations=3, pairs=2, seeds_per_candidate=1, n_val_seeds=2, eval_every=1,
                 sigma=0.05, lr=0.05, run_seed=4)
    res = steer_policy(scn, START, objective, es, log=lambda s: None)
    vals = [h["val"] for h in res.history if "val" in h]
    assert len(vals) == 4 and res.val_start == vals[0]
    assert res.val_kept == min(vals) <= res.val_start
    assert res.episodes == es.episodes() == 3 * 2 * 2 * 1 + 4 * 2
    path = save_steered(res, START, tmp_path / "steered", scn, es, "active share")
    sim = ScenarioSim(scn)
    ctrl = load_controller(path)
    again = objective([record(sim, ctrl, s) for s in validation_seeds(2)]).mean()
    assert again == pytest.approx(res.val_kept, abs=1e-9)
    man = json.loads((path / "manifest.json").read_text())
    assert man["kept_iteration"] == res.kept_iteration and man["init_checkpoint"] == str(START)


def _states(seed: int, n: int) -> list[ScenarioState]:
    from envs.scenario.sim import ScenarioSim

    sim = ScenarioSim(load_scenario("tiny"))
    sim.reset(seed)
    out = []
    while not sim.done and len(out) < n:
        if sim.t % sim.cfg.decision_ticks == 0:
            out.append(ScenarioState.model_validate_json(json.dumps(state_of(sim))))
        sim.tick()
    return out


def _rollout() -> ScenarioRollout:
    return ScenarioRollout(ScenarioService(ScenarioServing(name="tiny", policy="signal_aware")))


def test_canary_routes_its_share_and_is_promoted_after_its_decisions():
    import asyncio

    ro = _rollout()
    rep = ro.handle(CanaryRequest(policy=f"learned:{START}", weight=0.25, promote_after=7))
    assert rep["canary"] == f"learned:{START}" and rep["events"][-1]["event"] == "started"
    states = _states(11, 40)

    async def play():
        return [await ro.decide(s) for s in states]

    answers = asyncio.run(play())
    # a quarter of the requests until the 7th canary decision (request 27) promotes it
    assert [a.policy for a in answers[:28]].count("learned") == 7
    assert all(a.policy == "learned" for a in answers[28:])
    ev = ro.report()["events"][-1]
    assert ev["event"] == "promoted" and ev["decisions"] == 7 and ev["fallbacks"] == 0
    assert ro.report()["stable"] == f"learned:{START}" and ro.canary is None


def test_a_failing_canary_is_rolled_back_at_its_first_fallback_and_bad_input_named():
    import asyncio

    ro = _rollout()
    ro.handle(CanaryRequest(policy="python:serve_apps.scenario_faults:raising", weight=0.5,
                            promote_after=5))
    states = _states(12, 6)

    async def play():
        return [await ro.decide(s) for s in states]

    answers = asyncio.run(play())
    assert answers[1].fallback and "error" in (answers[1].reason or "")
    ev = ro.report()["events"][-1]
    assert ev["event"] == "rolled_back" and ev["decisions"] == 1
    assert "fallback 1 > max_fallbacks 0" in ev["reason"]
    assert ro.report()["stable"] == "signal_aware" and not any(a.fallback for a in answers[2:])
    with pytest.raises(CanaryError, match="^action: no canary"):
        ro.handle(CanaryRequest(action="promote"))
    with pytest.raises(CanaryError, match="^policy: "):
        ro.handle(CanaryRequest(policy="learned:/nonexistent/checkpoint"))
    with pytest.raises(CanaryError, match="^policy: give a policy"):
        ro.handle(CanaryRequest())


def _http(url: str, method: str = "GET", body=None, token: str | None = TOKEN):
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, None if body is None else json.dumps(body).encode(),
                                 headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_canary_over_real_http_on_serve(ray_session, tmp_path):
    from ray import serve

    from tests.test_serve import _deploy
    from tests.test_serve_scenario import _port

    port = _port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        _deploy({"policy": "heuristic:power_aware",
                 "env": {"n_servers": 8, "workload": "poisson"},
                 "state_db": str(tmp_path / "state.db"), "auth_token": TOKEN, "num_cpus": 0.0,
                 "scenario": {"name": "tiny", "policy": "signal_aware"}})
        url = f"http://127.0.0.1:{port}/v1/scenario/canary"
        body = {"policy": f"learned:{START}", "weight": 0.5, "promote_after": 3}
        assert _http(url, "POST", body, token=None)[0] == 401  # no token: nothing changes
        assert _http(url, token=None)[0] == 401
        code, err = _http(url, "POST", {**body, "policy": "learned:/no/such/dir"})
        assert code == 422 and err["errors"][0]["field"] == "policy"
        assert _http(url, "POST", {**body, "weight": 2})[0] == 422
        assert _http(url)[1]["canary"] is None
        code, rep = _http(url, "POST", body)
        assert code == 200 and rep["canary"] == f"learned:{START}"
        decide = f"http://127.0.0.1:{port}/v1/scenario/decide"
        policies = []
        for s in _states(13, 8):
            code, d = _http(decide, "POST", json.loads(s.model_dump_json()))
            assert code == 200
            policies.append(d["policy"])
        assert policies[:6] == ["signal_aware", "learned"] * 3
        rep = _http(url)[1]
        assert rep["stable"] == f"learned:{START}" and rep["canary"] is None
        assert rep["events"][-1]["event"] == "promoted" and policies[6:] == ["learned"] * 2
        assert _http(f"http://127.0.0.1:{port}/v1/scenario")[1]["policy"] == f"learned:{START}"
    finally:
        serve.shutdown()


@pytest.mark.slow
def test_loop_steers_the_learned_policy_and_rolls_it_out(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "cloudrl", "steer", "loop", "--scenario", "tiny",
         "--operators", "alice:class_fairness", "bob:toggle_cap>class_fairness@0.5",
         "--comparisons", "40", "--rounds", "1", "--snapshots", "20", "--pool-heuristic",
         "4", "--pool-mpc", "0", "--pool-seeds", "1", "--pool-learned", "2",
         "--search-heuristic", "3", "--search-mpc", "0", "--val-seeds", "1",
         "--n-test-seeds", "2", "--members", "2", "--steps", "30", "--start", str(START),
         "--es-iterations", "1", "--es-pairs", "1", "--es-seeds", "1",
         "--drift-threshold", "-1", "--canary", "alice", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["learner_saw_utilities"] is False
    assert rep["pool_episodes"] == 8  # the run-at-once corner, 4 random points, 3 learned
    st_ = rep["steered_learned"]
    assert set(st_) == {"alice", "bob", "alice@20", "bob@20", "alice:stale", "bob:stale"}
    assert {st_[k]["labels"] for k in st_} == {20, 40}
    learned = [r for r in rep["rows"] if r["family"] == "learned"]
    assert {(r["operator"], r["policy"]) for r in learned} >= {
        ("alice", "default"), ("alice", "hidden"), ("alice", "steered"), ("bob@20", "steered")}
    assert all(r["utility"].split(">")[-1].startswith("class_fairness") for r in learned)
    assert rep["drift"]["bob"]["retrained"] is True  # threshold -1: always retrains
    can = rep["canary"]
    assert can["outcome"] in ("promoted", "rolled_back") and can["reason"]
    assert can["policy"].startswith("learned:") and "mlartifacts" in can["policy"]
    if can["outcome"] == "promoted":
        assert can["canary_decisions"] == 20 and can["champion"] == can["registered_version"]
