"""Describing a table for a chunked snapshot, and reading its rows, against a real PostgreSQL."""

import json
import logging
import re
import threading
import time

import pytest
import sqlalchemy
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.changes import ChangeStreamError
from spark_jobs.sources.cdc.connection import describe
from spark_jobs.sources.cdc.describe import byte_order_advice, describe_table, key_order
from spark_jobs.sources.cdc.table import SUPPORTED, Key, TableColumn, TableError, TableShape
from spark_jobs.storage.databases import is_outage
from tests.spark_jobs.sources.cdc.conftest import non_c_collation
from tests.support.cdc_types import OUTPUT_SETTINGS, TYPE_COLUMNS, create_types_table, literal

#: On each PostgreSQL release the source supports: the catalogs and decoding differ.
pytestmark = pytest.mark.every_release


def create(database, *statements: str) -> None:
    with database.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))


def test_columns_in_order_and_a_composite_key_in_the_keys_order(database):
    create(
        database,
        'CREATE TABLE described (region text COLLATE "C", note varchar(20), '
        "day date, id bigint, PRIMARY KEY (day, id, region))",
        "ALTER TABLE described DROP COLUMN note",
    )
    shape = describe_table(database, "described")
    assert shape.name == "public.described"
    assert shape.columns == (
        TableColumn("region", "region", 25, "text", collation='pg_catalog."C"'),
        TableColumn("day", "day", 1082, "date"),
        TableColumn("id", "id", 20, "bigint"),
    )
    assert shape.key == ("day", "id", "region")


def test_names_are_taken_as_written_and_quoted_where_needed(database):
    create(database, 'CREATE TABLE "Orders" ("Id" int PRIMARY KEY, "the note" text)')
    shape = describe_table(database, "public.Orders")
    assert shape.name == 'public."Orders"'
    assert [c.sql for c in shape.columns] == ['"Id"', '"the note"']
    with pytest.raises(TableError, match="no table 'orders'"):
        describe_table(database, "orders")


def test_a_missing_table_is_named_without_the_password(logical_server):
    url = logical_server.url.replace("postgres@", "postgres:s3cret-pw@")
    engine = make_engine(url)
    try:
        with pytest.raises(TableError, match=r"no table 'nowhere' on .*postgres:\*+@") as error:
            describe_table(engine, "nowhere")
    finally:
        engine.dispose()
    assert "s3cret-pw" not in str(error.value)


def test_a_view_is_refused(database):
    create(database, "CREATE VIEW a_view AS SELECT 1 AS id")
    with pytest.raises(TableError, match=r"public\.a_view is not a table"):
        describe_table(database, "a_view")


def test_a_table_without_a_primary_key_is_refused(database):
    create(database, "CREATE TABLE keyless (id int UNIQUE NOT NULL, name text)")
    with pytest.raises(TableError, match=r"public\.keyless has no primary key.*needs one"):
        describe_table(database, "keyless")


@pytest.mark.parametrize(
    ("identity", "refused"),
    [
        ("DEFAULT", None),
        ("FULL", None),
        ("USING INDEX identified_pkey", None),
        ("USING INDEX identified_code_key", "USING INDEX identified_code_key"),
        ("NOTHING", "NOTHING"),
    ],
)
def test_changes_must_name_the_primary_key(database, identity, refused):
    create(
        database,
        "CREATE TABLE identified (id int PRIMARY KEY, code int NOT NULL UNIQUE)",
        f"ALTER TABLE identified REPLICA IDENTITY {identity}",
    )
    try:
        if refused is None:
            assert describe_table(database, "identified").key == ("id",)
        else:
            with pytest.raises(TableError, match=f"REPLICA IDENTITY {refused}: its updates"):
                describe_table(database, "identified")
    finally:
        create(database, "DROP TABLE identified")


@pytest.mark.parametrize(
    "column",
    [
        "id int2",
        "id int4",
        "id int8",
        "id numeric(10, 2)",
        "id uuid",
        "id date",
        "id timestamp",
        "id timestamptz",
        'id text COLLATE "C"',
        'id varchar(10) COLLATE "POSIX"',
        'id char(3) COLLATE "C"',
        # The test servers' databases are created with locale C: the default resolves to it.
        "id text",
    ],
)
def test_chunkable_keys_are_allowed(database, column):
    create(database, f"CREATE TABLE allowed ({column} PRIMARY KEY)")
    try:
        assert describe_table(database, "allowed").key == ("id",)
    finally:
        create(database, "DROP TABLE allowed")


