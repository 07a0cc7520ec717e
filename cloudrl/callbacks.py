"""RLlib callback that reports the cluster's own episode metrics next to the return.

Sums the env's per-step ``info`` over all chunks of a finished episode and
logs energy (kWh), SLA violation rate (over jobs that ended), toggles and
invalid actions under ``env_runners/cluster/...`` (windowed means).
"""

from __future__ import annotations

from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

WINDOW = 100
_SUMMED = ("energy_kwh", "violations", "finished", "dropped", "toggles", "invalid_action")


def episode_totals(chunks: list[Any]) -> dict[str, float]:
    """Totals of the summed info keys over episode chunks (SingleAgentEpisode-like).

    A chunk's first info is never its own step: in the first chunk it is the reset info,
    in a successor (``episode.cut()``) it repeats the predecessor's last step info, which
    would otherwise be counted once per chunk boundary."""
    totals = dict.fromkeys(_SUMMED, 0.0)
    for chunk in chunks:
        for info in chunk.get_infos()[1:]:
            if not info or "energy_kwh" not in info:  # an agent's step without env terms
                continue
            for key in _SUMMED:
                totals[key] += float(info[key])
    return totals


class ClusterMetricsCallback(RLlibCallback):
    """Logs ``cluster/energy_kwh``, ``cluster/sla_violation_rate``, toggles, invalid actions."""

    def on_episode_end(self, *, episode, prev_episode_chunks=None, metrics_logger=None,
                       **kwargs) -> None:
        if metrics_logger is None:
            return
        totals = episode_totals(list(prev_episode_chunks or []) + [episode])
        ended = totals["finished"] + totals["dropped"]
        values = {
            "energy_kwh": totals["energy_kwh"],
            "sla_violation_rate": totals["violations"] / ended if ended else 0.0,
            "toggles": totals["toggles"],
            "invalid_actions": totals["invalid_action"],
        }
        for key, value in values.items():
            metrics_logger.log_value(("cluster", key), value, reduce="mean", window=WINDOW)
