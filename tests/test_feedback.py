"""Feedback store: canonical dedup, all-or-nothing batches, persistence, export CLI."""

from __future__ import annotations

import json
import sqlite3

import pytest

from cloudrl.cli import main
from cloudrl.feedback import FeedbackStore, canonical_pair

A = {"trajectory_id": "episode-17"}
B = {"trajectory": {"steps": [{"state": {"servers": [{"tier": "standard"}]}, "action": [1, 2]}]}}
C = {"trajectory_id": "episode-18"}


def test_same_judgement_in_either_order_is_one_row(tmp_path):
    store = FeedbackStore(tmp_path / "fb.db")
    ids, dup = store.add_pairs([{"a": A, "b": B, "preferred": "a", "operator": "ann"}])
    assert len(ids) == 1 and dup == 0
    ids, dup = store.add_pairs([{"a": B, "b": A, "preferred": "b", "operator": "bob"},
                                {"a": A, "b": C, "preferred": "equal"},
                                {"a": C, "b": A, "preferred": "equal"}])
    assert len(ids) == 1 and dup == 2
    assert store.count() == 2
    rows = list(store.pairs())
    assert rows[0]["preferred"] == "a" and rows[0]["a"] == A and rows[0]["b"] == B
    assert rows[0]["operator"] == "ann"  # the first submission is the one kept


def test_opposite_judgements_are_different_rows():
    assert canonical_pair(A, B, "a") != canonical_pair(A, B, "b")
    assert canonical_pair(A, B, "equal") == canonical_pair(B, A, "equal")
    with pytest.raises(ValueError, match="preferred"):
        canonical_pair(A, B, "maybe")


def test_a_batch_with_a_bad_pair_stores_nothing(tmp_path):
    store = FeedbackStore(tmp_path / "fb.db")
    with pytest.raises(ValueError):
        store.add_pairs([{"a": A, "b": B, "preferred": "a"},
                         {"a": A, "b": {"x": float("nan")}, "preferred": "a"}])
    assert store.count() == 0


def test_store_is_wal_and_survives_reopen_and_exports(tmp_path, capsys):
    db = tmp_path / "fb.db"
    store = FeedbackStore(db)
    store.add_pairs([{"a": A, "b": B, "preferred": "b"}], policy_version="v3")
    store.close()
    mode = sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    assert FeedbackStore(db).count() == 1
    out = tmp_path / "pairs.jsonl"
    assert main(["feedback", "export", "--db", str(db), "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 1
    assert lines[0]["a"] == B and lines[0]["b"] == A and lines[0]["preferred"] == "a"
    assert lines[0]["policy_version"] == "v3"
    assert json.loads(capsys.readouterr().out)["pairs"] == 1


def test_export_of_a_missing_database_is_an_error(tmp_path, capsys):
    assert main(["feedback", "export", "--db", str(tmp_path / "none.db"),
                 "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
