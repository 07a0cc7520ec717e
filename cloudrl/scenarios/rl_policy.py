"""A policy trained with RLlib on a scenario (``cloudrl train --scenario``) as a scenario
controller, and its comparison with the signal-aware heuristic.

:class:`RLlibController` has the interface of
:class:`cloudrl.algorithms.distill.policy.LearnedController`: it observes exactly as the
env does (:func:`envs.scenario.env.observe` of the online
:class:`~envs.scenario.control.PlanView`, in the masked layout the env wrapper
:class:`envs.scenario.env.MaskedScenarioEnv` trained it on), plays the module's greedy
action (Q-learners: the argmax of the Q-values, per branch for BDQ; PPO: the most
probable action) and sets the env's controls for it (the gated DQN's action is a preset
of the signal-aware rule, which sets them: :mod:`envs.scenario.gated`); ``decide_times``
records the wall time of each decision (view + observation + forward, batch 1,
in-process), the forward on ``threads`` torch intra-op threads (default 1; the process
setting is restored after).

A gated policy may play with a **margin** (``margin`` $, default 0): it leaves the rule
(preset 0) only for a preset whose Q-value beats the rule's by more than the margin. At 0
it is the plain argmax; the larger the margin, the nearer the policy stays to the rule,
whose cost and SLA it was trained to improve on (a conservative improvement step: a
Q-value that is wrong by less than the margin cannot take the policy off the rule). The
headline picks a run's margin on validation seeds (``gated_dqn_margin``); a checkpoint
carries its own as ``gate_margin`` in ``cloudrl.json``, which ``load_rl_controller`` reads
unless it is given.

A checkpoint is the directory ``cloudrl train --scenario`` writes: RLlib's checkpoint of
the algorithm (the module under ``learner_group/learner/rl_module/default_policy``) and
``cloudrl.json`` (algorithm, interface, scenario). :func:`load_rl_controller` reads it;
the scenario runner plays it as ``ControllerSpec("rllib", {"checkpoint": DIR})`` (and
imports this module for that, so nothing here imports the runner); :func:`format_table`
and :func:`comparison_metrics` read the runner's per-seed results of a checkpoint beside
the heuristic (labelled ``"heuristic"``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from envs.scenario.control import plan_view, release_and_ready
from envs.scenario.env import READY_MARGINS, RELEASE_LEVELS, masked_observation, observe
from envs.scenario.sim import ScenarioSim

# (column, header, scale) of the validation table: per-episode means
TABLE_COLUMNS = (("cost_usd", "cost $", 1.0), ("energy_kwh", "kWh", 1.0),
                 ("carbon_kg", "kgCO2", 1.0), ("sla_lc", "SLA LC %", 100.0),
                 ("sla_batch", "SLA batch %", 100.0))


class RLCheckpointError(ValueError):
    """A directory that is not a checkpoint of ``cloudrl train --scenario``."""


def read_scenario_meta(path: str | Path) -> dict[str, Any]:
    """The checkpoint's ``cloudrl.json``; a :class:`RLCheckpointError` names what is wrong."""
    from cloudrl.checkpoint_policy import read_meta

    try:
        meta = read_meta(path)
    except (OSError, ValueError) as e:
        raise RLCheckpointError(f"checkpoint {path}: {e}") from None
    if meta.get("scenario") is None:
        raise RLCheckpointError(f"checkpoint {path}: trained on the cluster env, not on a "
                                f"scenario (train one with 'cloudrl train --scenario NAME')")
    if "gate_margin" in meta:
        try:
            check_margin(meta["gate_margin"], meta.get("interface", ""))
        except ValueError as e:
            raise RLCheckpointError(f"checkpoint {path}: cloudrl.json gate_margin: {e}") \
                from None
    return meta


