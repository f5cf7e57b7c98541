"""Spark's micro-batch protocol for one Python streaming source and a ``foreachBatch`` sink, run in
this process: what the CDC tests and the randomized CDC campaign drive the source with when
they search many interleavings, at seconds a trial rather than a JVM's start a run.

It makes the calls Spark's ``MicroBatchExecution`` makes of a ``DataSourceStreamReader``, in
its order, and keeps Spark's two logs: ``latestOffset`` plans batch N, whose end goes to the
offset log; the source's ``commit`` of batch N-1's end follows; the batch's partitions are
pickled with the reader (as they travel to executors), read and handed to the sink; then the
commit log takes N. ``kill`` drops the reader at any point (closing its connections, as a
dead process's are), and the next ``step`` starts a new one the way a restarted query does: a
batch in the offset log but not in the commit log is run again from the same two offsets,
else the last end is committed and planning goes on. What it leaves out is Spark's own: the
JVM, Arrow's trip through it and the parquet files of the real sink; the campaign runs the real
job too.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadLimit

Offset = dict[str, Any]
#: Where a fault may strike: a batch planned and logged, the source told of the batch before
#: it, the batch's rows being read into the sink (whose transaction then never commits), the
#: batch merged but not yet in the commit log.
FAULT_POINTS = ("planned", "committed", "reading", "merged")
#: What a sink is given: the batch id and the batch's rows (a function, as a retry reads
#: them again).
Sink = Callable[[int, Callable[[], Iterator[pa.RecordBatch]]], None]


@dataclass
class Logs:
    """Spark's offset and commit logs: what survives a kill."""

    initial: Offset | None = None
    offsets: dict[int, Offset] = field(default_factory=dict)
    commits: set[int] = field(default_factory=set)

    @property
    def last(self) -> int | None:
        return max(self.offsets, default=None)

    def start_of(self, batch: int) -> Offset:
        assert self.initial is not None
        return self.offsets[batch - 1] if batch > 0 else self.initial


class Killed(Exception):
    """Raised by a fault at one of ``FAULT_POINTS``: the process dies there."""


def no_fault(point: str) -> None:
    """Nothing strikes."""


class MicroBatches:
    """``step()`` is one trigger; ``kill()`` ends the reader wherever it is. ``fault`` is
    called at each of ``FAULT_POINTS`` and may raise ``Killed``."""

    def __init__(
        self,
        make_reader: Callable[[], DataSourceStreamReader],
        sink: Sink,
        fault: Callable[[str], None] = no_fault,
    ):
        self._make_reader = make_reader
        self._sink = sink
        self._fault = fault
        self.logs = Logs()
        self.reader: DataSourceStreamReader | None = None
        #: Batches run, replays included; kills by a fault.
        self.runs = self.kills = 0

    def step(self, limit: ReadLimit) -> bool:
        """One trigger: a restart's recovery if the reader is new, else the next batch if the
        source has one. True if a batch ran; False also when a fault killed the reader."""
        try:
            return self._step(limit)
        except Killed:
            self.kills += 1
            self.kill()
            return False

    def _step(self, limit: ReadLimit) -> bool:
        if self.reader is None:
            return self._restart()
        last = self.logs.last
        batch = 0 if last is None else last + 1
        start = self.logs.start_of(batch)
        end = self.reader.latestOffset(start, limit)
        if end == start:
            return False
        self.logs.offsets[batch] = end
        self._fault("planned")
        if batch > 0:
            self.reader.commit(self.logs.offsets[batch - 1])
            self._fault("committed")
        self._run(batch)
        return True

    def kill(self) -> None:
        if self.reader is not None:
            self.reader.stop()
            self.reader = None

    def _restart(self) -> bool:
        self.reader = self._make_reader()
        if self.logs.initial is None:
            self.logs.initial = self.reader.initialOffset()
            return False
        last = self.logs.last
        if last is None:
            return False
        if last in self.logs.commits:
            self.reader.commit(self.logs.offsets[last])
            return False
        self._run(last)
        return True

    def _run(self, batch: int) -> None:
        assert self.reader is not None
        partitions = self.reader.partitions(self.logs.start_of(batch), self.logs.offsets[batch])
        shipped = pickle.dumps((self.reader, partitions))

        def rows() -> Iterator[pa.RecordBatch]:
            executor, tasks = pickle.loads(shipped)
            for partition in tasks:
                for piece in executor.read(partition):
                    yield piece
                    self._fault("reading")

        self._sink(batch, rows)
        self._fault("merged")
        self.logs.commits.add(batch)
        self.runs += 1
