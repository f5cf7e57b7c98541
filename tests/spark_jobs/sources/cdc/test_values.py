"""Reading PostgreSQL's text as values and writing Arrow arrays back as text: alone, then
every supported type's edge values through a real PostgreSQL and back."""

import re
from decimal import Decimal

import pyarrow as pa
import pytest
from sqlalchemy import text

from spark_jobs.sources.cdc.describe import describe_table
from spark_jobs.sources.cdc.messages import UNCHANGED
from spark_jobs.sources.cdc.table import TableColumn, TableShape
from spark_jobs.sources.cdc.values import (
    DATE_INFINITY,
    DATE_MINUS_INFINITY,
    READERS,
    TIMESTAMP_INFINITY,
    TIMESTAMP_MINUS_INFINITY,
    NumericKey,
    date_text,
    postgres_text,
    read_bool,
    read_bytea,
    read_column,
    read_date,
    read_numeric_key,
    read_padded_key,
    read_timestamp,
    read_timestamptz,
    timestamp_text,
    timestamptz_text,
)
from tests.support.cdc_types import (
    OUTPUT_SETTINGS,
    TYPE_COLUMNS,
    create_types_table,
    output_text,
)

DAY_US = 86_400_000_000


@pytest.mark.parametrize(("text", "value"), [("t", True), ("f", False), ("true", True)])
def test_bool_reads_its_output_and_its_cast_to_text(text, value):
    assert read_bool(text) is value


@pytest.mark.parametrize(
    ("text", "days"),
    [
        ("1970-01-01", 0),
        ("2024-02-29", 19_782),
        ("1969-12-31", -1),
        ("0001-01-01", -719_162),
        ("0001-12-31 BC", -719_163),
        ("0044-03-15 BC", -735_160),
        ("4714-11-24 BC", -2_440_588),
        ("10000-01-01", 2_932_897),
        ("5874897-12-31", 2_145_042_905),
        ("infinity", DATE_INFINITY),
        ("-infinity", DATE_MINUS_INFINITY),
    ],
)
def test_a_date_is_days_since_1970_and_writes_back_as_the_servers_text(text, days):
    assert read_date(text) == days
    assert date_text(days) == text


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("1970-01-01 00:00:00", 0),
        ("1969-12-31 23:59:59.999999", -1),
        ("2024-02-29 13:05:07.5", 19_782 * DAY_US + 47_107_500_000),
        ("0044-03-15 12:00:00 BC", -735_160 * DAY_US + 43_200_000_000),
        ("4714-11-24 00:00:00 BC", -2_440_588 * DAY_US),
        ("294246-12-31 23:59:59.999999", 106_751_982 * DAY_US - 1),
        ("infinity", TIMESTAMP_INFINITY),
        ("-infinity", TIMESTAMP_MINUS_INFINITY),
    ],
)
def test_a_timestamp_is_microseconds_since_1970_with_or_without_zone(text, micros):
    assert read_timestamp(text) == micros
    assert timestamp_text(micros) == text
    zoned = text if "infinity" in text else re.sub(r"( BC)?$", r"+00\1", text, count=1)
    assert read_timestamptz(zoned) == micros
    assert timestamptz_text(micros) == zoned


@pytest.mark.parametrize(
    "text",
    ["2024-02-29 14:35:07.5+01:30", "2024-02-29 14:35:07.5+01:30:00", "2024-02-29 13:05:07.5+00"],
)
def test_a_timestamptz_in_any_offset_is_the_same_instant(text):
    assert read_timestamptz(text) == read_timestamptz("2024-02-29 13:05:07.500000+00")
    assert read_timestamptz("0044-03-15 14:00:00+02 BC") == read_timestamp("0044-03-15 12:00:00 BC")


def test_a_timestamp_past_64_bit_microseconds_is_refused_with_the_range():
    message = r"outside .* to 294247-01-10 04:00:54\.775806 UTC.*294276 AD"
    with pytest.raises(ValueError, match=message):
        read_timestamp("294247-01-10 04:00:54.775807")  # would be infinity
    with pytest.raises(ValueError, match=message):
        read_timestamptz("294276-12-31 23:59:59.999999+00")


