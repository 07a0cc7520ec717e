"""Preference-alignment head benchmark: plain BDQ vs BDQ + head at the same env-step budget.

What it does (the safety benchmark; goal: fewer violations of each
teacher bound per episode, with no more energy):

1. Demonstrations (branching interface, N=``--n-servers``, poisson, train seeds), recorded
   with :func:`cloudrl.recording.record_episodes`: ``--episodes`` episodes of each
   of ``--demo-policies`` (power_aware, round_robin, ffd, sjf), each policy on its own seeds
   (``demos/``) and, for matched pairs, every policy on the same seeds (``demos_matched/``).
2. Pair datasets of ``--pairs`` pairs of ``--segment`` steps, one per head arm:
   ``lex``: random segment pairs (:func:`cloudrl.alignment.teacher.make_teacher_pairs`),
   default teacher (SLA violations bound 0, overload bound 0, slowdown spread, energy);
   ``energy``: the same random pairs, but overload bounded at ``--overload-bound`` of the
   segment's N*T server-steps (both sides inside tie, so spread and then energy decide);
   ``matched``: the energy teacher on :func:`make_matched_pairs`, two policies' segments
   of the same episode seed at the same start (the same workload, so a label compares
   behaviour, not load). Printed per set: the deciding criteria and :func:`label_directions`.
3. Per run seed (``--run-seeds``) and arm (``--arms``: ``bdq``, ``head_lex``,
   ``head_energy``, ``head_matched``), a BDQ run with the cloudrl defaults
   (``cloudrl train --algo bdq``) of ``--env-steps``; head arms add ``alignment_pairs``,
   ``alignment_weight=--weight``, ``alignment_batch=--batch``,
   ``alignment_trunk_grad_scale=--grad-scale``. TD loss (``qf_loss``, the TD part alone)
   per iteration, and ``alignment/bt_loss`` / ``alignment/pair_accuracy``.
4. Each run's checkpoint, greedy, on ``--test-seeds`` held-out test seeds right after it
   trains (and power_aware for reference): per episode the return and the default
   teacher's statistics over the whole episode: SLA violations, overload (server-steps
   above utilisation 0.9), slowdown spread (p90 - p10) and energy (kWh).

Printed: TD loss per arm (mean +- 95% CI over run seeds), per-arm means +- 95% CI over all
(run seed x test seed) episodes, per-run-seed means, and the paired difference arm - BDQ
(same run seed, same test seed) with its 95% CI and the verdict of :func:`goal_verdict`
(a bound is "fewer" when the difference's upper 95% bound is < 0; energy is "no more" when
its upper bound is <= ``--energy-tolerance`` (1%) of BDQ's energy). The CI over test-seed
pairs does not hold the run-seed variance: read it with the per-run-seed rows.
Everything goes to ``--out``/results.json; each run is kept in ``--out/<arm>_s<seed>/``
(run.json, checkpoint, eval_<n>.json) and reused, so calls that share ``--out`` can train
run seeds / arms side by side and a last call with all of them prints the tables::

    .venv/bin/python -m experiments.benchmarks.bench_alignment_head --out OUT --prepare-only
    .venv/bin/python -m experiments.benchmarks.bench_alignment_head --out OUT --run-seeds 0 \
        --arms bdq
    ...   (one call per run seed and arm, in parallel)
    .venv/bin/python -m experiments.benchmarks.bench_alignment_head --out OUT --run-seeds 0 1

Measured with the defaults (10,080 env steps per run; run seeds 0 and 1; 10 test seeds;
1,000 pairs of 20 steps; weight 0.1, 8 pairs per update, trunk scale 1.0; four calls side
by side on the shared 2-core machine, load average 30-55; 390-470 s per run). Pair sets, decided by:
lex 971 overload, 16 SLA, 11 energy; energy 642 energy, 198 overload, 117 spread, 16 SLA;
matched 653 energy, 164 overload, 48 spread, 27 SLA, 108 ties. The preferred side used less
energy in 68% / 91% / 87% of the decided pairs and had less overload in 99% / 72% / 66%.

TD loss (last 10 iterations, mean over 2 run seeds): bdq 0.00126, head_lex 0.00127,
head_energy 0.00141, head_matched 0.00149 (per seed 0.0011-0.0018 everywhere: no sign that
any head destabilises the critic); head BT loss 0.51 / 0.40 / 0.48, pair accuracy
0.75 / 0.82 / 0.83.

Test episodes, mean +- 95% CI over 20 episodes (2 run seeds x 10 test seeds):

    policy        return          SLA viol.     overload       slowdown spr.  energy kWh
    bdq           -4175 +- 564    22.8 +- 11.0  1861 +- 85     0.17 +- 0.08   45.7 +- 1.4
    head_lex      -3409 +- 565     8.7 +- 10.0  1684 +- 124    0.19 +- 0.14   48.1 +- 0.9
    head_energy  -12704 +- 3558  173.8 +- 61.7  2294 +- 197    1.43 +- 0.20   36.7 +- 2.6
    head_matched  -2943 +- 220     4.4 +- 3.2   1618 +- 102    0.16 +- 0.07   42.3 +- 1.1
    power_aware   -2488 +- 142     1.6 +- 0.8   1889 +- 134    0.01 +- 0.01   39.1 +- 1.8

Paired difference arm - bdq (20 pairs):

    head_lex      +765 +- 663    -14.1 +- 12.4  -176 +- 94    +0.02 +- 0.12   +2.4 +- 1.1
    head_energy  -8529 +- 3302  +151.1 +- 56.5  +433 +- 195   +1.26 +- 0.17   -9.0 +- 1.8
    head_matched +1232 +- 691    -18.4 +- 12.6  -243 +- 85    -0.01 +- 0.13   -3.4 +- 0.8

Per run seed (s0 / s1): bdq violations 0.1 / 45.4, energy 48.0 / 43.4; head_matched
violations 6.9 / 1.8, overload 1729 / 1507 (bdq 1876 / 1845), spread 0.23 / 0.09 (bdq
0.00 / 0.33), energy 44.2 / 40.5.

Why the energy goal was missed, and what changed it. The head is not neutral: it steers the
policy toward whatever its labels mostly decide on. With the default teacher on random
pairs, 97% of the labels are decided by overload (its bound 0 is exceeded by nearly every
20-step segment), so the head rewards spread-out load: fewer violations and overload, but
more energy (+2.4 +- 1.1 kWh, both run seeds; the earlier one-seed 20k-step run: +7.8).
Bounding overload at 20% of the server-steps makes energy decide instead, and the head then
sleeps too much: 9 kWh less, but 7x the SLA violations and more overload. Random pairs
mostly compare two workloads (a busy segment against a quiet one), not two behaviours;
matched pairs (same seed, same start, two policies) label behaviour, and with them the head
gives, on run seeds 0 and 1, less energy (-3.4 kWh), less overload and a better return.
A third run seed (``--run-seeds 2 --arms bdq head_matched``): energy 43.5 -> 42.3, but
overload 1627 -> 1740, violations 0.7 -> 4.7, spread 0.06 -> 0.26. Over 3 run seeds, paired
head_matched - bdq (30 pairs): return +760 +- 515, SLA violations -10.9 +- 9.1, overload
-124 +- 88, spread +0.06 +- 0.10, energy -2.7 +- 0.7 kWh.
Goal, as measured: NOT met. Less energy with matched pairs holds on all 3 run seeds; fewer
overload on 2 of 3, fewer SLA violations on 1 of 3 (the pooled mean rests on one BDQ seed
with 45 violations per episode), no fewer slowdown spread. The spread of plain BDQ between
run seeds is as large as the effects at 10k steps; what is left: more run seeds or a longer
budget, and labels that rank safety ahead of energy without overload deciding everything
(e.g. matched pairs with an overload tolerance instead of a bound).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.argparsing import CliParser

STATS = ("sla_violations", "overload", "slowdown_spread", "energy_kwh")
BOUNDS = STATS[:3]  # the teacher bounds the goal asks fewer violations of
COLUMNS = ("return", *STATS)
# plain BDQ; the head on random segment pairs labelled by the lexicographic (default) or the
# energy teacher; the head on matched pairs (energy teacher): two policies, same workload
ARMS = ("bdq", "head_lex", "head_energy", "head_matched")
KINDS = ("lex", "energy", "matched")
DEMO_POLICIES = ("power_aware", "round_robin", "ffd", "sjf")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CliParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/bench_alignment_head")
    p.add_argument("--n-servers", type=int, default=15)
    p.add_argument("--env-steps", type=int, default=10_000)
    p.add_argument("--run-seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--demo-policies", nargs="+", default=list(DEMO_POLICIES))
    p.add_argument("--episodes", type=int, default=2, help="demonstrations per policy")
    p.add_argument("--pairs", type=int, default=1000)
    p.add_argument("--segment", type=int, default=20)
    p.add_argument("--overload-bound", type=float, default=0.2,
                   help="energy teacher: overloaded share of a segment's server-steps "
                        "that is still within the overload bound")
    p.add_argument("--weight", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--grad-scale", type=float, default=1.0)
    p.add_argument("--test-seeds", type=int, default=10)
    p.add_argument("--tail", type=int, default=10, help="last iterations for the TD summary")
    p.add_argument("--prepare-only", action="store_true",
                   help="record the demonstrations and write the pair datasets, then stop "
                        "(calls that share --out then train run seeds side by side)")
    p.add_argument("--energy-tolerance", type=float, default=0.01,
                   help="'no more energy': the paired difference's upper 95%% bound is at "
                        "most this share of plain BDQ's energy")
    return p.parse_args(argv)


def teacher_config(kind: str, n_servers: int, segment: int, overload_bound: float) -> Any:
    """The arm's teacher: ``lex`` is the default; ``energy`` bounds overload at
    ``overload_bound`` of the segment's N*T server-steps (both sides within it tie on
    overload, so slowdown spread and then energy decide), everything else the default."""
    from cloudrl.alignment.teacher import Criterion, TeacherConfig

    if kind == "lex":
        return TeacherConfig()
    if kind == "energy":
        if not 0.0 <= overload_bound <= 1.0:
            raise ValueError(f"overload_bound must be in [0, 1], got {overload_bound}")
        return TeacherConfig(overload=Criterion(bound=overload_bound * n_servers * segment))
    raise ValueError(f"teacher kind must be lex or energy, got {kind!r}")


def record_demos(out: Path, env: dict[str, Any], policies: list[str], episodes: int,
                 same_seeds: bool = False) -> dict[str, float]:
    """``episodes`` per policy on train seeds: each policy its own seeds, or (``same_seeds``)
    every policy on seeds 0..episodes-1, i.e. on the same workloads."""
    from cloudrl.recording import record_episodes

    returns = {}
    for i, policy in enumerate(policies):
        seeds = [(0 if same_seeds else i * episodes) + k for k in range(episodes)]
        summary = record_episodes(policy, out, env_config=env, interface="branching",
                                  episodes=episodes, seeds=seeds)
        returns[policy] = float(np.mean(summary.returns))
    return returns


def train_run(name: str, cfg: Any, out: Path) -> tuple[Path, list[dict[str, float]], float]:
    """Train ``cfg`` to its budget; the checkpoint, per-iteration learner metrics, wall s."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.utils.metrics import LEARNER_RESULTS

    from cloudrl.algorithms.alignment_head import BT_LOSS_KEY, PAIR_ACCURACY_KEY
    from cloudrl.training import build_algo_config, env_steps_of, write_meta

    algo = build_algo_config(cfg).build_algo()
    history: list[dict[str, float]] = []
    start = time.perf_counter()
    try:
        steps = 0
        while steps < cfg.env_steps:
            result = algo.train()
            steps = env_steps_of(result)
            stats = result.get(LEARNER_RESULTS, {}).get(DEFAULT_MODULE_ID, {})
            row = {"env_steps": float(steps)}
            for key in ("qf_loss", BT_LOSS_KEY, PAIR_ACCURACY_KEY):
                if key in stats:
                    row[key] = float(stats[key])
            history.append(row)
            print(f"[{name}] steps {steps:>6} " + " ".join(
                f"{k} {v:.4g}" for k, v in row.items() if k != "env_steps"), flush=True)
        path = out / f"ckpt_{name}"
        algo.save_to_path(str(path.resolve()))
        write_meta(path, cfg)
    finally:
        algo.stop()
    return path, history, time.perf_counter() - start


