"""Real-data sources (CSV files, the shipped German 2020 carbon series): being built."""

from __future__ import annotations


def real_signals(cfg, n_ticks, tick_seconds, rng):
    raise NotImplementedError(f"source {cfg.source!r} is not available yet; use 'synthetic'")
