"""The CDC snapshot's read and write speeds beside the servers' own ``COPY``.

On a throwaway PostgreSQL server with logical decoding, a table of ``--rows`` accounts
(``tools/data/cdc_data.py``) is read whole, in key-ordered chunks of ``--chunk-rows``, and the
chunks written into a second server, as a warehouse would take them, each two ways that
alternate within each of ``--repeats`` rounds:

- ``copy``: ``COPY (SELECT ... ORDER BY id LIMIT n) TO STDOUT`` as CSV, parsed by
  ``pyarrow.csv`` into each column's Arrow type: the server and Arrow alone, the limit;
- ``chunks``: ``ChunkReader.next_chunk``, as the source reads its backlog: the watermarks,
  the read, the slot peeked for the changes made meanwhile, the merge, the chunk's file;
- ``target_copy``: each chunk's rows as CSV through ``COPY`` into a table of the second
  server with the same primary key: the limit of the write;
- ``merge``: each chunk as one batch of ``MergeTarget.merge``, as the merge sink writes it:
  staged through ``COPY``, applied, recorded, one transaction a batch.

With ``--changes-per-s`` a writer changes the table meanwhile, so that chunks have changes
to merge and the slot has WAL to peek. Reports rows/s per way (median over the rounds), the
ratios chunks/copy and merge/target_copy, and the load average; the last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg2
import pyarrow as pa
import pyarrow.csv as pa_csv

from spark_jobs.jobs.merge.target import MergeTarget
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.describe import describe_table
from spark_jobs.sources.cdc.slot import ReplicationSlot
from spark_jobs.sources.cdc.snapshot import ChunkReader, read_chunk
from spark_jobs.sources.cdc.table import TableShape
from tools.data.cdc_data import ChangeWriter, create_accounts
from tools.services.postgres import LOGICAL_DECODING, PostgresServer

TABLE = "accounts"
WAYS = ("copy", "chunks", "target_copy", "merge")
#: The accounts table's columns as ``COPY`` writes them and Arrow reads them.
COLUMN_TYPES = {
    "id": pa.int64(),
    "version": pa.int64(),
    "balance": pa.int64(),
    "note": pa.string(),
    "updated_at": pa.timestamp("us", tz="UTC"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/cdc-read-benchmark", description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000, help="table rows (200,000)")
    parser.add_argument("--chunk-rows", type=int, default=20_000, help="rows per chunk (20,000)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both ways (3)")
    parser.add_argument(
        "--changes-per-s", type=float, default=0.0, help="writer transactions per second (none)"
    )
    args = parser.parse_args(argv)
    for name in ("rows", "chunk_rows", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def copy_into_arrow(url: str, chunk_rows: int) -> int:
    """The whole table through ``COPY`` into Arrow, chunk by chunk: rows read."""
    rows, after = 0, 0
    connection = psycopg2.connect(url)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET TimeZone = 'UTC'")
            while True:
                buffer = io.BytesIO()
                query = (
                    f"SELECT id, version, balance, note, updated_at FROM {TABLE} "
                    f"WHERE id > {after} ORDER BY id LIMIT {chunk_rows}"
                )
                cursor.copy_expert(f"COPY ({query}) TO STDOUT WITH (FORMAT csv)", buffer)
                if not buffer.getvalue():
                    return rows
                chunk = pa_csv.read_csv(
                    io.BytesIO(buffer.getvalue()),
                    read_options=pa_csv.ReadOptions(column_names=list(COLUMN_TYPES)),
                    convert_options=pa_csv.ConvertOptions(column_types=COLUMN_TYPES),
                )
                rows += chunk.num_rows
                after = chunk.column("id")[-1].as_py()
                if chunk.num_rows < chunk_rows:
                    return rows
    finally:
        connection.close()


def read_chunks(url: str, chunk_rows: int, directory: Path) -> int:
    """The whole table as the source's chunks, written under ``directory``: rows read."""
    slot = ReplicationSlot(url, "probe_slot", "probe_publication", TABLE)
    slot.ensure()
    reader = ChunkReader(url, TABLE, slot)
    try:
        rows, after, index = 0, None, 0
        while True:
            chunk = reader.next_chunk(after, chunk_rows, str(directory / f"chunk-{index}.arrow"))
            rows, after, index = rows + chunk.rows, chunk.last_key, index + 1
            if chunk.last_key is None:
                return rows
    finally:
        reader.close()
        slot.drop()


