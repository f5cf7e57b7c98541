"""The changelog phase against a real PostgreSQL with wal_level = logical."""

import tracemalloc

import pyarrow as pa
import pytest
from sqlalchemy import text

from spark_jobs.sources.cdc.changelog import Changelog
from spark_jobs.sources.cdc.changes import ChangeStreamError, RelationCache
from spark_jobs.sources.cdc.describe import describe_table
from spark_jobs.sources.cdc.pgoutput import decode
from spark_jobs.sources.cdc.slot import ReplicationSlot, SlotError
from spark_jobs.sources.cdc.snapshot import ChunkReader, read_chunk
from spark_jobs.sources.cdc.table import TableChangedError
from tests.spark_jobs.sources.cdc.conftest import BIG, transactions


@pytest.fixture
def changelog(slot, table, database):
    return Changelog(slot, describe_table(database, table))


def write(database, *statements: str, **params) -> None:
    """Run ``statements`` as one transaction."""
    with database.begin() as connection:
        for statement in statements:
            connection.execute(text(statement), params)


def commit_ends(slot) -> list[int]:
    """The commit ends of every transaction the slot holds, decoded on their own."""
    found = transactions((decode(row.data) for row in slot.peek()), RelationCache())
    return [t.end_lsn for t in found]


def read_all(changelog: Changelog, start: int, end: int, coverage=None) -> pa.Table:
    """A batch's pieces as one table."""
    return pa.Table.from_batches(list(changelog.read(start, end, coverage)), changelog.schema)


def rows(batch) -> list[tuple]:
    return [
        (r["_op"], r["id"], r["name"], r["notes"], r["_lsn"], r["_unchanged"])
        for r in batch.to_pylist()
    ]


def test_row_changes_in_commit_order_with_their_commits_end(changelog, slot, table, database):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL), (2, 'b', 'x')")
    write(database, f"UPDATE {table} SET name = 'A' WHERE id = 1")
    write(database, f"UPDATE {table} SET id = 20 WHERE id = 2")
    write(database, f"DELETE FROM {table} WHERE id = 1")
    write(
        database,
        f"INSERT INTO {table} VALUES (3, 'c', NULL)",
        f"UPDATE {table} SET notes = 'y' WHERE id = 3",
        f"DELETE FROM {table} WHERE id = 20",
    )
    e1, e2, e3, e4, e5 = commit_ends(slot)

    end = changelog.plan(start)
    batch = read_all(changelog, start, end)

    assert end == e5
    assert rows(batch) == [
        ("insert", 1, "a", None, e1, []),
        ("insert", 2, "b", "x", e1, []),
        ("update", 1, "A", None, e2, []),
        ("delete", 2, None, None, e3, []),
        ("insert", 20, "b", "x", e3, []),
        ("delete", 1, None, None, e4, []),
        ("insert", 3, "c", None, e5, []),
        ("update", 3, "c", "y", e5, []),
        ("delete", 20, None, None, e5, []),
    ]
    times = batch.column("_commit_time").to_pylist()
    assert None not in times and times == sorted(times)
    assert changelog.plan(end) == end and read_all(changelog, end, end).num_rows == 0


def test_rows_have_the_schema_of_snapshot_chunks(
    changelog, logical_server, slot, table, database, tmp_path
):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', 'x')")
    reader = ChunkReader(logical_server.url, table, slot)
    try:
        chunk = reader.next_chunk(None, 10, str(tmp_path / "c.arrow"))
    finally:
        reader.close()

    batch = read_all(changelog, start, changelog.plan(start))

    assert batch.schema == read_chunk(chunk.path).schema
    assert batch.schema.field("_unchanged").type == pa.list_(pa.string())


@pytest.mark.parametrize("commit_each", [False, True])
def test_batches_of_one_change_take_whole_transactions_once_each(
    changelog, slot, table, database, commit_each
):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    write(database, *(f"INSERT INTO {table} VALUES ({i}, 'b', NULL)" for i in (2, 3, 4)))
    write(database, f"UPDATE {table} SET name = 'c' WHERE id = 1")
    write(database, *(f"DELETE FROM {table} WHERE id = {i}" for i in (2, 3)))
    ends = commit_ends(slot)
    assert changelog.plan(start, max_changes=3) == ends[0]
    assert changelog.plan(start, max_changes=4) == ends[1]

    batches, at = [], start
    while (end := changelog.plan(at, max_changes=1)) != at:
        batch = read_all(changelog, at, end)
        batches.append((end, batch.num_rows, set(batch.column("_lsn").to_pylist())))
        if commit_each:
            changelog.commit(end)
        at = end

    assert batches == [(e, n, {e}) for e, n in zip(ends, [1, 3, 1, 2], strict=True)]


