"""A long run stays flat: the events pipeline, live for an hour, must not grow with time.

A streaming job runs for weeks. Whatever it keeps per batch (checkpoint and state files,
metrics rows, log lines, memory) has to be cleaned up as fast as it is made, by Spark's
log compaction and purging, RocksDB's maintenance, the metrics retention, the garbage
collector. A leak shows only in a long run: this one drains a small backlog, then follows a
landing directory at 2,000 events/s for ``--minutes`` from its first batch, and every
``--every`` seconds samples the driver's JVM (RSS, heap), its Python processes, the
checkpoint and state directories, the metrics tables, the driver's log, and the output for
context.

Each series is judged on the last half of the run, counted from the first batch's commit:
the slope of its floor (the least value of each of six windows: what is left right after
a clean-up or a collection), per hour, against a bound per hour. Prints a sample a minute
and a table; writes ``soak.png`` (every series over time) and ``samples.jsonl``, which
``--report`` judges again without a run. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import sqlalchemy as sa

from airflow_provider_backlog.hooks.submit import DRIVER_LOG_LEVEL
from spark_jobs.backlog.values import duration_argument
from spark_jobs.jobs.startup import JavaMissing
from spark_jobs.metrics.schema import (
    backlog_checkpoints,
    backlog_control,
    backlog_leases,
    backlog_transitions,
    make_engine,
)
from tools.pipelines.report import Checkpoint, save_chart
from tools.pipelines.runs import Run, add_workspace_arguments, prepare_workspace, say
from tools.services.ports import free_port

MIB = 1024 * 1024

Point = tuple[float, float]


@dataclass(frozen=True)
class Series:
    """One sampled quantity, and how much it may grow per hour and still count as flat
    (None: shown for context, not judged)."""

    key: str
    label: str
    unit: str
    bound_per_h: float | None


SERIES = (
    Series("jvm_rss_bytes", "driver JVM RSS", "bytes", 16 * MIB),
    Series("jvm_heap_used_bytes", "driver JVM heap used", "bytes", 16 * MIB),
    Series("driver_python_rss_bytes", "driver Python RSS", "bytes", 4 * MIB),
    Series("python_workers_rss_bytes", "Python workers' RSS", "bytes", 16 * MIB),
    Series("python_workers", "Python workers (context)", "processes", None),
    Series("checkpoint_files", "Spark checkpoint files (no state/)", "files", 20),
    Series("checkpoint_bytes", "Spark checkpoint bytes (no state/)", "bytes", 1 * MIB),
    Series("state_files", "state files (state/)", "files", 20),
    Series("state_bytes", "state bytes (state/)", "bytes", 1 * MIB),
    Series("source_state_files", "source state files (hybrid/)", "files", 20),
    Series("source_state_bytes", "source state bytes (hybrid/)", "bytes", 1 * MIB),
    Series("journal_files", "metrics journal files", "files", 20),
    Series("checkpoint_rows", "backlog_checkpoints rows", "rows", 20),
    Series("transition_rows", "backlog_transitions rows", "rows", 20),
    Series("control_rows", "backlog_control rows", "rows", 20),
    Series("lease_rows", "backlog_leases rows", "rows", 20),
    Series("metrics_db_bytes", "metrics database bytes", "bytes", 1 * MIB),
    Series("driver_log_bytes", "driver log bytes", "bytes", 1 * MIB),
    Series("sink_log_files", "file sink log files (_spark_metadata)", "files", 20),
    Series("sink_log_bytes", "file sink log bytes (_spark_metadata)", "bytes", 1 * MIB),
    Series("load_average", "load average, 1 min (context)", "load", None),
    Series("output_files", "output data files (context)", "files", None),
    Series("output_bytes", "output data bytes (context)", "bytes", None),
)


# --- judging ---------------------------------------------------------------------------


def slope_per_h(points: Sequence[Point]) -> float:
    """The least-squares slope of (seconds, value) points, per hour; 0 for fewer than two
    distinct times."""
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return 3600 * sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def last_half(points: Sequence[Point], since: float = 0.0) -> list[Point]:
    """The points from the middle of the time span from ``since`` (the first batch's
    commit: start-up is not the run) to the last point."""
    if not points:
        return []
    middle = (max(since, points[0][0]) + points[-1][0]) / 2
    return [p for p in points if p[0] >= middle]


def floor(points: Sequence[Point], windows: int) -> list[Point]:
    """Per window of equal time, its least point: a saw-tooth shorter than a window (files
    between clean-ups, the heap between collections, a batch's files before the old ones
    are purged) becomes flat, a steady growth keeps its slope."""
    if not points:
        return []
    start, end = points[0][0], points[-1][0]
    width = (end - start) / windows or 1.0
    grouped: dict[int, list[Point]] = {}
    for t, v in points:
        grouped.setdefault(min(int((t - start) / width), windows - 1), []).append((t, v))
    chosen = []
    for _, group in sorted(grouped.items()):
        chosen.append(min(group, key=lambda point: point[1]))
    return chosen


@dataclass(frozen=True)
class Verdict:
    series: Series
    first: float
    last: float
    slope_per_h: float

    @property
    def bounded(self) -> bool | None:
        bound = self.series.bound_per_h
        return None if bound is None else self.slope_per_h <= bound


def judge(
    series: Series, points: Sequence[Point], since: float = 0.0, windows: int = 6
) -> Verdict | None:
    """The slope of the series' floor over the run's last half (None: never sampled)."""
    if not points:
        return None
    half = floor(last_half(points, since), windows)
    return Verdict(series, points[0][1], points[-1][1], slope_per_h(half))


def human(value: float, unit: str) -> str:
    if unit == "bytes":
        for name, size in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", 1024)):
            if abs(value) >= size:
                return f"{value / size:,.1f} {name}"
        return f"{value:,.0f} B"
    return f"{value:,.0f} {unit}"


# --- sampling --------------------------------------------------------------------------


def directory_usage(root: Path, leave_out: Path | None = None) -> tuple[int, int]:
    """Files and bytes under ``root`` (without ``leave_out``), tolerating files that the job
    deletes while they are counted."""
    files = size = 0
    for directory, subdirectories, names in os.walk(root):
        if leave_out is not None and Path(directory) == leave_out.parent:
            subdirectories[:] = [d for d in subdirectories if d != leave_out.name]
        for name in names:
            try:
                size += os.stat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
            files += 1
    return files, size


class JobProcesses:
    """The driver's Python (found by the checkpoint on its command line), its parent the
    driver's JVM, and the Python workers that JVM started: their RSS, and the heap from the
    metrics servlet of the driver's UI."""

    def __init__(self, checkpoint: Path, ui_port: int):
        self._mark = str(checkpoint)
        self._ui_port = ui_port
        self._driver: psutil.Process | None = None

    def _find_driver(self) -> psutil.Process | None:
        if self._driver is not None and self._driver.is_running():
            return self._driver
        self._driver = next(
            (
                p
                for p in psutil.process_iter(["cmdline"])
                if self._mark in (p.info["cmdline"] or [])
                and "java" not in p.name()
                and p.parent() is not None
                and p.parent().name() == "java"
            ),
            None,
        )
        return self._driver

    def sample(self) -> dict[str, float]:
        driver = self._find_driver()
        try:
            jvm = driver.parent() if driver is not None else None
            if driver is None or jvm is None:
                return {}
            workers = [
                p
                for p in jvm.children(recursive=True)
                if p.pid != driver.pid and "python" in p.name()
            ]
            found = {
                "jvm_rss_bytes": float(jvm.memory_info().rss),
                "driver_python_rss_bytes": float(driver.memory_info().rss),
                "python_workers_rss_bytes": float(sum(p.memory_info().rss for p in workers)),
                "python_workers": float(len(workers)),
            }
        except psutil.NoSuchProcess:
            return {}
        heap = self._heap_used()
        if heap is not None:
            found["jvm_heap_used_bytes"] = heap
        return found

    def _heap_used(self) -> float | None:
        """``jvm.heap.used`` of Spark's JvmSource, from the UI's ``/metrics/json``."""
        url = f"http://127.0.0.1:{self._ui_port}/metrics/json/"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                gauges = json.load(answer).get("gauges", {})
        except (OSError, ValueError):
            return None
        return next(
            (float(g["value"]) for key, g in gauges.items() if key.endswith(".jvm.heap.used")),
            None,
        )


