"""The slot client and the decoder against a real PostgreSQL with wal_level = logical."""

import threading
import time
from datetime import UTC

import psycopg2
import psycopg2.extras
import pytest
import sqlalchemy
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc import slot as slot_module
from spark_jobs.sources.cdc.changes import RelationCache
from spark_jobs.sources.cdc.describe import describe_table
from spark_jobs.sources.cdc.messages import UNCHANGED, Begin, Commit
from spark_jobs.sources.cdc.pgoutput import decode
from spark_jobs.sources.cdc.slot import ReplicationSlot, SlotError
from spark_jobs.sources.cdc.summary import BatchSummary
from tests.spark_jobs.sources.cdc.conftest import BIG, Transaction, transactions
from tests.support.postgres import LOGICAL_DECODING, PostgresServer


def autocommit(url: str) -> sqlalchemy.Engine:
    return make_engine(url).execution_options(isolation_level="AUTOCOMMIT")


def write(database, *statements: str, **params) -> int:
    """Run ``statements`` as one transaction; returns its 32-bit xid, as decoding sees it."""
    with database.begin() as connection:
        for statement in statements:
            connection.execute(text(statement), params)
        return connection.execute(text("SELECT pg_current_xact_id()::xid::text::bigint")).scalar()


def read(slot, **bounds) -> list[Transaction]:
    return transactions((decode(row.data) for row in slot.peek(**bounds)), RelationCache())


def rows_of(transaction: Transaction) -> list[tuple]:
    return [(change.operation, change.new, change.old) for change in transaction.changes]


def test_inserts_updates_and_deletes_decode_to_the_exact_rows(slot, table, database):
    inserted = write(
        database,
        f"INSERT INTO {table} VALUES (1, 'a', :big), (2, 'b', NULL), (3, 'c', 'short')",
        big=BIG,
    )
    renamed = write(database, f"UPDATE {table} SET name = 'A' WHERE id = 1")
    moved = write(database, f"UPDATE {table} SET id = 20 WHERE id = 2")
    deleted = write(database, f"DELETE FROM {table} WHERE id = 3")

    found = read(slot)

    assert [t.xid for t in found] == [inserted, renamed, moved, deleted]
    assert [rows_of(t) for t in found] == [
        [
            ("insert", {"id": "1", "name": "a", "notes": BIG}, None),
            ("insert", {"id": "2", "name": "b", "notes": None}, None),
            ("insert", {"id": "3", "name": "c", "notes": "short"}, None),
        ],
        # The TOASTed value the update left alone is not sent again.
        [("update", {"id": "1", "name": "A", "notes": UNCHANGED}, None)],
        # A new primary key carries the old one.
        [("update", {"id": "20", "name": "b", "notes": None}, {"id": "2"})],
        [("delete", None, {"id": "3"})],
    ]
    assert {t.changes[0].relation.qualified_name for t in found} == {f"public.{table}"}


def test_a_transactions_end_is_its_commit_rows_lsn_and_times_are_utc(slot, table, database):
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    with database.connect() as connection:
        before = connection.execute(text("SELECT now()")).scalar()
    write(database, f"INSERT INTO {table} VALUES (2, 'b', NULL)")

    rows = slot.peek()
    messages = [decode(row.data) for row in rows]
    commits = [(row.lsn, m) for row, m in zip(rows, messages, strict=True) if isinstance(m, Commit)]
    found = transactions(messages, RelationCache())

    assert [t.end_lsn for t in found] == [lsn for lsn, _ in commits]
    assert all(commit.commit_lsn < commit.end_lsn for _, commit in commits)
    assert found[0].commit_time < before < found[1].commit_time
    assert found[1].commit_time.tzinfo is UTC