@pytest.mark.parametrize(
    ("column", "type_name"),
    [("id bool", "boolean"), ("id float8", "double precision")],
)
def test_a_key_type_without_a_chunkable_order_is_refused(database, column, type_name):
    create(database, f"CREATE TABLE refused ({column} PRIMARY KEY)")
    try:
        expected = rf"column 'id' is {re.escape(type_name)}, .*must be int8"
        with pytest.raises(TableError, match=expected):
            describe_table(database, "refused")
    finally:
        create(database, "DROP TABLE refused")


def sorts(database, shape) -> bool:
    """Whether the server sorts the table to read it in chunk order, even when told to
    prefer any index: whether no index serves that order."""
    with database.connect() as connection:
        connection.execute(text("SET enable_seqscan = off"))
        plan = connection.execute(
            text(f"EXPLAIN SELECT * FROM {shape.name} ORDER BY {key_order(shape)} LIMIT 10")
        ).scalars()
        return any("Sort" in line for line in plan)


def test_only_a_btree_index_in_the_key_s_byte_order_serves_its_chunks(database):
    """A key under a language collation is compared in byte order ("C"), which its own key
    index cannot serve: the source names the index that would, until there is one. A hash
    index, another direction, a partial index, part of the key or an INCLUDE index that
    covered nothing (its collations list only its key columns) do not serve it."""
    collation = non_c_collation(database)
    create(
        database,
        f'CREATE TABLE worded (id int, word text COLLATE "{collation}", note text, '
        "PRIMARY KEY (word, id))",
    )
    shape = describe_table(database, "worded")
    advice = (
        "chunks of public.worded are read in key order with text compared in byte order, "
        "which no index of the table serves, so each chunk's read sorts the table; for a large "
        "table, create one: CREATE INDEX CONCURRENTLY ON public.worded "
        '(word COLLATE pg_catalog."C", id)'
    )
    assert byte_order_advice(database, shape) == advice and sorts(database, shape)
    for useless in (
        'CREATE INDEX ON worded USING hash ((word COLLATE "C"))',
        'CREATE INDEX ON worded (word COLLATE "C", id DESC)',
        'CREATE INDEX ON worded (word COLLATE "C", id) WHERE id > 0',
        "CREATE INDEX ON worded (id) INCLUDE (note)",
        'CREATE INDEX ON worded (word COLLATE "C")',
    ):
        create(database, useless)
        assert byte_order_advice(database, shape) == advice, useless
    create(database, 'CREATE INDEX ON worded (word COLLATE "C" DESC, id DESC) INCLUDE (note)')
    assert byte_order_advice(database, shape) is None and not sorts(database, shape)


def test_keys_whose_own_collation_orders_by_bytes_keep_their_key_index(database):
    """Declared "C" or "POSIX", or under a database default of C (the test servers'), a
    key is compared under its own collation, so its key index serves the chunks; a
    partitioned table's advice makes its index without CONCURRENTLY, which it refuses."""
    collation = non_c_collation(database)
    create(
        database,
        'CREATE TABLE coded (code char(3) COLLATE "C", day date, PRIMARY KEY (code, day))',
        "CREATE TABLE dated (day date PRIMARY KEY, note text)",
        'CREATE TABLE posix (word text COLLATE "POSIX", n int, PRIMARY KEY (word))',
        "CREATE TABLE plain (word text PRIMARY KEY)",
        f'CREATE TABLE parted (word text COLLATE "{collation}" PRIMARY KEY) '
        "PARTITION BY HASH (word)",
        "CREATE TABLE parted_0 PARTITION OF parted FOR VALUES WITH (MODULUS 1, REMAINDER 0)",
    )
    for table in ("coded", "dated", "posix", "plain"):
        shape = describe_table(database, table)
        assert byte_order_advice(database, shape) is None, table
        assert not sorts(database, shape), table
    advice = byte_order_advice(database, describe_table(database, "parted")) or ""
    assert advice.endswith('CREATE INDEX ON public.parted (word COLLATE pg_catalog."C")')
    create(database, advice.split(": ", 1)[1])
    assert byte_order_advice(database, describe_table(database, "parted")) is None


