"""A batch's change rows moved in bulk into a temporary table of the target database.

The rows arrive as Arrow pieces of bounded size and go in one statement per piece: ``COPY``
on PostgreSQL, ``executemany`` on SQLite, never a statement per row. On PostgreSQL every
value travels as the text PostgreSQL itself reads back (``values.postgres_text``) and is cast
to the column's type when merged, so each type round-trips exactly; SQLite takes integers,
reals, blobs and text as they are.

Staged columns are named by position (``k0``..: the key, ``v0``..: the other columns,
``u0``..: 1 where an update left that column unchanged), so a column called anything at all
(spaces, quotes) needs quoting only in the target.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import sqlalchemy

from spark_jobs.sources.cdc.bulk import copy_in
from spark_jobs.sources.cdc.table import TableColumn, TableShape
from spark_jobs.sources.cdc.values import postgres_text

STAGE = "backlog_stage"
#: The change columns staged after the table's own.
CHANGE_COLUMNS = ("_op", "_lsn", "_seq")
#: Arrow types SQLite takes as they are; every other value goes as PostgreSQL's text.
_SQLITE_NATIVE = (pa.types.is_integer, pa.types.is_floating, pa.types.is_binary)


@dataclass(frozen=True)
class Layout:
    """The target table's columns: the key's and the others', in the table's order, and
    each one's type in the target (what a staged text is cast to on PostgreSQL)."""

    keys: tuple[TableColumn, ...]
    values: tuple[TableColumn, ...]
    types: Mapping[str, str]
    #: The change rows' columns for op, lsn, seq and unchanged (``TableShape.change_fields``);
    #: the target's column of the position its rows reflect is named as the lsn one.
    changes: tuple[str, str, str, str]

    @classmethod
    def of(cls, shape: TableShape, types: Mapping[str, str] | None = None) -> Layout:
        values = tuple(c for c in shape.columns if c.name not in shape.key)
        own = {c.name: c.type_name for c in shape.columns}
        op, lsn, seq, unchanged = (
            shape.change_column(w) for w in ("op", "lsn", "seq", "unchanged")
        )
        return cls(
            shape.key_columns, values, own if types is None else types, (op, lsn, seq, unchanged)
        )

    @property
    def position(self) -> str:
        """The target's column of the position (a commit's end) each row reflects."""
        return self.changes[1]

    @property
    def key_names(self) -> list[str]:
        return [f"k{i}" for i in range(len(self.keys))]

    @property
    def value_names(self) -> list[str]:
        return [f"v{i}" for i in range(len(self.values))]

    @property
    def flag_names(self) -> list[str]:
        return [f"u{i}" for i in range(len(self.values))]

    @property
    def staged(self) -> list[str]:
        return [*self.key_names, *self.value_names, *self.flag_names, *CHANGE_COLUMNS]


@dataclass(frozen=True)
class Staged:
    """What a batch put into the stage: rows, and whether any left a column unchanged."""

    rows: int
    unchanged: bool


def create_stage(connection: sqlalchemy.Connection, layout: Layout) -> None:
    postgres = connection.dialect.name == "postgresql"
    kind = "text" if postgres else ""
    columns = [f"{name} {kind}" for name in (*layout.key_names, *layout.value_names)]
    columns += [f"{name} integer" for name in layout.flag_names]
    columns += ["_op text", "_lsn bigint", "_seq integer"]
    connection.exec_driver_sql(f"DROP TABLE IF EXISTS {STAGE}")
    suffix = " ON COMMIT DROP" if postgres else ""
    connection.exec_driver_sql(f"CREATE TEMPORARY TABLE {STAGE} ({', '.join(columns)}){suffix}")


def stage(
    connection: sqlalchemy.Connection, layout: Layout, pieces: Iterable[pa.RecordBatch]
) -> Staged:
    """Every piece into the stage, one statement each."""
    postgres = connection.dialect.name == "postgresql"
    rows, unchanged = 0, False
    for piece in pieces:
        if piece.num_rows == 0:
            continue
        flags = unchanged_flags(piece, layout)
        unchanged = unchanged or any(flag.any() for flag in flags)
        own = [piece.column(c.name) for c in (*layout.keys, *layout.values)]
        kinds = [c.kind.oid for c in (*layout.keys, *layout.values)]
        changes = [piece.column(name) for name in layout.changes[:3]]
        if postgres:
            texts = [postgres_text(a, kind) for a, kind in zip(own, kinds, strict=True)]
            _copy(connection, layout, [*texts, *map(pa.array, flags), *changes])
        else:
            values = [_sqlite_values(a, kind) for a, kind in zip(own, kinds, strict=True)]
            values += [flag.tolist() for flag in flags]
            values += [change.to_pylist() for change in changes]
            marks = ", ".join("?" * len(values))
            connection.exec_driver_sql(
                f"INSERT INTO {STAGE} VALUES ({marks})", list(zip(*values, strict=True))
            )
        rows += piece.num_rows
    return Staged(rows, unchanged)


def unchanged_flags(piece: pa.RecordBatch, layout: Layout) -> list[np.ndarray]:
    """Per non-key column, whether each row's ``_unchanged`` names it (as int8 0/1)."""
    listed = piece.column(layout.changes[3])
    flat = pc.list_flatten(listed).to_numpy(zero_copy_only=False)
    rows = pc.list_parent_indices(listed).to_numpy()
    flags = []
    for column in layout.values:
        flag = np.zeros(piece.num_rows, dtype=np.int8)
        flag[rows[flat == column.name]] = 1
        flags.append(flag)
    return flags


def _sqlite_values(array: pa.Array, type_oid: int) -> list:
    """A column as SQLite takes it: integers, reals and blobs as they are (a NaN as its
    text, which SQLite would store as NULL), booleans as 0 and 1, the rest as PostgreSQL's
    text."""
    if pa.types.is_boolean(array.type):
        return pc.cast(array, pa.int8()).to_pylist()
    if pa.types.is_floating(array.type):
        return ["NaN" if v != v else v for v in array.to_pylist()]
    if any(native(array.type) for native in _SQLITE_NATIVE):
        return array.to_pylist()
    return postgres_text(array, type_oid).to_pylist()


def _copy(connection: sqlalchemy.Connection, layout: Layout, columns: list[pa.Array]) -> None:
    """One ``COPY`` of a piece: CSV that quotes every value, so an empty string differs
    from a NULL (an unquoted empty field)."""
    buffer = io.BytesIO()
    pa_csv.write_csv(
        pa.table(columns, names=layout.staged),
        buffer,
        pa_csv.WriteOptions(include_header=False, quoting_style="all_valid"),
    )
    copy_in(connection, f"COPY {STAGE} FROM STDIN WITH (FORMAT csv)", buffer)
