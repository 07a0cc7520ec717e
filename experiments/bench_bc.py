"""Behaviour-cloning benchmark: Ray Train + Accelerate samples/s with 1 vs 2 workers.

What it does (issue 12, phase 1, "Ray Train scaling"):

1. Demonstrations: ``--episodes`` episodes of each heuristic in ``--policies`` (N=15,
   poisson, ``--max-steps`` steps, train seeds 0..) on the interface(s) asked for, recorded
   with :mod:`cloudrl.alignment.recording` (kept in ``--out`` and reused).
2. For each interface, :func:`cloudrl.alignment.bc.train_bc` with the same config
   (``--epochs`` epochs, global batch ``--batch-size``, hidden 128) on 1 and on 2 Ray Train
   workers (1 CPU each, gloo, DDP through Accelerate), in one run and one Ray session.
   Samples/s per epoch = demonstrated steps / wall time of the slowest rank for that epoch;
   the table shows the median over the epochs after the first (the first includes
   Accelerate's DDP set-up), the ratio 2 vs 1 workers, and the final loss of each (equal
   up to float reduction order: the workers split the same global batches).

Run::

    .venv/bin/python -m experiments.bench_bc [--out results/bench_bc] [--interfaces flat,branching]

Measured (shared 2-core machine, load average 15-25 from other engineers' jobs, so the
timings are noisy; ``--episodes 2 --max-steps 200 --epochs 6``, 1,600 samples, 4 heuristics):
see the table printed at the end of a run; numbers from this session are below.

    interface   workers  samples/s  ratio  final loss
    (filled in from the run in this commit's message; see the README)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

HEURISTICS = ("power_aware", "sjf", "ffd", "round_robin")


def record(out: Path, interface: str, policies: list[str], episodes: int,
           max_steps: int) -> Path:
    from cloudrl.alignment.recording import record_episodes

    out.mkdir(parents=True, exist_ok=True)
    if not any(out.glob("*.parquet")):
        for name in policies:
            record_episodes(name, out, env_config={"n_servers": 15, "workload": "poisson"},
                            interface=interface, episodes=episodes, max_steps=max_steps)
    return out


def throughput(history: list[dict]) -> float:
    """Median samples/s over the epochs after the first (all of them if there is one)."""
    rates = [h["samples_per_s"] for h in history]
    return statistics.median(rates[1:] or rates)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/bench_bc")
    p.add_argument("--interfaces", default="flat,branching")
    p.add_argument("--policies", default=",".join(HEURISTICS))
    p.add_argument("--episodes", type=int, default=2, help="per heuristic")
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", default="1,2")
    args = p.parse_args(argv)

    import ray

    from cloudrl.alignment.bc import BCConfig, load_demonstrations, train_bc

    out = Path(args.out)
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    rows = []
    for interface in args.interfaces.split(","):
        t0 = time.perf_counter()
        demo_dir = record(out / f"demos_{interface}", interface, args.policies.split(","),
                          args.episodes, args.max_steps)
        demos = load_demonstrations(demo_dir, interface)
        print(f"{interface}: {len(demos)} samples from {demos.episodes} episodes "
              f"({time.perf_counter() - t0:.0f} s to record/read)", flush=True)
        base = None
        for workers in (int(w) for w in args.workers.split(",")):
            cfg = BCConfig(demos=str(demo_dir), interface=interface, epochs=args.epochs,
                           batch_size=args.batch_size, num_workers=workers,
                           out=str(out / f"bc_{interface}_w{workers}"),
                           storage_path=str(out / "ray_train"), mlflow=False)
            t0 = time.perf_counter()
            res = train_bc(cfg, demos)
            rate = throughput(res.history)
            base = base or rate
            rows.append({"interface": interface, "workers": workers, "samples": len(demos),
                         "samples_per_s": rate, "ratio": rate / base,
                         "final_loss": res.final["loss"], "accuracy": res.final["accuracy"],
                         "wall_s": time.perf_counter() - t0})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'interface':10s} {'workers':>7s} {'samples/s':>10s} {'ratio':>6s} "
          f"{'final loss':>11s} {'accuracy':>8s} {'wall s':>7s}")
    for r in rows:
        print(f"{r['interface']:10s} {r['workers']:7d} {r['samples_per_s']:10.0f} "
              f"{r['ratio']:6.2f} {r['final_loss']:11.5f} {r['accuracy']:8.3f} "
              f"{r['wall_s']:7.0f}")
    (out / "bench_bc.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
