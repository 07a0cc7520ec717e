"""Loading typed configs from YAML files and environment variables, with errors that name fields.

Precedence (last wins): model defaults < YAML file < ``CLOUDRL__A__B=value``
environment variables < explicit command-line values. Nested keys use a
double underscore: ``CLOUDRL__SIM__ALPHA=3`` sets ``sim.alpha``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

ENV_PREFIX = "CLOUDRL__"
M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config that does not validate; the message names every offending field."""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from ``path``; a clear error for a missing file or a non-mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: top level must be a mapping, got {type(data).__name__}")
    return dict(data)


def env_overrides(environ: Mapping[str, str] | None = None,
                  prefix: str = ENV_PREFIX) -> dict[str, Any]:
    """Nested overrides from ``CLOUDRL__SIM__ALPHA=3``-style variables (values parsed as YAML)."""
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(prefix):
            continue
        path = [p.lower() for p in key[len(prefix):].split("__") if p]
        if not path:
            continue
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = yaml.safe_load(raw) if raw else raw
    return out


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "<root>"
        lines.append(f"  {field}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def build_config(model: type[M], *layers: Mapping[str, Any] | None, source: str = "config") -> M:
    """Validate ``model`` from merged layers; ConfigError names each bad field."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer:
            merged = deep_merge(merged, layer)
    try:
        return model.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None


def load_config(model: type[M], path: str | Path | None = None,
                overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> M:
    """Defaults < YAML at ``path`` < CLOUDRL__ env vars < ``overrides``."""
    file_layer = read_yaml(path) if path else {}
    source = str(path) if path else "defaults"
    return build_config(model, file_layer, env_overrides(environ), overrides, source=source)
