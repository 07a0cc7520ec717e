"""Offline constrained agent: logged datasets with a per-step cost, their
summaries, and the ``cloudrl offline record|train|evaluate`` commands."""
