"""The real-sites results page and its JSON from raw ``cloudrl sites headroom`` results.

One JSON row per site and split: the periods, the number of test windows, the mean cost of
the heuristic, the MPC, the fluid oracle and the learned policy (null when none was
tested), paired 95% CIs per cost term, SLA per class, the costs with a monthly peak-kW
demand charge, and each forecaster's error by lead on the test period
(:mod:`cloudrl.sites.forecast_eval`). The Markdown page is made from the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.scenarios.runner import paired_ci
from cloudrl.sites.forecast_eval import evaluate_forecasts
from cloudrl.sites.headroom import summarise
from cloudrl.sites.registry import get_site

CONTROLLERS = ("heuristic", "mpc", "fluid oracle", "learned", "fluid oracle, 1 plan")
LEADS = (1, 6, 12, 24)


def _row(raw: dict[str, Any]) -> dict[str, Any]:
    s = summarise(raw)
    means = s["means"]
    fc = evaluate_forecasts(get_site(raw["site"]), raw["split"])
    p = raw["periods"]
    sel = raw["selection"]
    return {
        "site": raw["site"], "split": raw["split"],
        "train_period": f"{p['train']['start']}..{p['train']['end']}",
        "validation_period": f"{p['validation']['start']}..{p['validation']['end']}",
        "test_period": f"{p['test']['start']}..{p['test']['end']}",
        "n_test_windows": len(raw["windows"]),
        "windows_per_season": {k: sum(w["season"] == k for w in raw["windows"])
                               for k in ("DJF", "MAM", "JJA", "SON")},
        "heuristic": {"kind": sel["selected"], "params": sel["tuned"][sel["selected"]]["params"],
                      "validation_cost": sel["validation_cost"]},
        "heuristic_cost": means["heuristic"]["cost_usd"],
        "mpc_cost": means["mpc"]["cost_usd"],
        "oracle_cost": means["fluid oracle"]["cost_usd"],
        "learned_cost": means["learned"]["cost_usd"] if "learned" in means else None,
        "cost_terms": means,
        "diff_vs_heuristic_ci95": {k: s["diff_vs_heuristic"].get(k) for k in CONTROLLERS[1:]},
        "diff_vs_mpc_ci95": {k: s["diff_vs_mpc"].get(k) for k in CONTROLLERS[2:]},
        "reused": bool(raw.get("reused")),
        "sla_by_class": {k: {"latency_critical": m["sla_lc"], "batch": m["sla_batch"],
                             "latency_critical_usd": m["sla_lc_usd"],
                             "batch_usd": m["sla_batch_usd"]} for k, m in means.items()},
        "with_demand_charge": {"usd_per_kw_month": s["demand_usd_per_kw_month"],
                               "mean_cost": s["with_demand_charge"]},
        "forecast_error_by_lead": fc,
        "size": raw["size"], "wall_s": raw["wall_s"],
        "learned": _learned(raw, s) if "train" in raw else None,
    }


def _learned(raw: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """How the learned row was made (``cloudrl sites train``) and its paired differences."""
    tr = raw["train"]
    base = s["means"]["mpc"]["cost_usd"]
    d = s["diff_vs_mpc"]["learned"]
    per = raw["per_window"]

    def part(who: str, keys: tuple[str, ...]) -> np.ndarray:
        return np.array([sum(m[k] for k in keys) for m in per[who]])

    split_terms = {}
    for ref in ("heuristic", "mpc"):
        for name, keys in (("energy_and_carbon", ("energy_usd", "carbon_usd")),
                           ("sla", ("sla_lc_usd", "sla_batch_usd"))):
            split_terms[f"{name}_vs_{ref}"] = list(paired_ci(part("learned", keys),
                                                             part(ref, keys)))
    return {"family": tr["family"], "selected": tr["selected"],
            "by_cost_term_ci95": split_terms,
            "validation_cost": tr["validation_cost"], "size": tr["size"],
            "workers": tr["workers"], "wall_s": tr["wall_s"],
            "command": tr.get("command"),
            "diff_vs_mpc_pct_ci95": [100 * x / base for x in d]}


def _ci(x: list[float] | None, fmt: str = "{:+.2f}") -> str:
    if not x:
        return "n/a"
    return f"{fmt.format(x[0])} [{fmt.format(x[1])}, {fmt.format(x[2])}]"


def _verdict(ci: list[float]) -> str:
    if ci[2] < 0:
        return "cheaper than the heuristic"
    if ci[1] > 0:
        return "dearer than the heuristic"
    return "not distinguishable from the heuristic"


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    out = ["# Real sites: results", "",
           "Produced by:", "", "```bash", command, "```", "",
           "Every number below is printed into this page by that last command from the raw "
           "results of the `cloudrl sites headroom` and `cloudrl sites train` runs it names. "
           "Costs are dollars per "
           "2-day test window (arrivals for 2 days, then the drain), means over the windows; "
           "differences are paired by window (the same window, seed and forecasts for "
           "every controller) with 95% t-intervals. Electricity Maps data via "
           "SustainCluster, ODbL 1.0.", "",
           "## Headroom on the test windows", "",
           "| site | split | train → test | windows | heuristic (chosen on validation) | "
           "heuristic $ | MPC $ | fluid oracle $ | learned $ | MPC − heuristic % [95% CI] | "
           "oracle − heuristic % [95% CI] |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["diff_vs_heuristic_ci95"]
        out.append(
            f"| {r['site']} | {r['split']} | {r['train_period'][:4]} → {r['test_period'][:4]} "
            f"| {r['n_test_windows']} | {r['heuristic']['kind']} | {r['heuristic_cost']:.2f} | "
            f"{r['mpc_cost']:.2f} | {r['oracle_cost']:.2f} | "
            f"{'—' if r['learned_cost'] is None else format(r['learned_cost'], '.2f')} | "
            f"{_ci(d['mpc']['cost_pct'], '{:+.1f}')} | "
            f"{_ci(d['fluid oracle']['cost_pct'], '{:+.1f}')} |")
    out += ["", "Verdicts (from the intervals above): "]
    for r in rows:
        d = r["diff_vs_heuristic_ci95"]
        out.append(f"- {r['site']} {r['split']}: the MPC is "
                   f"{_verdict(d['mpc']['cost_pct'])}; the fluid oracle is "
                   f"{_verdict(d['fluid oracle']['cost_pct'])}"
                   + (f"; the learned policy is {_verdict(d['learned']['cost_pct'])}"
                      if d.get("learned") else "") + ".")
    out += ["", "Which terms differ (95% CI excluding 0; $ per window, controller minus "
            "heuristic), and the difference once the demand charge below is added:", ""]
    names = {"energy_usd": "energy", "carbon_usd": "carbon", "sla_lc_usd": "SLA latency-"
             "critical", "sla_batch_usd": "SLA batch"}
    for r in rows:
        for who in ("mpc", "fluid oracle", "learned"):
            d = r["diff_vs_heuristic_ci95"].get(who)
            if not d:
                continue
            terms = [f"{names[k]} {d[k][0]:+.2f}" for k in names if d[k][1] > 0 or d[k][2] < 0]
            dc = d["cost_with_demand_charge"]
            out.append(f"- {r['site']} {r['split']}, {who}: "
                       f"{', '.join(terms) if terms else 'no term'}; with the demand charge "
                       f"{_ci(dc)} $ ({_verdict(dc)}).")
    out += _learned_section(rows)
    out += ["", "## Where the difference comes from: cost terms", "",
            "Mean $ per window, and each term's paired difference from the heuristic "
            "($, 95% CI). SLA $ is violations times the class penalty ($1 latency-critical, "
            "$2 batch); the rates are violations per ended job.", "",
            "| site | split | controller | energy $ | carbon $ | SLA lc $ | SLA batch $ | "
            "SLA lc rate | SLA batch rate | Δ energy $ | Δ carbon $ | Δ SLA lc $ | "
            "Δ SLA batch $ |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for name, m in r["cost_terms"].items():
            d = r["diff_vs_heuristic_ci95"].get(name) or {}
            out.append(
                f"| {r['site']} | {r['split']} | {name} | {m['energy_usd']:.2f} | "
                f"{m['carbon_usd']:.2f} | {m['sla_lc_usd']:.2f} | {m['sla_batch_usd']:.2f} | "
                f"{100 * m['sla_lc']:.3f}% | {100 * m['sla_batch']:.3f}% | "
                f"{_ci(d.get('energy_usd'))} | {_ci(d.get('carbon_usd'))} | "
                f"{_ci(d.get('sla_lc_usd'))} | {_ci(d.get('sla_batch_usd'))} |")
    rate = rows[0]["with_demand_charge"]["usd_per_kw_month"] if rows else 0
    out += ["", "## With a monthly peak-kW demand charge", "",
            f"A commercial tariff adds ${rate:g} per kW of the month's highest grid draw, "
            "prorated here to the window (2 days / 30). No controller is told about it; "
            "the charge is added to each window's cost afterwards from its peak grid kW.", "",
            "| site | split | controller | mean peak kW | cost + demand charge $ | "
            "Δ vs heuristic $ [95% CI] |", "|---|---|---|---|---|---|"]
    for r in rows:
        for name, m in r["cost_terms"].items():
            d = (r["diff_vs_heuristic_ci95"].get(name) or {}).get("cost_with_demand_charge")
            out.append(f"| {r['site']} | {r['split']} | {name} | {m['peak_kw']:.1f} | "
                       f"{r['with_demand_charge']['mean_cost'][name]:.2f} | {_ci(d)} |")
    out += ["", "## Forecast error on the test period, by lead", "",
            "Forecasts issued at every hour of the test period, as the controllers see them. "
            "`price_market`: published day-ahead prices exact, the rest the same hour a week "
            "earlier; MAPE over hours with |price| >= 10 $/MWh. Carbon: seasonal-naive (a "
            "day earlier) and boosted trees fit on the train period only.", "",
            "| site | split | forecaster | " + " | ".join(
                f"+{h} h MAE (MAPE %)" for h in LEADS) + " |",
            "|---|---|---|" + "---|" * len(LEADS)]
    for r in rows:
        fc = r["forecast_error_by_lead"]
        for name in ("price_market", "price_seasonal_naive_week",
                     "carbon_seasonal_naive_day", "carbon_gbt"):
            cells = [f"{fc[name]['mae'][h - 1]:.1f} ({fc[name]['mape'][h - 1]:.1f})"
                     for h in LEADS]
            out.append(f"| {r['site']} | {r['split']} | {name} | " + " | ".join(cells) + " |")
        share = fc["price_published_share"]
        out.append(f"| {r['site']} | {r['split']} | price hours already published | " +
                   " | ".join(f"{100 * share[h - 1]:.0f}%" for h in LEADS) + " |")
    out += ["", "## Size of the runs", "",
            "| site | split | windows per season (DJF/MAM/JJA/SON) | tuning points x seeds "
            "per rule | workers | wall s |", "|---|---|---|---|---|---|"]
    for r in rows:
        w = r["windows_per_season"]
        sz = r["size"]
        out.append(f"| {r['site']} | {r['split']} | {w['DJF']}/{w['MAM']}/{w['JJA']}/"
                   f"{w['SON']} | {sz['tune_samples']} (+1 corner) x {sz['tune_seeds']} | "
                   f"{sz['workers']} | {r['wall_s']:.0f} |")
    return "\n".join(out) + "\n"


def _learned_section(rows: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in rows if r.get("learned")]
    if not rows:
        return []
    out = ["", "## The learned policy (`cloudrl sites train`)", "",
           "Distilled from a teacher (behaviour cloning + DAgger) and fine-tuned on the true "
           "cost by evolution strategies, on train-period episodes only. The teacher is the "
           "forecast MPC (`distill_fine_ready*`) or the site's tuned rule "
           "(`distill_rule_fine_ready*`); with `--teacher both` both are trained and the four "
           "checkpoints compete on validation-period episodes; the chosen one plays the same "
           "test windows as the rows above. Paired differences per window, learned minus each "
           "controller.", "",
           "| site | split | selected (validation $) | learned $ | − heuristic % [95% CI] | "
           "− MPC % [95% CI] | − MPC $ [95% CI] | SLA lc rate | SLA batch rate |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lr = r["learned"]
        m = r["cost_terms"]["learned"]
        val = ", ".join(f"{k} {v:.2f}" for k, v in lr["validation_cost"].items())
        out.append(f"| {r['site']} | {r['split']} | {lr['selected']} ({val}) | "
                   f"{r['learned_cost']:.2f} | "
                   f"{_ci(r['diff_vs_heuristic_ci95']['learned']['cost_pct'], '{:+.1f}')} | "
                   f"{_ci(lr['diff_vs_mpc_pct_ci95'], '{:+.1f}')} | "
                   f"{_ci(r['diff_vs_mpc_ci95']['learned'])} | {100 * m['sla_lc']:.3f}% | "
                   f"{100 * m['sla_batch']:.3f}% |")
    out += ["", "Does learning pay? Planning around prices (energy + carbon) apart from "
            "deadlines (SLA), learned minus each, $ per window [95% CI]:", ""]
    for r in rows:
        lr, t = r["learned"], r["learned"]["by_cost_term_ci95"]
        h = r["diff_vs_heuristic_ci95"]["learned"]["cost_pct"]
        m = lr["diff_vs_mpc_pct_ci95"]
        out.append(
            f"- {r['site']} {r['split']}: against the heuristic {_ci(h, '{:+.1f}')}% "
            f"({_verdict(h)}): energy + carbon {_ci(t['energy_and_carbon_vs_heuristic'])}, "
            f"SLA {_ci(t['sla_vs_heuristic'])}; against the MPC {_ci(m, '{:+.1f}')}% "
            f"({_verdict(m).replace('the heuristic', 'the MPC')}): energy + carbon "
            f"{_ci(t['energy_and_carbon_vs_mpc'])}, SLA {_ci(t['sla_vs_mpc'])}.")
    out += ["", "Size of the training runs (`cloudrl sites train`, one worker, on a machine "
            "shared with other jobs; `train s` counts what that command trained: a family an "
            "earlier run trained into the same `--out-dir` with the same settings is reused):",
            "",
            "| site | split | expert seeds | DAgger rounds x seeds | ES iterations x pairs "
            "x 4 seeds | validation episodes | train s | select s | test s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lr = r["learned"]
        z, w = lr["size"], lr["wall_s"]
        out.append(f"| {r['site']} | {r['split']} | {z['expert_seeds']} | "
                   f"{z['dagger_rounds']} x {z['dagger_seeds']} | {z['es_iterations']} x "
                   f"{z['es_pairs']} | {z['val_seeds']} | {w['train']:.0f} | "
                   f"{w['select']:.0f} | {w['test']:.0f} |")
    return out


def _headroom_command(r: dict[str, Any], path: str) -> list[str]:
    sz = r["size"]
    season = f" --per-season {sz['per_season']}" if sz["per_season"] else ""
    first = path.replace(".json", "-first.json") if r.get("reused") else path
    out = [f"cloudrl sites headroom --site {r['site']} --split {r['split']}{season} "
           f"--tune-samples {sz['tune_samples']} --tune-seeds {sz['tune_seeds']} "
           f"--workers {sz['workers']} --out {first}"]
    if r.get("reused"):
        out.append(f"cloudrl sites headroom --site {r['site']} --split {r['split']} "
                   f"--reuse {first} --workers {sz['workers']} --out {path}")
    return out


def _yardstick_section(rows: list[dict[str, Any]], ladders: dict[str, Any]) -> list[str]:
    """The ladder of each site that has one (``cloudrl sites yardstick``)."""
    from cloudrl.sites.yardstick import format_markdown

    have = [r for r in rows if f"{r['site']}/{r['split']}" in ladders]
    if not have:
        return []
    out = ["", "## The yardstick: sim-MPC, hindsight oracle and lower bound", "",
           "On a season-stratified subset of the same test windows (same dates and seeds): the "
           "sim-MPC plans on the simulator itself (sampled arrivals; published prices exact, "
           "the forecasts beyond), the same search with every price and carbon value known, "
           "the hindsight oracle (that search on the realised window) and the provable lower "
           "bound. Commands:", "", "```bash"]
    out += [ladders[f"{r['site']}/{r['split']}"]["command"] for r in have]
    out += ["```"]
    for r in have:
        lad = ladders[f"{r['site']}/{r['split']}"]
        sim = {x["name"]: x for x in lad["rows"]}.get("sim-MPC", {})
        out += ["", f"**{r['site']} {r['split']}**, {lad['n_windows']} of "
                f"{lad['n_windows_in_raw']} windows; bound below every controller on every "
                f"window: {'yes' if lad['bound_below_every_controller'] else 'NO'}; sim-MPC "
                f"{sim.get('replan_s', 0):.2f} s per re-plan:", "", format_markdown(lad)]
    return out


def write_report(raws: list[dict[str, Any]], json_out: Path, md_out: Path,
                 raw_paths: list[str] | None = None,
                 yardstick: dict[str, Any] | None = None,
                 yardstick_path: str | None = None) -> list[dict[str, Any]]:
    from cloudrl.sites.yardstick import report_fields

    ladders = yardstick or {}
    rows = [_row(r) for r in raws]
    for row in rows:
        lad = ladders.get(f"{row['site']}/{row['split']}")
        row.update(report_fields(lad) if lad else {"sim_mpc_cost": None,
                                                    "hindsight_cost": None,
                                                    "lower_bound_cost": None})
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    paths = raw_paths or [f"{r['site']}-{r['split']}.json" for r in raws]
    lines = []
    for r, path in zip(raws, paths, strict=True):
        tr = r.get("train")
        if tr and tr.get("headroom"):
            lines += _headroom_command(r, tr["headroom"])
        else:
            lines += _headroom_command(r, path)
        if tr and tr.get("command"):
            lines.append(tr["command"])
    ys = f" --yardstick {yardstick_path}" if yardstick_path else ""
    lines.append(f"cloudrl sites report {' '.join(paths)}{ys} --json {json_out} --md {md_out}")
    md = markdown(rows, "\n".join(lines))
    extra = _yardstick_section(rows, ladders)
    if extra:
        head, sep, tail = md.partition("\n## Where the difference comes from")
        md = head.rstrip("\n") + "\n" + "\n".join(extra) + "\n" + sep + tail
    md_out.write_text(md)
    return rows
