"""A ``foreachBatch`` sink for a change stream: each batch written as parquet, then merged.

Spark writes a batch's change rows as parquet files of one directory per batch id
(``batch_id=N``), replacing what a failed try of the same batch left; the driver then reads
them back in pieces of ``PIECE_ROWS`` and merges them into the target table
(``merge/target.py``), so no batch, however large, is held in the driver's memory whole.
With ``--changes-output`` those directories are the raw change stream, kept; otherwise they
are a staging area under the checkpoint, removed once merged.

Reading the raw stream: a ``batch_id=N`` directory holds batch N once it has a ``_SUCCESS``
file; a replayed batch replaces it with the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from spark_jobs.jobs.merge.record import query_id
from spark_jobs.jobs.merge.target import MergeTarget
from spark_jobs.storage.files import filesystem, resolve_uri

#: Rows per piece read back from a batch's files.
PIECE_ROWS = 50_000


class MergeSink:
    """Writes each batch under ``output`` (``checkpoint``'s staging area if None) and merges
    it into ``target`` (none: the raw stream only)."""

    def __init__(
        self,
        checkpoint: str,
        target: MergeTarget | None,
        output: str | None,
        start_over: bool = False,
        first: Callable[[], None] | None = None,
    ):
        self.checkpoint = resolve_uri(checkpoint.rstrip("/"))
        self.target, self.start_over = target, start_over
        self.keep = output is not None
        self.output = resolve_uri(output or f"{self.checkpoint}/merge-staging")
        self._query_id: str | None = None
        #: Run before this process writes its first batch (a check of what it was given).
        self._first = first

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        if self._first is not None:
            self._first()
            self._first = None
        directory = f"{self.output.rstrip('/')}/batch_id={batch_id}"
        batch.write.mode("overwrite").parquet(directory)
        if self.target is None:
            return
        self.target.merge(
            lambda: pieces(directory),
            self.query_id,
            self.checkpoint,
            batch_id,
            self.start_over,
        )
        if not self.keep:
            fs, path = filesystem(directory)
            fs.delete_dir(path)

    @property
    def query_id(self) -> str:
        """The query's id, from the checkpoint's metadata (written when it first started)."""
        if self._query_id is None:
            found = query_id(f"{self.checkpoint}/spark")
            if found is None:
                raise RuntimeError(
                    f"no query id in {self.checkpoint}/spark/metadata: the sink runs only "
                    "inside a query started on that checkpoint"
                )
            self._query_id = found
        return self._query_id


def written_batches(output: str) -> dict[int, str]:
    """The batches of a raw change stream written whole (with ``_SUCCESS``), by batch id."""
    fs, path = filesystem(resolve_uri(output))
    found = {}
    for info in fs.get_file_info(pa_fs.FileSelector(path, allow_not_found=True)):
        name = info.base_name
        whole = f"{info.path}/_SUCCESS"
        if name.startswith("batch_id=") and fs.get_file_info(whole).type == pa_fs.FileType.File:
            found[int(name.removeprefix("batch_id="))] = f"{output.rstrip('/')}/{name}"
    return dict(sorted(found.items()))


def pieces(directory: str) -> Iterator[pa.RecordBatch]:
    """The rows of one batch's parquet files, ``PIECE_ROWS`` at a time, one file open at a
    time: memory stays one piece whatever the batch's size."""
    fs, path = filesystem(directory)
    found = fs.get_file_info(pa_fs.FileSelector(path))
    for info in sorted(found, key=lambda info: info.path):
        if info.type == pa_fs.FileType.File and info.base_name.endswith(".parquet"):
            with fs.open_input_file(info.path) as handle:
                yield from pq.ParquetFile(handle).iter_batches(batch_size=PIECE_ROWS)
