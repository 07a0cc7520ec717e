"""power_aware's duration-aware placement knob (long_job_ticks, long_tier_weight).

Off by default (long_job_ticks = 0): the episode is the same action for action; on, a
job at least that long is scored with long_tier_weight; the knob round-trips through
the tuned-parameter config and is in the tuning search space.
"""

from __future__ import annotations

import numpy as np
import pytest

from cloudrl.headline.tuning import default_point, search_space
from cloudrl.heuristics.power_aware import PowerAwareConfig, PowerAwareConsolidation
from cloudrl.heuristics.tuned import power_aware_config
from envs.cluster_env import ClusterBranchingEnv
from tests.test_heuristics import make_obs

# server 0: efficient and empty; server 1: less efficient, half full
SERVERS = [{"wpc": 0.5, "tier": 0}, {"wpc": 1.0, "tier": 1, "free": 0.5}]


@pytest.mark.parametrize("duration, server", [(0.3, 0), (2.0, 1)])
def test_long_jobs_use_their_own_tier_weight(duration: float, server: int) -> None:
    obs = make_obs(SERVERS, [{"cpu": 0.2, "duration": duration}], "flat")
    # default: tier first, every job to the efficient server
    assert PowerAwareConsolidation("flat").act(obs) == 0
    # long jobs (>= 100 ticks; durations in the observation are ticks / 100) best fit
    knob = PowerAwareConsolidation("flat", long_job_ticks=100.0, long_tier_weight=0.0)
    assert knob.act(obs) == server
    # and in the branching interface, slot 0's server choice
    b_obs = make_obs(SERVERS, [{"cpu": 0.2, "duration": duration}], "branching")
    assert PowerAwareConsolidation("branching", long_job_ticks=100.0,
                                   long_tier_weight=0.0).act(b_obs)[0] == server


def _episode(policy: PowerAwareConsolidation, seed: int = 3) -> tuple[list, float]:
    env = ClusterBranchingEnv({"n_servers": 12, "workload": "google_v2_like",
                               "sim": {"episode_length": 150}})
    obs, _ = env.reset(seed=seed)
    policy.reset()
    actions, done = [], False
    while not done:
        action = policy.act(obs)
        actions.append(np.asarray(action).tolist())
        obs, _, term, trunc, _ = env.step(action)
        done = term or trunc
    return actions, env.sim.stats.energy_j


def test_knob_off_leaves_the_episode_identical_and_on_changes_it() -> None:
    base = _episode(PowerAwareConsolidation("branching"))
    # long_job_ticks = 0 (off) whatever long_tier_weight; a threshold no job reaches
    assert _episode(PowerAwareConsolidation("branching", long_tier_weight=0.0)) == base
    assert _episode(PowerAwareConsolidation("branching", long_job_ticks=1e9,
                                            long_tier_weight=0.0)) == base
    # the same weight for long jobs is the same policy
    assert _episode(PowerAwareConsolidation("branching", long_job_ticks=1.0)) == base
    # a knob that acts changes the episode (so the checks above can fail)
    on = _episode(PowerAwareConsolidation("branching", long_job_ticks=1.0,
                                          long_tier_weight=0.0))
    assert on[0] != base[0]


def test_knob_round_trips_through_config_and_is_tuned() -> None:
    params = {"long_job_ticks": 60.0, "long_tier_weight": 0.1, "tier_weight": 10.0}
    cfg = power_aware_config(params)
    assert (cfg.long_job_ticks, cfg.long_tier_weight) == (60.0, 0.1)
    assert PowerAwareConfig().long_job_ticks == 0.0  # off by default
    with pytest.raises(ValueError, match="long_job_ticks must be >= 0"):
        power_aware_config({"long_job_ticks": -1.0})
    assert {"long_job_ticks", "long_tier_weight"} <= set(search_space("branching"))
    assert default_point("branching")["long_job_ticks"] == 0.0
