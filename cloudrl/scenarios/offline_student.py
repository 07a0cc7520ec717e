"""The offline agent's second learner: budget-filtered behaviour cloning into the scenario
policy (``cloudrl scenarios offline --learner student``).

CQL-Lag on the flat 24-action interface learns a Q function from 40 logged episodes and
lands above both behaviour policies in cost (measured: the offline results). This learner
trusts the data's best episodes instead (BC-Safe / %BC, Chen et al. 2021; Liu et al. 2023):

1. Read the logged episodes through RLlib's offline path (``cloudrl.data.offline``,
   ``SingleAgentEpisode`` rows in RLlib's episode format) -- nothing else is seen.
2. Every behaviour played the same train seeds, so the data compares them seed by seed:
   per seed, keep the cheapest episode of those within every class budget; on a seed
   where none is, the one closest to the budgets (``unsafe="closest"``) or none
   (``"drop"``). Ranking within a seed, not across seeds, keeps a cheap workload from
   passing for a good behaviour. ``select="behaviour"`` keeps instead every episode of
   the behaviour that is cheapest on average within the budgets (one behaviour's actions,
   not a mix of two).
3. Clone their decisions into :class:`models.scenario_policy.ScenarioPolicyModule` (the
   headline's student network, on the env's actions: the logged action ``a`` is release
   level ``a // len(READY_MARGINS)`` and ready margin ``a % len(READY_MARGINS)``), a fixed
   number of epochs: no online episode picks anything. Where the log holds the behaviour's
   runs with injected random actions (``offline --noise``), those runs on the kept seeds
   join, labelled with the behaviour's own action at every state they reached (DART,
   Laskey et al. 2017): the states a clone drifts into are in its data.

The checkpoint is the distilled policies' format, so ``evaluate``, ``serve`` and the
scenario runner (``ControllerSpec("learned", ...)``) play it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envs.scenario.config import ScenarioConfig
from envs.scenario.env import READY_MARGINS

CLASSES = ("lc", "batch")


@dataclass(frozen=True)
class StudentSettings:
    """Knobs of the budget-filtered cloning (every default runs)."""

    run_seed: int = 0
    select: str = "seed"  # "seed": the best episode per seed; "behaviour": one behaviour
    unsafe: str = "closest"  # a seed with no episode within budget: "closest" or "drop"
    epochs: int = 60
    hiddens: tuple[int, ...] = (128, 128)
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-5

    def __post_init__(self) -> None:
        if self.select not in ("seed", "behaviour"):
            raise ValueError(f"--select {self.select!r}: valid: seed, behaviour")
        if self.unsafe not in ("closest", "drop"):
            raise ValueError(f"--unsafe {self.unsafe!r}: valid: closest, drop")
        if self.epochs < 1:
            raise ValueError(f"--epochs must be >= 1, got {self.epochs}")


def _summary(ep: Any) -> dict[str, float]:
    return dict(ep.get_infos(len(ep))["episode"])


def select_episodes(summaries: list[dict[str, float]], seeds: list[int],
                    budgets: dict[str, float], unsafe: str = "closest") -> list[int]:
    """Per train seed (every behaviour played the same seeds), the episode to clone: the
    cheapest of those within every class budget; on a seed where none is, the one with
    the smallest summed rate-to-budget ratio (``unsafe="closest"``) or none (``"drop"``)."""
    ratio = [sum(s[f"sla_{c}"] / max(budgets[c], 1e-12) for c in CLASSES) for s in summaries]
    safe = [all(s[f"sla_{c}"] <= budgets[c] + 1e-12 for c in CLASSES) for s in summaries]
    keep = []
    for seed in sorted(set(seeds)):
        mine = [i for i, k in enumerate(seeds) if k == seed]
        ok = [i for i in mine if safe[i]]
        if ok:
            keep.append(min(ok, key=lambda i: (summaries[i]["cost_usd"], i)))
        elif unsafe == "closest":
            keep.append(min(mine, key=lambda i: (ratio[i], summaries[i]["cost_usd"], i)))
    return keep


def select_behaviour(summaries: list[dict[str, float]], policies: list[str],
                     budgets: dict[str, float]) -> list[int]:
    """Every episode of one behaviour: the cheapest on average of those whose mean rate of
    every class is within its budget (all behaviours when none is)."""
    names = sorted(set(policies))

    def mean(b: str, k: str) -> float:
        return float(np.mean([s[k] for s, p in zip(summaries, policies, strict=True) if p == b]))

    ok = [b for b in names if all(mean(b, f"sla_{c}") <= budgets[c] + 1e-12 for c in CLASSES)]
    best = min(ok or names, key=lambda b: mean(b, "cost_usd"))
    return [i for i, p in enumerate(policies) if p == best]


def macro_rows(obs: Any) -> np.ndarray:
    """The policy's flat observation (``macro``) of logged observations, one row each."""
    return np.asarray(obs["macro"] if isinstance(obs, dict) else [o["macro"] for o in obs],
                      np.float32)


