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

    def close(self, end_lsn: int) -> Iterator[pa.Table]:
        """The transaction's rows with ``_lsn`` = ``end_lsn``, in pieces; then start afresh
        for the next transaction."""
        spilled, self._spilled = self._spilled, None
        if spilled is not None:
            assert self._writer is not None
            self._writer.close()
            self._writer = None
            spilled.seek(0)
            try:
                for batch in pa.ipc.open_stream(spilled):
                    yield _with_lsn(pa.Table.from_batches([batch]), end_lsn)
            finally:
                spilled.close()
        if self._rows:
            yield _with_lsn(self._table.arrow_table(self._rows, self._marks), end_lsn)
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
    """Committed rows gathered into record batches of ``rows`` (the last one smaller)."""

    def __init__(self, rows: int):
        self._size = rows
        self._waiting: list[pa.Table] = []
        self._count = 0

    def add(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        self._waiting.append(table)
        self._count += table.num_rows
        if self._count >= self._size:
            yield from self.rest()

    def rest(self) -> Iterator[pa.RecordBatch]:
        if self._count:
            whole = pa.concat_tables(self._waiting).combine_chunks()
            yield from whole.to_batches(max_chunksize=self._size)
        self._waiting, self._count = [], 0


def _with_lsn(table: pa.Table, end_lsn: int) -> pa.Table:
    index = table.schema.get_field_index("_lsn")
    lsn = pa.repeat(pa.scalar(end_lsn, pa.int64()), table.num_rows)
    return table.set_column(index, table.schema.field(index), lsn)
