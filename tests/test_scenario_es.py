"""Evolution strategies on the true cost, from a distilled checkpoint, on the ``tiny``
scenario: fitness shaping, what the search moves and keeps, the CLI, the headline family."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.algorithms.distill.policy import build_module, load_checkpoint, save_checkpoint
from cloudrl.algorithms.es.algorithm import centred_ranks, es_finetune
from cloudrl.algorithms.es.config import ESConfig
from cloudrl.cli import main
from envs.scenario.catalog import load_scenario

TINY = dict(iterations=2, pairs=2, seeds_per_candidate=1, eval_every=1, n_val_seeds=1,
            workers=1, sigma=0.5)


def _start(tmp_path):
    torch.manual_seed(0)
    module = build_module((16,))
    return module, save_checkpoint(module, tmp_path / "start", (16,), {"scenario": "tiny"})


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=40))
@settings(max_examples=60, deadline=None)
def test_centred_ranks_are_an_even_grid_ordered_like_the_costs(xs):
    r = centred_ranks(np.array(xs))
    assert np.allclose(np.sort(r), np.linspace(-0.5, 0.5, len(xs)))
    order = np.argsort(xs, kind="stable")
    assert np.all(np.diff(r[order]) > 0)  # lower cost, lower rank


def test_under_a_constant_objective_the_start_is_kept_unchanged(tmp_path):
    start, path = _start(tmp_path)
    seen = []

    def objective(m):
        seen.append(m)
        return 1.0

    res = es_finetune(load_scenario("tiny"), str(path), ESConfig(**TINY), log=lambda _: None,
                      objective=objective)
    assert res.kept_iteration == 0
    # 3 validation scores (start + 2 iterations) and 2 x 2 x 1 episodes per iteration
    assert len(seen) == res.episodes == 3 * 1 + 2 * 4
    for k, v in start.state_dict().items():
        assert torch.equal(res.module.state_dict()[k], v)


@pytest.mark.parametrize("which", ["head", "all"])
def test_the_cost_keeps_its_lowest_validation_score_and_moves_only_what_it_tunes(tmp_path,
                                                                                 which):
    start, path = _start(tmp_path)
    res = es_finetune(load_scenario("tiny"), str(path), ESConfig(**TINY, params=which),
                      log=lambda _: None)
    vals = [(h["val"], h["iteration"]) for h in res.history if "val" in h]
    assert [i for _, i in vals] == [0, 1, 2]
    assert res.kept_iteration == min(vals)[1]
    after, before = res.module.state_dict(), start.state_dict()
    trunk_same = all(torch.equal(after[k], before[k]) for k in before if k.startswith("trunk"))
    assert trunk_same if which == "head" else True
    if res.kept_iteration > 0:  # a kept iterate differs from the start where it searched
        assert not torch.equal(after["logits.weight"], before["logits.weight"])
        if which == "all":
            assert not trunk_same


def test_es_cli_writes_a_checkpoint_that_evaluate_plays(tmp_path, capsys):
    _, path = _start(tmp_path)
    out = tmp_path / "es"
    assert main(["scenarios", "es", "--scenario", "tiny", "--init-checkpoint", str(path),
                 "--out", str(out), "--iterations", "2", "--pairs", "2",
                 "--seeds-per-candidate", "2", "--eval-every", "2", "--n-val-seeds", "1",
                 "--workers", "1", "--run-seed", "3"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["kept_iteration"] in (0, 2) and m["init_checkpoint"] == str(path)
    assert len(m["seeds"]["train"]) <= 4 and all(1 <= s < 50 for s in m["seeds"]["train"])
    assert m["seeds"]["validation"] == [500_000] and m["seeds"]["test"] == []
    assert m["episodes"] == 2 + 2 * 2 * 2 * 2 and m["config"]["run_seed"] == 3
    module, spec = load_checkpoint(out)
    assert spec["es"]["iterations"] == 2 and module.branch_sizes == [6, 4]
    capsys.readouterr()
    assert main(["scenarios", "evaluate", "--scenario", "tiny", "--policy", "signal_aware",
                 "--checkpoint", str(out), "--split", "validation", "--n-seeds", "1",
                 "--workers", "1"]) == 0
    assert "learned - signal_aware" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["--init-checkpoint", "{tmp}/nostart"], "nostart"),
    (["--init-checkpoint", "{start}", "--iterations", "0"], "iterations"),
    (["--init-checkpoint", "{start}", "--params", "trunk"], "trunk"),
    (["--init-checkpoint", "{start}", "--sigma", "0"], "sigma"),
    (["--init-checkpoint", "{start}", "--n-val-seeds", "51"], "n_val_seeds"),
])
def test_es_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    _, path = _start(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)).replace("{start}", str(path)) for a in argv]
    rc = main(["scenarios", "es", "--scenario", "tiny", "--out", str(tmp_path / "x"), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_a_headline_es_family_fine_tunes_its_base_runs_and_reuses_them(tmp_path, capsys):
    argv = ["headline", "--scenario", "tiny", "--tiny", "--out-dir", str(tmp_path), "--no-log",
            "--workers", "1", "--families", "distill", "distill_es"]
    assert main(argv) == 0
    res = json.loads((tmp_path / "tiny" / "result.json").read_text())
    assert set(res["validation"]["family_median_cost"]) == {"distill", "distill_es"}
    for run in (0, 1):
        es = json.loads((tmp_path / "tiny" / "distill_es" / f"run{run}" /
                         "manifest.json").read_text())
        assert es["init_checkpoint"] == str(tmp_path / "tiny" / "distill" / f"run{run}")
    capsys.readouterr()
    assert main(argv) == 0  # the same command again resumes: nothing is retrained
    out = capsys.readouterr().out
    assert out.count("reusing") == 6  # distill x 2, and each _es run's start and itself


def test_a_run_is_reused_only_with_the_same_scenario_and_config(tmp_path):
    from cloudrl.scenarios.headline import _trained

    scn = load_scenario("tiny")
    config = ESConfig().to_dict()
    out = tmp_path / "run"
    assert not _trained(out, scn, config)  # nothing there
    _, path = _start(tmp_path)
    out = path
    manifest = {"config": config, "scenario_config": scn.model_dump(mode="json")}
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert _trained(out, scn, config)
    assert not _trained(out, scn, {**config, "iterations": 21})
    assert not _trained(out, load_scenario("scarcity_spikes"), config)
    # a field the manifest lacks was added later with the default None
    (out / "manifest.json").write_text(json.dumps({**manifest, "config": config}))
    assert _trained(out, scn, {**config, "added_later": None})
    assert not _trained(out, scn, {**config, "added_later": 1})
    (out / "manifest.json").write_text(json.dumps({**manifest, "config": {**config, "x": 1}}))
    assert not _trained(out, scn, config)  # the manifest has a field the config lacks
    (out / "policy.pt").unlink()
    (out / "policy.json").unlink()
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert not _trained(out, scn, config)  # no checkpoint beside the manifest


def test_the_same_run_seed_gives_the_same_policy_and_another_seed_another_search(tmp_path):
    _, path = _start(tmp_path)
    cfg = ESConfig(**{**TINY, "iterations": 1})

    def run(seed):
        return es_finetune(load_scenario("tiny"), str(path), replace(cfg, run_seed=seed),
                           log=lambda _: None)

    a, b, c = run(0), run(0), run(1)
    assert [h.get("seeds") for h in a.history] == [h.get("seeds") for h in b.history]
    assert [h.get("population_mean") for h in a.history] == \
        [h.get("population_mean") for h in b.history]
    for k, v in a.module.state_dict().items():
        assert torch.equal(b.module.state_dict()[k], v)
    assert [h.get("seeds") for h in a.history] != [h.get("seeds") for h in c.history] or \
        [h.get("population_mean") for h in a.history] != \
        [h.get("population_mean") for h in c.history]


def test_a_fine_tune_is_reused_only_from_the_same_start(tmp_path):
    """A base run retrained with another config makes its fine-tune stale."""
    from cloudrl.algorithms.es.command import train_to_dir, weights_digest
    from cloudrl.scenarios.headline import _trained

    scn = load_scenario("tiny")
    _, path = _start(tmp_path)
    cfg = ESConfig(**{**TINY, "iterations": 1})
    train_to_dir(scn, path, cfg, tmp_path / "es", log=lambda _: None)
    assert _trained(tmp_path / "es", scn, cfg.to_dict(), init_digest=weights_digest(path))
    torch.manual_seed(1)
    save_checkpoint(build_module((16,)), path, (16,), {"scenario": "tiny"})  # retrained
    assert not _trained(tmp_path / "es", scn, cfg.to_dict(),
                        init_digest=weights_digest(path))


def test_workers_exit_when_their_parent_is_killed(tmp_path):
    """A parent killed by a signal must not leave its Ray workers playing."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    torch.manual_seed(0)
    save_checkpoint(build_module((8,)), tmp_path / "start", (8,), {"scenario": "tiny"})
    script = (
        "import os, sys, time\n"
        "from cloudrl.algorithms.es.algorithm import _Players\n"
        "from envs.scenario.catalog import load_scenario\n"
        f"p = _Players(load_scenario('tiny'), {str(tmp_path / 'start')!r}, 'head', 2)\n"
        "print(' '.join(str(q) for q in p.pool.pids()), flush=True)\n"
        "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            text=True)
    pids: list[int] = []

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # a zombie still answers signal 0 until someone reaps it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"

    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2
        assert all(alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        for _ in range(60):  # the watcher polls once a second
            if not any(alive(p) for p in pids):
                break
            time.sleep(0.5)
        assert not any(alive(p) for p in pids)
    finally:  # leave nothing behind, whatever failed
        proc.kill()
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_the_headline_es_step_moves_what_es_params_names():
    from pathlib import Path

    from cloudrl.scenarios.headline import (
        ScenarioHeadlineConfig,
        _es_command,
        _es_config,
    )

    scn = load_scenario("tiny")
    for params in ("head", "all"):
        cfg = ScenarioHeadlineConfig(scenario="tiny", es_params=params, tiny=True)
        ec = _es_config(cfg, 1)
        assert ec.params == params and ec.run_seed == 1
        cmd = _es_command(scn, Path("a"), Path("b"), ec)
        assert ("--params all" in cmd) == (params == "all")
    with pytest.raises(ValueError, match="es-params"):
        ScenarioHeadlineConfig(scenario="tiny", es_params="trunk", tiny=True)