def evaluate(policy: Any, env: dict[str, Any], seeds: list[int]) -> list[dict[str, float]]:
    """Per test episode: return and the teacher's statistics over the whole episode
    (always the default teacher's definitions: overload above utilisation 0.9)."""
    from cloudrl.alignment.teacher import TeacherConfig
    from cloudrl.data.segments import episode_data, segment_stats
    from cloudrl.policy import make_env
    from cloudrl.recording import record_episode
    from envs.env_config import EnvConfig

    gym_env = make_env(EnvConfig.coerce(env), policy.interface)
    cfg = TeacherConfig()
    rows = []
    for seed in seeds:
        episode = record_episode(gym_env, policy, seed)
        data = episode_data(episode)
        rows.append({"return": float(episode.get_return()),
                     **segment_stats(data, 0, data.length, cfg)})
    return rows


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t confidence interval (NaN for one value)."""
    from scipy import stats

    arr = np.asarray(values, dtype=np.float64)
    if arr.size < 2:
        return float(arr.mean()), float("nan")
    half = stats.t.ppf(0.975, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size)
    return float(arr.mean()), float(half)


def paired_differences(arm: dict[int, list[dict[str, float]]],
                       base: dict[int, list[dict[str, float]]], key: str) -> list[float]:
    """``arm - base`` per (run seed, test seed): the same run seed's episodes, in test-seed
    order, of the run seeds both have."""
    diffs = []
    for seed in sorted(set(arm) & set(base)):
        if len(arm[seed]) != len(base[seed]):
            raise ValueError(f"run seed {seed}: {len(arm[seed])} vs {len(base[seed])} episodes")
        diffs += [a[key] - b[key] for a, b in zip(arm[seed], base[seed], strict=True)]
    return diffs


def goal_verdict(diffs: dict[str, tuple[float, float]], base_energy: float,
                 energy_tolerance: float) -> dict[str, bool]:
    """The safety goal on paired differences (mean, 95% half-width) vs plain BDQ.

    Each bound in :data:`BOUNDS` is fewer when the difference's upper 95% bound is below 0;
    energy is no more when its upper bound is at most ``energy_tolerance * base_energy``.
    """
    out = {k: diffs[k][0] + diffs[k][1] < 0.0 for k in BOUNDS}
    out["energy_kwh"] = diffs["energy_kwh"][0] + diffs["energy_kwh"][1] <= (
        energy_tolerance * base_energy)
    out["met"] = all(out.values())
    return out


def td_summary(history: list[dict[str, float]], tail: int) -> dict[str, float]:
    losses = [h["qf_loss"] for h in history if "qf_loss" in h and math.isfinite(h["qf_loss"])]
    if not losses:
        return {}
    last = losses[-tail:]
    return {"td_last_mean": float(np.mean(last)), "td_last_max": float(np.max(last)),
            "td_all_mean": float(np.mean(losses)), "td_all_max": float(np.max(losses)),
            "iterations": len(losses)}


def make_matched_pairs(episodes: list[Any], n_pairs: int, segment: int, seed: int,
                       out_dir: Path, config: Any) -> dict[str, Any]:
    """``n_pairs`` pairs of two different episodes of the same episode seed (the same
    workload), cut at the same start, labelled by the teacher ``config``: the labels
    compare behaviour, not load. Returns the label and deciding-criterion counts."""
    from collections import Counter, defaultdict

    from cloudrl.alignment.teacher import Teacher
    from cloudrl.data.pairs import pair_row, write_pairs
    from cloudrl.data.segments import cut_segment

    by_seed: dict[int, list[Any]] = defaultdict(list)
    for ep in episodes:
        if ep.length >= segment:
            by_seed[ep.episode_seed].append(ep)
    groups = [g for g in by_seed.values() if len(g) >= 2]
    capacity = sum(len(g) * (len(g) - 1) // 2 * (min(e.length for e in g) - segment + 1)
                   for g in groups)
    if n_pairs < 1 or n_pairs > capacity:
        raise ValueError(f"n_pairs {n_pairs}: {capacity} matched pairs of length {segment} "
                         f"(episodes of at least two policies on the same seed)")
    rng = np.random.default_rng(seed)
    teacher = Teacher(config, seed=seed + 1)
    seen: set[tuple[str, str, int]] = set()
    rows, labels, decided = [], Counter(), Counter()
    while len(rows) < n_pairs:
        group = groups[int(rng.integers(len(groups)))]
        i, j = (int(x) for x in rng.choice(len(group), size=2, replace=False))
        a_ep, b_ep = group[i], group[j]
        start = int(rng.integers(min(a_ep.length, b_ep.length) - segment + 1))
        if {(a_ep.episode_id, b_ep.episode_id, start),
                (b_ep.episode_id, a_ep.episode_id, start)} & seen:
            continue
        seen.add((a_ep.episode_id, b_ep.episode_id, start))
        a, b = cut_segment(a_ep, start, segment, config), cut_segment(b_ep, start, segment, config)
        _, by = teacher.compare(a.stats, b.stats)
        label = teacher.label(a.stats, b.stats)
        labels[label] += 1
        decided[by or "tie"] += 1
        rows.append(pair_row(f"matched:{a_ep.episode_id}:{b_ep.episode_id}:{start}",
                             "teacher", label, a, b))
    write_pairs(rows, out_dir, prefix="matched")
    return {"labels": dict(labels), "decided_by": dict(decided)}


def make_pairs(args: argparse.Namespace, demos: Path, out: Path, kind: str) -> dict[str, Any]:
    """The arm's pair dataset at ``out``: random pairs (lex, energy) from ``demos``, matched
    pairs (energy teacher) from ``demos``'s same-seed recordings."""
    from cloudrl.alignment.teacher import make_teacher_pairs
    from cloudrl.data.segments import load_episode_data

    cfg = teacher_config("energy" if kind == "matched" else kind, args.n_servers,
                         args.segment, args.overload_bound)
    if kind == "matched":
        made = make_matched_pairs(load_episode_data(demos), args.pairs, args.segment, 0, out,
                                  cfg)
    else:
        summary = make_teacher_pairs(demos, args.pairs, args.segment, seed=0, out_dir=out,
                                     config=cfg)
        made = {"labels": summary.labels, "decided_by": summary.decided_by}
    info = {"dir": str(out.resolve()), "labels": {str(k): v for k, v in made["labels"].items()},
            "decided_by": dict(made["decided_by"]), "overload_bound": cfg.overload.bound,
            **label_directions(out)}
    print(f"pairs ({kind} teacher, overload bound {cfg.overload.bound}): labels "
          f"{info['labels']} decided by {info['decided_by']}; the preferred side has less "
          f"energy in {info['less_energy_share']:.0%} and less overload in "
          f"{info['less_overload_share']:.0%} of the decided pairs (energy preferred - other "
          f"{info['energy_diff_kwh']:+.3f} kWh per segment)", flush=True)
    return info


