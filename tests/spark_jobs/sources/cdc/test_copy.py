"""The postgres-cdc source and the merge target together, batch by batch as Spark runs them
(``tests.support.cdc_copy``), against a real PostgreSQL source and a PostgreSQL or SQLite
target: cases where the copy differed from the table while the source reported it live."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc import snapshot
from spark_jobs.sources.cdc.child import PostgresCdcChild
from spark_jobs.sources.cdc.table import TableChangedError
from tests.spark_jobs.sources.cdc.conftest import BIG, non_c_collation
from tests.support.cdc_types import TYPE_COLUMNS, create_types_table
from tests.support.postgres import LOGICAL_DECODING, PostgresServer
from tools.faults.cdc_copy import CdcCopy

#: On each PostgreSQL release the source supports: the catalogs and decoding differ.
pytestmark = pytest.mark.every_release


@pytest.fixture
def copies(logical_server, target_url, tmp_path) -> Iterator:
    made: list[CdcCopy] = []

    def make(table: str, chunk_rows: int, **fields) -> CdcCopy:
        state = tmp_path / f"state-{len(made)}"
        made.append(CdcCopy(logical_server.url, table, target_url, state, chunk_rows, **fields))
        return made[-1]

    yield make
    for copy in made:
        copy.close()


def write(database, *statements: str) -> None:
    with database.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))


def catch_up(copy: CdcCopy, database, rows: int, *rounds: list[str], mid_snapshot=False) -> None:
    """The copy's first start, then each round of statements committed in one transaction and
    the copy brought live and idle after it, ``rows`` a batch; with ``mid_snapshot`` the first
    round lands after one snapshot batch, while chunks remain. Ends equal to the table."""
    copy.step()
    if mid_snapshot:
        assert copy.step(max_rows=rows)
    else:
        copy.until_live_and_idle(max_rows=rows)
    for statements in rounds:
        write(database, *statements)
        copy.until_live_and_idle(max_rows=rows)
    assert copy.differences() == []


def server_version(database) -> int:
    with database.connect() as connection:
        return int(connection.execute(text("SHOW server_version_num")).scalar_one())


def rows(url: str, table: str, columns: str = "id, name, notes") -> list[tuple]:
    query = f"SELECT {columns} FROM {table} ORDER BY 1"  # table: as SQL takes it
    if url.startswith("sqlite"):
        connection = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return [tuple(row) for row in connection.execute(query)]
        finally:
            connection.close()
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(query))]
    finally:
        engine.dispose()


def notes(key: int) -> str:
    """A value PostgreSQL stores out of line (TOASTed), different for each key."""
    return f"{key}:{BIG}"


def test_a_key_move_s_insert_never_takes_another_row_s_toasted_value(
    copies, database, table, logical_server, target_url
):
    """REPLICA IDENTITY DEFAULT: the move 15 -> 4 sends its insert without ``notes``. Key 4
    is in the copied chunk, key 15 in one not copied yet, so the move's delete is left to that
    chunk; the insert followed the delete of key 3 in the same transaction, and took key 3's
    notes."""
    ids = [1, 2, 3, 5, 6, *range(11, 17)]
    values = ", ".join(f"({i}, 'n{i}', '{notes(i)}')" for i in ids)
    write(database, f"INSERT INTO {table} VALUES {values}")
    copy = copies(table, chunk_rows=5)
    copy.step()  # the reader's first start: the slot
    assert copy.step(max_rows=5)  # chunk 0: keys 1..6
    assert copy.batches.logs.offsets[0]["position"]["chunks"] == 1
    write(database, f"DELETE FROM {table} WHERE id = 3; UPDATE {table} SET id = 4 WHERE id = 15")
    copy.until_live_and_idle(max_rows=5)

    source = rows(logical_server.url, table)
    assert [row[0] for row in source] == [1, 2, 4, 5, 6, 11, 12, 13, 14, 16]
    assert rows(target_url, copy.target_table) == source


@pytest.fixture
def waiting_server() -> Iterator[PostgresServer]:
    """A server whose synchronous commits wait for a standby that never answers: such a
    commit is written and flushed (so decoded) but stays invisible until its wait is
    cancelled. Other commits are local."""
    settings = {
        **LOGICAL_DECODING,
        "synchronous_commit": "local",
        "synchronous_standby_names": "nosuch",
    }
    with PostgresServer(database="shop", settings=settings) as server:
        yield server


class WaitingCommit(threading.Thread):
    """A transaction whose commit waits for the standby, until ``release``."""

    def __init__(self, url: str, statement: str):
        super().__init__(daemon=True)
        self.engine = make_engine(url)
        self.statement = statement
        self.pid: int | None = None
        self.waiting = threading.Event()

    def run(self) -> None:
        with self.engine.begin() as connection:
            connection.execute(text("SET LOCAL synchronous_commit = on"))
            self.pid = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            connection.execute(text(self.statement))
            self.waiting.set()

    def wait_until_decodable(self, admin) -> None:
        """Until the commit waits for the standby (its WAL is flushed by then)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with admin.connect() as connection:
                state = connection.execute(
                    text("SELECT wait_event FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": self.pid},
                ).scalar()
            if state == "SyncRep":
                return
            time.sleep(0.05)
        raise AssertionError("the commit never waited for the standby")

    def release(self, admin) -> None:
        with admin.connect() as connection:
            connection.execute(text("SELECT pg_cancel_backend(:pid)"), {"pid": self.pid})
        self.join(30)
        self.engine.dispose()


