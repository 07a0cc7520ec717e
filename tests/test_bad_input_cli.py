"""Out-of-range numbers given to the command line (flags, ``CLOUDRL__*`` variables, YAML
files) are one line on stderr naming the field and the bound, exit code 2, before any work
starts: physics and reward weights, fleet and tier values, workload rates and trace
options, work-size limits, and the decision service's settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudrl.cli import main
from envs.workloads.google_trace import parse_task_events, save_trace

SAMPLE = Path(__file__).parent / "fixtures" / "google_v2_task_events_sample.csv.gz"


@pytest.fixture(autouse=True)
def _no_cloudrl_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("CLOUDRL__"):
            monkeypatch.delenv(key)


def _one_line_exit_2(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize(("var", "value", "needles"), [
    ("CLOUDRL__ENV__SIM__ALPHA", "1.7e308", ("env.sim.alpha", "1000000")),
    ("CLOUDRL__ENV__SIM__BETA", "-1", ("env.sim.beta", "greater than or equal to 0")),
    ("CLOUDRL__ENV__SIM__TOGGLE_PENALTY", "1e7", ("env.sim.toggle_penalty", "1000000")),
    ("CLOUDRL__ENV__SIM__TICK_SECONDS", "0.0001", ("env.sim.tick_seconds", "0.001")),
    ("CLOUDRL__ENV__SIM__TICK_SECONDS", "1e6", ("env.sim.tick_seconds", "86400")),
    ("CLOUDRL__ENV__SIM__WAKE_DELAY", "9223372036854775807", ("env.sim.wake_delay", "1000000")),
    ("CLOUDRL__ENV__SIM__QUEUE_CAPACITY", "10000000000", ("env.sim.queue_capacity",)),
    ("CLOUDRL__ENV__SIM__DIURNAL_PERIOD", "1000000000", ("env.sim.diurnal_period", "1000000")),
    ("CLOUDRL__ENV__SIM__EPISODE_LENGTH", "2000000", ("max_episode_ticks (1000000)",)),
    ("CLOUDRL__ENV__SIM__LIMITS__MAX_EPISODE_JOBS", "0", ("max_episode_jobs", "1")),
    ("CLOUDRL__ENV__SIM__FLEET__N_SERVERS", "5000", ("env.sim.fleet.n_servers", "4096")),
    ("CLOUDRL__ENV__WORKLOAD__RATE", "1e-9", ("rate", "0.000001")),
    ("CLOUDRL__ENV__WORKLOAD__RATE", "1000", ("workload.rate", "max_episode_jobs = 200,000")),
    ("CLOUDRL__ENV__WORKLOAD__DURATION_SIGMA", "1e300", ("duration_sigma", "4")),
    ("CLOUDRL__ENV__WORKLOAD__CPU_LOW", "1e-300", ("cpu_low", "0.001")),
])
def test_env_variables_out_of_range(monkeypatch, capsys, var, value, needles):
    monkeypatch.setenv(var, value)
    line = _one_line_exit_2(capsys, ["evaluate", "--n-seeds", "1"], *needles)
    assert var in line or "max_episode" in line  # the variable that set it is named


@pytest.mark.parametrize(("flags", "needles"), [
    (["--n-servers", "0"], ("n_servers", "greater than or equal to 1")),
    (["--n-servers", "100000"], ("n_servers", "4096")),
    (["--episode-length", "0"], ("episode_length",)),
    (["--episode-length", "10000000"], ("max_episode_ticks",)),
])
def test_flags_out_of_range(capsys, flags, needles):
    _one_line_exit_2(capsys, ["evaluate", "--n-seeds", "1", *flags], *needles)


TIER = "{name: big, cpu_cores: 64, mem_gib: 256, p_idle_w: 100, p_max_w: 300"


@pytest.mark.parametrize(("yaml_text", "needles"), [
    (f"env: {{sim: {{fleet: {{tiers: [{TIER}, power_exponent: 1000000}}]}}}}}}\n",
     ("power_exponent", "10")),
    (f"env: {{sim: {{fleet: {{tiers: [{TIER}, share: 0}}]}}}}}}\n", ("share", "0.000001")),
    ("env: {sim: {fleet: {tiers: [{name: x, cpu_cores: 1e9, mem_gib: 8, p_idle_w: 1, "
     "p_max_w: 2}]}}}\n", ("cpu_cores", "100000")),
    ("env: {sim: {fleet: {tiers: [{name: x, cpu_cores: 8, mem_gib: 8, p_idle_w: 1, "
     "p_max_w: 1e9}]}}}\n", ("p_max_w", "100000")),
    ("env: {workload: {kind: google_v2_like, burst_factor: 1e9}}\n", ("burst_factor", "100")),
    ("env: {workload: {kind: poisson, deadline: {slack_high: 1e12}}}\n", ("slack_high", "100")),
    ("env: {workload: {kind: poisson, load: null, duration_mean: 1e8}}\n",
     ("workload.load", "warm start", "max_episode_jobs")),
])
def test_config_files_out_of_range(tmp_path, capsys, yaml_text, needles):
    path = tmp_path / "run.yaml"
    path.write_text(yaml_text)
    line = _one_line_exit_2(capsys, ["evaluate", "--config", str(path), "--n-seeds", "1"],
                            *needles)
    assert str(path) in line


@pytest.fixture(scope="module")
def sample_trace(tmp_path_factory) -> Path:
    jobs, report = parse_task_events([SAMPLE])
    return save_trace(tmp_path_factory.mktemp("cli") / "sample.npz", jobs, report)


@pytest.mark.parametrize(("time_scale", "needles"), [
    (100, ("workload.time_scale", "jobs", "max_episode_jobs = 200,000")),
    (1e4, ("time_scale", "1000")), (1e-5, ("time_scale", "0.001"))])
def test_trace_options_out_of_range(tmp_path, capsys, sample_trace, time_scale, needles):
    path = tmp_path / "trace.yaml"
    path.write_text(f"env: {{workload: {{kind: trace, path: {sample_trace}, "
                    f"time_scale: {time_scale}}}}}\n")
    _one_line_exit_2(capsys, ["evaluate", "--config", str(path), "--n-seeds", "1"], *needles)


@pytest.mark.parametrize(("yaml_text", "field", "bound"), [
    ("max_batch_size: 1000000\n", "max_batch_size", "4096"),
    ("model_timeout_s: 1e9\n", "model_timeout_s", "600"),
    ("num_replicas: 0\n", "num_replicas", "1"),
    ("max_body_bytes: 1e12\n", "max_body_bytes", ""),
    ("env: {sim: {alpha: 1e300}}\n", "env.sim.alpha", "1000000"),
    ("env: {workload: {rate: 5000}}\n", "workload.rate", "max_episode_jobs"),
])
def test_serve_settings_out_of_range(tmp_path, capsys, yaml_text, field, bound):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml_text)
    _one_line_exit_2(capsys, ["serve", "--config", str(path), "--state-db",
                              str(tmp_path / "s.db")], field, bound)
