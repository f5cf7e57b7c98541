"""A table's snapshot in primary-key chunks, each merged with the changes made while it was read.

Flink CDC's watermark algorithm over the SQL slot functions: a chunk's rows are read in one
REPEATABLE READ transaction between two WAL positions, the low and the high watermark; the
transactions the read did not see that end by the high watermark are then applied to its
rows by key. Each key's image is the table as of the high watermark, so the changelog reader
emits, for a key, only transactions that end after its chunk's high watermark: none is lost,
none applied twice. The slot is peeked, never advanced.

What the image holds is decided by the read's own snapshot (``pg_current_snapshot()``), not by
LSNs alone: a commit's WAL record is written before the commit becomes visible, so one that
ends just before the low watermark can still be invisible to the read, and one that commits
between the low watermark and the read is visible. A transaction is applied when it ends at
or before the high watermark and the read did not see it. (Applying a seen one again would
be harmless, as a key's writes are serialized by its row lock, but is not needed.)

- low watermark: ``pg_current_wal_insert_lsn()`` just before the read's transaction. The slot
  must not be past it, or the peek would miss what the read did not see.
- high watermark: the end of a logical message (which pgoutput does not send) written just
  after the read, in a transaction that commits with ``synchronous_commit = on``: having
  written WAL, its commit flushes the WAL past the watermark (peeks decode flushed WAL only,
  and asynchronous commits wait for the WAL writer). Every commit the read saw ends before it.
- ``as_of``: the high watermark is rarely a commit's end, and advancing the slot inside a
  commit record drops that transaction. So a chunk also keeps the end of the last transaction
  peeked that ends by its high watermark (all are in the image), or the slot's position if
  there was none: the furthest commit end an offset may store on this chunk's account.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import sqlalchemy
from sqlalchemy import text
from sqlalchemy.engine import make_url

from spark_jobs.metrics.schema import installed_postgres_driver
from spark_jobs.sources.cdc.changes import RelationCache, Transaction, transactions
from spark_jobs.sources.cdc.lsn import format_lsn, parse_lsn
from spark_jobs.sources.cdc.messages import Truncate
from spark_jobs.sources.cdc.pgoutput import decode
from spark_jobs.sources.cdc.slot import SESSION_SETTINGS, ReplicationSlot, SlotError
from spark_jobs.sources.cdc.table import Key, Row, TableShape, describe_table
from spark_jobs.sources.cdc.values import typed_row
from spark_jobs.sources.storage import create_file, filesystem, resolve_uri


@dataclass(frozen=True)
class Visibility:
    """Which transactions a read saw: ``pg_current_snapshot()``'s xmax and running xids
    (64-bit); every xid below xmax that is not running had ended."""

    xmax: int
    running: frozenset[int]

    @classmethod
    def parse(cls, snapshot: str) -> Visibility:
        _, xmax, running = snapshot.split(":")
        return cls(int(xmax), frozenset(int(x) for x in running.split(",") if x))

    def sees(self, xid: int) -> bool:
        """Whether the read saw decoded (32-bit) ``xid``'s commit. Decoded transactions are
        recent, so ``xid`` is taken as the 64-bit id nearest ``xmax``."""
        full = self.xmax + (xid - self.xmax + 2**31) % 2**32 - 2**31
        return full < self.xmax and full not in self.running


@dataclass(frozen=True)
class KeyRange:
    """Keys after ``after`` up to ``last``; None: unbounded (first or last chunk)."""

    after: Key | None
    last: Key | None

    def __contains__(self, key: Key) -> bool:
        return (self.after is None or key > self.after) and (self.last is None or key <= self.last)


@dataclass(frozen=True)
class Chunk:
    """A chunk written to ``path``. Keys are JSON lists (ints as ints, other values as
    PostgreSQL reads their text); ``last_key`` None marks the table's last chunk."""

    after_key: list[Any] | None
    last_key: list[Any] | None
    rows: int
    low_watermark: int
    high_watermark: int
    as_of: int
    path: str


def merge(
    rows: Iterable[Row],
    changes: Iterable[Transaction],
    table: TableShape,
    keys: KeyRange,
    high_watermark: int,
    read: Visibility,
) -> list[Row]:
    """``rows`` (typed, as read) with the transactions the read did not see that end at or
    before ``high_watermark`` applied in order, for keys in ``keys`` only; sorted by key."""
    image = {table.key_of(row): row for row in rows}
    for transaction in changes:
        if transaction.end_lsn > high_watermark or read.sees(transaction.xid):
            continue
        for change in transaction.changes:
            if isinstance(change, Truncate):
                if table.oid in change.relation_ids:
                    image.clear()
                continue
            if change.relation.relation_id != table.oid:
                continue
            # An update that moves a row to a new key names the old one: a delete and an
            # insert. Keys outside the range are never in the image.
            old = (
                None if change.old is None else table.key_of(typed_row(change.relation, change.old))
            )
            if change.new is None:
                image.pop(old, None)
                continue
            new = typed_row(change.relation, change.new)
            key = table.key_of(new)
            before = image.get(key) if old is None else image.pop(old, None)
            if key in keys:
                image[key] = table.whole_row(new, before)
    return [image[key] for key in sorted(image)]


