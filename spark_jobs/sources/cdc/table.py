"""What a table must be for a chunked snapshot, checked in the catalog before any work starts.

Chunks are ranges of the primary key, read with ``(key) > (:after) ORDER BY key`` on the
server and merged with decoded changes by key in Python. Both sides must order keys the
same way, so every key column must be of a type whose PostgreSQL order is Python's order of
the value ``values.typed`` reads: integers, numeric, uuid (byte order), dates and timestamps,
and text only under a byte-ordered collation ("C" or "POSIX": UTF-8 byte order is code point
order). Other collations order by language rules that Python does not know, and a key
compared both ways would put a row in no chunk or in two. Every key column is checked, not
only the first, because the merge compares whole keys.

A table without a primary key has no key to chunk on (and its updates and deletes carry no
key, unless under REPLICA IDENTITY FULL): it is refused, as is a replica identity that is
neither the primary key nor FULL, since changes must name the key of the row they change.

The described table also gives its rows one form, whether read by a query or decoded from a
change: each value read from its text by ``values.typed``, and as Arrow arrays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import sqlalchemy
from sqlalchemy import text

from spark_jobs.backlog.secrets import redact_text
from spark_jobs.sources.cdc.changes import ChangeStreamError
from spark_jobs.sources.cdc.messages import UNCHANGED
from spark_jobs.sources.cdc.values import typed

Key = tuple[Any, ...]
Row = dict[str, Any]

#: Key column types whose order PostgreSQL and Python agree on, by type OID.
CHUNKABLE = {
    20: "int8",
    21: "int2",
    23: "int4",
    1700: "numeric",
    2950: "uuid",
    1082: "date",
    1114: "timestamp",
    1184: "timestamptz",
}
#: Text types, chunkable under a byte-ordered collation only.
TEXT_TYPES = {25: "text", 1043: "varchar"}
BYTE_ORDERED = ("C", "POSIX")
ALLOWED = (
    f"{', '.join(CHUNKABLE.values())}, or {' or '.join(TEXT_TYPES.values())} with "
    f'collation "C" or "POSIX" (declare the column with COLLATE "C")'
)


#: Types Arrow holds as they are, by type OID; numeric, uuid and the rest are kept as text.
ARROW_TYPES = {
    16: pa.bool_(),
    17: pa.binary(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    700: pa.float32(),
    701: pa.float64(),
    1082: pa.date32(),
    1114: pa.timestamp("us"),
    1184: pa.timestamp("us", tz="UTC"),
}
#: The columns that follow a table's own in the rows of both phases, snapshot and changelog,
#: so that they share one schema: what happened ('snapshot', 'insert', 'update' or 'delete'),
#: at which LSN (a commit's end) and place in its transaction, when (null for a snapshot),
#: and the columns an update left unchanged.
CHANGE_FIELDS = (
    pa.field("_op", pa.string()),
    pa.field("_lsn", pa.int64()),
    pa.field("_seq", pa.int32()),
    pa.field("_commit_time", pa.timestamp("us", tz="UTC")),
    pa.field("_unchanged", pa.list_(pa.string())),
)
#: One row's values of ``CHANGE_FIELDS``.
ChangeMark = tuple[str, int, int, datetime | None, list[str]]


class TableError(ValueError):
    """A table that cannot be read in chunks; the message names it and what is allowed."""


@dataclass(frozen=True)
class TableColumn:
    name: str
    #: The name as SQL needs it (``quote_ident``).
    sql: str
    type_oid: int
    #: As SQL spells it (``format_type``), to cast a bound key value to the column's type.
    type_name: str


@dataclass(frozen=True)
class TableShape:
    oid: int
    #: ``schema.table``, each part quoted where PostgreSQL needs it.
    name: str
    columns: tuple[TableColumn, ...]
    #: The primary key's column names, in the key's order.
    key: tuple[str, ...]

    @property
    def key_columns(self) -> tuple[TableColumn, ...]:
        by_name = {column.name: column for column in self.columns}
        return tuple(by_name[name] for name in self.key)

    def key_of(self, row: Mapping[str, Any]) -> Key:
        return tuple(row[name] for name in self.key)

    def json_key(self, key: Key | None) -> list[Any] | None:
        """A key for JSON: ints as they are, other values as text PostgreSQL reads back."""
        return None if key is None else [v if isinstance(v, int) else str(v) for v in key]

    def typed_key(self, key: list[Any]) -> Key:
        """A key from ``json_key`` as the values ``values.typed`` reads."""
        if len(key) != len(self.key):
            raise ValueError(
                f"key {key!r} has {len(key)} values; the primary key of {self.name} has "
                f"{len(self.key)}: {list(self.key)}"
            )
        return tuple(typed(c.type_oid, str(v)) for c, v in zip(self.key_columns, key, strict=True))

    def chunk_query(self, bounded: bool) -> sqlalchemy.TextClause:
        """At most ``:limit`` rows in key order, after the key ``:k0, :k1, ...`` if
        ``bounded``; every value as its text, for ``typed_row``."""
        # Qualified: an output column (the text) of the same name would order by text.
        key = ", ".join(f"t.{column.sql}" for column in self.key_columns)
        after = ", ".join(f"CAST(:k{i} AS {c.type_name})" for i, c in enumerate(self.key_columns))
        return text(
            f"SELECT {', '.join(f't.{c.sql}::text' for c in self.columns)} FROM {self.name} t "
            f"{f'WHERE ({key}) > ({after}) ' if bounded else ''}ORDER BY {key} LIMIT :limit"
        )

    def typed_row(self, values: Iterable[str | None]) -> Row:
        """A row of text values, in the table's column order, read as its columns' types."""
        return {c.name: typed(c.type_oid, v) for c, v in zip(self.columns, values, strict=True)}

    def whole_row(self, new: Mapping[str, Any], before: Row | None) -> Row:
        """A change's typed values in the table's columns; a value an update left unchanged
        (TOASTed) comes from ``before``, the row's image before the change."""
        row = {}
        for column in self.columns:
            if column.name not in new:
                raise ChangeStreamError(
                    f"a change of {self.name} has no column {column.name!r}: the table "
                    "changed while it was read; read it afresh"
                )
            value = new[column.name]
            if value is UNCHANGED:
                if before is None:
                    raise ChangeStreamError(
                        f"an update of {self.name} key {list(self.key_of(new))} left "
                        f"{column.name!r} unchanged, but no earlier image of the row is at hand"
                    )
                value = before[column.name]
            row[column.name] = value
        return row

    def arrow_columns(self, rows: list[Row]) -> dict[str, pa.Array]:
        """``rows`` (typed values by column name) as one Arrow array per column."""
        arrays = {}
        for column in self.columns:
            values = [row[column.name] for row in rows]
            if column.type_oid in ARROW_TYPES:
                arrays[column.name] = pa.array(values, ARROW_TYPES[column.type_oid])
            else:
                text_values = [None if v is None else str(v) for v in values]
                arrays[column.name] = pa.array(text_values, pa.string())
        return arrays

    def arrow_table(self, rows: list[Row], marks: list[ChangeMark]) -> pa.Table:
        """``rows`` and, for each, its ``CHANGE_FIELDS`` values: the one form of both phases."""
        arrays = self.arrow_columns(rows)
        values = list(zip(*marks, strict=True)) or [()] * len(CHANGE_FIELDS)
        for field, column in zip(CHANGE_FIELDS, values, strict=True):
            arrays[field.name] = pa.array(column, field.type)
        return pa.table(arrays)


