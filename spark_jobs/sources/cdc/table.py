"""A table as the CDC source holds it: the column types it copies, the shape it checks changes
against, and the one form of its rows.

Every column must be of a type whose values reach a target exactly (``COLUMN_TYPES``): each
is read from its output function's text (``values.py``) into a value Arrow holds exactly, or
kept as that text, which PostgreSQL reads back to the same value. Arrays, enums and domains
follow their elements, labels and base types. ``describe.py`` reads a table's shape from the
catalog and refuses what cannot be copied; the shape then checks every decoded change
against itself (``check_relation``) and the table against what it was when the copy began
(``signature``, ``check_unchanged``).

The described table also gives its rows one form, whether read by a query or decoded from a
change: each value read from its text by its column's reader, and as Arrow arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

import pyarrow as pa

from spark_jobs.sources.cdc.changes import ChangeStreamError
from spark_jobs.sources.cdc.messages import UNCHANGED, Relation, Value
from spark_jobs.sources.cdc.values import (
    KEY_READERS,
    READERS,
    Reader,
    date_text,
    read_column,
    timestamp_text,
    timestamptz_text,
    unreadable,
)

Key = tuple[Any, ...]
Row = dict[str, Any]


@dataclass(frozen=True)
class ColumnType:
    """A supported column type: its name, the Arrow type of its values, the reader of its
    text."""

    oid: int
    name: str
    arrow: pa.DataType
    read: Reader


def _supported(oid: int, name: str, arrow: pa.DataType) -> tuple[int, ColumnType]:
    return oid, ColumnType(oid, name, arrow, READERS.get(oid, str))


#: The built-in types a column may have, by type OID: those Arrow holds exactly as values,
#: every other as the server's text. An array is supported when its element type is, a
#: domain when its base type is, and every enum is: arrays and enums are kept as text, a
#: domain as its base type.
COLUMN_TYPES: Mapping[int, ColumnType] = dict(
    _supported(*supported)
    for supported in (
        (16, "bool", pa.bool_()),
        (17, "bytea", pa.binary()),
        (21, "int2", pa.int16()),
        (23, "int4", pa.int32()),
        (20, "int8", pa.int64()),
        (700, "float4", pa.float32()),
        (701, "float8", pa.float64()),
        (1700, "numeric", pa.string()),
        (25, "text", pa.string()),
        (1043, "varchar", pa.string()),
        (1042, "bpchar", pa.string()),
        (18, '"char"', pa.string()),
        (19, "name", pa.string()),
        (114, "json", pa.string()),
        (3802, "jsonb", pa.string()),
        (142, "xml", pa.string()),
        (2950, "uuid", pa.string()),
        (1082, "date", pa.date32()),
        (1083, "time", pa.string()),
        (1266, "timetz", pa.string()),
        (1114, "timestamp", pa.timestamp("us")),
        (1184, "timestamptz", pa.timestamp("us", tz="UTC")),
        (1186, "interval", pa.string()),
        (869, "inet", pa.string()),
        (650, "cidr", pa.string()),
        (829, "macaddr", pa.string()),
        (774, "macaddr8", pa.string()),
    )
)
#: What arrays and enums are read as.
TEXT = COLUMN_TYPES[25]
SUPPORTED = (
    f"{', '.join(t.name for t in COLUMN_TYPES.values())}, an array of these, an enum, "
    "or a domain over any of these"
)
#: Key column types whose order PostgreSQL and Python agree on, by type OID, with how a key
#: value goes into JSON: ints as they are, the others as text PostgreSQL reads back.
CHUNKABLE: Mapping[int, Callable[[Any], Any]] = {
    20: int,
    21: int,
    23: int,
    1700: str,
    2950: str,
    1082: date_text,
    1114: timestamp_text,
    1184: timestamptz_text,
}
#: Text types, chunkable in byte order (``COLLATE "C"``) in a UTF-8 database only.
TEXT_TYPES = {25: "text", 1043: "varchar", 1042: "char(n)"}
ALLOWED = (
    f"{', '.join(COLUMN_TYPES[oid].name for oid in CHUNKABLE)}, or "
    f"{', '.join(TEXT_TYPES.values())} under a deterministic collation in a database "
    "encoded in UTF8, or a domain over one of these"
)
#: The columns that follow a table's own in the rows of both phases, snapshot and changelog,
#: so that they share one schema: what happened ('snapshot', 'insert', 'update' or 'delete'),
#: at which LSN (a commit's end) and place in its transaction, when (null for a snapshot),
#: and the columns an update left unchanged. Each is named ``_`` and its word, or with as many
#: more underscores as keep all five clear of the table's own column names
#: (``TableShape.change_fields``).
CHANGE_FIELDS = (
    pa.field("op", pa.string()),
    pa.field("lsn", pa.int64()),
    pa.field("seq", pa.int32()),
    pa.field("commit_time", pa.timestamp("us", tz="UTC")),
    pa.field("unchanged", pa.list_(pa.string())),
)
#: One row's values of ``CHANGE_FIELDS``.
ChangeMark = tuple[str, int, int, datetime | None, list[str]]


START_OVER = (
    "start over with a new checkpoint (drop the replication slot and copy the table afresh)"
)
_IDENTITIES = {"d": "DEFAULT", "f": "FULL", "n": "NOTHING", "i": "USING INDEX"}


class TableChangedError(ChangeStreamError):
    """The table was truncated or its shape changed while its changes were read."""


class ValueNotAtHand(ChangeStreamError):
    """An update left a value unsent (TOASTed, unchanged) and moved the row from a key whose
    row is not at hand (``moved_from``, where known): that row must be read too."""

    def __init__(self, message: str, moved_from: Key | None = None):
        super().__init__(message)
        self.moved_from = moved_from


class TableError(ValueError):
    """A table the source cannot copy; the message names it, what is wrong and what is
    allowed."""


@dataclass(frozen=True)
class TableColumn:
    name: str
    #: The name as SQL needs it (``quote_ident``).
    sql: str
    #: The column's own type, as changes name it: a domain's, an enum's, an array's.
    type_oid: int
    #: As SQL spells it (``format_type``), to cast a bound key value to the column's type.
    type_name: str
    #: The type of ``COLUMN_TYPES`` the column is read and written as when not ``type_oid``:
    #: a domain's base type, text for an array or an enum.
    base_oid: int | None = None
    #: The built-in type a target on another server gets where it lacks ``type_name`` (an
    #: enum's or a domain's): the domain's base type, text for an enum, arrays alike.
    portable_type: str | None = None
    #: ``atttypmod``: a length, precision or scale (-1: none), which changes alone narrow.
    type_modifier: int = -1
    #: A stored generated column's expression (``pg_get_expr``), and the columns it reads:
    #: pgoutput sends no value for it, so the source server computes it (``generated.py``).
    generated: str | None = None
    generated_from: tuple[str, ...] = ()
    #: The column's collation, qualified and quoted, where its type has one: what its
    #: values compare and case-map by (an expression over them, say).
    collation: str | None = None
    #: A virtual generated column (PostgreSQL 18): computed when read, never sent.
    virtual: bool = False

    @property
    def kind(self) -> ColumnType:
        """How the column's values are read and held; ``kind.oid`` for ``postgres_text``."""
        return COLUMN_TYPES[self.type_oid if self.base_oid is None else self.base_oid]


