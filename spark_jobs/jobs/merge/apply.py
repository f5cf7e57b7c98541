"""A staged batch of changes applied to the target table, set by set, in the database.

Most batches hold each key once and no value an update left out (a snapshot's chunks always
do): their rows go in as they are, a delete removing the key, anything else inserting or
replacing it. Otherwise the batch is reduced first, key by key in commit order: a key's last
change says whether it stays, and each column takes the value of the last change that sent
it; one no change sent (a TOASTed value an update left unchanged) keeps the value the target
holds. A row the target lacks cannot keep a value: the source never sends such a row (it reads
a moved row again rather than send it incomplete), so one fails the batch by name.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy

from spark_jobs.backlog.table_names import qualified
from spark_jobs.jobs.merge.staging import STAGE, Layout

_ORDERED = "backlog_ordered"
_REDUCED = "backlog_reduced"


class MergeError(RuntimeError):
    """A batch that cannot be merged without losing a value; the message names it."""


class Statements:
    """SQL over the stage and the target, for one dialect."""

    def __init__(self, connection: sqlalchemy.Connection, table: str, layout: Layout):
        self.connection, self.layout = connection, layout
        self.postgres = connection.dialect.name == "postgresql"
        quote = connection.dialect.identifier_preparer.quote
        self.table = qualified(table, quote)
        self.keys = [quote(c.name) for c in layout.keys]
        self.values = [quote(c.name) for c in layout.values]
        self.position = quote(layout.position)

    def run(self, sql: str) -> sqlalchemy.CursorResult:
        return self.connection.exec_driver_sql(sql)

    def typed(self, staged: str, position: int, of_key: bool) -> str:
        """A staged value as its target column's type."""
        if not self.postgres:
            return staged
        column = (self.layout.keys if of_key else self.layout.values)[position]
        return f"CAST({staged} AS {self.layout.types[column.name]})"

    def as_staged(self, target_column: str) -> str:
        """A target value in the stage's form (PostgreSQL's text, which casts back)."""
        return f"CAST({target_column} AS text)" if self.postgres else target_column

    def same_key(self, target: str, staged: str) -> str:
        return " AND ".join(
            f"{target}.{column} = {self.typed(f'{staged}.k{i}', i, True)}"
            for i, column in enumerate(self.keys)
        )

    def staged_key(self, left: str, right: str) -> str:
        return " AND ".join(f"{left}.k{i} = {right}.k{i}" for i in range(len(self.keys)))


def apply(connection: sqlalchemy.Connection, table: str, layout: Layout, unchanged: bool) -> None:
    """The staged batch on ``table``: deleted keys removed, the others inserted or updated."""
    sql = Statements(connection, table, layout)
    duplicates = sql.run(
        f"SELECT 1 FROM {STAGE} GROUP BY {', '.join(layout.key_names)} HAVING count(*) > 1 LIMIT 1"
    ).first()
    if duplicates is None and not unchanged:
        _write(sql, STAGE, lambda i: "1")
        return
    _order(sql)
    _reduce(sql)
    _write(sql, _REDUCED, lambda i: f"src.known{i}")


def _order(sql: Statements) -> None:
    """The stage with each row's place in commit order, indexed by key."""
    sql.run(f"DROP TABLE IF EXISTS {_ORDERED}")
    sql.run(
        f"CREATE TEMPORARY TABLE {_ORDERED} AS SELECT s.*, "
        f"row_number() OVER (ORDER BY _lsn, _seq) AS _pos FROM {STAGE} s"
    )
    sql.run(f"CREATE INDEX {_ORDERED}_key ON {_ORDERED} ({', '.join(sql.layout.key_names)}, _pos)")


def _reduce(sql: Statements) -> None:
    """Per key: its last change's op and position, and per column the value of the last
    change that sent it, with ``known<i>`` 0 where none did."""
    keys = sql.staged_key("x", "l")
    columns = []
    for i in range(len(sql.values)):
        sent = f"FROM {_ORDERED} x WHERE {keys} AND x._op <> 'delete' AND x.u{i} = 0"
        columns.append(f"(SELECT x.v{i} {sent} ORDER BY x._pos DESC LIMIT 1) AS v{i}")
        columns.append(f"CASE WHEN EXISTS (SELECT 1 {sent}) THEN 1 ELSE 0 END AS known{i}")
    last = f"SELECT max(y._pos) FROM {_ORDERED} y WHERE {sql.staged_key('y', 'l')}"
    sql.run(f"DROP TABLE IF EXISTS {_REDUCED}")
    sql.run(
        f"CREATE TEMPORARY TABLE {_REDUCED} AS SELECT "
        f"{', '.join(f'l.k{k}' for k in range(len(sql.keys)))}, l._op, l._lsn"
        f"{''.join(', ' + c for c in columns)} FROM {_ORDERED} l WHERE l._pos = ({last})"
    )


def _write(sql: Statements, source: str, known: Callable[[int], str]) -> None:
    """Deleted keys out, present ones updated (a column not ``known`` keeps its value),
    new ones inserted; a new key with a value no change sent fails by name."""
    table, same = sql.table, sql.same_key(sql.table, "src")
    sql.run(
        f"DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM {source} src "
        f"WHERE src._op = 'delete' AND {same})"
    )
    updates = [
        f"{column} = CASE WHEN {known(i)} = 1 THEN {sql.typed(f'src.v{i}', i, False)} "
        f"ELSE {table}.{column} END"
        for i, column in enumerate(sql.values)
    ]
    sql.run(
        f"UPDATE {table} SET {', '.join([*updates, f'{sql.position} = src._lsn'])} "
        f"FROM {source} src "
        f"WHERE src._op <> 'delete' AND {same}"
    )
    new = f"src._op <> 'delete' AND NOT EXISTS (SELECT 1 FROM {table} WHERE {same})"
    unknown = " OR ".join(f"{known(i)} = 0" for i in range(len(sql.values))) or "0 = 1"
    missing = sql.run(
        f"SELECT {', '.join(sql.typed(f'src.k{k}', k, True) for k in range(len(sql.keys)))} "
        f"FROM {source} src "
        f"WHERE {new} AND ({unknown}) LIMIT 1"
    ).first()
    if missing is not None:
        key = dict(zip((c.name for c in sql.layout.keys), missing, strict=True))
        raise MergeError(
            f"cannot merge key {key} into {table}: a change left a value unsent, but the "
            "target has no row of that key to keep it from (was the row deleted from the "
            "target by hand?)"
        )
    values = [sql.typed(f"src.k{i}", i, True) for i in range(len(sql.keys))]
    values += [sql.typed(f"src.v{i}", i, False) for i in range(len(sql.values))]
    sql.run(
        f"INSERT INTO {table} ({', '.join([*sql.keys, *sql.values, sql.position])}) "
        f"SELECT {', '.join([*values, 'src._lsn'])} FROM {source} src WHERE {new}"
    )