def test_a_generated_column_reads_the_columns_its_expression_names(database):
    """Not itself too: its default's dependency on its own column was counted, so a value
    whose inputs were all left unsent never stood and every such update read its row again."""
    create(
        database,
        "CREATE TABLE measured (id int PRIMARY KEY, body text, title text, "
        "body_length int GENERATED ALWAYS AS (length(body)) STORED, "
        "headline text GENERATED ALWAYS AS (title || left(body, 3)) STORED)",
    )
    found = {c.name: c.generated_from for c in describe_table(database, "measured").columns}
    assert (found["body_length"], found["headline"]) == (("body",), ("body", "title"))


def test_a_generated_column_that_reads_tableoid_is_refused(database):
    create(
        database,
        "CREATE TABLE located (id int PRIMARY KEY, "
        "place bigint GENERATED ALWAYS AS (tableoid::bigint) STORED)",
    )
    with pytest.raises(
        TableError,
        match=r"table public.located: generated column 'place' reads tableoid, which no change "
        r"carries",
    ):
        describe_table(database, "located")


def test_a_partition_that_generates_a_column_otherwise_is_refused(database):
    """From PostgreSQL 17 a partition may compute a generated column by its own expression:
    its rows hold the partition's values, and a change computed by the table's would not."""
    create(
        database,
        "CREATE TABLE tripled (id int PRIMARY KEY, a int, "
        "g int GENERATED ALWAYS AS (a * 2) STORED) PARTITION BY RANGE (id)",
        "CREATE TABLE tripled_low (id int NOT NULL, a int, "
        "g int GENERATED ALWAYS AS (a * 3) STORED)",
    )
    try:
        create(
            database, "ALTER TABLE tripled ATTACH PARTITION tripled_low FOR VALUES FROM (0) TO (10)"
        )
    except sqlalchemy.exc.DBAPIError:
        pytest.skip("before PostgreSQL 17 a partition takes its table's expression")
    with pytest.raises(
        TableError,
        match=r"table public.tripled: partition public.tripled_low computes generated column "
        r"'g' by another expression",
    ):
        describe_table(database, "tripled")


#: Sessions waiting for a lock on a table whose name starts so; pg_locks is read live, where
#: pg_stat_activity would show what it showed at the transaction's first look.
_WAITING_ON = text(
    "SELECT l.pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
    "WHERE NOT l.granted AND c.relname LIKE :prefix"
)


def waiting_on(engine, prefix: str, timeout_s: float = 20.0) -> list[int]:
    """The pids waiting for a lock of a ``prefix*`` table, once one waits; [] at the timeout."""
    deadline = time.monotonic() + timeout_s
    with engine.connect() as watch:
        while time.monotonic() < deadline:
            pids = watch.execute(_WAITING_ON, {"prefix": f"{prefix}%"}).scalars().all()
            if pids:
                return list(pids)
            time.sleep(0.02)
    return []


def test_an_alter_of_a_partitioned_table_while_it_is_described_waits_for_the_read(
    logical_server, database
):
    """ALTER TABLE locks a partitioned table, then its partitions. The read of its partitions
    (seen by the seeded CDC trial 936144273) locked them first and the table after: an ALTER
    let in between the two deadlocked, and PostgreSQL ended the read, and the copy with it."""
    create(
        database,
        "CREATE TABLE halved (id int PRIMARY KEY, a int, b int, "
        "g int GENERATED ALWAYS AS (a * 2) STORED) PARTITION BY RANGE (id)",
        "CREATE TABLE halved_low PARTITION OF halved FOR VALUES FROM (0) TO (10)",
    )
    other = make_engine(logical_server.url)
    failures: list[BaseException] = []
    waited: list[int] = []

    def alter() -> None:
        try:
            with other.begin() as connection:
                connection.execute(text("ALTER TABLE halved ALTER COLUMN b TYPE bigint"))
        except BaseException as error:
            failures.append(error)

    altering = threading.Thread(target=alter)

    def let_the_alter_in(connection, cursor, statement, *rest) -> None:
        if "pg_partition_tree" not in statement or altering.ident is not None:
            return
        altering.start()  # once the partitions are read: it waits on a lock of the read's
        waited.extend(waiting_on(other, "halved"))

    sqlalchemy.event.listen(database, "after_cursor_execute", let_the_alter_in)
    try:
        shape = describe_table(database, "halved")
    finally:
        sqlalchemy.event.remove(database, "after_cursor_execute", let_the_alter_in)
        altering.join(timeout=30)
        other.dispose()
    assert waited, "the ALTER never waited for the read"
    assert not altering.is_alive() and not failures, failures
    # The read saw the table before the ALTER, whole; the ALTER then went through.
    assert {c.name: c.type_name for c in shape.columns}["b"] == "integer"
    assert {c.name: c.type_name for c in describe_table(database, "halved").columns}["b"] == (
        "bigint"
    )


