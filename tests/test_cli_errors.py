"""The CLI's user experience: every command's bad input is one stderr line naming the
file, field or value, exit code 2, no traceback; help texts; where outputs go; the demo's
budget and Ray's exit noise. No training runs."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cloudrl import cli
from cloudrl.cli import ALGOS, build_parser, main
from envs.workloads.google_trace import parse_task_events, save_trace

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CLOUDRL__ overrides from the caller's shell; outputs land in a temp dir."""
    for key in list(os.environ):
        if key.startswith("CLOUDRL__"):
            monkeypatch.delenv(key)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)


def run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


# --------------------------------------------------------------------------- inputs


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    notes = tmp_path / "notes.npz"
    notes.write_text("not an archive")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("env:\n  sim: [1, 2\n")
    typo = tmp_path / "typo.yaml"
    typo.write_text("env:\n  sim:\n    alpah: 3\n")
    pending = tmp_path / "pending.csv"  # a task that never ran: an import keeps nothing
    pending.write_text("5000000,,1,0,,0,u,0,0,0.1,0.1,0,0\n")
    jobs, report = parse_task_events([pending])
    empty = save_trace(tmp_path / "empty.npz", jobs, report)
    huge = tmp_path / "huge.csv"
    huge.write_text("99999999999999999999,,1,0,,0,u,0,0,0.1,0.1,0,0\n")
    return {"notes": notes, "bad_yaml": bad_yaml, "typo": typo, "empty": empty, "huge": huge,
            "missing": tmp_path / "missing.npz"}


CASES = [
    # (argv with {file} placeholders, env vars, needles in the one stderr line)
    (["evaluate", "--workload", "trace", "--trace", "{missing}"], {},
     ["--trace", "trace file not found", "missing.npz"]),
    (["evaluate", "--workload", "trace", "--trace", "{notes}"], {},
     ["notes.npz", "not a cloudrl trace file"]),
    (["evaluate", "--workload", "trace", "--trace", "{empty}"], {},
     ["empty.npz", "no finished jobs"]),
    (["evaluate", "--workload", "trace"], {}, ["--trace FILE"]),
    (["evaluate", "--config", "{missing}"], {}, ["config file not found", "missing.npz"]),
    (["evaluate", "--config", "{bad_yaml}"], {}, ["bad.yaml", "invalid YAML at line 3"]),
    (["evaluate", "--config", "{typo}"], {}, ["typo.yaml", "env.sim.alpah"]),
    (["evaluate", "--n-servers", "0"], {}, ["env.sim.fleet.n_servers", "(got 0)"]),
    (["evaluate", "--n-servers", "many"], {}, ["--n-servers", "'many'"]),
    (["evaluate", "--checkpoint", "{missing}"], {}, ["--checkpoint", "not a cloudrl checkpoint"]),
    (["evaluate", "--policy", "best"], {}, ["policies", "'best'"]),
    (["evaluate", "--policy", "."], {}, ["policies", "is not a cloudrl checkpoint"]),
    (["evaluate"], {"CLOUDRL__ENV__SIM__ALPHA": ".inf"},
     ["invalid config (env CLOUDRL__ENV__SIM__ALPHA): env.sim.alpha", "finite", "inf"]),
    (["evaluate"], {"CLOUDRL__ENV__SIM__BETA": "[1"}, ["CLOUDRL__ENV__SIM__BETA", "YAML"]),
    (["train", "--config", "{typo}"], {}, ["typo.yaml", "env.sim.alpah"]),
    (["train", "--hparams", "{{lr"], {}, ["--hparams is not valid JSON"]),
    (["train", "--hparams", '{{"lr": Infinity}}'], {}, ["hparams.lr", "finite"]),
    (["train"], {"CLOUDRL__ENV_STEPS": "0"}, ["env CLOUDRL__ENV_STEPS", "env_steps"]),
    (["sweep", "--config", "{missing}"], {}, ["config file not found"]),
    (["sweep", "--env-steps", "0"], {}, ["env_steps", "(got 0)"]),
    (["sweep", "--resume", "nope"], {}, ["--resume nope", "not a cloudrl sweep directory"]),
    (["sweep"], {"CLOUDRL__CPUS_PER_TRIAL": "nan"}, ["CLOUDRL__CPUS_PER_TRIAL", "finite"]),
    (["compare", "--tracking-uri", "{missing}.db"], {}, ["no MLflow database", "missing.npz.db"]),
    (["trace", "import", "{missing}", "--out", "x.npz"], {}, ["missing.npz"]),
    (["trace", "import", "{huge}", "--out", "x.npz"], {},
     ["huge.csv", "line 1", "above 2**63-1"]),
    (["serve", "--canary-weight", "2"], {}, ["canary_weight", "(got 2.0)"]),
    (["serve", "--checkpoint", "/nonexistent/ck"], {}, ["policy", "/nonexistent/ck"]),
    (["serve", "--policy", "heuristic:nosuch"], {}, ["policy", "nosuch"]),
    (["serve", "--canary", "python:os:getcwd"], {}, ["canary", "python:os:getcwd"]),
    (["demo", "--n-seeds", "0"], {}, ["--n-seeds", "0 is not in [1, 50]"]),
    (["demo"], {"CLOUDRL__MAX_FAILURES": "often"}, ["env CLOUDRL__MAX_FAILURES", "max_failures"]),
    (["feedback", "export", "--db", "{missing}"], {}, ["missing.npz"]),
]