@pytest.mark.parametrize(
    ("reader", "text", "message"),
    [
        (read_bool, "yes", "expected 't', 'f', 'true' or 'false'"),
        (read_bytea, "\\001", r"without the \\x of bytea_output = hex"),
        (read_date, "2024-02-30", "day is out of range"),
        (read_date, "0000-01-01", "year 0"),
        (read_date, "24/02/29", r"expected YYYY-MM-DD"),
        (read_timestamp, "2024-02-29 13:05:07+00", r"expected 'YYYY-MM-DD HH:MM:SS\[\.ffffff\]\["),
        (read_timestamptz, "0044-03-15 12:00:00 BC", r"HH:MM:SS\[\.ffffff\]\+HH"),
        (read_numeric_key, "abc", "ConversionSyntax"),
        (read_numeric_key, "inf", "expected digits, 'NaN', 'Infinity' or '-Infinity'"),
    ],
)
def test_text_a_reader_cannot_read_is_an_error(reader, text, message):
    with pytest.raises((ValueError, ArithmeticError), match=message):
        reader(text)


def test_numeric_keys_order_as_postgres_orders_numeric():
    texts = ["NaN", "Infinity", "1e-20", "-Infinity", "1.00", "0.0000001", "-5", "9" * 1000]
    keys = sorted(read_numeric_key(t) for t in texts)
    assert [str(k) for k in keys] == [
        "-Infinity",
        "-5",
        "1e-20",
        "0.0000001",
        "1.00",
        "9" * 1000,
        "Infinity",
        "NaN",
    ]
    assert read_numeric_key("1.0") == read_numeric_key("1.00")
    assert hash(read_numeric_key("1.0")) == hash(read_numeric_key("1.00"))
    assert read_numeric_key("NaN") == NumericKey(2, Decimal(0), "NaN")
    assert (read_numeric_key("2"),) < (read_numeric_key("NaN"),)


def test_char_keys_order_as_postgres_orders_them_under_a_byte_collation(database):
    """bpchar compares without the padding: 'a' sorts before 'a' || chr(1), whose padded
    bytes ('a\x01 ') sort before the padded 'a  '."""
    values = ["a", "a\x01", "ab", "a\t", "", "b", "\x7f", "é"]
    with database.connect() as connection:
        ordered = connection.execute(
            text(
                'SELECT v::char(3) COLLATE "C" AS k FROM unnest(CAST(:values AS text[])) v '
                "ORDER BY k"
            ),
            {"values": values},
        ).scalars()
        server = [key for key in ordered]
    assert [str(key) for key in sorted(read_padded_key(k) for k in server)] == server
    assert read_padded_key("a  ") == read_padded_key("a") and str(read_padded_key("a  ")) == "a  "


def test_a_changes_row_reads_by_its_columns_types_and_numeric_keys_order():
    shape = TableShape(
        1,
        "public.t",
        (
            TableColumn("id", "id", 1700, "numeric"),
            TableColumn("price", "price", 1700, "numeric"),
            TableColumn("at", "at", 1082, "date"),
        ),
        ("id",),
    )
    row = shape.typed_change({"id": "NaN", "price": "0.0000001", "at": "infinity"})
    assert row == {"id": read_numeric_key("NaN"), "price": "0.0000001", "at": DATE_INFINITY}
    assert shape.typed_change({"id": "1", "price": None, "at": UNCHANGED}) == {
        "id": read_numeric_key("1"),
        "price": None,
        "at": UNCHANGED,
    }


