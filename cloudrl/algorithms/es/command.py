"""``cloudrl scenarios es``: fine-tune a checkpoint on the true cost, write it and its
manifest (the command, commit, seeds of every iteration, validation scores, wall time,
machine). The result is a checkpoint like the start's: ``evaluate`` and ``serve`` play it."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from cloudrl.algorithms.distill.command import machine, source_state
from cloudrl.algorithms.distill.policy import (
    load_checkpoint,
    ready_margins_of,
    release_levels_of,
    save_checkpoint,
)
from cloudrl.algorithms.es.algorithm import ESResult, Objective, es_finetune
from cloudrl.algorithms.es.config import ESConfig
from cloudrl.protocol import validation_seeds
from envs.scenario.config import ScenarioConfig


def weights_digest(checkpoint: str | Path) -> str:
    """The SHA-256 of a checkpoint's weights file: which start a fine-tune began from."""
    return hashlib.sha256((Path(checkpoint) / "policy.pt").read_bytes()).hexdigest()


def es_manifest(scn: ScenarioConfig, init_checkpoint: str | Path, cfg: ESConfig,
                res: ESResult, command: str, t0: float, init_digest: str) -> dict:
    """A fine-tune's ``manifest.json``: the command, commit, the start and its digest, the
    seeds of every iteration, the validation scores, wall time (since ``t0``) and machine."""
    return {
        "command": command, **source_state(),
        "scenario": scn.name, "scenario_config": scn.model_dump(mode="json"),
        "run_seed": cfg.run_seed, "init_checkpoint": str(init_checkpoint),
        "init_digest": init_digest,
        "seeds": {"train": sorted({s for h in res.history for s in h.get("seeds", [])}),
                  "validation": list(validation_seeds(cfg.n_val_seeds)), "test": []},
        "config": cfg.to_dict(), "kept_iteration": res.kept_iteration,
        "history": res.history, "episodes": res.episodes,
        "wall_s": time.perf_counter() - t0, "machine": machine(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - (
            time.perf_counter() - t0)))}


def train_to_dir(scn: ScenarioConfig, init_checkpoint: str | Path, cfg: ESConfig,
                 out: str | Path, command: str = "", objective: Objective | None = None,
                 log: Callable[[str], None] = print) -> ESResult:
    """Fine-tune ``init_checkpoint`` and write the result to ``out``."""
    t0 = time.perf_counter()
    _, spec = load_checkpoint(init_checkpoint)  # a bad start fails before any episode
    if spec.get("scenario") not in (None, scn.name):
        log(f"note: {init_checkpoint} was trained on {spec['scenario']!r}, fine-tuning on "
            f"{scn.name!r}")
    res = es_finetune(scn, str(init_checkpoint), cfg, log=log, objective=objective)
    out = save_checkpoint(res.module, out, tuple(spec["model_config"]["hiddens"]),
                          {"scenario": scn.name, "config": spec.get("config", {}),
                           "es": cfg.to_dict(), "init_checkpoint": str(init_checkpoint)},
                          release_levels_of(spec), ready_margins_of(spec))
    manifest = es_manifest(scn, init_checkpoint, cfg, res, command, t0,
                           weights_digest(init_checkpoint))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    log(f"wrote {out} (iteration {res.kept_iteration}, {manifest['wall_s']:.0f} s, "
        f"{res.episodes} episodes)")
    return res
