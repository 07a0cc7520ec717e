"""Model registry of the production loop: policies and reward models in MLflow's Model Registry.

Every trained policy checkpoint (``cloudrl-policy``) and reward model (``cloudrl-reward-model``)
is logged as the artifact ``checkpoint/`` of a run in the ``cloudrl-registry`` experiment, then
registered as a new version of its registered model with two JSON tags: ``eval_table`` (what
it scored, e.g. the validation table) and ``lineage`` (what it was trained from: feedback row
ids, seed ranges, the parent version). Aliases name the versions the loop moves between:
``champion`` (what the service serves) and ``challenger`` (a retrained candidate).

URIs, as MLflow writes them: ``models:/cloudrl-policy@champion`` (by alias) and
``models:/cloudrl-policy/3`` (by version). :func:`resolve` turns such a URI, or a plain path,
into a local directory: with the default SQLite store the artifacts are local files
(``mlartifacts/`` next to ``mlflow.db``), so it is the registered copy itself; a remote
artifact store is downloaded once into a cache directory.

Tracking URI: the ``tracking_uri`` argument, else ``$MLFLOW_TRACKING_URI``, else
``sqlite:///<abs cwd>/mlflow.db`` (``cloudrl.tracking.resolve_tracking_uri``).
Errors are :class:`RegistryError` with one line naming the model, version or alias.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudrl import tracking

POLICY_MODEL = "cloudrl-policy"
REWARD_MODEL = "cloudrl-reward-model"
EXPERIMENT = "cloudrl-registry"
CHAMPION, CHALLENGER = "champion", "challenger"
ARTIFACT = "checkpoint"
KINDS = {POLICY_MODEL: "policy", REWARD_MODEL: "reward_model"}
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))/?$")


class RegistryError(ValueError):
    """A registry URI, model, version or alias that does not exist or cannot be used."""


@dataclass(frozen=True)
class RegisteredVersion:
    """One registered version, read back: where its files are and what was recorded."""

    name: str
    version: int
    source: str
    run_id: str | None
    aliases: tuple[str, ...]
    eval_table: dict[str, Any]
    lineage: dict[str, Any]
    tags: dict[str, str]

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"


def is_registry_uri(spec: str) -> bool:
    return str(spec).startswith("models:/")


def parse_uri(uri: str) -> tuple[str, str | None, int | None]:
    """``models:/NAME@ALIAS`` -> (NAME, ALIAS, None); ``models:/NAME/3`` -> (NAME, None, 3)."""
    m = _URI.match(str(uri))
    if m is None:
        raise RegistryError(f"registry URI {uri!r}: expected models:/NAME@ALIAS or "
                            "models:/NAME/VERSION")
    version = m.group("version")
    return m.group("name"), m.group("alias"), int(version) if version is not None else None


def _client(tracking_uri: str | None):
    return tracking.make_client(tracking_uri)


def _json_tag(value: Mapping[str, Any], what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False, default=_plain)
    except (TypeError, ValueError) as e:
        raise RegistryError(f"{what}: not JSON-serializable ({e})") from None


def _plain(value: Any) -> Any:
    """numpy scalars/arrays and paths in an eval table or lineage, as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def _numeric_metrics(table: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            out.update(_numeric_metrics(value, f"{prefix}{key}."))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


def register(checkpoint_dir: str | Path, *, name: str, eval_table: Mapping[str, Any],
             lineage: Mapping[str, Any], tracking_uri: str | None = None,
             aliases: tuple[str, ...] = (), tags: Mapping[str, Any] | None = None) -> int:
    """Log ``checkpoint_dir`` as a run's ``checkpoint/`` artifact and register it as a new
    version of ``name`` (created when missing); returns the version number."""
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise RegistryError(f"checkpoint {path}: not a directory")
    eval_json = _json_tag(eval_table, "eval_table")
    lineage_json = _json_tag(lineage, "lineage")
    client = _client(tracking_uri)
    exp_id = tracking.get_or_create_experiment(client, EXPERIMENT)
    kind = KINDS.get(name, "model")
    run_id = tracking.start_run(client, exp_id, f"{name}:{path.name}",
                                {"cloudrl.kind": kind, "cloudrl.registered_model": name,
                                 "cloudrl.checkpoint": str(path.resolve()),
                                 **{str(k): v for k, v in (tags or {}).items()}})
    with tracking.finishing(client, run_id):
        client.log_artifacts(run_id, str(path), ARTIFACT)
        client.log_dict(run_id, dict(eval_table), "eval_table.json")
        client.log_dict(run_id, dict(lineage), "lineage.json")
        tracking.log_metrics(client, run_id, _numeric_metrics(eval_table))
        source = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{ARTIFACT}"
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        with contextlib.suppress(MlflowException):  # else created meanwhile by another writer
            client.create_registered_model(name, tags={"cloudrl.kind": kind})
    mv = client.create_model_version(
        name, source, run_id=run_id,
        tags={"eval_table": eval_json, "lineage": lineage_json, "cloudrl.kind": kind,
              "cloudrl.checkpoint_name": path.name,
              **{str(k): str(v) for k, v in (tags or {}).items()}},
        await_creation_for=0)
    version = int(mv.version)
    for alias in aliases:
        client.set_registered_model_alias(name, alias, str(version))
    return version


def register_policy(checkpoint_dir: str | Path, *, name: str = POLICY_MODEL,
                    eval_table: Mapping[str, Any], lineage: Mapping[str, Any],
                    tracking_uri: str | None = None, aliases: tuple[str, ...] = (),
                    tags: Mapping[str, Any] | None = None) -> int:
    """A policy checkpoint (``cloudrl train`` / retrain output) as a new registered version."""
    return register(checkpoint_dir, name=name, eval_table=eval_table, lineage=lineage,
                    tracking_uri=tracking_uri, aliases=aliases, tags=tags)


def register_reward_model(checkpoint_dir: str | Path, *, name: str = REWARD_MODEL,
                          eval_table: Mapping[str, Any], lineage: Mapping[str, Any],
                          tracking_uri: str | None = None, aliases: tuple[str, ...] = (),
                          tags: Mapping[str, Any] | None = None) -> int:
    """A reward-model checkpoint directory as a new registered version."""
    return register(checkpoint_dir, name=name, eval_table=eval_table, lineage=lineage,
                    tracking_uri=tracking_uri, aliases=aliases, tags=tags)


def set_alias(name: str, alias: str, version: int | str, *,
              tracking_uri: str | None = None) -> None:
    """Point ``models:/name@alias`` at ``version`` (moves it if it pointed elsewhere)."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        client.get_model_version(name, str(version))
        client.set_registered_model_alias(name, alias, str(version))
    except MlflowException as e:
        raise RegistryError(f"set alias {alias!r} of {name} to version {version}: "
                            f"{_first_line(e)}") from None


def delete_alias(name: str, alias: str, *, tracking_uri: str | None = None) -> None:
    """Remove ``models:/name@alias`` (nothing happens when it is not set)."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    with contextlib.suppress(MlflowException):
        client.delete_registered_model_alias(name, alias)


def _first_line(e: Exception) -> str:
    text = str(getattr(e, "message", None) or e)
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def _read(mv: Any) -> RegisteredVersion:
    tags = dict(mv.tags or {})
    return RegisteredVersion(
        name=mv.name, version=int(mv.version), source=mv.source, run_id=mv.run_id,
        aliases=tuple(getattr(mv, "aliases", ()) or ()),
        eval_table=json.loads(tags.get("eval_table", "{}")),
        lineage=json.loads(tags.get("lineage", "{}")), tags=tags)


def get_version(name: str, version_or_alias: int | str, *,
                tracking_uri: str | None = None) -> RegisteredVersion:
    """Version ``3``/``"3"`` or alias ``"champion"`` of ``name``, read back."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    ref = str(version_or_alias)
    try:
        mv = (client.get_model_version(name, ref) if ref.isdigit()
              else client.get_model_version_by_alias(name, ref))
    except MlflowException as e:
        what = f"version {ref}" if ref.isdigit() else f"alias {ref!r}"
        raise RegistryError(f"models:/{name}: no {what} ({_first_line(e)})") from None
    return _read(mv)


def lookup(uri: str, *, tracking_uri: str | None = None) -> RegisteredVersion:
    """The registered version a ``models:/`` URI names."""
    name, alias, version = parse_uri(uri)
    return get_version(name, alias if alias is not None else int(version),  # type: ignore[arg-type]
                       tracking_uri=tracking_uri)


def versions(name: str, *, tracking_uri: str | None = None) -> list[RegisteredVersion]:
    """Every version of ``name``, oldest first ([] when the model is not registered)."""
    from dataclasses import replace

    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        aliases = dict(client.get_registered_model(name).aliases or {})
    except MlflowException:
        return []
    found = sorted((_read(mv) for mv in client.search_model_versions(f"name = '{name}'")),
                   key=lambda v: v.version)
    return [replace(v, aliases=tuple(sorted(a for a, ver in aliases.items()
                                            if int(ver) == v.version))) for v in found]


def alias_version(name: str, alias: str, *, tracking_uri: str | None = None) -> int | None:
    """The version ``alias`` points at, or None when it is not set."""
    try:
        return get_version(name, alias, tracking_uri=tracking_uri).version
    except RegistryError:
        return None


def _local_path(source: str) -> Path | None:
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "" and source:
        return Path(source)
    return None


def resolve(uri_or_path: str | Path, *, tracking_uri: str | None = None,
            cache_dir: str | Path | None = None) -> Path:
    """A local directory for a ``models:/`` URI (by alias or version) or a plain path.

    A plain path is returned as given (the caller checks what it is). A registry URI is
    looked up now (an alias follows its latest move); local artifacts are used in place,
    remote ones are downloaded into ``cache_dir/<name>/<version>`` (default
    ``~/.cache/cloudrl/registry``) once."""
    spec = str(uri_or_path)
    if not is_registry_uri(spec):
        return Path(spec)
    mv = lookup(spec, tracking_uri=tracking_uri)
    local = _local_path(mv.source)
    if local is not None:
        if not local.is_dir():
            raise RegistryError(f"{spec} (version {mv.version}): its files {local} are missing")
        return local
    cache = Path(cache_dir or Path.home() / ".cache" / "cloudrl" / "registry")
    dst = cache / mv.name / str(mv.version)
    if (dst / ARTIFACT).is_dir():
        return dst / ARTIFACT
    import mlflow.artifacts

    dst.mkdir(parents=True, exist_ok=True)
    try:
        out = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(dst),
                                                  tracking_uri=tracking.resolve_tracking_uri(
                                                      tracking_uri))
    except Exception as e:  # noqa: BLE001 - any store error: one line naming the URI
        raise RegistryError(f"{spec} (version {mv.version}): cannot download {mv.source} "
                            f"({_first_line(e)})") from None
    return Path(out)


__all__ = ["CHALLENGER", "CHAMPION", "POLICY_MODEL", "REWARD_MODEL", "RegisteredVersion",
           "RegistryError", "alias_version", "delete_alias", "get_version",
           "is_registry_uri", "lookup", "parse_uri", "register", "register_policy",
           "register_reward_model", "resolve", "set_alias", "versions"]
