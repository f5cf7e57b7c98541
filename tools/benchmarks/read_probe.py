"""Read speed of the hybrid source against Spark's own parquet source, on the same history.

The same parquet history is read in one large micro-batch by (a) Spark's built-in parquet
streaming source and (b) the hybrid source (the history, then an empty landing directory),
through the same queries:

- ``aggregate``: events and amounts per account (complete mode);
- ``windowed``: the events pipeline's event-time windowed aggregation with its watermark.

Both run on the pipeline's state store into Spark's ``noop`` sink, each on a fresh checkpoint
(so the hybrid source admits every file again, as a new job does), the two sources
alternating within each repetition after one warm-up of each. A run's rows/s is its data
batch's rows over that batch's whole duration (``triggerExecution``: planning, reading, the
query, the commit). Reports the median rows/s per query and source, and the ratio
hybrid/builtin of the medians; the last line is one JSON object.

Timings on a shared machine are noisy: compare the ratios, measured side by side, rather than
rows/s across runs. On a loaded machine wall time also favours the source that runs more
processes (the hybrid source reads in Python workers beside the JVM's threads), so each run
also counts the CPU seconds of Spark's process tree (the JVM and its Python workers), and the
summary gives the ratio of CPU seconds per row too (``cpu_ratio``: builtin's over hybrid's,
so that above 1 means the hybrid source works less, as for ``ratio``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spark_jobs.backlog.values import count_argument
from spark_jobs.jobs.startup import JavaMissing, prepare_driver_environment, require_java
from tools.pipelines.runs import prepare_history, say

SOURCES = ("builtin", "hybrid")
QUERIES = ("aggregate", "windowed")
#: The parts of a progress event's duration shown per run, to see where a batch's time goes.
PHASES = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets")


@dataclass(frozen=True)
class Measurement:
    """One data batch: its rows, its whole duration and the parts of it (``PHASES``), in ms,
    and the CPU seconds Spark's processes spent on the whole run."""

    source: str
    query: str
    rows: int
    duration_ms: int
    phases_ms: Mapping[str, int]
    cpu_s: float = 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / max(self.duration_ms, 1) * 1000

    @property
    def rows_per_cpu_s(self) -> float:
        return self.rows / max(self.cpu_s, 0.01)


def stat_cpu_ticks(stat: str) -> tuple[int, int]:
    """The parent's pid and the CPU ticks (own and of waited-for children) in a
    ``/proc/<pid>/stat`` line."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[1]), sum(int(value) for value in fields[11:15])


def tree_cpu_s(root: int) -> float:
    """CPU seconds of process ``root`` and every live descendant (Linux)."""
    tree: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent, ticks[int(entry)] = stat_cpu_ticks(Path(f"/proc/{entry}/stat").read_text())
            except OSError:  # gone meanwhile
                continue
            tree.setdefault(parent, []).append(int(entry))
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total += ticks.get(pid, 0)
        pending += tree.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def data_batch(progress: Iterable[Mapping[str, Any]], source: str, query: str) -> Measurement:
    """The measurement of the one batch that read data, from a query's progress events."""
    read = [p for p in progress if p.get("numInputRows", 0) > 0]
    if len(read) != 1:
        batches = [(p.get("batchId"), p.get("numInputRows")) for p in progress]
        raise RuntimeError(
            f"{source}/{query}: expected the history in one batch, got (batch, rows) {batches}"
        )
    durations = read[0]["durationMs"]
    return Measurement(
        source,
        query,
        read[0]["numInputRows"],
        durations["triggerExecution"],
        {phase: durations.get(phase, 0) for phase in PHASES},
    )


def summarize(measurements: Sequence[Measurement]) -> dict[str, float]:
    """Per query: the median rows/s and rows per CPU second of each source, and
    hybrid/builtin of those medians (``ratio``, ``cpu_ratio``)."""
    summary: dict[str, float] = {}
    for query in dict.fromkeys(m.query for m in measurements):
        for figure, key in (("rows_per_s", "ratio"), ("rows_per_cpu_s", "cpu_ratio")):
            medians = {}
            for source in SOURCES:
                runs = [m for m in measurements if (m.query, m.source) == (query, source)]
                if runs:
                    medians[source] = statistics.median(getattr(m, figure) for m in runs)
                    summary[f"{query}_{source}_{figure}"] = round(medians[source])
            if len(medians) == len(SOURCES):
                summary[f"{query}_{key}"] = round(medians["hybrid"] / medians["builtin"], 3)
    return summary


def format_run(measurement: Measurement) -> str:
    parts = ", ".join(f"{phase} {ms / 1000:.2f}" for phase, ms in measurement.phases_ms.items())
    return (
        f"  {measurement.query:9} {measurement.source:7} {measurement.rows:,} rows in "
        f"{measurement.duration_ms / 1000:.2f} s = {measurement.rows_per_s / 1e6:.2f}M rows/s, "
        f"{measurement.cpu_s:.1f} CPU s ({parts} s)"
    )


