"""``cloudrl serve --site NAME --checkpoint DIR``: a site's learned policy on the scenario
decision service, its state built with the site's scenario (fleet, workload, market).

In process: the service's scenario is the site's (its name, its market's time zone and
publication time), and the served path from a request body takes the in-simulator
controller's controls on the site's own test-period episodes. Over real HTTP (Ray Serve on
a port of 8611-8619): the committed checkpoint answers with its controls, the price and
carbon rows of the request drive it, and ``GET /v1/scenario`` names the site and market.
Bad ``--site``, another site's checkpoint or ``--site`` with ``--scenario``: one line,
exit 2.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cloudrl.algorithms.distill.policy import load_controller
from cloudrl.sites.registry import get_site
from cloudrl.sites.scenario import site_scenario
from envs.scenario.sim import ScenarioSim
from serve_apps.scenario_config import ScenarioServing
from serve_apps.scenario_schemas import ScenarioState
from serve_apps.scenario_service import ScenarioService
from serve_apps.scenario_state import state_of
from tests.support import free_port
from tests.test_serve import Client, _deploy

ROOT = Path(__file__).resolve().parents[1]
SITE = "de_lu"
CKPT = str(ROOT / "checkpoints" / "sites" / SITE)
TOKEN = "site-token-123456"


def _sim_at(seed: int, decisions: int) -> ScenarioSim:
    """The site's test-part scenario after ``decisions`` of its learned policy."""
    sim = ScenarioSim(site_scenario(get_site(SITE), "temporal", "test"))
    sim.reset(seed)
    ctrl = load_controller(CKPT)
    ctrl.reset(sim)
    while decisions > 0 or sim.t % sim.cfg.decision_ticks:
        if sim.t % sim.cfg.decision_ticks == 0:
            sim.set_controls(*ctrl.decide(sim))
            decisions -= 1
        sim.tick()
    return sim


def test_the_service_builds_its_state_with_the_sites_scenario_and_decides_as_the_sim():
    service = ScenarioService(ScenarioServing(name="scarcity_spikes", site=SITE,
                                              policy=f"learned:{CKPT}"))
    info = service.info()
    assert info["scenario"] == f"{SITE}-temporal-test" and info["site"] == SITE
    assert info["market"]["timezone"] == "Europe/Berlin"
    assert info["market"]["publish_local"] == "12:00"
    sim = ScenarioSim(site_scenario(get_site(SITE), "temporal", "test"))
    sim.reset(1_000_017)
    in_sim = load_controller(CKPT)
    in_sim.reset(sim)
    seen = []

    async def decisions(n: int) -> None:
        while len(seen) < n:
            if sim.t % sim.cfg.decision_ticks == 0:
                state = ScenarioState.model_validate_json(json.dumps(state_of(sim)))
                want = in_sim.decide(sim)
                out = await service.decide(state)
                assert not out.fallback and out.policy == "learned"
                assert out.release_util == want[0], sim.t
                assert out.ready_cores == pytest.approx(want[1], rel=1e-12, abs=1e-9), sim.t
                seen.append(want)
                sim.set_controls(*want)
            sim.tick()

    asyncio.run(decisions(48))  # the first half day, every decision from its request body
    assert len(set(seen)) > 1


@pytest.fixture(scope="module")
def served(ray_session, tmp_path_factory):
    from ray import serve

    db = str(tmp_path_factory.mktemp("serve_site") / "state.db")
    port = free_port(range(8611, 8620))
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _deploy({"policy": "heuristic:power_aware", "env": {"n_servers": 8}, "state_db": db,
             "auth_token": TOKEN, "decide_requires_token": True, "num_cpus": 0.0,
             "max_body_bytes": 400_000,
             "scenario": {"name": "scarcity_spikes", "site": SITE,
                          "policy": f"learned:{CKPT}"}})
    yield Client(port)
    serve.shutdown()


def test_serve_site_answers_the_checkpoints_controls_over_http(served):
    status, info = served.call("GET", "/v1/scenario")
    assert status == 200 and info["site"] == SITE
    assert info["market"]["publish_local"] == "12:00"
    sim = _sim_at(1_000_041, 70)
    body = state_of(sim)
    status, out = served.call("POST", "/v1/scenario/decide", body, token=TOKEN)
    assert status == 200, out
    assert out["policy"] == "learned" and out["fallback"] is False
    release, ready = load_controller(CKPT).decide(sim)
    assert out["release_util"] == release
    assert out["ready_cores"] == pytest.approx(ready, rel=1e-12, abs=1e-9)
    # the request's price and carbon rows are what the policy reads: the same state with
    # other rows is decided from them (a valid body either way), never a 5xx
    other = json.loads(json.dumps(body))
    other["price_fc"] = [p * 7.0 + 300.0 for p in other["price_fc"]]
    other["carbon_fc"] = [c * 0.2 for c in other["carbon_fc"]]
    other["price_now"], other["carbon_now"] = other["price_fc"][0], other["carbon_fc"][0]
    ScenarioState.model_validate(other)
    status2, out2 = served.call("POST", "/v1/scenario/decide", other, token=TOKEN)
    assert status2 == 200 and out2["policy"] == "learned", out2
    status3, _ = served.call("POST", "/v1/scenario/decide", {"price": "cheap"}, token=TOKEN)
    assert 400 <= status3 < 500


@pytest.mark.parametrize(("argv", "words"), [
    (["--site", "atlantis"], "--site: unknown site 'atlantis'"),
    (["--site", "caiso", "--site-split", "decade"], "--site-split"),
    (["--site", "de_lu", "--scenario", "scarcity_spikes"], "--site"),
    (["--site", "caiso", "--checkpoint", CKPT], "trained on scenario 'de_lu-temporal-train'"),
])
def test_bad_site_serving_is_one_line_exit_2(argv, words):
    # a subprocess: a Ray session earlier in this process may have patched stderr
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cloudrl", "serve", *argv, "--port", "8619"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and words in err, err