@pytest.mark.parametrize(("argv", "environ", "needles"), CASES,
                         ids=[" ".join(c[0][:2]) + (f" {next(iter(c[1]))}" if c[1] else "")
                              for c in CASES])
def test_bad_input_is_one_line_exit_2(argv: list[str], environ: dict[str, str],
                                      needles: list[str], files: dict[str, Path],
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    code, _, err = run([a.format(**files) for a in argv], capsys)
    assert_one_line(code, err, *needles)


def test_checkpoint_that_does_not_fit_the_env_is_one_line(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    import json

    from cloudrl.checkpoint_policy import META_FILE, MODULE_SUBDIR

    ck = tmp_path / "ppo_poisson_n15_s0"
    (ck / MODULE_SUBDIR).mkdir(parents=True)
    (ck / META_FILE).write_text(json.dumps({"algo": "ppo", "interface": "flat",
                                            "env": {"n_servers": 15}}))
    code, _, err = run(["evaluate", "--checkpoint", str(ck), "--n-servers", "50"], capsys)
    assert_one_line(code, err, "--checkpoint", "ppo_poisson_n15_s0", "n_servers=15",
                    "env has 50")
    code, _, err = run(["evaluate", "--checkpoint", str(ck), "--interface", "branching"], capsys)
    assert_one_line(code, err, "--checkpoint", "flat interface", "on branching")


def test_every_subcommand_is_covered() -> None:
    tested = {argv[0] for argv, _, _ in CASES}
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001
    required = {"evaluate", "train", "sweep", "compare", "trace", "serve", "demo", "feedback"}
    assert required <= commands and required <= tested


def test_subprocess_python_m_cloudrl(files: dict[str, Path], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDRL__")}
    env["CLOUDRL__ENV__WORKLOAD__RATE"] = "inf"
    for argv, needles in [
        (["evaluate", "--workload", "trace", "--trace", str(files["missing"])], ["missing.npz"]),
        (["evaluate", "--n-seeds", "1"], ["CLOUDRL__ENV__WORKLOAD__RATE",
                                          "env.workload.poisson.rate"]),
    ]:
        proc = subprocess.run([sys.executable, "-m", "cloudrl", *argv], capture_output=True,
                              text=True, cwd=tmp_path, env=env, timeout=120)
        assert_one_line(proc.returncode, proc.stderr, *needles)
        assert proc.stdout == ""


def test_compare_lists_the_experiments_there(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    from cloudrl import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.make_client(uri)
    for name in ("cloudrl-demo", "cloudrl-sweep-small"):
        tracking.get_or_create_experiment(client, name)
    capsys.readouterr()  # MLflow's own log lines while it created the database
    code, _, err = run(["compare", "--tracking-uri", uri], capsys)
    assert_one_line(code, err, "no MLflow experiment 'cloudrl-sweep'",
                    "experiments there: cloudrl-demo, cloudrl-sweep-small")


# ----------------------------------------------------------------------------- help


def _subparser(name: str) -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices[name]  # noqa: SLF001


def _help(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_help().split())


def test_help_lists_algorithms_and_every_demo_option_is_described() -> None:
    top = build_parser().format_help()
    assert all(algo in top for algo in ALGOS) and "apex_bdq" in top
    demo = _subparser("demo")
    options = [a for a in demo._actions if a.option_strings and a.dest != "help"]  # noqa: SLF001
    assert len(options) >= 6 and all(a.help for a in options)
    assert {"--report-md", "--report-img"} <= {o for a in options for o in a.option_strings}
    text = _help(demo)
    assert "(default: 9600)" in text and "(default: cloudrl-demo)" in text


def test_out_defaults_are_shown() -> None:
    assert "(default: results/compare/<experiment>)" in _help(_subparser("compare"))
    assert ("(default: results/eval_<checkpoint names or heuristics>_<workload>_n<N>_"
            "<interface>_<split><n seeds>)") in _help(_subparser("evaluate"))
    export = _subparser("feedback")._subparsers._group_actions[0].choices["export"]  # noqa: SLF001
    assert "(default: results/feedback.jsonl)" in _help(export)
    assert "(default: results/checkpoints/<algo>_" in _help(_subparser("train"))


def _all_parsers(parser: argparse.ArgumentParser, path: str = "cloudrl"
                 ) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                out += _all_parsers(sub, f"{path} {name}")
    return out


def test_every_out_option_says_its_default_or_is_required() -> None:
    from cloudrl.cli import build_parser

    missing = [f"{path} --out" for path, parser in _all_parsers(build_parser())
               for action in parser._actions  # noqa: SLF001
               if "--out" in action.option_strings and not action.required
               and "default" not in (action.help or "")]
    assert not missing, f"--out without its default in the help: {missing}"


# -------------------------------------------------------------------------- outputs


def test_evaluate_names_its_output_by_run(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(["evaluate", "--policy", "ffd", "--n-seeds", "1", "--workers", "1",
                        "--episode-length", "20", "--quiet"], capsys)
    assert code == 0
    assert "wrote results/eval_ffd_poisson_n15_flat_test1.csv" in out
    assert Path("results/eval_ffd_poisson_n15_flat_test1.json").is_file()


def test_checkpoint_evaluations_are_named_by_checkpoint() -> None:
    from cloudrl.evaluate import EvalConfig

    cfg = EvalConfig(n_seeds=10, env={"n_servers": 50, "workload": "google_v2_like"})
    ck = "results/checkpoints/ppo_poisson_n15_s0"
    assert cli._eval_out(cfg, [ck], None) == Path(  # noqa: SLF001
        "results/eval_ppo_poisson_n15_s0_google_v2_like_n50_flat_test10")
    assert cli._eval_out(cfg, [ck], ["sjf"]).name.startswith(  # noqa: SLF001
        "eval_ppo_poisson_n15_s0+sjf_")
    assert cli._eval_out(cfg, [], None).name.startswith("eval_heuristics_")  # noqa: SLF001


def test_compare_and_demo_write_to_their_experiment_dir(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    import cloudrl.compare

    calls: list[tuple] = []

    def fake_compare(experiment, uri, out, sweep_id, log_to_mlflow=True):
        calls.append((experiment, out))
        return {"text": {}, "titles": {}, "paths": [Path(out) / "pareto.png"], "run_id": None,
                "sweeps": []}

    sweeps: list[dict] = []
    monkeypatch.setattr(cloudrl.compare, "run_compare", fake_compare)
    monkeypatch.setattr(cli, "_cmd_sweep", lambda ns: sweeps.append(ns._overrides) or 0)
    assert run(["compare", "--experiment", "mine"], capsys)[0] == 0
    code, out, _ = run(["demo", "--env-steps", "30000", "--n-seeds", "2", "--skip-scenario"],
                       capsys)
    assert code == 0
    assert calls == [("mine", str(Path("results/compare/mine"))),
                     ("cloudrl-demo", str(Path("results/compare/cloudrl-demo")))]
    assert f"wrote {Path('results/compare/cloudrl-demo/pareto.png')}" in out
    # the budget is whole episodes: 30k -> 30.4k = 19 x 200 decisions (of 5 ticks) on each
    # of the 8 envs
    assert sweeps[0]["env_steps"] == 30_400
    assert "--env-steps 30000 rounded up to 30400" in out
    assert run(["demo", "--env-steps", "16000", "--skip-scenario"], capsys)[0] == 0
    assert sweeps[1]["env_steps"] == 16_000


@pytest.mark.parametrize(("steps", "length", "envs", "expected"), [
    (30_000, 1000, 8, 32_000), (32_000, 1000, 8, 32_000), (1, 1000, 8, 8000),
    (2000, 1000, 1, 2000), (2001, 100, 3, 2100),
])
def test_whole_episodes(steps: int, length: int, envs: int, expected: int) -> None:
    assert cli.whole_episodes(steps, length, envs) == expected


# ---------------------------------------------------------------------- Ray at exit


_UNRAISABLE = textwrap.dedent("""
    import atexit, sys
    {setup}
    def late_exit():  # what Ray's SIGTERM handler does in a worker that is exiting already
        raise SystemExit(1)
    def other():
        raise ValueError("still reported")
    atexit.register(other)
    atexit.register(late_exit)
""")


@pytest.mark.parametrize("quiet", [False, True])
def test_quiet_worker_exit_drops_only_unraisable_system_exit(quiet: bool) -> None:
    setup = "from cloudrl.ray_utils import quiet_worker_exit; quiet_worker_exit()" if quiet \
        else ""
    proc = subprocess.run([sys.executable, "-c", _UNRAISABLE.format(setup=setup)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0
    assert ("SystemExit: 1" in proc.stderr) is not quiet
    assert "ValueError: still reported" in proc.stderr


def test_init_ray_installs_the_hook_and_mentions_a_new_token(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import ray

    from cloudrl import ray_utils

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    calls: list[dict] = []

    def fake_init(**kwargs):
        calls.append(kwargs)
        token = tmp_path / ".ray" / "auth_token"
        token.parent.mkdir(exist_ok=True)
        token.write_text("x")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    ray_utils.init_ray(num_cpus=1)
    assert calls[0]["runtime_env"] == {"worker_process_setup_hook": ray_utils.SETUP_HOOK}
    module, _, name = ray_utils.SETUP_HOOK.rpartition(".")
    assert callable(getattr(importlib.import_module(module), name))  # the hook resolves
    assert f"Ray wrote an auth token to {tmp_path / '.ray' / 'auth_token'}" in \
        capsys.readouterr().out
    ray_utils.init_ray(num_cpus=1)  # the token exists now: nothing to say
    assert capsys.readouterr().out == ""
    assert getattr(sys.unraisablehook, "_cloudrl_quiet", False)


@pytest.mark.slow
def test_ray_workers_exit_quietly(tmp_path: Path) -> None:
    """A worker that gets SIGTERM while running its exit handlers (as when Tune stops a
    trial or ``ray.shutdown()`` runs) prints nothing; without the hook it printed
    ``Exception ignored ... SystemExit: 1`` with a traceback (~45 s: one Ray start)."""
    script = textwrap.dedent("""
        import os, signal, time
        import ray
        from cloudrl.ray_utils import init_ray
        init_ray(num_cpus=1)

        @ray.remote
        class Trial:
            def arm(self):
                import atexit
                def sigterm_while_exiting():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(1)
                atexit.register(sigterm_while_exiting)
                return os.getpid()

        trial = Trial.remote()
        print("worker", ray.get(trial.arm.remote()), flush=True)
        trial.__ray_terminate__.remote()
        time.sleep(5)
    """)
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "worker" in proc.stdout
    assert "Exception ignored" not in proc.stderr and "SystemExit" not in proc.stderr
    assert "Ray wrote an auth token to" in proc.stdout
