"""The CDC pipeline: a PostgreSQL table copied and then followed into a table elsewhere.

The ``postgres-cdc`` source reads the table's snapshot (backlog) and then its changes
(live); a streaming aggregation keeps the latest row of each key on the RocksDB state store,
and each batch's changed keys are merged into the target table (insert or update, or
delete) in one transaction that also records the batch, so a replayed batch changes
nothing twice: the target equals the source table as of the last batch.

    backlog-cdc-job --connection postgresql://reader@db:5432/shop --table accounts \\
        --target postgresql://writer@warehouse:5432/copy --checkpoint /data/checkpoint \\
        --conf spark.backlog.checkpointing.interval=2s \\
        --conf spark.backlog.checkpointing.interval-during-backlog=1min

With ``--changes-output DIR`` instead of ``--target``, every change row as it comes (the
table's columns, ``_op``, ``_lsn``, ``_seq``, ``_commit_time``, ``_unchanged``) is appended to
parquet files by Spark's exactly-once file sink: the raw change stream, duplicates and gaps
included if the source had any, which is what a check of the source needs to see.

The source's connection and table are checked before Spark starts (a password in the URL,
no primary key, a server without ``wal_level = logical``), so a refusal costs no JVM.

Passwords come from ``BACKLOG_CDC_PASSWORD`` (source) and ``BACKLOG_CDC_TARGET_PASSWORD``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.backlog.values import count_argument
from spark_jobs.coordinator.runtime import BacklogRuntime
from spark_jobs.jobs.cli import (
    REFUSED,
    add_run_arguments,
    check_run_arguments,
    run_command,
    spark_session,
)
from spark_jobs.jobs.events_pipeline import STATE_STORE
from spark_jobs.jobs.merge_sink import MergeSink
from spark_jobs.metrics.schema import with_password
from spark_jobs.sources.cdc.child import (
    DEFAULT_CHUNK_ROWS,
    checked_table,
    connection_url,
    default_slot_name,
    teardown,
)
from spark_jobs.sources.cdc.slot import SlotError
from spark_jobs.sources.cdc.table import TableShape
from spark_jobs.sources.children import ChildSpecError
from spark_jobs.sources.storage import resolve_uri

SOURCE_NAME = "cdc"
TARGET_PASSWORD_ENV = "BACKLOG_CDC_TARGET_PASSWORD"
#: The change columns the source adds after the table's own.
CHANGE_COLUMNS = ("_op", "_lsn", "_seq", "_commit_time", "_unchanged")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="backlog-cdc-job", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--connection", required=True, help="source: postgresql://user@host/db")
    parser.add_argument("--table", required=True, help="source table: name or schema.name")
    parser.add_argument("--chunk-rows", type=count_argument, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--target", help="target database: an SQLAlchemy URL")
    parser.add_argument(
        "--changes-output",
        metavar="DIR",
        help="instead of --target: append every change row to parquet files in DIR",
    )
    parser.add_argument("--target-table", help="default: the source table's name")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    parser.add_argument("--shuffle-partitions", type=count_argument, default=2)
    add_run_arguments(parser)
    parser.add_argument(
        "--teardown",
        action="store_true",
        help="drop the replication slot and publication of this checkpoint's query and exit "
        "(the query is gone for good: delete its checkpoint too)",
    )
    args = parser.parse_args(argv)
    if not args.teardown:
        if args.target is None and args.changes_output is None:
            parser.error("one of --target and --changes-output is required (unless --teardown)")
        if args.target is not None and args.changes_output is not None:
            parser.error("--target and --changes-output exclude each other; give one")
    if args.target_table and args.target is None and not args.teardown:
        parser.error("--target-table needs --target")
    check_run_arguments(parser, args)
    return args


def read_changes(
    spark: SparkSession, runtime: BacklogRuntime, args: argparse.Namespace
) -> DataFrame:
    reader = (
        spark.readStream.format("postgres-cdc")
        .option("name", SOURCE_NAME)
        .option("connection", args.connection)
        .option("table", args.table)
        .option("chunkRows", str(args.chunk_rows))
        .option("stateLocation", source_state(args))
    )
    if args.static_trigger is None:
        reader = reader.options(**runtime.source_options())
    elif args.static_max_rows:
        reader = reader.option("maxRowsPerTrigger", str(args.static_max_rows))
    return reader.load()


def source_state(args: argparse.Namespace) -> str:
    return f"{args.checkpoint.rstrip('/')}/source"


def drop_slot(args: argparse.Namespace) -> str:
    """Drop the slot and publication the source made for this checkpoint."""
    slot = default_slot_name(source_state(args), SOURCE_NAME)
    found = teardown(connection_url(SOURCE_NAME, args.connection), slot, slot, args.table)
    return f"dropped replication slot {slot!r}" if found else f"no replication slot {slot!r}"


def check_source(args: argparse.Namespace) -> TableShape:
    """The table's shape, after refusing what the source would refuse once Spark runs."""
    return checked_table(SOURCE_NAME, connection_url(SOURCE_NAME, args.connection), args.table)