def label_directions(pairs_dir: str | Path) -> dict[str, float]:
    """What the labels teach, over the decided pairs: the share whose preferred side used
    less energy / had less overload, and the mean energy difference preferred - other."""
    from cloudrl.data.pairs import read_pairs

    pairs = read_pairs(pairs_dir)
    decided = pairs.label != 0.5
    a_won = pairs.label[decided] > 0.5

    def preferred_minus_other(stat: str) -> np.ndarray:
        a, b = pairs.meta[f"a_{stat}"][decided], pairs.meta[f"b_{stat}"][decided]
        return np.where(a_won, a - b, b - a)

    energy, overload = preferred_minus_other("energy_kwh"), preferred_minus_other("overload")
    return {"decided": int(decided.sum()),
            "less_energy_share": float(np.mean(energy < 0)) if energy.size else math.nan,
            "less_overload_share": float(np.mean(overload < 0)) if overload.size else math.nan,
            "energy_diff_kwh": float(np.mean(energy)) if energy.size else math.nan}


def run_arm(args: argparse.Namespace, arm: str, seed: int, env: dict[str, Any],
            pairs: dict[str, dict[str, Any]], out: Path) -> dict[str, Any]:
    """Train (or reuse) one arm at one run seed; its run record (``run.json``)."""
    from cloudrl.training import TrainConfig

    run_dir = out / f"{arm}_s{seed}"
    record = run_dir / "run.json"
    if record.exists():
        return json.loads(record.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    hparams: dict[str, Any] = {}
    if arm != "bdq":
        hparams = {"alignment_pairs": pairs[arm.removeprefix("head_")]["dir"],
                   "alignment_weight": args.weight, "alignment_batch": args.batch,
                   "alignment_trunk_grad_scale": args.grad_scale}
    cfg = TrainConfig(algo="bdq", env=env, env_steps=args.env_steps, run_seed=seed,
                      hparams=hparams)
    path, history, wall = train_run(f"{arm}_s{seed}", cfg, run_dir)
    run = {"checkpoint": str(path), "history": history, "wall_s": wall,
           "td": td_summary(history, args.tail)}
    record.write_text(json.dumps(run, indent=1))
    return run


def start_ray(attempts: int = 4) -> None:
    """``ray.init`` for 2 CPUs, retried: on a loaded machine the raylet may miss Ray's fixed
    30 s registration window ("The current node timed out during startup")."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=2, include_dashboard=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception here
            ray.shutdown()
            if attempt == attempts:
                raise
            print(f"ray.init failed ({exc}); retrying", flush=True)
            time.sleep(10 * attempt)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import ray

    from cloudrl.checkpoint_policy import CheckpointPolicy
    from cloudrl.protocol import test_seeds
    from cloudrl.recording import make_policy

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"n_servers": args.n_servers, "workload": {"kind": "poisson"}}
    t0 = time.perf_counter()
    demos = {"random": out / "demos", "matched": out / "demos_matched"}
    for which, path in demos.items():
        if not path.exists():
            record_demos(path, env, args.demo_policies, args.episodes,
                         same_seeds=which == "matched")
    pairs = {kind: make_pairs(args, demos["matched" if kind == "matched" else "random"],
                              out / f"pairs_{kind}", kind)
             for kind in KINDS if f"head_{kind}" in args.arms
             and not (out / f"pairs_{kind}").exists()}
    for kind in KINDS:  # reused from an earlier call
        if f"head_{kind}" in args.arms and kind not in pairs:
            pairs[kind] = {"dir": str((out / f"pairs_{kind}").resolve())}

    if args.prepare_only:
        return {"pairs": pairs}
    seeds = list(test_seeds(args.test_seeds))
    runs: dict[str, dict[int, Any]] = {arm: {} for arm in args.arms}
    episodes: dict[str, dict[int, list[dict[str, float]]]] = {arm: {} for arm in args.arms}
    start_ray()
    try:
        for seed in args.run_seeds:  # seed-major: a cut-short call leaves whole seeds
            for arm in args.arms:  # each run evaluated right away (cached next to it)
                runs[arm][seed] = run = run_arm(args, arm, seed, env, pairs, out)
                cache = out / f"{arm}_s{seed}" / f"eval_{len(seeds)}.json"
                if not cache.exists():
                    rows = evaluate(CheckpointPolicy(run["checkpoint"]), env, seeds)
                    cache.write_text(json.dumps(rows))
                episodes[arm][seed] = json.loads(cache.read_text())
    finally:
        ray.shutdown()
    reference = evaluate(make_policy("power_aware", "branching"), env, seeds)

    report = summarise(args, runs, episodes, reference)
    results = {"args": vars(args), "pairs": pairs, "runs": {a: {str(s): r for s, r in v.items()}
                                                            for a, v in runs.items()},
               "episodes": {a: {str(s): r for s, r in v.items()} for a, v in episodes.items()},
               "power_aware": reference, **report, "wall_s": time.perf_counter() - t0}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'results.json'} ({results['wall_s']:.0f} s)")
    return results


def summarise(args: argparse.Namespace, runs: dict[str, dict[int, Any]],
              episodes: dict[str, dict[int, list[dict[str, float]]]],
              reference: list[dict[str, float]]) -> dict[str, Any]:
    """Print and return the TD-loss, per-arm and paired-difference tables and the verdict."""
    print(f"\nTD loss (qf_loss, mean of the last {args.tail} iterations; mean +- 95% CI "
          f"over run seeds)")
    td = {}
    for arm, by_seed in runs.items():
        per_seed = [r["td"]["td_last_mean"] for r in by_seed.values() if r["td"]]
        td[arm] = mean_ci(per_seed)
        heads = [h for r in by_seed.values() for h in r["history"][-args.tail:]
                 if "alignment/bt_loss" in h]
        extra = (f" | head bt_loss {np.mean([h['alignment/bt_loss'] for h in heads]):.3f}, "
                 f"pair accuracy {np.nanmean([h['alignment/pair_accuracy'] for h in heads]):.3f}"
                 if heads else "")
        print(f"  {arm:<12} {td[arm][0]:.4g} +- {td[arm][1]:.2g}  per seed "
              f"{[round(x, 5) for x in per_seed]}{extra}")

    pooled = {arm: [e for rows in by_seed.values() for e in rows]
              for arm, by_seed in episodes.items()}
    pooled["power_aware"] = reference
    table = {arm: {c: mean_ci([e[c] for e in rows]) for c in COLUMNS}
             for arm, rows in pooled.items()}
    print("\nTest episodes (run seeds x test seeds pooled; mean +- 95% CI per episode)")
    print(f"  {'policy':<12}" + "".join(f"{c:>22}" for c in COLUMNS))
    for arm, row in table.items():
        print(f"  {arm:<12}" + "".join(f"{row[c][0]:>12.2f} +- {row[c][1]:<7.2f}"
                                       for c in COLUMNS))
    print("\nPer run seed (means over the test seeds)")
    for arm, by_seed in episodes.items():
        for seed, rows in by_seed.items():
            print(f"  {arm:<12} s{seed} " + "".join(
                f"{c} {np.mean([e[c] for e in rows]):.2f}  " for c in COLUMNS))

    diffs: dict[str, dict[str, tuple[float, float]]] = {}
    verdicts: dict[str, dict[str, bool]] = {}
    if "bdq" in episodes:
        base_energy = table["bdq"]["energy_kwh"][0]
        print("\nPaired difference vs plain BDQ (same run seed, same test seed; mean +- 95% CI)")
        for arm in episodes:
            if arm == "bdq":
                continue
            diffs[arm] = {c: mean_ci(paired_differences(episodes[arm], episodes["bdq"], c))
                          for c in COLUMNS}
            verdicts[arm] = goal_verdict(diffs[arm], base_energy, args.energy_tolerance)
            print(f"  {arm:<12}" + "".join(f"{diffs[arm][c][0]:>12.2f} +- "
                                           f"{diffs[arm][c][1]:<7.2f}" for c in COLUMNS))
            print(f"  {'':<12}goal (fewer {', '.join(BOUNDS)}; energy upper bound <= "
                  f"{args.energy_tolerance:.0%} of BDQ): {verdicts[arm]}")
    return {"td": td, "table": table, "differences": diffs, "verdicts": verdicts}


if __name__ == "__main__":
    main()
