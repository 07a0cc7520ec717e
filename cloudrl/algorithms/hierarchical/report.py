"""Who decides when: each sub-agent's share of the supervisor's decisions by hour of day.

:func:`decision_shares` runs a :class:`HierarchicalPolicy` on episodes and bins every
supervisor decision by the simulated hour of day (from the observation's
``time_sin``/``time_cos``, one day = ``sim.diurnal_period`` ticks), so a learned
supervisor's reaction to the diurnal cycle of ``google_v2_like`` shows; the plot goes
to MLflow as an artifact with :func:`log_decision_shares`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from envs.observation import MACRO_TAIL

_SIN = MACRO_TAIL.index("time_sin") - len(MACRO_TAIL)
_COS = MACRO_TAIL.index("time_cos") - len(MACRO_TAIL)


def hour_of_day(macro: np.ndarray, hours: int = 24) -> int:
    """The hour bin (0..hours-1) of the observation's time-of-day features."""
    phase = math.atan2(float(macro[_SIN]), float(macro[_COS])) / (2 * math.pi) % 1.0
    return min(hours - 1, int(phase * hours))


def decision_shares(policy: Any, env: Any, seeds: Sequence[int], hours: int = 24
                    ) -> np.ndarray:
    """(hours, sub-agents) decision counts of ``policy`` over the episodes of ``seeds``."""
    counts = np.zeros((hours, len(policy.sub_agents)), dtype=np.int64)
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        policy.reset()
        done = False
        while not done:
            made = len(policy.decisions)
            action = policy.act(obs)
            if len(policy.decisions) > made:
                counts[hour_of_day(obs["macro"], hours), policy.active] += 1
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    return counts


def plot_decision_shares(counts_by_panel: Mapping[str, np.ndarray], names: Sequence[str],
                         path: Path) -> Path:
    """Stacked shares per hour, one panel per key (e.g. workload); hours without
    decisions are left blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(counts_by_panel.items())
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.6), squeeze=False)
    for ax, (title, counts) in zip(axes[0], panels, strict=True):
        total = counts.sum(axis=1, keepdims=True)
        share = np.divide(counts, total, out=np.full(counts.shape, np.nan), where=total > 0)
        hours = np.arange(counts.shape[0])
        bottom = np.zeros(counts.shape[0])
        for i, name in enumerate(names):
            values = np.nan_to_num(share[:, i])
            ax.bar(hours, values, bottom=bottom, width=0.9, label=name)
            bottom += values
        ax.set_title(f"{title} ({int(counts.sum())} decisions)")
        ax.set_xlabel("hour of day")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("share of supervisor decisions")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log_decision_shares(client: Any, run_id: str, counts_by_panel: Mapping[str, np.ndarray],
                        names: Sequence[str], out_dir: Path) -> Path:
    """The plot and the counts (JSON) as artifacts of MLflow run ``run_id``; overall
    shares as metrics ``share_<panel>_<sub-agent index>``."""
    import json

    from cloudrl.tracking import log_artifacts, log_metrics

    png = plot_decision_shares(counts_by_panel, names, out_dir / "decision_share.png")
    data = out_dir / "decision_share.json"
    data.write_text(json.dumps({"sub_agents": list(names), "counts_by_hour": {
        k: v.tolist() for k, v in counts_by_panel.items()}}, indent=1))
    log_artifacts(client, run_id, [png, data], "hierarchy")
    metrics = {}
    for panel, counts in counts_by_panel.items():
        total = max(1, int(counts.sum()))
        metrics.update({f"share_{panel}_{i}": counts[:, i].sum() / total
                        for i in range(counts.shape[1])})
    log_metrics(client, run_id, metrics)
    return png