def test_a_batch_read_again_after_more_writes_is_the_same(changelog, slot, table, database):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL), (2, 'b', NULL)")
    write(database, f"UPDATE {table} SET id = 3 WHERE id = 2")
    end = changelog.plan(start)
    first = read_all(changelog, start, end)

    write(database, f"INSERT INTO {table} VALUES (4, 'd', NULL)")
    write(database, f"DELETE FROM {table} WHERE id = 1")

    assert first.num_rows == 4
    assert read_all(changelog, start, end).equals(first)
    assert changelog.plan(start) > end


def test_commit_moves_the_slot_to_the_end_and_never_back(changelog, slot, table, database):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    write(database, f"INSERT INTO {table} VALUES (2, 'b', NULL)")
    first = changelog.plan(start, max_changes=1)

    changelog.commit(first)
    write(database, f"INSERT INTO {table} VALUES (3, 'c', NULL)")
    assert slot.confirmed_flush_lsn() == first

    second = changelog.plan(first)
    assert [r["id"] for r in read_all(changelog, first, second).to_pylist()] == [2, 3]
    changelog.commit(start)
    changelog.commit(first)
    assert slot.confirmed_flush_lsn() == first
    with pytest.raises(SlotError, match=r"past the batch start"):
        read_all(changelog, start, first)

    changelog.commit(second)
    assert slot.confirmed_flush_lsn() == second
    assert changelog.plan(second) == second


def test_an_end_that_is_no_commits_end_is_refused(changelog, slot, table, database):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    end = changelog.plan(start)
    with pytest.raises(ChangeStreamError, match=r"no transaction of public\.accounts_\d+ ends"):
        read_all(changelog, start, end - 1)
    with pytest.raises(ValueError, match="ends before it starts"):
        read_all(changelog, end, start)


def test_an_unchanged_toasted_value_is_null_and_named_without_an_old_row(
    changelog, slot, table, database
):
    write(database, f"INSERT INTO {table} VALUES (1, 'a', :big)", big=BIG)
    start = changelog.plan(slot.confirmed_flush_lsn())
    write(database, f"UPDATE {table} SET name = 'b' WHERE id = 1")
    write(database, f"UPDATE {table} SET id = 2 WHERE id = 1")

    batch = read_all(changelog, start, changelog.plan(start))

    assert [row[:4] + row[5:] for row in rows(batch)] == [
        ("update", 1, "b", None, ["notes"]),
        ("delete", 1, None, None, []),
        ("insert", 2, "b", None, ["notes"]),
    ]


