"""What a CDC batch's tasks read: a snapshot image written at planning, or the changes of a
range of WAL positions peeked again on the executor."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import sqlalchemy

from spark_jobs.backlog.outage import Outage
from spark_jobs.sources.cdc.changelog import Changelog
from spark_jobs.sources.cdc.connection import with_source_password
from spark_jobs.sources.cdc.coverage import SnapshotCoverage
from spark_jobs.sources.cdc.lsn import format_lsn
from spark_jobs.sources.cdc.slot import ReplicationSlot
from spark_jobs.sources.cdc.snapshot import read_chunk
from spark_jobs.sources.cdc.table import TableShape
from spark_jobs.sources.children import ReadablePartition
from spark_jobs.storage.databases import is_outage

logger = logging.getLogger(__name__)

#: The first pause of a read retried while the server is away; it doubles up to a second.
_READ_RETRY_PAUSE_S = 0.1


@dataclass(frozen=True)
class ChangelogSource:
    """What an executor needs to peek a source's changes: the URL without its password."""

    url: str
    slot: str
    publication: str
    table: str
    shape: TableShape
    outage_timeout_s: float


class SnapshotChunkPartition(ReadablePartition):
    """One chunk's merged image, as written at planning."""

    def __init__(self, path: str):
        self.path = path

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        yield from read_chunk(self.path).select(schema.names).cast(schema).to_batches()


class ChangelogPartition(ReadablePartition):
    """The changes of the transactions that end in (start, end], peeked on the executor."""

    def __init__(
        self, source: ChangelogSource, start: int, end: int, coverage: SnapshotCoverage | None
    ):
        self.source = source
        self.start, self.end, self.coverage = start, end, coverage

    def __repr__(self) -> str:
        where = f"{format_lsn(self.start)}..{format_lsn(self.end)}"
        return f"ChangelogPartition({self.source.slot}, {where})"

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """The batch's rows; a read cut by the server going away starts over once it is
        back and skips the rows already given, which a replay gives in the same order."""
        source = self.source
        given, outage, pause = 0, Outage(source.outage_timeout_s), _READ_RETRY_PAUSE_S
        while True:
            url = with_source_password(source.url)
            slot = ReplicationSlot(url, source.slot, source.publication, source.table)
            try:
                skip = given
                changes = Changelog(slot, source.shape).read(self.start, self.end, self.coverage)
                for piece in changes:
                    if skip >= piece.num_rows:
                        skip -= piece.num_rows
                        continue
                    piece, skip = piece.slice(skip), 0
                    yield (
                        pa.Table.from_batches([piece])
                        .select(schema.names)
                        .cast(schema)
                        .to_batches()[0]
                    )
                    given += piece.num_rows
                return
            except sqlalchemy.exc.DBAPIError as error:
                if not is_outage(error) or not outage.failed():
                    raise
                logger.warning("%r: the server is away (%s); reading again", self, error.orig)
            finally:
                slot.close()
            time.sleep(pause)
            pause = min(2 * pause, 1.0)
