"""The fleet: per-server arrays (tier, capacity, power curve) laid out from a fixed fleet seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.sim_config import FleetConfig


def _tier_counts(shares: np.ndarray, n: int) -> np.ndarray:
    """Largest-remainder apportionment of ``n`` servers by relative ``shares``."""
    exact = shares / shares.sum() * n
    counts = np.floor(exact).astype(np.int64)
    remainder = n - counts.sum()
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:remainder]] += 1
    return counts


@dataclass(frozen=True)
class Fleet:
    """Static per-server attributes. Capacities are in units of the largest tier (max = 1.0)."""

    tier: np.ndarray  # int64 (N,)
    tier_names: tuple[str, ...]
    cpu_cap: np.ndarray  # float64 (N,)
    mem_cap: np.ndarray
    p_idle: np.ndarray  # W
    p_max: np.ndarray  # W
    exponent: np.ndarray
    tier_onehot: np.ndarray  # float64 (N, T)
    largest_cpu_cores: float
    largest_mem_gib: float

    @property
    def n_servers(self) -> int:
        return len(self.tier)

    @property
    def n_tiers(self) -> int:
        return len(self.tier_names)

    @classmethod
    def from_config(cls, cfg: FleetConfig) -> Fleet:
        tiers = cfg.tiers
        counts = _tier_counts(np.array([t.share for t in tiers], dtype=float), cfg.n_servers)
        tier = np.repeat(np.arange(len(tiers)), counts)
        tier = np.random.default_rng(cfg.fleet_seed).permutation(tier)
        big_cpu = max(t.cpu_cores for t in tiers)
        big_mem = max(t.mem_gib for t in tiers)

        def col(attr: str) -> np.ndarray:
            return np.array([getattr(tiers[i], attr) for i in tier], dtype=np.float64)

        onehot = np.zeros((cfg.n_servers, len(tiers)))
        onehot[np.arange(cfg.n_servers), tier] = 1.0
        return cls(
            tier=tier.astype(np.int64),
            tier_names=tuple(t.name for t in tiers),
            cpu_cap=col("cpu_cores") / big_cpu,
            mem_cap=col("mem_gib") / big_mem,
            p_idle=col("p_idle_w"),
            p_max=col("p_max_w"),
            exponent=col("power_exponent"),
            tier_onehot=onehot,
            largest_cpu_cores=big_cpu,
            largest_mem_gib=big_mem,
        )

    def active_power(self, utilization: np.ndarray) -> np.ndarray:
        """P(u) = P_idle + (P_max - P_idle) * u**alpha, per server, in watts."""
        return self.p_idle + (self.p_max - self.p_idle) * np.power(utilization, self.exponent)
