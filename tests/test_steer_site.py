"""``cloudrl steer loop --site``: the loop on a real site's split parts. Training-side
episodes (pool, reward-model data, ES candidates) read the train part, selection the
validation part, the reported test the test part; checked on the series each seed gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cloudrl.sites.registry import BUILTIN
from cloudrl.sites.scenario import site_scenario
from cloudrl.sites.splits import slice_path
from envs.signals.make import make_signals
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[1]
PORTS = range(8760, 8780)


@pytest.mark.parametrize("args, field", [
    (("--site", "atlantis"), "unknown site 'atlantis'"),
    (("--site", "caiso", "--split", "by_moon"), "--split by_moon"),
    (("--site", "caiso", "--scenario", "tiny"), "exactly one"),
    (("--site", "caiso", "--carbon-model", "oracle"), "--carbon-model oracle"),
    (("--site", "caiso", "--start", str(ROOT / "checkpoints/sites/de_lu")), "--start"),
    (("--site", "caiso", "--start", str(ROOT / "checkpoints/sites/caiso"), "--canary", "a"),
     "--canary"),
])
def test_bad_site_input_is_one_line_and_exit_2(tmp_path, capsys, args, field):
    from cloudrl.cli import main

    out = tmp_path / "o"
    code = main(["steer", "loop", *args, "--operators", "a:lc_window", "--comparisons", "10",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0], err
    assert not out.exists()


@pytest.fixture
def slices(tmp_path, monkeypatch):
    """The site's part files are cut into a temporary cache."""
    monkeypatch.setenv("CLOUDRL_CACHE_DIR", str(tmp_path / "cache"))


def test_phase_scenarios_are_the_split_parts(slices):
    from cloudrl.steer.loop import LoopConfig, phase_scenarios

    site = BUILTIN["caiso"]
    scns = phase_scenarios(LoopConfig(site="caiso", split="regime_shift",
                                      carbon_model="seasonal_naive"))
    for part in ("train", "validation", "test"):
        assert scns[part].signals.csv_path == str(slice_path(site, "regime_shift", part))
        assert scns[part].name == f"caiso-regime_shift-{part}"
    one = phase_scenarios(LoopConfig(scenario="tiny"))
    assert one["train"] is one["validation"] is one["test"]


def _starts(cfg, seeds):
    return [np.datetime64(make_signals(cfg.signals, cfg.signal_ticks, cfg.tick_seconds,
                                       s).start).astype("datetime64[s]") for s in seeds]


@pytest.mark.slow
def test_site_loop_end_to_end_reads_no_test_date_before_the_test(tmp_path, slices):
    site, split = BUILTIN["de_lu"], "temporal"
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "cloudrl", "steer", "loop", "--site", "de_lu", "--split", split,
         "--carbon-model", "seasonal_naive", "--operators", "alice:hour_carbon",
         "--comparisons", "10", "--rounds", "1", "--pool-heuristic", "3", "--pool-mpc", "0",
         "--pool-seeds", "1", "--search-heuristic", "2", "--search-mpc", "0",
         "--val-seeds", "1", "--n-test-seeds", "2", "--members", "1", "--steps", "10",
         "--start", str(ROOT / "checkpoints/sites/de_lu"), "--pool-learned", "1",
         "--es-iterations", "1", "--es-pairs", "1", "--es-seeds", "1",
         "--port", str(free_port(PORTS)), "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=1200, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["learner_saw_utilities"] is False
    assert rep["pool_episodes"] == 6  # run-at-once + 3 heuristic + start + 1 perturbed
    assert {r["family"] for r in rep["rows"]} == {"signal_aware", "learned"}
    assert all(np.isfinite(r["utility_mean"]) for r in rep["rows"])

    per = site.splits[split]
    test_lo = np.datetime64(per.test.start).astype("datetime64[s]")
    phases = rep["phases"]
    names = " | ".join(p["phase"] for p in phases)
    for want in ("pool", "search selection", "steering alice candidates",
                 "steering alice validation", "hidden-tuned reference alice candidates",
                 "hidden-tuned reference alice validation", "test"):
        assert want in names, names
    for ph in phases:
        part = ph["part"]
        want = ("test" if ph["phase"] == "test" else
                "train" if ph["phase"].startswith("pool") or ph["phase"].endswith("candidates")
                else "validation")
        assert part == want, ph
        cfg = site_scenario(site, split, part, carbon_model="seasonal_naive")
        # the names the simulators of the phase's episodes carried
        assert ph["played"] == [f"de_lu-{split}-{part}"], ph
        assert ph["csv_path"] == cfg.signals.csv_path == str(slice_path(site, split, part))
        assert ph["seeds"], ph
        lo = np.datetime64(getattr(per, part).start).astype("datetime64[s]")
        hi = np.datetime64(getattr(per, part).end).astype("datetime64[s]")
        need = np.timedelta64(int(cfg.signal_ticks * cfg.tick_seconds), "s")
        for seed, start in zip(ph["seeds"], _starts(cfg, ph["seeds"]), strict=True):
            # every episode (and its forecast horizon) lies in its part's file; before the
            # test period unless it is the test
            assert lo - np.timedelta64(8, "D") <= start and start + need <= hi, (ph, seed)
            if part != "test":
                assert start + need <= test_lo, (ph["phase"], seed, start)
    # the reward model's data: every labelled segment is a pool episode of the train part
    pool_seeds = set(phases[0]["seeds"])
    labels = json.loads((out / "labels.json").read_text())["alice"]
    assert labels
    for lab in labels:
        for key in (lab["a"], lab["b"]):
            assert key.startswith(f"steer:de_lu-{split}-train:"), key
            assert int(key.rsplit(":", 1)[1]) in pool_seeds, key
