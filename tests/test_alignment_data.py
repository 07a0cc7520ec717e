"""Alignment data: the pair dataset contract, demonstrations, the teacher, operator pairs."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.alignment.preferences import (
    PAIR_SCHEMA,
    PairDataError,
    Segment,
    pair_files,
    pair_row,
    read_pairs,
    write_pairs,
)

# ----------------------------------------------------------------------------- pair schema

T, N, K, M, FS, FJ, A = 4, 3, 2, 5, 6, 7, 2


def _segment(rng: np.random.Generator, seed: int = 0, start: int = 0, **stats) -> Segment:
    return Segment(
        macro=rng.normal(size=(T, M)).astype(np.float32),
        servers=rng.normal(size=(T, N, FS)).astype(np.float32),
        jobs=rng.normal(size=(T, K, FJ)).astype(np.float32),
        actions=rng.integers(0, 4, size=(T, A)),
        episode_seed=seed, start=start, policy="ffd", stats=stats)


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    labels = [1.0, 0.0, 0.5]
    return [pair_row(f"p{i}", "teacher", labels[i % 3], _segment(rng, i, 2 * i, overload=1.0),
                     _segment(rng, i + 100, 3 * i)) for i in range(n)]


def test_pair_round_trip_keeps_values_and_shapes(tmp_path):
    rows = _rows(5)
    paths = write_pairs(rows, tmp_path / "pairs", rows_per_file=2)
    assert len(paths) == 3 and pair_files(tmp_path / "pairs") == sorted(paths)
    data = read_pairs(tmp_path / "pairs")
    assert len(data) == 5
    np.testing.assert_array_equal(data.label, [1.0, 0.0, 0.5, 1.0, 0.0])
    assert data.obs["a"]["servers"].shape == (5, T, N, FS)
    assert data.obs["b"]["actions"].shape == (5, T, A)
    assert data.obs["a"]["macro"].dtype == np.float32
    np.testing.assert_array_equal(data.obs["b"]["jobs"][3], rows[3]["b_jobs"].reshape(T, K, FJ))
    np.testing.assert_array_equal(data.obs["a"]["actions"][4],
                                  rows[4]["a_actions"].reshape(T, A))
    assert data.meta["pair_id"].tolist() == [f"p{i}" for i in range(5)]
    assert data.meta["b_episode_seed"].tolist() == [100, 101, 102, 103, 104]
    assert data.meta["a_overload"].tolist() == [1.0] * 5
    assert np.isnan(data.meta["b_overload"]).all()   # unknown statistics are NaN
    assert data.shape == {"segment_length": T, "n_servers": N, "k_slots": K, "macro_dim": M,
                          "server_dim": FS, "job_dim": FJ, "action_dim": A}
    assert pq.read_schema(paths[0]).remove_metadata().equals(PAIR_SCHEMA)


def test_pair_dataset_reads_with_ray_data(tmp_path, ray_session):
    from cloudrl.alignment.preferences import pairs_dataset

    write_pairs(_rows(4), tmp_path, rows_per_file=3)
    ds = pairs_dataset(tmp_path)
    assert ds.count() == 4
    rows = sorted(ds.take_all(), key=lambda r: r["pair_id"])
    assert [r["label"] for r in rows] == [1.0, 0.0, 0.5, 1.0]
    assert len(rows[0]["a_servers"]) == T * N * FS


def _write_raw(tmp_path, rows, name="bad.parquet"):
    table = pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)
    path = tmp_path / name
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize(("row", "column", "value", "message"), [
    (2, "label", 0.7, "is not 0, 0.5 or 1"),
    (1, "label", math.nan, "is not 0, 0.5 or 1"),
    (3, "source", "robot", "is not one of"),
    (0, "a_servers", "short", "expected T x n_servers x server_dim = 72"),
    (2, "b_macro", "nan", "non-finite value"),
    (1, "a_actions", "negative", "negative action"),
    (3, "segment_length", 0, "0 < 1"),
    (2, "b_energy_kwh", math.inf, "use NaN for unknown"),
    (1, "pair_id", "p0", "duplicate of row 0"),
])
def test_malformed_row_names_file_row_and_field(tmp_path, row, column, value, message):
    rows = _rows(4)
    if value == "short":
        rows[row][column] = rows[row][column][:-1]
    elif value == "nan":
        rows[row][column] = rows[row][column].copy()
        rows[row][column][7] = np.nan
    elif value == "negative":
        rows[row][column] = rows[row][column].copy()
        rows[row][column][-1] = -1
    else:
        rows[row][column] = value
    path = _write_raw(tmp_path, rows)
    with pytest.raises(PairDataError) as err:
        read_pairs(tmp_path)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: row {row}: field {column}: ")
    assert message in text
    # the writer refuses the same rows before anything is written
    with pytest.raises(PairDataError, match=f"row {row}: field {column}"):
        write_pairs(rows, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_soft_labels_only_when_allowed(tmp_path):
    rows = _rows(3)
    rows[1]["label"] = 0.8
    write_pairs(rows, tmp_path, soft_labels=True)
    assert read_pairs(tmp_path, soft_labels=True).label[1] == 0.8
    with pytest.raises(PairDataError, match="row 1: field label"):
        read_pairs(tmp_path)
    rows[1]["label"] = 1.2
    with pytest.raises(PairDataError, match=r"1.2 is not a probability in \[0, 1\]"):
        write_pairs(rows, tmp_path / "x", soft_labels=True)


def test_missing_column_and_mixed_shapes_are_errors(tmp_path):
    table = pa.Table.from_pylist(_rows(2), schema=PAIR_SCHEMA).drop_columns(["b_jobs"])
    pq.write_table(table, tmp_path / "a.parquet")
    with pytest.raises(PairDataError, match=r"a.parquet: schema: field b_jobs: missing column"):
        read_pairs(tmp_path)
    (tmp_path / "a.parquet").unlink()
    write_pairs(_rows(2), tmp_path, prefix="first")
    other = Segment(macro=np.zeros((T + 1, M)), servers=np.zeros((T + 1, N, FS)),
                    jobs=np.zeros((T + 1, K, FJ)), actions=np.zeros((T + 1, A), dtype=int))
    write_pairs([pair_row("q", "operator", 0.5, other, other)], tmp_path, prefix="second")
    with pytest.raises(PairDataError, match=r"second-.*: row 0: field segment_length: 5 differs"):
        read_pairs(tmp_path)


def test_empty_directory_is_an_error(tmp_path):
    with pytest.raises(PairDataError, match="no .parquet files"):
        read_pairs(tmp_path)


@settings(max_examples=25, deadline=None)
@given(labels=st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=6),
       t=st.integers(1, 5))
def test_round_trip_property(tmp_path_factory, labels, t):
    rng = np.random.default_rng(len(labels) * 10 + t)
    rows = []
    for i, label in enumerate(labels):
        segs = [Segment(macro=rng.normal(size=(t, 2)), servers=rng.normal(size=(t, 3, 1)),
                        jobs=rng.normal(size=(t, 1, 2)), actions=rng.integers(0, 9, size=t))
                for _ in range(2)]
        rows.append(pair_row(f"id{i}", "operator", label, *segs))
    out = tmp_path_factory.mktemp("prop")
    write_pairs(rows, out)
    data = read_pairs(out)
    np.testing.assert_array_equal(data.label, labels)
    assert data.obs["a"]["actions"].shape == (len(labels), t, 1)
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(data.obs["b"]["servers"][i].ravel(), row["b_servers"])
