"""Describing a table for a chunked snapshot, against a real PostgreSQL."""

import re

import pytest
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.table import TableColumn, TableError, describe_table


def create(database, *statements: str) -> None:
    with database.begin() as connection:
        for statement in statements:
            connection.execute(text(statement))


def non_c_collation(database) -> str:
    """A collation that orders by language rules, whichever the server has."""
    with database.connect() as connection:
        name = connection.execute(
            text(
                "SELECT collname FROM pg_collation WHERE collname IN ('und-x-icu', 'en_US.utf8', "
                "'en_US') ORDER BY collname DESC LIMIT 1"
            )
        ).scalar()
    if name is None:
        pytest.skip("the server has neither ICU nor an en_US locale")
    return name


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
        TableColumn("region", "region", 25, "text"),
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
    [("id bool", "boolean"), ("id float8", "double precision"), ("id char(3)", "character(3)")],
)
def test_a_key_type_without_a_chunkable_order_is_refused(database, column, type_name):
    create(database, f"CREATE TABLE refused ({column} PRIMARY KEY)")
    try:
        expected = rf"column 'id' is {re.escape(type_name)}, .*must be int8"
        with pytest.raises(TableError, match=expected):
            describe_table(database, "refused")
    finally:
        create(database, "DROP TABLE refused")


def test_a_text_key_under_a_language_collation_is_refused_by_column_and_collation(database):
    collation = non_c_collation(database)
    create(
        database,
        f'CREATE TABLE worded (id int, word text COLLATE "{collation}", PRIMARY KEY (id, word))',
    )
    with pytest.raises(
        TableError,
        match=rf"column 'word' is text with collation '{collation}' .*does not order by bytes"
        r'.*collation "C" or "POSIX"',
    ):
        describe_table(database, "worded")


def test_a_database_whose_default_collation_is_not_c_refuses_text_keys(logical_server, database):
    collation = non_c_collation(database)
    locale = (
        "LOCALE_PROVIDER icu ICU_LOCALE 'und'"
        if collation == "und-x-icu"
        else f"LC_COLLATE '{collation}' LC_CTYPE '{collation}'"
    )
    with database.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(text(f"CREATE DATABASE worded TEMPLATE template0 {locale}"))
    engine = make_engine(logical_server.url.rsplit("/", 1)[0] + "/worded")
    try:
        create(engine, "CREATE TABLE words (word text PRIMARY KEY)")
        with pytest.raises(TableError, match=r"column 'word' is text with collation 'default'"):
            describe_table(engine, "words")
    finally:
        engine.dispose()
