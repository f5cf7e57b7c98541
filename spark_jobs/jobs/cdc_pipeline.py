"""The CDC pipeline: a PostgreSQL table copied and then followed into a table elsewhere.

The ``postgres-cdc`` source reads the table's snapshot (backlog) and then its changes
(live). Each batch's change rows are written as parquet and merged into the target table
(insert or update, or delete) in one transaction that also records the batch under the
query's id, so a replayed batch changes nothing twice (``merge_sink.py``, ``merge/``). Once
the job is live, the target equals the source table as of the last batch's position.

    backlog-cdc-job --connection postgresql://reader@db:5432/shop --table accounts \\
        --target postgresql://writer@warehouse:5432/copy --checkpoint /data/checkpoint \\
        --conf spark.backlog.checkpointing.interval=2s \\
        --conf spark.backlog.checkpointing.interval-during-backlog=1min

With ``--changes-output DIR`` (alone or beside ``--target``), every change row as it comes
(the table's columns, ``_op``, ``_lsn``, ``_seq``, ``_commit_time``, ``_unchanged``) is kept
in parquet files, one ``batch_id=N`` directory per batch: the raw change stream, duplicates
and gaps included if the source had any, which is what a check of the source needs to see.

A target another query merged into (a run started over on a new checkpoint) is refused
unless ``--start-over``, which empties it first. The source's connection and table, and the
target's record, are checked before Spark starts, so a refusal costs no JVM.

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

from spark_jobs.backlog.table_names import TableNameError, as_part, split_table_name
from spark_jobs.backlog.values import count_argument, duration_argument
from spark_jobs.coordinator.runtime import BacklogRuntime, refuse_if_leased
from spark_jobs.jobs.cli import (
    REFUSED,
    add_run_arguments,
    check_run_arguments,
    launch_conf,
    run_command,
    spark_session,
)
from spark_jobs.jobs.merge.record import MergeRefused, next_batch, query_id
from spark_jobs.jobs.merge.target import MergeTarget
from spark_jobs.jobs.merge_sink import MergeSink
from spark_jobs.metrics.schema import with_password
from spark_jobs.sources.cdc.child import DEFAULT_CHUNK_ROWS, PostgresCdcChild, default_slot_name
from spark_jobs.sources.cdc.connection import checked_table, connection_url, teardown
from spark_jobs.sources.cdc.slot import SlotError
from spark_jobs.sources.cdc.table import TableChangedError, TableShape, signature_changes
from spark_jobs.sources.children import ChildSpecError
from spark_jobs.storage.files import StateDirectory, resolve_uri

SOURCE_NAME = "cdc"
TARGET_PASSWORD_ENV = "BACKLOG_CDC_TARGET_PASSWORD"
DEFAULT_TARGET_OUTAGE_TIMEOUT_S = 120.0


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
    parser.add_argument(
        "--start-over",
        action="store_true",
        help="if another query merged into the target table, empty it and copy afresh",
    )
    parser.add_argument(
        "--target-outage-timeout",
        type=duration_argument,
        default=DEFAULT_TARGET_OUTAGE_TIMEOUT_S,
        help="how long a batch waits for a target database that is away (default 2min)",
    )
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    parser.add_argument("--shuffle-partitions", type=count_argument, default=2)
    add_run_arguments(parser)
    parser.add_argument(
        "--teardown",
        action="store_true",
        help="drop the replication slot and publication of this checkpoint's query and exit "
        "(the query is gone for good: delete its checkpoint too); with --target, say what "
        "the target keeps",
    )
    args = parser.parse_args(argv)
    if not args.teardown and args.target is None and args.changes_output is None:
        parser.error("one of --target and --changes-output is required (unless --teardown)")
    for flag in ("target_table", "start_over"):
        if getattr(args, flag) and args.target is None:
            parser.error(f"--{flag.replace('_', '-')} needs --target")
    for flag in ("table", "target_table"):
        try:
            split_table_name(getattr(args, flag) or "table")
        except TableNameError as error:
            parser.error(f"--{flag.replace('_', '-')}: {error}")
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
    """Drop the slot and publication the source made for this checkpoint; say what the
    target keeps."""
    slot = default_slot_name(source_state(args), SOURCE_NAME)
    found = teardown(connection_url(SOURCE_NAME, args.connection), slot, slot, args.table)
    said = f"dropped replication slot {slot!r}" if found else f"no replication slot {slot!r}"
    if args.target is None:
        return (
            f"{said}; a target table keeps its rows and the record of this query: a run on "
            "a new checkpoint into it needs --start-over, which empties it first"
        )
    target = target_of(args)
    try:
        record = target.record()
    finally:
        target.close()
    if record is None:
        return f"{said}; target table {target.table} on {target.where} holds no merged batch"
    return (
        f"{said}; target table {target.table} on {target.where} keeps its rows, merged up "
        f"to batch {record.batch_id} of query {record.query_id}: a run on a new checkpoint "
        "into it needs --start-over, which empties it first"
    )


def target_of(args: argparse.Namespace, shape: TableShape | None = None) -> MergeTarget:
    return MergeTarget(
        with_password(args.target, os.environ.get(TARGET_PASSWORD_ENV)),
        args.target_table or as_part(split_table_name(args.table)[-1]),
        shape or check_source(args),
        args.target_outage_timeout,
    )


def check_target(target: MergeTarget, args: argparse.Namespace) -> None:
    """Refuse, before Spark starts, what this checkpoint's next batch would find
    (MergeRefused): a target another query merged into, or one that lacks this query's
    earlier batches."""
    spark = f"{args.checkpoint.rstrip('/')}/spark"
    ours = query_id(spark) or "(a new query)"
    checkpoint = resolve_uri(args.checkpoint.rstrip("/"))
    target.check(ours, next_batch(spark), args.start_over, checkpoint)


def check_source(args: argparse.Namespace) -> TableShape:
    """The table's shape, after refusing what the source would refuse once Spark runs: a
    table the copy cannot take, or one that changed since this checkpoint's copy began."""
    shape = checked_table(SOURCE_NAME, connection_url(SOURCE_NAME, args.connection), args.table)
    if (kept := kept_table(args)) is not None:
        refuse_changed(shape, kept)
    return shape


