"""Scaling of the library's parallel loops: Ray workers against a process pool.

What it measures, for ``--workers`` 1 and 2:

* evaluation: scenario episodes per second of ``run_controllers`` (the signal-aware rule
  on ``--scenario``'s test seeds, ``--episodes`` of them), as the library runs them (Ray
  actors, each holding a simulator) and with the process pool the library used before
  (``ProcessPoolExecutor``, kept here only as the reference: each worker builds the
  simulator once and plays its share of the seeds);
* evolution strategies: ES iterations per second of ``es_finetune`` (a random distilled
  policy on ``tiny``, ``--es-iterations`` iterations of ``--es-pairs`` antithetic pairs on
  2 seeds each, validation every iteration), on Ray actors and on the reference pool
  (the same episode function behind a spawned pool).

Workers = 1 runs in this process on both sides (the serial path: no Ray, no pool), so
its ratio is 1 by construction; it is the baseline for the speed-up. Every timed call
includes starting its workers (actors or pool processes, each building its simulator),
as a command does; Ray itself is started once beforehand (its start-up is printed on its
own). Each cell is the median of ``--repeats`` runs. Results are checked equal between
Ray and the pool (same numbers, whichever worker played what).

Run::

    python -m experiments.benchmarks.bench_parallel            # ~5 min on 2 loaded cores

Numbers: docs/benchmarks.md ("Parallel loops: Ray against a process pool").
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cloudrl.argparsing import CliParser  # noqa: E402

_POOL_STATE: dict[str, Any] = {}


# ----------------------------------------------------------- the reference pool
def _pool_init(init: Any, args: tuple) -> None:
    from cloudrl.quiet import quiet_library_logs

    quiet_library_logs()
    _POOL_STATE["state"] = init(*args)


def _pool_call(job: tuple[Any, Any]) -> Any:
    fn, item = job
    return fn(_POOL_STATE["state"], item)


class _PoolPlayers:
    """ES's players behind a spawned process pool (the library's design before Ray)."""

    def __init__(self, scn, checkpoint, which, workers, loader=None) -> None:
        from cloudrl.algorithms.es import algorithm as es

        self.pool = ProcessPoolExecutor(
            workers, multiprocessing.get_context("spawn"), initializer=_pool_init,
            initargs=(es._init, (scn, checkpoint, which, loader or es._distilled)))

    def play(self, jobs, desc=None):
        from cloudrl.algorithms.es import algorithm as es

        return list(self.pool.map(_pool_call, [(es._play, j) for j in jobs],
                                  chunksize=max(1, len(jobs) // 16)))

    def close(self) -> None:
        self.pool.shutdown()


def pool_run_controllers(cfg, specs, seeds, workers):
    """``run_controllers`` on a process pool: worker ``w`` plays ``seeds[w::workers]``."""
    from cloudrl.scenarios import runner

    items = [(i, s) for i in range(len(specs)) for s in seeds]
    with ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"),
                             initializer=_pool_init,
                             initargs=(runner._worker_state, (cfg, specs))) as pool:
        out = list(pool.map(_pool_call, [(runner._worker_episode, it) for it in items],
                            chunksize=max(1, len(items) // (4 * workers))))
    n = len(seeds)
    return [out[i * n:(i + 1) * n] for i in range(len(specs))]


# ---------------------------------------------------------------- measurements
def _median_time(fn, repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_eval(scenario: str, episodes: int, workers: int, repeats: int) -> dict[str, Any]:
    from cloudrl.protocol import test_seeds
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers
    from envs.scenario.catalog import load_scenario

    cfg, specs = load_scenario(scenario), [ControllerSpec("signal_aware")]
    seeds = list(test_seeds(episodes))
    t_ray, ray_out = _median_time(lambda: run_controllers(cfg, specs, seeds, workers), repeats)
    if workers == 1:
        t_pool, pool_out = t_ray, ray_out
    else:
        t_pool, pool_out = _median_time(
            lambda: pool_run_controllers(cfg, specs, seeds, workers), repeats)
    same = [m["cost_usd"] for m in ray_out[0]] == [m["cost_usd"] for m in pool_out[0]]
    return {"what": f"evaluation ({scenario}), episodes/s", "workers": workers,
            "ray": episodes / t_ray, "pool": episodes / t_pool, "same": same}


def bench_es(iterations: int, pairs: int, workers: int, repeats: int) -> dict[str, Any]:
    import torch

    from cloudrl.algorithms.distill.policy import build_module, save_checkpoint
    from cloudrl.algorithms.es import algorithm as es
    from cloudrl.algorithms.es.config import ESConfig
    from envs.scenario.catalog import load_scenario

    torch.manual_seed(0)
    path = save_checkpoint(build_module((16,)), Path(tempfile.mkdtemp()) / "start", (16,),
                           {"scenario": "tiny"})
    cfg = ESConfig(iterations=iterations, pairs=pairs, seeds_per_candidate=2, eval_every=1,
                   n_val_seeds=4, workers=workers, sigma=0.3)

    def run():
        return es.es_finetune(load_scenario("tiny"), str(path), cfg, log=lambda _: None)

    t_ray, ray_res = _median_time(run, repeats)
    if workers == 1:
        t_pool, pool_res = t_ray, ray_res
    else:
        players = es._Players
        es._Players = _PoolPlayers
        try:
            t_pool, pool_res = _median_time(run, repeats)
        finally:
            es._Players = players
    same = ([h.get("val") for h in ray_res.history] == [h.get("val") for h in pool_res.history])
    return {"what": f"ES (tiny, {pairs} pairs), iterations/s", "workers": workers,
            "ray": iterations / t_ray, "pool": iterations / t_pool, "same": same}


def main() -> int:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="carbon_shift")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--es-iterations", type=int, default=3)
    parser.add_argument("--es-pairs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("CLOUDRL_PROGRESS", "0")
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - t0
    rows = []
    try:
        for w in (1, 2):
            rows.append(bench_eval(args.scenario, args.episodes, w, args.repeats))
        for w in (1, 2):
            rows.append(bench_es(args.es_iterations, args.es_pairs, w, args.repeats))
    finally:
        ray.shutdown()
    base = {r["what"]: r["ray"] for r in rows if r["workers"] == 1}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, Ray {ray.__version__}; ray.init "
          f"{ray_start:.1f} s; median of {args.repeats} runs")
    print("| loop | workers | Ray | process pool | Ray / pool | speed-up (Ray) | same "
          "results |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} | {r['workers']} | {r['ray']:.2f} | {r['pool']:.2f} | "
              f"{r['ray'] / r['pool']:.2f} | {r['ray'] / base[r['what']]:.2f} | "
              f"{'yes' if r['same'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
