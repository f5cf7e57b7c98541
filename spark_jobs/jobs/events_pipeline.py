"""The events pipeline: a hybrid source (historical files, then a Kafka topic or a landing
directory) through an event-time windowed aggregation with a watermark, on the RocksDB state
store with changelog checkpointing, into an exactly-once parquet sink.

    spark-submit --conf spark.backlog.checkpointing.interval=2s \\
        --conf spark.backlog.checkpointing.interval-during-backlog=1min \\
        --conf spark.backlog.lag.offsets.enter-threshold=100000 \\
        spark_jobs/jobs/events_pipeline.py --history /data/history \\
        --kafka-bootstrap-servers broker:9092 --kafka-topic events \\
        --output /data/out --checkpoint /data/checkpoint

or the console command ``backlog-events-job`` with the same arguments (and ``--conf``).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from spark_jobs.backlog.values import (
    DURATION_FORMAT,
    count_argument,
    duration_argument,
    format_duration,
    processing_time,
)
from spark_jobs.coordinator.event_time import observe_event_time
from spark_jobs.coordinator.runtime import BacklogRuntime, refuse_if_leased
from spark_jobs.jobs.cli import (
    add_run_arguments,
    check_run_arguments,
    launch_conf,
    run_command,
    spark_session,
)
from spark_jobs.storage.files import resolve_uri

logger = logging.getLogger("spark_jobs.jobs.events_pipeline")
#: A standby's rehearsal: its trigger, and how long it may take to run its one batch.
WARM_UP_TRIGGER_S = 0.1
WARM_UP_TIMEOUT_S = 120.0
WARM_UP_EXECUTOR_WAIT_S = 30.0
WARM_UP_EVENT = {"event_id": 0, "account": "a", "amount": 0.0, "event_time": "2000-01-01T00:00:00Z"}

EVENT_SCHEMA = "event_id BIGINT, account STRING, amount DOUBLE, event_time TIMESTAMP"
#: Quantiles of event time observed per batch, to measure freshness afterwards.
FRESHNESS_QUANTILES = tuple(round(q / 20, 2) for q in range(1, 20))
STATE_STORE = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="backlog-events-job", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--history", required=True, help="directory of historical files")
    parser.add_argument("--history-format", default="parquet", choices=["parquet", "json", "csv"])
    live = parser.add_mutually_exclusive_group(required=True)
    live.add_argument("--landing", help="live phase: a directory files land in")
    live.add_argument(
        "--kafka-bootstrap-servers", help="live phase: a Kafka topic of JSON events, from here"
    )
    parser.add_argument("--landing-format", default="json", choices=["parquet", "json", "csv"])
    parser.add_argument(
        "--landing-max-file-age",
        type=duration_argument,
        help="files modified this long before the newest landed file count as seen, so the "
        f"source can forget them (its maxFileAge, default 7d): {DURATION_FORMAT}",
    )
    parser.add_argument("--kafka-topic", default="events")
    parser.add_argument(
        "--kafka-starting-offsets",
        default="earliest",
        help="earliest, latest, or JSON {topic: {partition: offset}}",
    )
    parser.add_argument("--output", required=True, help="parquet output directory")
    parser.add_argument(
        "--bad-records-path",
        help="set malformed files and records aside here instead of failing (the source's "
        "badRecordsPath)",
    )
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    parser.add_argument("--window", type=duration_argument, default=10.0, help=DURATION_FORMAT)
    parser.add_argument("--watermark", type=duration_argument, default=10.0, help=DURATION_FORMAT)
    parser.add_argument("--shuffle-partitions", type=count_argument, default=4)
    parser.add_argument(
        "--rows-per-partition",
        type=count_argument,
        help="rows per Spark task of the source (its rowsPerPartition; default 250000): "
        "max-batch-rows divided by the cores keeps every core reading a capped batch",
    )
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    check_run_arguments(parser, args)
    return args


def hybrid_children(args: argparse.Namespace) -> str:
    history = {
        "name": "history",
        "kind": "files",
        "path": args.history,
        "format": args.history_format,
    }
    if args.landing:
        live = {
            "name": "landing",
            "kind": "landing",
            "path": args.landing,
            "format": args.landing_format,
        }
        if args.landing_max_file_age:
            live["maxFileAge"] = format_duration(args.landing_max_file_age)
    else:
        live = {
            "name": "kafka",
            "kind": "kafka",
            "bootstrapServers": args.kafka_bootstrap_servers,
            "topics": [args.kafka_topic],
            "startingOffsets": args.kafka_starting_offsets,
            "valueFormat": "json",
        }
    return json.dumps([history, live])


def read_events(
    spark: SparkSession, runtime: BacklogRuntime, args: argparse.Namespace
) -> DataFrame:
    """The hybrid source, observed: each batch's event-time quantiles measure freshness."""
    reader = (
        spark.readStream.format("hybrid")
        .schema(EVENT_SCHEMA)
        .option("name", "events")
        .option("sources", hybrid_children(args))
        .option("stateLocation", f"{args.checkpoint.rstrip('/')}/hybrid")
    )
    if args.bad_records_path:
        reader = reader.option("badRecordsPath", args.bad_records_path)
    if args.rows_per_partition:
        reader = reader.option("rowsPerPartition", str(args.rows_per_partition))
    if args.static_trigger is None:
        reader = reader.options(**runtime.source_options())
    elif args.static_max_rows:
        reader = reader.option("maxRowsPerTrigger", str(args.static_max_rows))
    event_ms = F.unix_millis("event_time")
    return observe_event_time(
        reader.load(),
        "event_time",
        F.count(F.lit(1)).alias("rows"),
        F.max(event_ms).alias("max_ms"),
        F.percentile_approx(event_ms, list(FRESHNESS_QUANTILES), 1000).alias("quantiles_ms"),
    )


