"""The task queue: which pair an operator sees next, and what a label does to the queue.

* Each ordinary pair goes to ``k`` distinct operators (``pairs.k``, default 2): ``taken``
  counts the operators holding or having labelled it; an operator never gets the same
  pair twice (``UNIQUE (pair_id, operator_id)`` on assignments, kept after expiry).
* An assignment not labelled within ``assignment_timeout_s`` expires and its slot goes
  back to the queue; a reload before that shows the same assignment again. A late label
  for an expired assignment is still taken while the pair has a free slot.
* "Can't tell" (skip) is stored and frees the slot for another operator.
* Gold pairs (a known answer) are not limited to k: every operator sees each at most
  once, mixed in at random places: each block of ``1 / gold_rate`` consecutive tasks of
  an operator holds one gold slot at a random position (:func:`gold_slots`, seeded by the
  store's secret and the operator), so any task, the first one too, is gold with
  probability ``gold_rate`` and an operator's gold share stays within one task of
  ``gold_rate``. A gold slot with no gold pair left for the operator gets an ordinary
  pair.
* Ordinary pairs are picked stratified, then by priority: the stratum that has served
  the fewest tasks so far and still has a pair for this operator goes first (so no
  stratum starves), and inside it the pair with the highest priority (the reward
  model's uncertainty, :mod:`.active`), oldest first on ties.

All of it runs in one ``BEGIN IMMEDIATE`` transaction per call, under the caller's lock.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cloudrl.labelling.segments import SegmentRecord, pack_obs, stratum_of

CHOICES = ("a", "b", "equal", "skip")
FLIP = {"a": "b", "b": "a", "equal": "equal", "skip": "skip"}


@dataclass
class QueueConfig:
    """How tasks are handed out (defaults run)."""

    gold_rate: float = 0.1
    assignment_timeout_s: float = 600.0
    expire_every_s: float = 1.0


class TaskError(Exception):
    """A task request the service answers with a 4xx: ``status`` and one-line ``reason``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Tx:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any error)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


# ----------------------------------------------------------------------------- enqueue


@dataclass
class PairSpec:
    """A pair to enqueue: two segments, an optional gold answer (for side a vs b)."""

    a: SegmentRecord
    b: SegmentRecord
    source: str
    gold: str | None = None
    priority: float = 0.5
    stratum: str | None = None


def pair_key(a_key: str, b_key: str) -> tuple[str, bool]:
    """(key of the unordered pair, whether a/b were swapped to make it canonical)."""
    swapped = b_key < a_key
    first, second = (b_key, a_key) if swapped else (a_key, b_key)
    return hashlib.sha256(f"{first}\n{second}".encode()).hexdigest()[:32], swapped


def _segment_id(conn: sqlite3.Connection, seg: SegmentRecord, now: float) -> int:
    blob = pack_obs(seg.obs, seg.stats) if seg.obs is not None else None
    conn.execute("INSERT OR IGNORE INTO segments (seg_key, view_json, obs, created_at) "
                 "VALUES (?, ?, ?, ?)",
                 (seg.key, json.dumps(seg.view, separators=(",", ":"), allow_nan=False),
                  blob, now))
    return int(conn.execute("SELECT id FROM segments WHERE seg_key = ?",
                            (seg.key,)).fetchone()[0])


