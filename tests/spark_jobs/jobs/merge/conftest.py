"""A merge target on SQLite and on PostgreSQL, fed change pieces as the sink reads them back."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
import pytest
import sqlalchemy as sa

from spark_jobs.jobs.merge.target import MergeTarget
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.table import TableColumn, TableShape

AT = datetime(2026, 11, 27, 3, 4, 5, tzinfo=UTC)
SHAPE = TableShape(
    1,
    "public.accounts",
    (
        TableColumn("id", "id", 20, "bigint"),
        TableColumn("version", "version", 20, "bigint"),
        TableColumn("big note", '"big note"', 25, "text"),
    ),
    ("id",),
)
_tables = itertools.count()


def change(op: str, key: int, version: int | None, note: str | None, lsn: int, seq: int = 0,
           unchanged: tuple[str, ...] = ()) -> tuple:  # fmt: skip
    return op, key, version, note, lsn, seq, list(unchanged)


def pieces(*changes: tuple, shape: TableShape = SHAPE, size: int = 1000) -> list[pa.RecordBatch]:
    """Change rows in the sink's form, cut into pieces of ``size``."""
    rows = [{"id": c[1], "version": c[2], "big note": c[3]} for c in changes]
    marks = [(c[0], c[4], c[5], AT, c[6]) for c in changes]
    return shape.arrow_table(rows, marks).to_batches(max_chunksize=size)


@pytest.fixture
def url(target_url) -> str:
    return target_url


@pytest.fixture
def table() -> str:
    return f"copy_{next(_tables)}"


class Target:
    """A MergeTarget and what its table holds."""

    def __init__(self, url: str, table: str, shape: TableShape = SHAPE):
        self.url, self.table = url, table
        self.merger = MergeTarget(url, table, shape, outage_timeout_s=1.0)

    def merge(self, batch_id: int, *changes: tuple, query: str = "q", start_over: bool = False):
        found = pieces(*changes)
        return self.merger.merge(lambda: iter(found), query, "/ck", batch_id, start_over)

    def rows(self) -> dict[int, tuple]:
        engine = make_engine(self.url)
        try:
            with engine.connect() as connection:
                found = connection.execute(
                    sa.text(f'SELECT id, version, "big note", _lsn FROM {self.table}')
                )
                return {row[0]: tuple(row[1:]) for row in found}
        finally:
            engine.dispose()


@pytest.fixture
def target(url, table) -> Iterator[Target]:
    made = Target(url, table)
    yield made
    made.merger.close()
