"""Starting or joining Ray the way a user expects: local by default, a cluster when asked.

``RAY_ADDRESS`` set (as under ``ray job submit``) -> join that cluster.
Otherwise start a local Ray with this machine's CPUs and no dashboard.
"""

from __future__ import annotations

import os


def init_ray(num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False)
