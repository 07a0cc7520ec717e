"""Torch intra-op threads per process, from the CPUs Ray gives that process.

Torch defaults to one thread per core in every process. On a many-core node the
driver-side learner then takes most of the machine and the env runners' actors fight it
for cores (measured: Ape-X plateaued at 4.3x one runner from 8 runners on with torch's
default; 8.8x at 12 runners with the driver capped at 1 thread). ``TorchThreads`` says how
many threads each process gets; ``"auto"`` (the default) matches Ray's resources:

* an env runner (remote, ``worker_index > 0``): ``floor(num_cpus_per_env_runner)``, at
  least 1 -- set from RLlib's ``on_environment_created`` callback, which runs in the runner;
* the driver, which holds the learner when ``num_learners=0``: the CPUs of RLlib's
  main-process bundle (``max(num_cpus_per_learner, num_cpus_for_main_process)``) or, for a
  plain driver (not itself a Ray actor, e.g. not a Tune trial), also the cluster's CPUs
  that the run's actors leave unclaimed, whichever is more -- so a 2-core laptop sampling
  in the driver keeps its 2 threads, and 12 runners on 16 cores leave the learner 2-3;
* remote learners (``num_learners > 0``): ``floor(num_cpus_per_learner)``, at least 1.

Both are set from RLlib callbacks that :func:`thread_callbacks` returns for
``AlgorithmConfig.callbacks(...)``; replay shard actors set theirs from
``num_cpus_per_replay_shard`` (``cloudrl.algorithms.apex_bdq.shard``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PositiveInt

Threads = Literal["auto"] | PositiveInt


class TorchThreads(BaseModel):
    """Torch intra-op threads of the learner process(es) and of each env runner."""

    model_config = ConfigDict(extra="forbid")

    learner: Threads = "auto"
    env_runner: Threads = "auto"


def _whole(cpus: float) -> int:
    return max(1, math.floor(float(cpus) + 1e-9))


def _learner_cpus(config: Any) -> float:
    """RLlib's CPUs per learner (its ``"auto"``: 1 without a GPU, else 0)."""
    if config.num_cpus_per_learner != "auto":
        return float(config.num_cpus_per_learner)
    return 1.0 if config.num_gpus_per_learner == 0 else 0.0


def driver_threads(config: Any) -> int:
    """``"auto"`` threads of the driver process of ``config``'s algorithm (see module doc)."""
    import ray

    main = float(config.num_cpus_for_main_process)
    if config.num_learners == 0:
        main = max(main, _learner_cpus(config))
    ctx = ray.get_runtime_context()
    if ctx.worker.mode == ray.WORKER_MODE:  # a Ray actor (Tune trial): what it was given
        return _whole(ctx.get_assigned_resources().get("CPU", main))
    actors = config.algo_class.default_resource_request(config).bundles[1:]
    claimed = sum(float(b.get("CPU", 0.0)) for b in actors)
    spare = float(ray.cluster_resources().get("CPU", 0.0)) - claimed
    return _whole(max(main, spare))


def _set(n: int) -> int:
    import torch

    torch.set_num_threads(n)
    return torch.get_num_threads()


@dataclass(frozen=True)
class _OnAlgorithmInit:
    learner: Threads

    def __call__(self, *, algorithm: Any, **_: Any) -> None:
        cfg = algorithm.config
        _set(driver_threads(cfg) if self.learner == "auto" else self.learner)
        group = getattr(algorithm, "learner_group", None)
        if group is not None and not group.is_local:
            n = _whole(_learner_cpus(cfg)) if self.learner == "auto" else self.learner
            group.foreach_learner(lambda _learner, n=n: _set(n))


@dataclass(frozen=True)
class _OnEnvironmentCreated:
    env_runner: Threads

    def __call__(self, *, env_runner: Any, **_: Any) -> None:
        if getattr(env_runner, "worker_index", 0) == 0:
            return  # the driver's local runner: the driver's threads are the learner's
        n = (_whole(env_runner.config.num_cpus_per_env_runner)
             if self.env_runner == "auto" else self.env_runner)
        _set(n)


def thread_callbacks(threads: TorchThreads) -> dict[str, Any]:
    """``AlgorithmConfig.callbacks(**thread_callbacks(t))``: sets every process's threads."""
    return {"on_algorithm_init": _OnAlgorithmInit(threads.learner),
            "on_environment_created": _OnEnvironmentCreated(threads.env_runner)}
