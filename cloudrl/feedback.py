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

import numpy as np

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


# ----------------------------------------------------------------------------- pair datasets
# Operator pairs into the preference-pair dataset (cloudrl.data.pairs), the schema
# teacher pairs use. Each inline trajectory step's ClusterState is loaded into the policy
# env's own simulator (the decision service's path: cloudrl.serving.state.to_snapshot, then
# env.observe_snapshot; for an env with signals the state's ``signals`` give the signal
# columns, cloudrl.serving.state.signal_row and observe_with_signals, as ServedPolicy.observe
# does), so its observation is exactly what the env and the service build. A state whose
# signals do not fit the env (missing for an env with signals, given to one without, a
# forecast of another length) is a mismatch naming the field (``...state.signals...``).
# Segment-length policy: a trajectory of L steps becomes T = segment_length steps; L > T
# keeps the first T steps (cut="head") or the last T (cut="tail"); L < T repeats the last
# step (state and action) until T ("pad": edge padding), unless L < min_steps, when the pair
# is skipped. Pairs whose side is given only by trajectory_id are skipped and counted, as
# are pairs whose states or actions do not fit the env (other fleet, other interface).
# Statistics: overload and slowdown spread come from the observations and actions (as the
# teacher computes them); SLA violations and energy are unknown to an operator trajectory,
# so they are NaN.


