"""``cloudrl trace import``: turn Google trace v2 ``task_events`` shards into a compact file.

Usage::

    cloudrl trace import part-00000-of-00500.csv.gz part-00001-of-00500.csv.gz \\
        --out traces/google_v2.npz [--skip-malformed]

The compact ``.npz`` is what ``TraceReplayConfig.path`` points at. Errors (a
malformed row, a missing file) print one line to stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envs.workloads.google_trace import (
    EXCLUSION_LABELS,
    ImportReport,
    TraceFormatError,
    TraceJobs,
    parse_task_events,
    save_trace,
)

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``trace import`` to a CLI's subparsers; the handler is ``args.func``."""
    trace = subparsers.add_parser("trace", help="Google cluster trace v2 tools")
    actions = trace.add_subparsers(dest="trace_command", metavar="{import}", required=True)
    importer = actions.add_parser(
        "import", help="parse task_events shards (.csv / .csv.gz) into a compact .npz")
    importer.add_argument("paths", nargs="+", metavar="PATH", help="task_events shard(s)")
    importer.add_argument("--out", required=True, metavar="FILE", help="compact .npz to write")
    importer.add_argument("--skip-malformed", action="store_true",
                          help="skip and count malformed rows instead of failing")
    importer.set_defaults(func=run_import)
    return trace


def _counts(by_reason: dict[str, int]) -> str:
    """``evicted 3, never scheduled 2, ...`` in the report's reason order."""
    order = {reason: i for i, reason in enumerate(EXCLUSION_LABELS)}
    reasons = sorted(by_reason, key=lambda r: (order.get(r, len(order)), r))
    return ", ".join(f"{EXCLUSION_LABELS.get(r, r)} {by_reason[r]}" for r in reasons)


def format_summary(jobs: TraceJobs, report: ImportReport, out: Path) -> str:
    """A short human summary of an import."""
    hours = report.span_us / 3.6e9
    lines = [
        f"wrote {out}: {len(jobs)} jobs from {len(report.files)} file(s), "
        f"{report.rows} rows, {hours:.2f} h of trace",
        f"tasks: {report.tasks_seen} seen, {report.tasks_finished} finished, "
        f"{report.tasks_kept} kept, {report.resubmissions} resubmissions",
    ]
    if report.excluded:
        lines.append(f"excluded: {_counts(report.excluded)}")
    if report.run_ends:
        lines.append(f"runs ended without FINISH (all tasks, kept ones too): "
                     f"{_counts(report.run_ends)}")
    lines.append(f"requests: {report.requests_filled} filled from other events, "
                 f"{report.requests_floored} floored, {report.requests_clipped} clipped")
    if report.malformed_skipped:
        per_file = ", ".join(f"{f}: {n}" for f, n in report.malformed_skipped.items())
        lines.append(f"malformed rows skipped: {report.malformed_total} ({per_file})")
    if len(jobs) == 0:
        lines.append("warning: no finished task with known requests; nothing to replay")
    return "\n".join(lines)


def run_import(args: argparse.Namespace) -> int:
    """Handler of ``cloudrl trace import``; returns the process exit code."""
    out = Path(args.out)
    try:
        jobs, report = parse_task_events(args.paths, skip_malformed=args.skip_malformed)
        out.parent.mkdir(parents=True, exist_ok=True)
        save_trace(out, jobs, report)
    except (TraceFormatError, OSError, ValueError) as err:
        print(f"cloudrl trace import: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(format_summary(jobs, report, out))
    return EXIT_OK
