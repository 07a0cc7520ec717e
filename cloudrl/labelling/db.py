"""The labelling store: one SQLite file in WAL mode, its schema, and how it is opened.

Every write is one ``BEGIN IMMEDIATE`` transaction: once a label is acknowledged its
transaction is in the write-ahead log, so a ``kill -9`` of the server does not lose it.
The service runs ``synchronous=NORMAL`` by default (the log reaches the disk at
checkpoints: a power cut may lose the last labels, never consistency) and ``FULL`` on
request (every commit synced: also power-cut safe, a few ms more per label). Readers
never block the writer.

Tables: ``meta`` (settings), ``operators`` (name, sha256 of the token, admin flag),
``segments`` (what a segment shows, as JSON, and its observations, as a compressed
``npz`` blob), ``pairs`` (two segments, stratum, priority, optional gold answer, k,
how many operators hold or labelled it), ``assignments`` (a pair shown to an operator;
unique per pair and operator), ``labels`` (one per assignment: choice in the pair's own
orientation, note, time, time taken, gold correctness, flag) and ``strata`` (how many
tasks each stratum has served, for the stratified pick).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA_VERSION = "1"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS operators (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    token_hash TEXT NOT NULL UNIQUE,
    is_admin INTEGER NOT NULL DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    seg_key TEXT NOT NULL UNIQUE,
    view_json TEXT NOT NULL,
    obs BLOB,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS pairs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pair_key TEXT NOT NULL UNIQUE,
    a_seg INTEGER NOT NULL REFERENCES segments(id),
    b_seg INTEGER NOT NULL REFERENCES segments(id),
    stratum TEXT NOT NULL,
    source TEXT NOT NULL,
    priority REAL NOT NULL DEFAULT 0.5,
    gold TEXT CHECK (gold IN ('a', 'b', 'equal')),
    k INTEGER NOT NULL CHECK (k >= 1),
    taken INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS pairs_open ON pairs (stratum, priority DESC, id)
    WHERE gold IS NULL AND taken < k;
CREATE INDEX IF NOT EXISTS pairs_gold ON pairs (id) WHERE gold IS NOT NULL;
CREATE TABLE IF NOT EXISTS assignments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pair_id INTEGER NOT NULL REFERENCES pairs(id),
    operator_id INTEGER NOT NULL REFERENCES operators(id),
    issued_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('open', 'done', 'expired')),
    swapped INTEGER NOT NULL DEFAULT 0,
    is_gold INTEGER NOT NULL DEFAULT 0,
    UNIQUE (pair_id, operator_id)
);
CREATE INDEX IF NOT EXISTS assignments_open ON assignments (state, expires_at);
CREATE INDEX IF NOT EXISTS assignments_operator ON assignments (operator_id, state);
CREATE TABLE IF NOT EXISTS labels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    assignment_id INTEGER NOT NULL UNIQUE REFERENCES assignments(id),
    pair_id INTEGER NOT NULL REFERENCES pairs(id),
    operator_id INTEGER NOT NULL REFERENCES operators(id),
    choice TEXT NOT NULL CHECK (choice IN ('a', 'b', 'equal', 'skip')),
    note TEXT,
    created_at REAL NOT NULL,
    time_taken_ms INTEGER NOT NULL,
    is_gold INTEGER NOT NULL DEFAULT 0,
    gold_correct INTEGER,
    flagged INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS labels_pair ON labels (pair_id);
CREATE INDEX IF NOT EXISTS labels_operator ON labels (operator_id);
CREATE TABLE IF NOT EXISTS strata (name TEXT PRIMARY KEY, served INTEGER NOT NULL DEFAULT 0);
"""


class DatabaseError(ValueError):
    """The labelling database cannot be opened or is not one; the message says which file."""


SYNC_MODES = ("full", "normal")


def connect(path: str | Path, *, create: bool = True, schema: bool = True,
            sync: str = "full") -> sqlite3.Connection:
    """A connection in WAL mode (``synchronous`` = ``sync``), the schema in place.

    ``create=False`` refuses a file that does not exist yet; ``schema=False`` skips the
    schema statements (a reader of a store that another connection already set up).
    ``sync="normal"`` syncs the log to disk at checkpoints only: a committed label still
    survives a killed server (it is in the operating system's file cache), but not a
    power cut or kernel crash; ``"full"`` (default) syncs every commit.
    Any failure (a directory, a file that is not SQLite, no permission) is one
    :class:`DatabaseError` line.
    """
    p = Path(path)
    if p.is_dir():
        raise DatabaseError(f"labelling database {p}: is a directory")
    if not create and not p.is_file():
        raise DatabaseError(f"labelling database {p}: no such file (create it with "
                            "'cloudrl label operators add NAME --db PATH')")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(p), timeout=30.0, check_same_thread=False,
                               isolation_level=None)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"journal_mode is {mode}, not wal")
        if sync not in SYNC_MODES:
            raise ValueError(f"sync: {sync!r} is not one of {', '.join(SYNC_MODES)}")
        conn.execute(f"PRAGMA synchronous={sync.upper()}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=30000")
        if schema:
            conn.executescript(SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES "
                         "('schema_version', ?)", (SCHEMA_VERSION,))
    except (sqlite3.DatabaseError, OSError) as exc:
        raise DatabaseError(f"labelling database {p}: cannot be opened: {exc}") from None
    return conn