def test_values_read_as_their_columns_types_whatever_the_databases_settings(logical_server):
    # Decoding runs with the peeking connection's settings: the slot's own must win over these.
    admin = autocommit(logical_server.url)
    with admin.connect() as connection:
        connection.execute(text("CREATE DATABASE odd"))
        for setting in (
            "DateStyle = 'SQL, DMY'",
            "TimeZone = 'Asia/Kolkata'",
            "bytea_output = 'escape'",
            "extra_float_digits = 0",
        ):
            connection.execute(text(f"ALTER DATABASE odd SET {setting}"))
    admin.dispose()
    url = logical_server.url.rsplit("/", 1)[0] + "/odd"
    database = make_engine(url)
    with database.begin() as connection:
        connection.execute(
            text(
                "CREATE TABLE typed (id bigint PRIMARY KEY, ok bool, small int2, ratio float8, "
                "price numeric(12, 2), day date, at timestamp, at_tz timestamptz, tag uuid, "
                "raw bytea, doc jsonb, code char(4), label varchar(10))"
            )
        )
    slot = ReplicationSlot(url, "slot_typed", "pub_typed", "public.typed")
    slot.ensure()
    try:
        write(
            database,
            "INSERT INTO typed VALUES (9007199254740993, true, -7, 0.30000000000000004, 12.5, "
            "'2026-11-25', '2026-11-25 12:34:56.789012', '2026-11-25 18:04:56.5+05:30', "
            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff', '{\"b\": [1, 2]}', 'ab', 'xyz')",
        )
        (transaction,) = read(slot)
        (change,) = transaction.changes
        assert describe_table(database, "typed").typed_change(change.new) == {
            "id": 9007199254740993,
            "ok": True,
            "small": -7,
            "ratio": 0.30000000000000004,
            "price": "12.50",
            "day": 20782,  # days since 1970-01-01
            "at": 1795610096789012,  # microseconds since 1970-01-01 00:00 UTC
            "at_tz": 1795610096500000,
            "tag": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "raw": b"\x00\xff",
            "doc": '{"b": [1, 2]}',
            "code": "ab  ",
            "label": "xyz",
        }
    finally:
        slot.drop()
        slot.close()
        database.dispose()


def test_peeking_twice_with_the_same_bounds_returns_the_same_rows(slot, table, database):
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    write(database, f"UPDATE {table} SET name = 'b' WHERE id = 1")
    first = slot.peek()
    end = read(slot)[-1].end_lsn

    write(database, f"INSERT INTO {table} VALUES (2, 'c', NULL)")

    assert slot.peek(upto_lsn=end) == first
    assert slot.peek(upto_nchanges=len(first)) == first
    assert len(slot.peek()) > len(first)


def test_after_advancing_to_a_transactions_end_the_next_peek_starts_at_the_next(
    slot, table, database
):
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    second = write(database, f"INSERT INTO {table} VALUES (2, 'b', NULL)")
    before = read(slot)

    assert slot.advance(before[0].end_lsn) == before[0].end_lsn
    assert slot.confirmed_flush_lsn() == before[0].end_lsn

    first_row = decode(slot.peek()[0].data)
    assert isinstance(first_row, Begin) and first_row.xid == second
    assert read(slot) == before[1:]


def test_a_change_limit_never_splits_a_transaction(slot, table, database):
    write(database, *(f"INSERT INTO {table} VALUES ({i}, 'a', NULL)" for i in range(5)))
    write(database, f"INSERT INTO {table} VALUES (5, 'b', NULL)")

    rows = slot.peek(upto_nchanges=1)
    (whole,) = transactions((decode(row.data) for row in rows), RelationCache())
    assert len(whole.changes) == 5
    assert isinstance(decode(rows[-1].data), Commit)

    assert [len(t.changes) for t in read(slot, upto_nchanges=len(rows) + 1)] == [5, 1]


def test_drop_leaves_no_slot_and_no_publication(logical_server, table, database):
    slot = ReplicationSlot(logical_server.url, "slot_dropped", "pub_dropped", table)
    slot.ensure()
    slot.drop()
    slot.drop()
    slot.close()
    with database.connect() as connection:
        assert not connection.execute(
            text("SELECT slot_name FROM pg_replication_slots WHERE slot_name = 'slot_dropped'")
        ).all()
        assert not connection.execute(
            text("SELECT pubname FROM pg_publication WHERE pubname = 'pub_dropped'")
        ).all()
    with pytest.raises(SlotError, match="no replication slot 'slot_dropped'"):
        slot.confirmed_flush_lsn()


def test_a_server_without_logical_wal_is_refused_by_name_without_the_password(postgres_server):
    postgres_server.start()
    url = postgres_server.url.replace("postgres@", "postgres:s3cret-pw@")
    slot = ReplicationSlot(url, "slot_replica", "pub_replica", "anything")
    with pytest.raises(
        SlotError, match=r"wal_level is 'replica' on .*wal_level = logical"
    ) as error:
        slot.ensure()
    slot.close()
    assert "s3cret-pw" not in str(error.value)
    assert "postgres:*****@" in str(error.value)


def test_a_slot_with_another_plugin_is_refused(logical_server, table, database):
    with database.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(
            text("SELECT pg_create_logical_replication_slot('slot_other', 'test_decoding')")
        )
    slot = ReplicationSlot(logical_server.url, "slot_other", "pub_other", table)
    try:
        with pytest.raises(SlotError, match="exists with plugin 'test_decoding'"):
            slot.ensure()
    finally:
        slot.drop()
        slot.close()


@pytest.mark.parametrize("name", ["Slot", "slot-1", "", "s" * 64])
def test_a_name_postgresql_would_refuse_is_named(name):
    with pytest.raises(ValueError, match=r"slot name .*lower-case letters"):
        ReplicationSlot("postgresql://u@localhost/db", name, "pub", "t")


def test_a_slot_whose_wal_was_removed_is_an_error():
    with PostgresServer(
        database="shop",
        settings={**LOGICAL_DECODING, "max_slot_wal_keep_size": "1MB"},
    ) as server:
        engine = autocommit(server.url)
        slot = ReplicationSlot(server.url, "slot_lost", "pub_lost", "t")
        try:
            with engine.connect() as connection:
                connection.execute(text("CREATE TABLE t (id serial PRIMARY KEY)"))
                slot.ensure()
                assert slot.health().wal_status == "reserved"
                deadline = time.monotonic() + 30
                while (
                    time.monotonic() < deadline
                    and connection.execute(
                        text("SELECT wal_status FROM pg_replication_slots")
                    ).scalar()
                    != "lost"
                ):
                    for _ in range(3):  # past 1 MB of WAL: segments are 16 MB
                        connection.execute(text("INSERT INTO t DEFAULT VALUES"))
                        connection.execute(text("SELECT pg_switch_wal()"))
                    connection.execute(text("CHECKPOINT"))
            with pytest.raises(SlotError, match=r"has wal_status 'lost'.*max_slot_wal_keep_size"):
                slot.health()
        finally:
            slot.close()
            engine.dispose()


def test_the_current_wal_position_is_at_or_past_every_commit_end(slot, table, database):
    before = slot.current_wal_lsn()
    write(database, f"INSERT INTO {table} VALUES (1, 'a', NULL)")
    (inserted,) = read(slot)
    assert before < inserted.end_lsn <= slot.current_wal_lsn()


@pytest.fixture
def held(logical_server, slot, database):
    """The slot in use by a streaming replication session, as a second query would hold it."""
    connection = psycopg2.connect(
        logical_server.url, connection_factory=psycopg2.extras.LogicalReplicationConnection
    )
    connection.cursor().start_replication(
        slot_name=slot.slot,
        options={"proto_version": "1", "publication_names": slot.publication},
    )
    yield connection
    connection.close()
    # The server's walsender lets go of the slot a moment after its client is gone: the
    # slot fixture drops it only then.
    with database.connect() as session:
        deadline = time.monotonic() + 30
        while session.execute(ACTIVE, {"slot": slot.slot}).scalar():
            assert time.monotonic() < deadline, f"slot {slot.slot} still active"
            time.sleep(0.05)


ACTIVE = text("SELECT active FROM pg_replication_slots WHERE slot_name = :slot")


def test_a_slot_another_session_holds_is_refused_by_name_once_the_wait_is_over(
    slot, held, monkeypatch
):
    monkeypatch.setattr(slot_module, "BUSY_WAIT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(SlotError, match=f"slot '{slot.slot}' .* in use by another session"):
        slot.peek()
    assert 0.5 <= time.monotonic() - started < 5


def test_a_slot_let_go_while_waiting_is_then_read(slot, held, table, database):
    with database.begin() as connection:
        connection.execute(text(f"INSERT INTO {table} VALUES (1, 'a', NULL)"))
    threading.Timer(0.5, held.close).start()
    started = time.monotonic()
    messages = [decode(row.data) for row in slot.peek()]
    assert time.monotonic() - started >= 0.4  # it waited for the holder
    assert isinstance(messages[0], Begin) and isinstance(messages[-1], Commit)


# --- the publication ----------------------------------------------------------------------


@pytest.mark.every_release
@pytest.mark.parametrize(
    ("publication", "message"),
    [
        ("CREATE PUBLICATION {pub} FOR TABLE {other}", r"does not publish table {table}"),
        (
            "CREATE PUBLICATION {pub} FOR TABLE {table} WITH (publish = 'insert')",
            r"does not publish update, delete, truncate, so those changes",
        ),
        (
            "CREATE PUBLICATION {pub} FOR TABLE {table} WHERE (id > 10)",
            r"filters the rows of {table} \(WHERE \(id > 10\)\)",
        ),
        (
            "CREATE PUBLICATION {pub} FOR TABLE {table} (id, name)",
            r"publishes only the columns \['id', 'name'\] of {table}, not all of "
            r"\['id', 'name', 'notes'\]",
        ),
    ],
)
def test_a_publication_that_would_not_carry_every_change_is_refused_by_name(
    logical_server, table, database, publication, message
):
    """Only the publication's existence was checked: a leftover publication of the same name
    (another table's), publish = 'insert', a row filter or a column list each gave an empty
    or partial changelog without a word."""
    other = f"{table}_other"
    pub = f"pub_{table}"
    engine = autocommit(logical_server.url)
    with engine.connect() as connection:
        connection.execute(text(f"CREATE TABLE {other} (id int PRIMARY KEY)"))
        connection.execute(text(publication.format(pub=pub, table=table, other=other)))
    slot = ReplicationSlot(logical_server.url, f"slot_{table}", pub, table)
    try:
        with pytest.raises(
            SlotError, match=f"publication '{pub}' .*" + message.format(table=table)
        ):
            slot.ensure()
        with pytest.raises(SlotError, match=message.format(table=table)):
            slot.check_publication()
    finally:
        slot.drop()
        slot.close()
        engine.dispose()


def test_a_publication_for_all_tables_carries_the_table(logical_server, table):
    pub = f"pub_{table}"
    engine = autocommit(logical_server.url)
    with engine.connect() as connection:
        connection.execute(text(f"CREATE PUBLICATION {pub} FOR ALL TABLES"))
    slot = ReplicationSlot(logical_server.url, f"slot_{table}", pub, table)
    try:
        slot.ensure()
        slot.check_publication()
    finally:
        slot.drop()
        slot.close()
        engine.dispose()


def test_a_table_with_a_colon_in_its_name_is_published_and_its_changes_read(
    logical_server, database
):
    """The publication's statement goes through ``text()``, which takes ``:word`` for a
    bound parameter, inside quotes too."""
    with database.begin() as connection:
        connection.exec_driver_sql('CREATE TABLE "cost :eur" (id int PRIMARY KEY, a int)')
    slot = ReplicationSlot(logical_server.url, "slot_colon", "pub_colon", '"cost :eur"')
    try:
        slot.ensure()
        slot.check_publication()
        with database.begin() as connection:
            connection.exec_driver_sql('INSERT INTO "cost :eur" VALUES (1, 2)')
        [transaction] = read(slot)
        assert rows_of(transaction) == [("insert", {"id": "1", "a": "2"}, None)]
    finally:
        slot.drop()
        slot.close()


def test_a_publication_dropped_under_a_kept_slot_is_named(slot, database):
    with database.begin() as connection:
        connection.execute(text(f"DROP PUBLICATION {slot.publication}"))
    with pytest.raises(SlotError, match=f"no publication '{slot.publication}'"):
        slot.check_publication()


# --- streamed peeks, server-side counts, heartbeats -----------------------------------------


def test_a_streamed_peek_returns_what_a_peek_returns(slot, table, database, monkeypatch):
    monkeypatch.setattr("spark_jobs.sources.cdc.slot.STREAM_ROWS", 3)
    write(database, *(f"INSERT INTO {table} VALUES ({i}, 'n', NULL)" for i in range(10)))
    write(database, f"UPDATE {table} SET name = 'm'")
    assert list(slot.stream()) == slot.peek()
    ends = [t.end_lsn for t in read(slot)]
    assert list(slot.stream(upto_lsn=ends[0])) == slot.peek(upto_lsn=ends[0])


def test_the_summary_counts_changes_per_transaction_on_the_server(slot, table, database):
    start = slot.confirmed_flush_lsn()
    write(database, *(f"INSERT INTO {table} VALUES ({i}, 'n', NULL)" for i in range(3)))
    write(database, f"UPDATE {table} SET name = 'm' WHERE id < 2")
    write(database, f"DELETE FROM {table} WHERE id = 0")
    first, second, third = (t.end_lsn for t in read(slot))
    assert slot.summary(start, None, None).end == third
    assert slot.summary(start, 5, None) == BatchSummary(len(slot.peek()), second, 5, 0, 1)
    # The first transaction always fits, however large.
    assert slot.summary(start, 1, None).end == first
    assert slot.summary(second, 1, None) == BatchSummary(len(slot.peek()), third, 1, 0, 0)
    assert slot.summary(third, None, None).end is None


def test_the_summary_counts_the_updates_that_move_rows_to_new_keys(slot, table, database):
    start = slot.confirmed_flush_lsn()
    write(database, *(f"INSERT INTO {table} VALUES ({i}, 'n', NULL)" for i in range(3)))
    moves, names = f"UPDATE {table} SET id = id + 10 WHERE id < 2", f"UPDATE {table} SET name = 'm'"
    write(database, moves, names)
    first = next(t.end_lsn for t in read(slot))
    assert slot.summary(start, None, None).moves == 2
    assert slot.summary(start, None, None).changes == 3 + 2 + 3
    assert slot.summary(first, None, None).moves == 2
    assert slot.summary(start, 3, None).moves == 0


def test_a_heartbeat_is_a_position_of_its_own_and_another_slots_is_not(
    logical_server, slot, table, database
):
    """A transaction of this slot's heartbeat may end a batch although it changes no row;
    another job's heartbeat (or high watermark) is taken only along with changes."""
    start = slot.confirmed_flush_lsn()
    other = ReplicationSlot(logical_server.url, "slot_elsewhere", slot.publication, table)
    other.heartbeat()
    assert slot.summary(start, None, None).end is None
    slot.heartbeat()
    (beat,) = [t for t in read(slot)][-1:]
    assert beat.changes == () and slot.summary(start, None, None).end == beat.end_lsn
    other.close()


def test_health_says_what_the_slot_keeps(slot, table, database):
    health = slot.health()
    assert health.wal_status == "reserved" and health.unbounded
    assert health.max_slot_wal_keep_size == "-1"
    write(database, f"INSERT INTO {table} SELECT g, 'n', NULL FROM generate_series(1, 2000) g")
    later = slot.health()
    assert later.retained_wal_bytes > health.retained_wal_bytes + 50_000
    assert later.trailing_wal_bytes > 50_000


def test_a_slot_made_while_a_prepared_transaction_waits_says_what_it_waits_for(tmp_path, caplog):
    """Creating a slot waits for every transaction in progress, a prepared one for as long
    as it stays prepared: the first start looked hung without a word."""
    settings = {**LOGICAL_DECODING, "max_prepared_transactions": "2"}
    with PostgresServer(database="shop", settings=settings) as server:
        engine = make_engine(server.url)
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (id int PRIMARY KEY)"))
        with engine.connect() as connection:
            connection.execute(text("BEGIN"))
            connection.execute(text("INSERT INTO t VALUES (1)"))
            connection.execute(text("PREPARE TRANSACTION 'held by an app'"))
            connection.commit()
        slot = ReplicationSlot(server.url, "waiting", "waiting", "t")
        made = threading.Thread(target=slot.ensure)
        made.start()
        deadline = time.monotonic() + 10
        while "waits for 1 prepared transaction" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        assert "'held by an app'" in caplog.text and made.is_alive()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("COMMIT PREPARED 'held by an app'"))
        made.join(30)
        assert slot.confirmed_flush_lsn() > 0
        slot.drop()
        slot.close()
        engine.dispose()
