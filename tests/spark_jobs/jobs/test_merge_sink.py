"""The sink's driver side: a batch of any size is merged from its files piece by piece."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pa_ds

from spark_jobs.jobs.merge_sink import PIECE_ROWS, pieces, written_batches
from tests.spark_jobs.jobs.merge.conftest import AT

#: A child process merges a batch's files into SQLite and prints the most memory it held for
#: it at once (MiB): Python's objects and Arrow's buffers.
MERGE = """
import sys, tracemalloc
import pyarrow as pa
from spark_jobs.jobs.merge.target import MergeTarget
from spark_jobs.jobs.merge_sink import pieces
from tests.spark_jobs.jobs.merge.conftest import SHAPE
target = MergeTarget(sys.argv[2], "copy", SHAPE, outage_timeout_s=1.0)
tracemalloc.start()
target.merge(lambda: pieces(sys.argv[1]), "q", "/ck", 0, False)
held = tracemalloc.get_traced_memory()[1] + pa.default_memory_pool().max_memory()
print(held // 2**20)
"""


def write_batch(directory: Path, rows: int) -> None:
    """``rows`` snapshot rows of SHAPE as parquet files, as Spark writes a batch."""
    ids = pa.array(range(rows), pa.int64())
    table = pa.table(
        {
            "id": ids,
            "version": ids,
            "big note": pa.array(["note"] * rows),
            "_op": pa.array(["snapshot"] * rows),
            "_lsn": pa.array([7] * rows, pa.int64()),
            "_seq": pa.array([0] * rows, pa.int32()),
            "_commit_time": pa.array([AT] * rows, pa.timestamp("us", tz="UTC")),
            "_unchanged": pa.array([[]] * rows, pa.list_(pa.string())),
        }
    )
    pa_ds.write_dataset(
        table, directory, format="parquet", max_rows_per_file=100_000, max_rows_per_group=50_000
    )
    (directory / "_SUCCESS").touch()


def test_a_batch_is_read_back_in_pieces_and_only_whole_batches_count(tmp_path):
    write_batch(tmp_path / "batch_id=0", 120_000)
    (tmp_path / "batch_id=1").mkdir()  # a try cut short: no _SUCCESS
    assert written_batches(str(tmp_path)) == {0: f"{tmp_path}/batch_id=0"}
    sizes = [piece.num_rows for piece in pieces(f"{tmp_path}/batch_id=0")]
    assert sum(sizes) == 120_000 and max(sizes) <= PIECE_ROWS


def test_the_driver_s_memory_stays_flat_whatever_the_batch_s_size(tmp_path):
    """Merging a batch once collected it whole into the driver (up to a million rows, and
    unbounded under a static trigger); now eight times the rows cost about the same: a
    piece or two in Arrow, one piece's values in Python."""
    grown = []
    for rows in (100_000, 800_000):
        directory = tmp_path / f"rows-{rows}"
        write_batch(directory, rows)
        merged = subprocess.run(
            [sys.executable, "-c", MERGE, str(directory), f"sqlite:///{tmp_path}/{rows}.db"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parents[3],
        )
        grown.append(int(merged.stdout.split()[-1]))
    assert grown[1] < 1.25 * grown[0], grown
