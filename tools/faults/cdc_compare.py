"""A CDC copy against its source table, value by value, by a rule of its own.

The source's values are taken as their output functions write them (``format('%s', ...)``,
under the settings the source reads with), which two PostgreSQL servers agree on exactly when
the values are equal; a PostgreSQL copy is read the same way. A SQLite copy holds what
docs/sources.md says it holds for each type: integers and booleans as INTEGER, floats as REAL
(NaN as the text 'NaN', a float4 as the double of the same value), bytea as BLOB, anything
else as the text. None of this goes through the code that made the copy.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa

from spark_jobs.backlog.table_names import in_text, qualified, text_quoting
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.table import TableColumn, TableShape

#: The source's reading settings (``slot.SESSION_SETTINGS``), as statements of their own.
OUTPUT_SETTINGS = (
    "SET DateStyle = ISO",
    "SET TimeZone = 'UTC'",
    "SET bytea_output = hex",
    "SET extra_float_digits = 1",
    "SET IntervalStyle = postgres",
)
_INTEGERS = {20, 21, 23}

Rows = dict[tuple[Any, ...], tuple[Any, ...]]


def output_text(sql: str) -> str:
    """An SQL expression of the output function's text of ``sql`` (NULL stays NULL)."""
    return f"CASE WHEN {sql} IS NULL THEN NULL ELSE format('%s', {sql}) END"


def postgres_rows(url: str, table: str, shape: TableShape) -> Rows:
    """``table``'s rows by key, each value as its output text, in ``shape``'s column order."""
    engine = make_engine(url)
    quote = text_quoting(engine.dialect.identifier_preparer)
    try:
        with engine.connect() as connection:
            for setting in OUTPUT_SETTINGS:
                connection.execute(sa.text(setting))
            columns = ", ".join(output_text(quote(c.name)) for c in shape.columns)
            select = f"SELECT {columns} FROM {qualified(table, quote)}"
            found = connection.execute(sa.text(in_text(select))).all()
    finally:
        engine.dispose()
    return _by_key(shape, [tuple(row) for row in found])


def sqlite_rows(path: str, table: str, shape: TableShape) -> Rows:
    """A SQLite copy's rows by key, as SQLite holds them."""
    connection = sqlite3.connect(path)
    try:
        columns = ", ".join(_sqlite_quote(c.name) for c in shape.columns)
        name = qualified(table, _sqlite_quote)
        found = connection.execute(f"SELECT {columns} FROM {name}").fetchall()
    finally:
        connection.close()
    return _by_key(shape, found)


def as_sqlite(column: TableColumn, text: str | None) -> Any:
    """What a SQLite copy holds for a value whose output text is ``text``."""
    if text is None:
        return None
    oid = column.kind.oid
    if oid in _INTEGERS:
        return int(text)
    if oid == 16:
        return int(text == "t")
    if oid in (700, 701):
        if text == "NaN":
            return "NaN"
        return float(np.float32(text)) if oid == 700 else float(text)
    if oid == 17:
        return bytes.fromhex(text[2:])
    return text


def expected_in_sqlite(source: Rows, shape: TableShape) -> Rows:
    return {
        tuple(as_sqlite(shape.key_columns[i], k) for i, k in enumerate(key)): tuple(
            as_sqlite(c, v) for c, v in zip(shape.columns, values, strict=True)
        )
        for key, values in source.items()
    }


@dataclass(frozen=True)
class Difference:
    """One key where the copy is not the table: its values on each side (None: no row)."""

    key: tuple[Any, ...]
    source: tuple[Any, ...] | None
    copy: tuple[Any, ...] | None

    def describe(self, shape: TableShape, width: int = 60) -> str:
        def short(values: tuple[Any, ...] | None) -> str:
            if values is None:
                return "no row"
            shown = [repr(v) if len(repr(v)) <= width else repr(v)[:width] + "..." for v in values]
            return ", ".join(f"{c.name}={v}" for c, v in zip(shape.columns, shown, strict=True))

        if self.source is not None and self.copy is not None:
            changed = [
                i for i, (a, b) in enumerate(zip(self.source, self.copy, strict=True)) if a != b
            ]
            picked = tuple(shape.columns[i].name for i in changed)
            return (
                f"key {self.key}: columns {picked} differ: source ({short(self.source)}), "
                f"copy ({short(self.copy)})"
            )
        return f"key {self.key}: source {short(self.source)}, copy {short(self.copy)}"


def differences(source: Rows, copy: Rows) -> list[Difference]:
    """Every key whose rows differ, in key order of the keys' text."""
    keys = sorted(source.keys() | copy.keys(), key=repr)
    return [
        Difference(key, source.get(key), copy.get(key))
        for key in keys
        if source.get(key) != copy.get(key)
    ]


def compare(source_url: str, source_table: str, target_url: str, target_table: str,
            shape: TableShape) -> list[Difference]:  # fmt: skip
    """The keys where the copy at ``target_url`` is not the source table now."""
    source = postgres_rows(source_url, source_table, shape)
    if target_url.startswith("sqlite"):
        path = sa.make_url(target_url).database or ""
        return differences(
            expected_in_sqlite(source, shape), sqlite_rows(path, target_table, shape)
        )
    return differences(source, postgres_rows(target_url, target_table, shape))


def _sqlite_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _by_key(shape: TableShape, rows: list[tuple[Any, ...]]) -> Rows:
    positions = [i for i, c in enumerate(shape.columns) if c.name in shape.key]
    order = [positions[[shape.columns[p].name for p in positions].index(k)] for k in shape.key]
    return {tuple(row[i] for i in order): row for row in rows}
