"""A logical replication slot, read through PostgreSQL's SQL slot functions only.

Peeking (``pg_logical_slot_peek_binary_changes``) reads changes without consuming them, so
a batch replays the same rows until it is committed; the slot moves only when told to
(``pg_replication_slot_advance``), to the end of a transaction an offset stored. A
walsender connection would confirm positions as it streams instead. Statements run on an
AUTOCOMMIT connection, as the slot functions need: creating a slot inside a transaction
that has written is refused, and an open one would hold back the server. Only a streamed
peek runs in a (read-only) transaction, which a server-side cursor needs: rows then arrive
in bounded pieces, however large the transaction they belong to.

Planning a batch needs only where transactions end and how many changes each holds, so the
server counts them (``summary``) and no change is sent or decoded in Python for it.

The changes are decoded by the calling connection's backend, with its settings, so each
connection first sets those that shape the text of values to what ``values.py`` reads.

The slot keeps every WAL file from its ``restart_lsn`` on, and moves only when a batch
commits a position of ours; PostgreSQL sends nothing for a transaction that changed no
published table. So a quiet table in a busy database would hold WAL without bound: a
``heartbeat`` (a transactional logical message, sent with the ``messages`` option) gives
the changelog a position of its own to commit, as Debezium's heartbeat does.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import sqlalchemy
from sqlalchemy import text
from sqlalchemy.engine import make_url

from spark_jobs.backlog.secrets import redact_text
from spark_jobs.backlog.table_names import in_text, qualified, text_quoting
from spark_jobs.metrics.schema import installed_postgres_driver
from spark_jobs.sources.cdc.lsn import format_lsn, parse_lsn
from spark_jobs.sources.cdc.summary import OPTIONS, SUMMARY, BatchSummary
from spark_jobs.storage.databases import sqlstate

PLUGIN = "pgoutput"
#: Rows a streamed peek fetches at a time.
STREAM_ROWS = 2_000
#: The prefix of this slot's own position messages (heartbeats, and a snapshot chunk's high
#: watermark); the slot's name follows it. A transaction of one of them is a position the
#: changelog may end a batch at, though it changes no row.
POSITION_PREFIX = "backlog.position."
#: The four kinds of change a publication must publish for the copy to stay whole.
PUBLISHED_ACTIONS = ("insert", "update", "delete", "truncate")
#: How long a statement on the slot waits for another session to let go of it.
BUSY_WAIT_S = 60.0
#: SQLSTATE of "replication slot ... is active for PID ...".
_OBJECT_IN_USE = "55006"
#: PostgreSQL's rule for slot names, applied to the publication's name too, so both can go
#: into statements and options without quoting.
_NAME = re.compile(r"[a-z0-9_]{1,63}")
#: What every connection that decodes or reads rows sets first: the text of dates, times,
#: bytea and floats in the form ``values.py`` reads; arrays' NULL elements read back as NULL
#: (generated values are computed from values' text); and no row security, so that a read
#: that a policy would filter fails instead (the slot decodes every row's changes). A
#: database or role may set any of them otherwise.
SESSION_SETTINGS = text(
    "SELECT set_config('DateStyle', 'ISO', false), set_config('TimeZone', 'UTC', false), "
    "set_config('bytea_output', 'hex', false), set_config('extra_float_digits', '1', false), "
    "set_config('IntervalStyle', 'postgres', false), set_config('row_security', 'off', false), "
    "set_config('array_nulls', 'on', false)"
)
_PEEK = text(
    "SELECT lsn::text AS lsn, xid::text::bigint AS xid, data "
    "FROM pg_logical_slot_peek_binary_changes(:slot, CAST(:upto_lsn AS pg_lsn), "
    f"CAST(:upto_nchanges AS integer), {OPTIONS})"
)

T = TypeVar("T")
logger = logging.getLogger(__name__)


def source_engine(url: str, **options: Any) -> sqlalchemy.Engine:
    """An engine on the source whose connections speak UTF-8 whatever the database or role
    sets as ``client_encoding``: the snapshot hands COPY's bytes to Arrow as UTF-8, as the
    changes come in the database's own encoding, which must be UTF8. (Set when connecting,
    so the driver decodes in the encoding the server sends.)"""
    return sqlalchemy.create_engine(
        installed_postgres_driver(make_url(url)),
        connect_args={"client_encoding": "utf8"},
        **options,
    )


def check_name(what: str, name: str) -> None:
    """Refuse a slot or publication name PostgreSQL would refuse (or need quoted)."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{what} name {name!r}: use 1 to 63 lower-case letters, digits and underscores"
        )


