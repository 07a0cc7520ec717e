"""Shared pytest fixtures: one Ray session for every test that needs Ray."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Ray started once per test session on 2 CPUs (the CI budget), shut down at the end."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield
    ray.shutdown()
