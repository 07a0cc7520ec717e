"""Operators' own trade-offs, end to end: per-tick traces of scenario episodes, scripted
operators with hidden utilities who label through the labelling app's HTTP API, a
sequence reward model learned from their labels only, and the loop that steers the
heuristic and the MPC on it (``cloudrl steer loop``)."""
