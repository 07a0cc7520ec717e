"""Google cluster-data 2011 (trace v2) ``task_events`` ingestion and replay.

:func:`parse_task_events` streams shards (``.csv`` / ``.csv.gz``, 13 columns, no
header) and reduces each task (job ID, task index) to one job: arrival at its first
SUBMIT (first SCHEDULE if none), duration from the SCHEDULE that starts its last
successful run to that run's FINISH -- never from SUBMIT, so an evicted and
resubmitted task counts only its final run. :func:`save_trace` / :func:`load_trace`
keep the result in one compact ``.npz``; ``envs.workloads.trace_replay`` replays it
as a ``Workload``.

* A run is a SCHEDULE and the event that ends it (FINISH, EVICT, FAIL, KILL, LOST);
  KILL/FAIL/LOST while the task is pending end no run. A task that never finishes
  is excluded for what ended its *last run* -- ``evicted``, ``failed``, ``killed``,
  ``lost`` -- or as ``never_scheduled`` (no SCHEDULE at all), ``still_running`` (its
  last run has not ended when the trace ends) or ``no_schedule`` (a FINISH without
  any SCHEDULE). ``run_ends`` counts every run's end by reason, including the
  evictions and failures of tasks that finished later.

* Requests come from the SCHEDULE starting the final run; an empty field is filled
  from the nearest other event of the task (earlier first; UPDATE_PENDING/RUNNING
  only as a last resort), else the task is excluded as ``missing_request``. Values
  are clipped to (0, 1]: zero becomes :data:`REQUEST_FLOOR` (``requests_floored``),
  above 1 becomes 1 (``requests_clipped``).
* A run starting at timestamp 0 (before the trace start) or ending at 2**63-1 (after
  its end) has no known duration: ``censored_start`` / ``censored_end``. A FINISH
  in the same microsecond as its SCHEDULE lasts 1 us.
* A task's events are sorted by timestamp; ties keep file order, files are read in
  sorted path order, so the result does not depend on the argument order.
* Malformed rows raise :class:`TraceFormatError` naming file, 1-based line and field;
  with ``skip_malformed=True`` they are skipped and counted per file. Integers are
  plain ASCII digits (no spaces, signs or ``_``), timestamps at most 2**63-1.
* A trace spans at most :data:`MAX_TRACE_SPAN_US` (10 years) between its first and last
  real timestamp, so every duration and arrival is at most that too; a longer span (a
  typo'd timestamp near 2**62) is refused naming the two timestamps.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import re
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

SUBMIT, SCHEDULE, EVICT, FAIL, FINISH, KILL, LOST, UPDATE_PENDING, UPDATE_RUNNING = range(9)
N_COLUMNS = 13
BEFORE_START_US = 0
AFTER_END_US = 2**63 - 1
REQUEST_FLOOR = 1e-4
MAX_TRACE_SPAN_US = 3652 * 86_400 * 10**6  # ~10 years (3652 days) in microseconds, 3.2e14
FORMAT_TAG = "cloudrl-trace-v1"

_UPDATES = frozenset({UPDATE_PENDING, UPDATE_RUNNING})
_RUN_ENDERS = {EVICT: "evicted", FAIL: "failed", KILL: "killed", LOST: "lost"}
# Why a task that never finished is excluded, in report order, with its label.
EXCLUSION_LABELS = {
    "evicted": "evicted", "failed": "failed", "killed": "killed", "lost": "lost",
    "never_scheduled": "never scheduled", "still_running": "still running at trace end",
    "no_schedule": "finished without a SCHEDULE", "censored_start": "running since before "
    "the trace start", "censored_end": "finished after the trace end",
    "missing_request": "no CPU/memory request",
}
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
_ARRAYS = {"arrival_us": np.int64, "duration_us": np.int64, "cpu": np.float64, "mem": np.float64}

# One event: (timestamp_us, event_type, cpu_request or None, mem_request or None).
_Event = tuple[int, int, float | None, float | None]


class TraceFormatError(ValueError):
    """A ``task_events`` file that does not follow the 13-column schema."""


class TraceFileError(ValueError):
    """A file that is not a valid compact cloudrl trace (``.npz``)."""


class _BadField(ValueError):
    """Internal: one row is malformed; the reader adds file and line."""


@dataclass
class ImportReport:
    """What an import saw: rows, tasks, and why tasks were left out."""

    files: list[str] = field(default_factory=list)
    rows: int = 0
    tasks_seen: int = 0
    tasks_finished: int = 0
    tasks_kept: int = 0
    excluded: dict[str, int] = field(default_factory=dict)
    run_ends: dict[str, int] = field(default_factory=dict)  # every run's end (not FINISH)
    malformed_skipped: dict[str, int] = field(default_factory=dict)
    resubmissions: int = 0
    requests_filled: int = 0
    requests_floored: int = 0
    requests_clipped: int = 0
    first_timestamp_us: int | None = None
    last_timestamp_us: int | None = None

    @property
    def span_us(self) -> int:
        """Microseconds between the first and last real (not 0, not 2**63-1) timestamp."""
        if self.first_timestamp_us is None or self.last_timestamp_us is None:
            return 0
        return self.last_timestamp_us - self.first_timestamp_us

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed_skipped.values())


@dataclass(frozen=True)
class TraceJobs:
    """Finished tasks as jobs: arrival (sorted, first = 0) and duration in microseconds.

    ``span_us`` is the replay period: from the first arrival to the last real
    timestamp of the trace, and always past the last arrival.
    """

    arrival_us: np.ndarray  # int64, sorted, arrival_us[0] == 0
    duration_us: np.ndarray  # int64 > 0
    cpu: np.ndarray  # float64 in (0, 1]
    mem: np.ndarray  # float64 in (0, 1]
    span_us: int

    def __post_init__(self) -> None:
        n = len(self.arrival_us)
        if any(len(getattr(self, name)) != n for name in _ARRAYS):
            raise ValueError(f"TraceJobs: arrays differ in length ({n} arrivals)")
        if n == 0:
            return
        if self.arrival_us[0] != 0 or np.any(np.diff(self.arrival_us) < 0):
            raise ValueError("TraceJobs.arrival_us: must be sorted and start at 0")
        if np.any(self.duration_us <= 0):
            raise ValueError("TraceJobs.duration_us: every duration must be > 0")
        if np.any(self.duration_us > MAX_TRACE_SPAN_US):
            raise ValueError(f"TraceJobs.duration_us: {int(self.duration_us.max())} us is "
                             f"longer than {MAX_TRACE_SPAN_US} us (10 years)")
        for name in ("cpu", "mem"):
            values = getattr(self, name)
            if np.any(~(values > 0)) or np.any(values > 1):
                raise ValueError(f"TraceJobs.{name}: requests must lie in (0, 1]")
        if self.span_us <= self.arrival_us[-1]:
            raise ValueError(f"TraceJobs.span_us ({self.span_us}) must exceed the last arrival")
        if self.span_us > MAX_TRACE_SPAN_US:
            raise ValueError(f"TraceJobs.span_us: {self.span_us} us is longer than "
                             f"{MAX_TRACE_SPAN_US} us (10 years)")

    def __len__(self) -> int:
        return len(self.arrival_us)


# --------------------------------------------------------------------------- parsing


def _int_field(value: str, name: str) -> int:
    """Plain decimal digits only: ``int()`` alone would take `` 12``, ``+12`` and ``1_2``."""
    if not _INT.fullmatch(value):
        raise _BadField(f"{name} {value!r} is not an integer")
    return int(value)


def _request_field(value: str, name: str) -> float | None:
    if value == "":
        return None
    if not _FLOAT.fullmatch(value):
        raise _BadField(f"{name} {value!r} is not a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise _BadField(f"{name} {value!r} is not a finite number >= 0")
    return number


def _parse_row(row: list[str]) -> tuple[tuple[int, int], _Event]:
    if len(row) != N_COLUMNS:
        raise _BadField(f"expected {N_COLUMNS} columns, got {len(row)}")
    ts = _int_field(row[0], "timestamp")
    if ts < 0:
        raise _BadField(f"timestamp {row[0]!r} is negative")
    if ts > AFTER_END_US:
        raise _BadField(f"timestamp {row[0]!r} is above 2**63-1 (the trace's end marker)")
    job, task = _int_field(row[2], "job ID"), _int_field(row[3], "task index")
    for name, value, text in (("job ID", job, row[2]), ("task index", task, row[3])):
        if not 0 <= value <= AFTER_END_US:
            raise _BadField(f"{name} {text!r} is outside [0, 2**63-1]")
    kind = _int_field(row[5], "event type")
    if not SUBMIT <= kind <= UPDATE_RUNNING:
        raise _BadField(f"event type {row[5]!r} is not a known code (0-8)")
    cpu = _request_field(row[9], "CPU request")
    mem = _request_field(row[10], "memory request")
    return (job, task), (ts, kind, cpu, mem)


def _open_text(path: Path) -> TextIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", newline="", encoding="utf-8")
    return open(path, newline="", encoding="utf-8")


def _read_file(path: Path, events: dict[tuple[int, int], list[_Event]], report: ImportReport,
               skip_malformed: bool) -> None:
    """Stream one shard into ``events`` (per task), updating row counts and the time span."""
    skipped, rows = 0, 0
    lo, hi = report.first_timestamp_us, report.last_timestamp_us
    line = 0
    try:
        with _open_text(path) as handle:
            reader = csv.reader(handle)
            for row in reader:
                line = reader.line_num
                try:
                    key, event = _parse_row(row)
                except _BadField as err:
                    if not skip_malformed:
                        raise TraceFormatError(f"{path}: line {line}: {err}") from None
                    skipped += 1
                    continue
                events.setdefault(key, []).append(event)
                rows += 1
                ts = event[0]
                if BEFORE_START_US < ts < AFTER_END_US:
                    lo = ts if lo is None or ts < lo else lo
                    hi = ts if hi is None or ts > hi else hi
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, zlib.error) as err:
        raise TraceFormatError(f"{path}: cannot read after line {line}: {err}") from None
    report.rows += rows
    report.first_timestamp_us, report.last_timestamp_us = lo, hi
    if skip_malformed:
        report.malformed_skipped[str(path)] = skipped


def _final_run(events: list[_Event], report: ImportReport) -> tuple[int, int] | str:
    """Indices (SCHEDULE, FINISH) of the last successful run, or why there is none.

    Without one, what ended the task's last run decides (a LOST after a FAIL is still a
    failed run); every run end that is not a FINISH is counted in ``report.run_ends``.
    """
    running: int | None = None
    final: tuple[int, int] | None = None
    last_end: str | None = None
    scheduled = finished = False
    for i, (_, kind, _, _) in enumerate(events):
        if kind == SCHEDULE:
            running, scheduled = i, True
        elif kind == FINISH:
            finished = True
            if running is not None:
                final, last_end = (running, i), None
            running = None
        elif kind in _RUN_ENDERS and running is not None:
            last_end = _RUN_ENDERS[kind]
            report.run_ends[last_end] = report.run_ends.get(last_end, 0) + 1
            running = None
    if running is not None and final is None:
        return "still_running"
    if final is not None:
        return final
    if not scheduled:
        return "no_schedule" if finished else "never_scheduled"
    return last_end or "still_running"


def _pick_request(events: list[_Event], anchor: int, column: int) -> tuple[float | None, bool]:
    """Request at ``events[anchor]``, else from the nearest event that has it (filled=True)."""
    own = events[anchor][column]
    if own is not None:
        return own, False
    order = sorted(range(len(events)),
                   key=lambda i: (events[i][1] in _UPDATES, i > anchor, abs(i - anchor)))
    for i in order:
        value = events[i][column]
        if value is not None:
            return value, True
    return None, False


def _clip_request(value: float, report: ImportReport) -> float:
    if value <= 0:
        report.requests_floored += 1
        return REQUEST_FLOOR
    if value > 1:
        report.requests_clipped += 1
        return 1.0
    return value


def _exclude(report: ImportReport, reason: str) -> None:
    report.excluded[reason] = report.excluded.get(reason, 0) + 1


def _reduce_task(events: list[_Event], report: ImportReport
                 ) -> tuple[int, int, float, float] | None:
    """One task's events -> (arrival_us, duration_us, cpu, mem), or None when excluded."""
    events.sort(key=lambda e: e[0])  # stable: equal timestamps keep file order
    kinds = [e[1] for e in events]
    report.resubmissions += max(0, kinds.count(SUBMIT) - 1)
    run = _final_run(events, report)
    if isinstance(run, str):
        _exclude(report, run)
        return None
    report.tasks_finished += 1
    start, end = events[run[0]][0], events[run[1]][0]
    if start == BEFORE_START_US or end == AFTER_END_US:
        _exclude(report, "censored_start" if start == BEFORE_START_US else "censored_end")
        return None
    cpu, cpu_filled = _pick_request(events, run[0], 2)
    mem, mem_filled = _pick_request(events, run[0], 3)
    if cpu is None or mem is None:
        _exclude(report, "missing_request")
        return None
    report.requests_filled += int(cpu_filled or mem_filled)
    first = SUBMIT if SUBMIT in kinds else SCHEDULE
    arrival = events[kinds.index(first)][0]
    cpu, mem = _clip_request(cpu, report), _clip_request(mem, report)
    return arrival, max(1, end - start), cpu, mem


