"""The postgres-cdc child through the hybrid source's reader, against a real PostgreSQL."""

import contextlib
import json
import pickle
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import LongType, StringType, StructField, StructType
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.child import default_slot_name
from spark_jobs.sources.cdc.connection import (
    PASSWORD_ENV,
    change_schema,
    connection_url,
    describe,
    teardown,
)
from spark_jobs.sources.cdc.lsn import format_lsn, parse_lsn
from spark_jobs.sources.cdc.slot import ReplicationSlot, SlotError
from spark_jobs.sources.cdc.table import TableChangedError
from spark_jobs.sources.children import ChildSpecError
from spark_jobs.sources.hybrid import HybridStreamReader
from spark_jobs.sources.postgres_cdc import PostgresCdcDataSource
from tests.support.postgres import LOGICAL_DECODING, PostgresServer

CHUNK_ROWS = 10


def write(database, *statements: str) -> None:
    with database.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))


def spec(server, table, **fields) -> dict:
    return {
        "name": "accounts",
        "kind": "postgres-cdc",
        "connection": server.url,
        "chunkRows": CHUNK_ROWS,
        "table": table,
        **fields,
    }


@pytest.fixture
def filled(database, table):
    """25 rows: chunks (..10], (10..20], (20..)."""
    write(database, f"INSERT INTO {table} SELECT g, 'n' || g, NULL FROM generate_series(1, 25) g")
    return table


@pytest.fixture
def make_reader(logical_server, filled, tmp_path):
    readers = []

    def make(**fields):
        shape = describe("accounts", logical_server.url, filled)
        fields = {"table": filled, **fields}
        options = {
            "sources": json.dumps([spec(logical_server, **fields)]),
            "stateLocation": str(tmp_path / "state"),
        }
        readers.append(HybridStreamReader(options, from_arrow_schema(change_schema(shape))))
        return readers[-1]

    yield make
    for reader in readers:
        for child in reader.children:
            if child._start is not None:
                teardown(child.url, child.slot, child.publication, child.table)
        reader.stop()


def read(reader, start, end) -> list[dict]:
    tables = [
        pa.Table.from_batches(list(reader.read(p)), schema=reader.arrow_schema)
        for p in reader.partitions(start, end)
    ]
    return pa.concat_tables(tables).to_pylist() if tables else []


def ops(rows) -> list[tuple]:
    return [(r["_op"], r["id"], r["name"]) for r in rows]


def slot_of(reader) -> ReplicationSlot:
    return reader.children[0].replication_slot


def test_the_snapshot_is_backlog_then_one_switch_to_a_live_changelog(make_reader, database, filled):
    reader = make_reader()
    start = reader.initialOffset()
    ends = [start]
    for _ in range(4):
        ends.append(reader.latestOffset(ends[-1], ReadMaxRows(2 * CHUNK_ROWS)))
    positions = [end["position"] for end in ends]

    assert [p["phase"] for p in positions] == ["snapshot"] * 3 + ["changelog"] * 2
    assert [end["backlog"] for end in ends] == [True, True, True, False, False]
    assert [p["chunks"] for p in positions[:3]] == [0, 2, 3]
    assert positions[2]["done"] and positions[1]["after"] == [20]
    assert [end.get("rows") for end in ends[1:3]] == [20, 5]
    # Nothing changed: the switch is a batch of its own, up to the last chunk's high
    # watermark (from there the copy is the table as of one position), then no batch.
    assert ends[4] == ends[3]
    until = reader.children[0].coverage(3).until
    assert parse_lsn(positions[0]["lsn"]) < until < parse_lsn(positions[3]["lsn"])
    snapshot = read(reader, ends[0], ends[1]) + read(reader, ends[1], ends[2])
    assert sorted(r["id"] for r in snapshot) == list(range(1, 26))
    assert {r["_op"] for r in snapshot} == {"snapshot"}
    assert read(reader, ends[2], ends[3]) == []


