"""A saved RLModule state (e.g. behaviour cloning's output) and the algorithms it fits.

Behaviour cloning writes the state with ``bc_meta.json`` (``META_FILE``: interface,
module class, model_config, hidden width and the algorithms it fits) beside it;
``TrainConfig(init_module_state=...)`` checks the pairing with :func:`check_module_state`
before training starts from it.
"""

from __future__ import annotations

import json
from pathlib import Path

META_FILE = "bc_meta.json"


def check_module_state(path: str | Path, algo: str, hidden: int) -> str:
    """The absolute path of a saved RLModule state for ``TrainConfig.init_module_state``.

    A ValueError (one line) when ``path`` holds no RLModule state, or when its
    ``bc_meta.json`` says it does not fit ``algo`` (other interface or module) or was
    trained with another ``hidden``.
    """
    p = Path(path).expanduser().resolve()
    if not p.is_dir() or not any(p.glob("module_state*")):
        raise ValueError(f"init_module_state: {path}: not a saved RLModule state (a "
                         "directory RLModule.save_to_path wrote, e.g. cloudrl align bc --out)")
    meta_file = p / META_FILE
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        if algo not in meta.get("fits", [algo]):
            raise ValueError(f"init_module_state: {path}: a {meta.get('interface')} "
                             f"{meta.get('module_class')} state fits "
                             f"{', '.join(meta['fits'])}, not {algo}")
        if int(meta.get("hidden", hidden)) != hidden:
            raise ValueError(f"init_module_state: {path}: trained with hidden="
                             f"{meta['hidden']}, this run has hidden={hidden}")
    return str(p)