# --- Spark -----------------------------------------------------------------------------


def session(conf: Mapping[str, str]) -> Any:
    from pyspark.sql import SparkSession

    from spark_jobs.jobs.events_pipeline import STATE_STORE
    from spark_jobs.sources.hybrid import HybridDataSource

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("read-probe")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    )
    for key, value in {**STATE_STORE, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(HybridDataSource)
    return spark


def reader(spark: Any, source: str, root: Path, run: Path) -> Any:
    from spark_jobs.jobs.events_pipeline import EVENT_SCHEMA

    history = str(root / "history")
    if source == "builtin":
        return spark.readStream.schema(EVENT_SCHEMA).parquet(history)
    landing = root / "landing"
    landing.mkdir(exist_ok=True)
    children = [
        {"name": "history", "kind": "files", "path": history, "format": "parquet"},
        {"name": "landing", "kind": "landing", "path": str(landing), "format": "json"},
    ]
    return (
        spark.readStream.format("hybrid")
        .schema(EVENT_SCHEMA)
        .option("sources", json.dumps(children))
        .option("stateLocation", str(run / "state"))
        .load()
    )


def query(events: Any, name: str) -> tuple[Any, str]:
    """The query and its output mode."""
    from pyspark.sql import functions as F

    from spark_jobs.jobs.events_pipeline import windowed_totals

    if name == "aggregate":
        totals = events.groupBy("account").agg(F.count("*"), F.sum("amount"))
        return totals, "complete"
    return windowed_totals(events, argparse.Namespace(window=10.0, watermark=10.0)), "append"


def run_once(spark: Any, root: Path, source: str, name: str) -> Measurement:
    run = root / "runs" / f"{source}-{name}"
    shutil.rmtree(run, ignore_errors=True)
    frame, mode = query(reader(spark, source, root, run), name)
    jvm = spark.sparkContext._gateway.proc.pid
    cpu_before = tree_cpu_s(jvm)
    started = (
        frame.writeStream.format("noop")
        .outputMode(mode)
        .option("checkpointLocation", str(run / "checkpoint"))
        .start()
    )
    try:
        started.processAllAvailable()
    finally:
        started.stop()
    cpu_s = tree_cpu_s(jvm) - cpu_before
    return replace(data_batch(started.recentProgress, source, name), cpu_s=round(cpu_s, 2))


def probe(
    run: Callable[[str, str], Measurement], queries: Sequence[str], repetitions: int
) -> list[Measurement]:
    """One warm-up run of each source (discarded), then per repetition and query both sources,
    alternating which goes first, so that drifting load hits both alike."""
    for source in SOURCES:
        say(f"warm-up: {source}")
        say(format_run(run(source, queries[0])))
    measured = []
    for repetition in range(repetitions):
        say(f"repetition {repetition + 1}/{repetitions}")
        for name in queries:
            order = SOURCES if (repetition + QUERIES.index(name)) % 2 == 0 else SOURCES[::-1]
            for source in order:
                measured.append(run(source, name))
                say(format_run(measured[-1]))
    return measured


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/read-benchmark", description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("var/read-benchmark"))
    parser.add_argument("--events", type=count_argument, default=1_000_000)
    parser.add_argument("--files", type=count_argument, default=100)
    parser.add_argument("--repetitions", type=count_argument, default=3)
    parser.add_argument("--query", choices=QUERIES, action="append", help="default: both")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark conf"
    )
    args = parser.parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)
    prepare_driver_environment()
    try:
        require_java()
    except JavaMissing as error:
        print(f"scripts/read-benchmark: {error}", file=sys.stderr)
        return 2
    root = args.workdir.resolve()
    say(f"writing a history of {args.events:,} events in {args.files} parquet files")
    prepare_history(root / "history", args.events, args.files)
    load_before = os.getloadavg()[0]
    spark = session(conf)
    started = time.monotonic()
    try:
        measured = probe(
            lambda source, name: run_once(spark, root, source, name),
            args.query or list(QUERIES),
            args.repetitions,
        )
    finally:
        spark.stop()
    summary: dict[str, Any] = {"events": args.events, "files": args.files, "conf": conf}
    summary.update(summarize(measured))
    summary["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    say(f"{len(measured)} runs in {time.monotonic() - started:.0f} s")
    for name in args.query or QUERIES:
        say(
            f"{name}: builtin {summary[f'{name}_builtin_rows_per_s'] / 1e6:.2f}M rows/s, "
            f"hybrid {summary[f'{name}_hybrid_rows_per_s'] / 1e6:.2f}M rows/s: "
            f"hybrid/builtin {summary[f'{name}_ratio']:.2f}; per CPU second "
            f"{summary[f'{name}_cpu_ratio']:.2f}"
        )
    say(f"load average (1 min) before and after: {summary['load_average']}")
    say(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