def test_a_commit_flushed_but_not_yet_visible_is_never_left_behind_the_slot(
    waiting_server, target_url, tmp_path
):
    """The commit of key 18 is decoded while it waits for the standby, invisible to every
    snapshot. Planned into a batch, its key left to a chunk not read yet, it would move the
    slot past it with Spark's commit; the chunk read meanwhile could not see it."""
    admin = make_engine(waiting_server.url)
    write(
        admin,
        "CREATE TABLE t (id int PRIMARY KEY, name text, notes text)",
        "INSERT INTO t SELECT g, 'n' || g, NULL FROM generate_series(1, 20) g",
    )
    copy = CdcCopy(waiting_server.url, "t", target_url, tmp_path / "state", chunk_rows=5)
    try:
        copy.step()
        assert copy.step(max_rows=5)  # chunk 0
        pending = WaitingCommit(waiting_server.url, "UPDATE t SET name = 'late' WHERE id = 18")
        pending.start()
        pending.wait_until_decodable(admin)
        assert copy.step(max_rows=5) and copy.step(max_rows=5)  # chunks 1, 2; the slot moves
        # The slot has not passed the commit: the chunk of key 18, read while the commit is
        # still invisible, gets it from the changes it peeks.
        assert copy.step(max_rows=5)
        pending.release(admin)
        copy.until_live_and_idle(max_rows=5)
        source = rows(waiting_server.url, "t")
        assert source[17] == (18, "late", None)
        assert rows(target_url, copy.target_table) == source
    finally:
        copy.close()
        admin.dispose()


def insert_rows(database, table: str, ids) -> None:
    values = ", ".join(f"({i}, 'n{i}', '{notes(i)}')" for i in ids)
    write(database, f"INSERT INTO {table} VALUES {values}")


def short_rows(url: str, table: str) -> list[tuple]:
    """Rows with their notes cut to the key they were written for: a diff stays legible."""
    return rows(url, table, "id, name, substr(notes, 1, 8), length(notes)")


@pytest.mark.parametrize(
    "statements",
    [
        # Moved twice in one transaction: 15 -> 4 -> 7, then 7's name changed.
        ["UPDATE {t} SET id = 4 WHERE id = 15", "UPDATE {t} SET id = 7 WHERE id = 4",
         "UPDATE {t} SET name = 'seven' WHERE id = 7"],
        # From one copied key to another: the delete half is in the batch.
        ["UPDATE {t} SET id = 9 WHERE id = 2"],
        # Moved away from and back onto a copied key, then deleted and inserted again.
        ["UPDATE {t} SET id = 100 WHERE id = 1", "UPDATE {t} SET id = 1 WHERE id = 100",
         "DELETE FROM {t} WHERE id = 5", "INSERT INTO {t} VALUES (5, 'again', 'short')"],
    ],
)  # fmt: skip
def test_rows_moved_to_copied_keys_arrive_whole_in_one_transaction_or_several(
    copies, database, table, logical_server, target_url, statements
):
    insert_rows(database, table, [1, 2, 3, 5, 6, *range(11, 17)])
    copy = copies(table, chunk_rows=5)
    copy.step()
    assert copy.step(max_rows=5)
    for together in (True, False):
        sql = [statement.format(t=table) for statement in statements]
        write(database, "; ".join(sql)) if together else write(database, *sql)
        copy.until_live_and_idle(max_rows=5)
        assert short_rows(target_url, copy.target_table) == short_rows(logical_server.url, table)
        # Read again, the moved rows are taken up to where the batch ends: live throughout.
        live_from = copy.phases.index(False)
        assert not any(copy.phases[live_from:]), copy.phases
        write(database, f"DELETE FROM {table}")
        insert_rows(database, table, [1, 2, 3, 5, 6, *range(11, 17)])


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_every_type_is_copied_through_either_driver(
    logical_server, postgres_server, tmp_path, driver
):
    """psycopg 3 beside psycopg2 crashed the first chunk (its cursors have no ``mogrify`` or
    ``copy_expert``): each driver, named in the URLs, copies the table of every type, its
    changes and a TOASTed value left alone by a key move, into PostgreSQL and SQLite."""
    source = logical_server.url.replace("postgresql://", f"postgresql+{driver}://")
    names = ", ".join(c.sql for c in TYPE_COLUMNS)
    targets = (
        postgres_server.url.replace("postgresql://", f"postgresql+{driver}://"),
        f"sqlite:///{tmp_path}/copy.db",
    )
    for number, target in enumerate(targets):
        table = f"every_type_{driver}_{number}"
        create_types_table(logical_server.url, table)
        copy = CdcCopy(source, table, target, tmp_path / f"state-{number}", chunk_rows=4)
        try:
            copy.step()
            copy.until_live_and_idle(max_rows=4)
            write(
                make_engine(logical_server.url),
                f"INSERT INTO {table} SELECT id + 100, {names} FROM {table} WHERE id < 100",
                f"UPDATE {table} SET id = 1000, \"note\" = 'moved' WHERE id = 1",
                f"DELETE FROM {table} WHERE id = 2",
            )
            copy.until_live_and_idle(max_rows=4)
            assert copy.batches.reader is not None
            assert copy.differences() == []
        finally:
            copy.close()


