"""Sweeps and benchmarks; each module is runnable."""
