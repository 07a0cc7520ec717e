"""``--params`` of the scenario commands: the controllers' parameters, inline or from a file.

Shared by ``cloudrl scenarios evaluate`` and ``cloudrl scenarios bound`` (and analyses), so
the commands that take it do not import each other.
"""

from __future__ import annotations

import json
from pathlib import Path


def policy_params(text: str) -> dict[str, dict]:
    """``--params``: a JSON object (policy name -> its parameters) or a file holding one,
    e.g. a published checkpoint's ``references.json`` (whose other keys, such as
    ``source``, are skipped). A ValueError names what is wrong."""
    from cloudrl.scenarios.runner import KINDS

    path = Path(text)
    source = f"--params {text}"
    from_file = not text.lstrip().startswith(("{", "["))
    if from_file:
        try:
            text = path.read_text()
        except OSError as e:
            raise ValueError(f"{source}: neither a JSON object nor a readable file "
                             f"({e.strerror})") from None
    try:
        params = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: neither a JSON object nor a file holding one "
                         f"({e.msg}, line {e.lineno})") from None
    if not isinstance(params, dict):
        raise ValueError(f"{source}: expected a JSON object (policy name -> its parameters)")
    if from_file:
        params = {k: v for k, v in params.items() if k in KINDS}
    for name, value in params.items():
        if name not in KINDS:
            raise ValueError(f"--params: unknown policy {name!r}; valid: {', '.join(KINDS)}")
        if not isinstance(value, dict):
            raise ValueError(f"--params: {name}'s parameters must be a JSON object, got "
                             f"{json.dumps(value)[:40]}")
    return params
