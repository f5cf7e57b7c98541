"""Sample data for the PostgreSQL CDC source: an accounts table to snapshot, and a writer that
keeps changing it while the snapshot and the changelog are read.

The snapshot is read in primary-key chunks while transactions go on, and the changelog must
carry on exactly where each chunk's image ends. The writer makes the changes where that goes
wrong: a key inserted after every chunk, a row deleted or moved to another key behind or
ahead of the read, and one transaction touching both the first chunks and the last. Every
write adds one to the row's ``version`` (a new row starts at 1), so a consumer can check per
key that the versions after its snapshot image are consecutive (no change lost, none applied
twice), and compare its final rows with ``table_rows``.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

import sqlalchemy
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from spark_jobs.metrics.schema import installed_postgres_driver

INSERT = "insert"
UPDATE = "update"
DELETE = "delete"
#: A primary-key update: the row moves to a fresh id, which the changelog shows as the old
#: key gone and a new one present.
MOVE = "move"
#: Two far-apart rows (one among the first tenth of the keys, one among the last) updated in
#: one transaction: its changes fall into chunks read at very different times.
PAIR = "pair"
KINDS = (INSERT, UPDATE, DELETE, MOVE, PAIR)
#: Mostly updates, as in an OLTP table; inserts outnumber deletes and moves, so a long run
#: does not empty the table.
DEFAULT_WEIGHTS: Mapping[str, float] = {INSERT: 3, UPDATE: 4, DELETE: 1, MOVE: 1, PAIR: 1}

#: Short enough that ``<table>_fresh_ids`` is still a PostgreSQL identifier (63 bytes).
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,47}")
#: A pair's rows come from the first and the last tenth of the key range.
_PAIR_SPREAD = 0.1
#: Attempts to find an existing row before a change becomes an insert (the table is empty,
#: or other sessions keep deleting the rows found).
_PICK_ATTEMPTS = 3
#: How far behind its schedule the writer may fall before it stops catching up: after a
#: stall it resumes at its rate instead of bursting.
_MAX_LAG_S = 1.0
#: The pause after a failed transaction (the server gone, say) before the next try.
_RETRY_PAUSE_S = 0.5


class Account(NamedTuple):
    """One row of an accounts table without its key."""

    version: int
    balance: int
    note: str | None
    updated_at: datetime


def _identifier(name: str) -> str:
    """``name`` if it can go into SQL as is: the writer builds its statements with it."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(
            f"table name {name!r}: use 1-48 lower-case letters, digits and underscores, "
            "not starting with a digit"
        )
    return name


def _engine(url: str, **settings: str) -> sqlalchemy.Engine:
    """An engine for ``url`` with whichever driver is installed and the session settings."""
    parsed = installed_postgres_driver(make_url(url))
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"{url!r} is not a PostgreSQL URL")
    connect_args: dict[str, object] = {"connect_timeout": 5}
    if settings:
        connect_args["options"] = " ".join(f"-c {name}={value}" for name, value in settings.items())
    return sqlalchemy.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)


def fresh_ids(table: str) -> str:
    """The sequence that hands out the table's new ids.

    A sequence, not ``max(id) + 1``: an id is never handed out twice, even after its row was
    deleted or moved, or by a second writer, so a key's versions in a changelog never belong
    to two different rows.
    """
    return f"{_identifier(table)}_fresh_ids"


def create_accounts(url: str, table: str, rows: int) -> None:
    """Create ``table`` with ids 1..``rows`` at version 1, and its ``fresh_ids`` sequence.

    One INSERT ... SELECT over generate_series, so the server makes the rows itself: a million
    take seconds, where a round trip per row would take minutes. Every tenth note is NULL, so
    a consumer's nulls are tested from the snapshot on. The table is analyzed, so the planner
    (and a reader sizing chunks from pg_class) sees its size at once. Fails if it exists.
    """
    if rows < 0:
        raise ValueError(f"rows must be 0 or more, not {rows}")
    table = _identifier(table)
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    f"CREATE TABLE {table} ("
                    "id bigint PRIMARY KEY, version bigint NOT NULL, balance bigint NOT NULL, "
                    "note text, updated_at timestamptz NOT NULL DEFAULT now())"
                )
            )
            connection.execute(
                text(
                    f"INSERT INTO {table} (id, version, balance, note) "
                    "SELECT g, 1, (g * 7919) % 100000, "
                    "CASE WHEN g % 10 = 0 THEN NULL ELSE 'account ' || g END "
                    "FROM generate_series(1, CAST(:rows AS bigint)) AS g"
                ),
                {"rows": rows},
            )
            connection.execute(
                text(
                    f"CREATE SEQUENCE {fresh_ids(table)} AS bigint START {rows + 1} "
                    f"OWNED BY {table}.id"
                )
            )
            connection.execute(text(f"ANALYZE {table}"))
    finally:
        engine.dispose()


