"""Evolution strategies on a Q-network checkpoint of ``cloudrl train --scenario``: the
headline family ``gated_dqn_margin_es`` and ``cloudrl scenarios es`` on an RLlib
checkpoint.

The gated DQN picks one preset of the tuned rule every decision period, by the argmax of
its Q-values (leaving the rule only for a gain above its margin). TD learning fits those
Q-values to a discounted proxy of the cost on the episodes it saw; what decides is only
their order. This step searches the Q head's last layer on the true episode cost, with
the search of :mod:`cloudrl.algorithms.es` (antithetic pairs on common train seeds, the
start competing on validation seeds, so the kept policy is never worse there than the
start). The checkpoint's margin stays as it was chosen.

The result is the start's RLlib checkpoint with the kept weights written into its module
state (the target network's copy too, so an algorithm restored from it starts from the
same Q), ``cloudrl.json`` noting the search (``es``, ``init_checkpoint``) and a
``manifest.json`` as every fine-tune has. ``evaluate``, ``serve`` and the runner play it
as any RLlib scenario checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cloudrl.algorithms.es.algorithm import ESResult, es_finetune, output_layer
from cloudrl.algorithms.es.command import es_manifest
from cloudrl.algorithms.es.config import ESConfig
from cloudrl.checkpoint_policy import MODULE_SUBDIR
from cloudrl.scenarios.rl_policy import load_module, load_rl_controller, read_scenario_meta
from envs.scenario.config import ScenarioConfig

STATE_FILE = "module_state.pkl"
TARGET_PREFIX = "_target_"


def is_rllib_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is an RLlib checkpoint (as ``cloudrl train`` writes)."""
    return (Path(path) / "rllib_checkpoint.json").is_file()


def start_digest(path: str | Path) -> str:
    """Which start a fine-tune began from: the SHA-256 of the module's weights and of the
    margin it plays with."""
    h = hashlib.sha256((Path(path) / MODULE_SUBDIR / STATE_FILE).read_bytes())
    margin = json.loads((Path(path) / "cloudrl.json").read_text()).get("gate_margin")
    h.update(json.dumps(margin).encode())
    return h.hexdigest()


def check_start(path: str | Path, params: str) -> None:
    """A ValueError naming what is wrong with ``path`` as the start of a search on
    ``params`` (not a scenario checkpoint; no Q head to search)."""
    module, _ = load_module(path)  # RLCheckpointError (a ValueError) names a bad one
    if params == "head":
        output_layer(module)


def check_out(src: str | Path, out: str | Path) -> None:
    """A ValueError unless ``out`` may be (over)written: not the start itself, and either
    absent, empty or an RLlib checkpoint (a fine-tune written there before)."""
    src, out = Path(src), Path(out)
    if out.resolve() == src.resolve():
        raise ValueError(f"--out {out} is the start itself: write the fine-tune elsewhere")
    if out.exists() and not (out.is_dir() and (is_rllib_checkpoint(out)
                                               or not any(out.iterdir()))):
        raise ValueError(f"--out {out} exists and is not a checkpoint: it would be replaced")


def write_checkpoint(src: str | Path, out: str | Path, module: object,
                     note: dict) -> Path:
    """``src`` copied to ``out`` with ``module``'s weights in its module state and ``note``
    merged into its ``cloudrl.json``; a layer whose weights changed gets them in its
    target copy too."""
    src, out = Path(src), Path(out)
    check_out(src, out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    state_path = out / MODULE_SUBDIR / STATE_FILE
    with state_path.open("rb") as f:
        state = pickle.load(f)
    for key, value in module.state_dict().items():  # type: ignore[attr-defined]
        if key not in state:
            continue
        new = np.asarray(value.detach().cpu().numpy(), dtype=state[key].dtype)
        if np.array_equal(new, state[key]):
            continue  # a layer the search left as it was keeps its target copy too
        for k in (key, TARGET_PREFIX + key):
            if k in state:
                state[k] = new.copy()
    with state_path.open("wb") as f:
        pickle.dump(state, f)
    meta = json.loads((out / "cloudrl.json").read_text())
    meta.update(note)
    (out / "cloudrl.json").write_text(json.dumps(meta, indent=2))
    return out


def train_to_dir(scn: ScenarioConfig, init_checkpoint: str | Path, cfg: ESConfig,
                 out: str | Path, command: str = "",
                 log: Callable[[str], None] = print) -> ESResult:
    """Fine-tune the Q head of ``init_checkpoint`` on ``scn``'s cost; write it to ``out``."""
    t0 = time.perf_counter()
    meta = read_scenario_meta(init_checkpoint)
    if meta["scenario"] != scn.name:
        log(f"note: {init_checkpoint} was trained on {meta['scenario']!r}, fine-tuning on "
            f"{scn.name!r}")
    digest = start_digest(init_checkpoint)
    res = es_finetune(scn, str(init_checkpoint), cfg, log=log, loader=load_rl_controller)
    out = write_checkpoint(init_checkpoint, out, res.module,
                           {"es": cfg.to_dict(), "init_checkpoint": str(init_checkpoint)})
    manifest = es_manifest(scn, init_checkpoint, cfg, res, command, t0, digest)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    log(f"wrote {out} (iteration {res.kept_iteration}, {manifest['wall_s']:.0f} s, "
        f"{res.episodes} episodes)")
    return res


def trained(out: str | Path, scn: ScenarioConfig, cfg: ESConfig,
            init_checkpoint: str | Path) -> bool:
    """Whether ``out`` holds this search (same scenario, config and start): the search is
    deterministic given them, so a rerun reuses it."""
    out = Path(out)
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    same = json.loads(json.dumps({"s": scn.model_dump(mode="json"), "c": cfg.to_dict()}))
    return (is_rllib_checkpoint(out) and manifest.get("config") == same["c"]
            and manifest.get("scenario_config") == same["s"]
            and manifest.get("init_digest") == start_digest(init_checkpoint))
