"""Shared pytest fixtures: one Ray session for every test that needs Ray, and isolation.

Ray's driver replaces ``builtins.print`` with its tqdm-aware ``safe_print`` the first time
a worker's log line reaches the driver (``ray.experimental.tqdm_ray.instance()``). That
print then hides and redraws progress bars whose stream may be a closed capture of an
earlier test, so a later test that prints fails with "I/O operation on closed file".
``RAY_TQDM_PATCH_PRINT=0`` (set before Ray is imported) turns the patch off, and
:func:`_restore_print` puts the real ``print`` back after every test in case anything
patches it anyway.

Tests write only to temporary directories: hypothesis keeps no example database and its
other caches live in the system's temp dir (not ``.hypothesis/`` in the working tree),
and a test that runs a command whose outputs go to ``results/`` of the current directory
changes into its tmp dir first.
"""

from __future__ import annotations

import builtins
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
settings.register_profile("cloudrl", database=None)
settings.load_profile("cloudrl")
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "cloudrl-tests-hypothesis")
_PRINT = builtins.print


@pytest.fixture(autouse=True)
def _restore_print() -> Iterator[None]:
    """No test leaves ``builtins.print`` patched for the next one."""
    yield
    builtins.print = _PRINT


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Ray started once per test session on 2 CPUs (the CI budget), shut down at the end."""
    import ray

    # Serve's proxy readiness check gives up after 5 s by default; a loaded 2-core machine
    # can take longer to start it. The controller reads these from the environment.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "30")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield
    ray.shutdown()