def test_a_table_whose_names_collide_with_the_change_columns_or_hold_dots_and_quotes(
    copies, database, target_url
):
    """Columns named as the change columns (``_op``...) made Spark refuse the schema
    ("Field _op exists 2 times"); a name with a dot could not be given; a ``char(n)`` key
    was refused. The change columns take one more underscore, the name is quoted as SQL
    quotes it, and char(n) keys order without their padding."""
    kind = target_url.split(":")[0]
    table = f'"Sales Team"."q1.2026 ""final"" {kind}"'
    write(
        database,
        'CREATE SCHEMA IF NOT EXISTS "Sales Team"',
        f'CREATE TABLE {table} (code char(3) COLLATE "C" PRIMARY KEY, '
        '"_op" text, "_lsn" bigint, "_seq" int, "_commit_time" timestamptz, '
        '"_unchanged" text, "my col" text)',
        f"INSERT INTO {table} SELECT chr(97 + i / 3) || "
        "CASE i % 3 WHEN 1 THEN chr(1) WHEN 2 THEN 'b' ELSE '' END, 'op' || i, i, -i, "
        "timestamptz '2026-01-01' + i * interval '1 day', NULL, 'x' FROM generate_series(0, 20) i",
    )
    copy = copies(table, chunk_rows=4)
    assert [f.name for f in copy.shape.change_fields] == [
        "__op", "__lsn", "__seq", "__commit_time", "__unchanged"
    ]  # fmt: skip
    changes = [
        f"UPDATE {table} SET \"_op\" = 'changed', code = 'zz' WHERE code = 'b'",
        f"DELETE FROM {table} WHERE code = 'a'",
        f"INSERT INTO {table} VALUES ('a', 'new', 1, 2, now(), 'u', 'y')",
    ]
    catch_up(copy, database, 4, changes)


def test_text_keys_under_a_language_collation_are_chunked_in_byte_order(
    logical_server, database, target_url, tmp_path
):
    """A key under a language collation was refused, so a country-code key in an en_US
    database could not be copied. Chunks compare it COLLATE "C", the order the merge compares
    in: here the two orders differ at every chunk's bound, and rows are inserted, deleted and
    moved on both sides of the bounds while the chunks are read."""
    collation = non_c_collation(database)
    kind = target_url.split(":")[0]
    table = f"coded_{kind}"
    codes = ["1", "a", "ä", "B", "b ", "c", "D", "e", "É", "f", "Z", "zz", "Ω", "ab"]
    values = ", ".join(f"('{c}', {n}, '{c}{n}')" for c in codes for n in (1, 2))
    write(
        database,
        f'CREATE TABLE {table} (code char(3) COLLATE "{collation}", n int, name text, '
        "PRIMARY KEY (code, n))",
        f"INSERT INTO {table} VALUES {values}",
    )
    copy = CdcCopy(logical_server.url, table, target_url, tmp_path / "state", chunk_rows=3)
    try:
        copy.step()
        changes = iter(
            [
                f"INSERT INTO {table} VALUES ('A', 1, 'new'), ('å', 3, 'new'), ('zz', 3, 'new')",
                f"DELETE FROM {table} WHERE code IN ('Z', 'ä') AND n = 1",
                f"UPDATE {table} SET code = 'C' WHERE code = 'f'",
                f"UPDATE {table} SET code = 'é', name = 'moved' WHERE code = 'Ω' AND n = 2",
                f"UPDATE {table} SET name = 'renamed' WHERE code IN ('1', 'b', 'zz')",
            ]
        )
        while copy.step(max_rows=3):
            write(database, next(changes, "SELECT 1"))
        copy.until_live_and_idle(max_rows=3)
        assert copy.differences() == []
        assert len(rows(target_url, copy.target_table, "code, n, name")) == 2 * len(codes) + 1
    finally:
        copy.close()


