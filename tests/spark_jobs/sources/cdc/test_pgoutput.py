"""Messages built byte by byte as chapter 55.9 of the PostgreSQL 15 documentation lays them out."""

import struct
from datetime import UTC, datetime

import pytest

from spark_jobs.sources.cdc.messages import (
    UNCHANGED,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Relation,
    Truncate,
    Type,
    Update,
)
from spark_jobs.sources.cdc.pgoutput import PgOutputError, decode

# 2026-11-25 12:34:56.789012 UTC in microseconds since 2000-01-01.
MICROS = 848_925_296_789_012
TIME = datetime(2026, 11, 25, 12, 34, 56, 789012, tzinfo=UTC)


def string(text: str) -> bytes:
    return text.encode() + b"\0"


def tuple_data(*columns: bytes) -> bytes:
    return struct.pack(">h", len(columns)) + b"".join(columns)


def text(value: str) -> bytes:
    data = value.encode()
    return b"t" + struct.pack(">i", len(data)) + data


def binary(value: bytes) -> bytes:
    return b"b" + struct.pack(">i", len(value)) + value


def test_begin():
    data = b"B" + struct.pack(">QqI", 0x16_B374D848, MICROS, 4_000_000_000)
    assert decode(data) == Begin(0x16_B374D848, TIME, 4_000_000_000)


def test_commit():
    data = b"C" + struct.pack(">BQQq", 0, 0x1_00000010, 0x1_00000040, MICROS)
    assert decode(data) == Commit(0, 0x1_00000010, 0x1_00000040, TIME)


def test_a_timestamp_before_2000_is_negative():
    data = b"C" + struct.pack(">BQQq", 0, 1, 2, -1)
    assert decode(data).commit_time == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


def test_origin():
    assert decode(b"O" + struct.pack(">Q", 77) + string("pg_16390")) == Origin(77, "pg_16390")


def test_relation_with_its_columns():
    data = (
        b"R"
        + struct.pack(">I", 16390)
        + string("public")
        + string("accounts")
        + struct.pack(">Bh", ord("d"), 2)
        + struct.pack(">B", 1)
        + string("id")
        + struct.pack(">Ii", 23, -1)
        + struct.pack(">B", 0)
        + string("name")
        + struct.pack(">Ii", 1043, 68)
    )
    relation = decode(data)
    assert relation == Relation(
        16390,
        "public",
        "accounts",
        "d",
        (Column(1, "id", 23, -1), Column(0, "name", 1043, 68)),
    )
    assert [column.is_key for column in relation.columns] == [True, False]
    assert relation.qualified_name == "public.accounts"


def test_a_relation_in_pg_catalog_has_an_empty_namespace():
    data = b"R" + struct.pack(">I", 1) + string("") + string("t") + struct.pack(">Bh", 110, 0)
    assert decode(data).qualified_name == "pg_catalog.t"


def test_type():
    data = b"Y" + struct.pack(">I", 16400) + string("public") + string("mood")
    assert decode(data) == Type(16400, "public", "mood")


def test_insert_with_every_column_kind():
    data = (
        b"I"
        + struct.pack(">I", 16390)
        + b"N"
        + tuple_data(text("42"), b"n", b"u", binary(b"\x00\x01"), text("héllo"), text(""))
    )
    assert decode(data) == Insert(16390, ("42", None, UNCHANGED, b"\x00\x01", "héllo", ""))


def test_update_without_an_old_tuple():
    data = b"U" + struct.pack(">I", 7) + b"N" + tuple_data(text("1"), b"u")
    assert decode(data) == Update(7, ("1", UNCHANGED))


def test_update_with_the_old_key():
    data = b"U" + struct.pack(">I", 7) + b"K" + tuple_data(text("1"), b"n")
    data += b"N" + tuple_data(text("2"), text("x"))
    assert decode(data) == Update(7, ("2", "x"), key=("1", None))


def test_update_with_the_old_row():
    data = b"U" + struct.pack(">I", 7) + b"O" + tuple_data(text("1"), text("a"))
    data += b"N" + tuple_data(text("1"), text("b"))
    assert decode(data) == Update(7, ("1", "b"), old=("1", "a"))


