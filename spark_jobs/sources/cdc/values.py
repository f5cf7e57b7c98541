"""PostgreSQL's text output as Python values, by type OID.

The decoder keeps column values as the server's text; this is the one place that reads
them, so a type gets one reading everywhere. It expects text written under ``DateStyle``
ISO, ``TimeZone`` UTC and ``bytea_output`` hex, as ``slot.py`` sets them: in the SQL slot
functions, the output functions run with the calling connection's settings. A type not listed
stays text, as does a value in binary format, which only the ``binary`` option asks for.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from spark_jobs.sources.cdc.messages import Relation, Value


def _bool(text: str) -> bool:
    if text not in ("t", "f"):
        raise ValueError("expected 't' or 'f'")
    return text == "t"


def _timestamptz(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError("bytea text without the \\x of bytea_output = hex")
    return bytes.fromhex(text[2:])


#: Type OID -> (type name, reader of its text), as in ``pg_type``.
READERS: Mapping[int, tuple[str, Callable[[str], Any]]] = {
    16: ("bool", _bool),
    17: ("bytea", _bytea),
    20: ("int8", int),
    21: ("int2", int),
    23: ("int4", int),
    25: ("text", str),
    114: ("json", str),
    700: ("float4", float),
    701: ("float8", float),
    1042: ("bpchar", str),
    1043: ("varchar", str),
    1082: ("date", date.fromisoformat),
    1114: ("timestamp", datetime.fromisoformat),
    1184: ("timestamptz", _timestamptz),
    1700: ("numeric", Decimal),
    2950: ("uuid", uuid.UUID),
    3802: ("jsonb", str),
}


def typed(type_oid: int, value: Value) -> Any:
    """``value`` read as its type's Python value; None and ``UNCHANGED`` stay as they are.

    A value Python cannot hold (a date 'infinity', a year before 1 or after 9999) is an
    error naming it, rather than text in a column of dates.
    """
    entry = READERS.get(type_oid)
    if entry is None or not isinstance(value, str):
        return value
    name, read = entry
    try:
        return read(value)
    except (ValueError, ArithmeticError) as error:
        shown = value if len(value) <= 60 else value[:60] + "..."
        raise ValueError(
            f"cannot read {shown!r} as {name} (type OID {type_oid}): {error}"
        ) from None


def typed_row(relation: Relation, row: Mapping[str, Value]) -> dict[str, Any]:
    """A row by column name, each value read as its column's type."""
    types = {column.name: column.type_oid for column in relation.columns}
    return {name: typed(types[name], value) for name, value in row.items()}
