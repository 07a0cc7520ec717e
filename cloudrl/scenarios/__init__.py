"""Scenarios with decision headroom: run controllers on them, tune the signal-aware rule,
and measure what a forecast MPC and a clairvoyant oracle gain over it (``cloudrl
scenarios list|headroom|tune``)."""
