"""Soak of the production loop: live traffic, operator feedback, two retrain -> canary
cycles (one promoted, one rolled back by a planted bad policy), a kill of the service and a
backup/restore, with the production-loop goal checked at the end.

What it does, on one machine (Ray on 2 CPUs, Serve on localhost):

1. Builds a champion policy (an untrained gated DQN over the power-aware controller: a real
   RLlib checkpoint that schedules well), registers it as ``models:/cloudrl-policy@champion``
   (``cloudrl.loop.registry``) and serves it (``serve_apps.app``) with a bearer token.
2. Live traffic: ``--clusters`` simulated clusters (the env itself) step with the service's
   decisions, ``--batch`` states per ``/v1/decide/batch`` request from ``--clients``
   keep-alive threads paced to ``--rate`` decisions/s. Every answer is checked against the
   cluster's own action mask (an infeasible action served would be counted).
3. Operator feedback: every ``--feedback-every`` s, the last ``--segment`` steps of two
   clusters become a ranked pair (the larger true env reward preferred) posted to
   ``/v1/feedback``; every acknowledged row id is remembered.
4. Cycle 1 (after ``--warmup`` s): ``cloudrl loop retrain`` (reward model on the new
   feedback, validation, challenger registered when no worse; ``--fine-tune-steps 0``, the
   default, gives it a copy of the champion as ``--candidate`` instead of a phase-3
   fine-tune) then ``cloudrl loop rollout --policy models:/cloudrl-policy@challenger``:
   expected promoted (exit 0), which moves the ``champion`` alias.
5. Kill drill: traffic paused, the service's replica is killed with SIGKILL; Serve starts
   a new one on the same state database; every acknowledged feedback row must be there and
   the promoted version still served; traffic resumes.
6. Cycle 2: ``cloudrl loop retrain`` again on the feedback since cycle 1, then the canary
   is the planted bad policy (``--bad-policy``, default
   ``python:serve_apps.faults:infeasible_later``: after the smoke test, proposes masked
   actions on every state; the tick-dependent ``faults:infeasible`` can pass a whole canary
   window when the clusters are all in the first half of their episodes):
   expected rolled back at once by the rollout controller (exit 1); the shield answers
   meanwhile, so nothing infeasible is served.
7. Traffic runs until ``--duration`` s (at least until both cycles are done), then the
   service stops, the state database and the registry are backed up (``cloudrl.loop.backup``
   when present, else SQLite's online backup API) and restored into a fresh directory,
   where every acknowledged feedback row must be found.

The summary (JSON in ``--out``/summary.json, and a table on stdout) has decisions/s, the
decision latency p50/p95/p99 seen by the clients, HTTP status counts (5xx separately for the
kill window), infeasible actions served, acknowledged vs restored feedback rows, the two
cycles (retrain decision, rollout exit code and reason, wall time) and the goal check.

How to run:
    python experiments/benchmarks/soak_loop.py --duration 180   # a 3-minute proof run
    python experiments/benchmarks/soak_loop.py --duration 1800 --rate 250   # the 30-minute soak

Results to expect: see the README's "production loop" section (measured on the shared
2-core machine; the retrain cycles compete with the traffic for the 2 cores).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.argparsing import CliParser

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "soak-token-" + os.urandom(8).hex()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CliParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=1800.0, help="seconds of traffic (1800)")
    p.add_argument("--warmup", type=float, help="seconds before cycle 1 (default 15%% of "
                   "--duration, at least 20)")
    p.add_argument("--rate", type=float, default=250.0, help="target decisions/s (250)")
    p.add_argument("--clients", type=int, default=2, help="client threads (2)")
    p.add_argument("--clusters", type=int, default=64, help="simulated clusters (64)")
    p.add_argument("--batch", type=int, default=32, help="states per request (32, the "
                   "service's max_batch_size)")
    p.add_argument("--n-servers", type=int, default=8, help="fleet size (8)")
    p.add_argument("--workload", default="poisson")
    p.add_argument("--feedback-every", type=float, default=0.5, help="s between pairs (0.5)")
    p.add_argument("--segment", type=int, default=8, help="steps per pair side (8)")
    p.add_argument("--weight", type=float, default=0.2, help="canary share (0.2)")
    p.add_argument("--promote-after", type=int, default=1000, help="canary decisions (1000)")
    p.add_argument("--bad-policy", default="python:serve_apps.faults:infeasible_later")
    p.add_argument("--fine-tune-steps", type=int, default=0, help="0: the retrain's candidate "
                   "is a copy of the champion; >0 needs a fine-tunable champion (not the "
                   "gated DQN) and is not supported here yet")
    p.add_argument("--val-seeds", type=int, default=2)
    p.add_argument("--eval-ticks", type=int, default=100)
    p.add_argument("--reward-epochs", type=int, default=5)
    p.add_argument("--out", default="results/soak", help="work directory (results/soak)")
    args = p.parse_args(argv)
    for name in ("duration", "rate", "feedback_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.fine_tune_steps:
        p.error("--fine-tune-steps: only 0 (a copy of the champion as candidate) for now")
    if args.warmup is None:
        args.warmup = max(20.0, 0.15 * args.duration)
    return args


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ----------------------------------------------------------------------------- policies
def build_checkpoint(out: Path, env: dict[str, Any], seed: int = 0) -> Path:
    """A gated-DQN cloudrl checkpoint with freshly initialised weights (no training)."""
    import torch
    from ray.tune.registry import ENV_CREATOR, _global_registry

    from cloudrl.checkpoint_policy import MODULE_SUBDIR
    from cloudrl.training import TrainConfig, build_algo_config, write_meta

    cfg = TrainConfig(algo="gated_dqn", env=env, hidden=16, run_seed=seed)
    config = build_algo_config(cfg)
    env_obj = _global_registry.get(ENV_CREATOR, config.env)(config.env_config)
    torch.manual_seed(seed)
    config.get_rl_module_spec(env=env_obj).build().save_to_path(str(out / MODULE_SUBDIR))
    write_meta(out, cfg)
    return out


# ----------------------------------------------------------------------------- HTTP
class Http:
    """One keep-alive connection; ``call`` returns (status, JSON or None); status 0: the
    connection failed (refused, reset) and is reopened on the next call."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.port, self.timeout = port, timeout
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None, token: bool = False
             ) -> tuple[int, Any]:
        headers = {"content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {TOKEN}"
        data = None if body is None else json.dumps(body)
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=self.timeout)
            self.conn.request(method, path, body=data, headers=headers)
            resp = self.conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException):
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return 0, None
        try:
            return resp.status, json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return resp.status, None


