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
- high watermark: the end of a logical message written just after the read, in a
  transaction that commits with ``synchronous_commit = local``: having written WAL, its commit
  flushes the WAL past the watermark (peeks decode flushed WAL only, and asynchronous commits
  wait for the WAL writer), and it waits for no standby. Every commit the read saw ends
  before it.

A change the read did not see cannot always be applied: under REPLICA IDENTITY DEFAULT an
update that moves a row to a new key and leaves a TOASTed value as it was does not send the
value, and when the row came from a key outside the image, the value is nowhere at hand. The
image is then read again with the row of the key it moved from beside it
(``ValueNotAtHand``): a move the read did not see is applied to that row, read in the same
snapshot, as to the image's own (a move not yet visible, held by a standby, included).
Only rows that keep moving in through ever new keys fail it, after a few reads.

A refresh (``ChunkReader.refresh``) is the same read for a few keys anywhere in the table: the
changelog's way to complete rows it cannot (see ``coverage.py``). Its image also says which of
its keys have no row, as deletes.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.csv as pa_csv
import sqlalchemy
from sqlalchemy import text

from spark_jobs.sources.cdc import generated
from spark_jobs.sources.cdc.bulk import as_literal, copy_out
from spark_jobs.sources.cdc.catalog import CatalogState
from spark_jobs.sources.cdc.changes import Event, RelationCache, RowChange, events
from spark_jobs.sources.cdc.describe import describe_table, key_order
from spark_jobs.sources.cdc.lsn import format_lsn, parse_lsn
from spark_jobs.sources.cdc.messages import UNCHANGED, Begin, Commit, Truncate
from spark_jobs.sources.cdc.pgoutput import decode
from spark_jobs.sources.cdc.slot import (
    SESSION_SETTINGS,
    ReplicationSlot,
    SlotError,
    source_engine,
)
from spark_jobs.sources.cdc.table import Key, Row, TableShape, ValueNotAtHand
from spark_jobs.storage.files import create_file, filesystem, resolve_uri


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


class Keys(Protocol):
    """The keys an image holds."""

    def __contains__(self, key: Key) -> bool: ...


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
    path: str


@dataclass(frozen=True)
class Refresh:
    """The image of ``keys`` (JSON lists, as a chunk's) written to ``path``: ``rows`` of
    them present, the others written as deletes. Every transaction ending by ``settled_at``
    is flushed, the high watermark's own among them: a batch that ends there has passed the
    refresh."""

    keys: list[list[Any]]
    rows: int
    high_watermark: int
    settled_at: int
    path: str


K = TypeVar("K", bound=Keys)

#: Reads of one image before a value still not at hand fails it, and the pause before the
#: first retry (doubling): a move that is flushed but not yet visible shows up meanwhile.
READ_ATTEMPTS = 8
_RETRY_PAUSE_S = 0.05
#: Keys whose rows an image reads beside its own, at most: rows moved in from them.
BESIDE_KEYS = 256


def merge(
    image: pa.Table,
    changes: Iterable[Event],
    table: TableShape,
    keys: Keys,
    high_watermark: int,
    read: Visibility,
    complete: Callable[[pa.Table], pa.Table] = lambda rows: rows,
    around: pa.Table | None = None,
) -> pa.Table:
    """``image`` (the rows as read, in key order, as ``TableShape.typed_table`` gives them)
    with the transactions the read did not see that end at or before ``high_watermark``
    applied in order, for keys in ``keys`` only; sorted by key. Changes are applied as they
    stream by: a transaction is judged at its Begin, by where its commit starts.
    ``ValueNotAtHand`` if a row moved in from a key outside ``keys`` left a value unsent
    and ``around`` (rows read with the image, of keys outside it) does not hold it either.
    ``complete`` gives the rows the changes made their generated values.

    The rows stay in Arrow: only the keys the changes touch are held as Python rows, and
    the image is filtered and reordered once at the end."""
    changed = _Changed(image, table, keys, complete, around)
    applying = False
    for event in changes:
        if isinstance(event, Begin):
            applying = event.final_lsn < high_watermark and not read.sees(event.xid)
        elif isinstance(event, Commit) or not applying:
            continue
        elif isinstance(event, Truncate):
            if table.relation_ids.intersection(event.relation_ids):
                changed.truncate()
        elif event.relation.relation_id == table.oid:
            table.check_relation(event.relation, "while a snapshot chunk was read")
            changed.apply(event)
    return changed.image()


