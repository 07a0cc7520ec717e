"""Benchmarks: each prints a table with its reference measured in the same run.

Run one as ``python -m experiments.benchmarks.bench_env`` (its docstring says what it does,
how long it takes and the results to expect).
"""
