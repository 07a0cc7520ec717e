"""The library's parallel loops on Ray (:mod:`cloudrl.parallel`): no process pool is left,
results come back in order and equal the serial path's, a killed worker costs its items
(not the run), Ray the library started is shut down, and progress goes to stderr only."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ray import cloudpickle

from cloudrl.algorithms.distill.policy import build_module, save_checkpoint
from cloudrl.parallel import WorkerPool, ordered_map
from envs.scenario.catalog import load_scenario

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("cloudrl", "envs", "experiments", "serve_apps")
# the scaling benchmark keeps a process pool as the reference Ray is measured against
REFERENCE = REPO / "experiments" / "benchmarks" / "bench_parallel.py"


def _pool_uses(path: Path, root: Path = REPO) -> list[str]:
    """``file:line name`` for every import of multiprocessing / a process pool and every
    ``ProcessPoolExecutor`` / ``multiprocessing.Pool`` name or attribute in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "multiprocessing"]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] == "multiprocessing":
                names = [node.module or ""]
            names += [a.name for a in node.names if a.name == "ProcessPoolExecutor"]
        elif isinstance(node, ast.Name) and node.id == "ProcessPoolExecutor":
            names = [node.id]
        elif isinstance(node, ast.Attribute) and node.attr == "ProcessPoolExecutor":
            names = [node.attr]
        found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names]
    return found


def test_no_process_pool_is_left_in_the_sources() -> None:
    files = [p for d in SCANNED for p in (REPO / d).rglob("*.py") if p != REFERENCE]
    assert len(files) > 100
    assert [u for p in files for u in _pool_uses(p)] == []


def test_the_scan_finds_every_way_to_write_a_pool(tmp_path: Path) -> None:
    bad = {"a.py": "import multiprocessing\n",
           "b.py": "from concurrent.futures import ProcessPoolExecutor\n",
           "c.py": "import concurrent.futures as cf\nx = cf.ProcessPoolExecutor(2)\n",
           "d.py": "from multiprocessing.pool import Pool\n",
           "e.py": "import multiprocessing as mp\n"}
    for name, text in bad.items():
        path = tmp_path / name
        path.write_text(text)
        assert _pool_uses(path, tmp_path), f"{name}: {text!r} not found"
    ok = tmp_path / "ok.py"
    ok.write_text("from concurrent.futures import ThreadPoolExecutor\n")
    assert _pool_uses(ok, tmp_path) == []


# --------------------------------------------------------------------- the pool itself
# Ray workers cannot import this test module by its pytest name: its helpers travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _state(offset: int) -> dict[str, int]:
    return {"offset": offset, "pid": os.getpid()}


def _add(state: dict[str, int], x: int) -> int:
    return state["offset"] + x


def _slow_square(state: dict[str, int], x: int) -> tuple[int, int]:
    time.sleep(0.25)
    return x * x + state["offset"], os.getpid()


def _square(x: int) -> int:
    return x * x


@pytest.fixture(scope="class")
def pool(ray_session) -> WorkerPool:
    """Two actors for one class's tests (they hold the 2 CPUs of the test session's Ray,
    so the pool is closed before the next tests ask for workers)."""
    with WorkerPool(2, _state, (1000,)) as p:
        yield p


class TestActorPool:
    @given(st.lists(st.integers(-10**6, 10**6), max_size=30))
    @settings(max_examples=15, deadline=None)
    def test_actor_results_come_back_in_submission_order(self, pool: WorkerPool,
                                                         xs: list[int]) -> None:
        assert pool.map(_add, xs) == [1000 + x for x in xs]

    def test_a_killed_worker_costs_its_items_not_the_run(self, pool: WorkerPool) -> None:
        before = pool.pids()
        victim = before[1]
        threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
        items = list(range(3, 27))
        out = pool.map(_slow_square, items)
        assert [v for v, _ in out] == [x * x + 1000 for x in items]
        assert victim in {pid for _, pid in out}  # it played before it was killed
        after = pool.pids()
        assert after[0] == before[0] and after[1] != victim  # restarted, init ran again
        assert {pid for _, pid in out[-4:]} <= set(after)


def test_tasks_keep_the_order_and_raise_the_callers_error(ray_session) -> None:
    xs = [7, -3, 11, 0, 5, 2, 9]
    assert ordered_map(_square, xs, 2) == [x * x for x in xs]
    with pytest.raises(TypeError):
        ordered_map(_square, [1, "a", 3], 2)


# ------------------------------------------------- library loops: Ray == serial path
def test_scenario_runs_on_ray_equal_the_serial_path(ray_session) -> None:
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers

    scn = load_scenario("tiny")
    specs = [ControllerSpec("run_at_once"), ControllerSpec("signal_aware"),
             ControllerSpec("deadline_aware")]
    seeds = [104, 7, 55]
    serial = run_controllers(scn, specs, seeds, workers=1)
    on_ray = run_controllers(scn, specs, seeds, workers=2)
    timing = {"decide_ms", "solve_s", "solve_p50_ms", "solve_p99_ms", "decide_p50_ms",
              "decide_p99_ms"}
    for a_row, b_row in zip(serial, on_ray, strict=True):
        for a, b in zip(a_row, b_row, strict=True):
            assert {k: v for k, v in a.items() if k not in timing} == \
                   {k: v for k, v in b.items() if k not in timing}
    costs = {round(m["cost_usd"], 9) for row in serial for m in row}
    assert len(costs) > 1  # the seeds and controllers differ: order mistakes would show