def held_exclusively(engine, table: str) -> tuple[threading.Event, threading.Thread]:
    """A transaction that holds ``table`` in ACCESS EXCLUSIVE mode (as a DDL statement left
    open does) until the event is set."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.begin() as connection:
            connection.execute(text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            locked.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(20)
    return release, holder


def test_an_ordinary_table_is_described_while_another_session_holds_it_exclusively(
    logical_server, database
):
    """Reading an ordinary table's catalog waits for no lock: a plan checks its shape at
    every batch, and must not stop behind a user's open DDL or a VACUUM FULL."""
    create(database, "CREATE TABLE busy (id int PRIMARY KEY, note text)")
    other = make_engine(logical_server.url)
    release, holder = held_exclusively(other, "busy")
    described: list[TableShape] = []
    reading = threading.Thread(target=lambda: described.append(describe_table(database, "busy")))
    try:
        reading.start()
        reading.join(timeout=10)
        assert described, "describe waited for the lock of an ordinary table"
    finally:
        release.set()
        holder.join()
        reading.join()
        other.dispose()
    assert [c.name for c in described[0].columns] == ["id", "note"]


def test_a_server_that_goes_away_while_describe_waits_for_the_lock_is_an_outage(
    logical_server, database
):
    """The source rides out an outage (``is_outage``) and fails on anything else; a
    connection cut while the lock is awaited is an outage, not a driver's internal state."""
    create(
        database,
        "CREATE TABLE cut (id int PRIMARY KEY, a int) PARTITION BY RANGE (id)",
        "CREATE TABLE cut_low PARTITION OF cut FOR VALUES FROM (0) TO (10)",
    )
    other = make_engine(logical_server.url)
    release, holder = held_exclusively(other, "cut")
    errors: list[BaseException] = []

    def read() -> None:
        try:
            describe_table(database, "cut")
        except BaseException as error:
            errors.append(error)

    reading = threading.Thread(target=read)
    try:
        reading.start()
        [pid] = waiting_on(other, "cut")
        with other.connect() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        reading.join(timeout=20)
    finally:
        release.set()
        holder.join()
        reading.join()
        other.dispose()
    [error] = errors
    assert is_outage(error), repr(error)


def test_a_role_that_may_read_the_columns_but_not_lock_the_table_describes_it(
    logical_server, database
):
    """Column privileges let a role read every column but not LOCK the table: its shape is
    read unlocked, as before the lock existed, rather than refused."""
    create(
        database,
        "CREATE TABLE granted (id int PRIMARY KEY, a int) PARTITION BY RANGE (id)",
        "CREATE TABLE granted_low PARTITION OF granted FOR VALUES FROM (0) TO (10)",
        "DROP ROLE IF EXISTS column_reader",
        "CREATE ROLE column_reader LOGIN",
        "GRANT SELECT (id, a) ON granted TO column_reader",
    )
    url = sqlalchemy.make_url(logical_server.url).set(username="column_reader")
    reader = make_engine(url.render_as_string(hide_password=False))
    try:
        shape = describe_table(reader, "granted")
    finally:
        reader.dispose()
    assert [c.name for c in shape.columns] == ["id", "a"]


