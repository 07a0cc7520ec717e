"""MLflow tracking for cloudrl: where runs go, and small helpers to log to them from the driver.

Tracking URI, first that is set: an explicit ``--tracking-uri`` value, the
``MLFLOW_TRACKING_URI`` environment variable, else a SQLite store in the
current directory, ``sqlite:///<abs cwd>/mlflow.db``. MLflow 3.17+ refuses the
old ``./mlruns`` file store, so a plain ``*.db`` path is read as SQLite and
any other plain path is rejected with a hint. Artifacts of a SQLite store
live next to the database, in ``mlartifacts/``.

Look at the runs with::

    mlflow ui --backend-store-uri sqlite:///$PWD/mlflow.db

(then open http://127.0.0.1:5000). Every helper takes an ``MlflowClient`` and
a run id, so it is safe to call from Ray Tune callbacks, which run on the
driver; nothing here touches MLflow's global "active run".
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudrl.config_loader import ConfigError

if TYPE_CHECKING:
    from mlflow import MlflowClient

ENV_VAR = "MLFLOW_TRACKING_URI"
DEFAULT_DB = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"
MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_KEY = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH


def resolve_tracking_uri(uri: str | None = None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<abs cwd>/mlflow.db``."""
    uri = uri or os.environ.get(ENV_VAR) or ""
    if not uri:
        return f"sqlite:///{(Path.cwd() / DEFAULT_DB).resolve()}"
    if "://" in uri or uri.startswith(("databricks", "file:")):
        return uri
    path = Path(uri).expanduser().resolve()
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        return f"sqlite:///{path}"
    raise ConfigError(f"tracking URI {uri!r}: MLflow 3.17+ refuses the file store (./mlruns); "
                      f"use sqlite:///{path}.db, a *.db path, or an http(s) tracking server")


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    prefix = "sqlite:///"
    return Path(uri[len(prefix):]) if uri.startswith(prefix) else None


def make_client(uri: str | None = None) -> MlflowClient:
    from mlflow import MlflowClient

    uri = resolve_tracking_uri(uri)
    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


def get_or_create_experiment(client: MlflowClient, name: str) -> str:
    """The id of experiment ``name``; created (artifacts next to a SQLite DB) when missing."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    db = sqlite_path(client.tracking_uri)
    location = (db.parent / ARTIFACT_DIR).resolve().as_uri() if db is not None else None
    return client.create_experiment(name, artifact_location=location)


def start_run(client: MlflowClient, experiment_id: str, run_name: str,
              tags: Mapping[str, Any]) -> str:
    """A new run (status RUNNING); returns its id."""
    run = client.create_run(experiment_id, run_name=run_name,
                            tags={k: str(v) for k, v in tags.items()})
    return run.info.run_id


def open_run(uri: str | None, experiment: str, run_name: str, tags: Mapping[str, Any]
             ) -> tuple[MlflowClient, str]:
    """(client, id) of a new RUNNING run in ``experiment`` (created if missing) at ``uri``."""
    client = make_client(uri)
    return client, start_run(client, get_or_create_experiment(client, experiment), run_name,
                             tags)


def end_run(client: MlflowClient, run_id: str, status: str = "FINISHED") -> None:
    client.set_terminated(run_id, status=status)


@contextmanager
def finishing(client: MlflowClient, run_id: str) -> Iterator[None]:
    """Ends the run FINISHED after the block, or FAILED when the block raises."""
    try:
        yield
    except BaseException:
        end_run(client, run_id, "FAILED")
        raise
    end_run(client, run_id)


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and tuples stay values."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _param_value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_VALUE else text[:MAX_PARAM_VALUE - 3] + "..."


def log_params(client: MlflowClient, run_id: str, params: Mapping[str, Any]) -> None:
    """Flattened params, keys and values truncated to MLflow's limits, in batches of 100."""
    from mlflow.entities import Param

    items = [Param(k[:MAX_KEY], _param_value(v)) for k, v in flatten(params).items()]
    for i in range(0, len(items), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i:i + PARAMS_PER_BATCH])


def log_metrics(client: MlflowClient, run_id: str, metrics: Mapping[str, float],
                step: int = 0) -> None:
    """Finite numeric ``metrics`` at ``step`` (NaN and inf are skipped: MLflow plots break)."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k[:MAX_KEY], float(v), now, int(step)) for k, v in metrics.items()
             if isinstance(v, int | float) and math.isfinite(float(v))]
    for i in range(0, len(items), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=items[i:i + METRICS_PER_BATCH])


def log_artifacts(client: MlflowClient, run_id: str, paths: Iterable[str | Path],
                  artifact_path: str | None = None) -> None:
    """Files (or whole directories) into the run's artifact store."""
    for path in map(Path, paths):
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path)
        else:
            client.log_artifact(run_id, str(path), artifact_path)