def test_an_unreadable_value_in_a_change_names_the_table_column_and_key():
    shape = TableShape(
        1,
        "shop.orders",
        (
            TableColumn("id", "id", 23, "integer"),
            TableColumn("day", "day", 1082, "date"),
            TableColumn("at", "at", 1114, "timestamp without time zone"),
        ),
        ("id", "day"),
    )
    change = {"id": "7", "day": "2024-02-29", "at": "294250-01-01 00:00:00"}
    with pytest.raises(ValueError) as error:
        shape.typed_change(change)
    message = str(error.value)
    assert message.startswith("table shop.orders, row with key (id, day)=(7, 2024-02-29): ")
    assert "cannot read column 'at' = '294250-01-01 00:00:00' as timestamp" in message
    with pytest.raises(ValueError) as error:
        shape.typed_change({"id": "x" * 100, "day": UNCHANGED})
    shown = "x" * 60 + "..."
    assert f"key (id, day)=({shown}, ?): cannot read column 'id' = '{shown}' as" in str(error.value)


def test_arrays_are_written_whole_and_in_chunks_nulls_kept():
    days = pa.array([0, None, DATE_INFINITY, -735_160, 2_932_897], pa.date32())
    assert postgres_text(days, 1082).to_pylist() == [
        "1970-01-01",
        None,
        "infinity",
        "0044-03-15 BC",
        "10000-01-01",
    ]
    chunked = pa.chunked_array([days.slice(2), pa.array([], pa.date32())])
    assert postgres_text(chunked, 1082).to_pylist() == ["infinity", "0044-03-15 BC", "10000-01-01"]
    raw = pa.array([b"", None, b"\x00\xffa", b"z"], pa.binary()).slice(1)
    assert postgres_text(raw, 17).to_pylist() == [None, "\\x00ff61", "\\x7a"]
    micros = pa.array([None, TIMESTAMP_MINUS_INFINITY, 1], pa.timestamp("us", tz="UTC"))
    assert postgres_text(micros, 1184).to_pylist() == [
        None,
        "-infinity",
        "1970-01-01 00:00:00.000001+00",
    ]
    floats = pa.array([float("nan"), float("-inf"), -0.0, 0.1, None], pa.float32())
    assert postgres_text(floats, 700).to_pylist() == ["NaN", "-Infinity", "-0", "0.1", None]
    assert postgres_text(pa.array([True, None, False]), 16).to_pylist() == ["t", None, "f"]
    assert postgres_text(pa.array([-(2**63), None], pa.int64()), 20).to_pylist() == [
        str(-(2**63)),
        None,
    ]
    assert postgres_text(pa.array(["{1,2}", None]), 1007).to_pylist() == ["{1,2}", None]


@pytest.mark.parametrize(
    ("oid", "arrow", "texts"),
    [
        (16, pa.bool_(), ["t", "f", None, "true", "false"]),
        (21, pa.int16(), ["-32768", "32767", None]),
        (20, pa.int64(), ["-9223372036854775808", "9223372036854775807", None]),
        (700, pa.float32(), ["NaN", "Infinity", "-Infinity", "-0", "1e-45", "3.4028235e+38"]),
        (701, pa.float64(), ["5e-324", "0.30000000000000004", "9007199254740993", None]),
        (1082, pa.date32(), ["2024-02-29", "infinity", "-infinity", "0044-03-15 BC", None]),
        (1082, pa.date32(), ["10000-01-01", "0001-01-01", "9999-12-31"]),
        (1114, pa.timestamp("us"), ["2024-01-02 03:04:05.5", "0044-03-15 12:00:00 BC", None]),
        (1114, pa.timestamp("us"), ["infinity", "-infinity", "12024-01-02 00:00:00.000001"]),
        (1184, pa.timestamp("us", tz="UTC"), ["2024-01-02 03:04:05+00", "infinity", None]),
        (
            1184,
            pa.timestamp("us", tz="UTC"),
            ["2024-01-02 03:04:05+05:30", "0001-01-01 00:00:00+00 BC"],
        ),
        (17, pa.binary(), ["\\x", "\\x00ff", None]),
        (25, pa.string(), ["", "a 'b' \"c\"", None]),
    ],
)
def test_a_column_at_a_time_reads_what_its_values_read_one_by_one(oid, arrow, texts):
    read = READERS.get(oid, str)  # text types stay the server's text
    one_by_one = pa.array([None if t is None else read(t) for t in texts], arrow)
    at_once = read_column(pa.array(texts, pa.string()), oid, arrow)
    assert at_once.type == arrow
    # Compared as text: NaN equals itself there, and -0 differs from 0.
    assert postgres_text(at_once, oid).to_pylist() == postgres_text(one_by_one, oid).to_pylist()