def test_delete_by_key_and_by_old_row():
    key = b"D" + struct.pack(">I", 7) + b"K" + tuple_data(text("1"), b"n")
    old = b"D" + struct.pack(">I", 7) + b"O" + tuple_data(text("1"), text("a"))
    assert decode(key) == Delete(7, key=("1", None))
    assert decode(old) == Delete(7, old=("1", "a"))


def test_truncate_with_its_options():
    data = b"T" + struct.pack(">IBII", 2, 3, 16390, 16400)
    assert decode(data) == Truncate(3, (16390, 16400))


def test_a_memoryview_as_the_driver_returns_bytea():
    data = b"Y" + struct.pack(">I", 1) + string("s") + string("t")
    assert decode(memoryview(data)) == Type(1, "s", "t")


def test_a_logical_message_with_its_flags_prefix_and_content():
    data = b"M" + struct.pack(">BQ", 1, 0x1_0000_00A0) + string("backlog.position.s")
    data += struct.pack(">I", 9) + b"heartbeat"
    assert decode(data) == LogicalMessage(True, 0x1_0000_00A0, "backlog.position.s", b"heartbeat")
    empty = b"M" + struct.pack(">BQ", 0, 5) + string("x") + struct.pack(">I", 0)
    assert decode(empty) == LogicalMessage(False, 5, "x", b"")


@pytest.mark.parametrize("kind", [b"S", b"x", b"\x05"])
def test_an_unknown_message_type_is_named(kind):
    with pytest.raises(PgOutputError, match="unknown pgoutput message type") as error:
        decode(kind + b"\0\0\0\0")
    assert repr(kind) in str(error.value)
    assert "b'B'" in str(error.value)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "an empty pgoutput message"),
        (b"B" + struct.pack(">Qq", 1, 2), r"b'B' message: ends before its fields 'I' at byte 17"),
        (b"C" + struct.pack(">BQQqB", 0, 1, 2, 3, 0), r"b'C' message: 1 bytes left over"),
        (b"O" + struct.pack(">Q", 1) + b"no-end", "without its terminating zero byte"),
        (b"I" + struct.pack(">I", 1) + b"X", r"tuple marker b'X'; expected b'N'"),
        (b"D" + struct.pack(">I", 1) + b"N", r"tuple marker b'N'; expected b'K' or b'O'"),
        (b"U" + struct.pack(">I", 1) + b"Q", r"expected b'K' or b'O' or b'N'"),
        (
            b"U" + struct.pack(">I", 1) + b"K" + tuple_data(b"n") + b"K",
            r"tuple marker b'K'; expected b'N'",
        ),
        (
            b"I" + struct.pack(">I", 1) + b"N" + tuple_data(b"x"),
            r"column kind b'x'; expected b'n', b'u', b't' or b'b'",
        ),
        (
            b"I" + struct.pack(">I", 1) + b"N" + tuple_data(b"t" + struct.pack(">i", 5) + b"ab"),
            "a column of 5 bytes past the message's end",
        ),
        (
            b"I" + struct.pack(">I", 1) + b"N" + tuple_data(b"t" + struct.pack(">i", -1)),
            "a column of -1 bytes",
        ),
        (
            b"I" + struct.pack(">I", 1) + b"N" + tuple_data(b"t" + struct.pack(">i", 1) + b"\xff"),
            "not UTF-8",
        ),
        (b"T" + struct.pack(">IBI", 2, 0, 1), "ends before its fields '2I'"),
        (
            b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 2) + b"n",
            r"ends before its fields 'c' at byte 9",
        ),
        (
            b"I" + struct.pack(">I", 1) + b"N" + tuple_data(b"t" + b"\0\0"),
            r"ends before its fields 'i' at byte 9",
        ),
    ],
)
def test_a_malformed_message_is_an_error_that_says_where(data, problem):
    with pytest.raises(PgOutputError, match=problem):
        decode(data)
