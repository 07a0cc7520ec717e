"""Validation errors as a client reads them: the field, as written in the body, and a message.

A pydantic error's ``loc`` names the field step by step, but between the steps it also
names the members of a union it tried (``function-after[functools.partial(<function
less_than_or_equal_validator at 0x...>, le=...)]``, ``list[...]``, ``int``): Python
internals that mean nothing to a client and leak the validator's implementation.
:func:`field_path` keeps only the steps that are places in the body
(``pairs[0].a.trajectory.steps[2].action``); :func:`clean_message` drops any Python repr
left in a message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# a Python object's repr (<function f at 0x7f...>, <object at 0x...>), a partial's repr
_INTERNALS = re.compile(r"functools\.partial\(.*?\)(\(\))?|<[^<>]*\bat 0x[0-9a-fA-F]+>"
                        r"|\bat 0x[0-9a-fA-F]+")
_UNKNOWN = object()  # the body below this step is not known


def field_path(loc: Sequence[Any], body: Any = _UNKNOWN, missing: bool | None = None) -> str:
    """``servers[3].used_cpu_cores`` for a pydantic ``loc`` (without FastAPI's leading
    ``"body"``), or ``"body"`` for the body as a whole.

    With the parsed ``body`` the path follows it: a step is kept where the body has it (a
    key of an object, an index of an array), and the last step when it names a missing
    field (``missing``: the error is pydantic's ``missing``; None: any plain name may be);
    the steps pydantic adds for the members of a union are not in the body and are left
    out. Without the body, a step is kept when it is an index or a plain name."""
    node = body
    steps: list[str | int] = []
    last = len(loc) - 1
    for i, step in enumerate(loc):
        if isinstance(step, int) and not isinstance(step, bool):
            node = node[step] if isinstance(node, list) and 0 <= step < len(node) \
                else _UNKNOWN  # off the body: keep plain names from here
            steps.append(step)
            continue
        step = str(step)
        if isinstance(node, dict) and step in node:
            node = node[step]
            steps.append(step)
        elif (node is _UNKNOWN or (isinstance(node, dict) and i == last
                                   and missing is not False)) \
                and _NAME.match(step):  # a field (or one the body lacks: a missing one)
            steps.append(step)
        # else: a union member's name, not a place in the body
    out = ""
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out or "body"


def clean_message(message: str) -> str:
    """``message`` without Python reprs (validator functions, object addresses)."""
    cleaned = _INTERNALS.sub("", str(message))
    return re.sub(r"\s{2,}", " ", cleaned).strip() or "invalid value"


def field_errors(errors: Iterable[dict[str, Any]], body: Any = _UNKNOWN,
                 prefix: tuple[Any, ...] = ()) -> list[dict[str, str]]:
    """``[{"field", "message"}]`` of pydantic ``errors`` (``ValidationError.errors()``) on
    ``body``; ``prefix`` is stripped from each ``loc`` first (FastAPI's ``("body",)``)."""
    out = []
    for error in errors:
        loc = tuple(error.get("loc", ()))
        if prefix and loc[:len(prefix)] == prefix:
            loc = loc[len(prefix):]
        out.append({"field": field_path(loc, body, error.get("type") == "missing"),
                    "message": clean_message(error.get("msg", "invalid value"))})
    return out
