"""The preference-pair dataset: one schema for teacher and operator pairs, on disk as parquet.

A dataset is a directory of parquet files (``ray.data.read_parquet(dir)`` reads it), one
row per ranked pair of fixed-length trajectory segments A and B:

* ``pair_id`` (str), ``source`` ("teacher" | "operator"), ``label`` (float64, the
  probability that A is preferred: 1.0, 0.0, or 0.5 for a tie; any value in [0, 1]
  when soft labels are allowed), ``segment_length`` T (steps, i.e. actions, per side);
* ``obs_steps`` O, the observations per side: T+1 for transition segments (the
  observation the first action was taken on, then the one after each of the T steps;
  what teacher pairs and operator exports hold, so a reward r(s, s') sees every
  transition) or T for state segments (only the T post-step observations: files written
  before the column existed, which read as O = T, and hand-made state pairs);
* shape columns ``n_servers`` N, ``k_slots`` K, ``macro_dim`` M, ``server_dim`` Fs,
  ``job_dim`` Fj, ``action_dim`` A (1 for the flat interface, the branch count for the
  branching one);
* per side ``s`` in {a, b}: ``s_macro`` (O*M float32), ``s_servers`` (O*N*Fs float32),
  ``s_jobs`` (O*K*Fj float32), ``s_actions`` (T*A int64, the env actions), flattened in
  C order; provenance ``s_episode_seed``, ``s_start``, ``s_policy`` (may be "");
  teacher statistics ``s_sla_violations``, ``s_overload``, ``s_slowdown_spread``,
  ``s_energy_kwh`` (float64, NaN when unknown).

:func:`write_pairs` validates before it writes; :func:`read_pairs` validates what it
reads and returns stacked numpy arrays (:class:`PairArrays`). A malformed row raises
:class:`PairDataError` (a ``ValueError``) whose one-line message names the file, the
row index in that file and the field.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SOURCES = ("teacher", "operator")
SIDES = ("a", "b")
SHAPE_FIELDS = ("n_servers", "k_slots", "macro_dim", "server_dim", "job_dim", "action_dim")
STAT_FIELDS = ("sla_violations", "overload", "slowdown_spread", "energy_kwh")
HARD_LABELS = (0.0, 0.5, 1.0)
OBS_PARTS = ("macro", "servers", "jobs")


def _side_fields(s: str) -> list[pa.Field]:
    return [
        pa.field(f"{s}_macro", pa.list_(pa.float32()), nullable=False),
        pa.field(f"{s}_servers", pa.list_(pa.float32()), nullable=False),
        pa.field(f"{s}_jobs", pa.list_(pa.float32()), nullable=False),
        pa.field(f"{s}_actions", pa.list_(pa.int64()), nullable=False),
        pa.field(f"{s}_episode_seed", pa.int64(), nullable=False),
        pa.field(f"{s}_start", pa.int64(), nullable=False),
        pa.field(f"{s}_policy", pa.string(), nullable=False),
        *[pa.field(f"{s}_{name}", pa.float64(), nullable=False) for name in STAT_FIELDS],
    ]


PAIR_SCHEMA = pa.schema([
    pa.field("pair_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("label", pa.float64(), nullable=False),
    pa.field("segment_length", pa.int64(), nullable=False),
    pa.field("obs_steps", pa.int64(), nullable=False),
    *[pa.field(name, pa.int64(), nullable=False) for name in SHAPE_FIELDS],
    *_side_fields("a"),
    *_side_fields("b"),
])

# list column -> (its step count column, the shape columns whose product with it gives
# its length per row)
_LIST_DIMS = {"macro": ("obs_steps", "macro_dim"),
              "servers": ("obs_steps", "n_servers", "server_dim"),
              "jobs": ("obs_steps", "k_slots", "job_dim"),
              "actions": ("segment_length", "action_dim")}


class PairDataError(ValueError):
    """A malformed pair row or file; the message names the file, the row and the field."""


@dataclass
class Segment:
    """One side of a pair: T consecutive steps, their actions and observations.

    Transition segments (teacher pairs, operator exports) hold T+1 observations:
    ``actions[t]`` was taken on ``macro[t]`` and led to ``macro[t + 1]``; the reward
    model sums r(s_t, s_{t+1}) over the T transitions. State segments hold T: the
    observations after each step (``actions[t]`` led to ``macro[t]``), summed as r(s).

    ``macro`` (O, M), ``servers`` (O, N, Fs), ``jobs`` (O, K, Fj), ``actions`` (T, A),
    O = T+1 or T. ``stats`` holds the teacher statistics (missing ones are written as NaN).
    """

    macro: np.ndarray
    servers: np.ndarray
    jobs: np.ndarray
    actions: np.ndarray
    episode_seed: int = -1
    start: int = 0
    policy: str = ""
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def length(self) -> int:
        """T, the number of steps (actions)."""
        return int(np.asarray(self.actions).shape[0])

    @property
    def obs_steps(self) -> int:
        """O, the number of observations (T+1 for a transition segment, T for a state one)."""
        return int(np.asarray(self.macro).shape[0])


def pair_row(pair_id: str, source: str, label: float, a: Segment, b: Segment) -> dict[str, Any]:
    """One dataset row from two segments of the same shape (checked when written)."""
    actions = np.asarray(a.actions)
    row: dict[str, Any] = {
        "pair_id": str(pair_id), "source": source, "label": float(label),
        "segment_length": a.length, "obs_steps": a.obs_steps,
        "n_servers": int(a.servers.shape[1]), "k_slots": int(a.jobs.shape[1]),
        "macro_dim": int(a.macro.shape[1]), "server_dim": int(a.servers.shape[2]),
        "job_dim": int(a.jobs.shape[2]),
        "action_dim": int(actions.shape[1]) if actions.ndim == 2 else 1,
    }
    for s, seg in (("a", a), ("b", b)):
        row[f"{s}_macro"] = np.asarray(seg.macro, dtype=np.float32).ravel()
        row[f"{s}_servers"] = np.asarray(seg.servers, dtype=np.float32).ravel()
        row[f"{s}_jobs"] = np.asarray(seg.jobs, dtype=np.float32).ravel()
        row[f"{s}_actions"] = np.asarray(seg.actions, dtype=np.int64).ravel()
        row[f"{s}_episode_seed"] = int(seg.episode_seed)
        row[f"{s}_start"] = int(seg.start)
        row[f"{s}_policy"] = str(seg.policy)
        for name in STAT_FIELDS:
            row[f"{s}_{name}"] = float(seg.stats.get(name, math.nan))
    return row


# ----------------------------------------------------------------------------- validation


def _fail(where: str, row: int | None, name: str, problem: str) -> PairDataError:
    at = f"row {row}" if row is not None else "schema"
    return PairDataError(f"{where}: {at}: field {name}: {problem}")


def _conform(table: pa.Table, where: str) -> pa.Table:
    """Select and cast the schema's columns; a missing or uncastable column is an error."""
    columns = []
    if "obs_steps" not in table.column_names and "segment_length" in table.column_names:
        # written before transition segments: the T post-step observations per side
        table = table.append_column("obs_steps", table.column("segment_length"))
    for f in PAIR_SCHEMA:
        if f.name not in table.column_names:
            raise _fail(where, None, f.name, "missing column")
        col = table.column(f.name)
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise _fail(where, row, f.name, "null value")
        if not col.type.equals(f.type):
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise _fail(where, None, f.name,
                            f"type {col.type} does not convert to {f.type}") from exc
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=PAIR_SCHEMA)


