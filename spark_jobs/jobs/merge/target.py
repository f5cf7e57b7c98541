"""The table a change stream is merged into, one batch per transaction.

Each batch is staged, applied and recorded in one transaction (``record.py``), so the table
takes every batch exactly once: a replay finds its batch recorded and changes nothing, and a
batch that fails half-way leaves neither rows nor its record.

The table is created with the source's own column types on PostgreSQL (``numeric``,
``jsonb``, arrays and the rest stay what they were) and with SQLite's affinities there
(INTEGER, REAL, BLOB, else TEXT holding PostgreSQL's text of the value), plus ``_lsn``: the
position of the change each row reflects. A database that is away (restarting, say) is
waited for, up to ``outage_timeout_s``, and the batch tried again from the start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import pyarrow as pa
import sqlalchemy

from spark_jobs.backlog.outage import Outage
from spark_jobs.backlog.secrets import redact_text
from spark_jobs.backlog.table_names import qualified, split_table_name, text_quoting
from spark_jobs.backlog.values import format_duration
from spark_jobs.jobs.merge.apply import apply
from spark_jobs.jobs.merge.record import (
    MergeRefused,
    Record,
    Verdict,
    create_records,
    judge,
    read_record,
    resolve,
    write_record,
)
from spark_jobs.jobs.merge.staging import Layout, create_stage, stage
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.table import TableColumn, TableShape
from spark_jobs.storage.databases import is_outage

logger = logging.getLogger(__name__)

#: SQLite's affinity per PostgreSQL type OID (int2, int4, int8, bool; float4, float8; bytea);
#: every other type is TEXT.
_SQLITE_TYPES = {21: "INTEGER", 23: "INTEGER", 20: "INTEGER", 16: "INTEGER", 700: "REAL"}
_SQLITE_TYPES |= {701: "REAL", 17: "BLOB"}
#: The first pause before a batch is tried again while the database is away.
_RETRY_PAUSE_S = 0.5


def _check_sqlite_names(table: str, shape: TableShape) -> None:
    """Refuse columns SQLite cannot tell apart: its names ignore case (ASCII letters)."""
    seen: dict[str, str] = {}
    for column in shape.columns:
        other = seen.setdefault(column.name.lower(), column.name)
        if other != column.name:
            raise MergeRefused(
                f"{shape.name}: columns {other!r} and {column.name!r} differ only by case, "
                f"which SQLite's column names do not tell apart, so table {table!r} could "
                "not hold both; copy it into PostgreSQL"
            )


class MergeTarget:
    """``table`` of the database at ``url``, fed batches of ``shape``'s changes."""

    def __init__(self, url: str, table: str, shape: TableShape, outage_timeout_s: float):
        self.engine = make_engine(url)
        self.where = redact_text(url)
        self.table, self.shape = table, shape
        if self.engine.dialect.name == "sqlite":
            _check_sqlite_names(table, shape)
        self.layout = Layout.of(shape)
        self.outage_timeout_s = outage_timeout_s
        self._created = False

    def merge(
        self,
        pieces: Callable[[], Iterable[pa.RecordBatch]],
        query_id: str,
        checkpoint: str,
        batch_id: int,
        start_over: bool,
    ) -> Verdict:
        """Batch ``batch_id`` of query ``query_id``, read from ``pieces()`` (called again for
        each try), merged unless recorded already; MergeRefused if another query merged
        into the table and ``start_over`` is not set."""
        outage, pause = Outage(self.outage_timeout_s), _RETRY_PAUSE_S
        while True:
            try:
                return self._merge_once(pieces(), query_id, checkpoint, batch_id, start_over)
            except sqlalchemy.exc.DBAPIError as error:
                if not is_outage(error):
                    raise
                if not outage.failed():
                    raise RuntimeError(
                        f"the target database {self.where} has not answered for "
                        f"{format_duration(outage.lasted_s)} (--target-outage-timeout "
                        f"{format_duration(self.outage_timeout_s)}): {error.orig}"
                    ) from None
                logger.warning(
                    "batch %d: the target database %s is away (%s); trying again",
                    batch_id, self.where, str(error.orig).strip(),
                )  # fmt: skip
            time.sleep(pause)
            pause = min(2 * pause, 5.0)

    def record(self) -> Record | None:
        """The query and last batch recorded for the table, None if none."""
        create_records(self.engine)
        with self.engine.connect() as connection:
            return read_record(connection, resolve(connection, self.table))

    def check(self, query_id: str, batch_id: int, start_over: bool, checkpoint: str) -> None:
        """Refuse now (MergeRefused) what merging batch ``batch_id`` of ``query_id`` would."""
        create_records(self.engine)
        with self.engine.connect() as connection:
            table = resolve(connection, self.table)
            found = read_record(connection, table)
        judge(found, query_id, batch_id, start_over, self.table, checkpoint, table.oid)

    def close(self) -> None:
        self.engine.dispose()

    def _merge_once(
        self,
        pieces: Iterable[pa.RecordBatch],
        query_id: str,
        checkpoint: str,
        batch_id: int,
        start_over: bool,
    ) -> Verdict:
        self._create()
        with self.engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # Values arrive as text: an array's NULL element reads as NULL whatever the
                # database or role sets.
                connection.exec_driver_sql("SET LOCAL statement_timeout = 0")
                connection.exec_driver_sql("SET LOCAL array_nulls = on")
            table = resolve(connection, self.table)
            found = read_record(connection, table)
            verdict = judge(
                found, query_id, batch_id, start_over, self.table, checkpoint, table.oid
            )
            if verdict is Verdict.SKIP:
                return verdict
            if verdict is Verdict.EMPTY_THEN_MERGE:
                connection.exec_driver_sql(f"DELETE FROM {self._quoted(connection)}")
            create_stage(connection, self.layout)
            staged = stage(connection, self.layout, pieces)
            if staged.rows:
                apply(connection, self.table, self.layout, staged.unchanged)
            write_record(connection, table, checkpoint, query_id, batch_id)
        return verdict

    def _create(self) -> None:
        """The table (and the records) if missing, once per process."""
        if self._created:
            return
        create_records(self.engine)
        with self.engine.begin() as connection:
            quote = connection.dialect.identifier_preparer.quote
            columns = [f"{quote(c.name)} {_type(connection, c)}" for c in self.shape.columns]
            key = ", ".join(quote(name) for name in self.shape.key)
            connection.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {self._quoted(connection)} "
                f"({', '.join(columns)}, {quote(self.layout.position)} BIGINT, "
                f"PRIMARY KEY ({key}))"
            )
            self._check_columns(connection)
            if connection.dialect.name == "postgresql":
                self.layout = Layout.of(self.shape, self._column_types(connection))
        self._created = True

    def _check_columns(self, connection: sqlalchemy.Connection) -> None:
        """Refuse a table made beforehand without a column the copy writes."""
        parts = split_table_name(self.table)
        schema = parts[0] if len(parts) == 2 else None
        inspector = sqlalchemy.inspect(connection)
        held = {c["name"] for c in inspector.get_columns(parts[-1], schema=schema)}
        wanted = [*(c.name for c in self.shape.columns), self.layout.position]
        missing = [name for name in wanted if name not in held]
        if missing:
            raise MergeRefused(
                f"target table {self.table} on {self.where} was made without the columns "
                f"{missing} that the copy of {self.shape.name} writes: add them, or drop the "
                "table and let the copy make it"
            )

    def _column_types(self, connection: sqlalchemy.Connection) -> dict[str, str]:
        """The table's column types as the target has them (created here or before), without
        their modifiers: a value is cast to the type, then stored as an INSERT stores it, so
        a text too long for a ``varchar(n)`` the table was made with fails instead of being
        cut, as an explicit cast would cut it."""
        found = connection.execute(
            sqlalchemy.text(
                "SELECT attname, format_type(atttypid, NULL) FROM pg_attribute "
                "WHERE attrelid = to_regclass(:table) AND attnum > 0 AND NOT attisdropped"
            ),
            {"table": qualified(self.table, text_quoting(connection.dialect.identifier_preparer))},
        )
        return {name: _unbounded(type_name) for name, type_name in found.all()}

    def _quoted(self, connection: sqlalchemy.Connection) -> str:
        """The table's name for statements the driver renders (``exec_driver_sql``)."""
        quote = connection.dialect.identifier_preparer.quote
        return qualified(self.table, quote)


def _unbounded(type_name: str) -> str:
    """A type named without its modifier, as a cast to it keeps a value whole: PostgreSQL
    names ``bpchar`` so ``character``, which means ``character(1)``."""
    if type_name == "character" or type_name.startswith("character["):
        return "bpchar" + type_name.removeprefix("character")
    return type_name


def _type(connection: sqlalchemy.Connection, column: TableColumn) -> str:
    """The column's type in the target: the source's own on PostgreSQL (or, for an enum or a
    domain the target lacks, the built-in type that holds its values), SQLite's affinity."""
    if connection.dialect.name != "postgresql":
        return _SQLITE_TYPES.get(column.kind.oid, "TEXT")
    if column.portable_type is None:
        return column.type_name
    known = connection.execute(
        sqlalchemy.text("SELECT to_regtype(:name) IS NOT NULL"), {"name": column.type_name}
    ).scalar_one()
    return column.type_name if known else column.portable_type