def check_logical_decoding(url: str) -> None:
    """Refuse a server that cannot decode changes, before anything is created on it."""
    engine = source_engine(url)
    try:
        with engine.connect() as connection:
            _check_wal_level(connection, redact_text(url))
    finally:
        engine.dispose()


#: The first release with what the source reads: publications of a schema's tables (for the
#: publication's state) and ``pg_visible_in_snapshot``.
OLDEST_SERVER = 150000


def _check_wal_level(connection: sqlalchemy.Connection, where: str) -> None:
    version = int(connection.execute(text("SHOW server_version_num")).scalar_one())
    if version < OLDEST_SERVER:
        raise SlotError(
            f"the server at {where} runs PostgreSQL {version // 10000}; reading changes needs "
            "PostgreSQL 15 or later"
        )
    encoding = connection.execute(text("SHOW server_encoding")).scalar_one()
    if encoding != "UTF8":
        raise SlotError(
            f"the database at {where} is encoded in {encoding}; the source reads databases "
            "encoded in UTF8 (its changes come in the database's encoding, as bytes)"
        )
    level = connection.execute(text("SHOW wal_level")).scalar_one()
    if level != "logical":
        raise SlotError(
            f"wal_level is {level!r} on {where}; reading changes needs "
            "wal_level = logical (set it in postgresql.conf and restart the server)"
        )


class SlotError(RuntimeError):
    """The server or the slot cannot serve changes; the message names the setting or state."""


class PeekedRow(NamedTuple):
    """One row of a peek: ``lsn`` is the message's (for a Commit, its end), ``xid`` 32-bit."""

    lsn: int
    xid: int
    data: bytes


@dataclass(frozen=True)
class SlotHealth:
    """What the slot costs the server: WAL kept for it from its ``restart_lsn``, WAL the
    server wrote after the slot's position, whether the kept WAL is safe (``wal_status``),
    and the server's cap (``max_slot_wal_keep_size``, '-1': none, so the WAL of a stuck
    slot grows until the disk is full)."""

    retained_wal_bytes: int
    trailing_wal_bytes: int
    wal_status: str
    max_slot_wal_keep_size: str

    @property
    def unbounded(self) -> bool:
        return self.max_slot_wal_keep_size == "-1"


class _Cursor:
    """A server-side cursor in a read-only transaction of its own pooled connection.
    (SQLAlchemy's ``stream_results`` keeps what it fetched; psycopg's named cursor alone
    holds one fetch at a time.)"""

    def __init__(self, pooled: Any, dbapi: Any):
        self._pooled, self._dbapi = pooled, dbapi
        self._connection = pooled.dbapi_connection
        self._connection.autocommit = False
        self._cursor: Any = None
        self._statement = ""

    def open(self, statement: str, bounds: dict[str, Any]) -> list:
        self._statement = statement
        with self._errors():
            setup = self._connection.cursor()
            setup.execute(str(SESSION_SETTINGS))
            setup.close()
            self._cursor = self._connection.cursor(name="backlog_peek")
            self._cursor.execute(statement, bounds)
        return self.cursor_fetch()

    def cursor_fetch(self) -> list:
        with self._errors():
            return self._cursor.fetchmany(STREAM_ROWS)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """The driver's errors as SQLAlchemy's, as every other statement raises them."""
        try:
            yield
        except self._dbapi.Error as error:
            raise sqlalchemy.exc.DBAPIError.instance(
                self._statement, None, error, self._dbapi.Error
            ) from error

    def close(self) -> None:
        try:
            self._connection.rollback()
            self._connection.autocommit = True
        except self._dbapi.Error:
            self._pooled.invalidate()  # a connection left in a transaction must not be reused
        finally:
            self._pooled.close()


