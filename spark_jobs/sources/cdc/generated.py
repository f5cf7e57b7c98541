"""Generated columns, whose values no change carries: the source server computes them.

pgoutput leaves a generated column out of every change (PostgreSQL 18 sends a stored one only
where a publication asks, a virtual one never). Its value is a function of the row's other
columns (PostgreSQL requires the expression to be immutable), so the server that defined it
computes it again from the row the change gives, a batch of rows in one statement: the rows'
columns as text arrays, unnested and cast back to the table's types and collations under the
columns' own names, and the expressions selected over them, cast to their columns' types
(their output text, read as every value is).

A row must be whole for that. Where an update left a value unsent (TOASTed, unchanged) that
an expression reads: if every column the expression reads was left unsent, its value did not
change either, and is named unsent too (a copy keeps the one it has); if only some were, no
value can be computed here, and the changelog reads the row again (a refresh).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.backlog.table_names import in_text
from spark_jobs.sources.cdc.table import TableColumn, TableShape
from spark_jobs.sources.cdc.values import postgres_text, read_column

#: Runs a statement with bound values on the source, returning its rows.
Select = Callable[[str, dict[str, Any]], Sequence[Sequence[Any]]]


def kept(column: TableColumn, unsent: Collection[str]) -> bool:
    """Whether ``column``'s value stands as it was: every column it reads was left unsent."""
    return bool(column.generated_from) and set(column.generated_from) <= set(unsent)


def incomplete(table: TableShape, unsent: Collection[str]) -> bool:
    """Whether a row with ``unsent`` columns has a generated value no one can compute: its
    expression reads some unsent columns and some sent ones."""
    return any(
        set(c.generated_from) & set(unsent) and not kept(c, unsent) for c in table.generated_columns
    )


def compute(table: TableShape, rows: pa.Table, select: Select) -> pa.Table:
    """``rows`` (the table's columns, in ``TableShape.arrow_table``'s form; each generated
    column's values are replaced) with every generated value computed on the source, from
    the row's other values. Their text travels as one array per column."""
    generated = table.generated_columns
    if not generated or rows.num_rows == 0:
        return rows
    inputs = [c for c in table.columns if c.generated is None]
    bound = {
        f"c{i}": postgres_text(rows.column(c.name), c.kind.oid).to_pylist()
        for i, c in enumerate(inputs)
    }
    arrays = ", ".join(f"CAST(:c{i} AS text[])" for i in range(len(inputs)))
    typed = ", ".join(
        f"CAST(v{i} AS {c.type_name}){f' COLLATE {c.collation}' if c.collation else ''} AS {c.sql}"
        for i, c in enumerate(inputs)
    )
    values = ", ".join(f"v{i}" for i in range(len(inputs)))
    # Cast to the column's type, as storing it does: the expression's own type may differ
    # (``a / 3.0`` into numeric(6, 1), a text into char(4)).
    expressions = ", ".join(
        f"CASE WHEN ({c.generated}) IS NULL THEN NULL "
        f"ELSE format('%s', CAST(({c.generated}) AS {c.type_name})) END"
        for c in generated
    )
    # The expressions and names are the table's SQL, as written: a ``:v`` in them is no
    # bound value.
    # The rows' order, under a name none of the table's columns has.
    names = {c.name for c in table.columns}
    order = next(n for n in (f"backlog_row{'_' * i}" for i in itertools.count()) if n not in names)
    head = in_text(f"SELECT {expressions} FROM (SELECT {typed}, {order} FROM unnest(")
    found = select(
        f"{head}{arrays}) WITH ORDINALITY AS r({values}, {order})) AS t ORDER BY {order}",
        bound,
    )
    texts = list(zip(*found, strict=True)) if found else [()] * len(generated)
    for column, column_texts in zip(generated, texts, strict=True):
        computed = read_column(
            pa.array(column_texts, pa.string()), column.kind.oid, column.kind.arrow
        )
        index = rows.schema.get_field_index(column.name)
        rows = rows.set_column(index, rows.schema.field(index), computed)
    return rows


def fill(table: TableShape, piece: pa.Table, select: Select) -> pa.Table:
    """A changelog piece with its generated values: computed for the inserts' and updates'
    rows, except where ``_unchanged`` names the column (the value stands); deletes keep
    theirs null."""
    if not table.generated_columns or piece.num_rows == 0:
        return piece
    computed = compute(table, piece, select)
    present = pc.not_equal(piece.column(table.change_column("op")), "delete").to_numpy(
        zero_copy_only=False
    )
    listed = piece.column(table.change_column("unchanged")).combine_chunks()
    names = pc.list_flatten(listed).to_numpy(zero_copy_only=False)
    owners = pc.list_parent_indices(listed).to_numpy()
    for column in table.generated_columns:
        standing = np.zeros(piece.num_rows, dtype=bool)
        standing[owners[names == column.name]] = True
        index = piece.schema.get_field_index(column.name)
        take = pa.array(present & ~standing)
        values = pc.if_else(take, computed.column(index), piece.column(index))
        piece = piece.set_column(index, piece.schema.field(index), values)
    return piece


def name_unsent(table: TableShape, row: dict[str, Any], unsent: list[str]) -> None:
    """A decoded change's ``row``, completed: each generated column it lacks is null, and
    named in ``unsent`` where its value stands (``kept``)."""
    for column in table.generated_columns:
        row.setdefault(column.name, None)
        if kept(column, unsent):
            unsent.append(column.name)