_SIGNATURE_FIELDS = {
    "oid": "its OID (the table dropped and created again?) is",
    "columns": "its columns (name, type, type modifier, generated as) are",
    "key": "its primary key is",
    "replica_identity": "its replica identity is",
    "partitions": "its partitions (attached or detached, whose rows no change names) are",
}


def signature_changes(now: Mapping[str, Any], was: Mapping[str, Any]) -> list[str]:
    """What differs between two ``signature``s of a table, each said as it is ``now``."""
    fields = (*_SIGNATURE_FIELDS, *sorted(set(now) | set(was) - set(_SIGNATURE_FIELDS)))
    return [
        f"{_SIGNATURE_FIELDS.get(field, field)} {now.get(field)!r}, not {was.get(field)!r}"
        for field in fields
        if now.get(field) != was.get(field)
    ]


@dataclass(frozen=True)
class TableShape:
    oid: int
    #: ``schema.table``, each part quoted where PostgreSQL needs it.
    name: str
    columns: tuple[TableColumn, ...]
    #: The primary key's column names, in the key's order.
    key: tuple[str, ...]
    #: ``relreplident``: 'd' (the primary key), 'i' (the primary key's own index, which the
    #: server treats as 'd') or 'f' (the whole row).
    replica_identity: str = "d"
    #: A partitioned table's partitions (OIDs, at every level): its changes are published as
    #: the root's (``publish_via_partition_root``), its truncates name the partitions.
    partitions: tuple[int, ...] = ()
    #: Per key column, the byte-ordered collation chunks compare it under, as its OID and
    #: its SQL name (``describe.py``); None for a column of a type without collations.
    key_collations: tuple[tuple[int, str] | None, ...] = ()

    def signature(self) -> dict[str, Any]:
        """What the copy relies on, as JSON: kept at the first start and compared at every
        plan, so a change made while the job ran, or while it was stopped, fails by name."""
        return {
            "table": self.name,
            "oid": self.oid,
            "columns": [[c.name, c.type_name, c.type_modifier, c.generated] for c in self.columns],
            "key": list(self.key),
            "replica_identity": self.replica_identity,
            "partitions": list(self.partitions),
        }

    @property
    def sends_whole_rows(self) -> bool:
        """Whether an update sends the old row whole (REPLICA IDENTITY FULL); else only its
        key, and a large value it leaves unchanged is not sent at all."""
        return self.replica_identity == "f"

    @property
    def generated_columns(self) -> tuple[TableColumn, ...]:
        return tuple(c for c in self.columns if c.generated is not None)

    @property
    def relation_ids(self) -> frozenset[int]:
        """The table's OID and its partitions': a truncate of any of them empties rows of it."""
        return frozenset((self.oid, *self.partitions))

    def check_unchanged(self, kept: Mapping[str, Any]) -> None:
        """Refuse the table if it is no longer what it was when the copy began (``kept``, a
        ``signature``): dropped and created again, other columns, types or type modifiers,
        another key or replica identity. Its chunks and changes would not fit the copy."""
        changed = signature_changes(self.signature(), kept)
        if changed:
            raise TableChangedError(
                f"table {self.name} changed since the copy began: {'; '.join(changed)}; "
                f"{START_OVER}"
            )

    def check_relation(self, relation: Relation, at: str) -> None:
        """Refuse a change decoded with another shape than the one described: other columns
        or types, type modifiers (a narrowed ``varchar(n)``, a numeric's scale), other key
        columns (a new primary key), another replica identity. Its rows would not fit the
        copy's, or an update would not name the row it changes."""
        found = [(c.name, c.type_oid, c.type_modifier, c.is_key) for c in relation.columns]
        identity = self.replica_identity
        expected = [
            (c.name, c.type_oid, c.type_modifier, self.sends_whole_rows or c.name in self.key)
            for c in self.columns
        ]
        # pgoutput leaves generated columns out: before PostgreSQL 18 all, after it the
        # stored ones unless the publication sets publish_generated_columns, virtual ones
        # always.
        published = [e for e, c in zip(expected, self.columns, strict=True) if not c.generated]
        stored = [e for e, c in zip(expected, self.columns, strict=True) if not c.virtual]
        if found in (expected, published, stored) and relation.replica_identity == identity:
            return
        expected = published if len(found) == len(published) else expected
        if relation.replica_identity != identity:
            what = (
                f"its replica identity is {_IDENTITIES.get(relation.replica_identity, '?')}, "
                f"not {_IDENTITIES[identity]}"
            )
        elif [f[:3] for f in found] != [e[:3] for e in expected]:
            what = (
                f"its columns (name, type OID, type modifier) are {[f[:3] for f in found]}, "
                f"not {[e[:3] for e in expected]}"
            )
        else:
            keys = [f[0] for f in found if f[3]]
            what = f"its key columns are {keys}, not {[e[0] for e in expected if e[3]]}"
        raise TableChangedError(
            f"table {self.name} changed {at}: {what} as described when the copy began, so "
            f"its changes no longer fit the copy: {START_OVER}"
        )

    @cached_property
    def change_fields(self) -> tuple[pa.Field, ...]:
        """``CHANGE_FIELDS`` named for this table: ``_op``... unless one of the table's own
        columns has such a name, then ``__op``... and so on."""
        own = {c.name for c in self.columns}
        prefix = "_"
        while any(prefix + field.name in own for field in CHANGE_FIELDS):
            prefix += "_"
        return tuple(field.with_name(prefix + field.name) for field in CHANGE_FIELDS)

    def change_column(self, word: str) -> str:
        """The name of the change column for ``word`` (``op``, ``lsn``, ``seq``...)."""
        (found,) = [f.name for f in self.change_fields if f.name.lstrip("_") == word]
        return found

    @property
    def key_columns(self) -> tuple[TableColumn, ...]:
        by_name = {column.name: column for column in self.columns}
        return tuple(by_name[name] for name in self.key)

    @cached_property
    def _readers(self) -> dict[str, Reader]:
        """Each column's reader by name; a key column's orders as on the server."""
        return {
            c.name: KEY_READERS.get(c.kind.oid, c.kind.read) if c.name in self.key else c.kind.read
            for c in self.columns
        }

    @cached_property
    def _typed_columns(self) -> tuple[tuple[str, Reader], ...]:
        return tuple(self._readers.items())

    def key_of(self, row: Mapping[str, Any]) -> Key:
        return tuple(row[name] for name in self.key)

    def key_row(self, key: Key) -> Row:
        """A row of ``key``, every other column null: what a delete carries."""
        values = dict(zip(self.key, key, strict=True))
        return {c.name: values.get(c.name) for c in self.columns}

    def json_key(self, key: Key | None) -> list[Any] | None:
        """A key for JSON: ints as they are, other values as text PostgreSQL reads back (a
        bound ``CAST(:k AS type)`` reads it)."""
        if key is None:
            return None
        return [
            CHUNKABLE.get(c.kind.oid, str)(v) for c, v in zip(self.key_columns, key, strict=True)
        ]

    def typed_key(self, key: list[Any]) -> Key:
        """A key from ``json_key`` as the values its columns' readers give."""
        if len(key) != len(self.key):
            raise ValueError(
                f"key {key!r} has {len(key)} values; the primary key of {self.name} has "
                f"{len(self.key)}: {list(self.key)}"
            )
        return tuple(self._readers[name](str(v)) for name, v in zip(self.key, key, strict=True))

    def typed_row(self, values: Sequence[str | None]) -> Row:
        """A row of text values (None for NULL), in the table's column order, read as its
        columns' types; an unreadable value is an error naming the column and the row's key."""
        try:
            return {
                name: None if v is None else read(v)
                for (name, read), v in zip(self._typed_columns, values, strict=True)
            }
        except (ValueError, ArithmeticError) as error:
            row = dict(zip(self._readers, values, strict=True))
            raise (self._unreadable(row) or error) from None

    def typed_table(self, texts: pa.Table) -> pa.Table:
        """Rows of text (columns in the table's order, null for NULL) as the table's Arrow
        columns, what ``typed_row`` reads, a column at a time; an unreadable value is an
        error naming the column and the row's key, as ``typed_row`` names it."""
        try:
            arrays = [
                read_column(texts.column(i).combine_chunks(), c.kind.oid, c.kind.arrow)
                for i, c in enumerate(self.columns)
            ]
        except (ValueError, ArithmeticError):
            for values in zip(*texts.to_pydict().values(), strict=True):
                self.typed_row(values)
            raise
        return pa.table(arrays, names=[c.name for c in self.columns])

    def keys_of(self, image: pa.Table) -> list[Key]:
        """Each row's key, as ``key_of`` gives it, from the table's Arrow columns."""
        columns = [_values(image.column(c.name), c, key=True) for c in self.key_columns]
        return list(zip(*columns, strict=True))

    def row_at(self, image: pa.Table, index: int) -> Row:
        """Row ``index`` of the table's Arrow columns, as ``typed_row`` gives it."""
        one = image.slice(index, 1)
        return {c.name: _values(one.column(c.name), c, c.name in self.key)[0] for c in self.columns}

    def typed_change(self, row: Mapping[str, Value]) -> Row:
        """A decoded change's values by column name (all of them, or the key's), read as
        ``typed_row`` reads; None, ``UNCHANGED`` and bytes stay as they are."""
        readers = self._readers
        try:
            return {name: readers[name](v) if v.__class__ is str else v for name, v in row.items()}
        except KeyError:
            unknown = sorted(set(row) - set(readers))
            raise ChangeStreamError(
                f"a change of {self.name} has columns {unknown} it was not described with: the "
                "table changed while it was read; read it afresh"
            ) from None
        except (ValueError, ArithmeticError) as error:
            raise (self._unreadable(row) or error) from None

    def _unreadable(self, row: Mapping[str, Value]) -> ValueError | None:
        by_name = {c.name: c.type_name for c in self.columns}
        types = {name: (by_name[name], read) for name, read in self._readers.items()}
        return unreadable(self.name, self.key, row, types)

    def whole_row(self, new: Mapping[str, Any], before: Row | None) -> Row:
        """A change's typed values in the table's columns; a value an update left unchanged
        (TOASTed) comes from ``before``, the row's image before the change."""
        row = {}
        for column in self.columns:
            if column.generated is not None and column.name not in new:
                row[column.name] = None  # computed by the source (generated.py)
                continue
            if column.name not in new:
                raise ChangeStreamError(
                    f"a change of {self.name} has no column {column.name!r}: the table "
                    "changed while it was read; read it afresh"
                )
            value = new[column.name]
            if value is UNCHANGED:
                if before is None:
                    raise ValueNotAtHand(
                        f"an update of {self.name} moved a row to key "
                        f"{list(self.key_of(new))} and left {column.name!r} (a TOASTed "
                        "value) unchanged, from a key whose row is not at hand"
                    )
                value = before[column.name]
            row[column.name] = value
        return row

    def arrow_columns(self, rows: list[Row]) -> dict[str, pa.Array]:
        """``rows`` (typed values by column name) as one Arrow array per column; a numeric
        key's ``NumericKey`` as its text."""
        arrays = {}
        for column in self.columns:
            values = [row[column.name] for row in rows]
            if column.kind.oid in KEY_READERS:
                values = [None if v is None else str(v) for v in values]
            arrays[column.name] = pa.array(values, column.kind.arrow)
        return arrays

    def arrow_table(self, rows: list[Row], marks: list[ChangeMark]) -> pa.Table:
        """``rows`` and, for each, its ``CHANGE_FIELDS`` values: the one form of both phases."""
        arrays = self.arrow_columns(rows)
        values = list(zip(*marks, strict=True)) or [()] * len(CHANGE_FIELDS)
        for field, column in zip(self.change_fields, values, strict=True):
            arrays[field.name] = pa.array(column, field.type)
        return pa.table(arrays)


def _values(array: pa.ChunkedArray, column: TableColumn, key: bool) -> list[Any]:
    """Arrow values as the readers give them: dates and timestamps as their counts, a numeric
    key as a ``NumericKey``."""
    if pa.types.is_date32(array.type):
        array = array.cast(pa.int32())
    elif pa.types.is_timestamp(array.type):
        array = array.cast(pa.int64())
    values = array.to_pylist()
    read_key = KEY_READERS.get(column.kind.oid) if key else None
    return values if read_key is None else [read_key(v) for v in values]
