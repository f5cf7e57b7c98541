"""A logical replication slot, read through PostgreSQL's SQL slot functions only.

Peeking (``pg_logical_slot_peek_binary_changes``) reads changes without consuming them, so
a batch replays the same rows until it is committed; the slot moves only when told to
(``pg_replication_slot_advance``), to the end of a transaction an offset stored. A
walsender connection would confirm positions as it streams instead. Every statement runs
on an AUTOCOMMIT connection, as the slot functions need: creating a slot inside a
transaction that has written is refused, and an open one would hold back the server.

The changes are decoded by the calling connection's backend, with its settings, so each
connection first sets those that shape the text of values to what ``values.py`` reads.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import sqlalchemy
from sqlalchemy import text
from sqlalchemy.engine import make_url

from spark_jobs.backlog.secrets import redact_text
from spark_jobs.metrics.schema import installed_postgres_driver
from spark_jobs.sources.cdc.lsn import format_lsn, parse_lsn

PLUGIN = "pgoutput"
#: How long a statement on the slot waits for another session to let go of it.
BUSY_WAIT_S = 60.0
#: SQLSTATE of "replication slot ... is active for PID ...".
_OBJECT_IN_USE = "55006"
#: PostgreSQL's rule for slot names, applied to the publication's name too, so both can go
#: into statements and options without quoting.
_NAME = re.compile(r"[a-z0-9_]{1,63}")
#: What every connection that decodes or reads rows sets first: the text of dates, times,
#: bytea and floats in the form ``values.py`` reads.
SESSION_SETTINGS = text(
    "SELECT set_config('DateStyle', 'ISO', false), set_config('TimeZone', 'UTC', false), "
    "set_config('bytea_output', 'hex', false), set_config('extra_float_digits', '1', false)"
)


def check_name(what: str, name: str) -> None:
    """Refuse a slot or publication name PostgreSQL would refuse (or need quoted)."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{what} name {name!r}: use 1 to 63 lower-case letters, digits and underscores"
        )


def check_logical_decoding(url: str) -> None:
    """Refuse a server that cannot decode changes, before anything is created on it."""
    engine = sqlalchemy.create_engine(installed_postgres_driver(make_url(url)))
    try:
        with engine.connect() as connection:
            _check_wal_level(connection, redact_text(url))
    finally:
        engine.dispose()


def _check_wal_level(connection: sqlalchemy.Connection, where: str) -> None:
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
        self._engine = sqlalchemy.create_engine(
            installed_postgres_driver(make_url(url)),
            isolation_level="AUTOCOMMIT",
            pool_pre_ping=True,
        )

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
                connection.execute(
                    text(f"CREATE PUBLICATION {self.publication} FOR TABLE {self._table()}")
                )
            existing = connection.execute(
                text(
                    "SELECT plugin, database, current_database() AS here "
                    "FROM pg_replication_slots WHERE slot_name = :slot"
                ),
                {"slot": self.slot},
            ).first()
            if existing is None:
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

    def peek(
        self, upto_nchanges: int | None = None, upto_lsn: int | None = None
    ) -> list[PeekedRow]:
        """The messages after the slot's position, without consuming them: until the slot is
        advanced, the same bounds return the same rows. Both bounds end at a transaction's
        end: ``upto_nchanges`` once that many rows are out, ``upto_lsn`` with the last
        transaction that ends at or before it. None: no bound. Only WAL the server has
        flushed is decoded: under ``synchronous_commit = off`` a commit shows up to a few
        ``wal_writer_delay`` after it returned."""
        if upto_nchanges is not None and upto_nchanges < 1:
            raise ValueError(f"upto_nchanges = {upto_nchanges!r}: expected None or at least 1")
        statement = text(
            "SELECT lsn::text AS lsn, xid::text::bigint AS xid, data "
            "FROM pg_logical_slot_peek_binary_changes(:slot, CAST(:upto_lsn AS pg_lsn), "
            "CAST(:upto_nchanges AS integer), 'proto_version', '1', "
            "'publication_names', :publication)"
        )
        bounds = {
            "slot": self.slot,
            "publication": self.publication,
            "upto_lsn": None if upto_lsn is None else format_lsn(upto_lsn),
            "upto_nchanges": upto_nchanges,
        }
        rows = self._when_free(statement, bounds).all()
        return [PeekedRow(parse_lsn(row.lsn), row.xid, bytes(row.data)) for row in rows]

    def advance(self, lsn: int) -> int:
        """Consume every transaction that ends at or before ``lsn`` (a Commit's end LSN: a
        position inside a commit record drops that transaction); returns the new position,
        which the server caps at what it has flushed."""
        moved_to = self._when_free(
            text(
                "SELECT end_lsn::text FROM pg_replication_slot_advance(:slot, CAST(:lsn AS pg_lsn))"
            ),
            {"slot": self.slot, "lsn": format_lsn(lsn)},
        ).scalar_one()
        return parse_lsn(moved_to)

    def confirmed_flush_lsn(self) -> int:
        """Where the next peek starts: the position last advanced to."""
        return parse_lsn(self._state()["confirmed_flush_lsn"])

    def current_wal_lsn(self) -> int:
        """How far the server has written WAL (``pg_current_wal_lsn()``): no change decoded
        from this slot ends beyond it."""
        with self._connection() as connection:
            return parse_lsn(connection.execute(text("SELECT pg_current_wal_lsn()::text")).scalar())

    def wal_status(self) -> str:
        """Whether the server still keeps the WAL the slot needs: 'reserved', 'extended' or
        'unreserved' (at risk); a lost slot is an error."""
        return self._state()["wal_status"]

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
                    "SELECT confirmed_flush_lsn::text, wal_status FROM pg_replication_slots "
                    "WHERE slot_name = :slot"
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
        quote = self._engine.dialect.identifier_preparer.quote
        return ".".join(quote(part) for part in self.table.split("."))

    def _when_free(
        self, statement: sqlalchemy.TextClause, parameters: dict[str, Any]
    ) -> sqlalchemy.Result:
        """Run a statement that uses the slot, waiting while another session uses it (the
        planner's peek and an executor's read of one query take turns), for ``BUSY_WAIT_S``."""
        deadline = time.monotonic() + BUSY_WAIT_S
        pause = 0.02
        while True:
            try:
                with self._connection() as connection:
                    result = connection.execute(statement, parameters)
                    return result.freeze()()
            except sqlalchemy.exc.OperationalError as error:
                code = getattr(error.orig, "sqlstate", None) or getattr(error.orig, "pgcode", None)
                if code != _OBJECT_IN_USE:
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