def test_a_column_value_no_reader_reads_names_its_column_and_row():
    shape = TableShape(
        10,
        "public.items",
        (TableColumn("id", "id", 23, "integer"), TableColumn("due day", '"due day"', 1082, "date")),
        ("id",),
    )
    texts = pa.table({"id": ["1", "2"], "due": ["2024-01-01", "2024-13-01"]})
    with pytest.raises(
        ValueError, match=r"row with key \(id\)=\(2\): cannot read column 'due day'"
    ):
        shape.typed_table(texts)


#: Arrow types a SQLite target takes as values; every other value goes there as text.
SQLITE_NATIVE = {pa.bool_(), pa.binary(), pa.int16(), pa.int32(), pa.int64(), pa.float32(),
                 pa.float64()}  # fmt: skip


def test_every_supported_type_round_trips_through_arrow_to_the_server(logical_server, database):
    """Each edge value of ``cdc_types``: the server's text, read, held in Arrow, written as
    text and cast back on the server, gives the server the very value (its text equal)."""
    create_types_table(logical_server.url, "round_trip")
    shape = describe_table(database, "round_trip")
    with database.connect() as connection:
        for setting in OUTPUT_SETTINGS:
            connection.execute(text(setting))
        texts = connection.execute(
            text(f"SELECT {', '.join(output_text(c.sql) for c in shape.columns)} FROM round_trip")
        ).all()
        rows = [shape.typed_row(values) for values in texts]
        arrays = shape.arrow_columns(rows)
        columns = list(zip(*texts, strict=True))
        at_once = shape.typed_table(
            pa.table([pa.array(c, pa.string()) for c in columns], names=list(arrays))
        )
        ids = arrays["id"].to_pylist()
        for column in shape.columns:
            written = postgres_text(arrays[column.name], column.kind.oid).to_pylist()
            # Read a column at a time (the snapshot's way), the same values.
            assert at_once.column(column.name).type == arrays[column.name].type, column.name
            assert postgres_text(at_once.column(column.name), column.kind.oid).to_pylist() == (
                written
            ), column.name
            back = output_text(f"CAST(w.value AS {column.type_name})")
            differing = connection.execute(
                text(
                    f"SELECT t.id, {output_text(f't.{column.sql}')} AS original, w.value, "
                    f"{back} AS back FROM round_trip t JOIN unnest(CAST(:ids AS int[]), "
                    "CAST(:values AS text[])) AS w(id, value) ON w.id = t.id "
                    f"WHERE {output_text(f't.{column.sql}')} IS DISTINCT FROM {back}"
                ),
                {"ids": ids, "values": written},
            ).all()
            assert differing == [], column.name
            if column.kind.arrow not in SQLITE_NATIVE:
                # A SQLite target keeps this text itself: it must be the server's, to the letter.
                original = [row[shape.columns.index(column)] for row in texts]
                assert written == original, column.name
    assert {c.name for c in shape.columns} == {"id", *(c.name for c in TYPE_COLUMNS)}


def test_dates_and_timestamps_write_back_exactly_the_servers_text(logical_server, database):
    """What keys are written as in JSON is the server's own text, BC and infinity included."""
    create_types_table(logical_server.url, "temporal")
    writers = {"date": (read_date, date_text), "timestamp": (read_timestamp, timestamp_text)}
    writers["timestamptz"] = (read_timestamptz, timestamptz_text)
    with database.connect() as connection:
        for setting in OUTPUT_SETTINGS:
            connection.execute(text(setting))
        for column in TYPE_COLUMNS:
            if column.sql_type not in writers:
                continue
            read, write = writers[column.sql_type]
            found = connection.execute(
                text(f"SELECT {output_text(column.sql)} FROM temporal WHERE {column.sql} NOTNULL")
            ).scalars()
            for value in found:
                assert write(read(value)) == value