class _Changed:
    """The rows the changes touched, by key (None: deleted), over the image as read and the
    rows read around it (only ever rows a change moves from)."""

    def __init__(
        self,
        image: pa.Table,
        table: TableShape,
        keys: Keys,
        complete: Callable[[pa.Table], pa.Table],
        around: pa.Table | None,
    ):
        self._read, self._table, self._keys_held = image, table, keys
        self._complete, self._around = complete, around
        self._rows: dict[Key, Row | None] = {}
        self._truncated = False

    @cached_property
    def _around_positions(self) -> dict[Key, int]:
        if self._around is None:
            return {}
        return {key: i for i, key in enumerate(self._table.keys_of(self._around))}

    @cached_property
    def _keys(self) -> list[Key]:
        """The image's keys, in its order; read only once a change touches the chunk."""
        return self._table.keys_of(self._read)

    @cached_property
    def _positions(self) -> dict[Key, int]:
        return {key: i for i, key in enumerate(self._keys)}

    def truncate(self) -> None:
        self._rows.clear()
        self._truncated = True

    def apply(self, change: RowChange) -> None:
        """One row change. An update that moves a row to a new key names the old one: a
        delete and an insert. Keys outside the image's are never in it."""
        table = self._table
        old_row = None if change.old is None else table.typed_change(change.old)
        old = None if old_row is None else table.key_of(old_row)
        if change.new is None:
            self._rows[old] = None
            return
        new = table.typed_change(change.new)
        if old_row is not None:  # a TOASTed key (or, under FULL, any value) left unsent
            new = {n: old_row.get(n, v) if v is UNCHANGED else v for n, v in new.items()}
        key = table.key_of(new)
        before = self._row(key if old is None else old)
        if before is None and old is not None and UNCHANGED in new.values():
            raise ValueNotAtHand(
                f"an update of {table.name} moved a row to key {list(table.json_key(key) or [])}"
                f" and left a TOASTed value unchanged, from key "
                f"{list(table.json_key(old) or [])}, whose row is not at hand",
                moved_from=old,
            )
        if old is not None:
            self._rows[old] = None
        if key in self._keys_held or key in self._around_positions:
            self._rows[key] = table.whole_row(new, before)

    def _row(self, key: Key) -> Row | None:
        if key in self._rows:
            return self._rows[key]
        if self._truncated:
            return None
        position = self._positions.get(key)
        if position is not None:
            return self._table.row_at(self._read, position)
        around = self._around_positions.get(key)
        return None if around is None else self._table.row_at(self._around, around)

    def image(self) -> pa.Table:
        """The image as read, less the touched keys' rows, plus their rows now, in key order."""
        if not self._rows and not self._truncated:
            return self._read
        kept = (
            []
            if self._truncated
            else [i for i, key in enumerate(self._keys) if key not in self._rows]
        )
        now = sorted(
            (
                (key, row)
                for key, row in self._rows.items()
                if row is not None and key in self._keys_held
            ),
            key=lambda item: item[0],
        )
        rows = self._complete(pa.table(self._table.arrow_columns([row for _, row in now])))
        combined = pa.concat_tables([self._read.take(pa.array(kept, pa.int64())), rows])
        keys = [self._keys[i] for i in kept] + [key for key, _ in now]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        return combined.take(pa.array(order, pa.int64()))