def parse_task_events(paths: Iterable[str | os.PathLike[str]], *,
                      skip_malformed: bool = False) -> tuple[TraceJobs, ImportReport]:
    """Parse ``task_events`` shards into finished jobs and an :class:`ImportReport`."""
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("no task_events files given")
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"task_events file not found: {path}")
    report = ImportReport(files=[str(p) for p in files])
    events: dict[tuple[int, int], list[_Event]] = {}
    for path in sorted(files, key=str):
        _read_file(path, events, report, skip_malformed)
    if report.span_us > MAX_TRACE_SPAN_US:
        raise TraceFormatError(
            f"timestamps span {report.span_us} us (from {report.first_timestamp_us} to "
            f"{report.last_timestamp_us}), more than a trace may: {MAX_TRACE_SPAN_US} us "
            f"(10 years); only 2**63-1 may mark the trace's end")
    report.tasks_seen = len(events)
    reduced = (_reduce_task(events.pop(key), report) for key in sorted(events))
    kept = [job for job in reduced if job is not None]
    report.tasks_kept = len(kept)
    return _to_jobs(kept, report), report


def _to_jobs(kept: list[tuple[int, int, float, float]], report: ImportReport) -> TraceJobs:
    """Columns sorted by arrival (ties keep task-key order), arrivals shifted to start at 0."""
    if not kept:
        return TraceJobs(*(np.zeros(0, dtype=t) for t in _ARRAYS.values()), span_us=0)
    columns = zip(*kept, strict=True)
    arrival, duration, cpu, mem = (np.array(column, dtype=t) for column, t
                                   in zip(columns, _ARRAYS.values(), strict=True))
    order = np.argsort(arrival, kind="stable")
    first = int(arrival[order[0]])
    arrival = arrival[order] - first
    span = max(int(arrival[-1]) + 1, (report.last_timestamp_us or 0) - first)
    return TraceJobs(arrival, duration[order], cpu[order], mem[order], span_us=span)