def add_pairs(conn: sqlite3.Connection, pairs: Iterable[PairSpec], k: int = 2
              ) -> tuple[int, int]:
    """Store pairs (one transaction); returns (added, already there)."""
    if k < 1:
        raise ValueError(f"k: {k} < 1 (operators per pair)")
    added = dup = 0
    now = time.time()
    with _Tx(conn):
        for p in pairs:
            if p.gold is not None and p.gold not in ("a", "b", "equal"):
                raise ValueError(f"gold: {p.gold!r} is not a, b or equal")
            if p.a.key == p.b.key:
                raise ValueError(f"pair of segment {p.a.key!r} with itself")
            key, swapped = pair_key(p.a.key, p.b.key)
            a, b = (p.b, p.a) if swapped else (p.a, p.b)
            gold = FLIP[p.gold] if (swapped and p.gold) else p.gold
            ids = [_segment_id(conn, s, now) for s in (a, b)]
            stratum = p.stratum or stratum_of(a.view, b.view)
            cur = conn.execute(
                "INSERT OR IGNORE INTO pairs (pair_key, a_seg, b_seg, stratum, source, "
                "priority, gold, k, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, ids[0], ids[1], stratum, p.source, float(p.priority), gold, k, now))
            conn.execute("INSERT OR IGNORE INTO strata (name) VALUES (?)", (stratum,))
            if cur.rowcount:
                added += 1
            else:
                dup += 1
    return added, dup


def set_gold(conn: sqlite3.Connection, pair_id: int, answer: str | None) -> None:
    """Mark (or with None unmark) a pair as gold with ``answer`` for its side a vs b."""
    if answer is not None and answer not in ("a", "b", "equal"):
        raise ValueError(f"answer: {answer!r} is not a, b or equal")
    with _Tx(conn):
        if not conn.execute("SELECT 1 FROM pairs WHERE id = ?", (pair_id,)).fetchone():
            raise ValueError(f"pair {pair_id}: no such pair")
        conn.execute("UPDATE pairs SET gold = ? WHERE id = ?", (answer, pair_id))
        conn.execute("UPDATE labels SET is_gold = ?, gold_correct = CASE WHEN ? IS NULL OR "
                     "choice = 'skip' THEN NULL ELSE choice = ? END WHERE pair_id = ?",
                     (int(answer is not None), answer, answer, pair_id))


def set_priorities(conn: sqlite3.Connection, priorities: Sequence[tuple[int, float]]) -> int:
    with _Tx(conn):
        conn.executemany("UPDATE pairs SET priority = ? WHERE id = ?",
                         [(float(p), int(i)) for i, p in priorities])
    return len(priorities)


# ----------------------------------------------------------------------------- serving


def gold_slots(secret: str, operator_id: int, rate: float, upto: int) -> list[int]:
    """The operator's gold task numbers (0-based) up to ``upto``: the j-th slot lies at a
    uniform random place in ``[j / rate, (j + 1) / rate)``, at least one after the one
    before (so a task is gold with probability ``rate`` and the first ``n`` tasks hold
    ``n * rate`` gold slots, give or take one)."""
    if rate <= 0:
        return []
    rng = random.Random(f"{secret}:{operator_id}")
    period = 1.0 / min(rate, 1.0)
    out: list[int] = []
    j = 0
    while True:
        slot = max(int((j + rng.random()) * period), out[-1] + 1 if out else 0)
        if slot > upto:
            return out
        out.append(slot)
        j += 1


def _store_secret(conn: sqlite3.Connection) -> str:
    """The store's random gold secret (made once, kept in ``meta``)."""
    conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('gold_secret', ?)",
                 (secrets.token_hex(16),))
    return str(conn.execute("SELECT value FROM meta WHERE key = 'gold_secret'").fetchone()[0])


