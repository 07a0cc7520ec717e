"""Offline constrained agent: discrete CQL + cost critic + Lagrangian."""

from cloudrl.algorithms.cql_lag.cql_lag import CQLLag, CQLLagConfig

__all__ = ["CQLLag", "CQLLagConfig"]
