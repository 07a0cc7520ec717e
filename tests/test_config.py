"""Config validation (errors name the offending field), EnvConfig shortcuts, fleet layout."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from envs.env_config import EnvConfig
from envs.fleet import Fleet, _tier_counts
from envs.sim import ClusterSim
from envs.sim_config import FleetConfig, SimConfig, TierConfig, default_tiers
from envs.workloads import (
    DeadlineConfig,
    GoogleV2LikeConfig,
    PoissonConfig,
    TraceReplayConfig,
    make_workload,
)


def error_of(config) -> tuple[str, list[tuple]]:
    with pytest.raises(ValidationError) as info:
        EnvConfig.coerce(config)
    return str(info.value), [e["loc"] for e in info.value.errors()]


# --------------------------------------------------------------------------- validation
def test_p_max_below_p_idle_names_the_tier_and_both_fields():
    with pytest.raises(ValidationError, match=r"tier 'hot': p_max_w \(50.0\) must be >= "
                                              r"p_idle_w \(100.0\)"):
        TierConfig(name="hot", cpu_cores=8, mem_gib=8, p_idle_w=100, p_max_w=50)
    tiers = [t.model_dump() for t in default_tiers()]
    tiers[1].update(p_idle_w=400.0, p_max_w=399.0)
    msg, locs = error_of({"sim": {"fleet": {"tiers": tiers}}})
    assert locs == [("sim", "fleet", "tiers", 1)]
    assert "'standard'" in msg and "p_max_w (399.0)" in msg and "p_idle_w (400.0)" in msg
    assert TierConfig(name="flat", cpu_cores=1, mem_gib=1, p_idle_w=5, p_max_w=5).p_max_w == 5


@pytest.mark.parametrize(("config", "loc"), [
    ({"sim": {"alpah": 1}}, ("sim", "alpah")),
    ({"sim": {"fleet": {"n_server": 3}}}, ("sim", "fleet", "n_server")),
    ({"workload": {"kind": "poisson", "rat": 2}}, ("workload", "poisson", "rat")),
    ({"seed": 3}, ("seed",)),
])
def test_unknown_field_is_an_error_naming_it(config, loc):
    msg, locs = error_of(config)
    assert locs == [loc]
    assert loc[-1] in msg and "Extra inputs are not permitted" in msg


@pytest.mark.parametrize("n", [-1, 0, 5000])
def test_n_servers_out_of_range_names_the_field(n):
    msg, locs = error_of({"n_servers": n})
    assert locs == [("sim", "fleet", "n_servers")] and str(n) in msg
    with pytest.raises(ValidationError, match="n_servers"):
        FleetConfig(n_servers=n)


def test_queue_window_larger_than_capacity_names_both():
    msg, locs = error_of({"sim": {"queue_window": 9, "queue_capacity": 8}})
    assert locs == [("sim",)]
    assert "queue_window (9) must be <= queue_capacity (8)" in msg
    assert SimConfig(queue_window=8, queue_capacity=8).queue_window == 8


@pytest.mark.parametrize("kind", ["uniform", "Poisson", ""])
def test_unknown_workload_kind_names_the_kind_and_the_choices(kind):
    msg, locs = error_of({"workload": kind})
    assert locs == [("workload",)]
    assert f"'{kind}'" in msg
    assert all(k in msg for k in ("'poisson'", "'google_v2_like'", "'trace'"))


def test_deadline_slack_must_be_ordered():
    with pytest.raises(ValidationError, match=r"slack_high \(1.0\) must be >= slack_low \(2.0\)"):
        DeadlineConfig(slack_low=2.0, slack_high=1.0)
    msg, locs = error_of({"workload": {"kind": "google_v2_like",
                                       "deadline": {"slack_low": 3, "slack_high": 0.5}}})
    assert locs == [("workload", "google_v2_like", "deadline")] and "slack_high" in msg
    msg, locs = error_of({"workload": {"kind": "poisson", "deadline": {"min_slack": 0}}})
    assert locs == [("workload", "poisson", "deadline", "min_slack")]
    assert DeadlineConfig(slack_low=1.0, slack_high=1.0).slack_high == 1.0


@pytest.mark.parametrize(("config", "loc"), [
    ({"workload": {"kind": "poisson", "cpu_low": 0.5, "cpu_high": 0.2}}, ("workload", "poisson")),
    ({"workload": {"kind": "poisson", "rate": 0}}, ("workload", "poisson", "rate")),
    ({"workload": {"kind": "google_v2_like", "diurnal_amplitude": 1.0}},
     ("workload", "google_v2_like", "diurnal_amplitude")),
    ({"sim": {"fleet": {"tiers": []}}}, ("sim", "fleet", "tiers")),
    ({"sim": {"fleet": {"initially_asleep": 1.5}}}, ("sim", "fleet", "initially_asleep")),
    ({"sim": {"standby_fraction": -0.1}}, ("sim", "standby_fraction")),
    ({"sim": {"wake_delay": -1}}, ("sim", "wake_delay")),
    ({"sim": {"tick_seconds": 0}}, ("sim", "tick_seconds")),
    ({"sim": {"queue_window": 65, "queue_capacity": 100}}, ("sim", "queue_window")),
])
def test_other_invalid_values_are_located(config, loc):
    assert error_of(config)[1] == [loc]


def test_duplicate_tier_names_are_rejected():
    tier = TierConfig(name="same", cpu_cores=4, mem_gib=4, p_idle_w=10, p_max_w=20)
    with pytest.raises(ValidationError, match="duplicate tier names"):
        FleetConfig(tiers=[tier, tier])


def test_configs_are_frozen():
    cfg = SimConfig()
    with pytest.raises(ValidationError):
        cfg.alpha = 1.0


# --------------------------------------------------------------------------- EnvConfig
def test_defaults_run_and_have_the_documented_values():
    cfg = EnvConfig.coerce(None)
    assert cfg == EnvConfig()
    assert cfg.sim.fleet.n_servers == 15 and [t.name for t in cfg.sim.fleet.tiers] == [
        "efficient", "standard", "performance"]
    assert isinstance(cfg.workload, PoissonConfig) and cfg.seed_pool is None
    assert (cfg.sim.queue_window, cfg.sim.queue_capacity, cfg.sim.wake_delay) == (8, 64, 3)


def test_shortcuts_fill_the_nested_values():
    cfg = EnvConfig.coerce({"n_servers": 7, "workload": "google_v2_like",
                            "sim": {"wake_delay": 1, "fleet": {"fleet_seed": 4}},
                            "seed_pool": [5, 6]})
    assert cfg.sim.fleet.n_servers == 7
    assert cfg.sim.fleet.fleet_seed == 4 and cfg.sim.wake_delay == 1  # nested values kept
    assert isinstance(cfg.workload, GoogleV2LikeConfig)
    assert cfg.workload == GoogleV2LikeConfig()
    assert cfg.seed_pool == (5, 6)
    nested = EnvConfig.model_validate({"sim": {"wake_delay": 1, "fleet": {
        "fleet_seed": 4, "n_servers": 7}}, "workload": {"kind": "google_v2_like"},
        "seed_pool": (5, 6)})
    assert cfg == nested
    # the shortcut wins over a nested n_servers, and None means "not given"
    assert EnvConfig.coerce({"n_servers": 3, "sim": {"fleet": {"n_servers": 9}}}) \
        .sim.fleet.n_servers == 3
    assert EnvConfig.coerce({"n_servers": None}).sim.fleet.n_servers == 15
    assert isinstance(EnvConfig.coerce({"workload": "poisson"}).workload, PoissonConfig)
    assert EnvConfig.coerce({"workload": {"kind": "poisson", "rate": 2.5}}).workload.rate == 2.5


def test_coerce_passes_an_envconfig_through_and_reads_any_mapping():
    cfg = EnvConfig.coerce({"n_servers": 4})
    assert EnvConfig.coerce(cfg) is cfg

    class Context(dict):  # what RLlib hands an env creator
        worker_index = 3

    assert EnvConfig.coerce(Context(n_servers=4)) == cfg


def test_trace_workload_kind_requires_its_path():
    msg, locs = error_of({"workload": "trace"})
    assert locs and locs[0][:2] == ("workload", "trace")
    assert TraceReplayConfig.model_fields["kind"].default == "trace"


# --------------------------------------------------------------------------- fleet layout
@pytest.mark.parametrize(("shares", "n", "counts"), [
    ([1, 1, 1], 15, [5, 5, 5]),
    ([1, 2, 3], 10, [2, 3, 5]),  # exact 1.67, 3.33, 5 -> floors 1, 3, 5 + remainder to tier 0
    ([1, 1, 1], 4, [2, 1, 1]),  # equal remainders: the first tier wins
    ([1, 1, 1], 1, [1, 0, 0]),
    ([0.2, 5.0], 3, [0, 3]),
    ([3, 1], 7, [5, 2]),  # exact 5.25, 1.75 -> 5, 1 + remainder to tier 1
    ([1, 1, 1, 1], 4096, [1024] * 4),
])
def test_tier_counts_follow_shares_by_largest_remainder(shares, n, counts):
    got = _tier_counts(np.array(shares, dtype=float), n)
    assert got.tolist() == counts and got.sum() == n
    tiers = [TierConfig(name=f"t{i}", cpu_cores=8, mem_gib=8, p_idle_w=1, p_max_w=2, share=s)
             for i, s in enumerate(shares)]
    fleet = Fleet.from_config(FleetConfig(n_servers=n, tiers=tiers))
    assert np.bincount(fleet.tier, minlength=len(shares)).tolist() == counts


def test_default_fleet_layout_is_pinned_by_the_fleet_seed():
    fleet = Fleet.from_config(FleetConfig())
    assert fleet.tier.tolist() == [0, 2, 0, 2, 0, 0, 1, 1, 2, 2, 1, 1, 2, 1, 0]
    assert fleet.tier_names == ("efficient", "standard", "performance")
    np.testing.assert_array_equal(fleet.cpu_cap, np.array([0.25, 0.5, 1.0])[fleet.tier])
    np.testing.assert_array_equal(fleet.mem_cap, np.array([0.25, 0.5, 1.0])[fleet.tier])
    np.testing.assert_array_equal(fleet.p_idle, np.array([60.0, 100.0, 180.0])[fleet.tier])
    np.testing.assert_array_equal(fleet.p_max, np.array([180.0, 300.0, 520.0])[fleet.tier])
    np.testing.assert_array_equal(fleet.exponent, np.array([1.3, 1.4, 1.6])[fleet.tier])
    np.testing.assert_array_equal(fleet.tier_onehot, np.eye(3)[fleet.tier])
    assert (fleet.largest_cpu_cores, fleet.largest_mem_gib) == (64, 256)


@pytest.mark.parametrize("fleet_seed", [0, 1, 123])
def test_fleet_layout_depends_only_on_the_fleet_config(fleet_seed):
    cfg = FleetConfig(n_servers=30, fleet_seed=fleet_seed)
    a, b = Fleet.from_config(cfg), Fleet.from_config(cfg)
    for attr in ("tier", "cpu_cap", "mem_cap", "p_idle", "p_max", "exponent"):
        np.testing.assert_array_equal(getattr(a, attr), getattr(b, attr))
    other = Fleet.from_config(FleetConfig(n_servers=30, fleet_seed=fleet_seed + 1))
    assert not np.array_equal(a.tier, other.tier)
    assert np.bincount(other.tier).tolist() == np.bincount(a.tier).tolist() == [10, 10, 10]
    # episode seeds never move the fleet
    sim_cfg = SimConfig(fleet=cfg, episode_length=5)
    sim = ClusterSim(sim_cfg, make_workload(PoissonConfig(), sim_cfg.tick_seconds))
    for seed in (0, 1, 1_000_000):
        sim.reset(seed)
        np.testing.assert_array_equal(sim.fleet.tier, a.tier)


# --------------------------------------------------------------------- finite floats
def _float_fields(model) -> list[str]:
    """Fields typed ``float`` or ``float | None``."""
    import typing

    out = []
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation)
        if field.annotation is float or (float in args and set(args) <= {float, type(None)}):
            out.append(name)
    return out


def _config_models() -> dict:
    from cloudrl.evaluate import EvalConfig
    from cloudrl.sweep import SweepConfig
    from cloudrl.training import TrainConfig
    from serve_apps.service_config import ServiceConfig

    required = {TierConfig: {"name": "t", "cpu_cores": 8, "mem_gib": 8, "p_idle_w": 10,
                             "p_max_w": 20},
                TraceReplayConfig: {"path": "x.npz"}}
    models = [TierConfig, FleetConfig, SimConfig, DeadlineConfig, PoissonConfig,
              GoogleV2LikeConfig, TraceReplayConfig, EnvConfig, EvalConfig, TrainConfig,
              SweepConfig, ServiceConfig]
    return {(model, name): required.get(model, {}) for model in models
            for name in _float_fields(model)}


FLOAT_FIELDS = _config_models()


def test_float_fields_are_found_in_every_model():
    names = {(m.__name__, f) for m, f in FLOAT_FIELDS}
    assert {("TierConfig", "p_max_w"), ("TierConfig", "cpu_cores"), ("SimConfig", "alpha"),
            ("PoissonConfig", "rate"), ("GoogleV2LikeConfig", "load"),
            ("TraceReplayConfig", "time_scale"), ("TrainConfig", "reward_scale"),
            ("SweepConfig", "cpus_per_trial"), ("ServiceConfig", "num_cpus")} <= names
    assert len(names) >= 40


@given(case=st.sampled_from(sorted(FLOAT_FIELDS, key=lambda k: (k[0].__name__, k[1]))),
       value=st.sampled_from([math.inf, -math.inf, math.nan]))
@settings(max_examples=150, deadline=None)
def test_every_float_field_rejects_inf_and_nan_naming_it(case, value):
    model, name = case
    with pytest.raises(ValidationError) as info:
        model(**{**FLOAT_FIELDS[case], name: value})
    assert (name,) in [e["loc"] for e in info.value.errors()]


@pytest.mark.parametrize(("env", "loc"), [
    ({"sim": {"fleet": {"tiers": [{"name": "t", "cpu_cores": 8, "mem_gib": 8, "p_idle_w": 1,
                                   "p_max_w": math.inf}]}}},
     ("sim", "fleet", "tiers", 0, "p_max_w")),
    ({"sim": {"fleet": {"tiers": [{"name": "t", "cpu_cores": math.inf, "mem_gib": 8,
                                   "p_idle_w": 1, "p_max_w": 2}]}}},
     ("sim", "fleet", "tiers", 0, "cpu_cores")),
    ({"sim": {"alpha": math.inf}}, ("sim", "alpha")),
    ({"workload": {"kind": "poisson", "rate": math.inf}}, ("workload", "poisson", "rate")),
    ({"workload": {"kind": "google_v2_like", "burst_factor": math.nan}},
     ("workload", "google_v2_like", "burst_factor")),
])
def test_issue_inputs_are_rejected_before_they_reach_the_sim(env, loc):
    assert error_of(env)[1] == [loc]


def test_free_form_dicts_must_be_finite_too():
    from cloudrl.config_loader import ConfigError, load_config
    from cloudrl.sweep import SweepConfig
    from cloudrl.training import TrainConfig

    with pytest.raises(ConfigError, match=r"^invalid config \(command line\): hparams\.lr: "
                                          r"Input should be a finite number \(got inf\)$"):
        load_config(TrainConfig, None, {"hparams": {"lr": math.inf}}, environ={})
    with pytest.raises(ConfigError, match=r"env CLOUDRL__HPARAMS__PPO__GAMMA\): "
                                          r"hparams\.ppo\.gamma: .*nan"):
        load_config(SweepConfig, None, None, environ={"CLOUDRL__HPARAMS__PPO__GAMMA": ".nan"})


# ------------------------------------------------------------- where a bad value came from
def test_config_errors_are_one_line_naming_the_source(tmp_path):
    from cloudrl.config_loader import ConfigError, load_config
    from cloudrl.evaluate import EvalConfig

    with pytest.raises(ConfigError) as info:
        load_config(EvalConfig, None, None, environ={"CLOUDRL__ENV__SIM__ALPHA": "abc"})
    assert str(info.value).startswith(
        "invalid config (env CLOUDRL__ENV__SIM__ALPHA): env.sim.alpha: Input should be a "
        "valid number")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  sim:\n    alpah: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(EvalConfig, bad, {"n_seeds": 0}, environ={"CLOUDRL__WORKERS": "-1"})
    message = str(info.value)
    assert "\n" not in message
    assert f"env.sim.alpah: Extra inputs are not permitted (got 1) [{bad}]" in message
    assert "n_seeds: Input should be greater than or equal to 1 (got 0) [command line]" in message
    assert "workers: Input should be greater than or equal to 1 (got -1) [env CLOUDRL__WORKERS]" \
        in message


def test_workload_fields_without_a_kind_are_the_default_workloads():
    cfg = EnvConfig.coerce({"workload": {"rate": 2.5}})
    assert isinstance(cfg.workload, PoissonConfig) and cfg.workload.rate == 2.5
    msg, locs = error_of({"workload": {"rate": math.inf}})
    assert locs == [("workload", "poisson", "rate")]
