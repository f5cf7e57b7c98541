"""Which query a target table was merged from, and up to which batch: exactly-once across
replays, and no silent skip when a query starts over.

Spark may run a batch again after a failure (the same id, the same rows), so a batch at or
below the one recorded is skipped. A batch id means something only within one query, though:
a query started afresh on a new checkpoint counts from 0 again. Records are therefore kept
per target table with the query's identity (the id Spark keeps in the checkpoint's
``metadata`` file, the same across restarts of one query). A batch of another query finds
the table holding rows that may have been deleted in the source since: it is refused by
name, unless the user asked to start over, which empties the table in the same transaction
as that query's first merge.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

import sqlalchemy
from sqlalchemy import BigInteger, Column, MetaData, Table, Text

from spark_jobs.storage.files import filesystem, resolve_uri

#: Per target table: the query merged into it and its last batch.
RECORDS_TABLE = "backlog_merge_records"

metadata = MetaData()
records = Table(
    RECORDS_TABLE,
    metadata,
    Column("target", Text, primary_key=True),
    Column("query_id", Text, nullable=False),
    Column("checkpoint", Text, nullable=False),
    Column("batch_id", BigInteger, nullable=False),
)


class MergeRefused(RuntimeError):
    """A merge the target cannot take: a batch of one query into a table another query
    merged into, or a table the target's database cannot hold."""


@dataclass(frozen=True)
class Record:
    query_id: str
    checkpoint: str
    batch_id: int


class Verdict(Enum):
    MERGE = "merge"
    #: A replayed batch: merged before.
    SKIP = "skip"
    #: The first batch of a query asked to start over: empty the table, then merge.
    EMPTY_THEN_MERGE = "empty then merge"


def judge(
    record: Record | None,
    query_id: str,
    batch_id: int,
    start_over: bool,
    target: str,
    checkpoint: str,
) -> Verdict:
    """What to do with batch ``batch_id`` of query ``query_id`` into ``target``, given the
    table's record; MergeRefused names the other query and the way out."""
    if record is None:
        return Verdict.MERGE
    if record.query_id == query_id:
        return Verdict.SKIP if batch_id <= record.batch_id else Verdict.MERGE
    if start_over:
        return Verdict.EMPTY_THEN_MERGE
    raise MergeRefused(
        f"target table {target} holds batches up to {record.batch_id} of query "
        f"{record.query_id} (checkpoint {record.checkpoint}), not of this query {query_id} "
        f"(checkpoint {checkpoint}): it may keep rows deleted in the source since that query "
        "stopped. Run with --start-over to empty it and copy the table afresh, or give "
        "another --target-table"
    )


def read_record(connection: sqlalchemy.Connection, target: str) -> Record | None:
    found = connection.execute(
        sqlalchemy.select(records.c.query_id, records.c.checkpoint, records.c.batch_id).where(
            records.c.target == target
        )
    ).first()
    return None if found is None else Record(*found)


def write_record(
    connection: sqlalchemy.Connection, target: str, checkpoint: str, query_id: str, batch_id: int
) -> None:
    connection.execute(records.delete().where(records.c.target == target))
    connection.execute(
        records.insert().values(
            target=target, query_id=query_id, checkpoint=checkpoint, batch_id=batch_id
        )
    )


def create_records(engine: sqlalchemy.Engine) -> None:
    metadata.create_all(engine)


def query_id(spark_checkpoint: str) -> str | None:
    """The id Spark keeps in a checkpoint's ``metadata`` file, None before its first start."""
    fs, path = filesystem(resolve_uri(f"{spark_checkpoint.rstrip('/')}/metadata"))
    try:
        with fs.open_input_stream(path) as handle:
            return str(json.loads(handle.read().decode().splitlines()[0])["id"])
    except FileNotFoundError:
        return None