# ----------------------------------------------------------------------------- traffic
class Cluster:
    """One simulated cluster: the env steps with the service's decisions."""

    def __init__(self, index: int, env_config: dict[str, Any], segment: int) -> None:
        from envs.cluster_env import ClusterBranchingEnv

        self.key = f"cluster-{index}"
        self.env = ClusterBranchingEnv(env_config)
        self.seed = 1_000 + index * 100_000
        self.obs, _ = self.env.reset(seed=self.seed)
        self.history: deque = deque(maxlen=segment)  # (state, action, reward)

    def state(self) -> dict[str, Any]:
        from serve_apps.state import state_of

        return state_of(self.env.sim)

    def step(self, state: dict[str, Any], raw: Any) -> None:
        obs, reward, terminated, truncated, _ = self.env.step(np.asarray(raw))
        self.history.append((state, raw, float(reward)))
        if terminated or truncated:
            self.seed += 1
            obs, _ = self.env.reset(seed=self.seed)
            self.history.clear()
        self.obs = obs


class Stats:
    """Counters shared by the client threads (under one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.status: Counter = Counter()
        self.drill_status: Counter = Counter()
        self.decisions = 0
        self.infeasible = 0
        self.fallbacks: Counter = Counter()
        self.versions: Counter = Counter()
        self.latencies: list[float] = []  # per request, ms, client side
        self.answered: list[tuple[float, int]] = []  # (monotonic time, decisions) per request
        self.server_latencies: list[float] = []
        self.acked: list[int] = []
        self.feedback_sent = 0
        self.in_drill = False

    def http(self, status: int) -> None:
        with self.lock:
            (self.drill_status if self.in_drill else self.status)[status] += 1


def client_loop(port: int, clusters: list[Cluster], args: argparse.Namespace, stats: Stats,
                stop: threading.Event, paused: threading.Event, share: float) -> None:
    from serve_apps.runtime import ServedPolicy

    env_config = clusters[0].env.config
    checker = ServedPolicy("heuristic:power_aware", "check", env_config, "branching")
    conn = Http(port)
    period = min(args.batch, len(clusters)) / (args.rate * share)  # s per request
    next_at, i = time.perf_counter(), 0
    while not stop.is_set():
        if paused.is_set():
            time.sleep(0.05)
            next_at = time.perf_counter()
            continue
        size = min(args.batch, len(clusters))  # a cluster at most once per request
        group = [clusters[(i + k) % len(clusters)] for k in range(size)]
        i += size
        states = [c.state() for c in group]
        body = {"states": [{**s, "routing_key": c.key} for s, c in zip(states, group,
                                                                        strict=True)]}
        t0 = time.perf_counter()
        status, out = conn.call("POST", "/v1/decide/batch", body)
        elapsed = (time.perf_counter() - t0) * 1e3
        stats.http(status)
        if status == 200:
            bad = 0
            for c, s, d in zip(group, states, out["decisions"], strict=True):
                raw = d["action"]["raw"]
                if not checker.is_feasible(np.asarray(raw), c.obs):
                    bad += 1
                c.step(s, raw)
            with stats.lock:
                stats.decisions += len(group)
                stats.infeasible += bad
                stats.latencies.append(elapsed)
                stats.answered.append((time.monotonic(), len(group)))
                for d in out["decisions"]:
                    stats.versions[d["policy_version"]] += 1
                    stats.server_latencies.append(d["latency_ms"])
                    if d["answered_by"] == "fallback":
                        stats.fallbacks[d["fallback_reason"]] += 1
        next_at += period
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.perf_counter()  # behind: do not burst to catch up


def feedback_loop(port: int, clusters: list[Cluster], args: argparse.Namespace, stats: Stats,
                  stop: threading.Event, paused: threading.Event) -> None:
    conn = Http(port)
    rng = np.random.default_rng(0)
    while not stop.wait(args.feedback_every):
        if paused.is_set():
            continue
        ready = [c for c in clusters if len(c.history) == args.segment]
        if len(ready) < 2:
            continue
        a, b = (ready[j] for j in rng.choice(len(ready), 2, replace=False))
        sides = []
        for c in (a, b):
            steps = list(c.history)  # a snapshot: the client thread appends meanwhile
            sides.append(({"steps": [{"state": s, "action": np.asarray(r).tolist()}
                                     for s, r, _ in steps]}, sum(w for *_, w in steps)))
        (ta, ra), (tb, rb) = sides
        pair = {"a": {"trajectory": ta}, "b": {"trajectory": tb},
                "preferred": "a" if ra > rb else "b" if rb > ra else "equal",
                "operator": "soak-teacher"}
        status, out = conn.call("POST", "/v1/feedback", {"pairs": [pair]}, token=True)
        stats.http(status)
        with stats.lock:
            stats.feedback_sent += 1
            if status == 200:
                stats.acked.extend(out["ids"])


# ----------------------------------------------------------------------------- the loop
def run_cli(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[int, str, float]:
    """``python -m cloudrl ARGV`` in a subprocess at a lower CPU priority than the traffic
    (as a batch retrain job would run next to a live service); (exit code, stdout, s)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cloudrl", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False,
                          preexec_fn=lambda: os.nice(10))  # live traffic comes first
    log_path.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    return proc.returncode, proc.stdout, time.monotonic() - t0


