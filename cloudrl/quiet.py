"""Keep library messages a cloudrl user cannot act on out of the console.

Ray, RLlib, Tune and MLflow log progress and advice meant for their own developers (that
RLlib's new API stack is the default, that a checkpoint was written, that GPUtil is not
installed for GPU monitoring, ...). :func:`quiet_library_logs` drops exactly those
messages, by logger and text, so every other warning from the same loggers still shows.
It runs in the CLI's process and, as part of Ray's ``worker_process_setup_hook``
(:func:`quiet_worker`), in every Ray worker. :data:`QUIET_ENV` holds the environment
settings for the same purpose (Tune's console reporter, which prints a configuration box
even at ``verbose=0`` otherwise); Ray workers inherit them.
"""

from __future__ import annotations

import logging
import os

# logger name -> substrings of messages to drop (an empty tuple drops the logger's INFO lines)
NOISE: dict[str, tuple[str, ...]] = {
    "ray.rllib.algorithms.algorithm_config": ("on the new API stack!",),
    "ray._common.deprecation": ("`RLModule(config=[RLModuleConfig object])` has been deprecated",),
    "ray.tune.utils.util": ("Install gputil for GPU system monitoring",),
    "ray._private.authentication.authentication_token_setup": (
        "Token authentication is enabled for this Ray cluster",),
}
INFO_ONLY = ("ray.train._internal.storage", "ray.tune.tune", "ray.tune.impl.tuner_internal",
             "mlflow.store.db.utils", "ray._private.worker", "alembic.runtime.migration")
QUIET_ENV = {"RAY_AIR_NEW_OUTPUT": "0", "RAY_DEDUP_LOGS": "1"}


class _DropMessages(logging.Filter):
    def __init__(self, needles: tuple[str, ...]) -> None:
        super().__init__()
        self.needles = needles

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(n in text for n in self.needles)


def quiet_library_logs() -> None:
    """Install the filters (idempotent) and raise INFO-only loggers to WARNING."""
    for name, needles in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(needles))
    for name in INFO_ONLY:
        logger = logging.getLogger(name)
        if logger.level in (logging.NOTSET, logging.DEBUG, logging.INFO):
            logger.setLevel(logging.WARNING)


def quiet_environment() -> None:
    """Set :data:`QUIET_ENV` where the user has not set the variable already."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def quiet_worker() -> None:
    """Ray ``worker_process_setup_hook``: quiet logs and exits in a worker process."""
    from cloudrl.ray_utils import quiet_worker_exit

    quiet_worker_exit()
    quiet_library_logs()
