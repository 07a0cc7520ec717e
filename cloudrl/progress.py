"""Progress bars for the long loops: tqdm on stderr, redrawn at most once a second.

Shown whether or not stderr is a terminal (a command run under ``nohup`` or in CI shows
that it is alive, at most one update a second, and keeps each bar's final count);
``CLOUDRL_PROGRESS=0`` turns every bar off.
stdout is never written to, so the commands' tables stay as they are.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tqdm import tqdm

ENV = "CLOUDRL_PROGRESS"
MININTERVAL_S = 1.0


def progress_enabled() -> bool:
    """False when ``CLOUDRL_PROGRESS`` is ``0`` (or ``false``/``no``/``off``)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def progress_bar(total: int | None, desc: str | None, unit: str = "it",
                 enabled: bool = True, **kw: Any) -> tqdm:
    """A tqdm bar on stderr; disabled when ``desc`` is None, ``enabled`` is False or
    :func:`progress_enabled` says so. Usable as a context manager."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, mininterval=MININTERVAL_S,
                disable=desc is None or not enabled or not progress_enabled(),
                dynamic_ncols=True, leave=not _isatty(), **kw)


def _isatty() -> bool:
    """A terminal gets its bars cleared when done; a log keeps each bar's final line."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