def test_a_value_that_starts_with_a_byte_order_mark_keeps_it(
    logical_server, database, target_url, tmp_path
):
    """Arrow's CSV reader takes a U+FEFF that starts its input for a byte-order mark and
    drops it: the first value of each chunk lost it, a key became another key, the copy held
    a row the table does not, and with one row a chunk the snapshot never got past it."""
    kind = target_url.split(":")[0]
    table = f"marked_{kind}"
    write(
        database,
        f"CREATE TABLE {table} (k text PRIMARY KEY, note text)",
        f"INSERT INTO {table} VALUES ('a', U&'\\FEFFfirst'), (U&'\\FEFFx', 'x'), "
        f"(U&'\\FEFFy', U&'\\FEFF')",
    )
    copy = CdcCopy(logical_server.url, table, target_url, tmp_path / "state", chunk_rows=1)
    try:
        copy.step()
        copy.until_live_and_idle(max_rows=1, steps=20)
        assert copy.differences() == []
        assert sorted(rows(target_url, copy.target_table, "k, note")) == [
            ("a", "\ufefffirst"),
            ("\ufeffx", "x"),
            ("\ufeffy", "\ufeff"),
        ]
    finally:
        copy.close()


@pytest.mark.parametrize("publish_generated", [False, True], ids=["published", "sent"])
def test_stored_generated_columns_are_computed_as_the_source_computes_them(
    copies, database, target_url, publish_generated
):
    """pgoutput sends no generated value: the first change failed the copy forever. Each is
    computed by the source from the row the change gives; where an update left a value it
    reads unsent (``body``, TOASTed) the value stands if all it reads was unsent
    (``body_length``), and the row is read again if only some was (``headline``). From
    PostgreSQL 18 a publication made beforehand may send them (``sent``): taken as it is."""
    kind = target_url.split(":")[0]
    table = f"generated_{kind}_{publish_generated:d}"
    fields = {}
    if publish_generated:
        if server_version(database) < 180000:
            pytest.skip("publish_generated_columns is PostgreSQL 18's")
        fields = {"publication": f"sent_{table}"}
    write(
        database,
        f"CREATE TABLE {table} (id int PRIMARY KEY, price numeric(10, 2), qty int, "
        "total numeric GENERATED ALWAYS AS (price * qty) STORED, title text, body text, "
        "headline text GENERATED ALWAYS AS (title || ': ' || left(body, 6)) STORED, "
        "body_length int GENERATED ALWAYS AS (length(body)) STORED)",
        f"ALTER TABLE {table} ALTER COLUMN body SET STORAGE EXTERNAL",
        f"INSERT INTO {table} (id, price, qty, title, body) SELECT g, g * 1.5, g, 't' || g, "
        f"repeat(md5(g::text), 200) FROM generate_series(1, 12) g",
        *[
            f"CREATE PUBLICATION {name} FOR TABLE {table} WITH (publish_generated_columns = stored)"
            for name in fields.values()
        ],
    )
    copy = copies(table, chunk_rows=4, **fields)
    assert [c.name for c in copy.shape.generated_columns] == ["total", "headline", "body_length"]
    # Beside the snapshot: a copied key and keys not copied yet; then live changes.
    beside = [f"UPDATE {table} SET qty = qty + 1 WHERE id IN (2, 10)"]
    live = [
        f"UPDATE {table} SET price = 9.99 WHERE id = 1",
        f"UPDATE {table} SET title = 'new' WHERE id = 3",
        f"UPDATE {table} SET qty = 0 WHERE id = 4",
        f"UPDATE {table} SET body = 'short' WHERE id = 5",
        f"UPDATE {table} SET id = 50, title = 'moved' WHERE id = 6",
        f"INSERT INTO {table} (id, price, qty, title, body) VALUES (60, NULL, 1, 'n', NULL)",
        f"DELETE FROM {table} WHERE id = 7",
    ]
    catch_up(copy, database, 4, beside, live, mid_snapshot=True)
    assert not any(copy.phases[copy.phases.index(False) :]), copy.phases


def test_virtual_generated_columns_are_computed_as_the_source_computes_them(
    copies, database, target_url
):
    """PostgreSQL 18's virtual generated columns (its default kind) were taken for ordinary
    ones: pgoutput never sends them, so the first change failed the copy as a table that
    changed, and starting over failed the same way. Computed as the stored ones are."""
    if server_version(database) < 180000:
        pytest.skip("virtual generated columns are PostgreSQL 18's")
    kind = target_url.split(":")[0]
    table = f"virtual_{kind}"
    write(
        database,
        f"CREATE TABLE {table} (id int PRIMARY KEY, a int, "
        "doubled int GENERATED ALWAYS AS (a * 2) VIRTUAL, "
        "stored int GENERATED ALWAYS AS (a + 1) STORED)",
        f"INSERT INTO {table} (id, a) SELECT g, g FROM generate_series(1, 9) g",
    )
    copy = copies(table, chunk_rows=4)
    assert [c.name for c in copy.shape.generated_columns] == ["doubled", "stored"]
    beside = [f"UPDATE {table} SET a = 100 WHERE id IN (1, 9)"]
    live = [
        f"UPDATE {table} SET a = -1 WHERE id = 2",
        f"UPDATE {table} SET id = 20 WHERE id = 3",
        f"INSERT INTO {table} (id, a) VALUES (30, NULL)",
    ]
    catch_up(copy, database, 4, beside, live, mid_snapshot=True)
    assert (20, 3, 6, 4) in rows(target_url, copy.target_table, "id, a, doubled, stored")


