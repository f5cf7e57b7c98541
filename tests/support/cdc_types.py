"""A table holding every column type the CDC source supports, each with its edge values.

One definition for the unit tests that read and write values and for the end-to-end copies
into PostgreSQL and SQLite targets: a type the source comes to support gets its column here,
and every test that copies this table then covers it. Column names need quoting (a space, a
quote); row 0 is NULL in every column, row ``i`` holds each column's ``i``-th edge value
(NULL past its last), and ``Long Note`` holds a value stored out of line (TOASTed).

Values are written as PostgreSQL input text, which the column's type reads on insert.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from tools.faults.cdc_compare import OUTPUT_SETTINGS, output_text

__all__ = ["OUTPUT_SETTINGS", "output_text"]  # read from here by the tests of every type

#: 12,000 random letters: they do not compress, and are well past the 2 kB at which
#: PostgreSQL moves a value out of line.
TOASTED = "".join(random.Random(12_000).choices(string.ascii_letters, k=12_000))
#: An enum and domains the table's columns use, created once per database.
TYPES = (
    "CREATE TYPE cdc_mood AS ENUM ('sad', 'ok', 'happy', 'a \"b\" c')",
    "CREATE DOMAIN cdc_positive AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN cdc_day AS date",
    "CREATE DOMAIN cdc_codes AS text[]",
)


@dataclass(frozen=True)
class TypeColumn:
    """A column: its name as written, its SQL type, and its edge values as input text."""

    name: str
    sql_type: str
    values: tuple[str, ...]

    @property
    def sql(self) -> str:
        return '"' + self.name.replace('"', '""') + '"'


TYPE_COLUMNS = (
    TypeColumn("flag", "boolean", ("true", "false")),
    TypeColumn("raw bytes", "bytea", ("\\x", "\\x" + bytes(range(256)).hex(), "\\x00")),
    TypeColumn("small", "smallint", ("-32768", "32767", "0")),
    TypeColumn("int", "integer", ("-2147483648", "2147483647", "0")),
    TypeColumn("big", "bigint", ("-9223372036854775808", "9223372036854775807", "0")),
    TypeColumn(
        "real",
        "real",
        ("NaN", "Infinity", "-Infinity", "-0", "0.1", "3.4028235e+38", "1.1754944e-38", "1e-45"),
    ),
    TypeColumn(
        "double",
        "double precision",
        (
            "NaN",
            "Infinity",
            "-Infinity",
            "-0",
            "0.30000000000000004",
            "1.7976931348623157e+308",
            "2.2250738585072014e-308",
            "5e-324",
            "9007199254740993",
        ),
    ),
    TypeColumn(
        'Order "Total"',
        "numeric",
        (
            "NaN",
            "Infinity",
            "-Infinity",
            "0.0000001",
            "9" * 1000,
            "-1.500",
            "0",
            "1e-20",
            "123456789012345678901234567890.123456789",
        ),
    ),
    TypeColumn("fixed", "numeric(12, 2)", ("0", "-9999999999.99", "1.5")),
    TypeColumn(
        "note",
        "text",
        (
            "",
            "naïve café \u2013 東京 😀",
            "tab\there\nnew line \\ backslash \"quote\" 'apostrophe'",
            "NULL",
            "\\N",
        ),
    ),
    TypeColumn("Long Note", "text", (TOASTED,)),
    TypeColumn("short", "varchar(20)", ("", "ü")),
    TypeColumn("padded", "char(5)", ("ab", "", "abcde")),
    TypeColumn("letter", '"char"', ("a", "", "\\377")),
    TypeColumn("label", "name", ("pg_catalog", "x" * 63)),
    TypeColumn("doc", "json", ('{"k": "é", "n": [1, 2.50, null]}', '"\\u00e9"', "[]", "  {} ")),
    TypeColumn("binary doc", "jsonb", ('{"b": 1, "a": [true, null, "ü"]}', "null", "1e400")),
    TypeColumn(
        "tag",
        "uuid",
        (
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
        ),
    ),
    TypeColumn(
        "day",
        "date",
        (
            "infinity",
            "-infinity",
            "4714-11-24 BC",
            "5874897-12-31",
            "0044-03-15 BC",
            "0001-12-31 BC",
            "0001-01-01",
            "1969-12-31",
            "2024-02-29",
            "9999-12-31",
            "10000-01-01",
        ),
    ),
    TypeColumn(
        "at",
        "timestamp",
        (
            "infinity",
            "-infinity",
            "4714-11-24 00:00:00 BC",
            "294246-12-31 23:59:59.999999",
            "0044-03-15 12:00:00.5 BC",
            "0001-01-01 00:00:00",
            "1969-12-31 23:59:59.999999",
            "2024-02-29 13:05:07.123456",
            "9999-12-31 23:59:59.999999",
            "10000-01-01 00:00:00",
        ),
    ),
    TypeColumn(
        "at zone",
        "timestamptz",
        (
            "infinity",
            "-infinity",
            "4714-11-24 00:00:00+00 BC",
            "294246-12-31 23:59:59.999999+00",
            "0044-03-15 12:00:00+00 BC",
            "2024-02-29 13:05:07.123456+05:30",
            "1969-12-31 23:59:59.999999+00",
            "9999-12-31 23:59:59.999999+00",
            "10000-01-01 00:00:00-03",
        ),
    ),
    TypeColumn("clock", "time", ("00:00:00", "24:00:00", "23:59:59.999999", "13:05:07.5")),
    TypeColumn("clock zone", "timetz", ("00:00:00+1559", "24:00:00-1559", "13:05:07.1+05:30")),
    TypeColumn(
        "span",
        "interval",
        ("0", "1 year 2 mons 3 days 04:05:06.789", "-178000000 years", "-1 days +02:03:04"),
    ),
    TypeColumn("address", "inet", ("192.168.0.1", "::1", "10.0.0.0/8", "2001:db8::1/64")),
    TypeColumn("network", "cidr", ("10.0.0.0/8", "2001:db8::/32")),
    TypeColumn("mac", "macaddr", ("08:00:2b:01:02:03", "ff:ff:ff:ff:ff:ff")),
    TypeColumn("mac8", "macaddr8", ("08:00:2b:01:02:03:04:05",)),
    TypeColumn("markup", "xml", ('<a x="1">é &amp; ü</a>', "plain text", "")),
    TypeColumn("ints", "integer[]", ("{}", "{1,2,NULL}", "{{1,2},{3,4}}", "[0:1]={7,8}")),
    TypeColumn("words", "text[]", ('{"a b","",NULL,"\\"q\\"","NULL","é"}',)),
    TypeColumn("flags", "boolean[]", ("{t,f,NULL}",)),
    TypeColumn("days", "date[]", ('{infinity,-infinity,"0044-03-15 BC"}',)),
    TypeColumn("moments", "timestamptz[]", ('{"2024-02-29 13:05:07+00",-infinity}',)),
    TypeColumn("amounts", "numeric[]", ("{NaN,1.50,-Infinity}",)),
    TypeColumn("floats", "float8[]", ("{NaN,-0,Infinity,0.1}",)),
    TypeColumn("blobs", "bytea[]", ('{"\\\\x00ff",NULL}',)),
    TypeColumn("mood", "cdc_mood", ("sad", 'a "b" c')),
    TypeColumn("moods", "cdc_mood[]", ('{happy,"a \\"b\\" c"}',)),
    TypeColumn("positive", "cdc_positive", ("1", "2147483647")),
    TypeColumn("deadline", "cdc_day", ("infinity", "0044-03-15 BC", "2024-02-29")),
    TypeColumn("codes", "cdc_codes", ("{a,b}", "{}")),
)
#: Row 0 (all NULL) and one row per edge value of the column that has most.
ROWS = 1 + max(len(column.values) for column in TYPE_COLUMNS)


def literal(value: str) -> str:
    """``value`` as an SQL string literal (standard_conforming_strings on)."""
    return "'" + value.replace("'", "''") + "'"


def create_types_table(url: str, table: str = "every_type") -> None:
    """Create ``table`` (dropping one of that name, and creating the enum and domains of
    ``TYPES`` if missing) with an ``id`` primary key and ``TYPE_COLUMNS``, and fill its
    ``ROWS`` rows."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            for statement in TYPES:
                escaped = statement.replace("'", "''")
                connection.execute(
                    text(f"DO 'BEGIN {escaped}; EXCEPTION WHEN duplicate_object THEN NULL; END'")
                )
            columns = ", ".join(f"{c.sql} {c.sql_type}" for c in TYPE_COLUMNS)
            connection.execute(text(f"DROP TABLE IF EXISTS {table}"))
            connection.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, {columns})"))
            connection.execute(
                text(f'ALTER TABLE {table} ALTER COLUMN "Long Note" SET STORAGE EXTERNAL')
            )
            names = ", ".join(c.sql for c in TYPE_COLUMNS)
            for row in range(ROWS):
                values = [
                    literal(c.values[row - 1]) if 0 < row <= len(c.values) else "NULL"
                    for c in TYPE_COLUMNS
                ]
                connection.exec_driver_sql(
                    f"INSERT INTO {table} (id, {names}) VALUES ({row}, {', '.join(values)})"
                )
    finally:
        engine.dispose()