def check_launched_shape(args: argparse.Namespace, shape: TableShape) -> None:
    """The table as this run launched with it (its target's columns and key, its stream's
    schema) must be the table the source copies, kept at its first plan: a table changed
    between the two (DDL in the seconds a first start takes) would be merged by a stale key
    and lose columns without a word. The run fails by name; started again, it takes the
    table as it is."""
    kept = kept_table(args)
    assert kept is not None, "the source keeps the table's shape at its first plan"
    changed = signature_changes(kept, shape.signature())
    if changed:
        raise ChildSpecError(
            f"child source {SOURCE_NAME!r}: table {shape.name} changed between this run's "
            f"start and its copy's: {'; '.join(changed)}; run the job again: the copy began "
            "with the table as it is now"
        )


def kept_table(args: argparse.Namespace) -> dict[str, Any] | None:
    """The table's signature the source kept when this checkpoint's copy began, if it has."""
    state = StateDirectory(f"{resolve_uri(source_state(args))}/{SOURCE_NAME}")
    names = state.names(PostgresCdcChild.SHAPE)
    return state.read(PostgresCdcChild.SHAPE)["table"] if names else None


def refuse_changed(shape: TableShape, kept: dict[str, Any]) -> None:
    try:
        shape.check_unchanged(kept)
    except TableChangedError as error:
        raise ChildSpecError(f"child source {SOURCE_NAME!r}: {error}") from None


def run(args: argparse.Namespace) -> None:
    # Before the source is touched: a refused launch leaves the slot and the target alone.
    refuse_if_leased(launch_conf("backlog-cdc", args), resolve_uri(args.checkpoint))
    shape = check_source(args)
    target = None if args.target is None else target_of(args, shape)
    try:
        if target is not None:
            check_target(target, args)
        sink = MergeSink(
            args.checkpoint,
            target,
            args.changes_output,
            args.start_over,
            first=lambda: check_launched_shape(args, shape),
        )
        run_query(args, sink)
    finally:
        if target is not None:
            target.close()


def run_query(args: argparse.Namespace, sink: MergeSink) -> None:
    spark = spark_session("backlog-cdc", args)
    try:
        runtime = BacklogRuntime(spark)
        signal.signal(signal.SIGTERM, lambda _signum, _frame: runtime.stop())
        try:
            spark.conf.set("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
            spark.conf.set("spark.sql.session.timeZone", "UTC")
            # Column names as PostgreSQL has them: "Name" and name are two columns.
            spark.conf.set("spark.sql.caseSensitive", "true")
            # Parquet's own UTC timestamps, not Spark's legacy INT96, which other readers
            # (pyarrow, pandas) take for local times without a zone; dates and times as
            # they are (proleptic Gregorian, as PostgreSQL's), BC and all.
            spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
            spark.conf.set("spark.sql.parquet.datetimeRebaseModeInWrite", "CORRECTED")
            writer = (
                read_changes(spark, runtime, args)
                .writeStream.foreachBatch(sink.write_batch)
                .option("checkpointLocation", f"{args.checkpoint.rstrip('/')}/spark")
            )
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.teardown:
        try:
            print(f"backlog-cdc-job: {drop_slot(args)}")
        except (ChildSpecError, SlotError) as error:
            print(f"backlog-cdc-job: {error}", file=sys.stderr)
            return REFUSED
        return 0
    return run_command(
        "backlog-cdc-job", lambda: run(args), refusals=(ChildSpecError, MergeRefused)
    )


if __name__ == "__main__":
    sys.exit(main())
