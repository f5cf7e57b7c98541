"""The changelog phase of the CDC source: a table's row changes after its snapshot, in batches.

A batch is the range of WAL positions (start, end]: the transactions whose commits end in it.
Every end ``plan`` gives is a commit's end, because advancing the slot to a position inside a
commit record silently drops that transaction. ``read`` peeks the slot up to the end and skips
what ends by the start, so reading a batch again, however much was written since, returns the
same rows; ``commit`` advances the slot only once a batch can no longer be replayed.

Planning counts transactions on the server (``ReplicationSlot.summary``), and reading streams
the changes in pieces of at most ``PIECE_ROWS`` rows, a transaction larger than that spilled
to a local file until its commit names its end: memory stays flat whatever a transaction's
size.

Rows have the snapshot's form (``TableShape.arrow_table``) so the two phases share a schema:

- an insert or an update is the whole new row; a delete is the key, other columns null;
- an update that changes the primary key is a 'delete' of the old key followed by an
  'insert' of the new row, so a consumer that merges by key removes the old one;
- a TOASTed value an update left unchanged is not sent again by the server. It is taken from
  the old row when the update carries one (REPLICA IDENTITY FULL); otherwise it is null and
  its column is named in ``_unchanged``: the consumer keeps the value it has (for a key
  update's 'insert', the value of the row deleted just before it).

A transaction that changed no row of the table but carries this slot's heartbeat is a
position only: a batch may end at it, so the slot follows the server's WAL while the table
is quiet (``slot.py``).

The rows decoded are only right while the table has the columns it was described with, so a
TRUNCATE of it or a change decoded with other columns stops the changelog with an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from spark_jobs.sources.cdc import generated
from spark_jobs.sources.cdc.changes import (
    Change,
    ChangeStreamError,
    RelationCache,
    events,
)
from spark_jobs.sources.cdc.coverage import SnapshotCoverage
from spark_jobs.sources.cdc.lsn import format_lsn
from spark_jobs.sources.cdc.messages import UNCHANGED, Begin, Commit, Truncate
from spark_jobs.sources.cdc.pgoutput import decode
from spark_jobs.sources.cdc.slot import ReplicationSlot, SlotError
from spark_jobs.sources.cdc.spill import OpenTransaction, Pieces
from spark_jobs.sources.cdc.table import START_OVER, Key, Row, TableChangedError, TableShape

#: Rows per Arrow piece ``read`` yields.
PIECE_ROWS = 10_000


@dataclass(frozen=True)
class _RowOfChange:
    """One row a change makes: its ``_op``, key, values and the columns left unsent."""

    op: str
    key: Key
    row: Row
    unchanged: list[str]

    @classmethod
    def delete(cls, table: TableShape, old: Row | None) -> _RowOfChange:
        assert old is not None, "a delete names the row's key"
        key = table.key_of(old)
        return cls("delete", key, table.key_row(key), [])


class Changelog:
    """Batches of the changes of ``table`` (as described) through ``slot``, its publication's."""

    def __init__(self, slot: ReplicationSlot, table: TableShape):
        self._slot = slot
        self.table = table
        self.schema = table.arrow_table([], []).schema
        #: Whether the last ``plan`` left transactions after its end for the next one.
        self.more_after = False
        #: Rows the last ``plan``'s batch moves to new keys (whose values may be incomplete).
        self.moves = 0
        #: Where the first transaction not visible yet ends, if the last ``plan`` stopped
        #: before one.
        self.blocked_at: int | None = None

    def plan(self, start_lsn: int, max_changes: int | None = None) -> int:
        """The end of the batch after ``start_lsn``: the commit end of the last transaction
        that fits in ``max_changes`` row changes (None: no limit), ``start_lsn`` when nothing
        is new. A transaction is never split: one larger than the limit is a batch alone.
        The batch ends before the first transaction that is not visible yet (``slot.py``)."""
        if max_changes is not None and max_changes < 1:
            raise ValueError(f"max_changes = {max_changes!r}: expected None or at least 1")
        limit = max_changes
        while True:
            # The peek starts at the slot, maybe before start_lsn, so it may need more rows.
            summary = self._slot.summary(start_lsn, max_changes, upto_nchanges=limit)
            self._check_position(start_lsn)
            end = start_lsn if summary.end is None else summary.end
            full = max_changes is not None and summary.changes >= max_changes
            blocked = summary.blocked_at is not None
            if full or summary.left_out or blocked or limit is None or summary.messages < limit:
                self.more_after = full or summary.left_out > 0 or blocked
                self.moves, self.blocked_at = summary.moves, summary.blocked_at
                return end
            # Past what this peek saw: a transaction larger than the limit is read once more
            # at most, not once per doubling.
            limit = max(2 * limit, summary.messages + limit)

    def plan_until(self, start_lsn: int, upto_lsn: int) -> int:
        """The end of the batch after ``start_lsn`` that takes every transaction ending by
        ``upto_lsn``, or the visible ones before the first that is not (``start_lsn``: none)."""
        summary = self._slot.summary(start_lsn, None, None, upto_lsn)
        self._check_position(start_lsn)
        self.moves, self.blocked_at = summary.moves, summary.blocked_at
        return start_lsn if summary.end is None else summary.end

    def read(
        self, start_lsn: int, end_lsn: int, coverage: SnapshotCoverage | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The row changes of the transactions that end in (``start_lsn``, ``end_lsn``], in
        commit order and pieces of at most ``PIECE_ROWS``, with ``_op``, ``_lsn`` (the
        commit's end), ``_seq`` (the row's place among the transaction's rows of the table),
        ``_commit_time`` and ``_unchanged``; without the changes of a key whose snapshot
        image holds them already, by ``coverage``. Nothing when the batch is empty."""
        pieces = Pieces(self.table, PIECE_ROWS)
        current = OpenTransaction(self.table, PIECE_ROWS)
        for begin, change in self._row_changes(start_lsn, end_lsn):
            if isinstance(change, Commit):
                yield from self._generated(current.close(change.end_lsn, pieces))
            elif coverage is not None and coverage.has(change.key, begin.final_lsn):
                current.skip()
            else:
                current.add(change.row, change.op, begin.commit_time, change.unchanged)
        yield from self._generated(pieces.rest())

    def _generated(self, pieces: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Pieces with their generated columns' values, which no change carries."""
        for piece in pieces:
            if not self.table.generated_columns:
                yield piece
                continue
            rows = generated.fill(self.table, pa.Table.from_batches([piece]), self._slot.select)
            yield from rows.to_batches()

    def incomplete_rows(
        self, start_lsn: int, end_lsn: int, coverage: SnapshotCoverage | None = None
    ) -> list[Key]:
        """The keys whose rows ``read`` would give without a value the row has: the insert
        of a key move that left a TOASTed value unsent (under REPLICA IDENTITY DEFAULT no
        change says what it was), an update whose generated value reads such a value and a
        sent one (``generated.incomplete``). Only a refresh of the key completes them."""
        found: dict[Key, None] = {}
        for begin, change in self._row_changes(start_lsn, end_lsn):
            if isinstance(change, Commit) or not change.unchanged:
                continue
            moved = change.op == "insert"
            if not moved and not generated.incomplete(self.table, change.unchanged):
                continue
            if coverage is None or not coverage.has(change.key, begin.final_lsn):
                found[change.key] = None
        return list(found)

    def _row_changes(
        self, start_lsn: int, end_lsn: int
    ) -> Iterator[tuple[Begin, _RowOfChange | Commit]]:
        """Each row change of the transactions that end in (``start_lsn``, ``end_lsn``], and
        each of their Commits, with the transaction's Begin."""
        if end_lsn < start_lsn:
            raise ValueError(
                f"batch ({format_lsn(start_lsn)}, {format_lsn(end_lsn)}] ends before it starts"
            )
        if end_lsn == start_lsn:
            return
        last_end, begin = None, None
        peeked = (decode(row.data) for row in self._slot.stream(upto_lsn=end_lsn))
        for event in events(peeked, RelationCache()):
            if isinstance(event, Begin):
                # A commit that starts before the batch's start ends at or before it.
                begin = None if event.final_lsn < start_lsn else event
            elif begin is None:
                continue
            elif isinstance(event, Commit):
                last_end = event.end_lsn
                yield begin, event
            else:
                for row in self._rows(begin, event):
                    yield begin, row
        self._check_position(start_lsn)
        if last_end != end_lsn:
            raise ChangeStreamError(
                f"no transaction of {self.table.name} ends at {format_lsn(end_lsn)} on "
                f"{self._slot.where}: a batch must end where plan() ended it"
            )

    def commit(self, end_lsn: int) -> None:
        """Consume the batches that end at or before ``end_lsn`` (an end ``plan`` gave); an
        end at or before the slot's position is a no-op, as the slot never moves back."""
        if end_lsn > self._slot.confirmed_flush_lsn():
            self._slot.advance(end_lsn)

    def behind(self, end_lsn: int) -> dict[str, int]:
        """What waits after ``end_lsn``, without decoding it: ``bytes_behind`` of WAL."""
        return {"bytes_behind": max(0, self._slot.current_wal_lsn() - end_lsn)}

    def _check_position(self, start_lsn: int) -> None:
        """Checked after a peek: the slot only moves forward, so it started at or before."""
        position = self._slot.confirmed_flush_lsn()
        if position > start_lsn:
            raise SlotError(
                f"replication slot {self._slot.slot!r} on {self._slot.where} is at "
                f"{format_lsn(position)}, past the batch start {format_lsn(start_lsn)}: the "
                "changes in between are gone; a slot must be advanced only to committed ends"
            )

    def _rows(self, begin: Begin, change: Change) -> list[_RowOfChange]:
        """``change`` as rows of the table, each with its ``_op`` and ``_unchanged``."""
        at = f"in the transaction that commits at {format_lsn(begin.final_lsn)}"
        if isinstance(change, Truncate):
            if self.table.relation_ids.intersection(change.relation_ids):
                raise TableChangedError(
                    f"table {self.table.name} was truncated {at}, which removes rows no change "
                    f"names: {START_OVER}"
                )
            return []
        if change.relation.relation_id != self.table.oid:
            return []
        table = self.table
        table.check_relation(change.relation, at)
        old = None if change.old is None else table.typed_change(change.old)
        if change.new is None:
            return [_RowOfChange.delete(table, old)]
        row: Row = {}
        unchanged: list[str] = []
        for name, value in table.typed_change(change.new).items():
            if value is UNCHANGED and old is not None:
                value = old.get(name, UNCHANGED)
            if value is UNCHANGED:
                value = None
                unchanged.append(name)
            row[name] = value
        generated.name_unsent(table, row, unchanged)
        key = table.key_of(row)
        if change.operation == "insert" or old is None:
            return [_RowOfChange(change.operation, key, row, unchanged)]
        # A key of another text is a move, equal or not (numeric 1.5 set to 1.50).
        if [str(v) for v in table.key_of(old)] == [str(v) for v in key]:
            return [_RowOfChange("update", key, row, unchanged)]
        return [_RowOfChange.delete(table, old), _RowOfChange("insert", key, row, unchanged)]
