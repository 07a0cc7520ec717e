"""Operator feedback store: ranked trajectory pairs in SQLite (WAL), deduplicated.

The decision service writes pairs here (``POST /v1/feedback``); the preference-alignment
training reads them back (``FeedbackStore.pairs()`` or ``cloudrl feedback export``).
A pair is stored in canonical form: ``preferred`` is ``"a"`` or ``"equal"`` (a pair
given as "b preferred to a" is stored swapped), and an "equal" pair is ordered by its
trajectories' canonical JSON, so the same judgement submitted twice, in either order,
is one row. Operator name and note do not make a pair different.
A batch of pairs is written in one transaction: all or nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pair_key TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    preferred TEXT NOT NULL CHECK (preferred IN ('a', 'equal')),
    a_json TEXT NOT NULL,
    b_json TEXT NOT NULL,
    operator TEXT,
    note TEXT,
    policy_version TEXT
);
"""


def open_db(path: str | Path) -> sqlite3.Connection:
    """A connection in WAL mode (readers never block the writer), parent dirs created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), timeout=10.0, check_same_thread=False,
                           isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def canonical_pair(a: Any, b: Any, preferred: str) -> tuple[str, str, str]:
    """(a_json, b_json, preferred) with preferred in {"a", "equal"}."""
    a_json, b_json = _canonical(a), _canonical(b)
    if preferred == "b":
        return b_json, a_json, "a"
    if preferred == "equal" and b_json < a_json:
        return b_json, a_json, "equal"
    if preferred not in ("a", "equal"):
        raise ValueError(f"preferred must be 'a', 'b' or 'equal', got {preferred!r}")
    return a_json, b_json, preferred


class FeedbackStore:
    """Ranked pairs in one SQLite file; safe to share between threads of one process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._conn = open_db(self.path)
        self._conn.executescript(SCHEMA)

    def add_pairs(self, pairs: list[dict[str, Any]], policy_version: str | None = None
                  ) -> tuple[list[int], int]:
        """Store pairs (dicts with a, b, preferred, operator?, note?) in one transaction.

        Returns (ids of the stored rows, number of duplicates skipped)."""
        rows = []
        for pair in pairs:
            a_json, b_json, preferred = canonical_pair(pair["a"], pair["b"], pair["preferred"])
            key = hashlib.sha256(f"{preferred}\n{a_json}\n{b_json}".encode()).hexdigest()
            rows.append((key, a_json, b_json, preferred, pair.get("operator"), pair.get("note")))
        stored: list[int] = []
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for key, a_json, b_json, preferred, operator, note in rows:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO feedback (pair_key, created_at, preferred, a_json,"
                    " b_json, operator, note, policy_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, time.time(), preferred, a_json, b_json, operator, note,
                     policy_version))
                if cur.rowcount:
                    stored.append(int(cur.lastrowid))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return stored, len(rows) - len(stored)

    def count(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])

    def pairs(self) -> Iterator[dict[str, Any]]:
        """Every stored pair, oldest first, as plain dicts (trajectories parsed)."""
        cur = self._conn.execute(
            "SELECT id, created_at, preferred, a_json, b_json, operator, note, policy_version"
            " FROM feedback ORDER BY id")
        for row in cur:
            yield {"id": row[0], "created_at": row[1], "preferred": row[2],
                   "a": json.loads(row[3]), "b": json.loads(row[4]), "operator": row[5],
                   "note": row[6], "policy_version": row[7]}

    def close(self) -> None:
        self._conn.close()


def export_jsonl(db: str | Path, out: str | Path) -> int:
    """Write every pair of ``db`` as one JSON object per line; returns the count."""
    if not Path(db).is_file():
        raise FileNotFoundError(f"feedback database {db} does not exist")
    store = FeedbackStore(db)
    n = 0
    with open(out, "w") as f:
        for pair in store.pairs():
            f.write(json.dumps(pair) + "\n")
            n += 1
    store.close()
    return n
