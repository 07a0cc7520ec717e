"""Decision-service latency and throughput against a trivial echo deployment, in one run.

What it does: starts Ray Serve on localhost with two applications side by side: an echo
deployment (returns the request's JSON; the HTTP floor) and the cloudrl decision service
(``serve_apps.app``), one replica each. The same cluster state (N servers after 100
ticks of power-aware scheduling) is posted to both at concurrency 1, 8 and 32 from
keep-alive client threads, then ``/v1/decide/batch`` with 32 states per request. The
in-process rows time the service's own path without HTTP: observation from the request
state plus the model forward, one state at a time and 32 at once.

How to run:
    python experiments/benchmarks/bench_serve.py                  # power_aware, N=50
    python experiments/benchmarks/bench_serve.py \
        --checkpoint results/checkpoints/bdq_google_v2_like_n50_s0

Results to expect (BDQ at N=50, 2-core machine, no GPU, client threads on the same
cores; full table in the README's "Decision service" section):
    /v1/decide conc 1:  p50 27.4 ms vs echo 22.6 ms (1.21x; 1.21-1.70x across runs),
                        server-side p50 6.4 ms
    /v1/decide conc 32: p50 390 ms, 83 decisions/s (echo 102 req/s)
    /v1/decide/batch, 32 states/request, conc 8: 454 decisions/s
    in process: 3.0 ms per decision alone, 0.47 ms per decision in batches of 32
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np

from cloudrl.argparsing import CliParser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load(port: int, path: str, body: bytes, concurrency: int, seconds: float,
          server_side: list[float] | None = None) -> tuple[list[float], int]:
    """Latencies (s) of every request answered within ``seconds``; count of non-200s.

    ``server_side`` collects the service's own ``latency_ms`` (seconds) of /v1/decide."""
    server_side = [] if server_side is None else server_side
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine, server = [], []
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            conn.request("POST", path, body, {"content-type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            mine.append(time.perf_counter() - t0)
            if resp.status != 200:
                errors[0] += 1
            elif path == "/v1/decide":
                server.append(json.loads(data)["latency_ms"] / 1e3)
        with lock:
            latencies.extend(mine)
            server_side.extend(server)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors[0]


def _state_body(policy_spec: str, n_servers: int) -> tuple[dict, object]:
    from envs.env_config import EnvConfig
    from serve_apps.runtime import ServedPolicy
    from serve_apps.state import state_of

    served = ServedPolicy(policy_spec, "bench", EnvConfig.model_validate(
        {"n_servers": n_servers, "workload": "google_v2_like"}), "branching")
    env = served.env
    obs, _ = env.reset(seed=1_000_000)
    for _ in range(100):
        obs, *_ = env.step(served.fallback.act_batch([obs])[0])
    return state_of(env.sim), served


def _in_process(served, body: dict, batch: int, repeats: int) -> float:
    """Seconds per decision of observe + model forward, ``batch`` states at once."""
    from serve_apps.schemas import DecideRequest

    state = DecideRequest.model_validate(body)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        observations = [served.observe(state) for _ in range(batch)]
        served.model.act_batch(observations)
        times.append((time.perf_counter() - t0) / batch)
    return float(np.median(times))


def main() -> None:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="policy checkpoint (default heuristic:power_aware)")
    parser.add_argument("--n-servers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--out", default="results/bench_serve.json")
    args = parser.parse_args()

    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from serve_apps.app import build_app

    spec = args.checkpoint or "heuristic:power_aware"
    body, served = _state_body(spec, args.n_servers)
    payload = json.dumps(body).encode()
    batch_payload = json.dumps({"states": [body] * 32}).encode()

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
    class Echo:
        async def __call__(self, request: Request) -> JSONResponse:
            return JSONResponse(await request.json())

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    db = Path("results/bench_serve_state.db").resolve()
    serve.run(build_app({"policy": spec, "interface": "branching", "num_cpus": 0,
                         "env": {"n_servers": args.n_servers, "workload": "google_v2_like"},
                         "state_db": str(db)}), name="cloudrl", route_prefix="/")
    for path, data in (("/echo", payload), ("/v1/decide", payload)):
        _load(port, path, data, 4, 2.0)  # warm up

    rows = []
    for concurrency in (1, 8, 32):
        echo, _ = _load(port, "/echo", payload, concurrency, args.seconds)
        server: list[float] = []
        decide, errors = _load(port, "/v1/decide", payload, concurrency, args.seconds, server)
        rows.append({"target": "/v1/decide", "concurrency": concurrency,
                     "server_p50_ms": 1e3 * np.percentile(server, 50),
                     "p50_ms": 1e3 * np.percentile(decide, 50),
                     "p99_ms": 1e3 * np.percentile(decide, 99),
                     "decisions_per_s": len(decide) / args.seconds,
                     "echo_p50_ms": 1e3 * np.percentile(echo, 50),
                     "echo_p99_ms": 1e3 * np.percentile(echo, 99),
                     "echo_req_per_s": len(echo) / args.seconds, "errors": errors})
    batched, errors = _load(port, "/v1/decide/batch", batch_payload, 8, args.seconds)
    rows.append({"target": "/v1/decide/batch (32 states)", "concurrency": 8,
                 "p50_ms": 1e3 * np.percentile(batched, 50),
                 "p99_ms": 1e3 * np.percentile(batched, 99),
                 "decisions_per_s": 32 * len(batched) / args.seconds, "errors": errors})
    serve.shutdown()
    ray.shutdown()
    in_process = {b: 1e3 * _in_process(served, body, b, 30) for b in (1, 32)}

    print(f"\npolicy {served.name} ({spec}), N={args.n_servers}, {args.seconds:.0f} s per row")
    print(f"{'target':30s} {'conc':>4s} {'p50 ms':>8s} {'p99 ms':>8s} {'dec/s':>8s} "
          f"{'echo p50':>9s} {'echo p99':>9s} {'echo r/s':>9s} {'p50/echo':>9s}")
    for r in rows:
        echo_cols = (f"{r['echo_p50_ms']:9.2f} {r['echo_p99_ms']:9.2f} "
                     f"{r['echo_req_per_s']:9.0f} {r['p50_ms'] / r['echo_p50_ms']:8.2f}x"
                     if "echo_p50_ms" in r else f"{'':9s} {'':9s} {'':9s} {'':9s}")
        print(f"{r['target']:30s} {r['concurrency']:4d} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
              f"{r['decisions_per_s']:8.0f} {echo_cols}  errors {r['errors']}"
              + (f"  server-side p50 {r['server_p50_ms']:.2f} ms" if "server_p50_ms" in r
                 else ""))
    print(f"in-process observe + forward: {in_process[1]:.2f} ms per decision one at a time, "
          f"{in_process[32]:.2f} ms per decision in batches of 32")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"policy": spec, "rows": rows,
                                          "in_process_ms": in_process}, indent=1))


if __name__ == "__main__":
    main()
