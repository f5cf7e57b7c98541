"""MergeSink on SQLite, fed Arrow tables as Spark's foreachBatch would: each batch id merged
once, deletes removing keys, upserts replacing whole rows."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
import sqlalchemy as sa

from spark_jobs.jobs.merge_sink import BATCHES_TABLE, MergeSink, sql_type

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("version", pa.int64()),
        ("note", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("_op", pa.string()),
        ("_lsn", pa.int64()),
    ]
)
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class Batch:
    """What write_batch uses of a DataFrame."""

    def __init__(self, rows: list[tuple]):
        self.table = pa.Table.from_pylist(
            [dict(zip(SCHEMA.names, row, strict=True)) for row in rows], schema=SCHEMA
        )

    def toArrow(self) -> pa.Table:
        return self.table


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path}/target.db"


def rows(url: str, table: str = "accounts") -> dict[int, tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            result = connection.execute(sa.text(f"SELECT id, version, note, _lsn FROM {table}"))
            return {row[0]: tuple(row[1:]) for row in result}
    finally:
        engine.dispose()


def recorded(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            result = connection.execute(sa.text(f"SELECT query, batch_id FROM {BATCHES_TABLE}"))
            return {row[0]: row[1] for row in result}
    finally:
        engine.dispose()


def test_upserts_and_deletes_merge_by_key(url):
    sink = MergeSink(url, "accounts", ["id"], query="q")
    sink.write_batch(Batch([(1, 1, "a", AT, "snapshot", 10), (2, 1, None, AT, "snapshot", 10)]), 0)
    sink.write_batch(
        Batch([(1, 2, "b", AT, "update", 20), (2, None, None, None, "delete", 20),
               (3, 1, "c", AT, "insert", 20)]),
        1,
    )  # fmt: skip
    assert rows(url) == {1: (2, "b", 20), 3: (1, "c", 20)}
    assert recorded(url) == {"q": 1}
    sink.close()


def test_a_replayed_or_older_batch_changes_nothing(url):
    sink = MergeSink(url, "accounts", ["id"], query="q")
    sink.write_batch(Batch([(1, 1, "a", AT, "insert", 10)]), 0)
    sink.write_batch(Batch([(1, 2, "b", AT, "update", 20)]), 1)
    # Spark runs batch 1 again after a failure, and a stale batch 0 turns up: both skipped.
    sink.write_batch(Batch([(1, 2, "b", AT, "update", 20), (9, 1, "x", AT, "insert", 20)]), 1)
    sink.write_batch(Batch([(1, 1, "a", AT, "insert", 10)]), 0)
    assert rows(url) == {1: (2, "b", 20)}
    assert recorded(url) == {"q": 1}
    sink.close()


def test_the_batch_record_survives_a_new_sink_and_is_per_query(url):
    first = MergeSink(url, "accounts", ["id"], query="q")
    first.write_batch(Batch([(1, 1, "a", AT, "insert", 10)]), 3)
    first.close()
    again = MergeSink(url, "accounts", ["id"], query="q")  # a restarted driver
    again.write_batch(Batch([(1, 9, "late", AT, "update", 5)]), 3)
    assert rows(url) == {1: (1, "a", 10)}
    other = MergeSink(url, "copy", ["id"], query="other")
    other.write_batch(Batch([(7, 1, "o", AT, "insert", 1)]), 0)
    assert rows(url, "copy") == {7: (1, "o", 1)}
    assert recorded(url) == {"q": 3, "other": 0}
    again.close()
    other.close()


def test_a_failing_batch_leaves_neither_rows_nor_its_record(url, monkeypatch):
    sink = MergeSink(url, "accounts", ["id"], query="q")
    sink.write_batch(Batch([(1, 1, "a", AT, "insert", 10)]), 0)
    calls = []
    real = sink._upsert

    def failing(table):
        calls.append(table)
        raise RuntimeError("boom")

    monkeypatch.setattr(sink, "_upsert", failing)
    with pytest.raises(RuntimeError):
        sink.write_batch(
            Batch([(1, None, None, None, "delete", 20), (2, 1, "b", AT, "insert", 20)]), 1
        )
    assert calls and rows(url) == {1: (1, "a", 10)} and recorded(url) == {"q": 0}
    monkeypatch.setattr(sink, "_upsert", real)
    sink.write_batch(Batch([(1, None, None, None, "delete", 20), (2, 1, "b", AT, "insert", 20)]), 1)
    assert rows(url) == {2: (1, "b", 20)} and recorded(url) == {"q": 1}
    sink.close()


def test_batches_larger_than_one_statement(url, monkeypatch):
    monkeypatch.setattr("spark_jobs.jobs.merge_sink.STATEMENT_ROWS", 7)
    sink = MergeSink(url, "accounts", ["id"], query="q")
    sink.write_batch(Batch([(i, 1, None, AT, "snapshot", 1) for i in range(50)]), 0)
    sink.write_batch(Batch([(i, None, None, None, "delete", 2) for i in range(0, 50, 2)]), 1)
    assert sorted(rows(url)) == list(range(1, 50, 2))
    sink.close()


def test_a_composite_key(url):
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int64()),
                        ("_op", pa.string()), ("_lsn", pa.int64())])  # fmt: skip

    class Two:
        def __init__(self, data):
            self.data = pa.Table.from_pylist(
                [dict(zip(schema.names, r, strict=True)) for r in data], schema=schema
            )

        def toArrow(self):
            return self.data

    sink = MergeSink(url, "pairs", ["a", "b"], query="q")
    sink.write_batch(Two([(1, "x", 1, "insert", 1), (1, "y", 1, "insert", 1)]), 0)
    sink.write_batch(Two([(1, "x", None, "delete", 2), (1, "y", 2, "update", 2)]), 1)
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT a, b, v FROM pairs")).all() == [(1, "y", 2)]
    engine.dispose()
    sink.close()


def test_sql_types_follow_arrow():
    assert isinstance(sql_type(pa.int64()), sa.BigInteger)
    assert isinstance(sql_type(pa.int32()), sa.Integer)
    assert isinstance(sql_type(pa.float64()), sa.Float)
    assert isinstance(sql_type(pa.bool_()), sa.Boolean)
    assert sql_type(pa.timestamp("us", tz="UTC")).timezone is True
    assert isinstance(sql_type(pa.string()), sa.Text)