def metrics_rows(url: str, job: str) -> dict[str, float]:
    """The job's rows in each metrics table."""
    engine = make_engine(url)
    tables = {
        "checkpoint_rows": backlog_checkpoints,
        "transition_rows": backlog_transitions,
        "control_rows": backlog_control,
        "lease_rows": backlog_leases,
    }
    try:
        with engine.connect() as connection:
            return {
                key: float(
                    connection.execute(
                        sa.select(sa.func.count()).where(table.c.job_name == job)
                    ).scalar_one()
                )
                for key, table in tables.items()
            }
    except sa.exc.OperationalError:  # the job has not created the tables yet
        return {}
    finally:
        engine.dispose()


def committed_batches(checkpoint: Path) -> int:
    """Batches Spark committed, by its own commit log: the latest batch id plus one (the
    files of older batches are purged, the latest is always kept)."""
    commits = checkpoint / "spark" / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.exists() else []
    return max(ids, default=-1) + 1


def file_sizes(*paths: Path) -> float:
    return float(sum(p.stat().st_size for p in paths if p.exists()))


class Sampler:
    """A ``keep_going`` for ``Run.execute``: a sample every ``every_s`` seconds, a line a
    minute, until ``minutes`` have passed since the first batch committed (a loaded machine
    may take minutes to start the job: start-up is not the run)."""

    def __init__(self, run: Run, database: Path, ui_port: int, every_s: float, minutes: float):
        self.run = run
        self.database = database
        self.processes = JobProcesses(run.root / "checkpoint", ui_port)
        self.every_s = every_s
        self.samples: list[dict[str, float]] = []
        self._started = time.monotonic()
        self._run_s = 60 * minutes
        self._first_batch: float | None = None
        self._next = self._started
        self._next_line = self._started + 60
        self.journal = run.root.parent / "samples.jsonl"
        self.journal.write_text("")

    def __call__(self, checkpoints: list[Checkpoint]) -> bool:
        now = time.monotonic()
        if now >= self._next:
            self._next += self.every_s
            if self._first_batch is None and checkpoints:
                self._first_batch = now
            sample = self.take(now, checkpoints)
            if now >= self._next_line:
                self._next_line += 60
                say(f"[soak] {self.line(sample)}")
        return self._first_batch is None or now < self._first_batch + self._run_s

    def finish(self, checkpoints: list[Checkpoint]) -> dict[str, float]:
        """The last sample, taken once the job has exited: nothing commits between its
        readings, so its counts (batches, rows, Spark's commit log) agree by construction,
        where a sample of the running job may see a batch in one reading and not the next."""
        sample = self.take(time.monotonic(), checkpoints)
        sample["committed_batches"] = float(committed_batches(self.run.root / "checkpoint"))
        return sample

    def take(self, now: float, checkpoints: list[Checkpoint]) -> dict[str, float]:
        sample = {"t": now - self._started, "batches": float(len(checkpoints))}
        sample |= self.measure()
        self.samples.append(sample)
        with self.journal.open("a") as journal:
            journal.write(json.dumps(sample) + "\n")
        return sample

    def measure(self) -> dict[str, float]:
        checkpoint = self.run.root / "checkpoint"
        spark, state = checkpoint / "spark", checkpoint / "spark" / "state"
        output, sink_log = self.run.root / "output", self.run.root / "output" / "_spark_metadata"
        found = self.processes.sample()
        found["load_average"] = os.getloadavg()[0]
        for key, usage in (
            ("checkpoint", directory_usage(spark, leave_out=state)),
            ("state", directory_usage(state)),
            ("source_state", directory_usage(checkpoint / "hybrid")),
            ("journal", directory_usage(checkpoint / "metrics-journal")),
            ("sink_log", directory_usage(sink_log)),
            ("output", directory_usage(output, leave_out=sink_log)),
        ):
            found[f"{key}_files"], found[f"{key}_bytes"] = map(float, usage)
        found |= metrics_rows(self.run.metrics_url, self.run.name)
        db = self.database
        found["metrics_db_bytes"] = file_sizes(db, Path(f"{db}-wal"), Path(f"{db}-shm"))
        found["driver_log_bytes"] = file_sizes(self.run.root / "job.log")
        return found

    @staticmethod
    def line(sample: dict[str, float]) -> str:
        def show(key: str, unit: str) -> str:
            return human(sample[key], unit) if key in sample else "-"

        return (
            f"{sample['t'] / 60:5.1f} min, {sample['batches']:,.0f} batches: "
            f"JVM {show('jvm_rss_bytes', 'bytes')} (heap {show('jvm_heap_used_bytes', 'bytes')}), "
            f"Python {show('driver_python_rss_bytes', 'bytes')} + "
            f"{show('python_workers_rss_bytes', 'bytes')}; checkpoint "
            f"{show('checkpoint_files', 'files')}, state {show('state_files', 'files')}, "
            f"source state {show('source_state_bytes', 'bytes')}; "
            f"{show('checkpoint_rows', 'rows')}; log {show('driver_log_bytes', 'bytes')}"
        )