def test_es_on_ray_equals_es_in_process(ray_session, tmp_path: Path) -> None:
    from cloudrl.algorithms.es.algorithm import es_finetune
    from cloudrl.algorithms.es.config import ESConfig

    torch.manual_seed(3)
    path = save_checkpoint(build_module((8,)), tmp_path / "start", (8,), {"scenario": "tiny"})
    kw = dict(iterations=2, pairs=2, seeds_per_candidate=2, eval_every=1, n_val_seeds=2,
              sigma=0.4, run_seed=5)
    runs = [es_finetune(load_scenario("tiny"), str(path), ESConfig(**kw, workers=w),
                        log=lambda _: None) for w in (1, 2)]
    vals = [[h.get("val", h.get("population_mean")) for h in r.history] for r in runs]
    assert vals[0] == vals[1]
    assert runs[0].kept_iteration == runs[1].kept_iteration
    assert runs[0].episodes == runs[1].episodes == 3 * 2 + 2 * 8
    a, b = runs[0].module.state_dict(), runs[1].module.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_evaluate_on_ray_equals_the_serial_path(ray_session) -> None:
    from cloudrl.evaluate import EvalConfig, evaluate
    from envs.env_config import EnvConfig

    env = EnvConfig.model_validate({"n_servers": 4, "sim": {"episode_length": 60}})
    cfg = EvalConfig(env=env, policies=["ffd", "power_aware"], n_seeds=5, workers=1)
    serial = evaluate(cfg, progress=False)
    on_ray = evaluate(cfg.model_copy(update={"workers": 2}), progress=False)
    assert [(r.policy, r.seed) for r in serial] == [(r.policy, r.seed) for r in on_ray]
    assert serial == on_ray


# ------------------------------------------------ Ray's lifetime, progress on stderr
LIFETIME = """
import builtins, json, sys
real_print = builtins.print
import ray
from cloudrl.scenarios.runner import ControllerSpec, run_controllers
from envs.scenario.catalog import load_scenario

res = run_controllers(load_scenario("tiny"), [ControllerSpec("run_at_once")], [3, 4], 2,
                      desc="episodes")
after_own = ray.is_initialized()
ray.init(num_cpus=2, include_dashboard=False)
run_controllers(load_scenario("tiny"), [ControllerSpec("run_at_once")], [3, 4], 2)
after_joined = ray.is_initialized()
ray.shutdown()
real_print(json.dumps({"own": after_own, "joined": after_joined,
                       "print": builtins.print is real_print, "n": len(res[0])}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("progress", ["1", "0"])
def test_the_library_shuts_down_only_the_ray_it_started(progress: str) -> None:
    import json

    temp = tempfile.mkdtemp(prefix="crl-rp-")  # private: joins no one else's `ray start`
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(RAY_TMPDIR=temp, CLOUDRL_PROGRESS=progress, RAY_USAGE_STATS_ENABLED="0")
    res = subprocess.run([sys.executable, "-c", LIFETIME], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"own": False, "joined": True, "print": True, "n": 2}
    assert len(res.stdout.strip().splitlines()) == 1  # no worker output, no bar on stdout
    assert ("episodes" in res.stderr) == (progress == "1")


def test_a_ray_the_caller_started_stays_up(ray_session) -> None:
    import ray

    from cloudrl.parallel import ensure_ray

    with ensure_ray(2) as started:
        assert not started
    assert ray.is_initialized()


@pytest.mark.parametrize("setting", ["1", "0"])
def test_progress_goes_to_stderr_and_off_with_the_env_var(setting, monkeypatch, capsys) -> None:
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers

    monkeypatch.setenv("CLOUDRL_PROGRESS", setting)
    run_controllers(load_scenario("tiny"), [ControllerSpec("run_at_once")], [8, 9], 1,
                    desc="tiny episodes")
    out, err = capsys.readouterr()
    assert out == ""
    assert ("tiny episodes" in err and "2/2" in err) == (setting == "1")
    assert err == "" or setting == "1"


def test_supervisor_episodes_on_ray_equal_the_serial_path(ray_session) -> None:
    from cloudrl.scenarios.supervisor import FixedChoice, map_episodes

    scn, seeds = load_scenario("tiny"), [21, 4, 37]
    for what, kw in (("online", {"policy": FixedChoice(1), "seg_hours": 6.0}),
                     ("hindsight", {"seg_hours": 6.0, "lookahead": "rollout"})):
        serial = map_episodes(what, scn, seeds, 1, **kw)
        on_ray = map_episodes(what, scn, seeds, 2, **kw)
        assert [e.seed for e in on_ray] == seeds
        assert [e.metrics for e in serial] == [e.metrics for e in on_ray], what
        assert [e.choices for e in serial] == [e.choices for e in on_ray], what
