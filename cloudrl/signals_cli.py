"""``cloudrl signals``: check a signal file, plot the signals a source makes.

Usage::

    cloudrl signals check prices.csv [--tick-seconds 300]
    cloudrl signals show --source synthetic --days 2 --seed 0 --solar-kwp 100 \\
        --out docs/img/signals.png

``check`` validates a file in the signal schema (or the carbon-only ``Time,Carbon
Intensity`` layout) and prints a summary; a bad file prints one line naming the line and
column on stderr and exits with code 2. ``show`` plots price, carbon and solar over the
days, with the forecast made at the start of day 2 (dashed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``signals check`` and ``signals show`` to a CLI's subparsers."""
    sig = subparsers.add_parser("signals", help="electricity price, grid carbon and solar "
                                                "signals: check a file, plot a source")
    actions = sig.add_subparsers(dest="signals_command", metavar="{check,show}", required=True)
    check = actions.add_parser("check", help="validate a signal CSV and print a summary")
    check.add_argument("path", metavar="FILE", help="signal CSV (.csv or .csv.gz)")
    check.add_argument("--tick-seconds", type=float, default=300.0, metavar="S",
                       help="tick length to count ticks for (default 300)")
    check.set_defaults(func=run_check)

    show = actions.add_parser("show", help="plot price, carbon and solar of a source")
    show.add_argument("--source", default="synthetic",
                      choices=["synthetic", "csv", "de_carbon_2020"])
    show.add_argument("--csv", dest="csv_path", metavar="FILE", help="signal file for --source csv")
    show.add_argument("--days", type=float, default=2.0, help="days to plot (default 2)")
    show.add_argument("--seed", type=int, default=0, help="episode seed (default 0)")
    show.add_argument("--start-date", help="YYYY-MM-DD (default: the seed picks the day)")
    show.add_argument("--solar-kwp", type=float, default=0.0, help="PV peak power, kWp")
    show.add_argument("--solar-source", default="pvlib", choices=["pvlib", "synthetic"])
    show.add_argument("--forecast-error", type=float, default=0.1,
                      help="relative forecast error at 24 h lead (default 0.1)")
    show.add_argument("--tick-seconds", type=float, default=300.0, metavar="S")
    show.add_argument("--out", required=True, metavar="PNG", help="image to write")
    show.set_defaults(func=run_show)
    return sig


def _fail(err: BaseException) -> int:
    lines = [ln.strip() for ln in str(err).splitlines()
             if ln.strip() and "errors.pydantic.dev" not in ln]
    print(f"cloudrl: {' '.join(lines) or type(err).__name__}", file=sys.stderr)
    return EXIT_BAD_INPUT


def format_check(table, tick_seconds: float) -> str:
    """The summary ``signals check`` prints."""
    span_s = float((table.end - table.times[0]).astype("int64"))
    lines = [
        f"{table.path}: {table.n_rows} rows, {table.layout} layout, interval "
        f"{table.interval_s / 60:g} min",
        f"span {table.times[0]} .. {table.end} ({span_s / 3600:g} h = {span_s / 86400:.2f} days)",
        f"ticks of {tick_seconds:g} s: {int(span_s // tick_seconds)}",
    ]
    units = {"carbon_g_per_kwh": "gCO2/kWh", "price_usd_per_mwh": "$/MWh", "solar_kw": "kW"}
    for name, values in table.columns().items():
        lines.append(f"{name:<18} mean {values.mean():10.2f}  min {values.min():10.2f}  "
                     f"max {values.max():10.2f}  {units[name]}")
    if table.price is None:
        lines.append("no price column: the price comes from the generator")
    return "\n".join(lines)


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``cloudrl signals check``."""
    from envs.signals.csv_import import SignalFileError, read_signal_file

    if not args.tick_seconds > 0:
        return _fail(ValueError(f"--tick-seconds: must be > 0, got {args.tick_seconds}"))
    try:
        table = read_signal_file(args.path)
    except (SignalFileError, FileNotFoundError) as e:
        return _fail(e)
    print(format_check(table, args.tick_seconds))
    return 0


def run_show(args: argparse.Namespace) -> int:
    """Handler of ``cloudrl signals show``."""
    from pydantic import ValidationError

    from envs.signals import SignalConfig, make_signals
    from envs.signals.csv_import import SignalFileError

    if not (args.days > 0 and args.tick_seconds > 0):
        return _fail(ValueError("--days and --tick-seconds must be > 0"))
    try:
        cfg = SignalConfig(source=args.source, csv_path=args.csv_path,
                           start_date=args.start_date, solar_kwp=args.solar_kwp,
                           solar_source=args.solar_source, forecast_error=args.forecast_error)
        n = int(round(args.days * 86400 / args.tick_seconds))
        horizon = cfg.horizon_ticks(args.tick_seconds)
        series = make_signals(cfg, n + horizon, args.tick_seconds, args.seed)
    except (ValidationError, SignalFileError, FileNotFoundError, ImportError, ValueError) as e:
        return _fail(e)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_signals(series, n, cfg, args.seed, out)
    print(f"wrote {out}: {args.days:g} days from {series.start} ({cfg.source}, seed "
          f"{args.seed})")
    return 0


def plot_signals(series, n: int, cfg, seed: int, out: Path) -> None:
    """Three stacked panels (price, carbon, solar) over ``n`` ticks, forecast dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from envs.signals import forecast

    hours = np.arange(n) * series.tick_seconds / 3600.0
    t0 = min(n - 1, int(round(86400 / series.tick_seconds)))  # start of day 2
    h = min(cfg.horizon_ticks(series.tick_seconds), n - 1 - t0)
    fc = forecast(series, t0, h, cfg.forecast_error, seed) if h > 0 else None
    fc_hours = (np.arange(t0 + 1, t0 + 1 + h)) * series.tick_seconds / 3600.0
    panels = [("price ($/MWh)", series.price_usd_per_mwh, "tab:blue"),
              ("carbon (gCO2/kWh)", series.carbon_g_per_kwh, "tab:green"),
              ("solar (kW)", series.solar_kw, "tab:orange")]
    fig, axes = plt.subplots(3, 1, figsize=(9, 6.5), sharex=True)
    for k, (ax, (label, values, color)) in enumerate(zip(axes, panels, strict=True)):
        ax.plot(hours, values[:n], color=color, lw=1.2, label="truth")
        if fc is not None and cfg.forecast_error > 0:
            ax.plot(fc_hours, fc[k], color="k", lw=0.9, ls="--",
                    label=f"forecast at {hours[t0]:g} h (error {cfg.forecast_error:g})")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for d in range(1, int(hours[-1] // 24) + 1):
            ax.axvline(24 * d, color="grey", lw=0.6)
    axes[0].axhline(0, color="grey", lw=0.5)
    axes[0].legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel(f"hours from {series.start} (local time)")
    weekday = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"][int(series.hour_of_week0 // 24)]
    fig.suptitle(f"signals: source {cfg.source}, seed {seed}, starts {weekday} "
                 f"{str(series.start)[:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