def test_changes_a_chunk_holds_are_not_emitted_again(make_reader, database, filled):
    reader = make_reader()
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(CHUNK_ROWS))
    # Key 1's chunk is copied, key 24's is not: only key 1's update is a change to emit,
    # in the next batch, beside the chunks it copies; key 24's is in its chunk's image.
    write(database, f"UPDATE {filled} SET name = 'x' WHERE id IN (1, 24)")
    rest = reader.latestOffset(first, ReadAllAvailable())
    switch = reader.latestOffset(rest, ReadAllAvailable())

    assert rest["position"]["done"]
    batch = read(reader, first, rest)
    assert [r for r in ops(batch) if r[1] in (1, 24)] == [("update", 1, "x"), ("snapshot", 24, "x")]
    assert sorted(r["id"] for r in batch if r["_op"] == "snapshot") == list(range(11, 26))
    assert read(reader, rest, switch) == []


def test_the_slot_follows_the_snapshot_so_a_chunk_decodes_only_the_changes_since_the_last_batch(
    make_reader, database, filled
):
    reader = make_reader()
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(CHUNK_ROWS))
    write(database, f"UPDATE {filled} SET name = 'x' WHERE id = 1")
    second = reader.latestOffset(first, ReadMaxRows(CHUNK_ROWS))
    assert ops(read(reader, first, second))[0] == ("update", 1, "x")
    reader.commit(first)
    reader.commit(second)
    moved = slot_of(reader).confirmed_flush_lsn()
    write(database, f"UPDATE {filled} SET name = 'y' WHERE id IN (2, 12, 22)")
    third = reader.latestOffset(second, ReadMaxRows(CHUNK_ROWS))

    assert second["position"]["phase"] == "snapshot" and second["position"]["chunks"] == 2
    assert format_lsn(moved) == second["position"]["lsn"] > start["position"]["lsn"]
    batch = read(reader, second, third)
    assert ops(batch)[:2] == [("update", 2, "y"), ("update", 12, "y")]
    assert [r for r in ops(batch) if r[1] == 22] == [("snapshot", 22, "y")]
    # A peek from the moved slot holds only what was written since: the third batch's
    # update and the high watermarks of the chunks after it.
    assert all(row.lsn > moved for row in slot_of(reader).peek())


def test_changes_follow_in_commit_order_and_a_limit_leaves_lag(make_reader, database, filled):
    reader = make_reader()
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    end = reader.latestOffset(end, ReadAllAvailable())
    write(database, f"INSERT INTO {filled} VALUES (100, 'a', NULL)")
    write(database, f"UPDATE {filled} SET id = 101, name = 'b' WHERE id = 100")
    write(database, f"DELETE FROM {filled} WHERE id = 3")

    limited = reader.latestOffset(end, ReadMaxRows(1))
    assert reader.latest["lag"]["offsets_behind_latest"] > 0
    assert ops(read(reader, end, limited)) == [("insert", 100, "a")]
    rest = reader.latestOffset(limited, ReadAllAvailable())
    lag = reader.latest["lag"]
    assert (lag["offsets_behind_latest"], lag["bytes_behind"]) == (0, 0)
    changes = read(reader, limited, rest)
    assert ops(changes) == [("delete", 100, None), ("insert", 101, "b"), ("delete", 3, None)]
    assert [r["_seq"] for r in changes] == [0, 1, 0]


def test_a_batch_read_again_after_more_writes_returns_the_same_rows(make_reader, database, filled):
    reader = make_reader()
    start = reader.initialOffset()
    snapshot_end = reader.latestOffset(start, ReadAllAvailable())
    switch = reader.latestOffset(snapshot_end, ReadAllAvailable())
    write(database, f"UPDATE {filled} SET name = 'y' WHERE id = 5")
    changes_end = reader.latestOffset(switch, ReadAllAvailable())
    first = (read(reader, start, snapshot_end), read(reader, switch, changes_end))
    write(database, f"UPDATE {filled} SET name = 'z' WHERE id = 5", f"DELETE FROM {filled}")

    assert (read(reader, start, snapshot_end), read(reader, switch, changes_end)) == first
    assert ops(first[1]) == [("update", 5, "y")]


