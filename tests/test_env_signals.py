"""Exogenous signals (price, carbon, solar, forecasts) in the cluster envs, single and batched.

* Without signals (the default, ``signals=None``) the envs are what they were: the batched
  env's runs are compared (to a stated tolerance, ``tests/recorded.py``) with those recorded
  by the code before signals existed (the single env's in ``tests/test_envs_golden.py``),
  and an explicit ``None`` equals an absent field.
* With signals the macro row grows by the documented columns, the info carries the step's
  ``energy_usd`` / ``carbon_kg`` (the integral of kWh x price and kWh x carbon), the reward
  the weighted dollar term, and the batched env matches ``SyncVectorEnv`` of the single env
  bit for bit (observations, rewards, infos, autoresets).
* A bad ``signals`` value is refused naming the field.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from test_vector_env import run_both

from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from envs.env_config import EnvConfig
from envs.observation import (
    CARBON_SCALE,
    MACRO_TAIL,
    PRICE_SCALE,
    SIGNAL_COLS,
    SOLAR_COLS,
    USD_PER_KWH_REF,
    episode_signals,
    forecast_summary,
    macro_size,
)
from envs.signals import SignalConfig, forecast, make_signals
from envs.snapshot import ClusterSnapshot
from envs.vector_env import ClusterBranchingVectorEnv, ClusterSchedulingVectorEnv
from tests.recorded import Trace, assert_matches

ENVS = [ClusterSchedulingEnv, ClusterBranchingEnv]
SMALL = {"n_servers": 8, "sim": {"episode_length": 40}}
SOLAR = {"solar_kwp": 2.0, "solar_source": "synthetic"}


def _act(env, rng: np.random.Generator):
    if isinstance(env, ClusterSchedulingEnv):
        return int(rng.choice(np.flatnonzero(env.action_mask)))
    return np.array([int(rng.choice(np.flatnonzero(m))) for m in env.branch_masks()])


# ------------------------------------------------------------------ old configs unchanged
def vector_trace(cls, cfg, n_envs=3, steps=100, seed=5) -> Trace:
    """A seeded batched run (random actions, some masked; autoresets) as a :class:`Trace`."""
    tr = Trace()
    vec = cls(n_envs, cfg)
    rng = np.random.default_rng(2)
    obs, info = vec.reset(seed=seed)

    def add_info(info):
        for key in sorted(info):
            tr.add(f"info.{key}", np.asarray(info[key]))

    add_info(info)
    for _ in range(steps):
        for key in sorted(obs):
            tr.add(key, obs[key])
        mask = obs["action_mask"] > 0
        if cls is ClusterSchedulingVectorEnv:
            acts = np.array([int(rng.integers(len(m))) if rng.random() < 0.1
                             else int(rng.choice(np.flatnonzero(m))) for m in mask])
        else:
            sizes = vec.single_action_space.nvec
            offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            acts = np.array([[int(rng.choice(np.flatnonzero(m[o:o + s]))) if rng.random() > 0.05
                              else int(rng.integers(s)) for o, s in zip(offs, sizes, strict=True)]
                             for m in mask], dtype=np.int64)
        obs, rew, term, trunc, info = vec.step(acts)
        tr.add("reward", rew)
        tr.add("terminated", term)
        tr.add("truncated", trunc)
        add_info(info)
    return tr


OLD_CASES = (
    {"n_servers": 12, "sim": {"episode_length": 40}},
    {"n_servers": 9, "workload": "google_v2_like",
     "sim": {"episode_length": 30, "wake_delay": 0, "queue_window": 4, "diurnal_period": 97}},
)
# recorded (tests/fixtures/recorded/batched_episodes.npz) with the code whose sha256 digests
# matched those taken with the batched env before signals were added (commit 6b1fc4f)
OLD_KEYS = [(ClusterSchedulingVectorEnv, 0), (ClusterSchedulingVectorEnv, 1),
            (ClusterBranchingVectorEnv, 0), (ClusterBranchingVectorEnv, 1)]


def old_case_key(cls, case) -> str:
    return f"{cls.__name__}-{case}"


@pytest.mark.parametrize(("cls", "case"), OLD_KEYS,
                         ids=lambda v: getattr(v, "__name__", v))
@pytest.mark.parametrize("explicit_none", [False, True])
def test_configs_without_signals_give_the_recorded_batched_episodes(cls, case, explicit_none):
    cfg = dict(OLD_CASES[case])
    if explicit_none:
        cfg["signals"] = None
    assert_matches(vector_trace(cls, cfg), "batched_episodes", old_case_key(cls, case))


@pytest.mark.parametrize("env_cls", ENVS)
def test_without_signals_spaces_and_info_keys_are_the_old_ones(env_cls):
    env = env_cls(SMALL)
    assert EnvConfig.coerce(SMALL) == EnvConfig.coerce({**SMALL, "signals": None})
    assert env.observation_space["macro"].shape == (macro_size(env.sim.fleet.n_tiers),)
    assert env.n_signal == 0 and env.signals is None
    env.reset(seed=0)
    _, _, _, _, info = env.step(_act(env, np.random.default_rng(0)))
    assert not {"energy_usd", "carbon_kg", "r_signal"} & set(info)


def test_importing_the_envs_does_not_import_the_signals_package():
    """envs.signals pulls in scipy.signal (~1 s); an env without signals never needs it."""
    code = ("import sys, envs.cluster_env, envs.vector_env, envs.env_config; "
            "sys.exit('envs.signals' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ------------------------------------------------------------------ observation
@pytest.mark.parametrize("env_cls", ENVS)
@pytest.mark.parametrize(("signals", "cols"), [({}, SIGNAL_COLS),
                                               (SOLAR, SIGNAL_COLS + SOLAR_COLS)])
def test_observation_space_grows_by_the_signal_columns(env_cls, signals, cols):
    plain, env = env_cls(SMALL), env_cls({**SMALL, "signals": signals})
    assert env.signal_cols == cols
    base = macro_size(env.sim.fleet.n_tiers)
    assert env.observation_space["macro"].shape == (base + len(cols),)
    for key in ("servers", "jobs", "action_mask"):
        assert env.observation_space[key] == plain.observation_space[key]
    obs, _ = env.reset(seed=1)
    assert obs["macro"].dtype == np.float32 and obs in env.observation_space
    rng = np.random.default_rng(1)
    for _ in range(env.config.sim.episode_length):
        obs, *_ = env.step(_act(env, rng))
        assert obs in env.observation_space and np.isfinite(obs["macro"]).all()


@pytest.mark.parametrize("env_cls", ENVS)
def test_gymnasium_check_env_passes_with_signals(env_cls):
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env_cls({**SMALL, "signals": SOLAR}), skip_render_check=True)
    # the only acceptable complaints are about the unbounded feature boxes
    assert [str(w.message) for w in caught if "infinity" not in str(w.message)] == []


def test_signal_columns_are_the_documented_features():
    env = ClusterSchedulingEnv({**SMALL, "signals": {**SOLAR, "forecast_error": 0.2}})
    obs, _ = env.reset(seed=4)
    sig = env.signals
    series, h, every = sig.series, sig.horizon_ticks, sig.forecast_every
    assert series.n_ticks == 40 + h + 1 and h == 1440 and every == 60
    base = macro_size(env.sim.fleet.n_tiers)
    rng = np.random.default_rng(4)
    peak_kw = env.sim.fleet_peak_w / 1000.0
    for t in range(41):
        if t:
            obs, *_ = env.step(_act(env, rng))
        t0 = t - t % every
        p, c, s = forecast(series, t0, h + every - 1, 0.2, 4)
        w = slice(t - t0, t - t0 + h)
        price, carbon = series.price_usd_per_mwh[t], series.carbon_g_per_kwh[t]
        want = [price / PRICE_SCALE, carbon / CARBON_SCALE,
                (p[w].mean() - price) / PRICE_SCALE, (p[w].min() - price) / PRICE_SCALE,
                (c[w].mean() - carbon) / CARBON_SCALE, (c[w].min() - carbon) / CARBON_SCALE,
                series.solar_kw[t] / peak_kw, s[w].mean() / peak_kw]
        np.testing.assert_allclose(obs["macro"][base:], np.float32(want), rtol=1e-6,
                                   atol=1e-7)
        assert obs["macro"][base - len(MACRO_TAIL) + MACRO_TAIL.index("progress")] == \
            np.float32(t / 40)


@pytest.mark.parametrize("error", [0.0, 0.35])
@pytest.mark.parametrize(("horizon", "every"), [(288, 12), (5, 5), (7, 1), (3, 2)])
def test_forecast_summary_is_the_window_mean_and_min_of_the_forecast(error, horizon, every):
    series = make_signals(SignalConfig(**SOLAR), 200, 300.0, 9)
    n_obs = 150
    mean, low = forecast_summary(series, 9, error, horizon, every, n_obs)
    for t in range(n_obs):
        t0 = t - t % every
        fc = forecast(series, t0, horizon + every - 1, error, 9)
        for r in range(3):
            window = fc[r][t - t0:t - t0 + horizon]
            assert low[r, t] == window.min()
            assert mean[r, t] == pytest.approx(window.mean(), rel=1e-12, abs=1e-12)


# ------------------------------------------------------------------ cost and reward
@pytest.mark.parametrize("env_cls", ENVS)
@pytest.mark.parametrize("signals", [{}, {**SOLAR, "solar_kwp": 4.0},
                                     {**SOLAR, "solar_kwp": 4.0, "export_price_usd_per_mwh": 30.0},
                                     {"price_negative_per_day": 5.0}])
def test_info_terms_are_the_integral_of_kwh_times_signal(env_cls, signals):
    cfg = {**SMALL, "signals": signals, "signal_cost_weight": 3.0, "carbon_usd_per_tonne": 250.0}
    env = env_cls(cfg)
    env.reset(seed=2)
    series, tick_h = env.signals.series, env.config.sim.tick_seconds / 3600.0
    peak_kwh = env.sim.fleet_peak_w / 1000.0 * tick_h
    export = (signals.get("export_price_usd_per_mwh") or 0.0) / 1000.0
    rng = np.random.default_rng(2)
    usd = kg = want_usd = want_kg = 0.0
    done, t = False, 0
    while not done:
        _, reward, _, done, info = env.step(_act(env, rng))
        kwh = info["energy_kwh"]
        solar_kwh = series.solar_kw[t] * tick_h
        grid = max(kwh - solar_kwh, 0.0)
        want_usd += grid * series.price_usd_per_mwh[t] / 1000.0 - \
            max(solar_kwh - kwh, 0.0) * export
        want_kg += grid * series.carbon_g_per_kwh[t] / 1000.0
        usd += info["energy_usd"]
        kg += info["carbon_kg"]
        cost = info["energy_usd"] + info["carbon_kg"] * 250.0 / 1000.0
        assert info["r_signal"] == pytest.approx(-3.0 * cost / (peak_kwh * USD_PER_KWH_REF),
                                                 rel=1e-12, abs=1e-15)
        terms = ("r_energy", "r_sla", "r_toggle", "r_invalid", "r_signal")
        assert reward == pytest.approx(sum(info[k] for k in terms), rel=1e-12, abs=1e-12)
        t += 1
    assert t == 40
    assert usd == pytest.approx(want_usd, rel=1e-9, abs=1e-12)
    assert kg == pytest.approx(want_kg, rel=1e-9)
    if "solar_kwp" not in signals:
        assert kg > 0 and (usd != 0)


def test_signals_change_no_dynamics_only_the_added_terms():
    """Same seed and actions with and without signals: the same cluster episode."""
    plain = ClusterSchedulingEnv(SMALL)
    env = ClusterSchedulingEnv({**SMALL, "signals": SOLAR})
    a, _ = plain.reset(seed=6)
    b, _ = env.reset(seed=6)
    base = len(a["macro"])
    rng = np.random.default_rng(6)
    for _ in range(40):
        for key in ("servers", "jobs", "action_mask"):
            assert np.array_equal(a[key], b[key])
        assert np.array_equal(a["macro"], b["macro"][:base])
        action = _act(plain, rng)
        a, ra, _, _, ia = plain.step(action)
        b, rb, _, _, ib = env.step(action)
        assert {k: v for k, v in ib.items() if k in ia} == ia
        assert rb == pytest.approx(ra + ib["r_signal"], rel=1e-12, abs=1e-12)


def test_episode_signals_are_built_once_per_seed_and_read_only():
    env = ClusterSchedulingEnv({**SMALL, "signals": SOLAR})
    other = ClusterSchedulingEnv({**SMALL, "signals": SOLAR})
    first, _ = env.reset(seed=11)
    sig = env.signals
    env.reset(seed=12)
    assert env.signals is not sig
    again, _ = other.reset(seed=11)
    assert other.signals is sig and np.array_equal(first["macro"], again["macro"])
    for arr in (sig.price, sig.carbon, sig.solar_j, sig.features):
        assert not arr.flags.writeable
    fresh = episode_signals(SignalConfig(**SOLAR, forecast_error=0.2), 40, 60.0, 11,
                            env.sim.fleet_peak_w)
    assert fresh is not sig and not np.array_equal(fresh.features, sig.features)


def test_observe_snapshot_is_refused_with_signals():
    env = ClusterSchedulingEnv({**SMALL, "signals": {}})
    env.reset(seed=0)
    snap = env.sim.snapshot()
    assert isinstance(snap, ClusterSnapshot)
    with pytest.raises(ValueError, match="snapshot carries no price"):
        env.observe_snapshot(snap)
    # the error names the field to change (EnvConfig.signals)
    with pytest.raises(ValueError, match=r"^observe_snapshot: .*env config without signals"):
        env.observe_snapshot(snap)
    plain = ClusterSchedulingEnv(SMALL)
    plain.reset(seed=0)
    assert plain.observe_snapshot(snap)["macro"].shape == (macro_size(plain.sim.fleet.n_tiers),)


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize(("trained", "asked", "message"), [
    (None, {}, r"trained with signals=None, env has signals=synthetic \(no solar columns\)"),
    ({}, None, r"trained with signals=synthetic \(no solar columns\), env has signals=None"),
    ({}, SOLAR, r"signals=synthetic \(no solar columns\), env has signals=synthetic "
                r"\(with solar columns\)"),
    (SOLAR, None, r"signals=synthetic \(with solar columns\), env has signals=None"),
])
def test_a_checkpoint_is_refused_on_an_env_with_other_signal_columns(trained, asked, message):
    from pathlib import Path
    from types import SimpleNamespace

    from cloudrl.checkpoint_policy import CheckpointPolicy

    def policy(signals):
        return SimpleNamespace(env_config=EnvConfig.coerce({**SMALL, "signals": signals}),
                               path=Path("/x/ckpt"))

    asked_cfg = EnvConfig.coerce({**SMALL, "signals": asked})
    with pytest.raises(ValueError, match=message) as err:
        CheckpointPolicy.check_env(policy(trained), asked_cfg)
    assert "\n" not in str(err.value) and str(err.value).startswith("checkpoint ckpt was")
    # the same columns load, whatever the other signal settings
    CheckpointPolicy.check_env(policy(asked), asked_cfg)
    if asked is not None:
        other = EnvConfig.coerce({**SMALL, "signals": {**asked, "price_mean_usd_per_mwh": 90.0,
                                                       "forecast_error": 0.3}})
        CheckpointPolicy.check_env(policy(asked), other)


# ------------------------------------------------------------------ single == batched
@pytest.mark.parametrize("interface", ["flat", "branching"])
@pytest.mark.parametrize("signals", [{}, {**SOLAR, "forecast_error": 0.0},
                                     {**SOLAR, "export_price_usd_per_mwh": 40.0,
                                      "horizon_hours": 0.5}])
def test_batched_env_with_signals_matches_sync_vector_env(interface, signals):
    config = EnvConfig.coerce({"n_servers": 7, "sim": {"episode_length": 25},
                               "signals": signals, "signal_cost_weight": 2.0})
    seen = run_both(interface, config, 3, seed=17, steps=60, p_masked=0.2)
    assert seen["resets"] >= 6 and seen["invalid"] > 0


def test_batched_env_with_signals_after_a_masked_reset_matches():
    config = EnvConfig.coerce({"n_servers": 6, "sim": {"episode_length": 20}, "signals": SOLAR})
    vec = ClusterBranchingVectorEnv(3, config)
    singles = [ClusterBranchingEnv(config) for _ in range(3)]
    vec.reset(seed=[1, 2, 3])
    for i, env in enumerate(singles):
        env.reset(seed=i + 1)
    hold = np.tile(np.asarray(vec.single_action_space.nvec) - 1, (3, 1))
    hold[:, 6:6 + singles[0].n_tiers] = 1
    hold[:, -1] = 0
    for _ in range(3):
        vec.step(hold)
        for env, a in zip(singles, hold, strict=True):
            env.step(a)
    obs, _ = vec.reset(seed=[None, 42, None], options={"reset_mask": np.array([False, True,
                                                                               False])})
    want, _ = singles[1].reset(seed=42)
    assert np.array_equal(obs["macro"][1], want["macro"])
    obs, rew, _, _, info = vec.step(hold)
    for i, env in enumerate(singles):
        o, r, _, _, inf = env.step(hold[i])
        assert np.array_equal(obs["macro"][i], o["macro"]) and rew[i] == r
        assert info["energy_usd"][i] == inf["energy_usd"]


# ------------------------------------------------------------------ bad configs
@pytest.mark.parametrize(("cfg", "message"), [
    ({"signals": {"price_mean_usd_per_mwh": -5}}, r"signals\.price_mean_usd_per_mwh"),
    ({"signals": {"no_such_field": 1}}, r"signals\.no_such_field"),
    ({"signals": {"forecast_error": float("nan")}}, r"signals\.forecast_error"),
    ({"signals": {"source": "csv"}}, r"signals: csv_path"),
    ({"signals": "yes"}, r"signals: expected a SignalConfig"),
    ({"signals": {}, "signal_cost_weight": -1.0}, r"signal_cost_weight"),
    ({"signal_cost_weight": 2.0}, r"signal_cost_weight: only used with signals"),
    ({"carbon_usd_per_tonne": 50.0}, r"carbon_usd_per_tonne: only used with signals"),
])
def test_bad_signal_config_is_refused_naming_the_field(cfg, message):
    with pytest.raises(ValidationError, match=message):
        EnvConfig.coerce(cfg)


def test_signal_config_round_trips_through_a_json_dump():
    cfg = EnvConfig.coerce({"signals": SignalConfig(**SOLAR), "signal_cost_weight": 1.5})
    again = EnvConfig.model_validate(cfg.model_dump(mode="json"))
    assert again == cfg and isinstance(again.signals, SignalConfig)
    assert EnvConfig.model_validate(EnvConfig().model_dump(mode="json")) == EnvConfig()


# ------------------------------------------------------------------ cheaper make_signals
# make_signals' outputs (price, carbon, solar, start, meta) over SIGNAL_SEEDS, per case, and
# the env's episode tables and forecasts: recorded (tests/fixtures/recorded/signals.npz, to
# RTOL of tests/recorded.py) with the code whose sha256 digests matched those taken before
# make_signals was made cheaper (clock arrays kept, AR filters and the calendar compiled,
# the price's spike windows found by bisection).
SIGNAL_SEEDS = [0, 1, 7, 123456789, 2**63 + 5, -3]
SIGNAL_CASES = [  # (SignalConfig fields, tick seconds, ticks)
    ({}, 300.0, 201),
    ({}, 60.0, 1500),
    ({}, 3600.0, 100),
    ({}, 90000.0, 12),
    ({}, 7.5, 3),
    ({"solar_kwp": 2.0, "solar_source": "synthetic"}, 60.0, 1441),
    ({"solar_kwp": 5.0, "solar_source": "synthetic", "start_date": "2021-02-27"}, 900.0, 800),
    ({"start_date": "2024-12-30", "price_spikes_per_day": 3.0, "price_negative_per_day": 2.0},
     600.0, 2000),
    ({"price_carbon_correlation": -1.0, "price_noise_sd": 0.0,
      "carbon_slow_sd_g_per_kwh": 0.0}, 120.0, 500),
    ({"price_daily_amplitude": 3.0, "carbon_daily_amplitude": 5.0, "price_spikes_per_day": 5.0,
      "price_negative_per_day": 5.0, "carbon_floor_g_per_kwh": 400.0}, 300.0, 3000),
    ({"source": "de_carbon_2020"}, 300.0, 600),
    ({"source": "de_carbon_2020", "solar_kwp": 1.0, "solar_source": "synthetic"}, 3600.0, 200),
    ({"solar_kwp": 3.0, "solar_source": "pvlib"}, 600.0, 400),
]


def signals_trace(fields, tick, n) -> Trace:
    """make_signals over SIGNAL_SEEDS for one case, as a :class:`Trace`."""
    cfg = SignalConfig(**fields)
    tr = Trace()
    for seed in SIGNAL_SEEDS:
        series = make_signals(cfg, n, tick, seed)
        for name in ("price_usd_per_mwh", "carbon_g_per_kwh", "solar_kw"):
            a = getattr(series, name)
            tr.add(f"{name}.dtype", a.dtype.str)
            tr.add(name, a)
        tr.add("start", str(series.start))
        # the data file's folder depends on where the checkout is: its name is what counts
        for k, v in sorted(series.meta.items()):
            tr.add(f"meta.{k}", Path(v).name if k == "path" else
                   (float(v) if isinstance(v, float) else repr(v)))
    return tr


def episode_tables_trace() -> Trace:
    """The env's episode tables, then Forecaster paths and forecasts, as a :class:`Trace`."""
    from envs.signals.forecast import Forecaster

    tr = Trace()
    for fields in ({}, SOLAR):
        for seed in SIGNAL_SEEDS[:4]:
            sig = episode_signals(SignalConfig(**fields), 300, 60.0, seed, 5000.0)
            for name in ("price", "carbon", "solar_j", "features"):
                tr.add(name, getattr(sig, name))
    for fields, tick, n in SIGNAL_CASES[:3] + SIGNAL_CASES[5:6]:
        for seed in SIGNAL_SEEDS[:3]:
            series = make_signals(SignalConfig(**fields), n, tick, seed)
            tr.add("paths", Forecaster(series, seed).paths)
            for t in (0, 1, n // 2, n - 1):
                for error in (0.0, 0.1, 0.7):
                    for i, a in enumerate(forecast(series, t, 50, error, seed)):
                        tr.add(f"forecast{i}", a)
    return tr


@pytest.mark.parametrize(("fields", "tick", "n"), SIGNAL_CASES,
                         ids=[str(i) for i in range(len(SIGNAL_CASES))])
def test_make_signals_gives_the_recorded_series(fields, tick, n):
    if fields.get("solar_source") == "pvlib":
        pytest.importorskip("pvlib")
    case = SIGNAL_CASES.index((fields, tick, n))
    assert_matches(signals_trace(fields, tick, n), "signals", f"case{case}")


def test_episode_tables_and_forecasts_give_the_recorded_values():
    assert_matches(episode_tables_trace(), "signals", "episode_tables")


def test_compiled_calendar_and_ar_filter_match_numpy_and_scipy_bit_for_bit():
    """The compiled passes against the numpy/scipy expressions they replace, on random
    times (before and after 1970, odd tick lengths) and random AR inputs."""
    from scipy.signal import lfilter

    from envs.signals.timebase import TickClock, ar1, smooth_ar

    for start, tick, n in (("2020-03-01", 60.0, 5000), ("1969-12-25", 7.3, 3000),
                           ("1950-06-30T13:17:05", 1234.567, 4000), ("2024-02-28", 0.1, 10)):
        clock = TickClock(np.datetime64(start, "s"), tick, n)
        secs = clock.seconds_of_epoch()
        hour = np.mod(secs, 86400) / 3600.0
        how = np.mod(secs + 3 * 86400, 7 * 86400) / 3600.0

        def step(x):
            return np.clip((x + 3.0) / 6.0, 0.0, 1.0)

        weekend = step(how - 120.0) - step(how - 168.0) + 1.0 - step(how)
        assert np.array_equal(clock.hour_of_day(), hour)
        assert np.array_equal(clock.weekend_weight(), weekend)
        assert np.array_equal(clock.weekend_weight(4.0), clock.weekend_weight(4.0))
        assert not clock.hour_of_day().flags.writeable
    for n, phi in ((1, 0.5), (2, 0.9), (3000, 0.999), (500, 0.0)):
        e = np.random.default_rng(n).standard_normal(n)
        x0 = e[0]
        e[0] = 0.0
        scale = np.sqrt(max(1.0 - phi * phi, 0.0))
        want = lfilter([scale], [1.0, -phi], e) + x0 * phi ** np.arange(n)
        assert np.array_equal(ar1(np.random.default_rng(n), n, phi), want)
        y = ar1(np.random.default_rng(n + 1), n, phi)
        r = np.random.default_rng(n + 1)
        r.standard_normal(n)
        c = (1.0 - phi * phi) / np.sqrt(1.0 + phi * phi)
        rho = 1.0 / np.sqrt(1.0 + phi * phi)
        z0 = rho * y[0] + np.sqrt(max(1.0 - rho * rho, 0.0)) * r.standard_normal()
        drive = c * y
        drive[0] = 0.0
        want = lfilter([1.0], [1.0, -phi], drive) + z0 * phi ** np.arange(n)
        assert np.array_equal(smooth_ar(np.random.default_rng(n + 1), n, phi), want)