@pytest.mark.parametrize("stored", ["STORED", "VIRTUAL"])
def test_generated_values_take_their_column_s_type(copies, database, target_url, stored):
    """An expression's own type is not its column's: ``a / 3.0`` into ``numeric(6, 1)``
    rounds, into ``int`` too, a ``timestamp(3)`` into ``timestamp(0)``, a text into
    ``char(4)`` pads. The values computed for changes skipped that conversion: a SQLite copy
    held 3.3333333333333333 where the table holds 3.3, and an int failed the copy."""
    if stored == "VIRTUAL" and server_version(database) < 180000:
        pytest.skip("virtual generated columns are PostgreSQL 18's")
    kind = target_url.split(":")[0]
    table = f"converted_{kind}_{stored.lower()}"
    write(
        database,
        f"CREATE TABLE {table} (id int PRIMARY KEY, a int, at timestamp(3), "
        f"third numeric(6, 1) GENERATED ALWAYS AS (a / 3.0) {stored}, "
        f"half int GENERATED ALWAYS AS (a / 2.0) {stored}, "
        f"second timestamp(0) GENERATED ALWAYS AS (at) {stored}, "
        f"label char(4) GENERATED ALWAYS AS ('x' || a) {stored})",
        f"INSERT INTO {table} (id, a, at) SELECT g, g, "
        "timestamp '2024-01-01 10:00:00.7' + g * interval '1 ms' FROM generate_series(1, 6) g",
    )
    beside = [f"UPDATE {table} SET a = 10 WHERE id IN (1, 6)"]
    live = [f"INSERT INTO {table} (id, a, at) VALUES (7, 7, '2024-01-01 10:00:00.5')"]
    catch_up(copies(table, chunk_rows=4), database, 4, beside, live, mid_snapshot=True)


def test_a_colon_in_a_generated_expression_or_a_column_name_is_sql_not_a_parameter(
    copies, database, target_url
):
    """The statement computing generated values went through ``text()``, which took the
    ``:v`` of a literal and the ``:b`` of a column named ``:b`` for bound values it was
    never given: every change batch failed. (In ``a:b`` the colon follows a letter, which
    ``text()`` leaves alone.)"""
    kind = target_url.split(":")[0]
    table = f"colons_{kind}"
    with database.begin() as connection:  # as written: text() would read the colons too
        cursor = connection.connection.cursor()
        for statement in (
            f'CREATE TABLE {table} (id int PRIMARY KEY, t text, ":b" text, '
            f"u text GENERATED ALWAYS AS (t || ':v' || \":b\" || '%s') STORED)",
            f"INSERT INTO {table} (id, t, \":b\") SELECT g, 't' || g, ':x' FROM "
            "generate_series(1, 5) g",
        ):
            cursor.execute(statement)
    copy = copies(table, chunk_rows=2)
    beside = [f"UPDATE {table} SET t = 'new' WHERE id IN (1, 5)"]
    catch_up(copy, database, 2, beside, mid_snapshot=True)
    assert (5, "new:v:x%s") in rows(target_url, copy.target_table, "id, u")


def test_a_column_named_as_the_statement_s_row_order_is_computed_from(copies, database, target_url):
    """The statement computing generated values numbered its rows ``backlog_row``: a table
    with a column of that name made it ambiguous, and every change batch failed."""
    kind = target_url.split(":")[0]
    table = f"row_named_{kind}"
    write(
        database,
        f"CREATE TABLE {table} (id int PRIMARY KEY, backlog_row int, "
        "doubled int GENERATED ALWAYS AS (backlog_row * 2) STORED)",
        f"INSERT INTO {table} (id, backlog_row) SELECT g, g FROM generate_series(1, 4) g",
    )
    copy = copies(table, chunk_rows=2)
    beside = [f"UPDATE {table} SET backlog_row = 10 WHERE id IN (1, 4)"]
    catch_up(copy, database, 2, beside, mid_snapshot=True)
    assert (4, 10, 20) in rows(target_url, copy.target_table, "id, backlog_row, doubled")