def test_the_slot_moves_only_when_spark_commits_and_to_that_end(make_reader, database, filled):
    reader = make_reader()
    start = reader.initialOffset()
    created_at = slot_of(reader).confirmed_flush_lsn()
    snapshot_end = reader.latestOffset(start, ReadAllAvailable())
    switch = reader.latestOffset(snapshot_end, ReadAllAvailable())
    write(database, f"UPDATE {filled} SET name = 'y' WHERE id = 5")
    first = reader.latestOffset(switch, ReadAllAvailable())
    write(database, f"UPDATE {filled} SET name = 'z' WHERE id = 6")
    second = reader.latestOffset(first, ReadAllAvailable())
    reader.commit(snapshot_end)
    assert slot_of(reader).confirmed_flush_lsn() == created_at
    # The switch batch ends at the last chunk's high watermark: a position of its own.
    reader.commit(switch)
    assert format_lsn(slot_of(reader).confirmed_flush_lsn()) == switch["position"]["lsn"]

    reader.commit(first)
    assert format_lsn(slot_of(reader).confirmed_flush_lsn()) == first["position"]["lsn"]
    # A commit seen again, or late, never moves the slot back.
    reader.commit(switch)
    assert format_lsn(slot_of(reader).confirmed_flush_lsn()) == first["position"]["lsn"]
    assert ops(read(reader, first, second)) == [("update", 6, "z")]


def test_committed_chunk_files_go_and_a_chunk_no_offset_recorded_is_copied_again(
    make_reader, database, filled, tmp_path
):
    reader = make_reader()
    start = reader.initialOffset()
    reader.latestOffset(start, ReadMaxRows(CHUNK_ROWS))  # a plan the driver died before logging
    chunks = tmp_path / "state" / "accounts" / "chunks"
    assert sorted(p.name for p in chunks.iterdir()) == ["00000000.arrow", "00000000.json"]
    write(database, f"UPDATE {filled} SET name = 'late' WHERE id = 2")

    restarted = make_reader()
    again = restarted.latestOffset(restarted.initialOffset(), ReadMaxRows(CHUNK_ROWS))
    assert again["position"]["chunks"] == 1
    # Once, from the new copy's image: the update ended before its high watermark.
    assert [(r["_op"], r["name"]) for r in read(restarted, start, again) if r["id"] == 2] == [
        ("snapshot", "late")
    ]
    restarted.commit(again)
    assert sorted(p.name for p in chunks.iterdir()) == ["00000000.json"]


def test_the_planner_s_connections_stay_behind_when_it_is_pickled(make_reader):
    reader = make_reader()
    reader.latestOffset(reader.initialOffset(), ReadMaxRows(CHUNK_ROWS))
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.children[0]._slot is None and copy.children[0]._reader is None


def test_a_changelog_partition_does_not_show_the_password(
    make_reader, database, filled, monkeypatch
):
    monkeypatch.setenv(PASSWORD_ENV, "hunter2")
    reader = make_reader()
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    switch = reader.latestOffset(end, ReadAllAvailable())
    write(database, f"DELETE FROM {filled} WHERE id = 1")
    end = reader.latestOffset(switch, ReadAllAvailable())
    (partition,) = reader.partitions(switch, end)
    # What travels to executors (the reader and its partitions, pickled) holds no password:
    # an executor takes it from its own environment.
    assert b"hunter2" not in pickle.dumps((reader, partition))
    assert "hunter2" not in repr(partition)
    assert [row["id"] for row in read(reader, switch, end)] == [1]


