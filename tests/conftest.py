"""Shared pytest fixtures: one Ray session for every test that needs Ray."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Ray started once per test session on 2 CPUs (the CI budget), shut down at the end."""
    import os

    import ray

    # Serve's proxy readiness check gives up after 5 s by default; a loaded 2-core machine
    # can take longer to start it. The controller reads these from the environment.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "30")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield
    ray.shutdown()
