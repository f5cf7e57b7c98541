"""Side by side with Apache Flink, which has FLIP-309 natively: the same backlog and the same
live events through our events pipeline (backlog-aware) and through PyFlink's HybridSource
(tools/flink/job.py, in .venv-flink), with the same checkpoint intervals.

Each side runs alone, one after the other, with 2,000 live events/s landing from the start.
Reported for both: backlog rows/s and checkpoints during the backlog, and live freshness of
the windowed totals (when a window's row is committed to the sink, minus the window's end)
once caught up. The last line is one JSON object with the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from spark_jobs.backlog.values import count_argument
from spark_jobs.jobs.startup import JavaMissing, require_java
from tools import REPOSITORY
from tools.benchmarks.benchmark import measure, setups
from tools.data.events import LiveProducer
from tools.pipelines.report import (
    BACKLOG_COLOUR,
    LIVE_COLOUR,
    Checkpoint,
    Reentry,
    phase_stats,
    save_chart,
    warm_up_s,
    weighted_percentile,
)
from tools.pipelines.runs import Run, Workspace, add_workspace_arguments, prepare_workspace, say
from tools.services.ports import free_port

ROOT = REPOSITORY
FLINK_PYTHON = ROOT / ".venv-flink" / "bin" / "python"
FLINK_JOB = ROOT / "tools" / "flink" / "job.py"
#: tools/flink/job.py's sink: CSV rows of window_start, window_end, account, events, amount.
FLINK_SINK_COLUMNS = ["window_start", "window_end", "account", "events", "amount"]
#: The HybridSource's log lines, with the JVM's local time (the job runs with TZ=UTC).
SOURCE_STARTED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Starting enumerator for sourceIndex=(\d+)",
    re.MULTILINE,
)


class FlinkMissing(Exception):
    pass


@dataclass(frozen=True)
class WindowRow:
    """One row of windowed totals in a sink: its window's end, its events, and when the file
    holding it was last written (all epoch seconds)."""

    window_end: float
    events: int
    written_at: float


@dataclass(frozen=True)
class Side:
    """What one engine did: the backlog phase, then live freshness over a measured span.

    ``backlog_s`` runs from the backlog's reading starting (ours: its first batch; Flink's:
    its first source) to its end (ours: the last backlog commit; Flink's: the switch to
    live); ``submitted_s`` from the job's submission to the commit of the backlog's last
    output (Flink's: the first checkpoint completed after the switch), deployment and
    warm-up included."""

    backlog_rows: int
    backlog_s: float
    submitted_s: float
    backlog_checkpoints: int
    freshness_p50_s: float
    freshness_p95_s: float
    windows_measured: int

    @property
    def backlog_rows_per_s(self) -> float:
        return self.backlog_rows / self.backlog_s if self.backlog_s > 0 else float("nan")

    @property
    def submitted_rows_per_s(self) -> float:
        return self.backlog_rows / self.submitted_s if self.submitted_s > 0 else float("nan")


def required_ratio(events: int) -> float:
    """Ours over Flink's backlog rows/s from submission that is aimed at: 1.5x on a long
    backlog (20,000,000 events and more), 1.0x on shorter ones."""
    return 1.5 if events >= 20_000_000 else 1.0


def write_csv_history(parquet_dir: Path, csv_dir: Path, files: int) -> int:
    """The parquet history again as headerless CSV lines ``event_id,account,amount,
    event_time_ms``, in event-time order, cut into ``files`` contiguous parts: one per
    parallel reader, so each reads in event-time order and none falls behind the watermark.
    Returns the rows written."""
    table = pq.read_table(parquet_dir).sort_by("event_id")
    millis = pc.divide(table["event_time"].cast(pa.int64()), 1000)
    table = table.set_column(table.schema.get_field_index("event_time"), "event_time", millis)
    csv_dir.mkdir(parents=True, exist_ok=True)
    per_file = -(-table.num_rows // files)
    for index in range(files):
        part = table.slice(index * per_file, per_file)
        options = pcsv.WriteOptions(include_header=False, quoting_style="none")
        pcsv.write_csv(part, csv_dir / f"history-{index:05d}.csv", options)
    return table.num_rows


def committed_at(written_at: float, commits: Sequence[float]) -> float | None:
    """A sink file becomes visible at the first commit (a batch's, a checkpoint's) that ends
    at or after its last write; None if none did."""
    return next((commit for commit in sorted(commits) if commit >= written_at), None)


def window_freshness(
    rows: Sequence[WindowRow], commits: Sequence[float], since: float, span_s: float
) -> list[tuple[float, float]]:
    """(seconds from a window's end to the commit of its row, events) for the windows that end
    within ``span_s`` after ``since``."""
    samples = []
    for row in rows:
        if since <= row.window_end <= since + span_s:
            commit = committed_at(row.written_at, commits)
            if commit is not None:
                samples.append((commit - row.window_end, float(row.events)))
    return samples


def backlog_span(log: str) -> tuple[float, float] | None:
    """When the HybridSource started its first child (the backlog) and its last, in epoch
    seconds, from Flink's log; None until both happened."""
    started = {int(index): at for at, index in SOURCE_STARTED.findall(log)}
    if 0 not in started or max(started) == 0:
        return None

    def epoch(text: str) -> float:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()

    return epoch(started[0]), epoch(started[max(started)])


def completed_checkpoints(history: Sequence[dict]) -> list[tuple[float, float]]:
    """(triggered, completed) epoch seconds of the completed checkpoints in a Flink REST
    ``/jobs/:id/checkpoints`` history, oldest first."""
    done = [
        (c["trigger_timestamp"] / 1000, (c["trigger_timestamp"] + c["end_to_end_duration"]) / 1000)
        for c in history
        if c["status"] == "COMPLETED"
    ]
    return sorted(done)


def side_from(
    backlog_rows: int,
    submitted_at: float,
    backlog: tuple[float, float],
    checkpoints: Sequence[tuple[float, float]],
    rows: Sequence[WindowRow],
    settle_s: float,
    span_s: float,
) -> Side:
    """One engine's figures, from its submission, its backlog span, its (start, commit)
    checkpoints and its sink's rows. Freshness covers the windows ending within ``span_s``
    from ``settle_s`` after the first commit past the backlog: earlier ones hold live
    events that piled up during the backlog."""
    start, end = backlog
    commits = [done for _, done in checkpoints]
    committed = committed_at(end, commits)
    since = next((done for done in commits if done > end), end) + settle_s
    fresh = window_freshness(rows, commits, since, span_s)
    return Side(
        backlog_rows=backlog_rows,
        backlog_s=end - start,
        submitted_s=float("nan") if committed is None else committed - submitted_at,
        backlog_checkpoints=sum(1 for begun, _ in checkpoints if start <= begun <= end),
        freshness_p50_s=weighted_percentile(fresh, 0.5),
        freshness_p95_s=weighted_percentile(fresh, 0.95),
        windows_measured=len(fresh),
    )


def summary(
    events: int, events_per_s: int, spark: Side, flink: Side, extra: dict[str, object]
) -> dict[str, object]:
    """The JSON line: both sides' figures under ``spark.`` and ``flink.``, then the ratios and
    whether the targets hold (ours over Flink's backlog rows/s from submission at least
    ``required_ratio``, live p50 freshness within 1 s of Flink's)."""
    found: dict[str, object] = {"events": events, "live_events_per_s": events_per_s}
    for name, side in (("spark", spark), ("flink", flink)):
        for key, value in asdict(side).items():
            found[f"{name}.{key}"] = value
        found[f"{name}.backlog_rows_per_s"] = side.backlog_rows_per_s
        found[f"{name}.submitted_rows_per_s"] = side.submitted_rows_per_s
    submitted = spark.submitted_rows_per_s / flink.submitted_rows_per_s
    diff = spark.freshness_p50_s - flink.freshness_p50_s
    found |= {
        "submitted_rows_per_s_ratio": submitted,
        "backlog_rows_per_s_ratio": spark.backlog_rows_per_s / flink.backlog_rows_per_s,
        "freshness_p50_diff_s": diff,
        "target.submitted_rows_per_s_ratio": required_ratio(events),
        "target.submitted_rows_per_s_ratio_met": submitted >= required_ratio(events),
        "target.freshness_p50_within_1s": diff <= 1.0,
        **extra,
    }
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in found.items()}


def window_rows(table: pa.Table, written_at: float) -> list[WindowRow]:
    """A sink file's rows (``window_end`` a timestamp of any unit, naive ones UTC)."""
    ends = table["window_end"]
    millis = ends.cast(pa.timestamp("ms", tz=ends.type.tz)).cast(pa.int64())
    return [
        WindowRow(end / 1000, count, written_at)
        for end, count in zip(millis.to_pylist(), table["events"].to_pylist(), strict=True)
    ]


def spark_rows(output: Path) -> list[WindowRow]:
    """The parquet sink's rows; files of a batch are written before its commit."""
    rows = []
    for path in sorted(output.glob("part-*.parquet")):
        table = pq.read_table(path, columns=["window_end", "events"])
        rows += window_rows(table, path.stat().st_mtime)
    return rows


def flink_rows(output: Path) -> list[WindowRow]:
    """The CSV sink's committed part files (in-progress ones are hidden, named with a dot)."""
    rows = []
    options = pcsv.ReadOptions(column_names=FLINK_SINK_COLUMNS)
    # Flink writes UTC (the job's session time zone) without a zone.
    convert = pcsv.ConvertOptions(column_types={"window_end": pa.timestamp("ms")})
    for path in sorted(output.glob("part-*")):
        if path.stat().st_size:
            table = pcsv.read_csv(path, read_options=options, convert_options=convert)
            rows += window_rows(table, path.stat().st_mtime)
    return rows


def run_spark(
    args: argparse.Namespace, workspace: Workspace
) -> tuple[Side, dict[str, float | None]]:
    """Ours, backlog-aware, exactly as scripts/benchmark runs it."""
    aware = next(
        s
        for s in setups(args.interval, args.interval_during_backlog, 1, args.max_batch_rows)
        if s.name == "backlog-aware"
    )
    run = Run(
        "peer-spark",
        workspace.root / "spark",
        workspace.root / "history",
        workspace.metrics_url,
        aware.conf,
        [*aware.args, "--rows-per-partition", str(rows_per_partition(args))],
    )
    wait = args.settle_s + args.measure_s + args.tail_s
    done: list[float] = []

    def keep_going(checkpoints: list[Checkpoint]) -> bool:
        live = [c for c in checkpoints if not c.is_backlog]
        if live and not done:
            done.append(live[0].committed_at)
        return not done or time.time() - done[0] < wait

    checkpoints = run.execute(workspace.first_live_id, args.live_events_per_s, keep_going)
    backlog = [c for c in checkpoints if c.is_backlog]
    assert run.submitted_at is not None
    side = side_from(
        phase_stats(backlog).rows,
        run.submitted_at,
        (checkpoints[0].started_at, backlog[-1].committed_at),
        [(c.started_at, c.committed_at) for c in checkpoints],
        spark_rows(run.root / "output"),
        args.settle_s,
        args.measure_s,
    )
    inputs = measure(aware, checkpoints, args.measure_s, Reentry(None, None))
    return side, {
        "spark.input_freshness_p50_s": inputs.freshness_p50_s,
        "spark.input_freshness_p95_s": inputs.freshness_p95_s,
        "spark.first_batch_s": backlog[0].duration_s,
        "spark.first_batch_rows": backlog[0].rows,
        "spark.warm_up_s": warm_up_s(backlog),
    }


def rows_per_partition(args: argparse.Namespace) -> int:
    """Ours, one task per core of ``local[2]`` for a full batch unless told otherwise."""
    return args.rows_per_partition or max(1, args.max_batch_rows // 2)


def rest(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.load(response)


def run_flink(args: argparse.Namespace, workspace: Workspace, history_rows: int) -> Side:
    """PyFlink's HybridSource on the CSV copy of the history, then the landing directory."""
    root = workspace.root / "flink"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    port = free_port()
    command = [
        str(FLINK_PYTHON),
        str(FLINK_JOB),
        "--history",
        str(workspace.root / "history-csv"),
        "--landing",
        str(root / "landing"),
        "--output",
        str(root / "output"),
        "--checkpoint",
        str(root / "checkpoint"),
        "--interval-ms",
        str(round(args.interval * 1000)),
        "--interval-during-backlog-ms",
        str(round(args.interval_during_backlog * 1000)),
        "--parallelism",
        str(args.parallelism),
        "--rest-port",
        str(port),
    ]
    logs = root / "log"
    logs.mkdir()
    environment = os.environ | {"FLINK_LOG_DIR": str(logs), "TZ": "UTC"}
    producer = LiveProducer(
        root / "landing", workspace.first_live_id, args.live_events_per_s, file_every_s=0.25
    )
    say(f"[flink] starting the job (Flink log: {logs})")
    producer.start()
    submitted_at = time.time()
    with (root / "job.out").open("w") as out:
        # Its own process group: the PyFlink gateway starts a JVM that must go with it.
        job = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
    try:
        span = None
        while span is None or time.time() < span[1] + args.settle_s + args.measure_s + args.tail_s:
            if job.poll() is not None:
                tail = (root / "job.out").read_text()[-3000:]
                raise RuntimeError(f"the Flink job ended ({job.returncode}):\n{tail}")
            if span is None:
                span = backlog_span("".join(p.read_text() for p in logs.glob("*.log")))
                if span is not None:
                    say(f"[flink] backlog read in {span[1] - span[0]:.1f} s; now live")
            time.sleep(0.5)
        # The mini-cluster runs this one job.
        job_id = rest(port, "/jobs")["jobs"][0]["id"]
        history = rest(port, f"/jobs/{job_id}/checkpoints")["history"]
    finally:
        producer.stop()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(60)
    (root / "checkpoints.json").write_text(json.dumps(history))
    checkpoints = completed_checkpoints(history)
    say(f"[flink] {len(checkpoints)} checkpoints completed")
    rows = flink_rows(root / "output")
    return side_from(
        history_rows, submitted_at, span, checkpoints, rows, args.settle_s, args.measure_s
    )


def table(events: int, spark: Side, flink: Side) -> list[str]:
    lines = [
        "| events | engine | from submission (s) | rows/s from submission | backlog (s) "
        "| backlog rows/s | backlog checkpoints | live freshness p50 (s) "
        "| live freshness p95 (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, side in (("ours (backlog-aware)", spark), ("Flink (HybridSource)", flink)):
        lines.append(
            f"| {events:,} | {name} | {side.submitted_s:.1f} | "
            f"{side.submitted_rows_per_s:,.0f} | {side.backlog_s:.1f} | "
            f"{side.backlog_rows_per_s:,.0f} | {side.backlog_checkpoints} | "
            f"{side.freshness_p50_s:.2f} | {side.freshness_p95_s:.2f} |"
        )
    return lines


def scale_chart(results: Sequence[dict[str, Any]], path: Path) -> Path:
    """Backlog rows/s against the backlog's size, both engines: from submission (solid) and
    from the backlog's reading starting (dashed)."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    events = [found["events"] for found in results]
    for engine, colour, label in (
        ("spark", BACKLOG_COLOUR, "ours (backlog-aware)"),
        ("flink", LIVE_COLOUR, "Flink 2.3 (HybridSource)"),
    ):
        submitted = [found[f"{engine}.submitted_rows_per_s"] for found in results]
        reading = [found[f"{engine}.backlog_rows_per_s"] for found in results]
        axes.plot(events, submitted, "o-", color=colour, label=f"{label}, from submission")
        axes.plot(events, reading, "s--", color=colour, alpha=0.6, label=f"{label}, reading only")
    top = max(found[key] for found in results for key in found if key.endswith("rows_per_s"))
    for found in results:
        axes.annotate(
            f"{found['submitted_rows_per_s_ratio']:.2f}x",
            (found["events"], 1.0),
            xycoords=("data", "axes fraction"),
            textcoords="offset points",
            xytext=(0, -16),
            ha="center",
            fontsize=10,
            fontweight="bold",
        )
    axes.set_xscale("log")
    axes.set_xticks(events, [f"{n / 1e6:g}M" for n in events])
    axes.set_xlabel("backlog (events)")
    axes.set_ylabel("backlog rows/s")
    axes.set_ylim(0, top * 1.18)
    axes.yaxis.set_major_formatter(lambda value, _: f"{value / 1000:,.0f}k")
    axes.set_title("Draining a backlog, ours and Flink (top: ours over Flink's, from submission)")
    axes.legend(fontsize=8, loc="center left")
    axes.grid(alpha=0.3)
    return save_chart(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/flink-benchmark", description=__doc__)
    add_workspace_arguments(parser, "var/flink-benchmark", events=1_000_000)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--interval-during-backlog", type=float, default=30.0, help="seconds")
    parser.add_argument(
        "--max-batch-rows",
        type=count_argument,
        default=20_000_000,
        help="ours: a backlog batch's rows at most (the query streams them through its "
        "aggregation, so they are not held at once)",
    )
    parser.add_argument(
        "--rows-per-partition",
        type=count_argument,
        help="ours: rows per task (default: --max-batch-rows over local[2]'s 2 cores)",
    )
    parser.add_argument("--parallelism", type=count_argument, default=2, help="Flink's")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=20.0,
        help="live time left out after the backlog (one window and the watermark's delay)",
    )
    parser.add_argument(
        "--measure-s", type=float, default=60.0, help="live span whose windows are measured"
    )
    parser.add_argument(
        "--tail-s",
        type=float,
        default=30.0,
        help="live time after the span, for its last windows to close and commit",
    )
    parser.add_argument(
        "--sizes",
        type=count_argument,
        nargs="+",
        help="backlogs to compare in turn (events each; instead of --events), with a chart",
    )
    args = parser.parse_args(argv)
    if not FLINK_PYTHON.exists():
        print(
            "scripts/flink-benchmark: the Flink peer is not set up (.venv-flink is missing). "
            "Run scripts/flink-setup first: it installs apache-flink 2.3.0 from PyPI into "
            ".venv-flink, about a minute.",
            file=sys.stderr,
        )
        return 2
    try:
        require_java()
    except JavaMissing as error:
        print(f"scripts/flink-benchmark: {error}", file=sys.stderr)
        return 2
    results = []
    for events in args.sizes or [args.events]:
        found = compare(argparse.Namespace(**{**vars(args), "events": events}))
        results.append(found)
        say(json.dumps(found))
    if len(results) > 1:
        say(f"chart: {scale_chart(results, args.workdir.resolve() / 'flink-scale.png')}")
    return 0


def compare(args: argparse.Namespace) -> dict[str, object]:
    """One backlog of ``args.events`` through both engines, one after the other."""
    workspace = prepare_workspace(args)
    say(f"writing the same backlog as CSV for Flink ({args.parallelism} files)")
    rows = write_csv_history(
        workspace.root / "history", workspace.root / "history-csv", args.parallelism
    )
    load = {"load_average_start": os.getloadavg()[0]}
    spark, inputs = run_spark(args, workspace)
    load["load_average_between"] = os.getloadavg()[0]
    flink = run_flink(args, workspace, rows)
    load["load_average_end"] = os.getloadavg()[0]
    for line in ["", *table(args.events, spark, flink), ""]:
        say(line)
    found = summary(args.events, args.live_events_per_s, spark, flink, inputs | load)
    say(
        f"{args.events:,} events: from submission ours drains the backlog at "
        f"{found['submitted_rows_per_s_ratio']}x Flink's rows/s "
        f"({found['backlog_rows_per_s_ratio']}x once reading); its live freshness p50 is "
        f"{found['freshness_p50_diff_s']:+} s from Flink's (load average "
        f"{load['load_average_start']:.1f} at the start, {load['load_average_end']:.1f} at "
        f"the end, on {os.cpu_count()} cores)."
    )
    return found


if __name__ == "__main__":
    sys.exit(main())
