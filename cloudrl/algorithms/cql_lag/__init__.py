"""Offline constrained agent: discrete CQL + cost critic + Lagrangian (issue 14)."""

from cloudrl.algorithms.cql_lag.cql_lag import CQLLag, CQLLagConfig

__all__ = ["CQLLag", "CQLLagConfig"]
