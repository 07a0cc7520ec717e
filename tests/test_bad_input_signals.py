"""Bad signal inputs and oversized scenarios: one line on stderr naming the field, the
file's own column header and the line, exit code 2, no traceback, before any episode.

Covered: a defective signal file given to the scenario commands through ``--override`` (the
same line as ``cloudrl signals check``); a signal timebase (tick length x forecast horizon)
too large for ``sim.limits.max_episode_bytes``; a scenario expected to create more jobs than
``max_jobs``; CSV errors naming the file's header (``datetime,CO2 (gCO2/kWh)`` and others)
and the right line after blank lines; a large file read in chunks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cloudrl.cli import main
from envs.env_config import EnvConfig
from envs.scenario.catalog import load_scenario
from envs.scenario.config import ScenarioConfig
from envs.signals.csv_import import CHUNK_ROWS, SignalFileError, read_signal_file
from envs.workloads import make_workload
from envs.workloads.work_size import BYTES_PER_SIGNAL_TICK, episode_work

CLOUDRL = Path(sys.executable).with_name("cloudrl")


@pytest.fixture(autouse=True)
def _no_cloudrl_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("CLOUDRL__"):
            monkeypatch.delenv(key)


def _cli(*argv: str, cwd: Path | None = None) -> tuple[int, str]:
    """The real entry point in a subprocess: (exit code, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDRL__")}
    proc = subprocess.run([str(CLOUDRL), *argv], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)
    return proc.returncode, proc.stderr


def _one_line(err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _in_process(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 2
    return _one_line(capsys.readouterr().err, *needles)


def _carbon_file(path: Path, header: str, n: int = 96, bad: tuple[int, str] | None = None,
                 blank_after: int | None = None) -> Path:
    """A carbon-only file of ``n`` 15-minute rows from 2021-03-01; ``bad`` = (data row,
    text) replaces one value; a blank line after data row ``blank_after``."""
    t0 = np.datetime64("2021-03-01T00:00:00")
    lines = [header]
    for i in range(n):
        value = bad[1] if bad and bad[0] == i else f"{250 + 40 * np.sin(i / 8):.1f}"
        lines.append(f"{t0 + np.timedelta64(15 * i, 'm')},{value}")
        if blank_after == i:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


def _override(path: Path) -> str:
    return json.dumps({"signals": {"source": "csv", "csv_path": str(path)}})


# ---------------------------------------------------------------- 1. --override signal files
def test_scenario_evaluate_with_a_defective_file_says_what_signals_check_says(tmp_path):
    """The file named as the user spells it (relative here), in both commands."""
    _carbon_file(tmp_path / "grid.csv", "datetime,CO2 (gCO2/kWh)", bad=(40, "n/a"))
    code, err = _cli("signals", "check", "grid.csv", cwd=tmp_path)
    assert code == 2
    expected = _one_line(err, "cloudrl: grid.csv line 42", "'CO2 (gCO2/kWh)'", "'n/a'")
    code, err = _cli("scenarios", "evaluate", "--scenario", "tiny", "--n-seeds", "1",
                     "--override", _override(Path("grid.csv")), cwd=tmp_path)
    assert code == 2
    assert _one_line(err) == expected


@pytest.mark.parametrize("argv", [
    ["scenarios", "evaluate", "--scenario", "price_peak", "--n-seeds", "2"],
    ["headline", "--scenario", "tiny", "--tiny", "--no-log"],
    ["scenarios", "offline", "--scenario", "tiny"],
])
def test_every_scenario_command_with_an_override_gives_the_same_line(tmp_path, capsys, argv):
    bad = _carbon_file(tmp_path / "g.csv", "Date,carbon_intensity", bad=(7, "-12"))
    assert main(["signals", "check", str(bad)]) == 2
    expected = _one_line(capsys.readouterr().err, "line 9", "'carbon_intensity'", "negative")
    assert _in_process(capsys, [*argv, "--override", _override(bad)]) == expected


def test_an_override_file_too_short_or_missing_is_one_line(tmp_path, capsys):
    short = _carbon_file(tmp_path / "short.csv", "timestamp_utc,gCO2_per_kWh", n=30)
    _in_process(capsys, ["scenarios", "evaluate", "--scenario", "tiny", "--override",
                         _override(short)], str(short), "covers 7.5 h", "need")
    _in_process(capsys, ["scenarios", "evaluate", "--scenario", "tiny", "--override",
                         _override(tmp_path / "absent.csv")], "signals.csv_path", "not found")


# ---------------------------------------------------------------- 2. the signal timebase
def test_cluster_env_signal_timebase_above_the_byte_limit_is_one_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("env: {sim: {tick_seconds: 0.005}, signals: {horizon_hours: 72}}\n")
    code, err = _cli("evaluate", "--config", str(path), "--n-seeds", "1")
    assert code == 2
    _one_line(err, "sim.tick_seconds", "signals.horizon_hours 72", "51,841,001 ticks",
              "max_episode_bytes", str(path))


@pytest.mark.parametrize(("tick", "hours"), [(0.002, 48.0), (0.03, 120.0), (0.25, 160.0)])
def test_timebase_guard_names_both_fields_before_any_allocation(capsys, monkeypatch, tick,
                                                                hours):
    monkeypatch.setenv("CLOUDRL__ENV__SIM__TICK_SECONDS", str(tick))
    monkeypatch.setenv("CLOUDRL__ENV__SIGNALS__HORIZON_HOURS", str(hours))
    monkeypatch.setenv("CLOUDRL__ENV__SIM__LIMITS__MAX_EPISODE_BYTES", str(2**27))
    ticks = 1000 + int(np.ceil(hours * 3600 / tick - 1e-9)) + 1
    _in_process(capsys, ["evaluate", "--n-seeds", "1"], "sim.tick_seconds",
                f"signals.horizon_hours {hours:g}", f"{ticks:,} ticks")


@given(tick=st.floats(0.001, 100.0), hours=st.floats(0.01, 168.0),
       length=st.integers(1, 20_000))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_timebase_guard_refuses_exactly_above_the_byte_limit(tick, hours, length):
    """Refused exactly when the signal timebase's bytes plus the episode's pass
    ``max_episode_bytes`` (the default, 1 GiB); accepted otherwise."""
    sim = {"tick_seconds": tick, "episode_length": length}
    plain = EnvConfig.model_validate({"sim": sim})
    work = episode_work(plain.sim, make_workload(plain.workload, tick))
    horizon = max(1, int(np.ceil(hours * 3600 / tick - 1e-9)))
    need = (length + horizon + 1) * BYTES_PER_SIGNAL_TICK + work.bytes
    try:
        EnvConfig.model_validate({"sim": sim, "signals": {"horizon_hours": hours}})
    except ValidationError as e:
        assert need > 2**30
        assert "sim.tick_seconds" in str(e) and "signals.horizon_hours" in str(e)
    else:
        assert need <= 2**30


# ---------------------------------------------------------------- 3. max_jobs
def test_scenario_above_max_jobs_is_refused_before_any_episode(tmp_path):
    code, err = _cli("scenarios", "evaluate", "--scenario", "demand_response", "--n-seeds",
                     "1", "--override", '{"max_jobs": 9000, "days": 1.5}')
    assert code == 2
    _one_line(err, "--override: max_jobs", "9,000", "utilization", "fleet.n_servers")


@pytest.mark.parametrize(("argv", "needle"), [
    (["scenarios", "evaluate", "--scenario", "solar_site", "--n-servers", "2500"],
     "fleet.n_servers 2500"),
    (["scenarios", "evaluate", "--scenario", "tiny", "--override",
      '{"utilization": 1.4, "max_jobs": 800}'], "utilization 1.4"),
    (["scenarios", "offline", "--scenario", "cold_standby", "--override",
      '{"max_jobs": 12345}'], "12,345"),
    (["headline", "--scenario", "tiny", "--tiny", "--override", '{"max_jobs": 300}'], "300"),
    (["scenarios", "distill", "--scenario", "mixed", "--n-servers", "4000", "--out", "x"],
     "4000"),
])
def test_every_scenario_command_refuses_too_many_jobs_in_one_line(capsys, argv, needle):
    _in_process(capsys, argv, "max_jobs", needle)


@given(n_servers=st.integers(1, 3000), util=st.floats(0.05, 1.5), days=st.floats(0.25, 3.0),
       max_jobs=st.integers(1_000, 500_000))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_validated_scenarios_never_fail_at_reset_and_stay_near_the_bound(n_servers, util, days,
                                                                         max_jobs):
    """A scenario that validates generates its jobs (no refusal at reset); the expected
    count is an upper bound of the mean at the peak hour, so realised counts stay below
    it plus Poisson scatter."""
    from envs.scenario.jobs import generate_jobs

    data = {"fleet": {"n_servers": n_servers}, "utilization": util, "days": days,
            "max_jobs": max_jobs}
    try:
        cfg = ScenarioConfig.model_validate(data)
    except ValidationError as e:
        assert "max_jobs" in str(e)
        assert sum(ScenarioConfig.model_validate({**data, "max_jobs": 10_000_000})
                   .expected_jobs()) > max_jobs
        return
    bound = sum(cfg.expected_jobs())
    assert bound <= max_jobs
    if bound > 200_000:
        return  # drawing that many jobs is slow; the bound is what matters
    cores = sum(t.cpu_cores * c for t, c in zip(cfg.fleet.tiers, _counts(cfg), strict=True))
    jobs = generate_jobs(cfg, cores, max(t.cpu_cores for t in cfg.fleet.tiers), 0.0,
                         cfg.n_ticks, np.random.default_rng(n_servers))
    assert len(jobs) <= bound + 6 * np.sqrt(bound) + 10


def _counts(cfg: ScenarioConfig) -> np.ndarray:
    from envs.fleet import Fleet

    fleet = Fleet.from_config(cfg.fleet)
    return np.bincount(fleet.tier, minlength=len(cfg.fleet.tiers))


def test_catalog_scenarios_and_documented_fleet_sizes_still_validate():
    for name in ("carbon_shift", "demand_response", "scarcity_spikes", "tiny"):
        assert sum(load_scenario(name).expected_jobs()) < 40_000
        assert sum(load_scenario(name, n_servers=1000).expected_jobs()) < 400_000


# ---------------------------------------------------------------- 4. the file's own headers
@pytest.mark.parametrize(("header", "bad", "line", "fragment"), [
    ("datetime,CO2 (gCO2/kWh)", (12, "12,5"), 14, "3 fields, expected 2 (datetime,CO2"),
    ("datetime,CO2 (gCO2/kWh)", (30, ""), 32, "'CO2 (gCO2/kWh)': empty value"),
    ("DateTime,Carbon_Intensity_gCO2", (3, "inf"), 5, "'Carbon_Intensity_gCO2': 'inf'"),
    ("date,co2", (50, "-4"), 52, "'co2': negative carbon intensity -4"),
    ("time_local,carbon", (9, "9e9"), 11, "'carbon': 9e+09 is above 2000"),
    ("Datetime (UTC),Carbon Intensity gCO2eq/kWh (direct)", (2, "x"), 4,
     "'Carbon Intensity gCO2eq/kWh (direct)': 'x' is not a number"),
])
def test_csv_errors_name_the_files_own_column_and_line(tmp_path, capsys, header, bad, line,
                                                       fragment):
    p = _carbon_file(tmp_path / "c.csv", header, bad=bad)
    msg = _in_process(capsys, ["signals", "check", str(p)], f"line {line}", fragment)
    assert "carbon_g_per_kwh" not in msg and str(p) in msg


def test_timestamp_errors_name_the_files_time_column(tmp_path, capsys):
    p = _carbon_file(tmp_path / "c.csv", "Zeit (UTC),CO2-Intensität")  # not time/date words
    _in_process(capsys, ["signals", "check", str(p)], "line 1", "unknown column 'Zeit (UTC)'")
    p = _carbon_file(tmp_path / "d.csv", "Timestamp (local),CO2 g/kWh")
    text = p.read_text().splitlines()
    text[20] = "21/03/2021 04:45," + text[20].split(",")[1]
    p.write_text("\n".join(text) + "\n")
    _in_process(capsys, ["signals", "check", str(p)], "line 21",
                "column 'Timestamp (local)': unparseable timestamp")
    text[20], text[21] = text[21], text[20].replace("21/03/2021 04:45", "2021-03-01T04:45:00")
    p.write_text("\n".join(text) + "\n")
    _in_process(capsys, ["signals", "check", str(p)], "line 22", "'Timestamp (local)'",
                "earlier than the previous row")


def test_lines_are_counted_across_blank_lines_and_chunks(tmp_path):
    n = CHUNK_ROWS + 500
    p = _carbon_file(tmp_path / "long.csv", "datetime,CO2 (gCO2/kWh)", n=n,
                     bad=(CHUNK_ROWS + 321, "-1"), blank_after=17)
    with pytest.raises(SignalFileError) as err:
        read_signal_file(p)
    assert f"line {CHUNK_ROWS + 321 + 3}," in str(err.value)  # header + blank line
    assert "'CO2 (gCO2/kWh)'" in str(err.value)
    ok = _carbon_file(tmp_path / "ok.csv", "datetime,CO2 (gCO2/kWh)", n=n, blank_after=17)
    t = read_signal_file(ok)
    assert t.n_rows == n and t.layout == "carbon-only"
    assert t.headers == {"timestamp": "datetime", "carbon_g_per_kwh": "CO2 (gCO2/kWh)"}
    expect = 250 + 40 * np.sin(np.arange(n) / 8)
    np.testing.assert_allclose(t.carbon, expect, atol=0.051)
    assert np.all(np.diff(t.times).astype(np.int64) == 900)


# ---------------------------------------------------------------- 5. large files, bounded memory
@pytest.mark.slow
def test_a_large_file_is_read_in_bounded_memory(tmp_path):
    """~60 MB of carbon rows: the reading process's peak RSS grows by under 120 bytes a row
    (the whole file held as Python strings first took ~330 in the benchmark)."""
    n = 2_400_000
    t = np.datetime64("2010-01-01T00:00:00") + np.arange(n).astype("timedelta64[m]")
    p = tmp_path / "big.csv"
    with p.open("w") as f:
        f.write("datetime,CO2 (gCO2/kWh)\n")
        for i in range(0, n, 400_000):
            ts = np.datetime_as_string(t[i:i + 400_000], unit="s")
            f.write("".join(f"{a},{300 + (k % 97)}\n" for k, a in enumerate(ts, i)))
    # VmHWM: this process's peak RSS (ru_maxrss would carry over pytest's own peak)
    code = ("import sys\nfrom envs.signals.csv_import import read_signal_file\n"
            "def hwm():\n"
            "    with open('/proc/self/status') as f:\n"
            "        return next(int(s.split()[1]) for s in f if s.startswith('VmHWM:'))\n"
            "base = hwm()\nt = read_signal_file(sys.argv[1])\nprint(t.n_rows, hwm() - base)")
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True,
                         timeout=600, cwd=Path(__file__).resolve().parents[1], check=True)
    rows, grown_kib = map(int, out.stdout.split())
    assert rows == n
    assert grown_kib * 1024 / n < 120, grown_kib
