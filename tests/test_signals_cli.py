"""``cloudrl signals check|show``: a summary for a good file, one line and exit 2 for a bad
one, and a picture from a source."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cloudrl import signals_cli
from envs.signals.real import DE_CARBON_2020


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cloudrl")
    signals_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def test_check_prints_a_summary_of_the_shipped_file(capsys):
    assert _run(["signals", "check", str(DE_CARBON_2020), "--tick-seconds", "3600"]) == 0
    out = capsys.readouterr().out
    assert "35134 rows" in out and "carbon-only layout" in out and "interval 15 min" in out
    assert "ticks of 3600 s: 8784" in out          # 366 days of 2020
    assert "mean     313.4" in out and "no price column" in out


def test_check_standard_file(tmp_path, capsys):
    p = tmp_path / "s.csv"
    p.write_text("timestamp,price_usd_per_mwh,carbon_g_per_kwh\n"
                 "2020-01-01T00:00:00,10,100\n2020-01-01T01:00:00,30,300\n")
    assert _run(["signals", "check", str(p), "--tick-seconds", "900"]) == 0
    out = capsys.readouterr().out
    assert "2 rows" in out and "ticks of 900 s: 8" in out
    assert "price_usd_per_mwh  mean      20.00  min      10.00  max      30.00" in out


@pytest.mark.parametrize("body,fragment", [
    ("timestamp,price_usd_per_mwh,carbon_g_per_kwh\n2020-01-01T00:00:00,10,100\n"
     "2020-01-01T01:00:00,30,-2\n", "line 3, column 'carbon_g_per_kwh': negative"),
    ("timestamp,carbon_g_per_kwh\n2020-01-01T00:00:00,100\n", "missing column"),
    ("Time,Carbon Intensity\n2020-01-01 00:00:00,0.3\n2020-01-01 00:15:00,0.31\n",
     "looks like kg/kWh"),
])
def test_check_bad_file_is_one_line_and_exit_2(tmp_path, capsys, body, fragment):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    assert _run(["signals", "check", str(p)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("cloudrl: ") and fragment in err


def test_check_missing_file_and_bad_tick(tmp_path, capsys):
    assert _run(["signals", "check", str(tmp_path / "nope.csv")]) == 2
    assert "not found" in capsys.readouterr().err
    assert _run(["signals", "check", str(DE_CARBON_2020), "--tick-seconds", "0"]) == 2
    assert "--tick-seconds" in capsys.readouterr().err


def test_show_writes_a_png(tmp_path, capsys):
    out = tmp_path / "img" / "s.png"
    rc = _run(["signals", "show", "--source", "synthetic", "--days", "2", "--seed", "3",
               "--solar-kwp", "50", "--solar-source", "synthetic", "--tick-seconds", "900",
               "--out", str(out)])
    assert rc == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 20_000
    assert "2 days from 2020-" in capsys.readouterr().out


def test_show_bad_config_is_one_line(tmp_path, capsys):
    rc = _run(["signals", "show", "--source", "csv", "--out", str(tmp_path / "x.png")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "csv_path" in err
    assert not (tmp_path / "x.png").exists()
    rc = _run(["signals", "show", "--forecast-error", "7", "--out", str(tmp_path / "x.png")])
    assert rc == 2 and "forecast_error" in capsys.readouterr().err


def test_registered_in_the_cloudrl_cli():
    text = Path("cloudrl/cli.py").read_text()
    assert "signals_cli.register(sub)" in text


@pytest.mark.slow
def test_through_the_cloudrl_entry_point(tmp_path, capsys):
    from cloudrl.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,price_usd_per_mwh,carbon_g_per_kwh\n2020-01-01T00:00:00,1,2\n"
                   "2020-01-01T00:00:00,1,2\n")
    assert main(["signals", "check", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "line 3, column 'timestamp'" in err
    assert main(["signals", "check", str(DE_CARBON_2020)]) == 0