def test_a_partitioned_table_with_a_colon_in_its_name_is_described(database):
    """SQLAlchemy's ``text()`` takes ``:word`` for a bound parameter, inside quotes too."""
    with database.begin() as connection:
        connection.exec_driver_sql(
            'CREATE TABLE "cost :eur" (id int PRIMARY KEY, a int) PARTITION BY RANGE (id)'
        )
        connection.exec_driver_sql(
            'CREATE TABLE "cost :eur low" PARTITION OF "cost :eur" FOR VALUES FROM (0) TO (10)'
        )
    shape = describe_table(database, '"cost :eur"')
    assert shape.name == 'public."cost :eur"'
    assert [c.name for c in shape.columns] == ["id", "a"]


def test_a_text_key_under_a_nondeterministic_collation_is_refused(database):
    with database.connect() as connection:
        icu = connection.execute(
            text("SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu'")
        ).scalar()
    if icu is None:
        pytest.skip("the server has no ICU")
    create(
        database,
        "CREATE COLLATION IF NOT EXISTS folded "
        "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
        "CREATE TABLE folded_keys (word text COLLATE folded PRIMARY KEY)",
    )
    with pytest.raises(
        TableError,
        match=r"column 'word' is text with collation 'folded', which is nondeterministic: it "
        r"makes keys equal whose bytes differ; .*under a deterministic collation in a database "
        r"encoded in UTF8",
    ):
        describe_table(database, "folded_keys")


def test_a_database_whose_default_collation_is_not_c_takes_text_keys_and_names_the_index(
    logical_server, database, caplog
):
    """What most users have: en_US.UTF-8 (or ICU) as the database's default. The source
    takes the table, and warns when it starts that every chunk's read will sort it."""
    collation = non_c_collation(database)
    locale = (
        "LOCALE_PROVIDER icu ICU_LOCALE 'und'"
        if collation == "und-x-icu"
        else f"LC_COLLATE '{collation}' LC_CTYPE '{collation}'"
    )
    with database.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(text(f"CREATE DATABASE worded TEMPLATE template0 {locale}"))
    url = logical_server.url.rsplit("/", 1)[0] + "/worded"
    engine = make_engine(url)
    try:
        create(engine, "CREATE TABLE words (word text PRIMARY KEY)")
        with caplog.at_level(logging.WARNING, logger="spark_jobs.sources.cdc.connection"):
            assert describe("cdc", url, "words").key == ("word",)
        assert caplog.messages == [
            f"child source 'cdc': {byte_order_advice(engine, describe_table(engine, 'words'))}"
        ]
        assert caplog.messages[0].endswith(
            'CREATE INDEX CONCURRENTLY ON public.words (word COLLATE pg_catalog."C")'
        )
    finally:
        engine.dispose()


def rows_of(database, shape: TableShape, after: Key | None = None) -> list[dict]:
    """The table's rows after ``after`` in key order, every value cast to text, bound with
    the key's JSON form as a snapshot chunk binds it."""
    params = {f"k{i}": v for i, v in enumerate(shape.json_key(after) or ())}
    keys = ", ".join(f"t.{c.sql}" for c in shape.key_columns)
    bounds = ", ".join(f"CAST(:k{i} AS {c.type_name})" for i, c in enumerate(shape.key_columns))
    where = f"WHERE ({keys}) > ({bounds}) " if after is not None else ""
    query = (
        f"SELECT {', '.join(f't.{c.sql}::text' for c in shape.columns)} FROM {shape.name} t "
        f"{where}ORDER BY {keys} LIMIT 1000"
    )
    with database.connect() as connection:
        for setting in OUTPUT_SETTINGS:
            connection.execute(text(setting))
        found = connection.execute(text(query), params).all()
    return [shape.typed_row(values) for values in found]


def test_a_boolean_column_reads_from_its_output_and_from_its_cast_to_text(database):
    create(database, "CREATE TABLE flags (id int PRIMARY KEY, ok bool)")
    create(database, "INSERT INTO flags VALUES (1, true), (2, false), (3, NULL)")
    shape = describe_table(database, "flags")
    assert [row["ok"] for row in rows_of(database, shape)] == [True, False, None]  # 'true'
    assert shape.typed_row(("1", "t")) == {"id": 1, "ok": True}  # bool's output function


