"""The copy (``tools.faults.cdc_copy``, as Spark runs it) under what users' databases hold:
their settings (a client encoding, ``array_nulls``), names with a '%', rows of megabytes, a
primary key that INCLUDEs columns, the key's own index as replica identity, unlogged
partitions. Each was a copy that differed from its table while the source reported it live,
or a realistic table that broke it with a message naming nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import text

from spark_jobs.jobs.merge.record import MergeRefused
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.table import TableChangedError
from spark_jobs.sources.children import ChildSpecError
from tools.faults.cdc_copy import CdcCopy

DRIVERS = ["psycopg2", "psycopg"]


def with_driver(url: str, driver: str) -> str:
    return url.replace("postgresql://", f"postgresql+{driver}://")


def new_database(server_url: str, *settings: str, encoding: str | None = None) -> str:
    """A database of its own on the server at ``server_url``, with ``ALTER DATABASE ... SET``
    ``settings`` (``name = value``) and, given, another encoding; its URL."""
    name = "db_" + uuid.uuid4().hex[:10]
    created = f"ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    admin = make_engine(server_url).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f"CREATE DATABASE {name} {created if encoding else ''}"))
            for setting in settings:
                connection.execute(text(f"ALTER DATABASE {name} SET {setting}"))
    finally:
        admin.dispose()
    return server_url.rsplit("/", 1)[0] + "/" + name


def write(url: str, *statements: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


@pytest.fixture
def copies(tmp_path) -> Iterator[Callable[..., CdcCopy]]:
    made: list[CdcCopy] = []

    def make(source: str, table: str, target: str, chunk_rows: int = 10) -> CdcCopy:
        made.append(CdcCopy(source, table, target, tmp_path / f"state-{len(made)}", chunk_rows))
        return made[-1]

    yield make
    for copy in made:
        copy.close()


def copied_exactly(copy: CdcCopy, source: str, *changes: str) -> None:
    """The snapshot, then ``changes`` through the changelog: the copy equals the table."""
    copy.until_live_and_idle()
    assert copy.differences() == []
    write(source, *changes)
    copy.until_live_and_idle()
    assert copy.live
    assert copy.differences() == []


TEXTS = ["café", "naïve", "Â£ 5", "Ærø", "plain"]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    "side, setting, encoding",
    [
        ("source", "client_encoding = 'WIN1252'", None),
        ("target", "client_encoding = 'LATIN1'", None),
        ("target", "client_encoding = 'WIN1252'", None),
        ("target", None, "LATIN1"),  # its client encoding is LATIN1 too
    ],
)
def test_text_is_copied_as_it_is_whatever_encoding_a_database_sets(
    logical_server, postgres_server, copies, driver, side, setting, encoding
):
    """COPY's bytes go to Arrow as UTF-8, and Arrow's CSV goes to COPY as UTF-8: each
    connection says so, whatever its database sets (the snapshot read 'Â£ 5' as '£ 5' and
    failed on 'café'; the target held 'cafÃ©')."""
    settings = [setting] if setting else []
    source = logical_server.url
    target = postgres_server.url
    if side == "source":
        source = new_database(source, *settings)
    else:
        target = new_database(target, *settings, encoding=encoding)
    values = ", ".join(f"({i}, '{value}')" for i, value in enumerate(TEXTS))
    table = "labels_" + uuid.uuid4().hex[:8]
    write(source, f"CREATE TABLE {table} (id int PRIMARY KEY, label text)")
    write(source, f"INSERT INTO {table} VALUES {values}")
    copy = copies(with_driver(source, driver), table, with_driver(target, driver))
    copied_exactly(
        copy,
        source,
        f"INSERT INTO {table} VALUES (10, 'Øre'), (11, 'Â£ 6')",
        f"UPDATE {table} SET label = label || ' é' WHERE id < 3",
    )


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
def test_null_array_elements_stay_null_under_array_nulls_off_at_the_source(
    logical_server, target_url, copies
):
    """Generated values are computed at the source from the changes' text: a NULL element
    read back as the string 'NULL' counted (3 instead of 2)."""
    source = new_database(logical_server.url, "array_nulls = off")
    write(
        source,
        "CREATE TABLE tagged (id int PRIMARY KEY, tags text[], known int "
        "GENERATED ALWAYS AS (cardinality(array_remove(tags, NULL))) STORED)",
        "INSERT INTO tagged VALUES (1, ARRAY['a', NULL])",
    )
    copied_exactly(
        copies(source, "tagged", target_url),
        source,
        "INSERT INTO tagged VALUES (2, ARRAY['a', NULL, 'b']), (3, ARRAY[NULL]::text[])",
    )


def test_null_array_elements_stay_null_under_array_nulls_off_at_the_target(
    logical_server, postgres_server, copies
):
    """The merge reads values from their text: a NULL element became the string 'NULL'."""
    target = new_database(postgres_server.url, "array_nulls = off")
    write(
        logical_server.url,
        "CREATE TABLE tags_off (id int PRIMARY KEY, tags text[], counts int[])",
        "INSERT INTO tags_off VALUES (1, ARRAY['a', NULL, 'NULL'], ARRAY[NULL, 1])",
    )
    copy = copies(logical_server.url, "tags_off", target)
    copied_exactly(copy, logical_server.url, "INSERT INTO tags_off VALUES (2, ARRAY[NULL], NULL)")
    engine = make_engine(target)
    try:
        with engine.connect() as connection:
            positions = connection.execute(
                text(f"SELECT id, array_position(tags, NULL) FROM {copy.target_table} ORDER BY 1")
            ).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in positions] == [(1, 2), (2, 1)]


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize("driver", DRIVERS)
def test_names_with_a_percent_sign_are_copied(logical_server, target_url, copies, driver):
    """Tables begun as spreadsheets: the chunk's COPY query is rendered by the driver, which
    took each '%' for a placeholder (an IndexError naming nothing)."""
    table = f'"Discounts % {driver}"'
    write(
        logical_server.url,
        f"DROP TABLE IF EXISTS {table}",
        f'CREATE TABLE {table} ("id %" int PRIMARY KEY, "discount %" numeric, "%s" text)',
        f"INSERT INTO {table} VALUES (1, 12.5, '%s'), (2, NULL, '100%')",
    )
    source = with_driver(logical_server.url, driver)
    copy = copies(source, f"Discounts % {driver}", target_url, chunk_rows=1)
    copied_exactly(
        copy,
        logical_server.url,
        f"INSERT INTO {table} VALUES (3, 0.5, '%%')",
        f'UPDATE {table} SET "id %" = 4 WHERE "id %" = 1',
    )


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
def test_rows_of_a_few_megabytes_are_copied_read_again_and_followed(
    logical_server, target_url, copies
):
    """Arrow's CSV reader takes a row of at most about 2 MiB in its default blocks: the
    snapshot failed with "straddling object straddles two block boundaries". A key move
    of the large row under REPLICA IDENTITY DEFAULT makes the chunk read it again."""
    table = "big_" + uuid.uuid4().hex[:8]
    write(
        logical_server.url,
        f"CREATE TABLE {table} (id int PRIMARY KEY, notes text, blob bytea)",
        f"INSERT INTO {table} VALUES (1, 'small', NULL), "
        "(2, repeat('ab', 1500000), decode(repeat('00ff', 600000), 'hex'))",
    )
    copied_exactly(
        copies(logical_server.url, table, target_url, chunk_rows=1),
        logical_server.url,
        f"UPDATE {table} SET id = 3 WHERE id = 2",
        f"INSERT INTO {table} VALUES (4, repeat('€', 1200000), NULL)",
    )


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
def test_a_primary_key_that_includes_columns_is_keyed_on_its_own(
    logical_server, target_url, copies
):
    """``PRIMARY KEY (id) INCLUDE (name)`` was read as the key (id, name): every change
    failed, and every restart, taking the table for changed."""
    table = "included_" + uuid.uuid4().hex[:8]
    write(
        logical_server.url,
        f"CREATE TABLE {table} (id int, name text, PRIMARY KEY (id) INCLUDE (name))",
        f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')",
    )
    copy = copies(logical_server.url, table, target_url)
    assert copy.shape.key == ("id",)
    copied_exactly(
        copy,
        logical_server.url,
        f"UPDATE {table} SET name = 'c' WHERE id = 1",
        f"UPDATE {table} SET id = 3 WHERE id = 2",
    )


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.parametrize("identity", ["DEFAULT", "USING INDEX {table}_pkey"])
def test_the_key_s_own_index_as_replica_identity_is_copied_as_the_default(
    logical_server, target_url, copies, identity
):
    """The server treats the key's own index as DEFAULT: an update leaves a TOASTed value
    unsent, which a generated column reads. Under it the row was not read again and the
    generated value was copied as NULL."""
    table = "headlines_" + uuid.uuid4().hex[:8]
    write(
        logical_server.url,
        f"CREATE TABLE {table} (id int PRIMARY KEY, title text, body text, "
        "headline text GENERATED ALWAYS AS (title || ': ' || left(body, 6)) STORED)",
        f"ALTER TABLE {table} ALTER COLUMN body SET STORAGE EXTERNAL",
        f"ALTER TABLE {table} REPLICA IDENTITY {identity.format(table=table)}",
        f"INSERT INTO {table} (id, title, body) SELECT g, 't' || g, "
        "repeat(md5(g::text), 200) FROM generate_series(1, 3) g",
    )
    copied_exactly(
        copies(logical_server.url, table, target_url),
        logical_server.url,
        # No key move: it would make the batch read rows again anyway.
        f"UPDATE {table} SET title = 'news' WHERE id = 2",
    )


#: On each PostgreSQL release the source supports: partitions and persistence differ.
@pytest.mark.every_release
@pytest.mark.parametrize("target_url", ["sqlite"], indirect=True)
def test_an_unlogged_partition_is_refused_and_one_made_unlogged_fails_the_copy(
    logical_server, target_url, copies
):
    """An unlogged partition writes no WAL, so none of its changes is decoded: its changes
    were lost while the copy went on live. PostgreSQL refuses SET UNLOGGED for a table a
    publication names, not for a partition of a published root."""
    table = "events_" + uuid.uuid4().hex[:8]
    write(
        logical_server.url,
        f"CREATE TABLE {table} (id int PRIMARY KEY, name text) PARTITION BY RANGE (id)",
        f"CREATE TABLE {table}_hot PARTITION OF {table} FOR VALUES FROM (0) TO (100)",
        f"CREATE UNLOGGED TABLE {table}_cold PARTITION OF {table} FOR VALUES FROM (100) TO (200)",
    )
    with pytest.raises(ChildSpecError, match=rf"partition {table}_cold is UNLOGGED"):
        copies(logical_server.url, table, target_url)

    write(logical_server.url, f"ALTER TABLE {table}_cold SET LOGGED")
    copy = copies(logical_server.url, table, target_url)
    copy.until_live_and_idle()
    write(
        logical_server.url,
        f"ALTER TABLE {table}_cold SET UNLOGGED",
        f"INSERT INTO {table} VALUES (160, 'lost')",
    )
    with pytest.raises(TableChangedError, match=rf"{table}_cold is UNLOGGED"):
        copy.until_live_and_idle()


# --- target tables: made beforehand, given again, restored --------------------------------


def accounts_table(source: str, rows: int) -> str:
    table = "accounts_" + uuid.uuid4().hex[:8]
    write(source, f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    write(source, f"INSERT INTO {table} SELECT g, 'snap' FROM generate_series(1, {rows}) g")
    return table


def target_rows(url: str, table: str) -> list[tuple]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(text(f"SELECT * FROM {table}"))]
    finally:
        engine.dispose()


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
def test_a_target_that_lacks_batches_of_its_query_is_refused_by_name(
    logical_server, target_url, copies
):
    """A checkpoint restarted with another --target-table, or a target restored from a
    backup (or failed over to a standby behind it): the table was fed from the middle of
    the stream, silently missing rows, while the source reported the copy live."""
    source = logical_server.url
    table = accounts_table(source, 20)
    copy = copies(source, table, target_url, chunk_rows=5)
    copy.until_live_and_idle(max_rows=5)
    backup = copy.target_table + "_backup"
    write(target_url, f"CREATE TABLE {backup} AS SELECT * FROM {copy.target_table}")
    write(source, f"DELETE FROM {table} WHERE id = 1")
    copy.until_live_and_idle()
    # Restored: its rows and its record as they were at the backup.
    records = "backlog_merge_records"
    kept = target_rows(target_url, f"{records} WHERE query_id = '{copy.query_id}'")
    write(
        target_url,
        f"DELETE FROM {copy.target_table}",
        f"INSERT INTO {copy.target_table} SELECT * FROM {backup}",
        f"UPDATE {records} SET batch_id = batch_id - 1 WHERE query_id = '{copy.query_id}'",
    )
    write(source, f"UPDATE {table} SET v = 'live' WHERE id = 3")
    with pytest.raises(MergeRefused, match=r"holds batches up to \d+ of this query .* not batch"):
        copy.until_live_and_idle()
    assert kept, "the record was there to restore"

    copy.batches.kill()
    copy.retarget(copy.target_table + "_new")
    with pytest.raises(MergeRefused, match=r"holds no batch of this query .* a new --checkpoint"):
        copy.until_live_and_idle()


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
def test_a_table_another_query_merged_into_is_refused_however_its_name_is_spelled(
    logical_server, target_url, copies
):
    """The record was kept under the name as given: ``accounts`` and ``public.accounts``
    (or SQLite's ``main.ACCOUNTS``) let a second query merge into the first one's rows,
    keeping a row deleted in the source since."""
    source = logical_server.url
    table = accounts_table(source, 3)
    shared = "shared_" + uuid.uuid4().hex[:8]
    other = f"public.{shared}" if target_url.startswith("postgresql") else f"main.{shared.upper()}"
    first = copies(source, table, target_url)
    first.retarget(shared)
    first.until_live_and_idle()
    write(source, f"DELETE FROM {table} WHERE id = 2")
    second = copies(source, table, target_url)
    second.retarget(other)
    with pytest.raises(MergeRefused, match="not of this query"):
        second.until_live_and_idle()


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
def test_start_over_left_on_never_empties_a_table_at_a_later_batch(
    logical_server, target_url, copies
):
    """A query left running with --start-over, beside another started over into its table:
    its next batch emptied the table and merged one batch, 9 rows of 10 lost."""
    source = logical_server.url
    table = accounts_table(source, 10)
    shared = "shared_" + uuid.uuid4().hex[:8]
    first, second = copies(source, table, target_url, 4), copies(source, table, target_url, 4)
    for copy in (first, second):
        copy.retarget(shared)
        copy.start_over = True
    first.until_live_and_idle()
    second.until_live_and_idle()  # started over: emptied, copied afresh
    assert second.differences() == []
    write(source, f"UPDATE {table} SET v = 'changed' WHERE id = 1")
    with pytest.raises(MergeRefused, match="only at a query's first batch"):
        first.until_live_and_idle()
    second.until_live_and_idle()
    assert second.differences() == []


@pytest.mark.parametrize("column", ["varchar(3)", "char(3)"])
def test_a_target_made_beforehand_with_narrower_text_fails_rather_than_cuts(
    logical_server, postgres_server, copies, column
):
    """Values were cast to the target's types, and a cast cuts a text to a varchar(n)
    (two keys 'abcd1' and 'abcd2' became one); stored as an INSERT stores them, they
    fail by the server's error."""
    source, target = logical_server.url, postgres_server.url
    table = "codes_" + uuid.uuid4().hex[:8]
    write(source, f"CREATE TABLE {table} (id int PRIMARY KEY, code text)")
    write(source, f"INSERT INTO {table} VALUES (1, 'abcdefgh')")
    copy = copies(source, table, target)
    write(
        target, f"CREATE TABLE {copy.target_table} (id int PRIMARY KEY, code {column}, _lsn bigint)"
    )
    with pytest.raises(Exception, match="value too long for type character"):
        copy.until_live_and_idle()
    assert target_rows(target, copy.target_table) == []


@pytest.mark.parametrize("target_url", ["sqlite", "postgresql"], indirect=True)
def test_a_target_made_beforehand_without_a_column_is_refused_by_name(
    logical_server, target_url, copies
):
    source = logical_server.url
    table = "wide_" + uuid.uuid4().hex[:8]
    write(source, f"CREATE TABLE {table} (id int PRIMARY KEY, code text, other text)")
    write(source, f"INSERT INTO {table} VALUES (1, 'a', 'b')")
    copy = copies(source, table, target_url)
    write(
        target_url, f"CREATE TABLE {copy.target_table} (id int PRIMARY KEY, code text, _lsn bigint)"
    )
    with pytest.raises(
        MergeRefused, match=rf"{copy.target_table} .* without the columns \['other'\]"
    ):
        copy.until_live_and_idle()