def test_virtual_and_stored_columns_under_a_publication_that_sends_the_stored(
    copies, database, target_url
):
    """PostgreSQL 18 with publish_generated_columns = stored sends the stored column and never
    the virtual one: neither all columns nor only the ordinary ones, and the first change
    failed the copy as a table that changed."""
    if server_version(database) < 180000:
        pytest.skip("virtual generated columns are PostgreSQL 18's")
    kind = target_url.split(":")[0]
    table = f"both_kinds_{kind}"
    write(
        database,
        f"CREATE TABLE {table} (id int PRIMARY KEY, a int, "
        "doubled int GENERATED ALWAYS AS (a * 2) VIRTUAL, "
        "stored int GENERATED ALWAYS AS (a + 1) STORED)",
        f"INSERT INTO {table} (id, a) SELECT g, g FROM generate_series(1, 5) g",
        f"CREATE PUBLICATION sent_{table} FOR TABLE {table} "
        "WITH (publish_generated_columns = stored)",
    )
    copy = copies(table, chunk_rows=2, publication=f"sent_{table}")
    live = [f"UPDATE {table} SET a = 100 WHERE id = 2", f"DELETE FROM {table} WHERE id = 3"]
    catch_up(copy, database, 2, live)


def test_a_partitioned_table_is_copied_with_rows_moving_between_partitions(
    logical_server, database, target_url, tmp_path
):
    """It was refused, naming the driver. Its changes are published as the root's, and a
    row moved between partitions is a delete and an insert of it."""
    kind = target_url.split(":")[0]
    table = f"parts_{kind}"
    write(
        database,
        f'CREATE TABLE {table} (id int, region text COLLATE "C", amount int, note text, '
        "PRIMARY KEY (region, id)) PARTITION BY LIST (region)",
        f"CREATE TABLE {table}_eu PARTITION OF {table} FOR VALUES IN ('eu')",
        f"CREATE TABLE {table}_us PARTITION OF {table} FOR VALUES IN ('us')",
        f"CREATE TABLE {table}_rest PARTITION OF {table} DEFAULT",
        f"ALTER TABLE {table}_eu ALTER COLUMN note SET STORAGE EXTERNAL",
        f"INSERT INTO {table} SELECT g, (ARRAY['eu', 'us', 'apac'])[1 + g % 3], g, "
        f"repeat(md5(g::text), 100) FROM generate_series(1, 15) g",
    )
    copy = CdcCopy(logical_server.url, table, target_url, tmp_path / "state", chunk_rows=4)
    try:
        copy.step()
        assert copy.step(max_rows=4)
        write(database, f"UPDATE {table} SET region = 'us' WHERE id = 3")
        copy.until_live_and_idle(max_rows=4)
        write(
            database,
            f"UPDATE {table} SET region = 'apac', amount = 0 WHERE region = 'eu'",
            f"UPDATE {table} SET amount = amount + 1 WHERE region = 'us'",
            f"DELETE FROM {table} WHERE id = 2",
            f"INSERT INTO {table} VALUES (100, 'eu', 1, 'new')",
        )
        copy.until_live_and_idle(max_rows=4)
        assert copy.differences() == []
        write(database, f"ALTER TABLE {table} DETACH PARTITION {table}_us")
        with pytest.raises(TableChangedError, match=r"its partitions \(attached or detached"):
            copy.step()
    finally:
        copy.close()


def test_a_partitioned_table_s_identity_changed_on_its_root_alone_fails_by_name(
    logical_server, database, tmp_path
):
    """Its partitions keep theirs: a table the copy could not begin with, named as a change."""
    write(
        database,
        "CREATE TABLE split (id int PRIMARY KEY, note text) PARTITION BY RANGE (id)",
        "CREATE TABLE split_low PARTITION OF split FOR VALUES FROM (MINVALUE) TO (100)",
        "INSERT INTO split SELECT g, 'n' FROM generate_series(1, 10) g",
    )
    copy = CdcCopy(logical_server.url, "split", f"sqlite:///{tmp_path}/t.db", tmp_path / "s", 4)
    try:
        copy.step()
        copy.until_live_and_idle()
        write(database, "ALTER TABLE split REPLICA IDENTITY FULL")
        with pytest.raises(
            TableChangedError, match=r"changed since the copy began: .*partition split_low has"
        ):
            copy.step()
    finally:
        copy.close()


def test_a_batch_never_runs_on_past_rows_it_no_longer_reads_again(
    copies, database, table, logical_server, target_url, monkeypatch
):
    """Each refresh in the changelog runs the batch on to its own position, taking what was
    written meanwhile: a move written as each refresh is read (a busy table) must not ride
    along unread on the last one, as it did once the refreshes a batch may make ran out."""
    insert_rows(database, table, range(1, 21))
    copy = copies(table, chunk_rows=50)
    copy.step()
    copy.until_live_and_idle()
    monkeypatch.setattr("spark_jobs.sources.cdc.child.REFRESHES_PER_BATCH", 2)
    moves = iter(range(2, 10))
    write_image = snapshot.write_image

    def a_move_meanwhile(*args, **kwargs):
        moved = next(moves, None)
        if moved is not None:
            write(database, f"UPDATE {table} SET id = {100 + moved} WHERE id = {moved}")
        write_image(*args, **kwargs)

    monkeypatch.setattr(snapshot, "write_image", a_move_meanwhile)
    write(database, f"UPDATE {table} SET id = 101 WHERE id = 1")
    copy.until_live_and_idle()
    assert short_rows(target_url, copy.target_table) == short_rows(logical_server.url, table)


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A source server of the test's own, to stop and start."""
    settings = {**LOGICAL_DECODING, "synchronous_commit": "on"}
    with PostgresServer(database="shop", settings=settings) as server:
        yield server