# ----------------------------------------------------------------- compact file


def save_trace(path: str | os.PathLike[str], jobs: TraceJobs, report: ImportReport) -> Path:
    """Write jobs and the import report to one ``.npz`` at exactly ``path``."""
    out = Path(path)
    meta = json.dumps({"format": FORMAT_TAG, "report": asdict(report)})
    with open(out, "wb") as handle:
        np.savez_compressed(handle, **{name: getattr(jobs, name) for name in _ARRAYS},
                            span_us=np.int64(jobs.span_us), meta=np.array(meta))
    return out


def load_trace(path: str | os.PathLike[str]) -> tuple[TraceJobs, ImportReport]:
    """Read a file written by :func:`save_trace`; raise :class:`TraceFileError` if it is not one."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"trace file not found: {source}")
    if not zipfile.is_zipfile(source):
        raise TraceFileError(f"{source}: not a cloudrl trace file (not an .npz archive; "
                             f"make one with `cloudrl trace import`)")
    try:
        with np.load(source, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise TraceFileError(f"{source}: not a cloudrl trace file ({err})") from None
    missing = [n for n in (*_ARRAYS, "span_us", "meta") if n not in arrays]
    if missing:
        raise TraceFileError(f"{source}: not a cloudrl trace file, missing arrays {missing}")
    try:
        meta = json.loads(str(arrays["meta"]))
        if meta.get("format") != FORMAT_TAG:
            raise ValueError(f"format tag {meta.get('format')!r} != {FORMAT_TAG!r}")
        report = ImportReport(**meta["report"])
        columns = {n: arrays[n].astype(t, casting="safe") for n, t in _ARRAYS.items()}
        jobs = TraceJobs(**columns, span_us=int(arrays["span_us"]))
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise TraceFileError(f"{source}: invalid cloudrl trace file: {err}") from None
    return jobs, report