def retrain(work: Path, db: Path, uri: str, candidate: Path, args: argparse.Namespace,
            env: dict[str, str], n: int) -> dict[str, Any]:
    code, out, seconds = run_cli(
        ["loop", "retrain", "--feedback-db", str(db), "--tracking-uri", uri, "--out",
         str(work / "retrain"), "--candidate", str(candidate), "--val-seeds",
         str(args.val_seeds), "--eval-ticks", str(args.eval_ticks), "--reward-epochs",
         str(args.reward_epochs), "--segment-length", str(args.segment)],
        env, work / f"retrain_{n}.log")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if code == 0 and lines else {"decision": "failed"}
    result.update(exit_code=code, seconds=round(seconds, 1))
    return result


def rollout(work: Path, port: int, uri: str, spec: str, args: argparse.Namespace,
            env: dict[str, str], n: int) -> dict[str, Any]:
    code, out, seconds = run_cli(
        ["loop", "rollout", "--url", f"http://127.0.0.1:{port}", "--policy", spec,
         "--weight", str(args.weight), "--promote-after", str(args.promote_after),
         "--tracking-uri", uri, "--timeout", "900", "--reason", f"soak cycle {n}"],
        env, work / f"rollout_{n}.log")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    final = json.loads(lines[-1]) if lines else {}
    return {"exit_code": code, "decision": final.get("decision"),
            "reason": final.get("reason"), "seconds": round(seconds, 1), "spec": spec}