def test_a_plan_cut_by_an_outage_leaves_no_record_of_its_chunks_behind(
    own_server, tmp_path, monkeypatch
):
    """The server went away after a plan had read chunk 1 (50..70) and looked at its
    records; ridden out in the same process, the next plan read chunk 1 again, to 80 now
    that 55 was gone, but the records of the plan never logged stood: key 80 looked like
    chunk 2's, whose image would hold its update."""
    engine = make_engine(own_server.url)
    ids = [10, 20, 30, 40, 50, 55, 60, 70, 80, 90, 100, 110, 120, 130]
    write(
        engine,
        "CREATE TABLE t (id int PRIMARY KEY, name text)",
        f"INSERT INTO t SELECT unnest(ARRAY{ids}), 'n'",
    )
    target = f"sqlite:///{tmp_path}/t.db"
    copy = CdcCopy(own_server.url, "t", target, tmp_path / "state", 4, outageTimeout="5min")
    try:
        copy.step()
        assert copy.step(max_rows=4)  # chunk 0: 10..40
        write(engine, "UPDATE t SET id = 15 WHERE id = 20")  # the plan looks at coverage
        health = PostgresCdcChild._health
        cut = [True]

        def away_once(child):
            if cut and cut.pop():
                own_server.stop()
                try:
                    return health(child)
                finally:
                    own_server.start()
            return health(child)

        monkeypatch.setattr(PostgresCdcChild, "_health", away_once)
        assert not copy.step(max_rows=4)  # chunk 1 read, then the outage: no batch
        engine.dispose()
        write(engine, "DELETE FROM t WHERE id = 55")
        assert copy.step(max_rows=4)  # chunk 1 again: 50..80
        write(engine, "UPDATE t SET name = 'after chunk 1' WHERE id = 80")
        copy.until_live_and_idle(max_rows=4)
        assert copy.differences() == []
    finally:
        copy.close()
        engine.dispose()


def test_a_numeric_key_set_to_an_equal_value_of_another_scale_is_moved(
    copies, database, logical_server, target_url
):
    """1.5 and 1.50 are equal as numerics but read differently: the update was taken for
    one that kept its key, and a copy kept '1.5' (SQLite: beside a new '1.50')."""
    write(
        database,
        "CREATE TABLE IF NOT EXISTS priced (id numeric PRIMARY KEY, name text)",
        "DELETE FROM priced",
        "INSERT INTO priced VALUES (1.5, 'a'), (2, 'b'), (3.000, 'c')",
    )
    copy = copies("priced", chunk_rows=10)
    copy.step()
    copy.until_live_and_idle()
    write(
        database,
        "UPDATE priced SET id = 1.50 WHERE id = 1.5",
        "UPDATE priced SET id = 3, name = 'C' WHERE id = 3",
    )
    copy.until_live_and_idle()
    assert copy.differences() == []


def test_generated_values_are_computed_under_their_columns_collations(
    copies, database, logical_server, target_url
):
    """upper() under a Turkish collation dots the capital I; least() under "C" puts capitals
    first. Computed under the database's default collation, both came out otherwise."""
    write(
        database,
        "DROP TABLE IF EXISTS shouted",
        'CREATE TABLE shouted (id int PRIMARY KEY, name text COLLATE "tr-x-icu", '
        "shout text GENERATED ALWAYS AS (upper(name)) STORED, "
        'a text COLLATE "C", b text COLLATE "C", '
        "first text GENERATED ALWAYS AS (least(a, b)) STORED)",
        "INSERT INTO shouted (id, name, a, b) VALUES (1, 'istanbul', 'a', 'B')",
    )
    copy = copies("shouted", chunk_rows=10)
    copy.step()
    copy.until_live_and_idle()
    write(database, "INSERT INTO shouted (id, name, a, b) VALUES (2, 'izmir', 'b', 'A')")
    copy.until_live_and_idle()
    assert copy.differences() == []