def test_an_unchanged_toasted_value_comes_from_the_old_row_under_replica_identity_full(
    slot, table, database
):
    write(database, f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    changelog = Changelog(slot, describe_table(database, table))
    write(database, f"INSERT INTO {table} VALUES (1, 'a', :big)", big=BIG)
    start = changelog.plan(slot.confirmed_flush_lsn())
    write(database, f"UPDATE {table} SET name = 'b' WHERE id = 1")
    write(database, f"UPDATE {table} SET id = 2 WHERE id = 1")

    batch = read_all(changelog, start, changelog.plan(start))

    assert [row[:4] + row[5:] for row in rows(batch)] == [
        ("update", 1, "b", BIG, []),
        ("delete", 1, None, None, []),
        ("insert", 2, "b", BIG, []),
    ]


def test_a_truncate_stops_the_changelog_by_name(changelog, slot, table, database):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    write(database, f"TRUNCATE {table}")
    before = changelog.plan(start, max_changes=1)
    assert read_all(changelog, start, before).num_rows == 1

    with pytest.raises(
        TableChangedError, match=rf"table public\.{table} was truncated .*start over"
    ):
        read_all(changelog, before, changelog.plan(before))


def test_a_column_added_stops_the_changelog_at_the_first_change_after(
    changelog, slot, table, database
):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    write(database, f"ALTER TABLE {table} ADD COLUMN extra int")
    quiet = changelog.plan(start)
    assert read_all(changelog, start, quiet).num_rows == 1

    write(database, f"INSERT INTO {table} VALUES (2, 'b', NULL, 7)")
    with pytest.raises(TableChangedError, match=rf"table public\.{table} changed .*'extra'"):
        read_all(changelog, quiet, changelog.plan(quiet))


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        # A new primary key: an update of the old key would carry no old key at all.
        (
            "ALTER TABLE {t} DROP CONSTRAINT {t}_pkey, ADD PRIMARY KEY (name)",
            r"its key columns are \['name'\], not \['id'\]",
        ),
        (
            "CREATE UNIQUE INDEX {t}_name ON {t} (name); "
            "ALTER TABLE {t} ALTER COLUMN name SET NOT NULL, REPLICA IDENTITY USING INDEX {t}_name",
            "its replica identity is USING INDEX, not DEFAULT",
        ),
        ("ALTER TABLE {t} REPLICA IDENTITY FULL", "its replica identity is FULL, not DEFAULT"),
    ],
)
def test_a_new_key_or_replica_identity_stops_the_changelog(
    changelog, slot, table, database, ddl, named
):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    write(database, *ddl.format(t=table).split("; "))
    write(database, f"UPDATE {table} SET name = 'b' WHERE id = 1")
    with pytest.raises(TableChangedError, match=rf"table public\.{table} changed .*{named}"):
        read_all(changelog, start, changelog.plan(start))


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        (
            "ALTER COLUMN code TYPE varchar(10)",
            r"\('code', 1043, 14\), \('amount', 1700, 655366\)\]",
        ),
        ("ALTER COLUMN amount TYPE numeric(10, 1)", r"\('amount', 1700, 655365\)\], not"),
    ],
)
def test_a_type_narrowed_stops_the_changelog(logical_server, database, ddl, named):
    """The copy would keep values the source no longer can: a ``varchar(n)`` shortened, a
    numeric's scale cut (its type OID stays)."""
    name = f"amounts_{'code' if 'code' in ddl else 'amount'}"
    write(
        database,
        f"CREATE TABLE {name} (id int PRIMARY KEY, code varchar(20), amount numeric(10, 2))",
    )
    slot = ReplicationSlot(logical_server.url, f"slot_{name}", f"pub_{name}", name)
    slot.ensure()
    try:
        changelog = Changelog(slot, describe_table(database, name))
        start = slot.confirmed_flush_lsn()
        write(database, f"ALTER TABLE {name} {ddl}")
        write(database, f"INSERT INTO {name} VALUES (1, 'c', 1.5)")
        with pytest.raises(TableChangedError, match=named):
            read_all(changelog, start, changelog.plan(start))
    finally:
        slot.drop()
        slot.close()


def test_behind_counts_the_wal_written_after_an_end(changelog, slot, table, database):
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', :big)", big=BIG)
    end = changelog.plan(start)

    assert changelog.behind(start)["bytes_behind"] >= end - start > 0
    assert changelog.behind(slot.current_wal_lsn() + 10**6) == {"bytes_behind": 0}


def test_planning_a_transaction_of_a_million_changes_holds_none_of_them(
    changelog, slot, table, database
):
    """The planner once peeked every change of a batch into memory, twice over for a large
    transaction; the server now counts them, and the transaction is a batch alone."""
    start = slot.confirmed_flush_lsn()
    write(database, f"INSERT INTO {table} SELECT g, 'n', NULL FROM generate_series(1, 1000000) g")
    write(database, f"UPDATE {table} SET name = 'after' WHERE id = 1")
    tracemalloc.start()
    try:
        end = changelog.plan(start, max_changes=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end > start and changelog.more_after
    assert peak < 1_000_000, f"{peak:,} bytes"
    changelog.commit(end)  # past it: the server need not decode it again
    after = changelog.plan(end, max_changes=1000)
    assert rows(read_all(changelog, end, after)) == [("update", 1, "after", None, after, [])]


def test_reading_a_large_transaction_keeps_memory_flat(
    changelog, slot, table, database, monkeypatch
):
    """Pieces of at most PIECE_ROWS, the transaction's rows spilled to a local file until its
    commit: eight times the rows, about the same peak."""
    monkeypatch.setattr("spark_jobs.sources.cdc.changelog.PIECE_ROWS", 1000)
    peaks = []
    for first, size in ((1, 5_000), (100_001, 40_000)):
        start = slot.confirmed_flush_lsn()
        write(
            database,
            f"INSERT INTO {table} SELECT g, 'n', NULL "
            f"FROM generate_series({first}, {first + size - 1}) g",
        )
        end = changelog.plan(start)
        tracemalloc.start()
        try:
            pieces = [(p.num_rows, p.column("id")[0].as_py()) for p in changelog.read(start, end)]
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        changelog.commit(end)
        assert sum(n for n, _ in pieces) == size and max(n for n, _ in pieces) == 1000
        assert [first_id for _, first_id in pieces] == list(range(first, first + size, 1000))
    assert peaks[1] < 1.5 * peaks[0], peaks
