"""``cloudrl steer loop``: operators' own trade-offs, end to end through the labelling app.

1. Pool (TRAIN seeds): the heuristic and the MPC at random points of their spaces (and
   the run-at-once corner, the MPC's defaults), each episode recorded tick by tick
   (:mod:`.trace`) and stored as a labelling segment (:mod:`.segments`).
2. Labelling: a fresh store, one token per operator (and an admin), the app started by
   this command (``python -m cloudrl.labelling serve``: real uvicorn, on ``port`` or a
   free one), candidate pairs enqueued for every operator (k = number of operators).
   The scripted operators (:mod:`.operators`, one process each: only they load a hidden
   utility) label over HTTP in ``rounds``; between rounds the learner refits each
   operator's reward model on the labels so far and re-prioritises the open pairs by its
   ensemble's uncertainty (:func:`cloudrl.labelling.active.uncertainty`): active querying.
3. Export and reward models: per operator, its own labels (:func:`.reward.operator_labels`),
   a sequence reward model (:mod:`.reward`); agreement from ``/api/admin/stats``; a drift
   report per operator (recent vs older labels).
4. Steering (VALIDATION seeds): per operator and family, the search point with the highest
   mean learned reward; the default-tuned point (lowest mean cost) beside it.
5. Evaluation (TEST seeds, :mod:`.evaluate`): only now is a hidden utility loaded, to
   measure; ``learner_saw_utilities`` records that nothing before it had loaded one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.protocol import test_seeds, train_seeds, validation_seeds
from cloudrl.scenarios.runner import ControllerSpec
from cloudrl.steer.operators import TOKEN_ENV, OperatorSpec
from cloudrl.steer.trace import Trace, record_many

UTILITIES_MODULE = "cloudrl.steer.utilities"
FAMILIES = ("signal_aware", "mpc")


@dataclass
class LoopConfig:
    scenario: str = "tiny"
    operators: tuple[OperatorSpec, ...] = field(default_factory=lambda: (
        OperatorSpec("alice", "hour_carbon"), OperatorSpec("bob", "lc_window")))
    comparisons: int = 300  # labels per operator (skips count)
    rounds: int = 3
    pool_heuristic: int = 20
    pool_mpc: int = 5
    pool_seeds: int = 2
    search_heuristic: int = 16
    search_mpc: int = 4
    val_seeds: int = 4
    n_test_seeds: int = 10
    members: int = 3
    steps: int = 200
    seed: int = 0
    workers: int = 1
    port: int = 0
    out: str = "results/steer/loop"

    def __post_init__(self) -> None:
        if not 1 <= self.comparisons <= 1000:
            raise ValueError(f"--comparisons {self.comparisons}: must be in [1, 1000] "
                             "(labels per operator)")
        if not self.operators:
            raise ValueError("--operators: at least one")
        names = [o.name for o in self.operators]
        if len(set(names)) != len(names):
            raise ValueError(f"--operators: names repeat ({', '.join(names)})")
        for name in ("rounds", "pool_heuristic", "pool_seeds", "search_heuristic",
                     "val_seeds", "n_test_seeds", "members", "steps", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("pool_mpc", "search_mpc"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("pool_seeds", "val_seeds", "n_test_seeds"):
            if getattr(self, name) > 50:
                raise ValueError(f"{name} must be <= 50, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: not a port")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _specs(rng: np.random.Generator, n_h: int, n_m: int) -> list[ControllerSpec]:
    from cloudrl.scenarios.steering import steer_mpc_space
    from cloudrl.scenarios.tuning import RUN_AT_ONCE_LIKE, heuristic_space

    out = [ControllerSpec("signal_aware", dict(RUN_AT_ONCE_LIKE))]
    out += [ControllerSpec("signal_aware", heuristic_space(rng)) for _ in range(n_h)]
    if n_m:
        out.append(ControllerSpec("mpc", {}))
        out += [ControllerSpec("mpc", steer_mpc_space(rng)) for _ in range(n_m - 1)]
    return out


class LabellingApp:
    """The labelling service in its own process (uvicorn), stopped on exit."""

    def __init__(self, db: Path, port: int, log: Path) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cloudrl.labelling", "serve", "--db", str(db), "--port",
             str(self.port), "--gold-rate", "0", "--rate", "1000", "--burst", "1000"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the labelling app did not start on port {self.port} "
                                   f"(see {log})")
            time.sleep(0.2)

    def get(self, path: str, token: str) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path,
                                     headers={"authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _run_operators(app: LabellingApp, ops: tuple[OperatorSpec, ...], tokens: dict[str, str],
                   n: int, offsets: dict[str, int], total: int, seed: int, rnd: int
                   ) -> list[dict[str, Any]]:
    """One round: every operator labels up to ``n`` more pairs, all at once, each in its
    own process; their counts."""
    procs = []
    for i, op in enumerate(ops):
        env = {**os.environ, TOKEN_ENV: tokens[op.name]}
        cmd = [sys.executable, "-m", "cloudrl.steer.operators", "--url", app.url, "--name",
               op.name, "--utility", op.utility, "--flip", str(op.flip), "--temperature",
               str(op.temperature), "--equal", str(op.equal), "--skip", str(op.skip),
               "--max-labels", str(n), "--offset", str(offsets[op.name]),
               "--total", str(total), "--seed", str(seed * 1000 + i * 100 + rnd)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for op, p in zip(ops, procs, strict=True):
        stdout, stderr = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"operator {op.name} failed ({p.returncode}): "
                               f"{(stderr or '').strip().splitlines()[-1:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _candidate_pairs(keys: list[str], n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    """Up to ``n`` distinct unordered pairs of distinct keys, at random."""
    allp = [(keys[i], keys[j]) for i in range(len(keys)) for j in range(i + 1, len(keys))]
    idx = rng.permutation(len(allp))[:n]
    return [allp[i] for i in idx]


def _reprioritise(conn: Any, models: dict[str, Any], traces: dict[str, Trace]) -> int:
    """Open pairs ranked by the operators' reward models' uncertainty (mean over them)."""
    from cloudrl.labelling.active import uncertainty
    from cloudrl.labelling.queue import set_priorities

    rows = conn.execute("SELECT p.id, sa.seg_key, sb.seg_key FROM pairs p JOIN segments sa "
                        "ON sa.id = p.a_seg JOIN segments sb ON sb.id = p.b_seg "
                        "WHERE p.taken < p.k").fetchall()
    if not rows or not models:
        return 0
    keys = list(traces)
    index = {k: i for i, k in enumerate(keys)}
    a = np.array([index[r[1]] for r in rows])
    b = np.array([index[r[2]] for r in rows])
    pri = np.zeros(len(rows))
    for model in models.values():
        inp = model.inputs([traces[k] for k in keys])
        pri += uncertainty(model.pair_gaps(inp, a, b)) / len(models)
    return set_priorities(conn, [(int(r[0]), float(p)) for r, p in zip(rows, pri, strict=True)])


def steer_loop(cfg: LoopConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The loop (module docstring); returns the report, also written to ``out``."""
    from cloudrl.labelling.db import connect
    from cloudrl.labelling.tokens import add_operator
    from cloudrl.steer.reward import drift_report, learn, operator_labels
    from cloudrl.steer.segments import enqueue_pairs, segment_key, segment_of
    from envs.scenario.catalog import load_scenario

    t0 = time.perf_counter()
    scn = load_scenario(cfg.scenario)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([cfg.seed, 0x57EE])

    # 1. the pool, on train seeds
    pspecs = _specs(rng, cfg.pool_heuristic, cfg.pool_mpc)
    pseeds = list(train_seeds(cfg.pool_seeds))
    ptraces = record_many(scn, pspecs, pseeds, cfg.workers)
    traces: dict[str, Trace] = {}
    segments = {}
    for spec, row in zip(pspecs, ptraces, strict=True):
        for seed, tr in zip(pseeds, row, strict=True):
            key = segment_key(scn.name, spec.kind, spec.params, seed)
            traces[key] = tr
            segments[key] = segment_of(key, tr, scn.name, spec.kind, seed)
    log(f"pool: {len(traces)} episodes ({len(pspecs)} behaviours x {len(pseeds)} train "
        f"seeds), {time.perf_counter() - t0:.0f} s")

    # 2. the store, tokens, the app, candidate pairs
    db = out / "labels.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    conn = connect(db)
    tokens = {op.name: add_operator(conn, op.name) for op in cfg.operators}
    admin = add_operator(conn, "steer-admin", admin=True)
    n_cand = min(len(traces) * (len(traces) - 1) // 2, 2 * cfg.comparisons)
    pairs = _candidate_pairs(list(traces), n_cand, rng)
    enqueue_pairs(conn, segments, pairs, k=len(cfg.operators))
    log(f"enqueued {len(pairs)} pairs, each for {len(cfg.operators)} operators")

    app = LabellingApp(db, cfg.port, out / "app.log")
    counts: dict[str, dict[str, int]] = {op.name: {} for op in cfg.operators}
    offsets = {op.name: 0 for op in cfg.operators}
    models: dict[str, Any] = {}
    infos: dict[str, Any] = {}
    try:
        per_round = [cfg.comparisons // cfg.rounds + (r < cfg.comparisons % cfg.rounds)
                     for r in range(cfg.rounds)]
        for rnd, n in enumerate(per_round):
            if n == 0:
                continue
            res = _run_operators(app, cfg.operators, tokens, n, offsets, cfg.comparisons,
                                 cfg.seed, rnd)
            for c in res:
                offsets[c["operator"]] += c["labels"]
                for k, v in c.items():
                    if isinstance(v, int) and k != "switch_at":
                        counts[c["operator"]][k] = counts[c["operator"]].get(k, 0) + v
            labels = operator_labels(conn)
            for op in cfg.operators:
                if len(labels.get(op.name, [])) >= 2:
                    models[op.name], infos[op.name] = learn(
                        traces, labels[op.name], seed=cfg.seed, steps=cfg.steps,
                        members=cfg.members)
            if rnd < len(per_round) - 1:
                _reprioritise(conn, models, traces)
            log(f"round {rnd + 1}/{cfg.rounds}: " + ", ".join(
                f"{op.name} {offsets[op.name]} labels (held-out pair accuracy "
                f"{infos.get(op.name, {}).get('heldout_acc', float('nan')):.3f})"
                for op in cfg.operators) + f" ({time.perf_counter() - t0:.0f} s)")
        stats = app.get("/api/admin/stats", admin)
    finally:
        app.stop()

    # 3. export: each operator's labels; drift
    labels = operator_labels(conn)
    (out / "labels.json").write_text(json.dumps(labels))
    drift = {name: drift_report(models[name], traces, labels[name])
             for name in models if len(labels.get(name, [])) >= 10}

    # 4. steering on validation seeds (the learner's choice)
    srng = np.random.default_rng([cfg.seed, 13])
    search = {f: [s for s in _specs(srng, cfg.search_heuristic, cfg.search_mpc)
                  if s.kind == f] for f in FAMILIES}
    vseeds = list(validation_seeds(cfg.val_seeds))
    vtraces = {f: record_many(scn, search[f], vseeds, cfg.workers) for f in FAMILIES
               if search[f]}
    chosen: dict[str, dict[str, int]] = {}
    for f, rows in vtraces.items():
        cost = [np.mean([t.cost_usd() for t in row]) for row in rows]
        chosen.setdefault("default", {})[f] = int(np.argmin(cost))
        for name, model in models.items():
            r = [float(model.score(model.inputs(row)).mean()) for row in rows]
            chosen.setdefault(name, {})[f] = int(np.argmax(r))
    learner_saw = UTILITIES_MODULE in sys.modules
    log(f"steered (validation, {len(vseeds)} seeds): " + ", ".join(
        f"{name}: " + " ".join(f"{f} #{i}" for f, i in ch.items())
        for name, ch in chosen.items()) + f" ({time.perf_counter() - t0:.0f} s)")

    # 5. evaluation under each operator's hidden utility, on test seeds
    from cloudrl.steer.evaluate import hidden_choice, rows_for

    tseeds = list(test_seeds(cfg.n_test_seeds))
    need: dict[tuple[str, int], None] = {}
    hidden: dict[str, dict[str, int]] = {}
    for op in cfg.operators:
        for f, rows in vtraces.items():
            hidden.setdefault(op.name, {})[f] = hidden_choice(op.utility, rows)
            for who in ("default", op.name):
                if who in chosen:
                    need[(f, chosen[who][f])] = None
            need[(f, hidden[op.name][f])] = None
    need[("signal_aware", chosen["default"]["signal_aware"])] = None
    order = list(need)
    ttr = record_many(scn, [search[f][i] for f, i in order], tseeds, cfg.workers)
    test = dict(zip(order, ttr, strict=True))
    base = test[("signal_aware", chosen["default"]["signal_aware"])]
    table = []
    for op in cfg.operators:
        if op.name not in chosen:
            continue
        for f in vtraces:
            rows = rows_for(op.utility, f, {
                "default": test[(f, chosen["default"][f])],
                "hidden": test[(f, hidden[op.name][f])],
                "steered": test[(f, chosen[op.name][f])]}, base)
            for r in rows:
                r["operator"] = op.name
            table.extend(rows)
    report = {"config": {**asdict(cfg), "operators": [asdict(o) for o in cfg.operators]},
              "pool_episodes": len(traces), "pairs_enqueued": len(pairs),
              "label_counts": counts, "reward_models": infos, "drift": drift,
              "agreement": stats.get("quality", {}), "queue": stats.get("queue", {}),
              "chosen": {k: {f: search[f][i].params for f, i in v.items()}
                         for k, v in chosen.items()},
              "hidden_tuned": {k: {f: search[f][i].params for f, i in v.items()}
                               for k, v in hidden.items()},
              "learner_saw_utilities": learner_saw, "rows": table,
              "wall_s": time.perf_counter() - t0}
    report["table"] = format_table(report)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    return report


def format_table(rep: dict[str, Any]) -> str:
    c = rep["config"]
    lines = [f"{c['scenario']}: {c['comparisons']} labels per operator over HTTP, "
             f"{c['n_test_seeds']} test seeds; U = the operator's hidden utility "
             "($/episode, lower is better)",
             f"{'operator':10s} {'utility':16s} {'family':13s} {'policy':8s} {'U':>8s} "
             f"{'cost':>7s}  {'U - default heuristic [95% CI]':>30s} {'gap closed':>10s}"]
    for r in rep["rows"]:
        d, lo, hi = r["vs_default_heuristic"]
        gap = "" if r["policy"] != "steered" else (
            "n/a" if not np.isfinite(r["gap_closed"]) else f"{100 * r['gap_closed']:.0f}%")
        lines.append(f"{r['operator']:10s} {r['utility']:16s} {r['family']:13s} "
                     f"{r['policy']:8s} {r['utility_mean']:8.3f} {r['cost_usd_mean']:7.3f}  "
                     f"{d:+8.3f} [{lo:+8.3f}, {hi:+8.3f}]  {gap:>10s}")
    for name, info in rep["reward_models"].items():
        cnt = rep["label_counts"].get(name, {})
        lines.append(f"{name}: {cnt.get('labels', 0)} labels ({cnt.get('skip', 0)} skip, "
                     f"{cnt.get('equal', 0)} equal, {cnt.get('flipped', 0)} flipped), "
                     f"held-out pair accuracy {info['heldout_acc']:.3f}")
    q = rep.get("agreement", {})
    alpha = q.get("krippendorff_alpha", q.get("alpha"))
    if alpha is not None:
        lines.append(f"agreement between operators: Krippendorff's alpha {alpha}")
    lines.append(f"wall time {rep['wall_s']:.0f} s")
    return "\n".join(lines)
