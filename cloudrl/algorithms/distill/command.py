"""``cloudrl scenarios distill``: train on a scenario, write the checkpoint and its manifest.

``manifest.json`` records what a rerun needs and what the run cost: the command line, the
git commit (and whether the tree had local changes), the seeds of every phase, the
training config, each round's validation cost, the wall time and the machine.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from cloudrl.algorithms.distill.algorithm import DistillResult, Objective, distill
from cloudrl.algorithms.distill.config import DistillConfig
from cloudrl.algorithms.distill.policy import save_checkpoint
from cloudrl.protocol import train_seeds, validation_seeds
from envs.scenario.config import ScenarioConfig


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def source_state() -> dict[str, object]:
    """The commit the code runs from and whether tracked files differ from it (a
    manifest's ``commit`` and ``dirty``)."""
    return {"commit": _git("rev-parse", "HEAD"),
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}


def machine() -> dict[str, object]:
    return {"platform": platform.platform(), "processor": platform.processor() or None,
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version()}


def train_to_dir(scn: ScenarioConfig, cfg: DistillConfig, out: str | Path,
                 expert_cache: str | Path | None = None, command: str = "",
                 objective: Objective | None = None, log: Callable[[str], None] = print
                 ) -> DistillResult:
    """Distil (``objective`` picks the round kept; default: validation cost) and write the
    checkpoint with its manifest to ``out``."""
    t0 = time.perf_counter()
    res = distill(scn, cfg, expert_cache, log=log, objective=objective)
    out = save_checkpoint(res.module, out, cfg.hiddens,
                          {"scenario": scn.name, "config": cfg.to_dict()}, cfg.levels,
                          cfg.margins)
    manifest = {
        "command": command, **source_state(),
        "scenario": scn.name, "scenario_config": scn.model_dump(mode="json"),
        "run_seed": cfg.run_seed,
        "seeds": {"expert_train": list(train_seeds(cfg.n_expert_seeds)),
                  "dagger_train": [s for r in res.rounds for s in r["dagger_seeds"]],
                  "validation": list(validation_seeds(cfg.n_val_seeds)), "test": []},
        "config": cfg.to_dict(), "best_round": res.best_round, "rounds": res.rounds,
        "rows": res.n_rows, "wall_s": time.perf_counter() - t0, "machine": machine(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - (
            time.perf_counter() - t0)))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    log(f"wrote {out} (round {res.best_round}, {manifest['wall_s']:.0f} s)")
    return res