def branch_actions(a: np.ndarray) -> np.ndarray:
    """Flat env actions -> (release index, ready index) rows."""
    return np.stack([a // len(READY_MARGINS), a % len(READY_MARGINS)], axis=1)


def episode_rows(ep: Any) -> tuple[np.ndarray, np.ndarray]:
    """(observations, (release index, ready index)) of every logged decision; the action
    is the behaviour's own (``infos["behaviour_action"]``, which differs from the one taken
    where noise was injected) when the log has it."""
    macro = macro_rows(ep.get_observations(slice(0, len(ep))))
    infos = [ep.get_infos(t + 1) for t in range(len(ep))]
    if all("behaviour_action" in i for i in infos):
        a = np.array([int(i["behaviour_action"]) for i in infos], np.int64)
    else:
        a = np.asarray(ep.get_actions(slice(0, len(ep))), np.int64).reshape(-1)
    return macro, branch_actions(a)


def train_student(cfg: ScenarioConfig, data: str | Path, out: str | Path,
                  budgets: dict[str, float], s: StudentSettings, log: Any = print
                  ) -> tuple[Path, dict[str, Any]]:
    """Clone the budget-filtered best logged episodes; the checkpoint dir and what was
    kept."""
    import torch

    from cloudrl.algorithms.distill.learner import evaluate_loss, fit
    from cloudrl.algorithms.distill.policy import build_module, save_checkpoint
    from cloudrl.data.offline import read_dataset

    t0 = time.perf_counter()
    everything = read_dataset(data)
    eps = [ep for ep in everything if float(ep.custom_data.get("noise", 0.0)) == 0.0]
    sums = [_summary(ep) for ep in eps]
    seeds = [int(ep.custom_data.get("episode_seed", -1)) for ep in eps]
    keep = select_episodes(sums, seeds, budgets, s.unsafe) if s.select == "seed" else \
        select_behaviour(sums, [str(ep.custom_data.get("policy")) for ep in eps], budgets)
    if not keep:
        raise ValueError(f"{data}: no seed has an episode within every budget; "
                         f"use unsafe='closest'")
    safe = [all(sums[i][f"sla_{c}"] <= budgets[c] + 1e-12 for c in CLASSES) for i in keep]
    chosen = {(eps[i].custom_data.get("policy"), seeds[i]) for i in keep}
    # the chosen behaviour's runs with injected noise on the same seed join its own
    cloned = [ep for ep in everything if (ep.custom_data.get("policy"),
                                          int(ep.custom_data.get("episode_seed", -1)))
              in chosen]
    kept = [{"policy": eps[i].custom_data.get("policy"),
             "seed": eps[i].custom_data.get("episode_seed"),
             "cost_usd": sums[i]["cost_usd"], "sla_lc": sums[i]["sla_lc"],
             "sla_batch": sums[i]["sla_batch"]} for i in keep]
    by = {b: sum(k["policy"] == b for k in kept) for b in sorted({k["policy"] for k in kept})}
    log(f"student: {len(keep)} of {len(eps)} logged episodes kept, "
        + ("one per train seed " if s.select == "seed" else "one behaviour's ") +
        f"({', '.join(f'{n} {b}' for b, n in by.items())}); {sum(safe)} within every "
        f"budget" + (f"; with their noisy runs, {len(cloned)} episodes"
                     if len(cloned) > len(keep) else ""))
    rows = [episode_rows(ep) for ep in cloned]
    obs = np.concatenate([r[0] for r in rows])
    act = np.concatenate([r[1] for r in rows])
    torch.manual_seed(s.run_seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        module = build_module(s.hiddens)
        fit(module, obs, act, s.epochs, s.batch_size, s.lr, s.weight_decay, s.run_seed)
        loss = evaluate_loss(module, obs, act)
    finally:
        torch.set_num_threads(threads)
    out = save_checkpoint(module, out, s.hiddens,
                          {"scenario": cfg.name, "config": {"offline_student": asdict(s)}})
    info = {"learner": "student", "settings": asdict(s), "rows": int(len(act)),
            "imitation_loss": loss, "kept": kept, "kept_within_budget": int(sum(safe)),
            "cloned_episodes": len(cloned),
            "dataset": str(Path(data).resolve()), "budgets": budgets,
            "train_s": time.perf_counter() - t0}
    (Path(out) / "offline.json").write_text(json.dumps(info, indent=1, default=float))
    log(f"student: {len(act)} decisions, {s.epochs} epochs, imitation loss {loss:.3f} "
        f"({info['train_s']:.0f} s) -> {out}")
    return Path(out), info
