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
   With ``teacher="rule"`` the teacher is the site's tuned heuristic (the signal-aware rule
   that the headroom run selected on validation) instead of the MPC: where the MPC is the
   weaker controller (CAISO 2023), its students start behind the rule. ``teacher="both"``
   trains both families and lets the validation episodes choose among all four checkpoints.
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
# ``--teacher rule``: the same pipeline with the site's tuned signal-aware rule as the teacher
RULE_FAMILY = "distill_rule_fine_ready_es"
RULE_BASE = "distill_rule_fine_ready"
TEACHERS = ("mpc", "rule")
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


def _train_from_rule(scn: Any, cfg: Any, rule: dict[str, Any], run_seed: int, out: Path
                     ) -> None:
    """``RULE_FAMILY``'s run into ``out``: the rule at ``rule`` distilled (BC + DAgger, the
    learned policy's fine ready margins) into ``RULE_BASE``'s directory beside it, then the ES
    fine-tune on the true cost; each step reused when trained earlier with the same config."""
    from cloudrl.algorithms.distill.actions import FINE_READY_MARGINS
    from cloudrl.algorithms.distill.command import train_to_dir as distill_to_dir
    from cloudrl.algorithms.distill.config import DistillConfig
    from cloudrl.algorithms.es.command import train_to_dir as es_to_dir
    from cloudrl.algorithms.es.command import weights_digest
    from cloudrl.scenarios.headline import _es_command, _es_config, _trained

    start = out.parent.parent / RULE_BASE / out.name
    dc = DistillConfig(run_seed=run_seed, heuristic_params=dict(rule),
                       n_expert_seeds=cfg.expert_seeds, dagger_rounds=cfg.dagger_rounds,
                       dagger_seeds_per_round=cfg.dagger_seeds,
                       n_val_seeds=min(cfg.distill_val_seeds, cfg.n_val_seeds),
                       ready_margins=FINE_READY_MARGINS)
    if not _trained(start, scn, dc.to_dict()):
        distill_to_dir(scn, dc, start, start.parent / "expert-rule-ready.npz",
                       command=f"cloudrl sites train --teacher rule ({scn.name})")
    ec = _es_config(cfg, run_seed)
    if not _trained(out, scn, ec.to_dict(), init_digest=weights_digest(start)):
        es_to_dir(scn, start, ec, out, command=_es_command(scn, start, out, ec))


def teacher_rule(site: Site, split: str, headroom_raw: dict[str, Any] | None, workers: int,
                 tune_samples: int, tune_seeds: int) -> dict[str, Any]:
    """The tuned signal-aware rule's parameters: the headroom run's selection, or tuned here
    on the train period (:func:`cloudrl.sites.headroom.tune_and_select`)."""
    from cloudrl.sites.headroom import tune_and_select

    sel = headroom_raw["selection"] if headroom_raw else tune_and_select(
        site, split, tune_samples, tune_seeds, workers)
    return dict(sel["tuned"]["signal_aware"]["params"])


def train_site(site: Site, split: str, out_dir: str | Path, size: TrainSize = TrainSize(),
               headroom_raw: dict[str, Any] | None = None, workers: int = 1,
               tune_samples: int = 6, tune_seeds: int = 4, log=print,
               teacher: str = "mpc") -> dict[str, Any]:
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
    if teacher not in (*TEACHERS, "both"):
        raise ValueError(f"teacher: {teacher!r}; valid: {', '.join(TEACHERS)}, both")
    pairs = {"mpc": (FAMILY, BASE), "rule": (RULE_FAMILY, RULE_BASE)}
    rule, cands, family_of = None, {}, {}
    for t in (TEACHERS if teacher == "both" else (teacher,)):
        family, base = pairs[t]
        es_dir = out / family / f"run{size.run_seed}"
        log(f"[{site.name} {split}] training {family} on the train period "
            f"({site.splits[split].train})")
        if t == "mpc":
            available_families()[FAMILY](scns["train"], cfg, {}, size.run_seed, es_dir)
        else:
            rule = teacher_rule(site, split, headroom_raw, workers, tune_samples, tune_seeds)
            _train_from_rule(scns["train"], cfg, rule, size.run_seed, es_dir)
        cands[base] = str((out / base / f"run{size.run_seed}").resolve())
        cands[family] = str(es_dir.resolve())
        family_of[base] = family_of[family] = (family, base)
    t_train = time.perf_counter() - t0
    log(f"[{site.name} {split}] selecting on {size.val_seeds} validation-period episodes "
        f"({site.splits[split].validation})")
    val = _validation_costs(scns["validation"], cands, size.val_seeds)
    val_cost = {k: float(np.mean([m["cost_usd"] for m in v])) for k, v in val.items()}
    # ties: the fine-tune over its start, the MPC's students (the older family) first
    order = list(cands)
    chosen = min(val_cost, key=lambda k: (val_cost[k], k not in (FAMILY, RULE_FAMILY),
                                          order.index(k)))
    family, base = family_of[chosen]
    t_select = time.perf_counter() - t0 - t_train
    log("  validation cost: " + ", ".join(f"{k} {v:.2f}" for k, v in val_cost.items())
        + f"; selected {chosen}")
    reuse = _subset(headroom_raw, size.per_season) if headroom_raw else None
    raw = measure(site, split, size.per_season, tune_samples, tune_seeds, workers,
                  learned=cands[chosen], reuse=reuse)
    t_test = time.perf_counter() - t0 - t_train - t_select
    raw["train"] = {"family": family, "base": base, "teacher": teacher,
                    "teacher_of_selected": "mpc" if family == FAMILY else "rule",
                    "teacher_params": rule, "selected": chosen, "checkpoint": cands[chosen],
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
    if tr["selected"] == tr["family"]:
        start = src.parent.parent / tr.get("base", BASE) / src.name
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