def write_image(
    path: str,
    table: TableShape,
    image: pa.Table,
    high_watermark: int,
    absent: Collection[Key] = (),
) -> None:
    """Create an image's Arrow IPC file once (StateFileExists if it exists): the table's
    columns, ``_op`` 'snapshot' (and 'delete' for each key ``absent``, its other columns
    null), ``_lsn`` the high watermark, ``_commit_time`` null and ``_unchanged`` empty, as
    ``TableShape.arrow_table`` shapes the changelog's rows too."""
    mark = ("snapshot", high_watermark, 0, None, [])
    for field, value in zip(table.change_fields, mark, strict=True):
        image = image.append_column(field, pa.array([value] * image.num_rows, field.type))
    if absent:
        rows = [table.key_row(key) for key in absent]
        deletes = table.arrow_table(rows, [("delete", high_watermark, 0, None, [])] * len(rows))
        image = pa.concat_tables([image, deletes.cast(image.schema)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, image.schema) as writer:
        writer.write_table(image)
    fs, file_path = filesystem(resolve_uri(path))
    create_file(fs, file_path, sink.getvalue().to_pybytes())


def read_chunk(path: str) -> pa.Table:
    fs, file_path = filesystem(resolve_uri(path))
    with fs.open_input_file(file_path) as handle:
        return pa.ipc.open_file(handle).read_all()


#: The largest block Arrow's CSV reader takes.
_MAX_BLOCK = 2**31 - 1


def _no_pause(step: str) -> None:
    """Nothing to do between the steps of a chunk's read."""


class ChunkReader:
    """Reads ``table`` in chunks through the slot (which must exist) of its publication: as it
    was described when the copy began (a ``TableShape``), or as it is now (its name)."""

    def __init__(self, url: str, table: str | TableShape, slot: ReplicationSlot):
        self._engine = source_engine(url, isolation_level="REPEATABLE READ", pool_pre_ping=True)
        self._name = table.name if isinstance(table, TableShape) else table
        self.table = table if isinstance(table, TableShape) else self.describe()
        self._slot = slot

    def describe(self) -> TableShape:
        """The table as the catalog has it now."""
        return describe_table(self._engine, self._name)

    def catalog(self) -> CatalogState:
        """What the catalog says of the table now, besides its shape (``catalog.py``)."""
        with self._engine.connect() as connection:
            return CatalogState.read(connection, self.table.oid)

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
        bounds: tuple[str, list[Any]] = ("", [])
        if after is not None:
            where = f"WHERE ({self._key_order}) > ({self._key_values}) "
            bounds = (where, self.table.json_key(after) or [])

        def keys_of(read: pa.Table) -> KeyRange:
            last = None
            if read.num_rows == chunk_rows:
                last = self.table.keys_of(read.slice(chunk_rows - 1))[0]
            return KeyRange(after, last)

        image, keys, low, high = self._image(*bounds, chunk_rows, keys_of, pause)
        write_image(path, self.table, image, high)
        last = self.table.json_key(keys.last)
        return Chunk(after_key, last, image.num_rows, low, high, path)

    def refresh(self, keys: Collection[Key], path: str) -> Refresh:
        """The rows of ``keys`` now, merged as a chunk is and written to ``path``, the keys
        with no row as deletes."""
        rows = [self.table.json_key(key) or [] for key in keys]
        wanted = frozenset(keys)
        image, _, _, high = self._image(*self._where_keys(keys), None, lambda _: wanted, _no_pause)
        present = set(self.table.keys_of(image))
        write_image(path, self.table, image, high, sorted(wanted - present))
        return Refresh(rows, image.num_rows, high, self._slot.current_wal_lsn(), path)

    def close(self) -> None:
        self._engine.dispose()

    def _where_keys(self, keys: Collection[Key]) -> tuple[str, list[Any]]:
        """The condition (with its values) that selects the rows of ``keys``."""
        where = (
            f"WHERE ({self._key_order}) IN ({', '.join([f'({self._key_values})'] * len(keys))}) "
        )
        return where, [v for key in keys for v in self.table.json_key(key) or []]

    @cached_property
    def _key_order(self) -> str:
        """The key's order, as ``copy_out`` renders it (names may hold a '%')."""
        return as_literal(key_order(self.table, "t."))

    @cached_property
    def _key_values(self) -> str:
        """Placeholders for one key's values, each cast to its column's type."""
        return ", ".join(f"CAST(%s AS {as_literal(c.type_name)})" for c in self.table.key_columns)

    def _image(
        self,
        where: str,
        values: list[Any],
        limit: int | None,
        keys_of: Callable[[pa.Table], K],
        pause: Callable[[str], None],
    ) -> tuple[pa.Table, K, int, int]:
        """The rows ``where`` selects (at most ``limit``) between a low and a high watermark,
        merged with what the read did not see for the keys ``keys_of`` the rows read: the
        image, those keys, its low and its high watermark. Read again while a row moved in
        is not at hand, with the row it moved from read beside it from then on (a key it
        came through, a temporary key of swaps, say; or a move not visible yet, whose old
        row still is)."""
        pause_s, beside, attempt = _RETRY_PAUSE_S, [], 0
        while True:
            low, read, found, around = self._read(where, values, limit, pause, beside)
            keys = keys_of(found)
            pause("read")
            high = self._high_watermark()
            start = self._slot.confirmed_flush_lsn()
            if start > low:
                raise SlotError(
                    f"replication slot {self._slot.slot!r} is at {format_lsn(start)}, past the "
                    f"low watermark {format_lsn(low)} of a chunk of {self.table.name}: changes "
                    "the chunk's read missed are gone; take the snapshot before advancing the "
                    "slot"
                )
            peeked = (decode(row.data) for row in self._slot.stream(upto_lsn=high))
            try:
                merged = merge(
                    found,
                    events(peeked, RelationCache()),
                    self.table,
                    keys,
                    high,
                    read,
                    lambda rows: generated.compute(self.table, rows, self._slot.select),
                    around,
                )
            except ValueNotAtHand as missing:
                new_key = missing.moved_from is not None and missing.moved_from not in beside
                if new_key and len(beside) < BESIDE_KEYS:
                    beside.append(missing.moved_from)
                    continue
                attempt += 1
                if attempt == READ_ATTEMPTS:
                    raise ValueNotAtHand(
                        f"{missing}, in each of {READ_ATTEMPTS} reads of an image of "
                        f"{self.table.name}: a row keeps moving in while it is read"
                    ) from None
                time.sleep(pause_s)
                pause_s *= 2
                continue
            return merged, keys, low, high

    def _read(
        self,
        where: str,
        values: list[Any],
        limit: int | None,
        pause: Callable[[str], None],
        beside: Collection[Key] = (),
    ) -> tuple[int, Visibility, pa.Table, pa.Table | None]:
        """The low watermark, then in one transaction its snapshot, the rows, and the rows
        of the keys ``beside``."""
        with self._engine.connect() as connection:
            connection.execute(SESSION_SETTINGS)
            low = connection.execute(text("SELECT pg_current_wal_insert_lsn()::text")).scalar()
            connection.commit()
            pause("low")
            snapshot = connection.execute(text("SELECT pg_current_snapshot()::text")).scalar()
            found = self._copy(connection, where, values, limit)
            around = self._copy(connection, *self._where_keys(beside), None) if beside else None
            connection.commit()
        return parse_lsn(low), Visibility.parse(snapshot), found, around

    def _copy(
        self, connection: sqlalchemy.Connection, where: str, values: list[Any], limit: int | None
    ) -> pa.Table:
        """The rows ``where`` selects in key order (at most ``limit``), through ``COPY``: its
        text comes from each type's output function, as the changelog's does (a cast to
        text differs: ``true`` for 't', ``char(n)`` without its padding). Each line leads with
        a constant, which Arrow drops: it takes a byte-order mark that starts its input for
        no value, and would strip a U+FEFF that starts the first row's first value."""
        columns = self.table.columns
        selected = as_literal(f"SELECT 0, {', '.join(f't.{c.sql}' for c in columns)} FROM ")
        query = f"{selected}{as_literal(self.table.name)} t {where}ORDER BY {self._key_order}"
        if limit is not None:
            query, values = f"{query} LIMIT %s", [*values, limit]
        buffer = copy_out(connection, query, values)
        names = [f"c{i}" for i in range(len(columns))]
        if not buffer:
            return self.table.typed_table(pa.table({n: pa.array([], pa.string()) for n in names}))
        found = pa_csv.read_csv(
            io.BytesIO(buffer),
            # One block: a row may be larger than Arrow's 1 MiB default, which it cannot
            # read across more than two blocks.
            read_options=pa_csv.ReadOptions(
                column_names=["lead", *names], block_size=min(len(buffer) + 1, _MAX_BLOCK)
            ),
            parse_options=pa_csv.ParseOptions(newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(
                include_columns=names,
                column_types=dict.fromkeys(names, pa.string()),
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
        return self.table.typed_table(found)

    def _high_watermark(self) -> int:
        with self._engine.begin() as connection:
            connection.execute(text("SET LOCAL synchronous_commit = local"))
            return parse_lsn(
                connection.execute(
                    text("SELECT pg_logical_emit_message(true, :prefix, 'high watermark')::text"),
                    {"prefix": self._slot.position_prefix},
                ).scalar()
            )