_RELATION = text(
    "SELECT c.oid, c.relkind, quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS name, "
    "c.relreplident, (SELECT i.indexrelid::regclass::text FROM pg_index i "
    "  WHERE i.indrelid = c.oid AND i.indisreplident AND NOT i.indisprimary) AS other_index "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.oid = to_regclass(:name)"
)
_COLUMNS = text(
    "SELECT attname, quote_ident(attname) AS sql, atttypid, "
    "format_type(atttypid, atttypmod) AS type_name FROM pg_attribute "
    "WHERE attrelid = :oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
)
_KEY = text(
    "SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod) AS type_name, "
    "coll.collname, "
    "CASE WHEN coll.collprovider = 'd' THEN db.datlocprovider ELSE coll.collprovider END "
    "  AS provider, "
    "CASE WHEN coll.collprovider = 'd' THEN db.datcollate ELSE coll.collcollate END AS locale "
    "FROM pg_index i CROSS JOIN unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, position) "
    "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
    "LEFT JOIN pg_collation coll ON coll.oid = a.attcollation "
    "JOIN pg_database db ON db.datname = current_database() "
    "WHERE i.indrelid = :oid AND i.indisprimary ORDER BY k.position"
)


def describe_table(engine: sqlalchemy.Engine, table: str) -> TableShape:
    """The columns and primary key of ``table`` (``name`` or ``schema.name``, each part as
    written: ``Orders`` is not ``orders``); TableError if it cannot be read in chunks."""
    where = redact_text(engine.url.render_as_string(hide_password=False))
    quote = engine.dialect.identifier_preparer.quote
    with engine.connect() as connection:
        found = connection.execute(
            _RELATION, {"name": ".".join(quote(part) for part in table.split("."))}
        ).first()
        if found is None or found.relkind != "r":
            what = "no table" if found is None else f"relation {found.name} is not a table, and"
            raise TableError(f"{what} {table!r} on {where}: a snapshot reads an ordinary table")
        columns = connection.execute(_COLUMNS, {"oid": found.oid}).all()
        key = connection.execute(_KEY, {"oid": found.oid}).all()
    if not key:
        raise TableError(
            f"table {found.name} has no primary key; reading it in chunks needs one "
            f"(ALTER TABLE {found.name} ADD PRIMARY KEY (...))"
        )
    if found.relreplident == "n" or found.other_index is not None:
        identity = "NOTHING" if found.relreplident == "n" else f"USING INDEX {found.other_index}"
        raise TableError(
            f"table {found.name} has REPLICA IDENTITY {identity}: its updates and deletes would "
            "not name the primary key of the row they change; use REPLICA IDENTITY DEFAULT"
        )
    for column in key:
        _check_key_column(found.name, column)
    return TableShape(
        found.oid,
        found.name,
        tuple(TableColumn(c.attname, c.sql, c.atttypid, c.type_name) for c in columns),
        tuple(column.attname for column in key),
    )


def _check_key_column(table: str, column: sqlalchemy.Row) -> None:
    if column.atttypid in CHUNKABLE:
        return
    if column.atttypid in TEXT_TYPES:
        if column.provider == "c" and column.locale in BYTE_ORDERED:
            return
        source = f"libc locale {column.locale!r}" if column.provider == "c" else "ICU"
        raise TableError(
            f"table {table}: primary-key column {column.attname!r} is {column.type_name} with "
            f"collation {column.collname!r} ({source}), which does not order by bytes; "
            f"a key column must be {ALLOWED}"
        )
    raise TableError(
        f"table {table}: primary-key column {column.attname!r} is {column.type_name}, which "
        f"cannot be chunked; a key column must be {ALLOWED}"
    )