def _first_bad(mask: np.ndarray) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if bad.size else None


def validate_table(table: pa.Table, where: str, *, soft_labels: bool = False) -> pa.Table:
    """The table conformed to :data:`PAIR_SCHEMA`; :class:`PairDataError` at the first bad row."""
    table = _conform(table, where)
    col = {name: table.column(name) for name in table.column_names}

    def num(name: str) -> np.ndarray:
        return col[name].to_numpy()

    ids = col["pair_id"].to_pylist()
    if (row := _first_bad(np.array([not s for s in ids], dtype=bool))) is not None:
        raise _fail(where, row, "pair_id", "empty")
    seen: dict[str, int] = {}
    for i, pid in enumerate(ids):
        if pid in seen:
            raise _fail(where, i, "pair_id", f"duplicate of row {seen[pid]} ({pid!r})")
        seen[pid] = i
    sources = col["source"].to_pylist()
    for i, s in enumerate(sources):
        if s not in SOURCES:
            raise _fail(where, i, "source", f"{s!r} is not one of {', '.join(SOURCES)}")
    label = num("label")
    if soft_labels:
        bad = ~np.isfinite(label) | (label < 0.0) | (label > 1.0)
        expect = "a probability in [0, 1]"
    else:
        bad = ~np.isin(label, HARD_LABELS)
        expect = "0, 0.5 or 1"
    if (row := _first_bad(bad)) is not None:
        raise _fail(where, row, "label", f"{float(label[row])!r} is not {expect}")
    t = num("segment_length")
    if (row := _first_bad(t < 1)) is not None:
        raise _fail(where, row, "segment_length", f"{t[row]} < 1")
    o = num("obs_steps")
    if (row := _first_bad((o != t) & (o != t + 1))) is not None:
        raise _fail(where, row, "obs_steps", f"{o[row]} observations for {t[row]} steps "
                    "(expected T+1 for a transition segment or T for a state segment)")
    shapes = {name: num(name) for name in ("segment_length", "obs_steps", *SHAPE_FIELDS)}
    for name, values in shapes.items():
        if (row := _first_bad(values < 1)) is not None:
            raise _fail(where, row, name, f"{values[row]} < 1")
    for s in SIDES:
        for part, dims in _LIST_DIMS.items():
            name = f"{s}_{part}"
            expected = np.ones_like(t)
            for d in dims:
                expected = expected * shapes[d]
            lengths = pc.list_value_length(col[name]).to_numpy()
            if (row := _first_bad(lengths != expected)) is not None:
                shape = " x ".join(dims)
                raise _fail(where, row, name, f"{lengths[row]} values, expected {shape} = "
                            f"{expected[row]}")
            values = pc.list_flatten(col[name]).to_numpy()
            bad_values = ~np.isfinite(values) if part != "actions" else values < 0
            if bad_values.any():
                offsets = np.concatenate([[0], np.cumsum(lengths)])
                row = int(np.searchsorted(offsets, np.flatnonzero(bad_values)[0], side="right")) - 1
                what = "non-finite value" if part != "actions" else "negative action"
                raise _fail(where, row, name, what)
        for stat in STAT_FIELDS:
            name = f"{s}_{stat}"
            values = num(name)
            if (row := _first_bad(np.isinf(values))) is not None:
                raise _fail(where, row, name, f"{values[row]} (use NaN for unknown)")
        start = num(f"{s}_start")
        if (row := _first_bad(start < 0)) is not None:
            raise _fail(where, row, f"{s}_start", f"{start[row]} < 0")
    return table