def chunk_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("chunk-*.arrow"), key=lambda path: int(path.stem[6:]))


def copy_into_target(url: str, table: str, shape: TableShape, directory: Path) -> int:
    """Each chunk's own columns as CSV through ``COPY`` into a new table with the source's
    primary key, as the merge sink's target has: rows written."""
    rows = 0
    connection = psycopg2.connect(url)
    try:
        with connection.cursor() as cursor:
            columns = ", ".join(f"{c.sql} {c.type_name}" for c in shape.columns)
            key = ", ".join(c.sql for c in shape.key_columns)
            cursor.execute(f"CREATE TABLE {table} ({columns}, PRIMARY KEY ({key}))")
            for path in chunk_files(directory):
                chunk = read_chunk(str(path)).select([c.name for c in shape.columns])
                buffer = io.BytesIO()
                pa_csv.write_csv(chunk, buffer, pa_csv.WriteOptions(include_header=False))
                buffer.seek(0)
                cursor.copy_expert(f"COPY {table} FROM STDIN WITH (FORMAT csv)", buffer)
                connection.commit()
                rows += chunk.num_rows
    finally:
        connection.close()
    return rows


def merge_into_target(url: str, table: str, shape: TableShape, directory: Path) -> int:
    """Each chunk as one batch of the merge sink's target: rows merged."""
    target = MergeTarget(url, table, shape, outage_timeout_s=30.0)
    rows = 0
    try:
        for batch_id, path in enumerate(chunk_files(directory)):
            chunk = read_chunk(str(path))
            target.merge(chunk.to_batches, "probe", str(directory), batch_id, False)
            rows += chunk.num_rows
    finally:
        target.close()
    return rows


def timed(way: Callable[..., int], *args: object) -> float:
    """Rows per second of one way's run on ``args``."""
    started = time.perf_counter()
    rows = way(*args)
    return rows / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    speeds: dict[str, list[float]] = {way: [] for way in WAYS}
    source = PostgresServer(database="shop", settings=LOGICAL_DECODING)
    with source, PostgresServer(database="warehouse") as warehouse:
        url = source.url
        create_accounts(url, TABLE, args.rows)
        engine = make_engine(url)
        shape = describe_table(engine, TABLE)
        engine.dispose()
        writer = None
        if args.changes_per_s:
            writer = ChangeWriter(url, TABLE, transactions_per_s=args.changes_per_s).start()
        try:
            for round_ in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="cdc-read-probe-") as scratch:
                    chunks = Path(scratch)
                    speeds["copy"].append(timed(copy_into_arrow, url, args.chunk_rows))
                    speeds["chunks"].append(timed(read_chunks, url, args.chunk_rows, chunks))
                    target = (warehouse.url, f"copy_{round_}", shape, chunks)
                    speeds["target_copy"].append(timed(copy_into_target, *target))
                    target = (warehouse.url, f"merged_{round_}", shape, chunks)
                    speeds["merge"].append(timed(merge_into_target, *target))
                done = ", ".join(f"{way} {speeds[way][-1]:,.0f}" for way in WAYS)
                print(
                    f"round {round_ + 1}/{args.repeats}, rows/s: {done} "
                    f"(load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        finally:
            if writer is not None:
                writer.stop()
    medians = {way: statistics.median(values) for way, values in speeds.items()}
    summary = {
        "rows": args.rows,
        "chunk_rows": args.chunk_rows,
        "changes_per_s": args.changes_per_s,
        "rows_per_s": {way: round(value) for way, value in medians.items()},
        "chunks_vs_copy": round(medians["chunks"] / medians["copy"], 3),
        "merge_vs_target_copy": round(medians["merge"] / medians["target_copy"], 3),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
