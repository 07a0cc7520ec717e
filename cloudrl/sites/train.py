"""``cloudrl sites train``: a site's learned policy, by the scenario headline's own pipeline.

The pieces are those of ``cloudrl headline --scenario`` (:mod:`cloudrl.scenarios.headline`),
composed here on the site's split parts instead of seeds of one synthetic scenario:

1. **Train** family ``distill_fine_ready_es`` (the family of the published scenario
   policies): behaviour cloning + DAgger from the forecast MPC (defaults), then an
   evolution-strategies fine-tune on the true cost. Every episode of it, the rounds and
   iterations it keeps included, reads the split's *train* file only (seeds draw start days
   inside it).
2. **Select** on the *validation* file: the distilled start and its ES fine-tune each play
   ``val_seeds`` episodes (seeds draw days inside the validation period); the cheaper is
   the site's learned policy.
3. **Test**: the selected checkpoint plays the split's test windows through
   :func:`cloudrl.sites.headroom.measure`, paired with the heuristic, MPC and oracle rows of
   an earlier headroom run (``headroom_raw``: the same windows, seeds and forecasts).

:func:`phase_scenarios` is the one place the scenarios of the three phases are built, so a
test can check the dates each phase reads.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.sites.registry import Site
from cloudrl.sites.scenario import site_scenario
from cloudrl.sites.splits import check_no_leak

FAMILY = "distill_fine_ready_es"
BASE = "distill_fine_ready"
PUBLISHED_FILES = ("manifest.json", "policy.json", "policy.pt")


@dataclass(frozen=True)
class TrainSize:
    """How much work ``sites train`` does (defaults: about 15 min per site on 2 cores)."""

    expert_seeds: int = 10
    dagger_rounds: int = 2
    dagger_seeds: int = 3
    inner_val_seeds: int = 3  # train-period seeds that pick the DAgger round / ES iteration
    es_iterations: int = 6
    es_pairs: int = 3
    val_seeds: int = 6  # validation-period episodes per candidate in the selection
    per_season: int | None = 25  # test windows per season (None: every window)
    run_seed: int = 0
    tiny: bool = False


TINY = TrainSize(expert_seeds=1, dagger_rounds=0, dagger_seeds=0, inner_val_seeds=1,
                 es_iterations=1, es_pairs=1, val_seeds=1, per_season=1, tiny=True)


def phase_scenarios(site: Site, split: str, carbon_model: str = "gbt") -> dict[str, Any]:
    """The scenario each phase plays: ``train`` (distillation and ES) and ``validation``
    (selection). The test windows are built by :func:`cloudrl.sites.headroom.measure`."""
    return {"train": site_scenario(site, split, "train", carbon_model=carbon_model),
            "validation": site_scenario(site, split, "validation", carbon_model=carbon_model)}


def _headline_config(size: TrainSize, workers: int) -> Any:
    from cloudrl.scenarios.headline import ScenarioHeadlineConfig

    return ScenarioHeadlineConfig(
        families=(FAMILY,), run_seeds=(size.run_seed,), expert_seeds=size.expert_seeds,
        dagger_rounds=size.dagger_rounds, dagger_seeds=size.dagger_seeds,
        distill_val_seeds=size.inner_val_seeds, n_val_seeds=size.inner_val_seeds,
        es_iterations=size.es_iterations, es_pairs=size.es_pairs, es_params="all",
        workers=workers, tiny=size.tiny, log=False)


def _validation_costs(scn: Any, checkpoints: dict[str, str], n: int) -> dict[str, list[dict]]:
    from cloudrl.protocol import validation_seeds
    from cloudrl.scenarios.runner import ControllerSpec
    from cloudrl.sites.headroom import play

    return {name: [{k: float(v) for k, v in play(scn, ControllerSpec(
        "learned", {"checkpoint": path}, name), s).items()} for s in validation_seeds(n)]
            for name, path in checkpoints.items()}


def _subset(raw: dict[str, Any], per_season: int | None) -> dict[str, Any]:
    """``raw`` on :func:`~cloudrl.sites.splits.stratified` ``per_season`` of its windows
    (their rows kept for every controller)."""
    from cloudrl.sites.splits import Window, stratified

    ws = [Window(**w) for w in raw["windows"]]
    keep = {w.index for w in stratified(ws, per_season)}
    pos = [i for i, w in enumerate(ws) if w.index in keep]
    if len(pos) == len(ws):
        return raw
    return dict(raw, windows=[raw["windows"][i] for i in pos],
                per_window={k: [v[i] for i in pos] for k, v in raw["per_window"].items()})


def train_site(site: Site, split: str, out_dir: str | Path, size: TrainSize = TrainSize(),
               headroom_raw: dict[str, Any] | None = None, workers: int = 1,
               tune_samples: int = 6, tune_seeds: int = 4, log=print) -> dict[str, Any]:
    """Train, select and test ``site``'s learned policy; returns the raw result of the test
    (headroom's schema with a ``learned`` row) with a ``train`` entry describing the run."""
    from cloudrl.scenarios.headline import available_families
    from cloudrl.sites.headroom import measure

    t0 = time.perf_counter()
    check_no_leak(site, split)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scns = phase_scenarios(site, split)
    cfg = _headline_config(size, workers)
    es_dir = out / FAMILY / f"run{size.run_seed}"
    log(f"[{site.name} {split}] training {FAMILY} on the train period "
        f"({site.splits[split].train})")
    available_families()[FAMILY](scns["train"], cfg, {}, size.run_seed, es_dir)
    start_dir = out / BASE / f"run{size.run_seed}"
    t_train = time.perf_counter() - t0
    cands = {BASE: str(start_dir.resolve()), FAMILY: str(es_dir.resolve())}
    log(f"[{site.name} {split}] selecting on {size.val_seeds} validation-period episodes "
        f"({site.splits[split].validation})")
    val = _validation_costs(scns["validation"], cands, size.val_seeds)
    val_cost = {k: float(np.mean([m["cost_usd"] for m in v])) for k, v in val.items()}
    chosen = min(val_cost, key=lambda k: (val_cost[k], k != FAMILY))
    t_select = time.perf_counter() - t0 - t_train
    log("  validation cost: " + ", ".join(f"{k} {v:.2f}" for k, v in val_cost.items())
        + f"; selected {chosen}")
    reuse = _subset(headroom_raw, size.per_season) if headroom_raw else None
    raw = measure(site, split, size.per_season, tune_samples, tune_seeds, workers,
                  learned=cands[chosen], reuse=reuse)
    t_test = time.perf_counter() - t0 - t_train - t_select
    raw["train"] = {"family": FAMILY, "selected": chosen, "checkpoint": cands[chosen],
                    "validation_cost": val_cost, "size": asdict(size), "workers": workers,
                    "data": {p: s.signals.csv_path for p, s in scns.items()},
                    "wall_s": {"train": t_train, "select": t_select, "test": t_test,
                               "total": time.perf_counter() - t0}}
    return raw


def publish(raw: dict[str, Any], dest: str | Path, command: str) -> Path:
    """Copy the selected checkpoint (and its distilled start, when the ES run was chosen) to
    ``dest`` with ``site.json``: the site, split, windows and every per-window cost of the
    test, so the checkpoint can be re-measured live against them."""
    tr = raw["train"]
    src = Path(tr["checkpoint"])
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in PUBLISHED_FILES:
        shutil.copy(src / f, dest / f)
    if tr["selected"] == FAMILY:
        start = src.parent.parent / BASE / src.name
        (dest / "start").mkdir()
        for f in PUBLISHED_FILES:
            shutil.copy(start / f, dest / "start" / f)
    sel = raw["selection"]
    (dest / "site.json").write_text(json.dumps({
        "command": command, "site": raw["site"], "split": raw["split"],
        "train": {k: v for k, v in tr.items() if k not in ("checkpoint", "data")},
        "heuristic": {"kind": sel["selected"],
                      "params": sel["tuned"][sel["selected"]]["params"]},
        "windows": raw["windows"],
        "learned_per_window": raw["per_window"]["learned"]}, indent=1) + "\n")
    return dest


def tiny_size(size: TrainSize) -> TrainSize:
    return replace(TINY, run_seed=size.run_seed)
