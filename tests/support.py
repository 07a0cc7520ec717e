"""Test helpers shared by several test modules."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable
from typing import Any

from envs.workloads.base import JobTable


class FixedWorkload:
    """Replays one hand-written job table; warm start must be off."""

    name = "fixed"

    def __init__(self, table: JobTable) -> None:
        self.table = table

    def generate(self, horizon, rng, fleet):
        return self.table

    def stationary_sample(self, n, rng, fleet):
        raise AssertionError("warm start is off in these scenarios")

    def offered_rate(self, fleet):
        return 0.0

    def mean_duration(self, fleet):
        return 1.0


def descendants(pid: int) -> dict[int, Any]:
    """``psutil.Process`` handles of every descendant of ``pid`` (they survive pid reuse:
    psutil refuses to signal a pid that now belongs to another process)."""
    import psutil

    try:
        return {p.pid: p for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}


def reap(processes: dict[int, Any], timeout_s: float = 10.0) -> None:
    """Wait for ``processes`` (psutil handles) to exit; SIGKILL the ones still alive."""
    import psutil

    _, alive = psutil.wait_procs(list(processes.values()), timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)


def free_port(ports: Iterable[int]) -> int:
    """The first of ``ports`` that 127.0.0.1 can bind now (each test module has its own
    range, so modules running at once do not race for one port)."""
    tried = list(ports)
    for port in tried:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {tried[0]}..{tried[-1]}")


def served_episode(service: Any, sim: Any, decide: Any, check: Any) -> int:
    """Every decision of ``sim``'s episode served: the request body of the state goes to
    ``service.decide``, its answer is checked by ``check(state, want, out)`` against
    ``want = decide(sim)``, and the simulator follows ``want``. Returns the decisions."""
    import asyncio
    import json

    from serve_apps.scenario_schemas import ScenarioState
    from serve_apps.scenario_state import state_of

    async def episode() -> int:
        n = 0
        while not sim.done:
            if sim.t % sim.cfg.decision_ticks == 0:
                state = ScenarioState.model_validate_json(json.dumps(state_of(sim)))
                want = decide(sim)
                out = await service.decide(state)
                check(state, want, out)
                sim.set_controls(*want)
                n += 1
            sim.tick()
        return n

    return asyncio.run(episode())
