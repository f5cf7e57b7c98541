"""A ``foreachBatch`` sink that merges each batch's latest rows per key into a SQL table.

Spark may run a batch again after a failure (the same batch id, the same rows). Each batch
is merged in one transaction that also records its id for the query, and a batch at or
below the recorded id is skipped, so the table takes every batch exactly once: Spark's
documented way to make ``foreachBatch`` exactly-once.

Rows carry the table's columns, ``_op`` ('delete' removes the key, anything else inserts
or updates it) and ``_lsn``, kept in the table as the position of the change it reflects.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import sqlalchemy
from pyspark.sql import DataFrame
from sqlalchemy import BigInteger, Column, MetaData, Table, Text, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite

from spark_jobs.backlog.secrets import redact_text
from spark_jobs.metrics.schema import make_engine

#: Which batch of which query each target was merged up to.
BATCHES_TABLE = "backlog_merged_batches"
#: Rows per statement: large batches (a snapshot's chunks) go in steps.
STATEMENT_ROWS = 5_000
_SQL_TYPES = (
    (pa.types.is_int64, sqlalchemy.BigInteger),
    (pa.types.is_integer, sqlalchemy.Integer),
    (pa.types.is_floating, sqlalchemy.Float),
    (pa.types.is_boolean, sqlalchemy.Boolean),
    (pa.types.is_binary, sqlalchemy.LargeBinary),
    (pa.types.is_date, sqlalchemy.Date),
)


def sql_type(arrow: pa.DataType) -> Any:
    if pa.types.is_timestamp(arrow):
        return sqlalchemy.DateTime(timezone=arrow.tz is not None)
    for matches, kind in _SQL_TYPES:
        if matches(arrow):
            return kind()
    return Text()


class MergeSink:
    """Merges batches into ``table`` (created from the first batch's schema if missing) of
    the database at ``url``; ``query`` names the query whose batches are recorded."""

    def __init__(self, url: str, table: str, key: list[str], query: str):
        self.engine = make_engine(url)
        self.where = redact_text(url)
        self.name, self.key, self.query = table, key, query
        self._table: Table | None = None
        metadata = MetaData()
        self._batches = Table(
            BATCHES_TABLE,
            metadata,
            Column("query", Text, primary_key=True),
            Column("batch_id", BigInteger, nullable=False),
        )
        metadata.create_all(self.engine)

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.toArrow()
        table = self._target(rows.schema)
        with self.engine.begin() as connection:
            done = connection.execute(
                select(self._batches.c.batch_id).where(self._batches.c.query == self.query)
            ).scalar()
            if done is not None and batch_id <= done:
                return
            ops = rows.column("_op").to_pylist()
            values = rows.drop_columns(["_op"]).to_pylist()
            deleted = [row for row, op in zip(values, ops, strict=True) if op == "delete"]
            kept = [row for row, op in zip(values, ops, strict=True) if op != "delete"]
            key = tuple_(*(table.c[name] for name in self.key))
            for start in range(0, len(deleted), STATEMENT_ROWS):
                keys = [
                    tuple(r[name] for name in self.key)
                    for r in deleted[start : start + STATEMENT_ROWS]
                ]
                connection.execute(table.delete().where(key.in_(keys)))
            for start in range(0, len(kept), STATEMENT_ROWS):
                connection.execute(self._upsert(table), kept[start : start + STATEMENT_ROWS])
            record = self._insert(self._batches).values(query=self.query, batch_id=batch_id)
            connection.execute(
                record.on_conflict_do_update(index_elements=["query"], set_={"batch_id": batch_id})
            )

    def close(self) -> None:
        self.engine.dispose()

    def _insert(self, table: Table) -> Any:
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(table)

    def _upsert(self, table: Table) -> Any:
        statement = self._insert(table)
        changing = {c.name: statement.excluded[c.name] for c in table.c if c.name not in self.key}
        return statement.on_conflict_do_update(index_elements=self.key, set_=changing)

    def _target(self, schema: pa.Schema) -> Table:
        if self._table is None:
            metadata = MetaData()
            self._table = Table(
                self.name,
                metadata,
                *(
                    Column(field.name, sql_type(field.type), primary_key=field.name in self.key)
                    for field in schema
                    if field.name != "_op"
                ),
            )
            metadata.create_all(self.engine)
        return self._table