class TaskQueue:
    """Hands out and takes back tasks on one write connection (thread-safe via ``lock``)."""

    def __init__(self, conn: sqlite3.Connection, config: QueueConfig | None = None,
                 lock: threading.Lock | None = None, seed: int | None = None) -> None:
        """``seed`` fixes the sides shown and the gold places (default: the sides at random,
        the gold places from the store's secret, the same after a restart)."""
        self.conn = conn
        self.gold_secret = str(seed) if seed is not None else _store_secret(conn)
        self.cfg = config or QueueConfig()
        self.lock = lock or threading.Lock()
        self._rng = random.Random(seed)
        self._last_expire = 0.0

    # -- expiry
    def _expire(self, now: float, force: bool = False) -> int:
        if not force and now - self._last_expire < self.cfg.expire_every_s:
            return 0
        self._last_expire = now
        rows = self.conn.execute(
            "UPDATE assignments SET state = 'expired' WHERE state = 'open' AND expires_at < ? "
            "RETURNING pair_id, is_gold", (now,)).fetchall()
        freed = [(pid,) for pid, gold in rows if not gold]
        self.conn.executemany("UPDATE pairs SET taken = taken - 1 WHERE id = ? AND taken > 0",
                              freed)
        return len(rows)

    def expire(self, now: float | None = None) -> int:
        """Expire overdue assignments now; returns how many."""
        with self.lock, _Tx(self.conn):
            return self._expire(time.time() if now is None else now, force=True)

    # -- picking
    def _pick_gold(self, operator_id: int) -> int | None:
        """A gold pair new to the operator when their next task is a gold slot."""
        if self.cfg.gold_rate <= 0:
            return None
        n = self.conn.execute("SELECT COUNT(*) FROM assignments WHERE operator_id = ?",
                              (operator_id,)).fetchone()[0]
        slots = gold_slots(self.gold_secret, operator_id, self.cfg.gold_rate, n)
        if not slots or slots[-1] != n:
            return None
        row = self.conn.execute(
            "SELECT p.id FROM pairs p WHERE p.gold IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
            "assignments a WHERE a.pair_id = p.id AND a.operator_id = ?) "
            "ORDER BY random() LIMIT 1", (operator_id,)).fetchone()
        return int(row[0]) if row else None

    def _pick_ordinary(self, operator_id: int) -> int | None:
        strata = [r[0] for r in self.conn.execute(
            "SELECT name FROM strata ORDER BY served, name")]
        for name in strata:
            row = self.conn.execute(
                "SELECT p.id FROM pairs p INDEXED BY pairs_open WHERE p.stratum = ? AND "
                "p.gold IS NULL AND p.taken < p.k AND NOT EXISTS (SELECT 1 FROM assignments a "
                "WHERE a.pair_id = p.id AND a.operator_id = ?) "
                "ORDER BY p.priority DESC, p.id LIMIT 1", (name, operator_id)).fetchone()
            if row:
                self.conn.execute("UPDATE strata SET served = served + 1 WHERE name = ?",
                                  (name,))
                return int(row[0])
        return None

    def next_task(self, operator_id: int, now: float | None = None) -> dict[str, Any] | None:
        """The operator's open task, else a new one; None when the queue has nothing for them.

        Returns ``assignment_id``, ``pair_id``, ``swapped`` (the page shows pair side b on
        the left), ``expires_at``, ``left`` and ``right`` (segment views as JSON text)."""
        now = time.time() if now is None else now
        with self.lock, _Tx(self.conn):
            return self._next(operator_id, now)

    def _next(self, operator_id: int, now: float) -> dict[str, Any] | None:
        self._expire(now)
        row = self.conn.execute(
            "SELECT id, pair_id, swapped, expires_at FROM assignments WHERE operator_id = ? "
            "AND state = 'open' AND expires_at >= ? ORDER BY id LIMIT 1",
            (operator_id, now)).fetchone()
        if row is None:
            gold_id = self._pick_gold(operator_id)
            pair_id = gold_id if gold_id is not None else self._pick_ordinary(operator_id)
            if pair_id is None:
                return None
            swapped = self._rng.random() < 0.5
            expires = now + self.cfg.assignment_timeout_s
            cur = self.conn.execute(
                "INSERT INTO assignments (pair_id, operator_id, issued_at, expires_at, "
                "state, swapped, is_gold) VALUES (?, ?, ?, ?, 'open', ?, ?)",
                (pair_id, operator_id, now, expires, int(swapped), int(gold_id is not None)))
            if gold_id is None:
                self.conn.execute("UPDATE pairs SET taken = taken + 1 WHERE id = ?",
                                  (pair_id,))
            row = (int(cur.lastrowid), pair_id, int(swapped), expires)
        views = self.conn.execute(
            "SELECT sa.view_json, sb.view_json FROM pairs p JOIN segments sa ON "
            "sa.id = p.a_seg JOIN segments sb ON sb.id = p.b_seg WHERE p.id = ?",
            (row[1],)).fetchone()
        left, right = (views[1], views[0]) if row[2] else (views[0], views[1])
        return {"assignment_id": int(row[0]), "pair_id": int(row[1]), "swapped": bool(row[2]),
                "expires_at": float(row[3]), "left": left, "right": right}

    # -- labelling
    def submit(self, operator_id: int, assignment_id: int, shown_choice: str,
               note: str | None = None, time_taken_ms: int = 0,
               now: float | None = None) -> dict[str, Any]:
        """Store a label; ``shown_choice`` is as the page showed it (a = left).

        Raises :class:`TaskError` 404 for an assignment that is not this operator's, 409
        for one already labelled or expired and given away, 422 for a bad choice."""
        now = time.time() if now is None else now
        with self.lock, _Tx(self.conn):
            return self._submit(operator_id, assignment_id, shown_choice, note,
                                time_taken_ms, now)

    def submit_and_next(self, operator_id: int, assignment_id: int, shown_choice: str,
                        note: str | None = None, time_taken_ms: int = 0,
                        now: float | None = None
                        ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """:meth:`submit` then :meth:`next_task` in one transaction (one disk sync)."""
        now = time.time() if now is None else now
        with self.lock, _Tx(self.conn):
            stored = self._submit(operator_id, assignment_id, shown_choice, note,
                                  time_taken_ms, now)
            return stored, self._next(operator_id, now)

    def _submit(self, operator_id: int, assignment_id: int, shown_choice: str,
                note: str | None, time_taken_ms: int, now: float) -> dict[str, Any]:
        if shown_choice not in CHOICES:
            raise TaskError(422, f"choice: {shown_choice!r} is not one of {', '.join(CHOICES)}")
        row = self.conn.execute(
            "SELECT a.pair_id, a.state, a.swapped, a.is_gold, p.taken, p.k, "
            "p.gold FROM assignments a JOIN pairs p ON p.id = a.pair_id WHERE a.id = ? "
            "AND a.operator_id = ?", (assignment_id, operator_id)).fetchone()
        if row is None:
            raise TaskError(404, f"task {assignment_id}: unknown task for this operator")
        pair_id, state, swapped, is_gold, taken, k, gold = row
        if state == "done":
            raise TaskError(409, f"task {assignment_id}: already labelled")
        if state == "expired" and not is_gold:  # its slot went back to the queue
            if taken >= k:
                raise TaskError(409, f"task {assignment_id}: expired and given to "
                                     "another operator")
            self.conn.execute("UPDATE pairs SET taken = taken + 1 WHERE id = ?",
                              (pair_id,))
        choice = FLIP[shown_choice] if swapped else shown_choice
        correct = None if (gold is None or choice == "skip") else int(choice == gold)
        cur = self.conn.execute(
            "INSERT INTO labels (assignment_id, pair_id, operator_id, choice, note, "
            "created_at, time_taken_ms, is_gold, gold_correct) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (assignment_id, pair_id, operator_id, choice, note or None, now,
             max(0, int(time_taken_ms)), int(gold is not None), correct))
        self.conn.execute("UPDATE assignments SET state = 'done' WHERE id = ?",
                          (assignment_id,))
        if choice == "skip" and not is_gold:
            self.conn.execute("UPDATE pairs SET taken = taken - 1 WHERE id = ? AND "
                              "taken > 0", (pair_id,))
        return {"label_id": int(cur.lastrowid), "pair_id": int(pair_id), "choice": choice}


