"""Library noise a cloudrl user cannot act on is dropped; every other message still shows."""

from __future__ import annotations

import logging

import pytest

from cloudrl import quiet


@pytest.fixture
def clean_loggers():
    names = list(quiet.NOISE) + list(quiet.INFO_ONLY)
    saved = {n: (logging.getLogger(n).filters[:], logging.getLogger(n).level) for n in names}
    for n in names:  # start from Ray's own state (an earlier test may have run the CLI)
        log = logging.getLogger(n)
        log.filters[:] = [f for f in log.filters if not isinstance(f, quiet._DropMessages)]
        log.setLevel(logging.NOTSET)
    yield
    for n, (filters, level) in saved.items():
        logging.getLogger(n).filters[:] = filters
        logging.getLogger(n).setLevel(level)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


def _emitted(logger: str, level: int, text: str) -> bool:
    """Whether ``text`` logged at ``level`` reaches a handler of the logger itself (Ray's
    loggers do not propagate to the root logger, so pytest's caplog would not see them)."""
    log, handler = logging.getLogger(logger), _Collect()
    old_level = log.level
    if log.level == logging.NOTSET:
        log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        log.log(level, text)
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    return text in handler.seen


def _emitted_at_its_level(logger: str, level: int, text: str) -> bool:
    """Like _emitted, but the logger keeps the level quiet_library_logs gave it."""
    log, handler = logging.getLogger(logger), _Collect()
    log.addHandler(handler)
    try:
        log.log(level, text)
    finally:
        log.removeHandler(handler)
    return text in handler.seen


@pytest.mark.usefixtures("clean_loggers")
def test_known_noise_is_dropped_and_other_warnings_kept() -> None:
    api = "ray.rllib.algorithms.algorithm_config"
    noise = "You are running DQN on the new API stack! This is the new default behavior"
    assert _emitted(api, logging.WARNING, noise)  # before: shown
    quiet.quiet_library_logs()
    quiet.quiet_library_logs()  # idempotent: one filter per logger
    assert sum(isinstance(f, quiet._DropMessages) for f in logging.getLogger(api).filters) == 1
    assert not _emitted(api, logging.WARNING, noise)
    assert _emitted(api, logging.WARNING, "train_batch_size is not a multiple of ...")
    assert not _emitted("ray.tune.utils.util", logging.WARNING,
                        "Install gputil for GPU system monitoring.")
    assert not _emitted_at_its_level("mlflow.store.db.utils", logging.INFO,
                        "Creating initial MLflow database tables...")
    assert _emitted("mlflow.store.db.utils", logging.WARNING, "database is locked")


def test_quiet_environment_keeps_what_the_user_set(monkeypatch) -> None:
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "1")
    monkeypatch.delenv("RAY_DEDUP_LOGS", raising=False)
    quiet.quiet_environment()
    import os

    assert os.environ["RAY_AIR_NEW_OUTPUT"] == "1"
    assert os.environ["RAY_DEDUP_LOGS"] == quiet.QUIET_ENV["RAY_DEDUP_LOGS"]


def test_ray_workers_run_the_quiet_hook() -> None:
    from cloudrl.ray_utils import SETUP_HOOK

    module, func = SETUP_HOOK.rsplit(".", 1)
    assert (module, func) == ("cloudrl.quiet", "quiet_worker")


@pytest.mark.usefixtures("clean_loggers")
def test_importing_the_cli_installs_the_filters() -> None:
    """The evaluation pool spawns workers that re-import the console script (and so the CLI
    module) without calling main(): the filters must come with the import."""
    import importlib

    import cloudrl.cli

    log = logging.getLogger("ray._common.deprecation")
    log.filters[:] = [f for f in log.filters if not isinstance(f, quiet._DropMessages)]
    importlib.reload(cloudrl.cli)
    assert any(isinstance(f, quiet._DropMessages) for f in log.filters)