# ----------------------------------------------------------------------------- writing


def _to_table(data: pa.Table | Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, Mapping):  # column-oriented: name -> list/array per row
        columns = {k: _column_values(v) for k, v in data.items()}
        return pa.table(columns)
    rows = list(data)
    names = [f.name for f in PAIR_SCHEMA]
    extra = {k for r in rows for k in r} - set(names)
    if extra:
        raise _fail("<rows>", None, sorted(extra)[0], "unknown column")
    columns = {}
    for f in PAIR_SCHEMA:
        values = [r.get(f.name) for r in rows]
        for i, v in enumerate(values):
            if v is None:
                raise _fail("<rows>", i, f.name, "missing")
        columns[f.name] = pa.array(_column_values(values), type=f.type)
    return pa.table(columns)


def _column_values(values: Any) -> Any:
    if isinstance(values, np.ndarray) and values.ndim > 1:
        return [np.ascontiguousarray(v).ravel() for v in values]
    if isinstance(values, list | tuple):
        return [np.asarray(v).ravel() if isinstance(v, np.ndarray) else v for v in values]
    return values


def write_pairs(data: pa.Table | Iterable[Mapping[str, Any]] | Mapping[str, Any],
                out_dir: str | Path, *, soft_labels: bool = False,
                rows_per_file: int = 1024, prefix: str = "pairs") -> list[Path]:
    """Validate ``data`` (rows, columns or a table) and write it as parquet files in ``out_dir``.

    Files are named ``{prefix}-{random}-{i:05d}.parquet`` so later writes add files next to
    earlier ones. Returns the written paths (none for no rows).
    """
    try:
        table = _to_table(data if isinstance(data, pa.Table | Mapping) else list(data))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise PairDataError(f"<rows>: schema: {str(exc).splitlines()[0]}") from exc
    table = validate_table(table, "<rows>", soft_labels=soft_labels)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    paths = []
    for i, start in enumerate(range(0, table.num_rows, max(1, rows_per_file))):
        path = out / f"{prefix}-{tag}-{i:05d}.parquet"
        pq.write_table(table.slice(start, rows_per_file), path)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- reading