def windowed_totals(events: DataFrame, args: argparse.Namespace) -> DataFrame:
    """Events and amounts per account and event-time window, emitted once the window closes."""
    window = F.window("event_time", processing_time(args.window))
    return (
        events.withWatermark("event_time", processing_time(args.watermark))
        .groupBy(window, "account")
        .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "account",
            "events",
            "amount",
        )
    )


def run(args: argparse.Namespace) -> None:
    refuse_if_leased(launch_conf("backlog-events", args), resolve_uri(args.checkpoint))
    spark = spark_session("backlog-events", args)
    try:
        runtime = BacklogRuntime(spark)
        # SIGTERM (a pod's or a scheduler's stop) ends the run after a commit, delivering
        # its metrics and letting go of its lease, as a stop request does.
        signal.signal(signal.SIGTERM, lambda _signum, _frame: runtime.stop())
        try:
            configure_session(spark, args)
            if runtime.stands_by:
                warm_up(spark, runtime, args)
            # Built before the lease is held: a standby has its query ready to start.
            writer = pipeline(spark, runtime, args)
            runtime.hold_lease(resolve_uri(args.checkpoint))
            start(runtime, writer, args)
            runtime.await_termination(stop_when_idle_s=args.stop_when_idle, timeout_s=args.timeout)
        finally:
            runtime.close()
    finally:
        spark.stop()


def configure_session(spark: SparkSession, args: argparse.Namespace) -> None:
    for key, value in STATE_STORE.items():
        spark.conf.set(key, value)
    spark.conf.set("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    spark.conf.set("spark.sql.session.timeZone", "UTC")


def warm_up(spark: SparkSession, runtime: BacklogRuntime, args: argparse.Namespace) -> None:
    """What a standby does before it waits for the lease, so that the first batch of its
    query does not pay for it while no run serves: the same pipeline, on one event in a
    scratch directory, with a scratch checkpoint and output, runs one batch. That starts
    the executors, the Python workers and the state store's native library, and compiles
    the query's generated code, which Spark caches for the real query. It touches neither
    the job's checkpoint nor its output."""
    started = time.monotonic()
    if not _executors_up(spark, WARM_UP_EXECUTOR_WAIT_S):
        logger.warning(
            "no executor registered within %.0f s (the running run may hold the cluster's "
            "cores): standing by without a warm-up",
            WARM_UP_EXECUTOR_WAIT_S,
        )
        return
    with tempfile.TemporaryDirectory(prefix="backlog-warm-up-") as scratch:
        root = Path(scratch)
        (root / "history").mkdir()
        (root / "landing").mkdir()
        (root / "history" / "warm-up.json").write_text(json.dumps(WARM_UP_EVENT) + "\n")
        rehearsal = argparse.Namespace(
            **{
                **vars(args),
                "history": str(root / "history"),
                "history_format": "json",
                "landing": str(root / "landing"),
                "landing_format": "json",
                "kafka_bootstrap_servers": None,
                "bad_records_path": None,
                "output": str(root / "output"),
                "checkpoint": str(root / "checkpoint"),
                "static_trigger": WARM_UP_TRIGGER_S,
                "static_max_rows": None,
            }
        )
        query = (
            pipeline(spark, runtime, rehearsal)
            .trigger(processingTime=processing_time(WARM_UP_TRIGGER_S))
            .start()
        )
        try:
            deadline = time.monotonic() + WARM_UP_TIMEOUT_S
            while not (ran := _ran_a_batch(query)) and time.monotonic() < deadline:
                query.awaitTermination(WARM_UP_TRIGGER_S)
        finally:
            query.stop()
    if ran:
        logger.info("warmed up in %.1f s: standing by", time.monotonic() - started)
    else:
        logger.warning("the warm-up ran no batch within %.0f s: standing by", WARM_UP_TIMEOUT_S)


def _executors_up(spark: SparkSession, wait_s: float) -> bool:
    """Whether an executor has registered (at once in local mode, where the driver is one),
    waiting up to ``wait_s``."""
    context = spark.sparkContext
    if context.master.startswith("local"):
        return True
    deadline = time.monotonic() + wait_s
    # The driver is listed among them too.
    while context._jsc.sc().getExecutorMemoryStatus().size() < 2:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def _ran_a_batch(query: StreamingQuery) -> bool:
    if query.exception() is not None:
        raise query.exception()  # type: ignore[misc]
    return any(p["numInputRows"] > 0 for p in query.recentProgress)


def pipeline(
    spark: SparkSession, runtime: BacklogRuntime, args: argparse.Namespace
) -> DataStreamWriter:
    """The pipeline's query, ready to start."""
    windows = windowed_totals(read_events(spark, runtime, args), args)
    return (
        windows.writeStream.format("parquet")
        .outputMode("append")
        .option("path", args.output)
        .option("checkpointLocation", f"{args.checkpoint.rstrip('/')}/spark")
    )


def start(runtime: BacklogRuntime, writer: DataStreamWriter, args: argparse.Namespace) -> None:
    """The pipeline's query, started under the runtime's coordinator."""
    if args.static_trigger is None:
        runtime.start_gated(writer)
    else:
        runtime.start_static(writer, args.static_trigger)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command("backlog-events-job", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