def load_module(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """The checkpoint's RLModule (eval mode, CPU) and its ``cloudrl.json``."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    from cloudrl.checkpoint_policy import MODULE_SUBDIR

    meta = read_scenario_meta(path)
    module = RLModule.from_checkpoint(str(Path(path).resolve() / MODULE_SUBDIR))
    module.eval()
    return module, meta


class RLlibController:
    """Plays an RLlib module greedily on the scenario; see the module docstring."""

    clairvoyant = False

    def __init__(self, module: Any, interface: str, name: str = "rllib",
                 threads: int | None = 1, gate: dict[str, Any] | None = None,
                 margin: float = 0.0) -> None:
        if interface not in ("flat", "branching", "gated"):
            raise ValueError(f"interface must be 'flat', 'branching' or 'gated', "
                             f"got {interface!r}")
        self.margin = check_margin(margin, interface)
        self.module = module
        self.interface = interface
        self.name = name
        self.threads = threads
        self.presets = None
        self._static: ScenarioSim | None = None
        if interface == "gated":  # the module picks a preset of the rule, which decides
            from envs.gated_env import resolve_controller

            if not gate or "controller" not in gate:
                raise ValueError("a gated checkpoint needs its controller "
                                 "(env_config['controller'] in cloudrl.json)")
            self.presets = resolve_controller(gate["controller"], gate.get("controller_config"))
            self.mask_size = int(self.presets.n_choices)
        else:
            self.mask_size = (len(RELEASE_LEVELS) * len(READY_MARGINS) if interface == "flat"
                              else len(RELEASE_LEVELS) + len(READY_MARGINS))
        self.decide_times: list[float] = []

    # the Serve endpoint sends an ObservedView: the observation reads the hour of the week
    # and the fleet by power state besides the plan view
    needs_observed_view = True

    def reset(self, sim: ScenarioSim) -> None:
        self.decide_times = []
        self._static = sim
        if self.presets is not None:
            self.presets.reset(sim)

    def scores(self, obs: np.ndarray) -> np.ndarray:
        """The module's greedy scores for one observation vector (Q-values or logits)."""
        import torch

        batch = {k: torch.from_numpy(v[None])
                 for k, v in masked_observation(obs, self.mask_size).items()}
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                if hasattr(self.module, "compute_q_values"):  # DQN (B, 24), BDQ (B, 2, 6)
                    scores = self.module.compute_q_values({"obs": batch})["qf_preds"][0]
                else:  # PPO: masked logits
                    scores = self.module.forward_inference({"obs": batch})[
                        "action_dist_inputs"][0]
        finally:
            torch.set_num_threads(before)
        return scores.numpy()

    def choice(self, q: np.ndarray) -> int:
        """The gated policy's preset for Q-values ``q``: the argmax, unless it beats the
        rule (preset 0) by no more than the margin."""
        best = int(np.argmax(q))
        return best if self.margin <= 0 or q[best] - q[0] > self.margin else 0

    def action(self, obs: np.ndarray) -> tuple[int, int]:
        """The greedy (release level, ready margin) indices for one observation vector."""
        scores = self.scores(obs)
        if self.interface == "flat":
            i, j = divmod(int(np.argmax(scores)), len(READY_MARGINS))
            return i, j
        # BDQ pads the shorter branch with FLOAT_MIN: the argmax stays inside each branch
        return int(np.argmax(scores[0])), int(np.argmax(scores[1]))

    def controls(self, v: Any, obs: np.ndarray) -> tuple[float, float]:
        """The controls of the greedy action on observation ``obs`` of the state ``v``."""
        if self.presets is not None:
            return self.presets.controls(v, self.choice(self.scores(obs)))
        i, j = self.action(obs)
        return release_and_ready(v, RELEASE_LEVELS[i], READY_MARGINS[j])

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        t0 = time.perf_counter()
        v = plan_view(sim)
        out = self.controls(v, observe(sim, v))
        self.decide_times.append(time.perf_counter() - t0)
        return out

    def decide_view(self, view: Any) -> tuple[float, float]:
        """The same decision from a request's view (the Serve endpoint's path): ``view`` is
        an :class:`~cloudrl.algorithms.distill.policy.ObservedView`, whose observation is
        the env's bit for bit; not recorded in ``decide_times`` (the service times it)."""
        from cloudrl.algorithms.distill.policy import view_observation

        if self._static is None:
            raise RuntimeError("reset(sim) first: the controller reads the scenario's fleet")
        return self.controls(view, view_observation(self._static, view))


def check_margin(margin: Any, interface: str) -> float:
    """A gated policy's margin ($, finite, >= 0); a ValueError names a bad one, or a margin
    on a policy that has no rule to stay with."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) \
            or not np.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be a finite number of $ >= 0, got {margin!r}")
    if margin > 0 and interface != "gated":
        raise ValueError(f"margin: only a gated policy has a rule to stay with; this "
                         f"checkpoint acts on the {interface} interface")
    return float(margin)


def load_rl_controller(path: str | Path, name: str = "rllib", scenario: str | None = None,
                       margin: float | None = None) -> RLlibController:
    """The greedy controller of a ``cloudrl train --scenario`` checkpoint; with ``scenario``,
    a checkpoint trained on another scenario is an :class:`RLCheckpointError`. ``margin``:
    the gated policy's margin (None: the checkpoint's ``gate_margin``, else 0)."""
    meta = read_scenario_meta(path)
    if scenario is not None and meta["scenario"] != scenario:
        raise RLCheckpointError(f"--checkpoint {path}: trained on scenario "
                                f"{meta['scenario']!r}, not {scenario!r} (serve it with "
                                f"--scenario {meta['scenario']})")
    module, meta = load_module(path)
    if margin is None:
        margin = meta.get("gate_margin", 0.0)
    return RLlibController(module, meta["interface"], name, gate=meta.get("env_config"),
                           margin=margin)


def heuristic_params(given: str | None, scenario: str) -> dict[str, Any]:
    """The signal-aware heuristic's parameters from ``--heuristic-params``: a JSON object or
    a JSON file holding one of: its parameters (``{"quantile": ...}``), the ``--params``
    of ``cloudrl scenarios evaluate`` (``{"signal_aware": {...}}``) or the ``--json`` of
    ``cloudrl scenarios headroom`` (the tuned parameters of the scenario's row). None: the
    defaults ({}). Raises ValueError naming what is wrong."""
    from cloudrl.heuristics.signal_aware import SignalAwareConfig

    if not given:
        return {}
    text = given
    if not given.lstrip().startswith("{"):
        try:
            text = Path(given).read_text()
        except OSError as e:
            raise ValueError(f"--heuristic-params {given}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--heuristic-params is not valid JSON: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("scenarios"), list):
        rows = [r for r in data["scenarios"] if r.get("name") == scenario]
        if not rows:
            raise ValueError(f"--heuristic-params {given}: no row for scenario {scenario!r}")
        data = rows[0].get("heuristic_params", {})
    elif isinstance(data, dict) and isinstance(data.get("signal_aware"), dict):
        data = data["signal_aware"]
    if not isinstance(data, dict):
        raise ValueError("--heuristic-params: expected a JSON object")
    SignalAwareConfig.from_dict(data)  # unknown names fail here, not in a worker
    return data


def means(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Mean per episode of each metric the runner reports."""
    keys = [k for k in per_seed[0] if all(k in m for m in per_seed)]
    return {k: float(np.mean([m[k] for m in per_seed])) for k in keys}


def format_table(results: dict[str, list[dict[str, float]]]) -> str:
    """The table ``cloudrl train --scenario`` prints: mean cost $, kWh, kgCO2 and the SLA
    violation rate of each class per policy, then each learned policy's paired cost
    difference to the heuristic ($, 95% t-interval, % of the heuristic's cost)."""
    from cloudrl.metrics import summarize

    lines = [f"{'policy':12s}" + "".join(f"{h:>13s}" for _, h, _ in TABLE_COLUMNS)]
    for name, per_seed in results.items():
        avg = means(per_seed)
        lines.append(f"{name:12s}" + "".join(f"{avg[c] * s:13.4f}"
                                             for c, _, s in TABLE_COLUMNS))
    if "heuristic" in results:
        base = np.array([m["cost_usd"] for m in results["heuristic"]])
        for name, per_seed in results.items():
            if name == "heuristic":
                continue
            diff = summarize(np.array([m["cost_usd"] for m in per_seed]) - base)
            d, lo, hi = diff.mean, diff.mean - diff.ci95, diff.mean + diff.ci95
            lines.append(f"{name} - heuristic: {d:+.2f} $ [{lo:+.2f}, {hi:+.2f}] "
                         f"({100 * d / base.mean():+.1f}% of the heuristic's cost; paired by "
                         f"seed, 95% t-interval)")
    return "\n".join(lines)


def comparison_metrics(results: dict[str, list[dict[str, float]]], label: str,
                       prefix: str = "val") -> dict[str, float]:
    """MLflow metrics of one learned policy and the heuristic on the same seeds:
    ``<prefix>/<metric>`` (learned), ``<prefix>/heuristic_<metric>`` and
    ``<prefix>/cost_diff_pct`` (learned minus heuristic, % of the heuristic's cost)."""
    learned, heur = means(results[label]), means(results["heuristic"])
    out = {f"{prefix}/{c}": learned[c] for c, _, _ in TABLE_COLUMNS}
    out.update({f"{prefix}/heuristic_{c}": heur[c] for c, _, _ in TABLE_COLUMNS})
    out[f"{prefix}/cost_diff_pct"] = 100 * (learned["cost_usd"] - heur["cost_usd"]) / \
        heur["cost_usd"]
    return out
