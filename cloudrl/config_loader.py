"""Loading typed configs from YAML files and environment variables, with errors that name fields.

Precedence (last wins): model defaults < YAML file < ``CLOUDRL__A__B=value``
environment variables < explicit command-line values. Nested keys use a
double underscore: ``CLOUDRL__SIM__ALPHA=3`` sets ``sim.alpha``.

An invalid config is one line naming each bad field, its value and where it came
from: ``invalid config (env CLOUDRL__ENV__SIM__ALPHA): env.sim.alpha: ...``. Every
float must be finite, in typed fields and in free-form dicts such as ``hparams``.
"""

from __future__ import annotations

import math
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
        raise ConfigError(f"{p}: invalid YAML{_yaml_where(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: top level must be a mapping, got {type(data).__name__}")
    return dict(data)


def _yaml_where(err: yaml.YAMLError) -> str:
    """`` at line L, column C: problem`` of a YAML error, on one line."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{where}: {problem}"


def _env_layer(environ: Mapping[str, str] | None, prefix: str
               ) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Overrides from ``CLOUDRL__...`` variables and, per field path, the variable that set it."""
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    names: dict[tuple[str, ...], str] = {}
    for key, raw in sorted(environ.items()):
        if not key.startswith(prefix):
            continue
        path = [p.lower() for p in key[len(prefix):].split("__") if p]
        if not path:
            continue
        try:
            value = yaml.safe_load(raw) if raw else raw
        except yaml.YAMLError as e:
            raise ConfigError(f"invalid config (env {key}): not a YAML value"
                              f"{_yaml_where(e)}") from None
        node = out
        for part in path[:-1]:
            child = node.get(part)
            node[part] = child = child if isinstance(child, dict) else {}
            node = child
        node[path[-1]] = value
        names[tuple(path)] = key
    return out, names


def env_overrides(environ: Mapping[str, str] | None = None,
                  prefix: str = ENV_PREFIX) -> dict[str, Any]:
    """Nested overrides from ``CLOUDRL__SIM__ALPHA=3``-style variables (values parsed as YAML)."""
    return _env_layer(environ, prefix)[0]


# (label, field paths) of one config layer, e.g. ("env CLOUDRL__SIM__ALPHA", [("sim", "alpha")])
Sources = list[tuple[str, list[tuple[Any, ...]]]]


def _leaf_paths(layer: Mapping[str, Any] | None, prefix: tuple[Any, ...] = ()
                ) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for key, value in (layer or {}).items():
        if isinstance(value, Mapping):  # an empty mapping sets nothing
            out += _leaf_paths(value, (*prefix, key))
        else:
            out.append((*prefix, key))
    return out


def _touches(path: tuple[Any, ...], loc: tuple[Any, ...]) -> bool:
    """Whether a value given at ``path`` can be what failed at ``loc``.

    pydantic's ``loc`` may hold extra parts (a union tag such as ``poisson``, a list index)
    or stop above the path (a model-level check); ``path`` must match it part for part
    otherwise.
    """
    if not path or not loc or path[0] != loc[0]:
        return False
    i = 0
    for part in loc:
        if i < len(path) and part == path[i]:
            i += 1
    return i == len(path) or loc == path[:len(loc)]


def _source_of(loc: tuple[Any, ...], sources: Sources, default: str) -> str:
    for label, paths in sources:
        if any(_touches(path, loc) for path in paths):
            return label
    return default


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _one_error(loc: tuple[Any, ...], msg: str, value: Any) -> str:
    field = ".".join(str(x) for x in loc) or "<root>"
    return f"{field}: {msg} (got {_short(value)})"


def _join(problems: list[tuple[str, str]], default: str) -> str:
    """``invalid config (source): a: ...; b: ...`` -- one line, each source named."""
    labels = list(dict.fromkeys(label for label, _ in problems))
    if len(labels) == 1:
        return f"invalid config ({labels[0]}): " + "; ".join(text for _, text in problems)
    return "invalid config: " + "; ".join(f"{text} [{label}]" for label, text in problems)


def format_validation_error(err: ValidationError, source: str,
                            sources: Sources | None = None) -> str:
    """One line naming every bad field, its value, and where it came from.

    ``source`` labels fields no layer in ``sources`` set (a file, or the defaults).
    """
    problems = [(_source_of(tuple(e["loc"]), sources or [], source),
                 _one_error(tuple(e["loc"]), e["msg"], e.get("input")))
                for e in err.errors()]
    return _join(problems or [(source, "<root>: invalid")], source)


def _non_finite(value: Any, loc: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], float]]:
    """Every inf/nan float in a validated config, with its field path (dict fields included)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(loc, value)]
    if isinstance(value, BaseModel):
        return [bad for name in type(value).model_fields
                for bad in _non_finite(getattr(value, name), (*loc, name))]
    if isinstance(value, Mapping):
        return [bad for k, v in value.items() for bad in _non_finite(v, (*loc, k))]
    if isinstance(value, (list, tuple)):
        return [bad for i, v in enumerate(value) for bad in _non_finite(v, (*loc, i))]
    return []


def check_finite(cfg: BaseModel, source: str = "config", sources: Sources | None = None) -> None:
    """ConfigError naming every inf/nan float of ``cfg``, free-form dicts (hparams) included."""
    bad = _non_finite(cfg)
    if bad:
        raise ConfigError(_join([(_source_of(loc, sources or [], source),
                                  _one_error(loc, "Input should be a finite number", v))
                                 for loc, v in bad], source))


def build_config(model: type[M], *layers: Mapping[str, Any] | None, source: str = "config",
                 sources: Sources | None = None) -> M:
    """Validate ``model`` from merged layers; ConfigError names each bad field.

    ``sources`` (highest precedence first) say which layer set which field paths, so an
    error names the environment variable or file the bad value came from.
    """
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer:
            merged = deep_merge(merged, layer)
    try:
        cfg = model.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, sources)) from None
    check_finite(cfg, source, sources)
    return cfg


def load_config(model: type[M], path: str | Path | None = None,
                overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> M:
    """Defaults < YAML at ``path`` < CLOUDRL__ env vars < ``overrides``."""
    file_layer = read_yaml(path) if path else {}
    env_layer, env_names = _env_layer(environ, ENV_PREFIX)
    source = str(path) if path else "defaults"
    sources: Sources = [("command line", _leaf_paths(overrides))]
    sources += [(f"env {name}", [p]) for p, name in env_names.items()]
    if path:
        sources.append((str(path), _leaf_paths(file_layer)))
    return build_config(model, file_layer, env_layer, overrides, source=source, sources=sources)
