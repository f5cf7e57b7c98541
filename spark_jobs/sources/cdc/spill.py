"""A changelog batch's rows in bounded pieces, however large its transactions.

A row's ``_lsn`` is its transaction's commit end, which only the transaction's Commit message
says, after every change. Rows of the transaction being read wait for it; past a piece's
worth they wait in a local Arrow file rather than in memory, so a transaction of a million
changes costs disk, not the executor's memory. Committed rows are then cut into pieces of
about the same size for Spark.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from datetime import datetime
from typing import IO

import pyarrow as pa

from spark_jobs.sources.cdc.table import ChangeMark, Row, TableShape

#: The ``_lsn`` of rows whose commit has not been read yet; replaced at the commit.
_UNKNOWN_LSN = -1


class OpenTransaction:
    """The rows of the transaction being read, in order, until its commit."""

    def __init__(self, table: TableShape, memory_rows: int):
        self._table, self._memory_rows = table, memory_rows
        self._rows: list[Row] = []
        self._marks: list[ChangeMark] = []
        self._place = 0
        self._spilled: IO[bytes] | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def add(self, row: Row, op: str, commit_time: datetime, unchanged: list[str]) -> None:
        self._rows.append(row)
        self._marks.append((op, _UNKNOWN_LSN, self._place, commit_time, unchanged))
        self._place += 1
        if len(self._rows) >= self._memory_rows:
            self._spill()

    def skip(self) -> None:
        """A row of the transaction left out: the rows after it keep their places."""
        self._place += 1

    def close(self, end_lsn: int, pieces: Pieces) -> Iterator[pa.RecordBatch]:
        """Hand the transaction's rows to ``pieces`` with ``_lsn`` = ``end_lsn`` (the pieces
        they fill come out); then start afresh for the next transaction."""
        spilled, self._spilled = self._spilled, None
        if spilled is not None:
            assert self._writer is not None
            self._writer.close()
            self._writer = None
            spilled.seek(0)
            try:
                for batch in pa.ipc.open_stream(spilled):
                    spilled_rows = pa.Table.from_batches([batch])
                    yield from pieces.add(_with_lsn(self._table, spilled_rows, end_lsn))
            finally:
                spilled.close()
        if self._rows:
            marks = [(op, end_lsn, place, at, left) for op, _, place, at, left in self._marks]
            yield from pieces.add_rows(self._rows, marks)
        self._rows, self._marks, self._place = [], [], 0

    def _spill(self) -> None:
        image = self._table.arrow_table(self._rows, self._marks)
        if self._spilled is None:
            self._spilled = tempfile.TemporaryFile(prefix="cdc-transaction-")  # noqa: SIM115 - closed in close()
            self._writer = pa.ipc.new_stream(self._spilled, image.schema)
        assert self._writer is not None
        self._writer.write_table(image)
        self._rows, self._marks = [], []


class Pieces:
    """Committed rows gathered into record batches of ``rows`` (the last one smaller).
    Rows of small transactions wait as Python values and become Arrow a piece at a time."""

    def __init__(self, table: TableShape, rows: int):
        self._table, self._size = table, rows
        self._waiting: list[pa.Table] = []
        self._rows: list[Row] = []
        self._marks: list[ChangeMark] = []
        self._count = 0

    def add_rows(self, rows: list[Row], marks: list[ChangeMark]) -> Iterator[pa.RecordBatch]:
        self._rows.extend(rows)
        self._marks.extend(marks)
        yield from self._counted(len(rows))

    def add(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        self._to_arrow()
        self._waiting.append(table)
        yield from self._counted(table.num_rows)

    def rest(self) -> Iterator[pa.RecordBatch]:
        self._to_arrow()
        if self._count:
            whole = pa.concat_tables(self._waiting).combine_chunks()
            yield from whole.to_batches(max_chunksize=self._size)
        self._waiting, self._count = [], 0

    def _counted(self, rows: int) -> Iterator[pa.RecordBatch]:
        self._count += rows
        if self._count >= self._size:
            yield from self.rest()

    def _to_arrow(self) -> None:
        """The rows waiting as Python values, as one table after the tables waiting."""
        if self._rows:
            self._waiting.append(self._table.arrow_table(self._rows, self._marks))
            self._rows, self._marks = [], []


def _with_lsn(shape: TableShape, table: pa.Table, end_lsn: int) -> pa.Table:
    index = table.schema.get_field_index(shape.change_column("lsn"))
    lsn = pa.repeat(pa.scalar(end_lsn, pa.int64()), table.num_rows)
    return table.set_column(index, table.schema.field(index), lsn)
