"""A gated policy's margin, picked on validation seeds: the headline family
``gated_dqn_margin``.

The gated DQN picks one preset of the tuned rule every decision period; preset 0 is the
rule. Its runs differ by training seed far more than by anything else (on
``scarcity_spikes`` from −6.9% to +16.4% against the rule), because a Q-value that is
wrong by a little takes whole stretches of an episode off the rule. A **margin** (in $ of
Q-value, :class:`cloudrl.scenarios.rl_policy.RLlibController`) lets the policy leave the rule
only for a preset that beats it by more than the margin.

:func:`choose_margin` plays the rule and the trained run at every margin of a grid on the
same validation seeds and keeps the cheapest margin whose SLA violation rate of each class
is not higher than the rule's there, by the test the headline's SLA goal applies (the
paired 95% interval of the difference, seed by seed, does not lie entirely above 0); the
rule itself (:data:`RULE`, a margin beyond every Q-gap) is always a candidate, so a run
that does not beat the rule on validation falls back to it. Test seeds are never touched.
:func:`write_with_margin` copies the run's checkpoint with the chosen margin in its
``cloudrl.json`` (``gate_margin``, read by
:func:`~cloudrl.scenarios.rl_policy.load_rl_controller`, so evaluation and the Serve
endpoint play it as chosen) and the validation table beside it (``margin_selection``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.scenarios.runner import ControllerSpec, paired_ci, run_controllers
from envs.scenario.config import ScenarioConfig

# $ of Q-value (a decision period costs about $0.3 at N=50); on demand_response from 1.6
# on every run plays the rule
MARGINS: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)
RULE = 1e6  # $: beyond every Q-gap, so the policy plays the rule (preset 0) throughout
SLA_KEYS = ("sla_lc", "sla_batch")


@dataclass
class MarginChoice:
    """The chosen margin and the validation table it was chosen from (one row per
    candidate: margin, mean cost $, mean SLA rates, the lower end of each class's paired
    interval against the rule, whether it keeps SLA)."""

    margin: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def selection_key(meta: dict[str, Any], heuristic_params: dict[str, Any], seeds: list[int],
                  margins: tuple[float, ...]) -> str:
    """What a choice depends on: the run (its ``cloudrl.json`` without an earlier choice),
    the rule's parameters, the validation seeds and the grid."""
    run = {k: v for k, v in meta.items() if k not in ("gate_margin", "margin_selection")}
    blob = json.dumps({"run": run, "rule": heuristic_params, "seeds": seeds,
                       "margins": list(margins)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def choose_margin(scn: ScenarioConfig, checkpoint: str | Path,
                  heuristic_params: dict[str, Any], seeds: list[int],
                  margins: tuple[float, ...] = MARGINS, workers: int | None = None
                  ) -> MarginChoice:
    """Play the rule and ``checkpoint`` at each margin on ``seeds``; the cheapest margin
    whose rate of each SLA class is not higher than the rule's (paired 95% interval not
    entirely above 0; the rule, :data:`RULE`, when none is cheaper)."""
    if not margins or any(not (np.isfinite(m) and m >= 0) for m in margins):
        raise ValueError(f"margins must be finite numbers >= 0, got {margins!r}")
    specs = [ControllerSpec("signal_aware", dict(heuristic_params), "rule")]
    specs += [ControllerSpec("rllib", {"checkpoint": str(checkpoint), "margin": float(m)},
                             f"margin {m:g}") for m in margins]
    played = run_controllers(scn, specs, list(seeds), workers)

    def row(margin: float, eps: list[dict[str, float]]) -> dict[str, Any]:
        return {"margin": margin, "cost_usd": float(np.mean([m["cost_usd"] for m in eps])),
                **{k: float(np.mean([m[k] for m in eps])) for k in SLA_KEYS}}

    rule = {**row(RULE, played[0]), **{f"{k}_diff_lo": 0.0 for k in SLA_KEYS},
            "keeps_sla": True}
    rows = [rule]
    for m, eps in zip(margins, played[1:], strict=True):
        r = row(float(m), eps)
        for k in SLA_KEYS:
            r[f"{k}_diff_lo"] = paired_ci(np.array([e[k] for e in eps]),
                                          np.array([e[k] for e in played[0]]))[1]
        r["keeps_sla"] = all(r[f"{k}_diff_lo"] <= 0 for k in SLA_KEYS)
        rows.append(r)
    meta = json.loads((Path(checkpoint) / "cloudrl.json").read_text())
    return MarginChoice(pick(rows)["margin"], rows, list(seeds),
                        selection_key(meta, heuristic_params, list(seeds), margins))


def pick(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The cheapest row that keeps SLA; on a tie in cost the larger margin (nearer the
    rule)."""
    return min((r for r in rows if r["keeps_sla"]), key=lambda r: (r["cost_usd"], -r["margin"]))


def chosen_earlier(out: Path, key: str) -> MarginChoice | None:
    """The choice ``out`` already holds for the same inputs (``key``), else None."""
    try:
        meta = json.loads((out / "cloudrl.json").read_text())
    except (OSError, ValueError):
        return None
    sel = meta.get("margin_selection")
    if not isinstance(sel, dict) or sel.get("key") != key \
            or not (out / "rllib_checkpoint.json").is_file():
        return None
    try:
        return MarginChoice(**sel)
    except TypeError:  # an edited record: choose again
        return None


def write_with_margin(src: str | Path, out: str | Path, choice: MarginChoice) -> Path:
    """``src``'s checkpoint copied to ``out`` with ``choice``'s margin as its own."""
    src, out = Path(src), Path(out)
    if out.resolve() != src.resolve():
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(src, out)
    meta = json.loads((out / "cloudrl.json").read_text())
    meta.update(gate_margin=choice.margin, margin_selection=choice.to_dict())
    (out / "cloudrl.json").write_text(json.dumps(meta, indent=2))
    return out


def format_choice(choice: MarginChoice) -> str:
    """The validation table of a choice, one line per candidate."""
    lines = [f"margin chosen on {len(choice.seeds)} validation seeds: "
             + ("the rule itself" if choice.margin >= RULE else f"${choice.margin:g}")]
    for r in choice.rows:
        name = "rule" if r["margin"] >= RULE else f"{r['margin']:g}"
        lines.append(f"  {name:>6s}: cost ${r['cost_usd']:.2f}, SLA LC {100 * r['sla_lc']:.4f}%"
                     f", batch {100 * r['sla_batch']:.4f}%"
                     + ("" if r["keeps_sla"] else " (SLA above the rule's)"))
    return "\n".join(lines)