class ReplicationSlot:
    """A ``pgoutput`` slot and the publication of one table, in the database of ``url``."""

    def __init__(self, url: str, slot: str, publication: str, table: str):
        check_name("slot", slot)
        check_name("publication", publication)
        self.slot = slot
        self.publication = publication
        self.table = table
        #: Where the slot lives, for messages: the URL without its password.
        self.where = redact_text(url)
        # A URL without a driver: whichever of psycopg and psycopg2 is installed, as the
        # metrics database's. No statement timeout: creating a slot waits for transactions.
        self._engine = source_engine(url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)

    def ensure(self) -> None:
        """Check that the server can decode, then create the publication and the slot if
        missing. Creating a slot waits for the transactions in progress to end: its first
        change is the first to commit after them."""
        with self._connection() as connection:
            _check_wal_level(connection, self.where)
            published = connection.execute(
                text("SELECT 1 FROM pg_publication WHERE pubname = :publication"),
                {"publication": self.publication},
            ).first()
            if published is None:
                # Changes of a partitioned table's partitions published as the table's own.
                connection.execute(
                    text(
                        f"CREATE PUBLICATION {self.publication} FOR TABLE "
                        f"{in_text(self._table())} "
                        "WITH (publish_via_partition_root = true)"
                    )
                )
            existing = connection.execute(
                text(
                    "SELECT plugin, database, current_database() AS here "
                    "FROM pg_replication_slots WHERE slot_name = :slot"
                ),
                {"slot": self.slot},
            ).first()
            if existing is None:
                self._say_what_the_slot_waits_for(connection)
                connection.execute(
                    text("SELECT pg_create_logical_replication_slot(:slot, :plugin)"),
                    {"slot": self.slot, "plugin": PLUGIN},
                )
            elif (existing.plugin, existing.database) != (PLUGIN, existing.here):
                raise SlotError(
                    f"replication slot {self.slot!r} on {self.where} exists with plugin "
                    f"{existing.plugin!r} in database {existing.database!r}; expected "
                    f"{PLUGIN!r} in {existing.here!r}: choose another slot name"
                )
        self.check_publication()

    def _say_what_the_slot_waits_for(self, connection: sqlalchemy.Connection) -> None:
        """Creating a slot waits for every transaction in progress, a prepared one too, for
        as long as it takes: say so when there are any."""
        prepared = connection.execute(
            text("SELECT gid, prepared FROM pg_prepared_xacts WHERE database = current_database()")
        ).all()
        if prepared:
            logger.warning(
                "creating replication slot %r on %s waits for %d prepared transaction(s) to "
                "be committed or rolled back, the oldest %r prepared at %s",
                self.slot, self.where, len(prepared), prepared[0].gid, prepared[0].prepared,
            )  # fmt: skip

    def check_publication(self) -> None:
        """Refuse a publication that would not carry every change of the table: one that
        does not hold it (a publication left by another table's query under the same name),
        publishes fewer than all four actions, filters its rows or lists only some columns.
        Any of these makes the changelog silently empty or partial."""
        with self._connection() as connection:
            found = connection.execute(
                text(
                    "SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot, "
                    "(SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(:table)) "
                    "AS partitioned FROM pg_publication WHERE pubname = :publication"
                ),
                {"publication": self.publication, "table": self._table()},
            ).first()
            if found is None:
                raise SlotError(
                    f"no publication {self.publication!r} on {self.where}: it was dropped "
                    "while the slot was kept; drop the slot too and read the table afresh"
                )
            carried = connection.execute(
                text(
                    "SELECT attnames, rowfilter, (SELECT array_agg(attname::text ORDER BY attnum) "
                    "  FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 "
                    "  AND NOT attisdropped AND attgenerated = '') AS columns, "
                    "EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON "
                    "  p.oid = pr.prpubid WHERE p.pubname = pt.pubname AND pr.prrelid = c.oid "
                    "  AND pr.prattrs IS NOT NULL) AS column_list "
                    "FROM pg_publication_tables pt JOIN pg_namespace n ON n.nspname = "
                    "pt.schemaname JOIN pg_class c ON c.relnamespace = n.oid AND "
                    "c.relname = pt.tablename WHERE pt.pubname = :publication "
                    "AND c.oid = to_regclass(:table)"
                ),
                {"publication": self.publication, "table": self._table()},
            ).first()
        named = f"publication {self.publication!r} on {self.where}"
        if found.partitioned and not found.pubviaroot:
            raise SlotError(
                f"{named} publishes the partitions of {self.table} under their own names, "
                "not the table's, so none of their changes would arrive as the table's: "
                f"ALTER PUBLICATION {self.publication} SET (publish_via_partition_root = true)"
            )
        if carried is None:
            raise SlotError(
                f"{named} does not publish table {self.table}, so none of its changes would "
                "arrive (is it left from a query on another table? the default name comes "
                "from the checkpoint path): give another --checkpoint, or ALTER PUBLICATION "
                f"{self.publication} ADD TABLE {self._table()}"
            )
        missing = [a for a, on in zip(PUBLISHED_ACTIONS, found[:4], strict=True) if not on]
        if missing:
            raise SlotError(
                f"{named} does not publish {', '.join(missing)}, so those changes of "
                f"{self.table} would never arrive: ALTER PUBLICATION {self.publication} "
                f"SET (publish = '{', '.join(PUBLISHED_ACTIONS)}')"
            )
        if carried.rowfilter is not None:
            raise SlotError(
                f"{named} filters the rows of {self.table} (WHERE {carried.rowfilter}), so changes "
                "of the rows it leaves out would never arrive: publish the table without a "
                "row filter"
            )
        # Without a column list, attnames lists what the release publishes (from 16 on:
        # without generated columns, unless publish_generated_columns asks for them).
        if carried.column_list and not set(carried.columns) <= set(carried.attnames):
            raise SlotError(
                f"{named} publishes only the columns {list(carried.attnames)} of {self.table}, "
                f"not all of {list(carried.columns)}: publish the table without a column list"
            )

    def select(self, statement: str, values: dict[str, Any]) -> list[tuple[Any, ...]]:
        """``statement``'s rows, run with the settings values are read under."""
        with self._connection() as connection:
            return [tuple(row) for row in connection.execute(text(statement), values)]

    def publication_state(self) -> dict[str, Any] | None:
        """What the publication is for the table, down to the catalog rows' own transaction
        ids: any change to it (actions, membership, even one undone since) gives another
        state. None: no such publication."""
        with self._connection() as connection:
            row = connection.execute(
                text(
                    "SELECT p.oid, p.xmin::text AS xmin, p.pubinsert, p.pubupdate, "
                    "p.pubdelete, p.pubtruncate, p.puballtables, p.pubviaroot, "
                    "ARRAY(SELECT pr.oid::text || '/' || pr.xmin::text "
                    "  FROM pg_publication_rel pr WHERE pr.prpubid = p.oid "
                    "  AND pr.prrelid = to_regclass(:table) ORDER BY 1) AS tables, "
                    "ARRAY(SELECT pn.oid::text || '/' || pn.xmin::text "
                    "  FROM pg_publication_namespace pn JOIN pg_class c "
                    "  ON c.relnamespace = pn.pnnspid WHERE pn.pnpubid = p.oid "
                    "  AND c.oid = to_regclass(:table) ORDER BY 1) AS schemas "
                    "FROM pg_publication p WHERE p.pubname = :publication"
                ),
                {"publication": self.publication, "table": self._table()},
            ).first()
        return None if row is None else {k: v for k, v in row._mapping.items()}

    def peek(
        self, upto_nchanges: int | None = None, upto_lsn: int | None = None
    ) -> list[PeekedRow]:
        """The messages after the slot's position, without consuming them: until the slot is
        advanced, the same bounds return the same rows. Both bounds end at a transaction's
        end: ``upto_nchanges`` once that many rows are out, ``upto_lsn`` with the last
        transaction that ends at or before it. None: no bound. Only WAL the server has
        flushed is decoded: under ``synchronous_commit = off`` a commit shows up to a few
        ``wal_writer_delay`` after it returned."""
        bounds = self._bounds(upto_lsn, upto_nchanges)
        rows = self._when_free(lambda: self._run(_PEEK, bounds).all())
        return [PeekedRow(parse_lsn(row.lsn), row.xid, bytes(row.data)) for row in rows]

    def stream(self, upto_lsn: int | None = None) -> Iterator[PeekedRow]:
        """``peek(upto_lsn=...)``'s rows, fetched ``STREAM_ROWS`` at a time through a
        server-side cursor: memory stays flat whatever the transactions' size."""
        statement = str(_PEEK.compile(dialect=self._engine.dialect))
        bounds = self._bounds(upto_lsn, None)
        connection, rows = self._when_free(lambda: self._first_rows(statement, bounds))
        try:
            while rows:
                for lsn, xid, data in rows:
                    yield PeekedRow(parse_lsn(lsn), xid, bytes(data))
                rows = connection.cursor_fetch()
        finally:
            connection.close()

    def summary(
        self,
        start_lsn: int,
        max_changes: int | None,
        upto_nchanges: int | None,
        upto_lsn: int | None = None,
    ) -> BatchSummary:
        """Where the batch after ``start_lsn`` ends, counted on the server (``summary.SUMMARY``)
        among the first ``upto_nchanges`` messages after the slot (None: all), of the
        transactions that end by ``upto_lsn`` (None: all)."""
        prefix = self.position_prefix.encode()
        values = {
            "slot": self.slot,
            "publication": self.publication,
            "upto_nchanges": upto_nchanges,
            "upto_lsn": None if upto_lsn is None else format_lsn(upto_lsn),
            "start": format_lsn(start_lsn),
            "max_changes": max_changes,
            "prefix": prefix + b"\0",
            "prefix_bytes": len(prefix) + 1,
        }
        row = self._when_free(lambda: self._run(SUMMARY, values).one())
        end = None if row.end_lsn is None else parse_lsn(row.end_lsn)
        blocked_at = None if row.blocked_at is None else parse_lsn(row.blocked_at)
        return BatchSummary(row.messages, end, row.changes, row.moves, row.left_out, blocked_at)

    def heartbeat(self) -> int:
        """Write this slot's heartbeat (a transaction of one logical message, flushed at its
        commit, since peeks decode flushed WAL only, and waiting for no standby); returns the
        message's position."""
        with self._connection() as connection:
            connection.execute(text("SELECT set_config('synchronous_commit', 'local', false)"))
            return parse_lsn(
                connection.execute(
                    text("SELECT pg_logical_emit_message(true, :prefix, 'heartbeat')::text"),
                    {"prefix": self.position_prefix},
                ).scalar_one()
            )

    @property
    def position_prefix(self) -> str:
        return POSITION_PREFIX + self.slot

    def health(self) -> SlotHealth:
        """What the slot keeps on the server; a slot whose WAL is lost is an error."""
        row = self._state()
        return SlotHealth(
            int(row["retained"]), int(row["trailing"]), row["wal_status"], row["keep_size"]
        )

    def advance(self, lsn: int) -> int:
        """Consume every transaction that ends at or before ``lsn`` (a Commit's end LSN: a
        position inside a commit record drops that transaction); returns the new position,
        which the server caps at what it has flushed."""
        statement = text(
            "SELECT end_lsn::text FROM pg_replication_slot_advance(:slot, CAST(:lsn AS pg_lsn))"
        )
        values = {"slot": self.slot, "lsn": format_lsn(lsn)}
        return parse_lsn(self._when_free(lambda: self._run(statement, values).scalar_one()))

    def confirmed_flush_lsn(self) -> int:
        """Where the next peek starts: the position last advanced to."""
        return parse_lsn(self._state()["confirmed_flush_lsn"])

    def current_wal_lsn(self) -> int:
        """How far the server has written WAL (``pg_current_wal_lsn()``): no change decoded
        from this slot ends beyond it."""
        with self._connection() as connection:
            return parse_lsn(connection.execute(text("SELECT pg_current_wal_lsn()::text")).scalar())

    def drop(self) -> None:
        """Remove the slot and the publication, if there; the slot must not be in use."""
        with self._connection() as connection:
            connection.execute(
                text(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = :slot"
                ),
                {"slot": self.slot},
            )
            connection.execute(text(f"DROP PUBLICATION IF EXISTS {self.publication}"))

    def close(self) -> None:
        self._engine.dispose()

    def _state(self) -> dict[str, Any]:
        with self._connection() as connection:
            row = connection.execute(
                text(
                    "SELECT confirmed_flush_lsn::text, wal_status, "
                    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained, "
                    "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                    "  AS trailing, "
                    "current_setting('max_slot_wal_keep_size') AS keep_size "
                    "FROM pg_replication_slots WHERE slot_name = :slot"
                ),
                {"slot": self.slot},
            ).first()
        if row is None:
            raise SlotError(f"no replication slot {self.slot!r} on {self.where}")
        if row.wal_status == "lost":
            raise SlotError(
                f"replication slot {self.slot!r} on {self.where} has wal_status 'lost': the "
                "server removed WAL it had not decoded (max_slot_wal_keep_size), so changes "
                "are missing; drop the slot and read the table afresh"
            )
        return dict(row._mapping)

    def _table(self) -> str:
        """``table`` or ``schema.table``, each part quoted as PostgreSQL needs."""
        return qualified(self.table, text_quoting(self._engine.dialect.identifier_preparer))

    def _bounds(self, upto_lsn: int | None, upto_nchanges: int | None) -> dict[str, Any]:
        if upto_nchanges is not None and upto_nchanges < 1:
            raise ValueError(f"upto_nchanges = {upto_nchanges!r}: expected None or at least 1")
        return {
            "slot": self.slot,
            "publication": self.publication,
            "upto_lsn": None if upto_lsn is None else format_lsn(upto_lsn),
            "upto_nchanges": upto_nchanges,
        }

    def _run(self, statement: sqlalchemy.TextClause, values: dict[str, Any]) -> sqlalchemy.Result:
        with self._connection() as connection:
            return connection.execute(statement, values).freeze()()

    def _first_rows(self, statement: str, bounds: dict[str, Any]) -> tuple[_Cursor, list]:
        """A streamed peek's cursor and first rows; the slot is taken, or found busy, when
        the first rows are fetched."""
        dbapi = self._engine.dialect.dbapi
        try:
            pooled = self._engine.raw_connection()
        except dbapi.Error as error:  # the pool hands the driver's own error on
            raise sqlalchemy.exc.DBAPIError.instance(None, None, error, dbapi.Error) from error
        cursor = _Cursor(pooled, dbapi)
        try:
            rows = cursor.open(statement, bounds)
        except BaseException:
            cursor.close()
            raise
        return cursor, rows

    def _when_free(self, attempt: Callable[[], T]) -> T:
        """Run a statement that uses the slot, waiting while another session uses it (the
        planner's peek and an executor's read of one query take turns), for ``BUSY_WAIT_S``."""
        deadline = time.monotonic() + BUSY_WAIT_S
        pause = 0.02
        while True:
            try:
                return attempt()
            except sqlalchemy.exc.OperationalError as error:
                if sqlstate(error) != _OBJECT_IN_USE:
                    raise
                if time.monotonic() >= deadline:
                    raise SlotError(
                        f"replication slot {self.slot!r} on {self.where} has been in use by "
                        f"another session for {BUSY_WAIT_S:.0f} s; only one query may read a "
                        "slot: is a second query running on the same checkpoint?"
                    ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    @contextmanager
    def _connection(self) -> Iterator[sqlalchemy.Connection]:
        with self._engine.connect() as connection:
            connection.execute(SESSION_SETTINGS)
            yield connection