def queue_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Pairs (all, gold, open, fully labelled), open assignments and labels."""
    q = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(gold IS NOT NULL), 0), "
        "COALESCE(SUM(gold IS NULL AND taken < k), 0) FROM pairs").fetchone()
    done = conn.execute(
        "SELECT COUNT(*) FROM (SELECT p.id FROM pairs p JOIN labels l ON l.pair_id = p.id "
        "WHERE p.gold IS NULL AND l.choice != 'skip' GROUP BY p.id "
        "HAVING COUNT(*) >= MAX(p.k))").fetchone()[0]
    open_assign = conn.execute("SELECT COUNT(*) FROM assignments WHERE state = 'open'"
                               ).fetchone()[0]
    labels, skips = conn.execute("SELECT COUNT(*), COALESCE(SUM(choice = 'skip'), 0) "
                                 "FROM labels").fetchone()
    return {"pairs": q[0], "gold_pairs": q[1], "open_pairs": q[2], "complete_pairs": done,
            "open_assignments": open_assign, "labels": labels, "skips": skips}


def strata_counts(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT s.name, s.served, (SELECT COUNT(*) FROM pairs p WHERE p.stratum = s.name "
        "AND p.gold IS NULL), (SELECT COUNT(*) FROM pairs p WHERE p.stratum = s.name AND "
        "p.gold IS NULL AND p.taken < p.k) FROM strata s ORDER BY s.name").fetchall()
    return [{"stratum": r[0], "served": r[1], "pairs": r[2], "open": r[3]} for r in rows]