def pair_files(path: str | Path) -> list[Path]:
    """The parquet files of a dataset (a directory, searched recursively, or one file)."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise PairDataError(f"{p}: no such file or directory")
    files = sorted(f for f in p.rglob("*.parquet") if f.is_file())
    if not files:
        raise PairDataError(f"{p}: no .parquet files")
    return files


@dataclass
class PairArrays:
    """A validated pair dataset as numpy arrays (every row shares T, N, K, M, Fs, Fj, A).

    ``obs[s]`` maps ``macro``/``servers``/``jobs``/``actions`` to arrays of shape
    (P, O, M), (P, O, N, Fs), (P, O, K, Fj), (P, T, A) for side ``s`` in {"a", "b"},
    O = ``shape["obs_steps"]`` (T+1: transition segments, T: state segments; the last T
    observations are the post-step states either way, :meth:`post_step_obs`);
    ``meta`` holds every scalar column (``pair_id``, ``source``, ``a_episode_seed``,
    ``a_sla_violations``, ...) as a 1-D array.
    """

    label: np.ndarray
    obs: dict[str, dict[str, np.ndarray]]
    meta: dict[str, np.ndarray]
    shape: dict[str, int]

    def __len__(self) -> int:
        return int(self.label.shape[0])

    @property
    def transitions(self) -> bool:
        """Whether the segments hold T+1 observations (every transition (s, s'))."""
        return int(self.shape.get("obs_steps", self.shape["segment_length"])) \
            == int(self.shape["segment_length"]) + 1

    def post_step_obs(self, side: str) -> dict[str, np.ndarray]:
        """Side ``side``'s T post-step observations ``{part: (P, T, ...)}`` in either layout."""
        t = int(self.shape["segment_length"])
        return {part: self.obs[side][part][:, -t:] for part in OBS_PARTS}


def read_table(path: str | Path, *, soft_labels: bool = False) -> pa.Table:
    """All files of the dataset, each validated, concatenated (pair_ids unique overall)."""
    tables = []
    seen: dict[str, str] = {}
    for f in pair_files(path):
        try:
            raw = pq.read_table(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise PairDataError(f"{f}: not a readable parquet file: "
                                f"{str(exc).splitlines()[0]}") from exc
        table = validate_table(raw, str(f), soft_labels=soft_labels)
        for i, pid in enumerate(table.column("pair_id").to_pylist()):
            if pid in seen:
                raise _fail(str(f), i, "pair_id", f"duplicate of a row in {seen[pid]} ({pid!r})")
            seen[pid] = str(f)
        tables.append((f, table))
    first_file, first = tables[0]
    ref = {name: int(first.column(name)[0].as_py()) if first.num_rows else None
           for name in ("segment_length", "obs_steps", *SHAPE_FIELDS)}
    for f, table in tables:
        for name, want in ref.items():
            if want is None:
                continue
            values = table.column(name).to_numpy()
            if (row := _first_bad(values != want)) is not None:
                raise _fail(str(f), row, name, f"{values[row]} differs from {want} "
                            f"(row 0 of {first_file}); one dataset has one shape")
    return pa.concat_tables([t for _, t in tables])


def read_pairs(path: str | Path, *, soft_labels: bool = False) -> PairArrays:
    """Read and validate a dataset into :class:`PairArrays`."""
    table = read_table(path, soft_labels=soft_labels)
    n = table.num_rows
    shape = {name: (int(table.column(name)[0].as_py()) if n else 0)
             for name in ("segment_length", "obs_steps", *SHAPE_FIELDS)}
    obs: dict[str, dict[str, np.ndarray]] = {}
    for s in SIDES:
        obs[s] = {}
        for part, dims in _LIST_DIMS.items():
            flat = pc.list_flatten(table.column(f"{s}_{part}")).to_numpy()
            obs[s][part] = flat.reshape((n, *(shape[d] for d in dims)))
    list_cols = {f"{s}_{p}" for s in SIDES for p in _LIST_DIMS}
    meta = {name: table.column(name).to_numpy(zero_copy_only=False)
            for name in table.column_names if name not in list_cols and name != "label"}
    return PairArrays(label=table.column("label").to_numpy(), obs=obs, meta=meta, shape=shape)


def first_state_segment_file(path: str | Path) -> tuple[Path, bool] | None:
    """The first file of a dataset whose segments hold T observations (state segments),
    and whether it lacks the ``obs_steps`` column (written before it existed); None when
    every file holds transition segments."""
    for f in pair_files(path):
        names = pq.read_schema(f).names
        if "obs_steps" not in names:
            return f, True
        cols = pq.read_table(f, columns=["segment_length", "obs_steps"])
        if (cols.column("obs_steps").to_numpy() == cols.column("segment_length").to_numpy()).any():
            return f, False
    return None


def pairs_dataset(path: str | Path, *, validate: bool = True, soft_labels: bool = False):
    """The dataset as a ``ray.data.Dataset`` (validated with :func:`read_table` first)."""
    import ray.data

    files = pair_files(path)
    if validate:
        read_table(path, soft_labels=soft_labels)
    return ray.data.read_parquet([str(f) for f in files])
