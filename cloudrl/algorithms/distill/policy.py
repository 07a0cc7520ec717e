"""A trained :class:`models.scenario_policy.ScenarioPolicyModule` as a scenario controller,
and its checkpoint on disk.

:class:`LearnedController` observes exactly as the env does (:func:`envs.scenario.env.
observe` of the online :class:`~envs.scenario.control.PlanView`), takes the module's
greedy action and sets the env's controls for it; it records the wall time of each
decision (view + observation + forward, batch 1, in-process) in ``decide_times``. The
forward runs on ``threads`` torch intra-op threads (default 1; the process setting is
restored after each decision): at batch 1 more threads only add synchronisation, and on
a loaded 2-core machine 2 threads measured 4.5-5 ms p50 per forward against 0.12 ms on
one.

A checkpoint is a directory: ``policy.pt`` (the module's ``state_dict``), ``policy.json``
(module class, ``model_config``, observation size, action branches, scenario, training
config) and, from the command that wrote it, ``manifest.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from cloudrl.algorithms.distill.actions import action_controls
from envs.scenario.control import plan_view
from envs.scenario.env import OBS_NAMES, READY_MARGINS, RELEASE_LEVELS, observe
from envs.scenario.sim import ScenarioSim
from models.scenario_policy import ScenarioPolicyModule

WEIGHTS = "policy.pt"
SPEC = "policy.json"


class CheckpointError(ValueError):
    """A checkpoint directory that is missing, incomplete or does not fit the env."""


def build_module(hiddens: tuple[int, ...]) -> ScenarioPolicyModule:
    """A fresh module for the scenario env's observation and action spaces."""
    return ScenarioPolicyModule(
        observation_space=gym.spaces.Box(-10.0, 10.0, (len(OBS_NAMES),), np.float32),
        action_space=gym.spaces.MultiDiscrete([len(RELEASE_LEVELS), len(READY_MARGINS)]),
        model_config={"hiddens": list(hiddens)})


class LearnedController:
    """Plays a module greedily; see the module docstring."""

    clairvoyant = False

    def __init__(self, module: ScenarioPolicyModule, name: str = "learned",
                 threads: int | None = 1) -> None:
        self.module = module.eval()
        self.name = name
        self.threads = threads
        self.decide_times: list[float] = []

    def reset(self, sim: ScenarioSim) -> None:
        self.decide_times = []

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        t0 = time.perf_counter()
        v = plan_view(sim)
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                a = self.module.greedy(torch.from_numpy(observe(sim, v))[None])[0]
        finally:
            torch.set_num_threads(before)
        out = action_controls(v, (int(a[0]), int(a[1])))
        self.decide_times.append(time.perf_counter() - t0)
        return out


def save_checkpoint(module: ScenarioPolicyModule, out: str | Path, hiddens: tuple[int, ...],
                    extra: dict[str, Any]) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(module.state_dict(), out / WEIGHTS)
    spec = {"module": f"{ScenarioPolicyModule.__module__}.{ScenarioPolicyModule.__name__}",
            "model_config": {"hiddens": list(hiddens)}, "obs_names": list(OBS_NAMES),
            "action_nvec": [len(RELEASE_LEVELS), len(READY_MARGINS)], **extra}
    (out / SPEC).write_text(json.dumps(spec, indent=2))
    return out


def load_checkpoint(path: str | Path) -> tuple[ScenarioPolicyModule, dict[str, Any]]:
    """The module and its ``policy.json``; a missing or mismatched checkpoint is a
    :class:`CheckpointError` naming the path and what is wrong."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"--checkpoint {path}: no such directory")
    for name in (WEIGHTS, SPEC):
        if not (p / name).is_file():
            raise CheckpointError(f"--checkpoint {path}: missing {name} (write one with "
                                  f"'cloudrl scenarios distill')")
    try:
        spec = json.loads((p / SPEC).read_text())
        hiddens = tuple(int(h) for h in spec["model_config"]["hiddens"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"--checkpoint {path}: {SPEC} is malformed ({e})") from None
    if spec.get("obs_names") != list(OBS_NAMES) or \
            spec.get("action_nvec") != [len(RELEASE_LEVELS), len(READY_MARGINS)]:
        raise CheckpointError(f"--checkpoint {path}: trained for another observation or "
                              f"action layout than this env's")
    module = build_module(hiddens)
    try:
        module.load_state_dict(torch.load(p / WEIGHTS, map_location="cpu", weights_only=True))
    except (RuntimeError, OSError, EOFError) as e:
        raise CheckpointError(f"--checkpoint {path}: {WEIGHTS} does not load "
                              f"({str(e).splitlines()[0]})") from None
    return module.eval(), spec


def load_controller(path: str | Path, name: str = "learned") -> LearnedController:
    return LearnedController(load_checkpoint(path)[0], name)