def test_the_password_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, "hunter2")
    assert connection_url("c", "postgresql://reader@db:5432/shop") == (
        "postgresql://reader:hunter2@db:5432/shop"
    )
    assert connection_url("c", "postgres://reader@db/shop?sslmode=require") == (
        "postgresql://reader:hunter2@db/shop?sslmode=require"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"connection": "mysql://u@h/d"}, "field 'connection' = 'mysql://u@h/d' must be a Postgre"),
        ({"connection": "not a url"}, "must be a PostgreSQL URL"),
        ({"connection": "postgresql://u:hunter2@h/d"}, r"in its user part.*BACKLOG_CDC_PASSWORD"),
        ({"connection": "postgresql://u@h/d?password=hunter2"}, r"in its parameter 'password'"),
        ({"connection": "postgres://u@h/d?sslmode=require&sslpassword=hunter2"}, "sslpassword"),
        ({"chunkRows": 0}, "field 'chunkRows' = 0 must be at least 1"),
        ({"chunkRows": "10"}, "field 'chunkRows' = '10' must be a int"),
        ({"slot": "Bad-Name"}, "field 'slot': slot name 'Bad-Name': use 1 to 63 lower-case"),
        ({"publication": "x y"}, "field 'publication': publication name 'x y'"),
        ({"table": "missing"}, "no table 'missing' on postgresql.*127.0.0.1"),
    ],
)
def test_bad_fields_are_refused_by_name(make_reader, fields, message):
    with pytest.raises(ChildSpecError, match=message) as caught:
        make_reader(**fields)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("create", "named"),
    [
        # Published, its table's every UPDATE and DELETE would fail: "does not have a
        # replica identity".
        (
            "CREATE TABLE deferred (id int PRIMARY KEY DEFERRABLE, name text)",
            r"its primary key deferred_pkey \(id\) is DEFERRABLE",
        ),
        (
            "CREATE TABLE keyed_on_generated (a int, b int GENERATED ALWAYS AS (a * 2) STORED, "
            "PRIMARY KEY (b))",
            "primary-key column 'b' is generated",
        ),
    ],
)
def test_a_table_postgresql_cannot_publish_whole_is_refused_before_anything_is_made(
    make_reader, database, create, named
):
    write(database, create)
    table = create.split()[2]
    made = text(
        "SELECT (SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_replication_slots)"
    )
    with database.connect() as connection:
        before = connection.execute(made).one()
    with pytest.raises(ChildSpecError, match=rf"table public\.{table}: {named}"):
        make_reader(table=table)
    with database.connect() as connection:
        assert connection.execute(made).one() == before
    write(
        database,
        f"UPDATE {table} SET a = 1" if "generated" in create else f"UPDATE {table} SET name = 'x'",
    )


@pytest.mark.parametrize(
    ("setup", "name", "named"),
    [
        # A read of a parent holds its children's rows, whose changes name the children.
        (
            "CREATE TABLE parent_t (id int PRIMARY KEY, name text); "
            "CREATE TABLE child_t (extra int) INHERITS (parent_t)",
            "parent_t",
            r"table public\.parent_t has inheritance children \(child_t\)",
        ),
        # A partition's changes are published as its root's.
        (
            "CREATE TABLE root_t (id int PRIMARY KEY) PARTITION BY RANGE (id); "
            "CREATE TABLE leaf_t PARTITION OF root_t FOR VALUES FROM (0) TO (10)",
            "leaf_t",
            r"table public\.leaf_t is a partition of root_t, .*copy root_t",
        ),
    ],
)
def test_a_table_whose_rows_a_read_and_its_changes_see_apart_is_refused(
    make_reader, database, setup, name, named
):
    write(database, *setup.split("; "))
    with pytest.raises(ChildSpecError, match=named):
        make_reader(table=name)


def test_row_security_that_hides_rows_from_the_reader_is_refused(
    make_reader, database, logical_server, filled, monkeypatch
):
    """The snapshot would read what the policy shows, the slot decode every change: the
    copy would hold fewer rows than the table and call itself live."""
    write(
        database,
        "CREATE ROLE limited LOGIN REPLICATION",
        f"GRANT SELECT ON {filled} TO limited",
        f"ALTER TABLE {filled} ENABLE ROW LEVEL SECURITY",
        f"CREATE POLICY first_rows ON {filled} FOR SELECT USING (id < 10)",
    )
    limited = logical_server.url.replace("postgres@", "limited@")
    try:
        with pytest.raises(ChildSpecError, match="row-level security that hides rows"):
            make_reader(connection=limited)
    finally:
        write(database, f"ALTER TABLE {filled} DISABLE ROW LEVEL SECURITY")


def test_a_database_not_in_utf8_is_refused_before_anything_is_made(
    make_reader, database, logical_server
):
    engine = database.execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(
            text(
                "CREATE DATABASE latin TEMPLATE template0 ENCODING 'LATIN1' "
                "LC_COLLATE 'C' LC_CTYPE 'C'"
            )
        )
    latin = logical_server.url.rsplit("/", 1)[0] + "/latin"
    write(make_engine(latin), "CREATE TABLE t (id int PRIMARY KEY, name text)")
    with pytest.raises(ChildSpecError, match="is encoded in LATIN1; the source reads"):
        make_reader(connection=latin, table="t")


