"""Prometheus metrics of the service and the loop: labels and values in process, and (slow)
scraped from Ray's metrics export endpoint of a running service."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from serve_apps.metrics import LATENCY_BUCKETS_MS, LoopMetrics, ServiceMetrics


def _value(snapshot: dict, name: str, **tags: str):
    hits = [s["value"] for s in snapshot[name]["samples"] if s["tags"] == tags]
    assert len(hits) <= 1
    return hits[0] if hits else None


def test_decisions_fallbacks_and_interventions_are_counted_per_version():
    m = ServiceMetrics()
    for version, by_model, reason in [("v1", True, None)] * 3 + [
            ("v2", True, None), ("v2", False, "nan"), ("v2", False, "breaker_open"),
            ("v2", False, "infeasible"), ("v1", False, "timeout")]:
        m.decision(version, by_model, reason, 1.0)
    snap = m.snapshot()
    assert snap["cloudrl_decisions"]["tag_keys"] == ["version", "answered_by"]
    assert _value(snap, "cloudrl_decisions", version="v1", answered_by="model") == 3
    assert _value(snap, "cloudrl_decisions", version="v1", answered_by="fallback") == 1
    assert _value(snap, "cloudrl_decisions", version="v2", answered_by="fallback") == 3
    assert _value(snap, "cloudrl_decide_fallbacks", version="v2", reason="breaker_open") == 1
    # an open breaker's fallback is not an intervention: the model was never asked
    interventions = {(s["tags"]["version"], s["tags"]["reason"]): s["value"]
                     for s in snap["cloudrl_shield_interventions"]["samples"]}
    assert interventions == {("v1", "timeout"): 1, ("v2", "infeasible"): 1, ("v2", "nan"): 1}
    # the Ray metric objects carry the same label keys as the mirror
    for recorded in (m.decisions, m.latency, m.fallbacks, m.interventions, m.canary_share):
        assert recorded.metric.info["tag_keys"] == recorded.tag_keys
        assert recorded.metric.info["name"] == recorded.name


def test_latency_histogram_buckets_are_prometheus_le_buckets():
    m = ServiceMetrics()
    for latency in (0.2, 0.5, 0.51, 4.9, 5.0, 7000.0):
        m.decision("v1", True, None, latency)
    h = _value(m.snapshot(), "cloudrl_decide_latency_ms", version="v1")
    assert h["count"] == 6 and h["sum"] == pytest.approx(7011.11)
    bounds = [*LATENCY_BUCKETS_MS, float("inf")]
    assert dict(zip(bounds, h["buckets"], strict=True)) == {
        0.5: 2, 1: 1, 2: 0, 5: 2, 10: 0, 20: 0, 50: 0, 100: 0, 200: 0, 500: 0, 1000: 0,
        5000: 0, float("inf"): 1}


def test_canary_share_gauge_follows_the_canary_and_zeroes_a_departed_one():
    m = ServiceMetrics()
    m.rollout_state("v2", 0.1, None)
    m.rollout_state("v2", 0.3, "v2")
    m.rollout_state(None, 0.0, "v2")
    m.rollout_state("v3", 0.2, None)
    shares = {s["tags"]["version"]: s["value"]
              for s in m.snapshot()["cloudrl_canary_share"]["samples"]}
    assert shares == {"v2": 0.0, "v3": 0.2}


def test_loop_metrics_reward_accuracy_per_model_version_and_pending_rows():
    m = LoopMetrics()
    m.reward_model(0.81, "2")
    m.reward_model(0.9, "3")
    m.reward_model(0.7, "3", split="new")
    m.pending(12)
    m.pending(0)
    snap = m.snapshot()
    assert _value(snap, "cloudrl_reward_model_accuracy", model_version="3",
                  split="validation") == 0.9
    assert _value(snap, "cloudrl_reward_model_accuracy", model_version="3", split="new") == 0.7
    assert _value(snap, "cloudrl_feedback_rows_pending") == 0.0
    assert m.reward_accuracy.metric.info["tag_keys"] == ("model_version", "split")


# ---------------------------------------------------------------- end to end (slow)
TOKEN = "metrics-token-1234"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        return resp.read().decode()


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The sum over Prometheus lines of ``name`` whose labels include ``labels``."""
    total, found = 0.0, False
    for line in text.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total, found = total + float(m.group(2)), True
    return total if found else None


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_metrics_appear_on_rays_metrics_endpoint_with_their_labels(tmp_path):
    import ray

    from tests.test_rollout_controller import _bodies
    from tests.test_serve import start_service

    def config(db: str) -> dict:
        return {"policy": "heuristic:power_aware", "interface": "branching",
                "env": {"n_servers": 8, "workload": "poisson"}, "state_db": db,
                "auth_token": TOKEN, "failure_threshold": 100, "num_cpus": 0.0}

    gen = start_service(tmp_path, config)
    client, _ = next(gen)
    try:
        early, late = _bodies()
        for _ in range(5):
            assert client.call("POST", "/v1/decide", early)[0] == 200
        assert client.call("POST", "/v1/rollout", {
            "action": "canary", "policy": "python:serve_apps.faults:nan", "weight": 1.0},
            token=TOKEN)[0] == 200
        for body in (early, late, late):
            assert client.call("POST", "/v1/decide", body)[0] == 200
        loop = LoopMetrics()  # set by the loop, from the driver
        loop.reward_model(0.875, "4")
        loop.pending(17)
        mirror = client.call("GET", "/v1/metrics")[1]
        assert _value(mirror["metrics"], "cloudrl_decide_fallbacks", version="v2",
                      reason="nan") == 2
        port = ray._private.worker.global_worker.node.metrics_export_port
        replica = {"WorkerId": mirror["worker_id"]}  # other services of the session differ
        driver = {"WorkerId": ray.get_runtime_context().get_worker_id()}
        want = [("ray_cloudrl_decisions_total", {"version": "v1", "answered_by": "model"}, 5),
                ("ray_cloudrl_decisions_total", {"version": "v2", "answered_by": "model"}, 1),
                ("ray_cloudrl_decide_fallbacks_total", {"version": "v2", "reason": "nan"}, 2),
                ("ray_cloudrl_shield_interventions_total", {"version": "v2", "reason": "nan"},
                 2),
                ("ray_cloudrl_decide_latency_ms_count", {"version": "v1"}, 5),
                ("ray_cloudrl_canary_share", {"version": "v2"}, 1.0),
                ("ray_cloudrl_rollout_transitions_total", {"event": "canary_started"}, 1)]
        want = [(name, {**labels, **replica}, v) for name, labels, v in want] + [
            ("ray_cloudrl_reward_model_accuracy", {"model_version": "4", "split": "validation",
                                                   **driver}, 0.875),
            ("ray_cloudrl_feedback_rows_pending", driver, 17)]
        deadline = time.monotonic() + 90  # Ray exports every few seconds
        while True:
            text = _scrape(port)
            got = [_sample(text, name, **labels) for name, labels, _ in want]
            if got == [v for *_, v in want] or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert got == [v for *_, v in want], list(zip(want, got, strict=True))
    finally:
        next(gen, None)