def test_an_unreadable_value_names_the_table_the_column_and_the_key(database):
    create(
        database,
        'CREATE TABLE far (id int, day date, "at" timestamp, PRIMARY KEY (id, day))',
        "INSERT INTO far VALUES (7, '2024-02-29', '294250-01-01 00:00:00')",
    )
    shape = describe_table(database, "far")
    expected = (
        "table public.far, row with key (id, day)=(7, 2024-02-29): cannot read column 'at' = "
        "'294250-01-01 00:00:00' as timestamp without time zone: outside "
        "290309-12-21 19:59:05.224193 BC to 294247-01-10 04:00:54.775806 UTC"
    )
    with pytest.raises(ValueError) as error:
        rows_of(database, shape)
    assert str(error.value).startswith(expected)
    with pytest.raises(ValueError) as error:
        shape.typed_change({"id": "7", "day": "2024-02-29", "at": "294250-01-01 00:00:00"})
    assert str(error.value).startswith(expected)


def test_numeric_values_stay_exactly_the_servers_text(database):
    create(
        database,
        "CREATE TABLE amounts (id int PRIMARY KEY, amount numeric)",
        "INSERT INTO amounts VALUES (1, 0.0000001), (2, 'NaN'), (3, 1.500), (4, '-Infinity')",
    )
    shape = describe_table(database, "amounts")
    arrays = shape.arrow_columns(rows_of(database, shape))
    assert arrays["amount"].to_pylist() == ["0.0000001", "NaN", "1.500", "-Infinity"]


@pytest.mark.parametrize(
    ("key_type", "values"),
    [
        (
            "numeric",
            ["NaN", "Infinity", "-Infinity", "0.0000001", "1e-20", "9" * 1000, "-1.5", "2.50"],
        ),
        ("date", ["infinity", "-infinity", "4714-11-24 BC", "0044-03-15 BC", "10000-01-01"]),
        (
            "timestamp",
            ["infinity", "-infinity", "0044-03-15 12:00:00.5 BC", "1969-12-31 23:59:59.999999"],
        ),
        (
            "timestamptz",
            ["infinity", "-infinity", "4714-11-24 00:00:00+00 BC", "2024-02-29 13:05:07+05:30"],
        ),
        ("uuid", ["ffffffff-ffff-ffff-ffff-ffffffffffff", "00000000-0000-0000-0000-00000000000a"]),
        ('text COLLATE "C"', ["é", "z", "", "Z", "😀", "\uff5a"]),
        ("bigint", [str(-(2**63)), str(2**63 - 1), "0"]),
    ],
)
def test_keys_order_as_on_the_server_and_resume_from_their_json(database, key_type, values):
    """The typed keys sort as the server sorts them, and each key's JSON form, bound as the
    chunk query's bound, resumes right after it."""
    create(database, f"CREATE TABLE keyed (k {key_type} PRIMARY KEY, i int)")
    try:
        literals = ", ".join(f"({literal(v)}, {i})" for i, v in enumerate(values))
        create(database, f"INSERT INTO keyed VALUES {literals}")
        shape = describe_table(database, "keyed")
        rows = rows_of(database, shape)
        keys = [shape.key_of(row) for row in rows]
        assert keys == sorted(keys) and len(set(keys)) == len(values)
        with database.connect() as connection:
            in_order = connection.execute(text("SELECT i FROM keyed ORDER BY k")).scalars().all()
        assert [row["i"] for row in rows] == in_order
        for place, key in enumerate(keys):
            stored = json.loads(json.dumps(shape.json_key(key)))
            assert shape.typed_key(stored) == key
            assert [shape.key_of(r) for r in rows_of(database, shape, key)] == keys[place + 1 :]
    finally:
        create(database, "DROP TABLE keyed")


def test_a_text_key_in_a_database_not_encoded_in_utf8_is_refused(logical_server, database):
    with database.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(
            text(
                "CREATE DATABASE latin TEMPLATE template0 ENCODING 'LATIN1' "
                "LC_COLLATE 'C' LC_CTYPE 'C'"
            )
        )
    engine = make_engine(logical_server.url.rsplit("/", 1)[0] + "/latin")
    try:
        create(engine, 'CREATE TABLE words (word text COLLATE "C" PRIMARY KEY)')
        with pytest.raises(
            TableError,
            match=r"column 'word' is text, whose chunks are read in byte order, but the "
            r"database is encoded in LATIN1, .*in a database encoded in UTF8",
        ):
            describe_table(engine, "words")
        create(engine, "CREATE TABLE numbered (id int PRIMARY KEY, word text)")
        assert describe_table(engine, "numbered").key == ("id",)
    finally:
        engine.dispose()


