"""Which query a target table was merged from, and up to which batch: exactly-once across
replays, no silent skip when a query starts over, and no batch merged past a gap.

Spark may run a batch again after a failure (the same id, the same rows), so a batch at or
below the one recorded is skipped. A batch id means something only within one query, though:
a query started afresh on a new checkpoint counts from 0 again. Records are therefore kept
per target table with the query's identity (the id Spark keeps in the checkpoint's
``metadata`` file, the same across restarts of one query). A batch of another query finds
the table holding rows that may have been deleted in the source since: it is refused by
name, unless the user asked to start over, which empties the table in the same transaction
as that query's first merge (its batch 0).

A query's batches reach the table one after another, so a batch that does not follow the
last one recorded means the table lacks some: the table restored from a backup, made again,
or given to a checkpoint that ran before without it. It is refused by name; only a copy
afresh, on a new checkpoint, makes such a table whole. A table is recorded by the name its
database resolves (``public.accounts`` for ``accounts``, SQLite's names without case), and
on PostgreSQL by its OID too, so that no spelling or re-creation escapes the record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

import pyarrow.fs as pa_fs
import sqlalchemy
from sqlalchemy import BigInteger, Column, MetaData, Table, Text

from spark_jobs.backlog.table_names import qualified, split_table_name, text_quoting
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
    #: PostgreSQL's OID of the table (None on SQLite, and for records made before it was).
    Column("target_oid", BigInteger, nullable=True),
)
#: A copy afresh, the one way to a table that lacks batches of its query.
AFRESH = "copy the table afresh: a new --checkpoint, with --start-over to empty the table first"


class MergeRefused(RuntimeError):
    """A merge the target cannot take: a batch of one query into a table another query
    merged into, or a table the target's database cannot hold."""


@dataclass(frozen=True)
class Record:
    query_id: str
    checkpoint: str
    batch_id: int
    target_oid: int | None = None


@dataclass(frozen=True)
class TargetTable:
    """A target table as given, and as its database resolves it: the name it is recorded
    under, and its OID on PostgreSQL (None on SQLite, and for a table not made yet)."""

    given: str
    name: str
    oid: int | None = None


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
    oid: int | None = None,
) -> Verdict:
    """What to do with batch ``batch_id`` of query ``query_id`` into ``target`` (whose OID
    is ``oid``, where known), given the table's record; MergeRefused names what is wrong
    and the way out."""
    if record is not None and record.query_id == query_id:
        if record.target_oid not in (None, oid):
            raise MergeRefused(
                f"target table {target} was made again since batch {record.batch_id} of this "
                f"query {query_id} was merged into it, so it lacks that query's batches; "
                f"{AFRESH}"
            )
        if batch_id <= record.batch_id:
            return Verdict.SKIP
        if batch_id == record.batch_id + 1:
            return Verdict.MERGE
        raise MergeRefused(
            f"target table {target} holds batches up to {record.batch_id} of this query "
            f"{query_id} (checkpoint {checkpoint}), not batch {batch_id - 1}: batches "
            f"{record.batch_id + 1} to {batch_id - 1} were committed without reaching it (was "
            f"it restored from a backup, or given to another run meanwhile?); {AFRESH}"
        )
    if start_over and batch_id == 0:
        return Verdict.MERGE if record is None else Verdict.EMPTY_THEN_MERGE
    if record is None:
        if batch_id == 0:
            return Verdict.MERGE
        raise MergeRefused(
            f"target table {target} holds no batch of this query {query_id} (checkpoint "
            f"{checkpoint}), whose batches 0 to {batch_id - 1} were committed without reaching "
            f"it (a --target or --target-table new to this checkpoint?); {AFRESH}"
        )
    way_out = (
        "Run with --start-over to empty it and copy the table afresh"
        if batch_id == 0
        else f"--start-over empties a table only at a query's first batch, not at batch "
        f"{batch_id}: {AFRESH}"
    )
    raise MergeRefused(
        f"target table {target} holds batches up to {record.batch_id} of query "
        f"{record.query_id} (checkpoint {record.checkpoint}), not of this query {query_id} "
        f"(checkpoint {checkpoint}): it may keep rows deleted in the source since that query "
        f"stopped. {way_out}, or give another --target-table"
    )


def resolve(connection: sqlalchemy.Connection, table: str) -> TargetTable:
    """``table`` (``name`` or ``schema.name``, as given) as its database resolves it."""
    parts = split_table_name(table)
    if connection.dialect.name == "sqlite":  # names without case; a default schema
        return TargetTable(table, ".".join(p.lower() for p in ("main", *parts)[-2:]))
    quoted = qualified(table, text_quoting(connection.dialect.identifier_preparer))
    found = connection.execute(
        sqlalchemy.text(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.oid "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(:table)"
        ),
        {"table": quoted},
    ).first()
    return TargetTable(table, quoted) if found is None else TargetTable(table, *found)


def read_record(connection: sqlalchemy.Connection, table: TargetTable) -> Record | None:
    """The record of ``table``: by the name its database resolves, else (a record made
    before names were resolved) by the name as given."""
    for name in dict.fromkeys((table.name, table.given)):
        found = connection.execute(
            sqlalchemy.select(
                records.c.query_id, records.c.checkpoint, records.c.batch_id, records.c.target_oid
            ).where(records.c.target == name)
        ).first()
        if found is not None:
            return Record(*found)
    return None


def write_record(
    connection: sqlalchemy.Connection,
    table: TargetTable,
    checkpoint: str,
    query_id: str,
    batch_id: int,
) -> None:
    connection.execute(records.delete().where(records.c.target.in_({table.name, table.given})))
    connection.execute(
        records.insert().values(
            target=table.name,
            query_id=query_id,
            checkpoint=checkpoint,
            batch_id=batch_id,
            target_oid=table.oid,
        )
    )


def create_records(engine: sqlalchemy.Engine) -> None:
    """The records table, with the columns later releases added to one made before."""
    metadata.create_all(engine)
    with engine.begin() as connection:
        columns = {c["name"] for c in sqlalchemy.inspect(connection).get_columns(RECORDS_TABLE)}
        if "target_oid" not in columns:
            connection.exec_driver_sql(f"ALTER TABLE {RECORDS_TABLE} ADD COLUMN target_oid BIGINT")


def query_id(spark_checkpoint: str) -> str | None:
    """The id Spark keeps in a checkpoint's ``metadata`` file, None before its first start."""
    fs, path = filesystem(resolve_uri(f"{spark_checkpoint.rstrip('/')}/metadata"))
    try:
        with fs.open_input_stream(path) as handle:
            return str(json.loads(handle.read().decode().splitlines()[0])["id"])
    except FileNotFoundError:
        return None


def next_batch(spark_checkpoint: str) -> int:
    """The batch a query on this checkpoint runs next: the one after its last commit (a
    batch planned but not committed runs again under its own id), 0 before its first."""
    fs, path = filesystem(resolve_uri(f"{spark_checkpoint.rstrip('/')}/commits"))
    infos = fs.get_file_info(pa_fs.FileSelector(path, allow_not_found=True))
    done = [int(info.base_name) for info in infos if info.base_name.isdigit()]
    return max(done) + 1 if done else 0