def latest_rows(changes: DataFrame, key: list[str]) -> DataFrame:
    """Per key, the latest value of each column and the latest ``_op`` and ``_lsn``.

    Changes are ordered by their commit's end, then their place in the transaction. A
    column an update left unchanged (named in ``_unchanged``) does not count as a value, so
    the latest value sent stays: that is why the state holds every column, not only the
    last change."""
    ordered = changes.withColumn("_order", F.struct("_lsn", "_seq"))
    columns = [c for c in changes.columns if c not in (*key, *CHANGE_COLUMNS)]
    sent = {
        c: F.when(
            ~F.array_contains(F.coalesce("_unchanged", F.array().cast("array<string>")), c),
            F.col("_order"),
        )
        for c in columns
    }
    return ordered.groupBy(*key).agg(
        *(F.max_by(c, sent[c]).alias(c) for c in columns),
        F.max_by("_op", "_order").alias("_op"),
        F.max("_lsn").alias("_lsn"),
    )


def run(args: argparse.Namespace) -> None:
    key = list(check_source(args).key)
    spark = spark_session("backlog-cdc", args)
    try:
        runtime = BacklogRuntime(spark)
        signal.signal(signal.SIGTERM, lambda _signum, _frame: runtime.stop())
        try:
            for conf_key, value in STATE_STORE.items():
                spark.conf.set(conf_key, value)
            spark.conf.set("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
            spark.conf.set("spark.sql.session.timeZone", "UTC")
            # Parquet's own UTC timestamps, not Spark's legacy INT96, which other readers
            # (pyarrow, pandas) take for local times without a zone.
            spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
            changes = read_changes(spark, runtime, args)
            writer = (
                changes_writer(changes, args)
                if args.changes_output is not None
                else merge_writer(changes, key, args)
            ).option("checkpointLocation", f"{args.checkpoint.rstrip('/')}/spark")
            runtime.hold_lease(resolve_uri(args.checkpoint))
            if args.static_trigger is None:
                runtime.start_gated(writer)
            else:
                runtime.start_static(writer, args.static_trigger)
            runtime.await_termination(stop_when_idle_s=args.stop_when_idle, timeout_s=args.timeout)
        finally:
            runtime.close()
    finally:
        spark.stop()


def merge_writer(changes: DataFrame, key: list[str], args: argparse.Namespace) -> Any:
    """The latest row per key, merged into --target batch by batch."""
    sink = MergeSink(
        with_password(args.target, os.environ.get(TARGET_PASSWORD_ENV)),
        args.target_table or args.table.split(".")[-1],
        key,
        query=resolve_uri(args.checkpoint),
    )
    return latest_rows(changes, key).writeStream.outputMode("update").foreachBatch(sink.write_batch)


def changes_writer(changes: DataFrame, args: argparse.Namespace) -> Any:
    """Every change row appended to parquet files in --changes-output."""
    return (
        changes.writeStream.format("parquet")
        .outputMode("append")
        .option("path", args.changes_output)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.teardown:
        try:
            print(f"backlog-cdc-job: {drop_slot(args)}")
        except (ChildSpecError, SlotError) as error:
            print(f"backlog-cdc-job: {error}", file=sys.stderr)
            return REFUSED
        return 0
    return run_command("backlog-cdc-job", lambda: run(args), refusals=(ChildSpecError,))


if __name__ == "__main__":
    sys.exit(main())
