"""The offline agent's fourth learner: the MPC clone improved by policy search in an
input-driven model of the logged data (``cloudrl scenarios offline --learner model``).

The clone (:mod:`cloudrl.scenarios.offline_student`) can at best match the behaviour it
copies, and the value learners (:mod:`cloudrl.scenarios.offline_iql`) could not rank
actions whose costs differ by cents per decision. Online, what passed the MPC was a
direct search on the episode cost. This learner does that search offline, in a model
built from the logs alone (:mod:`cloudrl.algorithms.model_es`):

1. Read the logged episodes through RLlib's offline path (``cloudrl.data.offline``).
2. The inputs: the observation columns every logged episode of a seed shares at every
   step (prices, carbon, solar, their forecasts, the arrival forecasts, the clock). The
   rest is the fleet's own state.
3. The model: an ensemble fitted on every logged transition (the perturbed runs
   included, on the action taken), from the observation and the action to the change of
   the fleet's state and the period's cost.
4. The start: the clone of the student learner, trained on the same data with the same
   run seed (``out/start``).
5. The search: evolution strategies on every weight of the clone, each candidate played
   in the model along logged days (the inputs replayed as they were recorded), on the
   model's cost plus a penalty on the ensemble's disagreement; the iteration kept is the
   one with the lowest penalised cost on held-out logged days, the clone competing.
   Constrained (the default): the model also predicts each period's violations of each
   class, a multiplier per class holds them at the clone's level along the search, and
   only iterations that predict no more of either class than the clone on the held-out
   days can be kept. With ``release_cap`` the searched policy keeps the clone beside it
   and never releases more batch work than the clone would; with ``cap_gate`` as well,
   only in the states where the logs show latency-critical violations
   (:func:`cloudrl.algorithms.model_es.cap_gate`).

The train seeds of the data are split: the last ``held_out`` seeds are the held-out days,
the others the search's. No environment is stepped; the test seeds are only played by the
evaluation afterwards. The checkpoint is the distilled policies' format, as the student's.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.algorithms.model_es import (
    InputDrivenModel,
    ModelESConfig,
    cap_gate,
    input_columns,
    search,
)
from cloudrl.scenarios.offline_student import StudentSettings, macro_rows, train_student
from envs.scenario.config import ScenarioConfig
from envs.scenario.env import OBS_NAMES, READY_MARGINS
from envs.scenario.sim import PLACEMENT_NAMES

CLASSES = ("lc", "batch")  # the violation counts the model predicts, in this order


def placement_rows(ep: Any, n: int) -> np.ndarray:
    """The logged placement state (``place_*`` infos) after reset and after each of the
    ``n`` steps, ``(n + 1, len(PLACEMENT_NAMES))``; a ValueError for data written before it
    was logged."""
    keys = [f"place_{k}" for k in PLACEMENT_NAMES]
    rows = []
    for t in range(n + 1):
        info = ep.get_infos(t)
        if any(k not in info for k in keys):
            raise ValueError("--placement: this data has no placement state in its infos "
                             "(written before it was logged); record it anew")
        rows.append([float(info[k]) for k in keys])
    return np.asarray(rows, np.float32)


def logged_arrays(episodes: list[Any], placement: bool = False) -> dict[str, Any]:
    """Every logged transition (observation, action taken, cost $, next observation, the
    period's violations of each class, the episode's seed and its index in ``episodes``;
    an episode's rows are contiguous and in order), each seed's observation
    arrays, and one logged day per seed (its first episode's observations: the inputs are
    the same in all of them). With ``placement`` every observation row carries the logged
    placement state after its own columns (:func:`placement_rows`): the model's state,
    not the policy's."""
    obs, acts, costs, nxt, viol, seed, index = [], [], [], [], [], [], []
    by_seed: dict[int, list[np.ndarray]] = {}
    for k, ep in enumerate(episodes):
        n = len(ep)
        o = macro_rows(ep.get_observations(slice(0, n + 1)))
        if placement:
            o = np.concatenate([o, placement_rows(ep, n)], 1)
        obs.append(o[:-1])
        nxt.append(o[1:])
        acts.append(np.asarray(ep.get_actions(slice(0, n)), np.int64).reshape(-1))
        costs.append(-np.asarray(ep.get_rewards(slice(0, n)), np.float64))
        infos = [ep.get_infos(t + 1) for t in range(n)]
        viol.append(np.array([[float(i.get(f"violations_{c}", 0.0)) for c in CLASSES]
                              for i in infos]))
        s = int(ep.custom_data.get("episode_seed", -1))
        seed.append(np.full(n, s, np.int64))
        index.append(np.full(n, k, np.int64))
        by_seed.setdefault(s, []).append(o)
    return {"obs": np.concatenate(obs), "actions": np.concatenate(acts),
            "seeds": np.concatenate(seed), "episodes": np.concatenate(index),
            "costs": np.concatenate(costs), "next_obs": np.concatenate(nxt),
            "violations": np.concatenate(viol),
            "by_seed": by_seed, "days": {s: eps[0] for s, eps in sorted(by_seed.items())}}


def logged_cap_gate(arrays: dict[str, Any], share: float, horizon: int = 4
                    ) -> dict[str, Any] | None:
    """The release cap's gate (:func:`cloudrl.algorithms.model_es.cap_gate`) over the
    policy's observation columns of :func:`logged_arrays`, on the LC violations, with the
    column's ``name``."""
    gate = cap_gate(arrays["obs"][:, :len(OBS_NAMES)],
                    arrays["violations"][:, CLASSES.index("lc")], arrays["episodes"],
                    share, horizon)
    if gate is not None:
        gate["name"] = OBS_NAMES[gate["column"]]
    return gate


def train_model_agent(cfg: ScenarioConfig, data: str | Path, out: str | Path,
                      budgets: dict[str, float], m: ModelESConfig,
                      student: StudentSettings, log: Any = print
                      ) -> tuple[Path, dict[str, Any]]:
    """Clone, model and search, from the logged episodes under ``data`` only; the
    checkpoint dir and diagnostics."""
    import torch

    from cloudrl.algorithms.distill.policy import (
        build_module,
        load_checkpoint,
        save_checkpoint,
    )
    from cloudrl.data.offline import read_dataset

    t0 = time.perf_counter()
    out = Path(out)
    start, _ = train_student(cfg, data, out / "start", budgets, student, log)
    arrays = logged_arrays(read_dataset(data), placement=m.placement)
    inputs = input_columns(arrays["by_seed"])
    seeds = sorted(arrays["days"])
    if len(seeds) <= m.held_out:
        raise ValueError(f"--learner model: {len(seeds)} logged train seeds; the search "
                         f"needs more than the {m.held_out} held out")
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    try:
        # unconstrained, the model is the cost model alone (as it was before the constraint)
        model = InputDrivenModel(inputs, 24, m, n_extra=len(CLASSES) if m.constrained else 0)
        log(f"model: {int(inputs.sum())} input columns replayed from the logs, "
            f"{len(model.endo)} modelled"
            + (f" ({len(PLACEMENT_NAMES)} of them the logged placement state, which the "
               f"policy does not see)" if m.placement else "")
            + f"; {len(arrays['obs'])} logged transitions")
        losses = model.fit(arrays["obs"], arrays["actions"], arrays["costs"],
                           arrays["next_obs"], log,
                           extra=arrays["violations"] if m.constrained else None)

        def days(ss: list[int]) -> torch.Tensor:
            n = min(len(arrays["days"][s]) for s in ss)
            return torch.as_tensor(np.stack([arrays["days"][s][:n] for s in ss]),
                                   dtype=torch.float32)

        search_seeds, held_seeds = seeds[:-m.held_out], seeds[-m.held_out:]
        module, spec = load_checkpoint(start)
        gate = None
        if m.cap_gate > 0:
            gate = logged_cap_gate(arrays, m.cap_gate, m.cap_gate_horizon)
            log("model: release cap gate: " + (
                "no observation column frees any logged state; the cap holds everywhere"
                if gate is None else
                f"the cap holds where {OBS_NAMES[gate['column']]} > {gate['above']:.4f}; "
                f"below it lie {100 * gate['free_share']:.1f}% of the logged states, "
                f"carrying {100 * gate['violation_share']:.1f}% of the LC violations "
                f"logged in the {m.cap_gate_horizon} periods after them"))
        if m.release_cap:  # the clone stays as the anchor whose release level caps it
            capped = build_module(tuple(spec["model_config"]["hiddens"]), release_cap=True,
                                  cap_gate=gate)
            capped.load_state_dict(module.state_dict(), strict=False)
            capped.set_anchor(module)
            module = capped.eval()
        n_ready = len(READY_MARGINS)

        def to_flat(a: torch.Tensor) -> torch.Tensor:
            return a[:, 0] * n_ready + a[:, 1]

        def states(ss: list[int]) -> torch.Tensor:
            return torch.as_tensor(arrays["obs"][np.isin(arrays["seeds"], ss)],
                                   dtype=torch.float32)

        logged = (states(search_seeds), states(held_seeds)) if m.logged_states else None
        torch.manual_seed(m.run_seed)
        module, history, kept = search(module, model, days(search_seeds), days(held_seeds),
                                       m, to_flat, log, logged=logged,
                                       policy_columns=len(OBS_NAMES))
    finally:
        torch.set_num_threads(threads)
    hiddens = tuple(int(h) for h in spec["model_config"]["hiddens"])
    ckpt = save_checkpoint(module, out / "policy", hiddens,
                           {"scenario": cfg.name,
                            "config": {"offline_model": asdict(m),
                                       "offline_student": asdict(student)}})
    info = {"learner": "model", "settings": asdict(m), "student": asdict(student),
            "start": str(start), "input_columns": [int(i) for i in np.flatnonzero(inputs)],
            "model_loss": losses, "kept_iteration": kept, "cap_gate": gate, "history": history,
            "search_seeds": search_seeds, "held_out_seeds": held_seeds,
            "rows": int(len(arrays["obs"])), "dataset": str(Path(data).resolve()),
            "budgets": budgets, "train_s": time.perf_counter() - t0}
    (Path(ckpt) / "offline.json").write_text(json.dumps(info, indent=1, default=float))
    log(f"model: kept iteration {kept} ({info['train_s']:.0f} s) -> {ckpt}")
    return Path(ckpt), info