def feedback_ids(db: Path) -> set[int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return {int(r[0]) for r in conn.execute("SELECT id FROM feedback")}
    finally:
        conn.close()


def wait_healthy(conn: Http, timeout: float = 300.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if conn.call("GET", "/healthz")[0] == 200:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise RuntimeError(f"service not healthy within {timeout:g} s")


def kill_drill(port: int, db: Path, stats: Stats, paused: threading.Event) -> dict[str, Any]:
    """Pause traffic, SIGKILL the replica, wait for Serve's new one; nothing acked is lost."""
    conn = Http(port)
    paused.set()
    time.sleep(2.0)  # let in-flight requests finish
    before = conn.call("GET", "/v1/rollout", token=True)[1]
    pid = conn.call("GET", "/v1/metrics")[1]["pid"]
    with stats.lock:
        stats.in_drill = True
        acked = set(stats.acked)
    os.kill(pid, signal.SIGKILL)
    log(f"drill: replica pid {pid} killed")
    time.sleep(1.0)
    t0 = time.monotonic()
    while True:  # Serve notices the dead replica and starts another
        status, out = conn.call("GET", "/v1/metrics")
        if status == 200 and out["pid"] != pid:
            break
        if time.monotonic() - t0 > 300:
            raise RuntimeError("no new replica within 300 s")
        time.sleep(0.5)
    recovery = time.monotonic() - t0
    after = conn.call("GET", "/v1/rollout", token=True)[1]
    present = feedback_ids(db)
    with stats.lock:
        stats.in_drill = False
    paused.clear()
    return {"killed_pid": pid, "new_pid": out["pid"], "recovery_s": round(recovery, 1),
            "acked_before_kill": len(acked), "lost": len(acked - present),
            "stable_before": before["stable"]["version"],
            "stable_after": after["stable"]["version"]}


def backup_and_restore(work: Path, db: Path, uri: str, acked: set[int]) -> dict[str, Any]:
    """Back up the (stopped) service's state and the registry, restore it fresh, compare."""
    dest, into = work / "backup", work / "restored"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(into, ignore_errors=True)
    try:
        from cloudrl.loop.backup import backup, restore
    except ImportError:
        backup = restore = None  # type: ignore[assignment]
    if backup is not None:
        backup(str(dest), checkpoints=[], replay=[], feedback_db=str(db), tracking_uri=uri,
               registry=True)
        restore(str(dest), str(into))
        found = sorted(into.rglob(db.name))
        how = "cloudrl.loop.backup"
    else:  # SQLite's online backup API: a consistent copy even while written
        into.mkdir(parents=True)
        src, dst = sqlite3.connect(str(db)), sqlite3.connect(str(into / db.name))
        with dst:
            src.backup(dst)
        src.close()
        dst.close()
        found = [into / db.name]
        how = "sqlite3 backup API (cloudrl.loop.backup not available)"
    restored = feedback_ids(found[0]) if found else set()
    return {"how": how, "restored_db": str(found[0]) if found else None,
            "acked": len(acked), "restored_rows": len(restored),
            "lost": len(acked - restored)}


def window_rates(answered: list[tuple[float, int]], start: float, end: float,
                 skip: tuple[float, float], width: float = 10.0) -> dict[str, float]:
    """Decisions/s in consecutive ``width``-second windows (those overlapping ``skip``, the
    kill window, left out): min, median, max and the share of windows at >= 200/s."""
    edges = np.arange(start, end - width + 1e-9, width)
    times = np.array([t for t, _ in answered])
    counts = np.array([n for _, n in answered], dtype=float)
    rates = [counts[(times >= a) & (times < a + width)].sum() / width for a in edges
             if a + width <= skip[0] or a >= skip[1]]
    if not rates:
        return {}
    return {"windows": len(rates), "min": round(float(np.min(rates)), 1),
            "median": round(float(np.median(rates)), 1), "max": round(float(np.max(rates)), 1),
            "share_at_200": round(float(np.mean(np.array(rates) >= 200)), 3)}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values)
    return {f"p{q}": round(float(np.percentile(arr, q)), 1) for q in (50, 95, 99)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    from ray import serve

    from cloudrl.loop import registry
    from serve_apps.app import build_app
    from serve_apps.metrics import LoopMetrics

    work = (ROOT / args.out / time.strftime("run-%Y%m%d-%H%M%S")).resolve()
    work.mkdir(parents=True)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    db = work / "state.db"
    env_config = {"n_servers": args.n_servers, "workload": args.workload}
    child_env = {**os.environ, "CLOUDRL_SERVE_TOKEN": TOKEN, "MLFLOW_TRACKING_URI": uri,
                 "OMP_NUM_THREADS": "1",  # the retrain shares the 2 cores with the traffic
                 "PYTHONPATH": str(ROOT)}
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    ray.init(num_cpus=2, include_dashboard=False)
    t_setup = time.monotonic()
    champion = build_checkpoint(work / "champion", env_config, seed=0)
    registry.register_policy(champion, eval_table={}, lineage={"soak": "initial champion"},
                             tracking_uri=uri, aliases=(registry.CHAMPION,))
    twin = work / "candidate"
    shutil.copytree(champion, twin)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app({"policy": str(registry.resolve(f"models:/{registry.POLICY_MODEL}"
                                                       "@champion", tracking_uri=uri)),
                         "env": env_config, "interface": "branching", "state_db": str(db),
                         "auth_token": TOKEN, "num_cpus": 0.0, "failure_threshold": 3,
                         "cooldown_s": 30.0}), name="cloudrl", route_prefix="/",
              logging_config={"enable_access_log": False})
    log(f"service on port {port}, setup {time.monotonic() - t_setup:.0f} s; work dir {work}")

    clusters = [Cluster(i, env_config, args.segment) for i in range(args.clusters)]
    stats, stop, paused = Stats(), threading.Event(), threading.Event()
    per_client = [clusters[k::args.clients] for k in range(args.clients)]
    threads = [threading.Thread(target=client_loop, daemon=True,
                                args=(port, group, args, stats, stop, paused,
                                      1.0 / args.clients)) for group in per_client]
    threads.append(threading.Thread(target=feedback_loop, daemon=True,
                                    args=(port, clusters, args, stats, stop, paused)))
    loop_metrics = LoopMetrics()
    t0 = time.monotonic()
    for t in threads:
        t.start()

    def progress(tag: str) -> None:
        with stats.lock:
            n, el = stats.decisions, time.monotonic() - t0
            log(f"{tag}: {n} decisions in {el:.0f} s ({n / max(el, 1e-9):.0f}/s), "
                f"statuses {dict(stats.status)}, infeasible served {stats.infeasible}, "
                f"feedback acked {len(stats.acked)}")

    def wait_until(t: float) -> None:
        while time.monotonic() - t0 < t:
            time.sleep(min(10.0, max(0.1, t - (time.monotonic() - t0))))
            progress("traffic")

    cycles: list[dict[str, Any]] = []
    wait_until(args.warmup)
    # cycle 1: retrain -> challenger -> canary -> promoted
    log("cycle 1: retrain")
    r1 = retrain(work, db, uri, twin, args, child_env, 1)
    if "new_heldout_accuracy" in r1.get("reward", {}):
        loop_metrics.reward_model(r1["reward"]["new_heldout_accuracy"],
                                  str(r1.get("reward_version")))
    log(f"cycle 1: retrain {r1['decision']} in {r1['seconds']} s")
    c1: dict[str, Any] = {"retrain": r1}
    if r1["decision"] == "registered":
        c1["rollout"] = rollout(work, port, uri, f"models:/{registry.POLICY_MODEL}@challenger",
                                args, child_env, 1)
        c1["champion_after"] = registry.alias_version(registry.POLICY_MODEL, "champion",
                                                      tracking_uri=uri)
        log(f"cycle 1: rollout {c1['rollout']['decision']} ({c1['rollout']['reason']})")
    cycles.append(c1)
    progress("after cycle 1")

    t_drill = time.monotonic()
    drill = kill_drill(port, db, stats, paused)
    drill_window = (t_drill, time.monotonic())
    log(f"drill: {drill}")

    # cycle 2: retrain -> a planted bad policy on canary -> rolled back
    log("cycle 2: retrain")
    r2 = retrain(work, db, uri, twin, args, child_env, 2)
    if "new_heldout_accuracy" in r2.get("reward", {}):
        loop_metrics.reward_model(r2["reward"]["new_heldout_accuracy"],
                                  str(r2.get("reward_version")))
    log(f"cycle 2: retrain {r2['decision']} in {r2['seconds']} s; planting {args.bad_policy}")
    c2 = {"retrain": r2, "rollout": rollout(work, port, uri, args.bad_policy, args,
                                            child_env, 2)}
    c2["champion_after"] = registry.alias_version(registry.POLICY_MODEL, "champion",
                                                  tracking_uri=uri)
    log(f"cycle 2: rollout {c2['rollout']['decision']} ({c2['rollout']['reason']})")
    cycles.append(c2)

    wait_until(args.duration)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    elapsed = time.monotonic() - t0
    from cloudrl.loop.retrain import pending_feedback

    loop_metrics.pending(pending_feedback(db, uri))
    final = Http(port).call("GET", "/v1/rollout?limit=1000", token=True)[1]
    serve.shutdown()
    with stats.lock:
        acked = set(stats.acked)
    restored = backup_and_restore(work, db, uri, acked)
    ray.shutdown()

    five_xx = sum(v for k, v in stats.status.items() if k >= 500)
    windows = window_rates(stats.answered, t0, t0 + elapsed, drill_window)
    traffic_s = elapsed - (drill_window[1] - drill_window[0])
    summary = {
        "duration_s": round(elapsed, 1), "decisions": stats.decisions,
        "decisions_per_s": round(stats.decisions / elapsed, 1),
        "decisions_per_s_outside_kill_window": round(stats.decisions / traffic_s, 1),
        "rate_per_10s_window": windows,
        "request_latency_ms": percentiles(stats.latencies), "batch": args.batch,
        "server_latency_ms": percentiles(stats.server_latencies),
        "http_status": dict(stats.status), "http_status_in_kill_window": dict(
            stats.drill_status), "infeasible_served": stats.infeasible,
        "fallbacks": dict(stats.fallbacks), "versions": dict(stats.versions),
        "feedback": {"sent": stats.feedback_sent, "acked": len(acked)},
        "cycles": cycles, "kill_drill": drill, "restore": restored,
        "transitions": [(e["event"], e["version"], e["reason"]) for e in final["history"]],
        "load_avg": os.getloadavg(),
    }
    c1_ok = cycles[0].get("rollout", {}).get("exit_code") == 0
    c2_ok = cycles[1]["rollout"]["exit_code"] == 1
    summary["goal"] = {
        "duration >= 1800 s": elapsed >= 1800,
        "decisions/s >= 200 (outside the kill window)":
            summary["decisions_per_s_outside_kill_window"] >= 200,
        "cycle promoted": c1_ok, "cycle rolled back": c2_ok,
        "zero infeasible served": stats.infeasible == 0, "zero 5xx": five_xx == 0,
        "zero feedback lost (kill)": drill["lost"] == 0,
        "zero feedback lost (restore)": restored["lost"] == 0}
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))
    print("\n| check | result |\n|---|---|")
    for k, v in summary["goal"].items():
        print(f"| {k} | {'yes' if v else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
