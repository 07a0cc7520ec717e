"""Decision share by hour of day: binning, counts, plot and MLflow artifacts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cloudrl.algorithms.hierarchical.policy import HierarchicalPolicy
from cloudrl.algorithms.hierarchical.report import (
    decision_shares,
    hour_of_day,
    log_decision_shares,
)
from cloudrl.algorithms.hierarchical.supervisors import FixedSupervisor, RuleSupervisor
from cloudrl.heuristics import make_heuristic
from envs.cluster_env import ClusterSchedulingEnv
from envs.observation import MACRO_TAIL

ENV = {"n_servers": 8, "workload": "google_v2_like", "sim": {"episode_length": 90}}


@pytest.mark.parametrize("hour", [0, 5, 12, 23])
def test_hour_of_day_reads_the_time_features(hour: int) -> None:
    macro = np.zeros(12 + len(MACRO_TAIL), dtype=np.float32)
    phase = 2 * math.pi * (hour + 0.5) / 24
    macro[12 + MACRO_TAIL.index("time_sin")] = math.sin(phase)
    macro[12 + MACRO_TAIL.index("time_cos")] = math.cos(phase)
    assert hour_of_day(macro) == hour


def test_counts_are_one_per_decision_in_the_hours_the_episode_covers() -> None:
    env = ClusterSchedulingEnv(ENV)
    policy = HierarchicalPolicy(FixedSupervisor(1), [make_heuristic("power_aware"),
                                                     make_heuristic("sjf")], k=9)
    counts = decision_shares(policy, env, [1_000_000, 1_000_001])
    assert counts.shape == (24, 2)
    assert counts[:, 0].sum() == 0 and counts[:, 1].sum() == 2 * 10  # 90 ticks / 9
    # 90 one-minute ticks span at most 3 hour bins per episode
    assert 1 <= (counts.sum(axis=1) > 0).sum() <= 6


def test_decision_share_plot_and_counts_go_to_mlflow(tmp_path) -> None:
    from cloudrl.tracking import open_run

    env = ClusterSchedulingEnv(ENV)
    policy = HierarchicalPolicy(RuleSupervisor(load_threshold=0.2),
                                [make_heuristic("power_aware"), make_heuristic("sjf")], k=5)
    counts = {"google_v2_like": decision_shares(policy, env, [1_000_000])}
    client, run_id = open_run(f"sqlite:///{tmp_path}/mlflow.db", "hier-test", "r", {})
    png = log_decision_shares(client, run_id, counts, ["power_aware", "sjf"], tmp_path / "o")
    assert png.stat().st_size > 1000
    artifacts = {a.path for a in client.list_artifacts(run_id, "hierarchy")}
    assert artifacts == {"hierarchy/decision_share.png", "hierarchy/decision_share.json"}
    metrics = client.get_run(run_id).data.metrics
    assert metrics["share_google_v2_like_0"] + metrics["share_google_v2_like_1"] == \
        pytest.approx(1.0)
    assert metrics["share_google_v2_like_1"] == pytest.approx(
        counts["google_v2_like"][:, 1].sum() / 18)