def write_chunk(path: str, table: TableShape, rows: list[Row], high_watermark: int) -> None:
    """Create the chunk's Arrow IPC file once (StateFileExists if it exists): the table's
    columns, ``_op`` 'snapshot', ``_lsn`` the high watermark, ``_commit_time`` null and
    ``_unchanged`` empty, as ``TableShape.arrow_table`` shapes the changelog's rows too."""
    image = table.arrow_table(rows, [("snapshot", high_watermark, 0, None, [])] * len(rows))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, image.schema) as writer:
        writer.write_table(image)
    fs, file_path = filesystem(resolve_uri(path))
    create_file(fs, file_path, sink.getvalue().to_pybytes())


def read_chunk(path: str) -> pa.Table:
    fs, file_path = filesystem(resolve_uri(path))
    with fs.open_input_file(file_path) as handle:
        return pa.ipc.open_file(handle).read_all()


def _no_pause(step: str) -> None:
    """Nothing to do between the steps of a chunk's read."""


class ChunkReader:
    """Reads ``table`` in chunks through the slot (which must exist) of its publication."""

    def __init__(self, url: str, table: str, slot: ReplicationSlot):
        self._engine = sqlalchemy.create_engine(
            installed_postgres_driver(make_url(url)),
            isolation_level="REPEATABLE READ",
            pool_pre_ping=True,
        )
        self.table = describe_table(self._engine, table)
        self._slot = slot

    def next_chunk(
        self,
        after_key: list[Any] | None,
        chunk_rows: int,
        path: str,
        pause: Callable[[str], None] = _no_pause,
    ) -> Chunk:
        """The ``chunk_rows`` keys after ``after_key`` (None: from the first), merged and
        written to ``path``. Fewer rows read than asked make it the last chunk. ``pause``
        runs after the low watermark ('low') and after the read ('read')."""
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows = {chunk_rows!r}: expected at least 1")
        after = None if after_key is None else self.table.typed_key(after_key)
        low, read, rows = self._read(after, chunk_rows, pause)
        pause("read")
        high = self._high_watermark()
        start = self._slot.confirmed_flush_lsn()
        if start > low:
            raise SlotError(
                f"replication slot {self._slot.slot!r} is at {format_lsn(start)}, past the "
                f"low watermark {format_lsn(low)} of a chunk of {self.table.name}: changes the "
                "chunk's read missed are gone; take the snapshot before advancing the slot"
            )
        peeked = self._slot.peek(upto_lsn=high)
        changes = transactions((decode(row.data) for row in peeked), RelationCache())
        last = self.table.key_of(rows[-1]) if len(rows) == chunk_rows else None
        merged = merge(rows, changes, self.table, KeyRange(after, last), high, read)
        write_chunk(path, self.table, merged, high)
        as_of = max((t.end_lsn for t in changes if t.end_lsn <= high), default=start)
        return Chunk(after_key, self.table.json_key(last), len(merged), low, high, as_of, path)

    def close(self) -> None:
        self._engine.dispose()

    def _read(
        self, after: Key | None, limit: int, pause: Callable[[str], None]
    ) -> tuple[int, Visibility, list[Row]]:
        """The low watermark, then in one transaction its snapshot and the chunk's rows."""
        with self._engine.connect() as connection:
            connection.execute(SESSION_SETTINGS)
            low = connection.execute(text("SELECT pg_current_wal_insert_lsn()::text")).scalar()
            connection.commit()
            pause("low")
            snapshot = connection.execute(text("SELECT pg_current_snapshot()::text")).scalar()
            found = connection.execute(
                self.table.chunk_query(bounded=after is not None),
                {**{f"k{i}": str(value) for i, value in enumerate(after or ())}, "limit": limit},
            ).all()
            connection.commit()
        return parse_lsn(low), Visibility.parse(snapshot), [self.table.typed_row(r) for r in found]

    def _high_watermark(self) -> int:
        with self._engine.begin() as connection:
            connection.execute(text("SET LOCAL synchronous_commit = on"))
            return parse_lsn(
                connection.execute(
                    text("SELECT pg_logical_emit_message(true, 'cdc', 'high watermark')::text")
                ).scalar()
            )