def table_rows(url: str, table: str) -> dict[int, Account]:
    """The table's current rows by id, to compare with what a sink holds."""
    table = _identifier(table)
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            result = connection.execute(
                text(f"SELECT id, version, balance, note, updated_at FROM {table} ORDER BY id")
            )
            return {row[0]: Account(*row[1:]) for row in result}
    finally:
        engine.dispose()


class ChangeWriter:
    """A background thread committing random changes to an accounts table at a steady rate.

    ``with ChangeWriter(url, "accounts", transactions_per_s=50) as writer: ...`` or
    ``start()`` ... ``stop()``. Each transaction is one of ``KINDS``, drawn by a
    ``random.Random(seed)`` with ``weights``; ``counts`` says how many of each committed,
    ``rows_changed`` how many rows they wrote. An update changes ``rows_per_update``
    consecutive rows in one statement, so a high rate of changes costs few transactions.
    Rows to change are looked up when changed, so rows deleted meanwhile by anyone are
    skipped; with no row left, the change becomes an insert. New ids come from the table's
    ``fresh_ids`` sequence (created, from the largest id, if the table has none).

    It commits with ``synchronous_commit = on``: logical decoding reads only flushed WAL, so
    on a server with asynchronous commit (the throwaway ones) a commit would reach the
    changelog some hundred milliseconds late, and "all that was written was read" could not
    be checked right after ``stop()``.

    A transaction that fails on the server's state (the server away, a deadlock with another
    session, a statement timeout) is counted in ``failures`` and another one is tried after a
    pause, so a demo outlives a restart of its database; one whose connection broke during
    the commit may have committed all the same, so after failures the table, not ``counts``,
    is the truth. Any other error (the table dropped, a bug) ends the thread and is raised by
    ``stop()``.
    """

    def __init__(
        self,
        url: str,
        table: str,
        *,
        transactions_per_s: float = 20.0,
        seed: int = 0,
        weights: Mapping[str, float] = DEFAULT_WEIGHTS,
        max_transactions: int | None = None,
        rows_per_update: int = 1,
    ):
        if not transactions_per_s > 0:
            raise ValueError(f"transactions_per_s must be above 0, not {transactions_per_s}")
        if rows_per_update < 1:
            raise ValueError(f"rows_per_update must be at least 1, not {rows_per_update}")
        unknown = set(weights) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown kinds of change {sorted(unknown)}; use {KINDS}")
        self.url = url
        self.table = _identifier(table)
        self.transactions_per_s = transactions_per_s
        self.max_transactions = max_transactions
        self.rows_per_update = rows_per_update
        self._kinds = [kind for kind in KINDS if weights.get(kind, 0) > 0]
        self._weights = [weights[kind] for kind in self._kinds]
        if not self._kinds:
            raise ValueError("weights choose no kind of change")
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(KINDS, 0)
        self._rows_changed = 0
        #: Rows the open transaction wrote so far.
        self._written = 0
        self._failures = 0
        self._stop = threading.Event()
        self._engine: sqlalchemy.Engine | None = None
        self._thread: threading.Thread | None = None
        #: Why the thread ended early, if it did.
        self.error: BaseException | None = None
        #: The last failed transaction's error.
        self.last_failure: BaseException | None = None
        # The key range rows are picked from; set from the table on start.
        self._low = 1
        self._high = 0

    @property
    def counts(self) -> dict[str, int]:
        """Committed transactions of each kind so far."""
        with self._lock:
            return dict(self._counts)

    @property
    def transactions(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    @property
    def rows_changed(self) -> int:
        """Rows written by the committed transactions (a moved row counts once)."""
        with self._lock:
            return self._rows_changed

    @property
    def failures(self) -> int:
        with self._lock:
            return self._failures

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> ChangeWriter:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> ChangeWriter:
        if self._thread is not None:
            raise RuntimeError("a ChangeWriter starts once")
        self._engine = _engine(
            self.url,
            synchronous_commit="on",
            # Bounds how long stop() can wait on a statement stuck behind a lock.
            statement_timeout="5000",
        )
        with self._engine.begin() as connection:
            self._prepare(connection)
        self._thread = threading.Thread(
            target=self._run, name=f"change-writer-{self.table}", daemon=True
        )
        self._thread.start()
        return self

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until the writer ends by itself (``max_transactions``); True if it has."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.running

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the transaction in flight; raise what ended the thread, if anything.

        Waits at most ``timeout_s`` (a statement gives up after 5 s, connecting after 5 s)
        and raises TimeoutError if the thread is still running then.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"the writer on {self.table} still runs after {timeout_s}s")
        if self._engine is not None:
            self._engine.dispose()
        if self.error is not None:
            raise self.error

    def _prepare(self, connection: sqlalchemy.Connection) -> None:
        sequence = fresh_ids(self.table)
        low, high = connection.execute(
            text(f"SELECT coalesce(min(id), 1), coalesce(max(id), 0) FROM {self.table}")
        ).one()
        # A table made elsewhere gets its sequence here, starting after its largest id.
        connection.execute(
            text(f"CREATE SEQUENCE IF NOT EXISTS {sequence} AS bigint START {high + 1}")
        )
        last = connection.execute(text(f"SELECT last_value FROM {sequence}")).scalar_one()
        self._low, self._high = low, max(high, last)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as error:
            self.error = error

    def _loop(self) -> None:
        assert self._engine is not None
        interval = 0.0 if math.isinf(self.transactions_per_s) else 1 / self.transactions_per_s
        due = time.monotonic()
        while not self._stop.is_set():
            if self.max_transactions is not None and self.transactions >= self.max_transactions:
                return
            delay = due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            due = max(due + interval, time.monotonic() - _MAX_LAG_S)
            kind = self._random.choices(self._kinds, self._weights)[0]
            try:
                self._written = 0
                with self._engine.begin() as connection:
                    kind = self._change(connection, kind)
            except OperationalError as failure:
                with self._lock:
                    self._failures += 1
                self.last_failure = failure
                self._stop.wait(_RETRY_PAUSE_S)
                continue
            with self._lock:
                self._counts[kind] += 1
                self._rows_changed += self._written

    def _change(self, connection: sqlalchemy.Connection, kind: str) -> str:
        """Make one change of ``kind`` in the open transaction; return the kind made."""
        if kind == INSERT:
            self._insert(connection)
            return INSERT
        span = self._high - self._low
        if kind == PAIR:
            first = self._pick(connection, self._low + self._random.random() * span * _PAIR_SPREAD)
            last = self._pick(
                connection, self._high - self._random.random() * span * _PAIR_SPREAD, upward=False
            )
            if first is None or last is None:
                self._insert(connection)
                return INSERT
            self._update(connection, first)
            if last == first:
                return UPDATE
            self._update(connection, last)
            return PAIR
        row = self._pick(connection, self._low + self._random.random() * span)
        if row is None:
            self._insert(connection)
            return INSERT
        if kind == UPDATE:
            self._update(connection, row, self.rows_per_update)
        elif kind == DELETE:
            self._write(connection, f"DELETE FROM {self.table} WHERE id = :id", id=row)
        else:
            new = self._fresh_id(connection)
            self._write(
                connection,
                f"UPDATE {self.table} SET id = :new, version = version + 1, updated_at = now() "
                "WHERE id = :id",
                id=row,
                new=new,
            )
        return kind

    def _pick(
        self, connection: sqlalchemy.Connection, near: float, upward: bool = True
    ) -> int | None:
        """An existing id near ``near``, locked for this transaction, or None if there is none.

        The first id at or after ``near`` (at or before it if not ``upward``), else the nearest
        the other way. Another session's delete can make the lock find nothing (PostgreSQL then
        returns no row), hence a few attempts.
        """
        key = int(near)
        after = f"SELECT id FROM {self.table} WHERE id >= :key ORDER BY id LIMIT 1 FOR UPDATE"
        before = f"SELECT id FROM {self.table} WHERE id <= :key ORDER BY id DESC LIMIT 1 FOR UPDATE"
        for _ in range(_PICK_ATTEMPTS):
            for query in (after, before) if upward else (before, after):
                found = connection.execute(text(query), {"key": key}).scalar()
                if found is not None:
                    return int(found)
        return None

    def _update(self, connection: sqlalchemy.Connection, row: int, rows: int = 1) -> None:
        """Row ``row`` and the ``rows - 1`` after it in key order, locked first."""
        delta = self._random.choice((-1, 1)) * self._random.randint(1, 1000)
        change = "SET version = version + 1, balance = balance + :delta, updated_at = now()"
        if rows == 1:
            self._write(
                connection, f"UPDATE {self.table} {change} WHERE id = :id", id=row, delta=delta
            )
            return
        locked = f"SELECT id FROM {self.table} WHERE id >= :id ORDER BY id LIMIT :rows FOR UPDATE"
        self._written += connection.execute(
            text(f"UPDATE {self.table} {change} WHERE id IN ({locked})"),
            {"id": row, "rows": rows, "delta": delta},
        ).rowcount

    def _insert(self, connection: sqlalchemy.Connection) -> None:
        new = self._fresh_id(connection)
        connection.execute(
            text(
                f"INSERT INTO {self.table} (id, version, balance, note) "
                "VALUES (:id, 1, :balance, :note)"
            ),
            {"id": new, "balance": self._random.randint(0, 99_999), "note": f"account {new}"},
        )
        self._written += 1

    def _fresh_id(self, connection: sqlalchemy.Connection) -> int:
        new = int(
            connection.execute(text(f"SELECT nextval('{fresh_ids(self.table)}')")).scalar_one()
        )
        self._high = max(self._high, new)
        return new

    def _write(self, connection: sqlalchemy.Connection, statement: str, **values: object) -> None:
        """Run a write to a row this transaction locked; it must change exactly that row."""
        changed = connection.execute(text(statement), values).rowcount
        if changed != 1:
            raise RuntimeError(f"{statement!r} with {values} changed {changed} rows, not 1")
        self._written += 1
