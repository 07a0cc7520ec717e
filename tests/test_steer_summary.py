"""``cloudrl steer summary``: the steered rows of several loop reports per hidden utility,
the median shares by label count, ``n/a`` where the reference found no gap, drifted
operators apart, and one line with exit code 2 for a path that is not a report."""

from __future__ import annotations

import json

import pytest

from cloudrl.steer.summary import markdown, summarise


def _row(op, util, family, policy, u, d, gap=0.0, gap_h=0.0, labels=None):
    r = {"operator": op, "utility": util, "family": family, "policy": policy,
         "utility_mean": u, "cost_usd_mean": 1.0, "vs_default_heuristic": [d, d - 1, d + 1],
         "gap_closed": gap, "gap_closed_vs_heuristic": gap_h}
    if labels:
        r["labels"] = labels
    return r


def _report(seed, steered_u, hidden_u=4.0, default_u=5.0, heur_u=6.0):
    rows = [_row("ann", "lc_window", "learned", "default", default_u, default_u - heur_u),
            _row("ann", "lc_window", "learned", "hidden", hidden_u, hidden_u - heur_u)]
    for n, u in steered_u.items():
        rows.append(_row("ann" if n == 300 else f"ann@{n}", "lc_window", "learned",
                         "steered", u, u - heur_u, (default_u - u) / (default_u - hidden_u),
                         (heur_u - u) / (heur_u - hidden_u), labels=n))
    rows.append(_row("zed", "toggle_cap>lc_window@0.5", "learned", "steered", 4.5, -1.5,
                     labels=300))
    return {"config": {"seed": seed, "comparisons": 300}, "rows": rows}


def test_rows_medians_and_drift_apart():
    reps = [_report(0, {100: 4.8, 300: 4.2}), _report(1, {300: 4.6}), _report(2, {300: 3.9})]
    s = summarise(reps)
    rows = s["rows"]["lc_window|learned"]
    ann = [r for r in rows if r["operator"].startswith("ann")]
    assert len(ann) == 4 and len(rows) == 7  # the drifted zed ends at lc_window too
    assert {r["seed"] for r in ann} == {0, 1, 2}
    md = markdown(s)
    # shares of 300 labels: 80%, 40%, 110% -> median 80%; from the heuristic: 90%, 70%, 105%
    assert "| `lc_window` | learned | 300 | 3 | 80% | 90% |" in md
    assert "| `lc_window` | learned | 100 | 1 | 20% | 60% |" in md
    main, _, drift = md.partition("Operators whose utility switched")
    assert "toggle_cap>lc_window" not in main and "`toggle_cap>lc_window@0.5` zed" in drift


def test_no_gap_to_close_is_na():
    s = summarise([_report(0, {300: 4.8}, hidden_u=5.2)])  # the reference is worse
    r = [r for r in s["rows"]["lc_window|learned"] if r["operator"] == "ann"][0]
    assert r["gap_closed"] != r["gap_closed"]  # nan
    assert r["gap_closed_vs_heuristic"] == pytest.approx((6.0 - 4.8) / (6.0 - 5.2))
    assert "| `lc_window` | learned | 300 | 1 | n/a | 150% |" in markdown(s)


def test_median_over_the_runs_with_a_gap_says_how_many():
    # run 1's reference is worse than the start and the heuristic: no gap on that run
    reps = [_report(0, {300: 4.5}), _report(1, {300: 4.8}, hidden_u=6.5),
            _report(2, {300: 4.1})]
    md = markdown(summarise(reps))
    # shares 50% and 90% (from the heuristic 75%, 95%): medians of the two runs with a gap
    assert "| `lc_window` | learned | 300 | 3 | 70% (2 of 3) | 85% (2 of 3) |" in md
    md = markdown(summarise([_report(1, {300: 4.8}, hidden_u=6.5)]))
    assert "| `lc_window` | learned | 300 | 1 | n/a | n/a |" in md


def test_cli_reads_dirs_and_names_a_bad_path(tmp_path, capsys):
    from cloudrl.cli import main

    (tmp_path / "r0").mkdir()
    (tmp_path / "r0" / "report.json").write_text(json.dumps(_report(0, {300: 4.2})))
    assert main(["steer", "summary", str(tmp_path / "r0"), "--json",
                 str(tmp_path / "s.json")]) == 0
    assert "| `lc_window` | learned | 300 | 1 | 80% | 90% |" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["rows"]["lc_window|learned"]
    bad = tmp_path / "nope.json"
    bad.write_text("{")
    assert main(["steer", "summary", str(bad)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "nope.json" in err[0]


def test_a_false_alarm_keeps_the_model_of_all_labels():
    rep = _report(0, {300: 4.6})
    stale = dict(rep["rows"][2], operator="ann:stale", utility_mean=4.2,
                 gap_closed=0.8, gap_closed_vs_heuristic=0.9)
    rep["rows"].append(stale)
    s = summarise([rep])
    rows = {r["operator"]: r for r in s["rows"]["lc_window|learned"]}
    assert rows["ann"]["U"] == 4.2
    assert rows["ann (retrained on a false alarm)"]["U"] == 4.6
    md = markdown(s)
    assert "| `lc_window` | learned | 300 | 1 | 80% | 90% |" in md
    assert "`lc_window` ann (retrained on a false alarm)" in md.split("switched")[1]