def test_a_table_without_a_primary_key_is_refused(make_reader, database):
    write(database, "CREATE TABLE keyless (id int, name text)")
    with pytest.raises(ChildSpecError, match=r"table public\.keyless has no primary key"):
        make_reader(table="keyless")


def test_the_state_location_is_required(logical_server, filled):
    options = {"sources": json.dumps([spec(logical_server, filled)])}
    schema = StructType([StructField("id", LongType())])
    with pytest.raises(ChildSpecError, match=r"option 'stateLocation'.*which is not set"):
        HybridStreamReader(options, schema)


def test_a_schema_column_the_table_lacks_is_named(logical_server, filled, tmp_path):
    options = {
        "sources": json.dumps([spec(logical_server, filled)]),
        "stateLocation": str(tmp_path),
    }
    schema = StructType([StructField("id", LongType()), StructField("email", StringType())])
    with pytest.raises(ChildSpecError, match=r"columns \['email'\] that rows of public\."):
        HybridStreamReader(options, schema)


def test_a_server_without_logical_wal_is_refused_before_the_query_starts(postgres_server, tmp_path):
    engine = make_engine(postgres_server.url)
    write(engine, "CREATE TABLE t (id int PRIMARY KEY)")
    engine.dispose()
    options = {
        "sources": json.dumps([spec(postgres_server, "t")]),
        "stateLocation": str(tmp_path),
    }
    with pytest.raises(ChildSpecError, match="child source 'accounts': wal_level is 'replica'"):
        HybridStreamReader(options, StructType([StructField("id", LongType())]))


def test_the_format_takes_its_schema_from_the_table(logical_server, filled):
    source = PostgresCdcDataSource(
        {"connection": logical_server.url, "table": filled, "stateLocation": "/tmp/x"}
    )
    assert [(f.name, f.dataType.simpleString()) for f in source.schema().fields] == [
        ("id", "int"),
        ("name", "string"),
        ("notes", "string"),
        ("_op", "string"),
        ("_lsn", "bigint"),
        ("_seq", "int"),
        ("_commit_time", "timestamp"),
        ("_unchanged", "array<string>"),
    ]


def test_each_state_location_has_its_own_slot_and_teardown_drops_it(logical_server, filled):
    one, other = default_slot_name("/data/a", "cdc"), default_slot_name("/data/b", "cdc")
    assert one != other and one.startswith("backlog_") and len(one) <= 63
    slot = ReplicationSlot(logical_server.url, one, one, filled)
    slot.ensure()
    slot.close()

    assert teardown(logical_server.url, one, one, filled) is True
    assert teardown(logical_server.url, one, one, filled) is False


def test_the_changelog_stays_backlog_until_it_passes_the_last_chunks_high_watermark(
    make_reader, database, filled
):
    """Before that point the copy holds each chunk as of its own moment: "live" must mean
    the copy equals the table as of one position, which a DAG can wait for."""
    reader = make_reader()
    first = reader.latestOffset(reader.initialOffset(), ReadMaxRows(2 * CHUNK_ROWS))
    for key in (1, 2, 3):
        write(database, f"UPDATE {filled} SET name = 'during' WHERE id = {key}")
    # One change fits beside the last chunk; the two after it are the changelog's.
    done = reader.latestOffset(first, ReadMaxRows(1))
    assert done["position"]["done"] and done["backlog"]
    assert ops(read(reader, first, done))[0] == ("update", 1, "during")
    catching_up = reader.latestOffset(done, ReadMaxRows(1))
    assert catching_up["position"]["phase"] == "changelog" and catching_up["backlog"]
    assert ops(read(reader, done, catching_up)) == [("update", 2, "during")]
    caught_up = reader.latestOffset(catching_up, ReadAllAvailable())
    assert not caught_up["backlog"]
    until = reader.children[0].coverage(caught_up["position"]["chunks"]).until
    assert parse_lsn(catching_up["position"]["lsn"]) < until
    assert parse_lsn(caught_up["position"]["lsn"]) > until


