"""Compare a sweep's learned policies with the heuristics, from what MLflow recorded.

``run_compare(...)`` reads the sweep's runs back with ``mlflow.search_runs``
(by default the latest sweep in the experiment), builds one table per
(workload, N): every heuristic, and every algorithm aggregated over its run
seeds, each as mean ± 95% CI of the test-seed metrics. A learned row's mean
is the mean of its runs' test means; its CI is that run's test CI with one
run seed, and the 95% t interval over the run seeds' means with several
(training variability, the honest error bar for RL). It prints the tables,
writes ``comparison.csv``, ``comparison.md``, ``pareto.png`` (energy vs SLA
violation rate, error bars = 95% CI, one panel per workload) and
``learning_curves.png`` (episode return and SLA violation rate against env
steps, one line per learned run) under ``out``, and logs them as artifacts of
a new MLflow run named ``compare``.

CLI: ``cloudrl compare --experiment cloudrl-sweep`` (files under
``results/compare/<experiment>/`` unless ``--out`` says otherwise).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from cloudrl import tracking
from cloudrl.config_loader import ConfigError
from cloudrl.evaluate import format_table
from cloudrl.metrics import METRIC_LABELS, METRICS, summarize

KINDS = ("heuristic", "learned")
CURVE_METRICS = ("episode_return_mean", "sla_violation_rate")
Group = tuple[str, int]  # (workload, n_servers)
LEARNED_NOTE = ("Learned rows: mean over run seeds of the test means; the CI is the run's test CI "
                "with one run seed, the 95% t interval across run seeds with several.")


def load_runs(experiment: str, tracking_uri: str | None = None,
              sweep_id: str | None = None) -> Any:
    """Finished learned and heuristic runs of ``sweep_id`` (None: the latest sweep; "all": all)."""
    import mlflow

    uri = tracking.resolve_tracking_uri(tracking_uri)
    db = tracking.sqlite_path(uri)
    if db is not None and not db.is_file():  # do not leave an empty database behind
        raise ConfigError(f"no MLflow database at {db}: run `cloudrl sweep` or `cloudrl demo` "
                          f"first, or pass --tracking-uri")
    mlflow.set_tracking_uri(uri)
    client = tracking.make_client(uri)
    if client.get_experiment_by_name(experiment) is None:
        names = sorted(e.name for e in client.search_experiments() if e.name != "Default")
        raise ConfigError(f"no MLflow experiment {experiment!r} at {uri}; experiments there: "
                          f"{', '.join(names) or 'none'} (choose one with --experiment)")
    df = mlflow.search_runs(experiment_names=[experiment],
                            filter_string="attributes.status = 'FINISHED'")
    if df.empty or "tags.kind" not in df or "metrics.test/sla_violation_rate_mean" not in df:
        raise ConfigError(f"experiment {experiment!r} has no finished sweep runs")
    df = df[df["tags.kind"].isin(KINDS) & df["metrics.test/sla_violation_rate_mean"].notna()]
    if sweep_id is None and not df.empty:
        sweep_id = df.sort_values("start_time")["tags.sweep_id"].iloc[-1]
    if sweep_id != "all":
        df = df[df["tags.sweep_id"] == sweep_id]
    if df.empty:
        raise ConfigError(f"no evaluated runs for sweep {sweep_id!r} in {experiment!r}")
    return df.reset_index(drop=True)


def _aggregate(runs: Any, label: str, kind: str) -> dict[str, Any]:
    row: dict[str, Any] = {"policy": label, "kind": kind, "runs": len(runs)}
    for m in METRICS:
        means = runs[f"metrics.test/{m}_mean"].astype(float).tolist()
        if len(means) == 1:
            row[f"{m}_mean"] = means[0]
            row[f"{m}_ci95"] = float(runs[f"metrics.test/{m}_ci95"].iloc[0])
        else:
            s = summarize(means)
            row[f"{m}_mean"], row[f"{m}_ci95"] = s.mean, s.ci95
    return row


def comparison_rows(df: Any) -> dict[Group, list[dict[str, Any]]]:
    """Per (workload, n_servers): heuristic rows first, then one row per algorithm."""
    from cloudrl.heuristics import HEURISTICS

    order = {name: i for i, name in enumerate(HEURISTICS)}
    out: dict[Group, list[dict[str, Any]]] = {}
    df = df.copy()
    # runs logged before interfaces were tagged are flat-interface runs
    iface = df.get("tags.interface")
    df["tags.interface"] = "flat" if iface is None else iface.fillna("flat")
    for (workload, n), group in df.groupby(["tags.workload", "tags.n_servers"], sort=True):
        rows = []
        heur = group[group["tags.kind"] == "heuristic"]
        keys = heur[["tags.interface", "tags.policy"]].drop_duplicates().itertuples(index=False)
        for interface, name in sorted(keys, key=lambda k: (k[0] != "flat", k[0],
                                                           order.get(k[1], 99))):
            runs = heur[(heur["tags.policy"] == name) & (heur["tags.interface"] == interface)]
            rows.append(_aggregate(runs, _label(name, interface), "heuristic"))
        learned = group[group["tags.kind"] == "learned"]
        for algo in sorted(learned["tags.policy"].unique()):
            runs = learned[learned["tags.policy"] == algo]
            label = f"{algo} ({len(runs)} run seed{'s' if len(runs) > 1 else ''})"
            rows.append(_aggregate(runs, _label(label, runs["tags.interface"].iloc[0]),
                                   "learned"))
        out[(str(workload), int(n))] = rows
    return out


def _label(name: str, interface: str) -> str:
    """Policies on the branching interface are marked; flat is the default."""
    return name if interface == "flat" else f"{name} [branching]"


def _title(group: Group, df: Any) -> str:
    seeds = df["tags.eval_seeds"].dropna().unique()
    return f"{group[0]}, N={group[1]}, {', '.join(seeds)} test seeds"


def write_tables(tables: dict[Group, list[dict[str, Any]]], df: Any, out: Path) -> list[Path]:
    """``comparison.csv`` (one row per workload x policy) and ``comparison.md``."""
    csv_path, md_path = out / "comparison.csv", out / "comparison.md"
    fields = ["workload", "n_servers", "policy", "kind", "runs"] + [
        f"{m}_{s}" for m in METRICS for s in ("mean", "ci95")]
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for (workload, n), rows in tables.items():
            writer.writerows({"workload": workload, "n_servers": n, **r} for r in rows)
    parts = ["# cloudrl comparison (mean ± 95% CI on held-out test seeds)\n", LEARNED_NOTE, ""]
    for group, rows in tables.items():
        parts += [f"## {_title(group, df)}\n", format_table(rows, markdown=True), ""]
    md_path.write_text("\n".join(parts))
    return [csv_path, md_path]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_plot(tables: dict[Group, list[dict[str, Any]]], path: Path) -> Path:
    """Energy (kWh) vs SLA violation rate, 95% CI error bars, one panel per workload."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(tables), figsize=(6 * len(tables), 4.5), squeeze=False)
    markers = "osD^v<>PX*h"
    for ax, (group, rows) in zip(axes[0], tables.items(), strict=True):
        for i, r in enumerate(rows):
            x, y = r["energy_kwh_mean"], r["sla_violation_rate_mean"]
            ax.errorbar(x, y, xerr=_bounded_err(x, r["energy_kwh_ci95"], 0.0, math.inf),
                        yerr=_bounded_err(y, r["sla_violation_rate_ci95"], 0.0, 1.0),
                        fmt=markers[i % len(markers)],
                        capsize=3, label=r["policy"],
                        markersize=8 if r["kind"] == "learned" else 6)
        ax.set(title=f"{group[0]} (N={group[1]})", xlabel=METRIC_LABELS["energy_kwh"],
               ylabel=METRIC_LABELS["sla_violation_rate"])
        ax.set_ylim(bottom=0.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("energy vs SLA violations (lower-left is better; bars: 95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _bounded_err(value: float, ci: float, low: float, high: float) -> list[list[float]]:
    """Asymmetric error bar of ``value ± ci`` clipped to [low, high] (a rate stays in [0, 1])."""
    ci = ci if math.isfinite(ci) else 0.0
    return [[min(ci, value - low)], [min(ci, high - value)]]


def learning_curves(df: Any, tracking_uri: str | None, path: Path) -> Path:
    """``episode_return_mean`` and ``sla_violation_rate`` vs env steps, per learned run."""
    plt = _pyplot()
    client = tracking.make_client(tracking_uri)
    learned = df[df["tags.kind"] == "learned"]
    groups = sorted({(w, int(n)) for w, n in zip(learned["tags.workload"],
                                                  learned["tags.n_servers"], strict=True)})
    fig, axes = plt.subplots(len(CURVE_METRICS), max(1, len(groups)),
                             figsize=(6 * max(1, len(groups)), 7), squeeze=False)
    for col, group in enumerate(groups):
        runs = learned[(learned["tags.workload"] == group[0])
                       & (learned["tags.n_servers"].astype(int) == group[1])]
        for _, run in runs.sort_values("tags.mlflow.runName").iterrows():
            for row, key in enumerate(CURVE_METRICS):
                hist = sorted(client.get_metric_history(run["run_id"], key),
                              key=lambda m: m.step)
                axes[row][col].plot([m.step for m in hist], [m.value for m in hist],
                                    marker=".", label=run["tags.mlflow.runName"])
        for row, key in enumerate(CURVE_METRICS):
            ax = axes[row][col]
            ax.set(title=f"{group[0]} (N={group[1]})", xlabel="env steps", ylabel=key)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
    fig.suptitle("training curves on train seeds (last 20 episodes; returns x reward_scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_compare(experiment: str = "cloudrl-sweep", tracking_uri: str | None = None,
                out: str | Path = "results/compare", sweep_id: str | None = None,
                log_to_mlflow: bool = True) -> dict[str, Any]:
    """Tables, plots and an MLflow ``compare`` run; returns tables, file paths and the run id."""
    df = load_runs(experiment, tracking_uri, sweep_id)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = comparison_rows(df)
    paths = write_tables(tables, df, out_dir)
    paths.append(pareto_plot(tables, out_dir / "pareto.png"))
    paths.append(learning_curves(df, tracking_uri, out_dir / "learning_curves.png"))
    sweeps = sorted(df["tags.sweep_id"].unique())
    run_id = None
    if log_to_mlflow:
        client = tracking.make_client(tracking_uri)
        exp_id = tracking.get_or_create_experiment(client, experiment)
        run_id = tracking.start_run(client, exp_id, "compare", {
            "kind": "compare", "sweep_id": sweeps[0] if len(sweeps) == 1 else "all"})
        tracking.log_params(client, run_id, {"sweeps": ",".join(sweeps),
                                             "runs": ",".join(df["run_id"])})
        tracking.log_artifacts(client, run_id, paths)
        tracking.end_run(client, run_id)
    return {"tables": tables, "text": {group: format_table(rows) for group, rows in
                                       tables.items()},
            "titles": {group: _title(group, df) for group in tables},
            "paths": paths, "run_id": run_id, "sweeps": sweeps}
