"""Load test of the labelling service: N simulated operators label pairs for a while.

What it does: builds a fresh labelling database in a temporary directory (synthetic
pairs, enough for the run; N operator tokens and one admin), starts
``python -m cloudrl.labelling serve`` (the same app as ``cloudrl label serve``) as a
subprocess, and runs N simulated operators concurrently from one asyncio process. Each
operator loads the page and its assets, signs in (``/api/me``), takes a task
(``/api/next``), then loops: think (uniform in [think/2, 3*think/2] seconds), post a
label (``/api/labels``, whose answer carries the next task), with an optional note on
one label in five; every 20th label it reloads the page. One admin polls
``/api/admin/stats`` every 5 s. Any non-2xx answer or transport error counts as an
error. At the end the database is read back: every acknowledged label must be there.

How to run (2 cores, the numbers in docs/tasks/labelling.md)::

    python experiments/benchmarks/bench_labelling.py --operators 50 --duration 300
    python experiments/benchmarks/bench_labelling.py --duration 20   # a quick look

Expect on a 2-core machine with 50 operators thinking ~1 s per pair (five to twenty
times faster than people label): 0 errors, every acknowledged label stored, p99 well
under 200 ms for every endpoint; the table prints requests, errors, p50/p95/p99/max
latency in ms and requests per second per endpoint.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from cloudrl.argparsing import CliParser

REPO = Path(__file__).resolve().parents[2]


def build_db(path: Path, operators: int, pairs: int, k: int, gold: int, seed: int
             ) -> tuple[list[str], str]:
    from cloudrl.labelling import db, tokens
    from cloudrl.labelling.queue import PairSpec, add_pairs
    from cloudrl.labelling.synthetic import synthetic_segments

    conn = db.connect(path)
    # few distinct segments, many pairs of them (the store dedups segments)
    segs = synthetic_segments(120, seed=seed, signal=True, classes=True, scenario="bench-a")
    segs += synthetic_segments(120, seed=seed + 1, scenario="bench-b")
    rng = random.Random(seed)
    specs, seen = [], set()
    while len(specs) < pairs:
        i, j = rng.sample(range(len(segs)), 2)
        if (i, j) in seen or (j, i) in seen:
            continue
        seen.add((i, j))
        specs.append(PairSpec(a=segs[i], b=segs[j], source="bench",
                              gold="a" if len(specs) < gold else None,
                              priority=rng.random()))
    add_pairs(conn, specs, k=k)
    toks = [tokens.add_operator(conn, f"op{i:03d}") for i in range(operators)]
    admin = tokens.add_operator(conn, "admin", admin=True)
    conn.close()
    return toks, admin


def free_port(lo: int, hi: int) -> int:
    for port in range(lo, hi):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit(f"no free port in {lo}..{hi}")


class Stats:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.error_samples: list[str] = []
        self.acked: list[int] = []


async def request(session, stats: Stats, name: str, method: str, url: str, token=None,
                  body=None):
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    t0 = time.perf_counter()
    try:
        async with session.request(method, url, json=body, headers=headers) as r:
            payload = await r.read()
            ok = 200 <= r.status < 300
            status = r.status
    except (TimeoutError, aiohttp.ClientError) as e:
        ok, status, payload = False, type(e).__name__, b""
    stats.latency[name].append((time.perf_counter() - t0) * 1000.0)
    if not ok:
        stats.errors[name] += 1
        if len(stats.error_samples) < 5:
            stats.error_samples.append(f"{name}: {status} {payload[:200]!r}")
        return None
    if name.startswith("/api/"):
        return json.loads(payload)
    return payload


async def page_load(session, stats, base, token):
    html = await request(session, stats, "GET /", "GET", base + "/")
    if html is None:
        return
    for asset in ("label.css", "common.js", "label.js"):
        marker = f"/static/{asset}?v="
        i = html.decode().find(marker)
        if i >= 0:
            url = html.decode()[i:html.decode().index('"', i)]
            await request(session, stats, "GET /static/*", "GET", base + url)
    await request(session, stats, "/api/me", "GET", base + "/api/me", token)


async def operator(session, stats, base, token, stop_at, think, rng):
    await asyncio.sleep(rng.uniform(0, think))  # operators do not start in lockstep
    await page_load(session, stats, base, token)
    got = await request(session, stats, "/api/next", "GET", base + "/api/next", token)
    task = got and got["task"]
    n = 0
    while time.monotonic() < stop_at:
        if task is None:  # queue empty for this operator: check again later
            await asyncio.sleep(think)
            got = await request(session, stats, "/api/next", "GET", base + "/api/next", token)
            task = got and got["task"]
            continue
        await asyncio.sleep(rng.uniform(0.5 * think, 1.5 * think))
        body = {"assignment_id": task["assignment_id"],
                "choice": rng.choice(["a", "b", "a", "b", "equal", "skip"]),
                "time_taken_ms": int(think * 1000)}
        if rng.random() < 0.2:
            body["note"] = "queue built up on the left"
        got = await request(session, stats, "/api/labels", "POST", base + "/api/labels",
                            token, body)
        if got is None:
            got = await request(session, stats, "/api/next", "GET", base + "/api/next", token)
            task = got and got["task"]
            continue
        stats.acked.append(got["stored"]["label_id"])
        task = got["task"]
        n += 1
        if n % 20 == 0:
            await page_load(session, stats, base, token)


async def admin_poll(session, stats, base, token, stop_at):
    while time.monotonic() < stop_at:
        await request(session, stats, "/api/admin/stats", "GET", base + "/api/admin/stats",
                      token)
        await asyncio.sleep(5.0)


async def run_load(base, toks, admin, duration, think, seed):
    import aiohttp

    stats = Stats()
    stop_at = time.monotonic() + duration
    conn = aiohttp.TCPConnector(limit=len(toks) + 8)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        rngs = [random.Random(seed * 1000 + i) for i in range(len(toks))]
        await asyncio.gather(admin_poll(session, stats, base, admin, stop_at),
                             *(operator(session, stats, base, t, stop_at, think, r)
                               for t, r in zip(toks, rngs, strict=True)))
    return stats


def table(stats: Stats, wall: float) -> str:
    lines = [f"{'endpoint':<18}{'requests':>9}{'errors':>8}{'p50 ms':>9}{'p95 ms':>9}"
             f"{'p99 ms':>9}{'max ms':>9}{'req/s':>8}"]
    every = []
    for name in sorted(stats.latency):
        lat = np.array(stats.latency[name])
        every.append(lat)
        p50, p95, p99 = np.percentile(lat, [50, 95, 99])
        lines.append(f"{name:<18}{len(lat):>9}{stats.errors[name]:>8}{p50:>9.1f}{p95:>9.1f}"
                     f"{p99:>9.1f}{lat.max():>9.1f}{len(lat) / wall:>8.1f}")
    lat = np.concatenate(every)
    p50, p95, p99 = np.percentile(lat, [50, 95, 99])
    lines.append(f"{'all':<18}{len(lat):>9}{sum(stats.errors.values()):>8}{p50:>9.1f}"
                 f"{p95:>9.1f}{p99:>9.1f}{lat.max():>9.1f}{len(lat) / wall:>8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = CliParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--operators", type=int, default=50)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of load (300)")
    p.add_argument("--think", type=float, default=1.0, help="mean seconds per label (1.0)")
    p.add_argument("--k", type=int, default=2, help="operators per pair (2)")
    p.add_argument("--gold-rate", type=float, default=0.1)
    p.add_argument("--port", type=int, help="default: a free port in 18180..18189")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", help="keep the database at this path")
    p.add_argument("--sync", choices=("full", "normal"), default="normal",
                   help="the server's --sync (default normal; full: every label synced to "
                        "disk)")
    args = p.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="bench-labelling-")
    path = Path(args.keep or Path(tmp) / "labels.db")
    labels_expected = args.operators * args.duration / args.think
    n_pairs = int(labels_expected / args.k * 1.5) + 200
    t0 = time.perf_counter()
    toks, admin = build_db(path, args.operators, n_pairs, args.k, gold=max(20, n_pairs // 50),
                           seed=args.seed)
    print(f"database: {n_pairs} pairs, {args.operators} operators, built in "
          f"{time.perf_counter() - t0:.1f} s ({path})", flush=True)
    port = args.port or free_port(18180, 18190)
    server = subprocess.Popen(
        [sys.executable, "-m", "cloudrl.labelling", "serve", "--db", str(path), "--port",
         str(port), "--gold-rate", str(args.gold_rate), "--sync", args.sync], cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.2)
        load = os.getloadavg()
        t0 = time.perf_counter()
        stats = asyncio.run(run_load(base, toks, admin, args.duration, args.think, args.seed))
        wall = time.perf_counter() - t0
    finally:
        server.terminate()
        server.wait(10)
    conn = sqlite3.connect(path)
    stored = {r[0] for r in conn.execute("SELECT id FROM labels")}
    missing = len(set(stats.acked) - stored)
    print(f"\n{args.operators} operators, {wall:.0f} s, think {args.think} s, k {args.k}, "
          f"gold rate {args.gold_rate}, sync {args.sync}, {os.cpu_count()} cores, load "
          f"average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print(table(stats, wall))
    print(f"\nlabels acknowledged {len(stats.acked)}, stored {len(stored)}, "
          f"acknowledged but missing {missing}")
    for sample in stats.error_samples:
        print("error:", sample)
    errors = sum(stats.errors.values())
    p99 = max(np.percentile(v, 99) for v in stats.latency.values())
    print(f"verdict: errors {errors} (goal 0), worst endpoint p99 {p99:.1f} ms (goal < 200)")
    return 0 if errors == 0 and missing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