def live(reader) -> dict:
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    return reader.latestOffset(end, ReadAllAvailable())


def test_a_quiet_table_in_a_busy_database_moves_its_slot_by_heartbeats(
    make_reader, logical_server, database, filled
):
    """PostgreSQL sends nothing for transactions of other tables, so the slot kept WAL
    without bound while the job was healthy: a heartbeat gives it a position to commit, and
    the WAL the server keeps for it stays small however much is written elsewhere."""
    write(database, "CREATE TABLE busy (id serial PRIMARY KEY, payload text)")
    reader = make_reader(heartbeatInterval="0.1s")
    end = live(reader)
    reader.commit(end)
    admin = make_engine(logical_server.url).execution_options(isolation_level="AUTOCOMMIT")
    retained, busy = [], "INSERT INTO busy (payload) SELECT repeat('w', 1000)"
    for _ in range(4):
        write(database, f"{busy} FROM generate_series(1, 300)")
        with admin.connect() as connection:  # logs the running transactions, as every 15 s
            connection.execute(text("CHECKPOINT"))
        time.sleep(0.15)  # past the heartbeat interval
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # writes the heartbeat
        beat = reader.latestOffset(end, ReadAllAvailable())
        assert beat != end and read(reader, end, beat) == []
        reader.commit(beat)
        end = beat
        retained.append(slot_of(reader).health().retained_wal_bytes)
    admin.dispose()
    # Each round writes ~300 kB elsewhere; the slot follows, so what it keeps stays small.
    assert max(retained) < 64 * 1024, retained
    health = reader.latest["health"]
    assert health == {"slot_wal_status": "reserved", "max_slot_wal_keep_size": "unlimited"}
    assert reader.latest["lag"]["slot_retained_wal_bytes"] >= 0


def test_the_publication_is_checked_at_every_start(make_reader, database, filled):
    reader = make_reader()
    end = live(reader)
    publication = reader.children[0].publication
    write(database, f"ALTER PUBLICATION {publication} SET (publish = 'insert, update')")
    restarted = make_reader()
    with pytest.raises(SlotError, match=r"does not publish delete, truncate"):
        restarted.latestOffset(end, ReadAllAvailable())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("ALTER PUBLICATION {p} SET (publish = 'insert')", "does not publish update, delete"),
        ("ALTER PUBLICATION {p} DROP TABLE {t}", "does not publish table"),
        # Undone at once: the changes in between were never decoded all the same.
        ("ALTER PUBLICATION {p} DROP TABLE {t}; ALTER PUBLICATION {p} ADD TABLE {t}",
         "changed since the copy began .*may not have been decoded"),
        ("ALTER PUBLICATION {p} SET (publish = 'insert'); "
         "ALTER PUBLICATION {p} SET (publish = 'insert, update, delete, truncate')",
         "changed since the copy began"),
    ],
)  # fmt: skip
def test_a_publication_changed_while_the_job_runs_fails_the_next_plan_and_every_restart(
    make_reader, database, filled, change, named
):
    """Its changes stop arriving without an error, and heartbeats would move the slot on:
    the plan after the change fails by name, before its batch is logged, and so does every
    restart, the publication mended or not."""
    reader = make_reader(heartbeatInterval="0.1s")
    end = live(reader)
    reader.commit(end)
    publication = reader.children[0].publication
    for statement in change.format(p=publication, t=filled).split("; "):
        write(database, statement)
    write(database, f"UPDATE {filled} SET name = 'lost' WHERE id = 1")
    slot_before = slot_of(reader).confirmed_flush_lsn()
    with pytest.raises(SlotError, match=named):
        reader.latestOffset(end, ReadAllAvailable())
    assert slot_of(reader).confirmed_flush_lsn() == slot_before
    write(
        database,
        f"ALTER PUBLICATION {publication} SET (publish = 'insert, update, delete, truncate')",
    )
    with contextlib.suppress(Exception):
        write(database, f"ALTER PUBLICATION {publication} ADD TABLE {filled}")
    with pytest.raises(SlotError, match="changed since the copy began"):
        make_reader().latestOffset(end, ReadAllAvailable())


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        # Under FULL no change names the key: only the catalog says it is another one.
        ("ALTER TABLE {t} REPLICA IDENTITY FULL; "
         "ALTER TABLE {t} DROP CONSTRAINT {t}_pkey, ADD PRIMARY KEY (name)",
         r"its primary key is \['name'\], not \['id'\]"),
        ("ALTER TABLE {t} ALTER COLUMN name TYPE varchar(5)", "its columns"),
        ("ALTER TABLE {t} REPLICA IDENTITY FULL", "its replica identity is 'f', not 'd'"),
    ],
)  # fmt: skip
def test_a_table_changed_while_the_job_runs_fails_the_next_plan_before_any_change_of_it(
    make_reader, database, filled, ddl, named
):
    reader = make_reader()
    end = live(reader)
    write(database, *ddl.format(t=filled).split("; "))
    changed = rf"table public\.{filled} changed since .*{named}"
    with pytest.raises(TableChangedError, match=changed):
        reader.latestOffset(end, ReadAllAvailable())
    # Started again, the query fails at once: its chunks and positions are of the old shape.
    with pytest.raises(TableChangedError, match=changed):
        make_reader()


