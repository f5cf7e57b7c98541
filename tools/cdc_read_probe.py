"""Snapshot read speed of the CDC source beside the server's own ``COPY`` into Arrow.

On a throwaway PostgreSQL server with logical decoding, a table of ``--rows`` accounts
(``tools/cdc_data.py``) is read whole, in key-ordered chunks of ``--chunk-rows``, two ways
that alternate within each of ``--repeats`` rounds:

- ``copy``: ``COPY (SELECT ... ORDER BY id LIMIT n) TO STDOUT`` as CSV, parsed by
  ``pyarrow.csv`` into each column's Arrow type: the server and Arrow alone, the limit;
- ``chunks``: ``ChunkReader.next_chunk``, as the source reads its backlog: the watermarks,
  the read, the slot peeked for the changes made meanwhile, the merge, the chunk's file.

With ``--changes-per-s`` a writer changes the table meanwhile, so that chunks have changes
to merge and the slot has WAL to peek. Reports rows/s per way (median over the rounds) and
the ratio chunks/copy, with the load average; the last line is one JSON object.
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

from spark_jobs.sources.cdc.slot import ReplicationSlot
from spark_jobs.sources.cdc.snapshot import ChunkReader
from tools.cdc_data import ChangeWriter, create_accounts
from tools.postgres import LOGICAL_DECODING, PostgresServer

TABLE = "accounts"
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


def timed(read: Callable[[], int]) -> float:
    """Rows per second of one read."""
    started = time.perf_counter()
    rows = read()
    return rows / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    speeds: dict[str, list[float]] = {"copy": [], "chunks": []}
    with PostgresServer(database="shop", settings=LOGICAL_DECODING) as server:
        url = server.url
        create_accounts(url, TABLE, args.rows)
        writer = None
        if args.changes_per_s:
            writer = ChangeWriter(url, TABLE, transactions_per_s=args.changes_per_s).start()
        try:
            for round_ in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="cdc-read-probe-") as scratch:
                    speeds["copy"].append(timed(lambda: copy_into_arrow(url, args.chunk_rows)))
                    speeds["chunks"].append(
                        timed(lambda: read_chunks(url, args.chunk_rows, Path(scratch)))
                    )
                print(
                    f"round {round_ + 1}/{args.repeats}: copy {speeds['copy'][-1]:,.0f} rows/s, "
                    f"chunks {speeds['chunks'][-1]:,.0f} rows/s "
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
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
