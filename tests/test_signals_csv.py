"""Signal files: the real German file imports cleanly, broken files fail with one line that
names the line and the column, and real sources resample exactly and pick days by seed."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from envs.signals import SignalConfig, make_signals
from envs.signals.csv_import import SignalFileError, read_signal_file
from envs.signals.real import DE_CARBON_2020

GERMAN = Path("/work/shared/data/carbon/de_2020_carbon_intensity.csv")
HEADER = "timestamp,price_usd_per_mwh,carbon_g_per_kwh,solar_kw"


def _good_rows(n: int = 8, step_min: int = 15) -> list[str]:
    rows = []
    for i in range(n):
        m = i * step_min
        rows.append(f"2020-03-02T{m // 60:02d}:{m % 60:02d}:00,{40 + i},{300 - i},{i * 0.5}")
    return rows


def _write(tmp_path: Path, lines: list[str], name: str = "s.csv") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.skipif(not GERMAN.is_file(), reason="shared German carbon data not present")
def test_the_real_german_file_imports_cleanly():
    t = read_signal_file(GERMAN)
    assert t.layout == "carbon-only" and t.price is None and t.solar is None
    assert t.n_rows == 37147 and t.interval_s == 900.0
    assert str(t.times[0]) == "2019-12-20T00:00:00"
    assert 310 < t.carbon.mean() < 320 and 100 < t.carbon.min() < 102 and t.carbon.max() > 592


def test_the_shipped_slice_is_2020_and_matches_the_source():
    t = read_signal_file(DE_CARBON_2020)
    assert str(t.times[0]) == "2020-01-01T00:00:00" and str(t.end) == "2021-01-01T00:00:00"
    assert t.n_rows == 35134  # two single rows missing in the source, forward-filled
    assert abs(t.carbon.mean() - 313.4) < 1.0
    assert DE_CARBON_2020.stat().st_size < 300_000
    if GERMAN.is_file():
        src = read_signal_file(GERMAN)
        sel = (src.times >= t.times[0]) & (src.times < t.end)
        assert np.array_equal(src.times[sel], t.times)
        np.testing.assert_allclose(src.carbon[sel], t.carbon, atol=0.05 + 1e-9)


def test_standard_schema_round_trip_and_exact_resampling(tmp_path):
    p = _write(tmp_path, [HEADER, *_good_rows(8)])
    t = read_signal_file(p)
    assert t.layout == "standard" and t.n_rows == 8 and t.interval_s == 900
    np.testing.assert_array_equal(t.price, 40 + np.arange(8.0))
    # 30-min ticks average pairs of rows; 5-min ticks forward-fill each row three times
    s = make_signals(SignalConfig(source="csv", csv_path=str(p)), 4, 1800, 0)
    np.testing.assert_allclose(s.price_usd_per_mwh, [40.5, 42.5, 44.5, 46.5])
    np.testing.assert_allclose(s.carbon_g_per_kwh, [299.5, 297.5, 295.5, 293.5])
    np.testing.assert_allclose(s.solar_kw, [0.25, 1.25, 2.25, 3.25])
    s5 = make_signals(SignalConfig(source="csv", csv_path=str(p)), 24, 300, 0)
    np.testing.assert_allclose(s5.price_usd_per_mwh, np.repeat(40 + np.arange(8.0), 3))
    assert str(s.start) == "2020-03-02T00:00:00"


def test_a_single_missing_row_is_forward_filled(tmp_path):
    rows = _good_rows(8)
    del rows[3]
    t = read_signal_file(_write(tmp_path, [HEADER, *rows]))
    assert t.n_rows == 7
    s = make_signals(SignalConfig(source="csv", csv_path=str(t.path)), 8, 900, 0)
    np.testing.assert_allclose(s.price_usd_per_mwh, [40, 41, 42, 42, 44, 45, 46, 47])


def test_gzip_offsets_and_space_separator(tmp_path):
    lines = [HEADER] + [r.replace("T", " ") for r in _good_rows(4)]
    p = tmp_path / "s.csv.gz"
    p.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    assert read_signal_file(p).n_rows == 4
    aware = [HEADER] + [r.replace(":00,", ":00+01:00,", 1) for r in _good_rows(4)]
    t = read_signal_file(_write(tmp_path, aware, "aware.csv"))
    assert str(t.times[0]) == "2020-03-01T23:00:00"  # converted to UTC


BROKEN = {
    # name: (lines, expected line number or None, expected fragment)
    "missing column": (["timestamp,price_usd_per_mwh", "2020-01-01T00:00:00,3"], 1,
                       "missing column 'carbon_g_per_kwh'"),
    "unknown column": (["timestamp,price_usd_per_kwh,carbon_g_per_kwh",
                        "2020-01-01T00:00:00,3,4"], 1, "unknown column 'price_usd_per_kwh'"),
    "duplicated column": (["timestamp,carbon_g_per_kwh,price_usd_per_mwh,carbon_g_per_kwh"],
                          1, "duplicated"),
    "empty value": ([HEADER, *_good_rows(3), "2020-03-02T00:45:00,40,,1"], 5,
                    "'carbon_g_per_kwh': empty value"),
    "nan": ([HEADER, *_good_rows(2), "2020-03-02T00:30:00,nan,300,1"], 4,
            "'price_usd_per_mwh': 'nan' is not a finite"),
    "not a number": ([HEADER, *_good_rows(2), "2020-03-02T00:30:00,40,abc,1"], 4,
                     "'carbon_g_per_kwh': 'abc' is not a number"),
    "negative carbon": ([HEADER, *_good_rows(4)[:3], "2020-03-02T00:45:00,40,-3,1"], 5,
                        "negative carbon intensity -3"),
    "negative solar": ([HEADER, *_good_rows(2), "2020-03-02T00:30:00,40,300,-1"], 4,
                       "'solar_kw': negative solar"),
    "not increasing": ([HEADER, *_good_rows(3), "2020-03-02T00:15:00,40,300,1"], 5,
                       "earlier than the previous row"),
    "duplicated timestamp": ([HEADER, *_good_rows(3), "2020-03-02T00:30:00,40,300,1"], 5,
                             "duplicates the previous row's timestamp"),
    "gap": ([HEADER, *_good_rows(4), "2020-03-02T02:00:00,40,300,1",
             "2020-03-02T02:15:00,40,300,1"], 6, "gap of 75 min"),
    "unparseable timestamp": ([HEADER, *_good_rows(2), "03/02/2020 00:30,40,300,1"], 4,
                              "unparseable timestamp '03/02/2020 00:30'"),
    "wrong field count": ([HEADER, *_good_rows(2), "2020-03-02T00:30:00,40,300"], 4,
                          "3 fields, expected 4"),
    "carbon in kg/kWh": ([HEADER] + [f"2020-01-01T0{i}:00:00,40,0.{3 + i},0" for i in range(4)],
                         5, "looks like kg/kWh"),
    "carbon in g/MWh": ([HEADER] + [f"2020-01-01T0{i}:00:00,40,{300000 + i},0"
                                    for i in range(4)], 2, "looks like g/MWh"),
    "price in $/kWh": ([HEADER] + [f"2020-01-01T0{i}:00:00,0.0{4 + i},300,0" for i in range(4)],
                       5, "looks like $/kWh"),
    "price absurd": ([HEADER] + [f"2020-01-01T0{i}:00:00,{40 + 1e5 * (i == 2)},300,0"
                                 for i in range(4)], 4, "wrong units"),
    "one row": ([HEADER, _good_rows(1)[0]], None, "at least 2"),
    "header only": ([HEADER], None, "at least 2"),
    "mixed offsets": ([HEADER, "2020-01-01T00:00:00+01:00,40,300,0",
                       "2020-01-01T00:15:00,40,300,0"], 3, "mixes times"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_files_fail_with_one_line_naming_line_and_column(tmp_path, case):
    lines, line_no, fragment = BROKEN[case]
    p = _write(tmp_path, lines)
    with pytest.raises(SignalFileError) as err:
        read_signal_file(p)
    msg = str(err.value)
    assert "\n" not in msg and fragment in msg and str(p) in msg
    if line_no is not None:
        assert f"line {line_no}" in msg


def test_empty_and_binary_files(tmp_path):
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(SignalFileError, match="empty"):
        read_signal_file(empty)
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 50)
    with pytest.raises(SignalFileError, match="not a readable CSV"):
        read_signal_file(binary)
    with pytest.raises(FileNotFoundError):
        read_signal_file(tmp_path / "missing.csv")


def test_real_source_picks_days_by_seed_and_is_deterministic():
    cfg = SignalConfig(source="de_carbon_2020")
    a = [make_signals(cfg, 2 * 96 + 96, 900, seed) for seed in range(6)]
    b = make_signals(cfg, 2 * 96 + 96, 900, 3)
    assert np.array_equal(a[3].carbon_g_per_kwh, b.carbon_g_per_kwh)
    assert np.array_equal(a[3].price_usd_per_mwh, b.price_usd_per_mwh)
    assert len({str(s.start) for s in a}) >= 5
    table = read_signal_file(DE_CARBON_2020)
    for s in a:  # 15-min ticks on 15-min data: the data themselves
        i = int(np.searchsorted(table.times, s.start))
        np.testing.assert_allclose(s.carbon_g_per_kwh[:50], table.carbon[i:i + 50])
        assert str(s.start).endswith("T00:00:00")


def test_real_source_too_long_or_outside_is_an_error(tmp_path):
    p = _write(tmp_path, [HEADER, *_good_rows(8)])
    with pytest.raises(SignalFileError, match="need"):
        make_signals(SignalConfig(source="csv", csv_path=str(p)), 9, 900, 0)
    with pytest.raises(SignalFileError, match="start_date"):
        make_signals(SignalConfig(source="de_carbon_2020", start_date="2020-12-31"), 200, 900, 0)