class OperatorExport:
    """What :func:`export_pairs` wrote and skipped (counts by reason, the first message)."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.written = 0
        self.skipped: dict[str, int] = {}
        self.first_skip: dict[str, str] = {}
        self.labels: dict[float, int] = {}

    def skip(self, reason: str, message: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.first_skip.setdefault(reason, message)

    def as_dict(self) -> dict[str, Any]:
        return {"pairs": self.written, "skipped": dict(self.skipped),
                "labels": {str(k): v for k, v in sorted(self.labels.items())},
                "files": [str(p) for p in self.paths],
                "first_skip": dict(self.first_skip)}


LABEL_OF_PREFERRED = {"a": 1.0, "b": 0.0, "equal": 0.5}


class _Mismatch(ValueError):
    """A state or action that does not fit the env."""


class _TooShort(ValueError):
    """A trajectory with fewer than min_steps steps."""


def _trajectory_segment(traj: dict[str, Any], env: Any, segment_length: int, cut: str,
                        min_steps: int, policy: str, teacher_cfg: Any, layout: Any = None):
    """A pair side from an inline trajectory; _Mismatch or a ("too_short", msg) signal.

    A transition segment: T actions and the T+1 states around them (step i's state is the
    one its action was taken on, so step i+1's is the one it led to). A trajectory of more
    than T steps gives a window of T+1 consecutive states (the first or the last ones, by
    ``cut``), the actions of the first T; a shorter one is edge-padded (last state and
    action repeated). ``layout`` is the env's ``cloudrl.serving.state.signal_layout`` (None: the
    env has no signals)."""
    from pydantic import ValidationError

    from cloudrl.data.pairs import Segment
    from cloudrl.data.segments import overload_count, placement_slowdowns, spread
    from cloudrl.serving.errors import field_errors
    from cloudrl.serving.schemas import Trajectory
    from cloudrl.serving.state import StateError, observe_with_signals, signal_row, to_snapshot

    try:
        steps = Trajectory.model_validate(traj).steps
    except ValidationError as e:
        err = field_errors(e.errors()[:1], traj)[0]  # the field as in the trajectory
        where = "trajectory" if err["field"] == "body" else f"trajectory.{err['field']}"
        raise _Mismatch(f"{where}: {err['message']}") from None
    if len(steps) < min_steps:
        raise _TooShort(f"{len(steps)} steps < min_steps {min_steps}")
    start = 0
    if len(steps) > segment_length:  # T+1 states for T transitions
        start = 0 if cut == "head" else len(steps) - segment_length - 1
        steps = steps[start:start + segment_length + 1]
    fleet, sim_cfg = env.sim.fleet, env.config.sim
    obs_list, actions = [], []
    for i, step in enumerate(steps):
        try:
            snapshot = to_snapshot(step.state, fleet, sim_cfg)
            row = signal_row(step.state.signals, layout, snapshot.tick)
            obs = env.observe_snapshot(snapshot) if row is None else \
                observe_with_signals(env, snapshot, row)
        except (StateError, ValueError) as e:
            raise _Mismatch(f"steps[{start + i}].state.{e}") from None
        action = np.atleast_1d(np.asarray(step.action, dtype=np.int64))
        if not env.action_space.contains(action[0] if action.size == 1 and
                                         env.action_space.shape == () else action):
            raise _Mismatch(f"steps[{start + i}].action: {step.action} is not in the env's "
                            f"{env.action_space}")
        obs_list.append({k: np.array(v) for k, v in obs.items()})
        actions.append(action)
    del actions[segment_length:]  # the last state's action led outside the segment
    while len(obs_list) < segment_length + 1:  # edge padding
        obs_list.append(obs_list[-1])
    while len(actions) < segment_length:
        actions.append(actions[-1])
    stacked = {k: np.stack([o[k] for o in obs_list]) for k in obs_list[0]}
    acts = np.stack(actions)
    n = stacked["servers"].shape[1]
    # as the teacher counts them: placements on the states the actions were taken on,
    # overload on the states they led to
    slowdowns = placement_slowdowns(stacked["jobs"][:-1], stacked["action_mask"][:-1], acts, n)
    stats = {"overload": float(overload_count(stacked["servers"][1:],
                                              teacher_cfg.overload_threshold)),
             "slowdown_spread": spread(slowdowns, teacher_cfg.fairness)}
    return Segment(macro=stacked["macro"], servers=stacked["servers"], jobs=stacked["jobs"],
                   actions=acts, episode_seed=-1, start=start, policy=policy, stats=stats)


def export_pairs(db: str | Path, out_dir: str | Path, *, env_config: Any = None,
                 interface: str = "flat", segment_length: int = 25, cut: str = "head",
                 min_steps: int = 1, teacher_config: Any = None,
                 rows_per_file: int = 256) -> OperatorExport:
    """Write the store's pairs with inline trajectories as a pair dataset in ``out_dir``.

    ``env_config`` and ``interface`` are the env the operators' states belong to (the
    serving policy's fleet). Labels: ``"a"`` -> 1.0, ``"b"`` -> 0.0, ``"equal"`` -> 0.5.
    """
    from cloudrl.data.pairs import pair_row, write_pairs
    from cloudrl.data.segments import DefaultStats
    from cloudrl.policy import make_env
    from cloudrl.serving.state import signal_layout

    if not Path(db).is_file():
        raise FileNotFoundError(f"feedback database {db} does not exist")
    if segment_length < 1:
        raise ValueError(f"segment_length must be >= 1, got {segment_length}")
    if cut not in ("head", "tail"):
        raise ValueError(f"cut must be 'head' or 'tail', got {cut!r}")
    teacher_cfg = teacher_config or DefaultStats()
    env = make_env(env_config, interface)  # type: ignore[arg-type]
    layout = signal_layout(env)  # None: the env observes no signals
    result = OperatorExport()
    store = FeedbackStore(db)
    rows: list[dict[str, Any]] = []
    try:
        for pair in store.pairs():
            where = f"pair {pair['id']}"
            if any("trajectory" not in pair[s] for s in ("a", "b")):
                result.skip("trajectory_id", f"{where}: a side is given only by "
                            "trajectory_id")
                continue
            sides = []
            try:
                for s in ("a", "b"):
                    sides.append(_trajectory_segment(
                        pair[s]["trajectory"], env, segment_length, cut, min_steps,
                        pair.get("policy_version") or "", teacher_cfg, layout))
            except _TooShort as e:
                result.skip("too_short", f"{where}: {s}: {e}")
                continue
            except _Mismatch as e:
                result.skip("mismatch", f"{where}: {s}.{e}")
                continue
            label = LABEL_OF_PREFERRED[pair["preferred"]]
            a_json, b_json, preferred = canonical_pair(pair["a"], pair["b"], pair["preferred"])
            key = hashlib.sha256(f"{preferred}\n{a_json}\n{b_json}".encode()).hexdigest()
            rows.append(pair_row(f"operator:{key[:24]}", "operator", label, *sides))
            result.labels[label] = result.labels.get(label, 0) + 1
            result.written += 1
            if len(rows) >= rows_per_file:
                result.paths += write_pairs(rows, out_dir, prefix="operator")
                rows = []
        if rows:
            result.paths += write_pairs(rows, out_dir, prefix="operator")
    finally:
        store.close()
    return result
