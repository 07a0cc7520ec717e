"""Every parallel loop of the library on Ray: ``--workers N`` is N Ray workers of 1 CPU each.

* :func:`ensure_ray` joins a cluster when there is one to join (``RAY_ADDRESS`` set, as
  under ``ray job submit``, or a cluster started with ``ray start`` on this machine),
  else starts a local Ray with ``max(workers, 1)`` CPUs and no dashboard. Ray that was
  already initialised in this process is used as it is and left running; Ray that
  :func:`ensure_ray` initialised itself is shut down again on exit (for a joined cluster
  that only disconnects this driver: the cluster keeps running).
* :class:`WorkerPool` runs ``fn`` over items on ``workers`` Ray actors that each hold a
  state built once by ``init(*init_args)`` (a simulator, a loaded policy), or, with no
  ``init``, as Ray tasks with at most ``workers`` in flight. Results come back in
  submission order whichever worker ran them, so a run gives the same numbers whatever the
  worker count, placement or failures.
* Fault tolerance: a worker process that dies (killed, its node lost) costs the items it
  held, not the run. Ray restarts the actor (``init`` runs again) and retries its items
  there (``max_restarts`` / ``max_task_retries``), a task is retried (``max_retries``).
  An exception raised by ``fn`` itself is not retried: it reaches the caller.

Worker output does not reach the driver's console (``log_to_driver=False``): the
commands' stdout stays what the serial path prints.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cloudrl.progress import progress_bar

RETRIES = 3  # restarts of a dead actor, retries of an item whose worker died


def cluster_address() -> str | None:
    """The cluster this process would join: ``RAY_ADDRESS``, else the address a ``ray
    start`` on this machine recorded (Ray's ``ray_current_cluster`` file); None for none."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    from ray._private.services import find_bootstrap_address

    return find_bootstrap_address(None)


@contextlib.contextmanager
def ensure_ray(workers: int) -> Iterator[bool]:
    """Ray for ``workers`` workers for the duration of the block; yields whether this call
    initialised Ray (and so shuts it down at the end)."""
    import ray

    if ray.is_initialized():
        yield False
        return
    from cloudrl.quiet import quiet_library_logs
    from cloudrl.ray_utils import SETUP_HOOK, quiet_worker_exit

    quiet_library_logs()
    quiet_worker_exit()
    if cluster_address() is not None:
        ray.init(address="auto", log_to_driver=False)
    else:
        ray.init(num_cpus=max(int(workers), 1), include_dashboard=False, log_to_driver=False,
                 runtime_env={"worker_process_setup_hook": SETUP_HOOK})
    try:
        yield True
    finally:
        ray.shutdown()


class ParallelWorker:
    """One Ray actor of a :class:`WorkerPool`: the state ``init(*init_args)`` built."""

    def __init__(self, init: Callable[..., Any], init_args: tuple) -> None:
        from cloudrl.quiet import quiet_library_logs

        quiet_library_logs()
        self.state = init(*init_args)

    def call(self, fn: Callable[[Any, Any], Any], item: Any) -> Any:
        return fn(self.state, item)

    def pid(self) -> int:
        return os.getpid()


def _task(fn: Callable[[Any], Any], item: Any) -> Any:
    from cloudrl.quiet import quiet_library_logs

    quiet_library_logs()
    return fn(item)


class WorkerPool:
    """``workers`` Ray actors holding ``init(*init_args)`` (or Ray tasks with no ``init``),
    Ray started or joined for the pool's lifetime (:func:`ensure_ray`). Use as a context
    manager or call :meth:`close`."""

    def __init__(self, workers: int, init: Callable[..., Any] | None = None,
                 init_args: tuple = ()) -> None:
        import ray

        self.workers = max(int(workers), 1)
        self._ray = ensure_ray(self.workers)
        self._ray.__enter__()
        try:
            self.actors = []
            if init is not None:
                cls = ray.remote(ParallelWorker).options(
                    num_cpus=1, max_restarts=RETRIES, max_task_retries=RETRIES)
                self.actors = [cls.remote(init, init_args) for _ in range(self.workers)]
            self._task = ray.remote(_task).options(num_cpus=1, max_retries=RETRIES)
        except BaseException:
            self._ray.__exit__(None, None, None)
            raise

    def pids(self) -> list[int]:
        """The process id of every actor (for tests that kill one)."""
        import ray

        return ray.get([a.pid.remote() for a in self.actors])

    def map(self, fn: Callable[..., Any], items: Iterable[Any], desc: str | None = None,
            total: int | None = None, count: Callable[[Any], int] | None = None,
            unit: str = "it") -> list[Any]:
        """``fn(state, item)`` (``fn(item)`` without actors) for every item, in order; a
        progress bar named ``desc`` on stderr when given, of ``total`` steps (default: one
        per item; ``count(result)`` steps per result when given)."""
        import ray

        items = list(items)
        out: list[Any] = [None] * len(items)
        slots = deque(self.actors * 2 if self.actors else [None] * self.workers)
        queue = iter(enumerate(items))
        pending: dict[Any, tuple[int, Any]] = {}
        with progress_bar(len(items) if total is None else total, desc, unit) as bar:
            while True:
                while slots:
                    nxt = next(queue, None)
                    if nxt is None:
                        break
                    i, item = nxt
                    slot = slots.popleft()
                    ref = (slot.call.remote(fn, item) if slot is not None
                           else self._task.remote(fn, item))
                    pending[ref] = (i, slot)
                if not pending:
                    break
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    i, slot = pending.pop(ref)
                    out[i] = ray.get(ref)
                    slots.append(slot)
                    bar.update(1 if count is None else count(out[i]))
        return out

    def close(self) -> None:
        import ray

        try:
            for actor in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            self.actors = []
        finally:
            self._ray.__exit__(None, None, None)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ordered_map(fn: Callable[..., Any], items: Iterable[Any], workers: int,
                init: Callable[..., Any] | None = None, init_args: tuple = (),
                desc: str | None = None) -> list[Any]:
    """``fn(state, item)`` on ``workers`` actors holding ``init(*init_args)`` (``fn(item)``
    as tasks without ``init``), results in the order of ``items``."""
    with WorkerPool(workers, init, init_args) as pool:
        return pool.map(fn, items, desc)