def test_a_table_of_every_supported_type_is_described_with_how_each_is_read(
    logical_server, database
):
    create_types_table(logical_server.url, "every_type")
    shape = describe_table(database, "every_type")
    assert [c.name for c in shape.columns] == ["id", *(c.name for c in TYPE_COLUMNS)]
    kinds = {c.name: c.kind.name for c in shape.columns}
    assert kinds['Order "Total"'] == "numeric"
    assert kinds["ints"] == kinds["moods"] == kinds["mood"] == kinds["codes"] == "text"
    assert (kinds["positive"], kinds["deadline"]) == ("int4", "date")
    by_name = {c.name: c for c in shape.columns}
    assert by_name["positive"].type_name == "cdc_positive"
    assert by_name["positive"].base_oid == 23 and by_name["int"].base_oid is None


@pytest.mark.parametrize(
    ("column_type", "shown"),
    [
        ("money", "money"),
        ("point", "point"),
        ("box", "box"),
        ("int4range", "int4range"),
        ("int4multirange", "int4multirange"),
        ("tsvector", "tsvector"),
        ("tsquery", "tsquery"),
        ("bit(3)", "bit(3)"),
        ("varbit", "bit varying"),
        ("pg_lsn", "pg_lsn"),
        ("oid", "oid"),
        ("regclass", "regclass"),
        ("xid", "xid"),
        ("int2vector", "int2vector"),
        ("point[]", "point[]"),
        ("cdc_pair", "cdc_pair"),
        ("cdc_cash", "cdc_cash"),
        ("cdc_cash[]", "cdc_cash[]"),
    ],
)
def test_a_column_of_an_unsupported_type_is_refused_by_name(database, column_type, shown):
    create(
        database,
        "CREATE TYPE cdc_pair AS (a int, b text)",
        "CREATE DOMAIN cdc_cash AS money",
        f'CREATE TABLE odd (id int PRIMARY KEY, "the value" {column_type})',
    )
    try:
        with pytest.raises(TableError) as error:
            describe_table(database, "odd")
        assert str(error.value) == (
            f"table public.odd: column 'the value' is {shown}, which cannot be copied exactly; "
            f"a column must be {SUPPORTED}"
        )
        assert SUPPORTED.startswith("bool, bytea, int2, int4, int8, float4, float8, numeric, ")
    finally:
        create(database, "DROP TABLE odd", "DROP TYPE cdc_pair", "DROP DOMAIN cdc_cash")


def test_a_domain_key_is_chunked_as_its_base_type_and_array_or_enum_keys_are_refused(database):
    create(
        database,
        "CREATE DOMAIN cdc_id AS bigint",
        "CREATE TYPE cdc_size AS ENUM ('small', 'large')",
        "CREATE TABLE by_domain (id cdc_id PRIMARY KEY)",
        "CREATE TABLE by_array (id int[] PRIMARY KEY)",
        "CREATE TABLE by_enum (id cdc_size PRIMARY KEY)",
        "INSERT INTO by_domain VALUES (5), (-3)",
    )
    shape = describe_table(database, "by_domain")
    assert [row["id"] for row in rows_of(database, shape)] == [-3, 5]
    assert shape.json_key((5,)) == [5]
    for table, type_name in (("by_array", r"integer\[\]"), ("by_enum", "cdc_size")):
        with pytest.raises(
            TableError, match=f"column 'id' is {type_name}, which cannot be chunked"
        ):
            describe_table(database, table)


def test_a_change_with_a_column_the_table_was_not_described_with_is_refused(database):
    create(database, "CREATE TABLE narrow (id int PRIMARY KEY)")
    shape = describe_table(database, "narrow")
    assert shape.typed_change({"id": "1"}) == {"id": 1}
    with pytest.raises(ChangeStreamError, match=r"has columns \['added'\] it was not described"):
        shape.typed_change({"id": "1", "added": "x"})
