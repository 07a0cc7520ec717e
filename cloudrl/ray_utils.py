"""Starting or joining Ray the way a user expects: local by default, a cluster when asked.

``RAY_ADDRESS`` set (as under ``ray job submit``) -> join that cluster.
Otherwise start a local Ray with this machine's CPUs and no dashboard, and:

* Ray's worker processes exit quietly. A worker's SIGTERM handler raises
  ``SystemExit(1)``; when the raylet's SIGTERM reaches a worker that is already
  running its exit handlers (Tune stopping a trial, ``ray.shutdown()`` at the end
  of a command), Python can only print that exception as ``Exception ignored ...
  SystemExit: 1`` with a traceback, which the driver forwards to the console.
  :func:`quiet_worker_exit` (a ``worker_process_setup_hook``) drops exactly those
  unraisable ``SystemExit`` reports; the process exits either way.
* Ray 2.5x creates a token for its token authentication in ``~/.ray/auth_token``
  the first time a local cluster starts; :func:`init_ray` says so in one line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

SETUP_HOOK = "cloudrl.quiet.quiet_worker"  # quiet_worker_exit + library log filters


def auth_token_path() -> Path:
    """Where Ray keeps its default auth token (``ray get-auth-token``)."""
    return Path.home() / ".ray" / "auth_token"


def quiet_worker_exit() -> None:
    """Do not print a ``SystemExit`` raised where it cannot propagate (exit handlers,
    finalizers): it comes from Ray's SIGTERM handler in a process that is already exiting.
    Every other unraisable exception still goes to the previous hook."""
    previous = sys.unraisablehook
    if getattr(previous, "_cloudrl_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, SystemExit):
            return
        previous(unraisable)

    hook._cloudrl_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def init_ray(num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
        return
    token = auth_token_path()
    had_token = token.exists()
    quiet_worker_exit()
    ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
             runtime_env={"worker_process_setup_hook": SETUP_HOOK})
    if not had_token and token.exists():
        print(f"note: Ray wrote an auth token to {token} (its token authentication for "
              f"local clusters; RAY_AUTH_MODE=disabled turns that off)", flush=True)
