"""Google trace v2 ``task_events`` import, compact file, replay workload and CLI handler.

The tiny fixture ``task_events_tiny.csv`` (32 rows, times in whole seconds) holds:

=========  ====================================================  =====================
task       events (s)                                            expected
=========  ====================================================  =====================
(100, 0)   SUBMIT 1, SCHEDULE 3, FINISH 13                       kept, 10 s
(100, 1)   SUBMIT 2, SCHEDULE 4, EVICT 6, SUBMIT 7, SCHEDULE 9,  kept, 30 s (final run)
           FINISH 39
(200, 0)   SUBMIT 5 (blank), UPDATE_PENDING 6 (0.5, 0.3),        kept, 2 s, requests
           SCHEDULE 8 (blank), FINISH 10 (blank)                 filled from the UPDATE
(200, 1)   SUBMIT 5, SCHEDULE 6, KILL 20                         killed
(300, 0)   SUBMIT 11, SCHEDULE 12, FAIL 14                       failed
(300, 1)   SUBMIT 15, SCHEDULE 16, FINISH 18, all blank          missing_request
(400, 0)   SUBMIT 0, SCHEDULE 0, FINISH 30                       censored_start
(400, 1)   SUBMIT 20, SCHEDULE 21 (0, 1.5), UPDATE_RUNNING 22    kept, 20 s, cpu floored,
           (0.9, 0.9), FINISH 41                                 mem clipped, update unused
(500, 0)   SUBMIT 40                                             never_scheduled
(500, 1)   SCHEDULE 25, FINISH 27 (no SUBMIT)                    kept, 2 s, arrival 25
=========  ====================================================  =====================
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from cloudrl.trace_import import register
from envs.workloads.base import FleetCapacity
from envs.workloads.google_trace import (
    MAX_TRACE_SPAN_US,
    REQUEST_FLOOR,
    ImportReport,
    TraceFileError,
    TraceFormatError,
    TraceJobs,
    load_trace,
    parse_task_events,
    save_trace,
)
from envs.workloads.trace_replay import TraceReplayConfig, TraceReplayWorkload

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "task_events_tiny.csv"
SAMPLE = FIXTURES / "google_v2_task_events_sample.csv.gz"
FLEET = FleetCapacity(total_cpu=10.0, n_servers=15)
S = 1_000_000  # microseconds per second


def _fixture_module():
    spec = importlib.util.spec_from_file_location("make_trace_fixture",
                                                  FIXTURES / "make_trace_fixture.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _corrupt(tmp_path: Path, line: int, text: str, name: str = "bad_events.csv") -> Path:
    lines = TINY.read_text().splitlines()
    lines[line - 1] = text
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------ tiny fixture


def test_tiny_counts_and_exclusions() -> None:
    jobs, report = parse_task_events([TINY])
    assert report.rows == 32
    assert report.tasks_seen == 10
    assert report.tasks_finished == 7  # includes the censored and the request-less task
    assert report.tasks_kept == len(jobs) == 5
    assert report.excluded == {"killed": 1, "failed": 1, "missing_request": 1,
                               "censored_start": 1, "never_scheduled": 1}
    # every run's end, the eviction of (100, 1), which finished later, included
    assert report.run_ends == {"evicted": 1, "killed": 1, "failed": 1}
    assert report.tasks_seen == report.tasks_kept + sum(report.excluded.values())
    assert report.resubmissions == 1
    assert (report.requests_filled, report.requests_floored, report.requests_clipped) == (1, 1, 1)
    assert (report.first_timestamp_us, report.last_timestamp_us) == (1 * S, 41 * S)
    assert report.malformed_skipped == {}


def test_tiny_arrivals_durations_and_requests() -> None:
    jobs, _ = parse_task_events([TINY])
    # kept in arrival order: (100,0) at 1 s, (100,1) 2 s, (200,0) 5 s, (400,1) 20 s, (500,1) 25 s
    np.testing.assert_array_equal(jobs.arrival_us, np.array([0, 1, 4, 19, 24]) * S)
    # (100,1) was evicted: 30 s from its last SCHEDULE, not 35 s (first) or 37 s (SUBMIT)
    np.testing.assert_array_equal(jobs.duration_us, np.array([10, 30, 2, 20, 2]) * S)
    np.testing.assert_allclose(jobs.cpu, [0.1, 0.25, 0.5, REQUEST_FLOOR, 0.3])
    np.testing.assert_allclose(jobs.mem, [0.2, 0.05, 0.3, 1.0, 0.4])
    assert jobs.arrival_us.dtype == np.int64 and jobs.duration_us.dtype == np.int64
    assert jobs.span_us == 40 * S  # first arrival (1 s) to the last timestamp (41 s)


def test_gzip_and_split_files_in_any_order_give_the_same_jobs(tmp_path: Path) -> None:
    lines = TINY.read_text().splitlines(keepends=True)
    first, second = tmp_path / "part-00000.csv.gz", tmp_path / "part-00001.csv"
    with gzip.open(first, "wt") as handle:
        handle.writelines(lines[:14])
    second.write_text("".join(lines[14:]))
    reference, ref_report = parse_task_events([TINY])
    for order in ([first, second], [second, first]):
        jobs, report = parse_task_events(order)
        for name in ("arrival_us", "duration_us", "cpu", "mem"):
            np.testing.assert_array_equal(getattr(jobs, name), getattr(reference, name))
        assert report.excluded == ref_report.excluded and report.rows == 32


@pytest.mark.parametrize(("line", "text", "needle"), [
    (8, "5000000,,200,1,,9,u2,0,0,0.1,0.1,0,0", "event type '9'"),
    (12, "7000000,,100,1,,0,u1,0,0,0.25,0.05,0", "expected 13 columns, got 12"),
    (3, "1e6,,100,0,,0,u1,0,0,0.1,0.2,0,0", "timestamp '1e6'"),
    (20, "15000000,,300,1,,0,u3,0,0,abc,,0,0", "CPU request 'abc'"),
    (5, "3000000,,x100,0,11,1,u1,0,0,0.1,0.2,0,0", "job ID 'x100'"),
])
def test_malformed_row_names_file_line_and_field(tmp_path: Path, line: int, text: str,
                                                 needle: str) -> None:
    bad = _corrupt(tmp_path, line, text)
    with pytest.raises(TraceFormatError) as err:
        parse_task_events([bad])
    message = str(err.value)
    assert "bad_events.csv" in message and f"line {line}:" in message and needle in message
    assert isinstance(err.value, ValueError)


def _events(tmp_path: Path, events: list[tuple[int, int]], name: str = "events.csv") -> Path:
    """One task (job 7, index 0) with ``(seconds, event type)`` events and fixed requests."""
    path = tmp_path / name
    path.write_text("".join(f"{t * S},,7,0,,{kind},u,0,0,0.1,0.1,0,0\n" for t, kind in events))
    return path


# event codes: 0 SUBMIT, 1 SCHEDULE, 2 EVICT, 3 FAIL, 4 FINISH, 5 KILL, 6 LOST
@pytest.mark.parametrize(("events", "reason", "run_ends"), [
    ([(1, 0), (2, 1), (3, 3), (4, 6)], "failed", {"failed": 1}),  # LOST after the FAIL
    ([(1, 0), (2, 1), (3, 2), (4, 0)], "evicted", {"evicted": 1}),  # pending at the end
    ([(1, 0), (2, 1), (3, 2), (4, 0), (5, 1)], "still_running", {"evicted": 1}),
    ([(1, 0), (2, 1)], "still_running", {}),
    ([(1, 0)], "never_scheduled", {}),
    ([(1, 0), (2, 5)], "never_scheduled", {}),  # killed while pending: no run ended
    ([(1, 0), (2, 1), (3, 5), (4, 0), (5, 6)], "killed", {"killed": 1}),  # lost while pending
    ([(1, 0), (2, 1), (3, 6)], "lost", {"lost": 1}),
    ([(1, 0), (2, 4)], "no_schedule", {}),
])
def test_exclusion_reason_is_what_ended_the_last_run(tmp_path: Path, events: list,
                                                     reason: str, run_ends: dict) -> None:
    jobs, report = parse_task_events([_events(tmp_path, events)])
    assert len(jobs) == 0 and report.excluded == {reason: 1}
    assert report.run_ends == run_ends


def test_evictions_of_finished_tasks_are_reported(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    events = [(1, 0), (2, 1), (3, 2), (4, 0), (5, 1), (6, 2), (7, 0), (8, 1), (9, 4)]
    jobs, report = parse_task_events([_events(tmp_path, events)])
    assert len(jobs) == 1 and jobs.duration_us[0] == 1 * S and report.excluded == {}
    assert report.run_ends == {"evicted": 2}
    out = tmp_path / "t.npz"
    assert _cli(["trace", "import", str(tmp_path / "events.csv"), "--out", str(out)]) == 0
    assert "runs ended without FINISH (all tasks, kept ones too): evicted 2" in \
        capsys.readouterr().out
    assert load_trace(out)[1].run_ends == {"evicted": 2}


def test_import_report_names_every_exclusion_reason(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    lines = []
    for job, events in enumerate([[(1, 0), (2, 1), (3, 2)], [(1, 0), (2, 1), (3, 3), (4, 6)],
                                  [(1, 0), (2, 1), (3, 5)], [(1, 0), (2, 1), (3, 6)],
                                  [(1, 0)], [(1, 0), (2, 1)], [(1, 0), (2, 1), (5, 4)]]):
        lines += [f"{t * S},,{job},0,,{kind},u,0,0,0.1,0.1,0,0\n" for t, kind in events]
    shard = tmp_path / "all.csv"
    shard.write_text("".join(lines))
    assert _cli(["trace", "import", str(shard), "--out", str(tmp_path / "all.npz")]) == 0
    printed = capsys.readouterr().out
    assert ("excluded: evicted 1, failed 1, killed 1, lost 1, never scheduled 1, "
            "still running at trace end 1") in printed


@pytest.mark.parametrize(("text", "needle"), [
    ("9223372036854775808", "above 2**63-1"),
    ("99999999999999999999999", "above 2**63-1"),
    ("1_300_000_000", "'1_300_000_000' is not an integer"),
    (" 5000000", "' 5000000' is not an integer"),
    ("+5000000", "'+5000000' is not an integer"),
    ("5000000 ", "'5000000 ' is not an integer"),
    ("\u0665", "is not an integer"),  # a non-ASCII digit int() would take
])
def test_timestamps_must_be_plain_int64(tmp_path: Path, text: str, needle: str) -> None:
    bad = _corrupt(tmp_path, 7, f"{text},,200,0,,0,u2,0,0,,,0,0")  # SUBMIT of (200, 0)
    with pytest.raises(TraceFormatError) as err:
        parse_task_events([bad])
    assert "bad_events.csv: line 7: timestamp" in str(err.value) and needle in str(err.value)
    _, report = parse_task_events([bad], skip_malformed=True)
    assert report.malformed_total == 1


@pytest.mark.parametrize("text", ["1_0.5", " 0.5", "0.5 ", "nan", "inf", "0x1p-3"])
def test_requests_must_be_plain_numbers(tmp_path: Path, text: str) -> None:
    bad = _corrupt(tmp_path, 8, f"5000000,,200,1,,0,u2,0,0,{text},0.1,0,0")
    with pytest.raises(TraceFormatError, match=r"line 8: CPU request"):
        parse_task_events([bad])


def test_cli_import_huge_timestamp_is_one_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    bad = _corrupt(tmp_path, 3, "18446744073709551616,,100,0,,0,u1,0,0,0.1,0.2,0,0")
    assert _cli(["trace", "import", str(bad), "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "line 3: timestamp" in err
    assert "Traceback" not in err


def test_skip_malformed_counts_per_file(tmp_path: Path) -> None:
    bad = _corrupt(tmp_path, 8, "5000000,,200,1,,9,u2,0,0,0.1,0.1,0,0")  # a SUBMIT of (200, 1)
    jobs, report = parse_task_events([bad, TINY], skip_malformed=True)
    assert report.malformed_skipped == {str(bad): 1, str(TINY): 0}
    assert report.rows == 31 + 32
    assert len(jobs) == 5  # both files describe the same tasks


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(b"this is not gzip")
    with pytest.raises(TraceFormatError, match=r"broken\.csv\.gz"):
        parse_task_events([broken])
    with pytest.raises(FileNotFoundError, match=r"nope\.csv"):
        parse_task_events([tmp_path / "nope.csv"])


# -------------------------------------------------------------- sample fixture


def test_sample_matches_generator_ground_truth() -> None:
    truths = _fixture_module().build()[1]
    jobs, report = parse_task_events([SAMPLE])
    kept = sorted((t for t in truths if t.outcome == "kept"),
                  key=lambda t: (t.arrival_us, t.job, t.task))
    expected_excluded: dict[str, int] = {}
    for t in truths:
        if t.outcome != "kept":
            expected_excluded[t.outcome] = expected_excluded.get(t.outcome, 0) + 1
    assert report.tasks_seen == len(truths) == 304
    assert report.excluded == expected_excluded
    assert {"killed", "failed", "lost", "never_scheduled", "still_running",
            "missing_request", "censored_start"} <= set(report.excluded)
    assert report.run_ends["evicted"] >= sum(t.resubmissions for t in truths if t.outcome
                                             == "kept") - report.run_ends["failed"] > 0
    assert report.resubmissions == sum(t.resubmissions for t in truths) > 0
    assert report.requests_filled == sum(t.filled for t in kept) > 0
    assert len(jobs) == len(kept)
    first = kept[0].arrival_us
    np.testing.assert_array_equal(jobs.arrival_us, [t.arrival_us - first for t in kept])
    np.testing.assert_array_equal(jobs.duration_us, [t.duration_us for t in kept])
    np.testing.assert_array_equal(jobs.cpu, [t.cpu for t in kept])
    np.testing.assert_array_equal(jobs.mem, [t.mem for t in kept])


def test_sample_fixture_is_reproducible(tmp_path: Path) -> None:
    fresh = _fixture_module().write(tmp_path / "again.csv.gz")
    assert fresh.read_bytes() == SAMPLE.read_bytes()
    assert SAMPLE.stat().st_size < 100_000


# ----------------------------------------------------------------- compact file


def test_save_load_round_trip(tmp_path: Path) -> None:
    jobs, report = parse_task_events([TINY])
    path = save_trace(tmp_path / "tiny.npz", jobs, report)
    assert path == tmp_path / "tiny.npz" and path.is_file()
    loaded, loaded_report = load_trace(path)
    for name in ("arrival_us", "duration_us", "cpu", "mem"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(jobs, name))
    assert loaded.span_us == jobs.span_us
    assert loaded_report == report and loaded_report.files == [str(TINY)]


def test_load_rejects_other_files(tmp_path: Path) -> None:
    text = tmp_path / "notes.npz"
    text.write_text("hello")
    with pytest.raises(TraceFileError, match=r"notes\.npz"):
        load_trace(text)
    partial = tmp_path / "partial.npz"
    np.savez(partial, arrival_us=np.zeros(1, dtype=np.int64))
    with pytest.raises(TraceFileError, match=r"partial\.npz.*missing arrays"):
        load_trace(partial)


# ----------------------------------------------------------------------- replay


@pytest.fixture(scope="module")
def sample_npz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    jobs, report = parse_task_events([SAMPLE])
    return save_trace(tmp_path_factory.mktemp("trace") / "sample.npz", jobs, report)


def _one_job_trace(tmp_path: Path) -> Path:
    """A single 25 s job in a 120 s period."""
    jobs = TraceJobs(np.array([0]), np.array([25 * S]), np.array([0.1]), np.array([0.2]),
                     span_us=120 * S)
    return save_trace(tmp_path / "one.npz", jobs, ImportReport())


def test_replay_is_deterministic_per_seed(sample_npz: Path) -> None:
    workload = TraceReplayWorkload(TraceReplayConfig(path=str(sample_npz)), tick_seconds=60.0)
    a = workload.generate(60, np.random.default_rng(7), FLEET)
    b = workload.generate(60, np.random.default_rng(7), FLEET)
    c = workload.generate(60, np.random.default_rng(8), FLEET)
    for name in ("arrival", "cpu", "mem", "duration", "deadline"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert len(a) != len(c) or not np.array_equal(a.arrival, c.arrival)
    assert len(a) > 0
    assert np.all((a.arrival >= 0) & (a.arrival < 60)) and np.all(np.diff(a.arrival) >= 0)
    assert np.all(a.deadline > a.duration) and np.all(a.duration >= 1)
    assert a.arrival.dtype == np.int64 and a.duration.dtype == np.int64


def test_replay_wraps_when_window_exceeds_trace(tmp_path: Path) -> None:
    workload = TraceReplayWorkload(TraceReplayConfig(path=str(_one_job_trace(tmp_path))),
                                   tick_seconds=10.0)
    for seed in range(5):
        table = workload.generate(30, np.random.default_rng(seed), FLEET)  # 300 s, period 120 s
        assert len(table) in (2, 3)
        assert 0 <= table.arrival[0] < 12
        np.testing.assert_array_equal(np.diff(table.arrival), 12)
        np.testing.assert_array_equal(table.duration, 3)  # ceil(25 s / 10 s)
    assert workload.offered_rate(FLEET) == pytest.approx(1 / 12)
    assert workload.mean_duration(FLEET) == 3.0


def test_replay_long_horizon_on_sample(sample_npz: Path) -> None:
    workload = TraceReplayWorkload(TraceReplayConfig(path=str(sample_npz)), tick_seconds=60.0)
    table = workload.generate(500, np.random.default_rng(3), FLEET)  # trace spans ~120 ticks
    assert np.all(table.arrival < 500) and np.all(np.diff(table.arrival) >= 0)
    expected = workload.offered_rate(FLEET) * 500
    assert abs(len(table) - expected) < 0.3 * expected


def test_time_scale_and_duration_clip(tmp_path: Path) -> None:
    path = str(_one_job_trace(tmp_path))
    slow = TraceReplayWorkload(TraceReplayConfig(path=path), tick_seconds=1.0)
    fast = TraceReplayWorkload(TraceReplayConfig(path=path, time_scale=5.0), tick_seconds=1.0)
    clipped = TraceReplayWorkload(TraceReplayConfig(path=path, max_duration_ticks=10),
                                  tick_seconds=1.0)
    assert (slow.mean_duration(FLEET), fast.mean_duration(FLEET)) == (25.0, 5.0)
    assert fast.offered_rate(FLEET) == pytest.approx(5 * slow.offered_rate(FLEET))
    assert clipped.mean_duration(FLEET) == 10.0


def test_stationary_sample_draws_from_job_mix(sample_npz: Path) -> None:
    workload = TraceReplayWorkload(TraceReplayConfig(path=str(sample_npz)), tick_seconds=60.0)
    table = workload.stationary_sample(50, np.random.default_rng(0), FLEET)
    assert len(table) == 50 and np.all(table.arrival == 0)
    assert set(table.cpu.tolist()) <= set(workload.jobs.cpu.tolist())
    assert np.all(table.deadline > table.duration)


def test_config_validation() -> None:
    with pytest.raises(ValidationError):
        TraceReplayConfig(path="x.npz", time_scale=0)
    with pytest.raises(ValidationError):
        TraceReplayConfig(path="x.npz", bogus=1)
    assert TraceReplayConfig(path="x.npz").kind == "trace"


# -------------------------------------------------------------------------- CLI


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cloudrl")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_import_writes_compact_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "traces" / "sample.npz"
    assert _cli(["trace", "import", str(SAMPLE), "--out", str(out)]) == 0
    jobs, report = load_trace(out)
    assert len(jobs) == report.tasks_kept == 239
    printed = capsys.readouterr().out
    assert "239 jobs" in printed and f"killed {report.excluded['killed']}" in printed


def test_cli_import_bad_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = _corrupt(tmp_path, 12, "7000000,,100,1,,0,u1,0,0,0.25,0.05,0")
    out = tmp_path / "bad.npz"
    assert _cli(["trace", "import", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "bad_events.csv" in err and "line 12" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert _cli(["trace", "import", str(tmp_path / "missing.csv"), "--out", str(out)]) == 2
    assert "missing.csv" in capsys.readouterr().err
    assert _cli(["trace", "import", str(bad), "--out", str(out), "--skip-malformed"]) == 0
    assert "malformed rows skipped: 1" in capsys.readouterr().out


def test_cli_copy_of_tiny_in_nested_dir(tmp_path: Path) -> None:
    source = tmp_path / "in" / "task_events.csv"
    source.parent.mkdir()
    shutil.copy(TINY, source)
    assert _cli(["trace", "import", str(source), "--out", str(tmp_path / "t.npz")]) == 0
    assert len(load_trace(tmp_path / "t.npz")[0]) == 5


# ----------------------------------------------------------------------- ranges of trace fields
@pytest.mark.parametrize(("column", "text"), [(2, "-100"), (3, "-1"), (2, "9223372036854775808"),
                                              (3, str(2**64))])
def test_job_ids_and_task_indices_are_int64_and_not_negative(tmp_path: Path, column: int,
                                                             text: str) -> None:
    fields = ["5000000", "", "200", "1", "", "0", "u2", "0", "0", "0.1", "0.1", "0", "0"]
    fields[column] = text
    bad = _corrupt(tmp_path, 8, ",".join(fields))
    name = "job ID" if column == 2 else "task index"
    with pytest.raises(TraceFormatError, match=rf"line 8: {name} '{text}' is outside"):
        parse_task_events([bad])


@pytest.mark.parametrize("last", [4 * 2**60, 2**62, 2**63 - 2, 400 * 365 * 86_400 * 10**6])
def test_a_span_beyond_ten_years_is_refused_naming_the_timestamps(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture,
                                                                  last: int) -> None:
    """A typo'd FINISH near 2**62 would make a task that runs for ~146,000 years."""
    bad = _corrupt(tmp_path, 32, f"{last},,100,0,,4,u1,0,0,0.1,0.2,0,0")
    with pytest.raises(TraceFormatError, match=rf"timestamps span \d+ us \(from \d+ to {last}\)"):
        parse_task_events([bad])
    assert _cli(["trace", "import", str(bad), "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "10 years" in err and str(last) in err


def test_a_span_of_nine_years_still_imports(tmp_path: Path) -> None:
    last = 9 * 365 * 86_400 * 10**6
    ok = _corrupt(tmp_path, 32, f"{last},,100,0,,4,u1,0,0,0.1,0.2,0,0")
    jobs, report = parse_task_events([ok])
    assert report.span_us <= MAX_TRACE_SPAN_US and int(jobs.duration_us.max()) <= report.span_us