def live_mood_copy(copies, database, table: str) -> CdcCopy:  # type: ignore[no-untyped-def]
    """``table`` (an enum column, a text one; ten rows) made afresh and copied until live."""
    write(
        database,
        f"DROP TABLE IF EXISTS {table}",
        f"DROP TYPE IF EXISTS {table}_mood",
        f"CREATE TYPE {table}_mood AS ENUM ('sad', 'ok')",
        f"CREATE TABLE {table} (id int PRIMARY KEY, mood {table}_mood, note text)",
        f"INSERT INTO {table} SELECT g, 'ok', 'n' || g FROM generate_series(1, 10) g",
    )
    copy = copies(table, chunk_rows=4)
    copy.step()
    copy.until_live_and_idle()
    return copy


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        # The last column again: every row's value now NULL, and no change says so.
        ("ALTER TABLE {t} DROP COLUMN note; ALTER TABLE {t} ADD COLUMN note text",
         "column 'note' was dropped and added again"),
        ("ALTER TABLE {t} ALTER COLUMN note TYPE text USING upper(note)",
         r"its rows were rewritten by a change of column 'note'"),
        ("ALTER TYPE {t}_mood RENAME VALUE 'ok' TO 'fine'", "an enum label .* was renamed"),
    ],
)  # fmt: skip
def test_ddl_that_changes_rows_without_a_change_fails_by_name(
    copies, database, target_url, ddl, named
):
    table = f"rewritten_{target_url.split(':')[0]}"
    copy = live_mood_copy(copies, database, table)
    write(database, *ddl.format(t=table).split("; "))
    with pytest.raises(TableChangedError, match=rf"changed since the copy began: {named}"):
        copy.until_live_and_idle()


def test_ddl_that_leaves_the_rows_as_they_were_lets_the_copy_go_on(
    copies, database, logical_server, target_url
):
    """A rewrite alone (VACUUM FULL), a column's catalog row alone (a default, statistics),
    an enum label added: nothing copied changed."""
    table = f"kept_{target_url.split(':')[0]}"
    copy = live_mood_copy(copies, database, table)
    write(
        database,
        f"ALTER TABLE {table} ALTER COLUMN note SET DEFAULT 'd'",
        f"ALTER TABLE {table} ALTER COLUMN note SET STATISTICS 500",
        f"ALTER TYPE {table}_mood ADD VALUE 'happy'",
    )
    engine = database.execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f"VACUUM FULL {table}"))
    write(database, f"INSERT INTO {table} (id, mood) VALUES (11, 'happy')")
    copy.until_live_and_idle()
    assert copy.differences() == []


def test_swaps_through_one_temporary_key_while_refreshes_are_read(
    copies, database, table, logical_server, target_url, monkeypatch
):
    """Applications swap two unique values through a temporary key (-1). A swap committed
    while a refresh is read moves a row in from -1, which the refresh did not read: it was
    read again and again, each time meeting the next swap, until the query failed."""
    insert_rows(database, table, range(1, 41))
    copy = copies(table, chunk_rows=100)
    copy.step()
    copy.until_live_and_idle()

    def swap(a: int, b: int) -> list[str]:
        return [
            f"UPDATE {table} SET id = -1 WHERE id = {a}",
            f"UPDATE {table} SET id = {a} WHERE id = {b}",
            f"UPDATE {table} SET id = {b} WHERE id = -1",
        ]

    pairs = iter([(i, i + 1) for i in range(3, 40, 2)])
    read = snapshot.ChunkReader._read

    def a_swap_meanwhile(reader, where, values, limit, *args, **kwargs):
        found = read(reader, where, values, limit, *args, **kwargs)
        if limit is None and (pair := next(pairs, None)):  # a refresh's read
            write(database, *swap(*pair))
        return found

    monkeypatch.setattr(snapshot.ChunkReader, "_read", a_swap_meanwhile)
    write(database, *swap(1, 2))
    copy.until_live_and_idle()
    assert short_rows(target_url, copy.target_table) == short_rows(logical_server.url, table)


def test_a_held_move_into_a_chunk_not_read_yet_lets_the_chunk_be_read(
    waiting_server, target_url, tmp_path
):
    """Committed but held by the standby, the move 18 -> 7 is decoded, invisible to the
    chunk of key 7: its value is not at hand, and a read again cannot see it either. The old
    row, still visible, is read beside the chunk."""
    admin = make_engine(waiting_server.url)
    ids = [1, 2, 3, 4, 5, *range(10, 21)]
    write(
        admin,
        "CREATE TABLE t (id int PRIMARY KEY, name text, notes text)",
        "ALTER TABLE t ALTER COLUMN notes SET STORAGE EXTERNAL",
        f"INSERT INTO t SELECT g, 'n' || g, g || repeat('x', 3000) FROM unnest(ARRAY{ids}) g",
    )
    copy = CdcCopy(waiting_server.url, "t", target_url, tmp_path / "state", chunk_rows=5)
    try:
        copy.step()
        assert copy.step(max_rows=5)  # chunk 0: 1..5
        pending = WaitingCommit(waiting_server.url, "UPDATE t SET id = 7 WHERE id = 18")
        pending.start()
        pending.wait_until_decodable(admin)
        assert copy.step(max_rows=5)  # chunk 1: (5, 14], key 7 in its range
        pending.release(admin)
        copy.until_live_and_idle(max_rows=5)
        assert rows(target_url, copy.target_table, "id, length(notes)") == rows(
            waiting_server.url, "t", "id, length(notes)"
        )
    finally:
        copy.close()
        admin.dispose()