@pytest.fixture
def restartable(tmp_path) -> Iterator[tuple[PostgresServer, dict]]:
    """A server of its own, to stop and start, with a 25-row table and a reader's options."""
    settings = {**LOGICAL_DECODING, "synchronous_commit": "on"}
    with PostgresServer(database="shop", settings=settings) as server:
        engine = make_engine(server.url)
        write(engine, "CREATE TABLE accounts (id int PRIMARY KEY, name text, notes text)")
        write(engine, "INSERT INTO accounts SELECT g, 'n' || g, NULL FROM generate_series(1, 25) g")
        engine.dispose()
        options = {
            "sources": json.dumps([spec(server, "accounts", outageTimeout="1min")]),
            "stateLocation": str(tmp_path / "state"),
        }
        yield server, options


def test_a_server_that_is_away_is_ridden_out_by_the_planner_and_the_reader(
    restartable, monkeypatch
):
    """No batch while the server is away, then the batch; a read cut half-way by a restart
    starts over once the server is back and gives each row once."""
    server, options = restartable
    shape = describe("accounts", server.url, "accounts")
    reader = HybridStreamReader(options, from_arrow_schema(change_schema(shape)))
    end = live(reader)
    engine = make_engine(server.url)
    write(engine, "INSERT INTO accounts SELECT g, 'new', NULL FROM generate_series(100, 2099) g")
    engine.dispose()
    server.stop()
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    server.start()
    changes = reader.latestOffset(end, ReadAllAvailable())
    assert changes != end
    (partition,) = reader.partitions(end, changes)
    monkeypatch.setattr("spark_jobs.sources.cdc.changelog.PIECE_ROWS", 300)
    pieces = partition.read(reader.arrow_schema)
    ids = next(pieces).column("id").to_pylist()
    server.stop()
    back = threading.Timer(1.0, server.start)  # meanwhile the read is refused, and retries
    back.start()
    ids += [i for piece in pieces for i in piece.column("id").to_pylist()]
    back.join()
    assert ids == list(range(100, 2100))
    reader.commit(changes)
    teardown(server.url, reader.children[0].slot, reader.children[0].publication, "accounts")
    reader.stop()


def test_a_server_away_past_the_outage_timeout_fails_by_name(restartable):
    server, options = restartable
    spec_ = {**json.loads(options["sources"])[0], "outageTimeout": "0.5s"}
    options = {**options, "sources": json.dumps([spec_])}
    shape = describe("accounts", server.url, "accounts")
    reader = HybridStreamReader(options, from_arrow_schema(change_schema(shape)))
    end = live(reader)
    server.stop()
    try:
        assert reader.latestOffset(end, ReadAllAvailable()) == end
        time.sleep(0.6)
        with pytest.raises(SlotError, match=r"has not answered for .* \(outageTimeout 500ms\)"):
            reader.latestOffset(end, ReadAllAvailable())
    finally:
        server.start()
        teardown(server.url, reader.children[0].slot, reader.children[0].publication, "accounts")
        reader.stop()
