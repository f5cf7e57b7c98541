"""PostgreSQL's text output as Python values, by type OID, and Arrow arrays back as its input text.

The snapshot and the decoder keep column values as the text each type's output function
writes; this is the one place that reads it, so a type gets one reading everywhere, and the
one place that writes values back for PostgreSQL to read. It expects text written under
``DateStyle`` ISO, ``TimeZone`` UTC, ``bytea_output`` hex, ``extra_float_digits`` 1 and
``IntervalStyle`` postgres, as ``slot.py`` sets them. A type not in ``READERS`` stays the
server's text, which PostgreSQL reads back to the same value.

Dates and timestamps are counts, as PostgreSQL and Arrow both keep them, so that infinity,
BC and years past 9999 (everyday PostgreSQL values Python's ``datetime`` cannot hold) are
read like any other: a date is days since 1970-01-01 in the proleptic Gregorian calendar,
'infinity' and '-infinity' the int32 extremes; a timestamp, with time zone or without, is
microseconds since 1970-01-01 00:00:00 UTC, 'infinity' and '-infinity' the int64 extremes.
Integers order as PostgreSQL orders these types, infinities included.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.sources.cdc.messages import Value

Reader = Callable[[str], Any]

DATE_INFINITY, DATE_MINUS_INFINITY = 2**31 - 1, -(2**31)
TIMESTAMP_INFINITY, TIMESTAMP_MINUS_INFINITY = 2**63 - 1, -(2**63)

_BOOLS = {"t": True, "f": False, "true": True, "false": False}
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_DAY_US = 86_400_000_000
#: Days in 400 Gregorian years: a date is moved by whole cycles into the years ``date`` holds.
_CYCLE_DAYS = 146_097
_DATE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?")
_TIMESTAMP = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?"
)
_DATE_SENTINELS = {"infinity": DATE_INFINITY, "-infinity": DATE_MINUS_INFINITY}
_TIMESTAMP_SENTINELS = {"infinity": TIMESTAMP_INFINITY, "-infinity": TIMESTAMP_MINUS_INFINITY}
_NUMERIC_RANKS = {"-Infinity": -1, "Infinity": 1, "NaN": 2}


def read_bool(text: str) -> bool:
    """'t' or 'f' (bool's output function), or 'true' or 'false' (its cast to text)."""
    try:
        return _BOOLS[text]
    except KeyError:
        raise ValueError("expected 't', 'f', 'true' or 'false'") from None


def read_bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError("bytea text without the \\x of bytea_output = hex")
    return bytes.fromhex(text[2:])


def read_date(text: str) -> int:
    """Days since 1970-01-01: 'YYYY-MM-DD', with ' BC' or not, or ±'infinity'."""
    try:
        return date.fromisoformat(text).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return _rare_date(text)


def read_timestamp(text: str) -> int:
    """Microseconds since 1970-01-01 00:00:00: 'YYYY-MM-DD HH:MM:SS[.ffffff][ BC]' or
    ±'infinity'."""
    try:
        return (datetime.fromisoformat(text) - _EPOCH) // _MICROSECOND
    except (ValueError, TypeError):  # TypeError: the text has a UTC offset
        return _rare_timestamp(text, zoned=False)


def read_timestamptz(text: str) -> int:
    """Microseconds since 1970-01-01 00:00:00 UTC: as ``read_timestamp``, with the UTC offset
    after the time ('+00' under TimeZone UTC)."""
    try:
        return (datetime.fromisoformat(text) - _EPOCH_UTC) // _MICROSECOND
    except (ValueError, TypeError):  # TypeError: the text has no UTC offset
        return _rare_timestamp(text, zoned=True)


@dataclass(frozen=True, order=True)
class NumericKey:
    """A numeric key value, equal and ordered as PostgreSQL orders numeric: -Infinity, the
    finite values (1.0 = 1.00), Infinity, NaN. ``str`` gives the server's text."""

    rank: int
    value: Decimal
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


def read_numeric_key(text: str) -> NumericKey:
    rank = _NUMERIC_RANKS.get(text)
    if rank is not None:
        return NumericKey(rank, Decimal(0), text)
    value = Decimal(text)
    if not value.is_finite():
        raise ValueError("expected digits, 'NaN', 'Infinity' or '-Infinity'")
    return NumericKey(0, value, text)


#: Type OID -> reader of its text, for the types not kept as text. A float4's text (the
#: shortest that reads back, at most 9 digits) reads to the same float4 through a double: no
#: such text lies within a double's rounding of a point halfway between two float4s.
READERS: Mapping[int, Reader] = {
    16: read_bool,
    17: read_bytea,
    20: int,
    21: int,
    23: int,
    700: float,
    701: float,
    1082: read_date,
    1114: read_timestamp,
    1184: read_timestamptz,
}


@dataclass(frozen=True, order=True)
class PaddedKey:
    """A ``char(n)`` key value, equal and ordered as PostgreSQL compares ``bpchar`` under a
    byte-ordered collation: without its trailing spaces, which pad it and mean nothing.
    ``str`` gives the server's text, padding and all."""

    value: str
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


def read_padded_key(text: str) -> PaddedKey:
    return PaddedKey(text.rstrip(" "), text)


#: Type OID -> reader of its text in a primary-key column, where it must order as on the server.
KEY_READERS: Mapping[int, Reader] = {1700: read_numeric_key, 1042: read_padded_key}


def read_column(texts: pa.Array, type_oid: int, arrow_type: pa.DataType) -> pa.Array:
    """A column of the server's text (null for NULL) as ``arrow_type``: the values ``READERS``
    give one by one, read a column at a time. Arrow's casts read the common values and the
    readers only the rare ones (infinity, BC, years past 9999); text a cast refuses goes to
    the reader, value by value, which raises ValueError for what it cannot read either."""
    read = READERS.get(type_oid)
    if read is None:
        return texts
    cast = _CASTS.get(type_oid)
    if cast is not None:
        try:
            return cast(texts, arrow_type)
        except pa.ArrowInvalid:
            pass
    return pa.array([None if v is None else read(v) for v in texts.to_pylist()], arrow_type)


def _cast(texts: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    return texts.cast(arrow_type)


def _cast_bool(texts: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    true = pc.or_(pc.equal(texts, "t"), pc.equal(texts, "true"))
    false = pc.or_(pc.equal(texts, "f"), pc.equal(texts, "false"))
    if pc.any(pc.invert(pc.or_(true, false))).as_py():
        raise pa.ArrowInvalid("not a bool's text")
    return true


def _cast_counts(
    texts: pa.Array, arrow_type: pa.DataType, counts: pa.DataType, placeholder: str, read: Reader
) -> pa.Array:
    """Dates or timestamps: ISO text of years 0001-9999 by Arrow's cast, the rest (infinity,
    BC, five-digit years) by ``read`` into ``counts`` (days or microseconds)."""
    iso = pc.and_(
        pc.match_substring_regex(texts, r"^[0-9]{4}-"), pc.invert(pc.ends_with(texts, " BC"))
    )
    rare = pc.fill_null(pc.invert(iso), False)
    values = pc.if_else(rare, placeholder, texts).cast(arrow_type).cast(counts)
    if pc.any(rare).as_py():
        spelled = [read(text) for text in texts.filter(rare).to_pylist()]
        values = pc.replace_with_mask(values, rare, pa.array(spelled, counts))
    return values.cast(arrow_type)


_CASTS: Mapping[int, Callable[[pa.Array, pa.DataType], pa.Array]] = {
    16: _cast_bool,
    20: _cast,
    21: _cast,
    23: _cast,
    700: _cast,
    701: _cast,
    1082: lambda texts, t: _cast_counts(texts, t, pa.int32(), "1970-01-01", read_date),
    1114: lambda texts, t: _cast_counts(
        texts, t, pa.int64(), "1970-01-01 00:00:00", read_timestamp
    ),
    1184: lambda texts, t: _cast_counts(
        texts, t, pa.int64(), "1970-01-01 00:00:00+00", read_timestamptz
    ),
}


def unreadable(
    table: str,
    key: Sequence[str],
    row: Mapping[str, Value],
    types: Mapping[str, tuple[str, Reader]],
) -> ValueError | None:
    """The error for the first value of ``row`` that its reader (in ``types``, with its type's
    name) refuses: it names the table, the column, the row's key (the key columns' text, '?'
    where the row has none) and the value. None if every value reads."""
    for name, value in row.items():
        type_name, read = types[name]
        if value.__class__ is not str:
            continue
        try:
            read(value)
        except (ValueError, ArithmeticError) as error:
            values = ", ".join(_key_text(row.get(k)) for k in key)
            return ValueError(
                f"table {table}, row with key ({', '.join(key)})=({values}): cannot read column "
                f"{name!r} = {_shortened(value)!r} as {type_name}: {_shortened(str(error), 200)}"
            )
    return None


def _key_text(value: Value) -> str:
    if value is None:
        return "NULL"
    return _shortened(value) if isinstance(value, str) else "?"


def _shortened(text: str, length: int = 60) -> str:
    return text if len(text) <= length else text[:length] + "..."


def _days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a date in any astronomical year (1 BC is year 0)."""
    cycles = (year - 2000) // 400
    ordinal = date(year - 400 * cycles, month, day).toordinal()
    return ordinal - _EPOCH_ORDINAL + cycles * _CYCLE_DAYS


def _civil(days: int) -> tuple[int, int, int]:
    """The astronomical year, month and day ``days`` after 1970-01-01."""
    cycles = days // _CYCLE_DAYS
    found = date.fromordinal(_EPOCH_ORDINAL + days - cycles * _CYCLE_DAYS)
    return found.year + 400 * cycles, found.month, found.day


def _year(digits: str, bc: str | None) -> int:
    year = int(digits)
    if year == 0:
        raise ValueError("year 0 does not exist (1 BC precedes 1 AD)")
    return 1 - year if bc else year


def _rare_date(text: str) -> int:
    """A date Python's ``date`` cannot hold: infinity, BC, a year past 9999."""
    if text in _DATE_SENTINELS:
        return _DATE_SENTINELS[text]
    match = _DATE.fullmatch(text)
    if match is None:
        raise ValueError("expected YYYY-MM-DD, 'YYYY-MM-DD BC' or ±'infinity' (DateStyle ISO)")
    year, month, day, bc = match.groups()
    return _days(_year(year, bc), int(month), int(day))


def _rare_timestamp(text: str, zoned: bool) -> int:
    """A timestamp Python's ``datetime`` cannot hold: infinity, BC, a year past 9999."""
    if text in _TIMESTAMP_SENTINELS:
        return _TIMESTAMP_SENTINELS[text]
    match = _TIMESTAMP.fullmatch(text)
    if match is None or (match[8] is not None) != zoned:
        offset = "+HH[:MM[:SS]]" if zoned else ""
        raise ValueError(
            f"expected 'YYYY-MM-DD HH:MM:SS[.ffffff]{offset}[ BC]' or ±'infinity' (DateStyle ISO)"
        )
    year, month, day, hour, minute, second, fraction, sign, hours, minutes, seconds, bc = (
        match.groups()
    )
    clock = (int(hour) * 60 + int(minute)) * 60 + int(second)
    if sign is not None:
        offset = (int(hours) * 60 + int(minutes or 0)) * 60 + int(seconds or 0)
        clock -= offset if sign == "+" else -offset
    micros = _days(_year(year, bc), int(month), int(day)) * _DAY_US + clock * 1_000_000
    micros += int((fraction or "").ljust(6, "0"))
    if not TIMESTAMP_MINUS_INFINITY < micros < TIMESTAMP_INFINITY:
        raise ValueError(
            f"outside {timestamp_text(TIMESTAMP_MINUS_INFINITY + 1)} to "
            f"{timestamp_text(TIMESTAMP_INFINITY - 1)} UTC, the timestamps 64 bits of "
            "microseconds since 1970 hold (PostgreSQL's go on to 294276 AD)"
        )
    return micros


def date_text(days: int) -> str:
    """Date text PostgreSQL reads back (and writes, under DateStyle ISO) for ``days``."""
    if days == DATE_INFINITY:
        return "infinity"
    if days == DATE_MINUS_INFINITY:
        return "-infinity"
    year, month, day = _civil(days)
    return _with_era(year, f"-{month:02d}-{day:02d}")


def timestamp_text(micros: int) -> str:
    """Timestamp text PostgreSQL reads back (and writes, under DateStyle ISO) for ``micros``."""
    return _timestamp_text(micros, "")


def timestamptz_text(micros: int) -> str:
    """As ``timestamp_text``, in UTC with its offset '+00' (as under TimeZone UTC)."""
    return _timestamp_text(micros, "+00")


def _timestamp_text(micros: int, zone: str) -> str:
    if micros == TIMESTAMP_INFINITY:
        return "infinity"
    if micros == TIMESTAMP_MINUS_INFINITY:
        return "-infinity"
    days, rest = divmod(micros, _DAY_US)
    seconds, fraction = divmod(rest, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    year, month, day = _civil(days)
    decimals = f".{fraction:06d}".rstrip("0") if fraction else ""
    clock = f"{hour:02d}:{minute:02d}:{second:02d}{decimals}{zone}"
    return _with_era(year, f"-{month:02d}-{day:02d} {clock}")


def _with_era(year: int, rest: str) -> str:
    """An astronomical year and what follows it, as PostgreSQL writes them ('0044-... BC')."""
    return f"{year:04d}{rest}" if year > 0 else f"{1 - year:04d}{rest} BC"


# --- Arrow arrays back to PostgreSQL's text ------------------------------------------------

#: The days and microseconds since 1970 of 0001-01-01 and of the end of 9999-12-31, between
#: which Arrow's cast to string writes the ISO text PostgreSQL reads.
_FIRST_DAY, _LAST_DAY = -719_162, 2_932_896
_FIRST_MICRO, _LAST_MICRO = _FIRST_DAY * _DAY_US, (_LAST_DAY + 1) * _DAY_US - 1
_HEX_PAIRS = pa.array([f"{octet:02x}" for octet in range(256)], pa.string())
_NO_OCTETS = pa.array([], pa.uint8())


def postgres_text(array: pa.Array | pa.ChunkedArray, type_oid: int) -> pa.Array | pa.ChunkedArray:
    """``array`` (a column of ``type_oid``, in the Arrow type ``table.py`` gives it; for a
    domain, pass its base type's OID) as text PostgreSQL's input function reads back to the
    same value; nulls stay null. Dates and timestamps may also come as their int counts.

    Arrow's casts write the common values; only the rare ones (infinity, BC, years past
    9999, NaN and infinite floats) are written one by one."""
    if isinstance(array, pa.ChunkedArray):
        chunks = [postgres_text(chunk, type_oid) for chunk in array.chunks]
        return pa.chunked_array(chunks, pa.string())
    return _WRITERS.get(type_oid, _as_text)(array)


def _as_text(array: pa.Array) -> pa.Array:
    return array.cast(pa.string())


def _bool_text(array: pa.Array) -> pa.Array:
    return pc.if_else(array, "t", "f")


def _bytea_text(array: pa.Array) -> pa.Array:
    """'\\x' and two hex digits per byte: each byte's pair is looked up, then joined per value."""
    binary = array.cast(pa.binary())
    _, offset_buffer, data = binary.buffers()
    offsets = pa.Array.from_buffers(
        pa.int32(), len(binary) + 1, [None, offset_buffer], offset=binary.offset
    )
    end = offsets[-1].as_py()
    octets = pa.Array.from_buffers(pa.uint8(), end, [None, data]) if end else _NO_OCTETS
    digits = pc.binary_join(pa.ListArray.from_arrays(offsets, _HEX_PAIRS.take(octets)), "")
    return pc.if_else(binary.is_valid(), pc.binary_join_element_wise("\\x", digits, ""), None)


def _float_text(array: pa.Array) -> pa.Array:
    """The shortest text that reads back to the same float; NaN and infinities as PostgreSQL
    spells them."""
    rare = pc.fill_null(pc.invert(pc.is_finite(array)), False)
    return _respelled(array.cast(pa.string()), rare, array, _special_float_text)


def _special_float_text(value: float) -> str:
    if value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _date_text(array: pa.Array) -> pa.Array:
    days = array.cast(pa.int32())
    rare = _outside(days, _FIRST_DAY, _LAST_DAY)
    common = pc.if_else(rare, pa.scalar(0, pa.int32()), days).cast(pa.date32()).cast(pa.string())
    return _respelled(common, rare, days, date_text)


def _timestamp_texts(array: pa.Array, zone: str, spell: Callable[[int], str]) -> pa.Array:
    if pa.types.is_timestamp(array.type):
        array = array.cast(pa.timestamp("us", array.type.tz))
    micros = array.cast(pa.int64())
    rare = _outside(micros, _FIRST_MICRO, _LAST_MICRO)
    common = pc.if_else(rare, pa.scalar(0, pa.int64()), micros).cast(pa.timestamp("us"))
    # Arrow writes six decimals; PostgreSQL drops trailing zeros, and a zero fraction.
    text = pc.replace_substring_regex(common.cast(pa.string()), r"\.0+$", "")
    text = pc.replace_substring_regex(text, r"(\.[0-9]*[1-9])0+$", r"\1")
    if zone:
        text = pc.binary_join_element_wise(text, zone, "")
    return _respelled(text, rare, micros, spell)


def _outside(values: pa.Array, first: int, last: int) -> pa.Array:
    """Where ``values`` (not null) are below ``first`` or above ``last``."""
    below_or_above = pc.or_(pc.less(values, first), pc.greater(values, last))
    return pc.fill_null(below_or_above, False)


def _respelled(
    text: pa.Array, rare: pa.Array, values: pa.Array, spell: Callable[[Any], str]
) -> pa.Array:
    """``text`` with the value at each ``rare`` position written by ``spell`` instead."""
    positions = pc.indices_nonzero(rare)
    if len(positions) == 0:
        return text
    spelled = [spell(value) for value in values.take(positions).to_pylist()]
    return pc.replace_with_mask(text, rare, pa.array(spelled, pa.string()))


_WRITERS: Mapping[int, Callable[[pa.Array], pa.Array]] = {
    16: _bool_text,
    17: _bytea_text,
    700: _float_text,
    701: _float_text,
    1082: _date_text,
    1114: lambda array: _timestamp_texts(array, "", timestamp_text),
    1184: lambda array: _timestamp_texts(array, "+00", timestamptz_text),
}