# --- the report ------------------------------------------------------------------------


def points(samples: Sequence[dict[str, float]], key: str) -> list[Point]:
    return [(s["t"], s[key]) for s in samples if key in s]


def first_batch_at(samples: Sequence[dict[str, float]]) -> float:
    """When the first sample saw a committed batch: the run proper starts there."""
    return next((s["t"] for s in samples if s["batches"]), 0.0)


def table(verdicts: Sequence[Verdict]) -> list[str]:
    lines = [
        f"{'series':36}{'first':>12}{'last':>12}{'slope per h':>15}{'bound per h':>14}  verdict"
    ]
    for v in verdicts:
        unit, bound = v.series.unit, v.series.bound_per_h
        verdict = {True: "bounded", False: "GROWS", None: "context"}[v.bounded]
        lines.append(
            f"{v.series.label:36}{human(v.first, unit):>12}{human(v.last, unit):>12}"
            f"{human(v.slope_per_h, unit):>15}"
            f"{'-' if bound is None else human(bound, unit):>14}  {verdict}"
        )
    return lines


def plot(samples: Sequence[dict[str, float]], verdicts: Sequence[Verdict], path: Path) -> Path:
    """A panel per series over minutes, the judged last half shaded, the slope in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = -(-len(verdicts) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(15, 2.6 * rows), squeeze=False)
    for axis in axes.flat[len(verdicts) :]:
        axis.set_visible(False)
    since = first_batch_at(samples) / 60
    end = samples[-1]["t"] / 60 if samples else 0.0
    for axis, verdict in zip(axes.flat, verdicts, strict=False):
        series = verdict.series
        scale = MIB if series.unit == "bytes" else 1
        found = points(samples, series.key)
        axis.plot([t / 60 for t, _ in found], [v / scale for _, v in found], lw=1)
        axis.axvspan((since + end) / 2, end, color="#dddddd", alpha=0.5, lw=0)
        state = {True: "bounded", False: "GROWS", None: "context"}[verdict.bounded]
        axis.set_title(
            f"{series.label}\n{human(verdict.slope_per_h, series.unit)}/h: {state}",
            fontsize="small",
        )
        axis.set_ylabel("MiB" if series.unit == "bytes" else series.unit, fontsize="small")
        axis.tick_params(labelsize="x-small")
    for axis in axes[-1]:
        axis.set_xlabel("minutes (shaded: the half judged)", fontsize="small")
    return save_chart(figure, path, dpi=90)


def summary(
    live_events_per_s: int, samples: Sequence[dict[str, float]], verdicts: Sequence[Verdict]
) -> dict[str, object]:
    judged = [v.bounded for v in verdicts if v.bounded is not None]
    loads = [load for _, load in points(samples, "load_average")]
    return {
        "minutes": round(samples[-1]["t"] / 60, 1) if samples else 0.0,
        "samples": len(samples),
        "batches": int(samples[-1]["batches"]) if samples else 0,
        "committed_batches": int(samples[-1].get("committed_batches", 0)) if samples else 0,
        "live_events_per_s": live_events_per_s,
        "load_average_1min": round(sum(loads) / len(loads), 2) if loads else None,
        "bounded": bool(judged) and all(judged),
        "series": {
            v.series.key: {
                "unit": v.series.unit,
                "first": round(v.first),
                "last": round(v.last),
                "slope_per_h": round(v.slope_per_h),
                "bound_per_h": v.series.bound_per_h,
                "bounded": v.bounded,
            }
            for v in verdicts
        },
    }


# --- the run ---------------------------------------------------------------------------


def spark_conf(args: argparse.Namespace, ui_port: int) -> dict[str, str]:
    """Backlog-aware checkpointing as the benchmark runs it, with the metrics retention, the
    log level the provider launches with, and the UI on (as in production) serving the JVM's
    heap; then ``--conf``."""
    conf = {
        "spark.backlog.checkpointing.interval": args.interval,
        "spark.backlog.checkpointing.interval-during-backlog": "30s",
        "spark.backlog.metrics.retention": args.retention,
        "spark.log.level": DRIVER_LOG_LEVEL,
        "spark.ui.enabled": "true",
        "spark.ui.port": str(ui_port),
        "spark.metrics.conf.driver.source.jvm.class": "org.apache.spark.metrics.source.JvmSource",
    }
    for item in args.conf:
        key, _, value = item.partition("=")
        conf[key] = value
    return conf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__)
    add_workspace_arguments(parser, "var/soak", events=100_000)
    parser.add_argument("--minutes", type=float, default=60.0, help="from the first batch's commit")
    parser.add_argument("--every", type=duration_argument, default=5.0, help="sample period")
    parser.add_argument("--interval", default="1s", help="the live checkpoint interval")
    parser.add_argument("--retention", default="1h", help="spark.backlog.metrics.retention")
    parser.add_argument(
        "--max-file-age", default="10min", help="the landing directory's maxFileAge"
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="more Spark conf"
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="SAMPLES",
        help="judge a finished run's samples.jsonl again (chart beside it), without a run",
    )
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.conf):
        parser.error("--conf takes KEY=VALUE")
    if args.report:
        samples = [json.loads(line) for line in args.report.read_text().splitlines() if line]
        report(samples, args.live_events_per_s, args.report.with_name("soak.png"))
        return 0
    try:
        workspace = prepare_workspace(args)
    except JavaMissing as error:
        print(f"scripts/soak: {error}", file=sys.stderr)
        return 2
    ui_port = free_port()
    run = Run(
        "soak",
        workspace.root / "run",
        workspace.root / "history",
        workspace.metrics_url,
        spark_conf(args, ui_port),
        # The run's own limit, well after the soak's end (the last one given wins).
        [
            "--timeout",
            f"{round(60 * args.minutes) + 600}s",
            "--landing-max-file-age",
            args.max_file_age,
        ],
    )
    sampler = Sampler(run, workspace.root / "metrics.db", ui_port, args.every, args.minutes)
    say(
        f"[soak] {args.minutes:g} min at {args.live_events_per_s:,} events/s, a sample every "
        f"{args.every:g} s (driver UI: http://127.0.0.1:{ui_port})"
    )
    sampler.finish(run.execute(workspace.first_live_id, args.live_events_per_s, sampler))
    report(sampler.samples, args.live_events_per_s, workspace.root / "soak.png")
    return 0


def report(samples: Sequence[dict[str, float]], live_events_per_s: int, chart: Path) -> None:
    """The table, the chart and the JSON line of a run's samples."""
    since = first_batch_at(samples)
    verdicts = [v for s in SERIES if (v := judge(s, points(samples, s.key), since)) is not None]
    for line in table(verdicts):
        say(line)
    say(f"chart: {plot(samples, verdicts, chart)}")
    say(json.dumps(summary(live_events_per_s, samples, verdicts)))


if __name__ == "__main__":
    sys.exit(main())
