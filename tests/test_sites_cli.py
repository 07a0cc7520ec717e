"""``cloudrl sites add`` on the real command line: bad files are one line each and exit 2,
nothing is stored; good files make a site that ``sites list`` and ``show`` know."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cloudrl", "sites", *args], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)


def _write(path: Path, header: str, times, values) -> Path:
    path.write_text(header + "\n" + "".join(f"{t},{v}\n" for t, v in
                                            zip(times, values, strict=True)))
    return path


@pytest.fixture
def files(tmp_path):
    """90 days of hourly prices (some negative) and carbon from 2021-08-02, in UTC."""
    t = np.arange(np.datetime64("2021-08-02T00"), np.datetime64("2021-10-31T00"),
                  np.timedelta64(1, "h")).astype("datetime64[s]")
    rng = np.random.default_rng(7)
    hour = np.arange(len(t)) % 24
    price = np.round(64 + 41 * np.sin(2 * np.pi * hour / 24) + rng.normal(0, 9, len(t)), 2)
    price[[30, 31, 400]] = [-7.25, -0.5, -61.0]
    carbon = np.round(240 + 95 * np.cos(2 * np.pi * hour / 24) + rng.normal(0, 12, len(t)), 1)
    return tmp_path, t, price, carbon


def _env(tmp_path):
    return {"CLOUDRL_SITES_DIR": str(tmp_path / "my_sites"),
            "CLOUDRL_CACHE_DIR": str(tmp_path / "cache")}


def test_bad_files_are_one_line_each_and_exit_2(files):
    tmp, t, price, carbon = files
    good_c = _write(tmp / "c.csv", "timestamp,carbon_g_per_kwh", t, carbon)
    cases = {}
    # one missing hour (the importer alone would fill it)
    keep = np.ones(len(t), bool)
    keep[700] = False
    cases["gap"] = (_write(tmp / "gap.csv", "timestamp,price_usd_per_mwh", t[keep],
                           price[keep]), good_c, "2021-08-31T04:00:00 is missing", "")
    # a repeated hour where Berlin's clocks went back (2021-10-31 02:00 local) needs data
    # on that day: shift the whole file one day later
    t2 = t + np.timedelta64(1, "D")
    j = int(np.flatnonzero(t2 == np.datetime64("2021-10-31T02:00"))[0])
    t_dup = np.insert(t2[:-1], j + 1, t2[j])
    p_dup = np.insert(price[:-1], j + 1, price[j])
    cases["dst"] = (_write(tmp / "dst.csv", "timestamp,price_usd_per_mwh", t_dup, p_dup),
                    _write(tmp / "c2.csv", "timestamp,carbon_g_per_kwh", t2, carbon),
                    "duplicates the previous row's timestamp", "daylight-saving")
    # prices in $/kWh
    cases["units"] = (_write(tmp / "kwh.csv", "timestamp,price_usd_per_mwh", t, price / 1000),
                      good_c, "looks like $/kWh", "")
    # a non-finite price
    bad = price.astype(object)
    bad[1234] = "inf"
    cases["inf"] = (_write(tmp / "inf.csv", "timestamp,price_usd_per_mwh", t, bad), good_c,
                    "line 1236, column 'price_usd_per_mwh': 'inf' is not a finite", "")
    # negative carbon
    neg = carbon.copy()
    neg[2001] = -3.5
    good_p = _write(tmp / "p.csv", "timestamp,price_usd_per_mwh", t, price)
    cases["negative carbon"] = (good_p, _write(tmp / "neg.csv", "timestamp,carbon_g_per_kwh",
                                               t, neg),
                                "line 2003, column 'carbon_g_per_kwh': negative carbon", "")
    env = _env(tmp)
    for name, (p, c, needle, extra) in cases.items():
        r = _cli("add", "mysite", "--prices", str(p), "--carbon", str(c), "--timezone",
                 "Europe/Berlin", env=env)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, (name, r.stderr)
        assert len(lines) == 1, (name, lines)
        assert needle in lines[0] and extra in lines[0], (name, lines[0])
        assert "Traceback" not in r.stderr
        assert not (tmp / "my_sites" / "mysite").exists()
    # both files bad: one line each
    r = _cli("add", "mysite", "--prices", str(cases["units"][0]), "--carbon",
             str(cases["negative carbon"][1]), env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 2


def _main(capsys, monkeypatch, tmp, *args):
    """The same command in this process (the subprocess test above covers the entry)."""
    from cloudrl.cli import main

    for k, v in _env(tmp).items():
        monkeypatch.setenv(k, v)
    rc = main(["sites", *args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out.out, out.err)


def test_bad_options_are_one_line(files, capsys, monkeypatch):
    tmp, t, price, carbon = files
    p = _write(tmp / "p.csv", "timestamp,price_usd_per_mwh", t, price)
    c = _write(tmp / "c.csv", "timestamp,carbon_g_per_kwh", t, carbon)
    for args, needle in ((["--timezone", "Europe/Atlantis"], "--timezone"),
                         (["--currency-rate", "0"], "--currency-rate"),
                         (["--publish", "12h"], "--publish"),
                         (["--timezone", "UTC", "--currency-rate", "-2"], "--currency-rate")):
        r = _main(capsys, monkeypatch, tmp, "add", "x1", "--prices", str(p), "--carbon",
                  str(c), *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
        assert needle in r.stderr
    r = _main(capsys, monkeypatch, tmp, "add", "de_lu", "--prices", str(p), "--carbon", str(c))
    assert r.returncode == 2 and "shipped site" in r.stderr
    assert not (tmp / "my_sites").exists()


def test_a_good_site_is_stored_with_negative_prices_and_the_rate(files, capsys, monkeypatch):
    tmp, t, price, carbon = files
    p = _write(tmp / "p.csv", "timestamp,price_usd_per_mwh", t, price)
    c = _write(tmp / "c.csv", "timestamp,carbon_g_per_kwh", t, carbon)
    r = _main(capsys, monkeypatch, tmp, "add", "plant_7", "--prices", str(p), "--carbon",
              str(c), "--timezone", "America/Chicago", "--publish", "10:30",
              "--currency-rate", "1.25")
    assert r.returncode == 0, r.stderr
    from envs.signals.csv_import import read_signal_file

    table = read_signal_file(tmp / "my_sites" / "plant_7" / "signals.csv.gz")
    assert table.n_rows == len(t)
    np.testing.assert_allclose(table.price, price * 1.25, rtol=1e-12)
    assert table.price.min() == pytest.approx(-61.0 * 1.25)
    np.testing.assert_allclose(table.carbon, carbon)
    r = _main(capsys, monkeypatch, tmp, "list")
    assert "plant_7" in r.stdout and "added" in r.stdout
    r = _main(capsys, monkeypatch, tmp, "show", "plant_7")
    assert r.returncode == 0 and "America/Chicago" in r.stdout and "10:30" in r.stdout
    # train 60%, validation 15%, test 25% of the 90 days (whole days, rounded down)
    assert "train 2021-08-02..2021-09-25, validation 2021-09-25..2021-10-08, test " \
        "2021-10-08..2021-10-31" in r.stdout
    r = _main(capsys, monkeypatch, tmp, "show", "nowhere")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_headroom_and_report_refuse_bad_arguments_in_one_line(tmp_path, capsys, monkeypatch):
    for args, needle in ((["headroom", "--site", "atlantis"], "unknown site 'atlantis'"),
                         (["headroom", "--site", "caiso", "--split", "yearly"], "--split"),
                         (["headroom", "--site", "de_lu", "--per-season", "0"],
                          "--per-season"),
                         (["headroom", "--site", "de_lu", "--tune-seeds", "51"],
                          "--tune-seeds"),
                         (["report", str(tmp_path / "none.json"), "--json", "a.json", "--md",
                           "a.md"], "none.json")):
        r = _main(capsys, monkeypatch, tmp_path, *args)
        assert r.returncode == 2, args
        assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr


def test_train_refuses_bad_arguments_in_one_line(tmp_path, capsys, monkeypatch):
    other = tmp_path / "other.json"
    other.write_text('{"site": "caiso", "split": "temporal", "windows": [], "per_window": {}}')
    broken = tmp_path / "broken.json"
    broken.write_text('{"site": "de_lu"')
    for args, needle in ((["--site", "narnia"], "unknown site 'narnia'"),
                         (["--site", "caiso", "--split", "monthly"], "--split"),
                         (["--site", "de_lu", "--es-iterations", "0"], "--es-iterations"),
                         (["--site", "de_lu", "--val-seeds", "99"], "--val-seeds"),
                         (["--site", "caiso", "--expert-seeds", "40", "--dagger-rounds", "4"],
                          "train seeds"),
                         (["--site", "de_lu", "--workers", "0"], "--workers"),
                         (["--site", "de_lu", "--headroom", str(other)], "holds caiso"),
                         (["--site", "de_lu", "--headroom", str(broken)], "broken.json")):
        out = tmp_path / "out"
        r = _main(capsys, monkeypatch, tmp_path, "train", *args, "--out-dir", str(out))
        assert r.returncode == 2, args
        assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
        assert not out.exists()


@pytest.mark.slow  # a tiny training run on a real site: minutes here
def test_train_with_both_teachers_distils_the_headroom_runs_rule_and_selects(tmp_path):
    """``--teacher both`` distils the MPC and the headroom run's tuned signal-aware rule (its
    parameters recorded), fine-tunes each, and the validation episodes pick the cheapest of
    the four checkpoints, which is tested and published with its start."""
    import json

    raw = json.loads((ROOT / "results" / "sites" / "de_lu-temporal.json").read_text()) \
        if (ROOT / "results" / "sites" / "de_lu-temporal.json").is_file() else None
    if raw is None:  # a clean clone has no raw results: a small headroom run first
        head = tmp_path / "headroom.json"
        r = _cli("headroom", "--site", "de_lu", "--per-season", "1", "--tune-samples", "1",
                 "--tune-seeds", "1", "--out", str(head), env={"CLOUDRL_PROGRESS": "0"})
        assert r.returncode == 0, r.stderr
    else:
        head = tmp_path / "headroom.json"
        head.write_text(json.dumps(raw))
    out = tmp_path / "raw.json"
    pub = tmp_path / "published"
    r = subprocess.run([sys.executable, "-m", "cloudrl", "sites", "train", "--site", "de_lu",
                        "--teacher", "both", "--tiny", "--headroom", str(head),
                        "--out-dir", str(tmp_path / "runs"), "--out", str(out),
                        "--publish", str(pub)], cwd=ROOT, capture_output=True, text=True,
                       timeout=1800, env={**os.environ, "CLOUDRL_PROGRESS": "0",
                                          "CLOUDRL_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(out.read_text())
    sel = json.loads(head.read_text())["selection"]
    tr = got["train"]
    assert tr["teacher"] == "both"
    val = tr["validation_cost"]
    assert set(val) == {"distill_fine_ready", "distill_fine_ready_es",
                        "distill_rule_fine_ready", "distill_rule_fine_ready_es"}
    assert val[tr["selected"]] == min(val.values())
    assert tr["selected"] in (tr["family"], tr["base"])
    assert tr["teacher_of_selected"] == ("rule" if "rule" in tr["family"] else "mpc")
    assert tr["teacher_params"] == sel["tuned"]["signal_aware"]["params"]
    manifest = json.loads((tmp_path / "runs" / "de_lu-temporal" / "distill_rule_fine_ready"
                           / "run0" / "manifest.json").read_text())
    assert manifest["config"]["heuristic_params"] == tr["teacher_params"]
    assert len(got["per_window"]["learned"]) == len(got["windows"]) >= 4
    assert (pub / "policy.pt").is_file() and (pub / "site.json").is_file()
