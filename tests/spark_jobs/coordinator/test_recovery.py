"""Rows for batches a killed driver committed but did not record, from the commit log."""

import json
import os
from datetime import UTC, datetime, timedelta

from spark_jobs.coordinator.recovery import (
    CommittedBatch,
    committed_batches,
    recovered_row,
    unrecorded,
)

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def write_batch(root, batch_id: int, started: datetime, offsets: list, committed: datetime | None):
    """One batch as Spark logs it: ``offsets/N`` (version, metadata, one line per source)
    and, once committed, ``commits/N``."""
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": int(started.timestamp() * 1000)}
    lines = ["v1", json.dumps(metadata)] + [
        "-" if offset is None else json.dumps(offset) for offset in offsets
    ]
    (root / "offsets" / str(batch_id)).write_text("\n".join(lines))
    if committed is not None:
        commit = root / "commits" / str(batch_id)
        commit.write_text('v1\n{"nextBatchWatermarkMs":0}')
        os.utime(commit, (committed.timestamp(), committed.timestamp()))


def test_committed_batches_before_the_first_are_read_with_their_times_and_rows(tmp_path):
    ours = {"source": "events", "child": 0, "position": {}, "rows": 120}
    write_batch(tmp_path, 4, T0, [ours], T0 + timedelta(seconds=2))
    write_batch(
        tmp_path, 5, T0 + timedelta(seconds=3), [ours, {"rows": 30}], T0 + timedelta(seconds=4)
    )
    write_batch(
        tmp_path, 6, T0 + timedelta(seconds=5), [{"logOffset": 7}], T0 + timedelta(seconds=6)
    )
    write_batch(tmp_path, 7, T0 + timedelta(seconds=7), [ours], None)  # planned, never committed

    batches = committed_batches(tmp_path.as_uri(), before=7)

    assert batches == [
        CommittedBatch(4, T0, T0 + timedelta(seconds=2), 120),
        CommittedBatch(5, T0 + timedelta(seconds=3), T0 + timedelta(seconds=4), 150),
        # Spark's own sources do not say how many rows they planned.
        CommittedBatch(6, T0 + timedelta(seconds=5), T0 + timedelta(seconds=6), None),
    ]
    assert [b.batch_id for b in committed_batches(tmp_path.as_uri(), before=7, look_back=1)] == [6]


def test_a_checkpoint_without_logs_has_no_committed_batches(tmp_path):
    assert committed_batches((tmp_path / "new").as_uri(), before=3) == []


def test_a_batch_is_unrecorded_unless_a_row_of_its_id_falls_within_its_run():
    batches = [
        CommittedBatch(4, T0, T0 + timedelta(seconds=2), 10),
        CommittedBatch(5, T0 + timedelta(seconds=3), T0 + timedelta(seconds=4), 10),
        CommittedBatch(6, T0 + timedelta(seconds=5), T0 + timedelta(seconds=6), 10),
    ]
    recorded = {
        4: [T0 + timedelta(seconds=2, milliseconds=30)],
        # Batch 5 of an earlier checkpoint of the same job, days before: not this batch.
        5: [T0 - timedelta(days=2)],
    }
    assert [b.batch_id for b in unrecorded(batches, recorded)] == [5, 6]


def test_a_recovered_row_says_what_the_log_knows_and_is_marked():
    batch = CommittedBatch(6, T0, T0 + timedelta(milliseconds=1500), None)
    row = recovered_row(batch, "events", "run-1", is_backlog=True)
    assert (row.job_name, row.run_id, row.batch_id, row.committed_at) == (
        "events",
        "run-1",
        6,
        T0 + timedelta(milliseconds=1500),
    )
    assert (row.is_backlog, row.num_input_rows, row.batch_duration_ms, row.recovered) == (
        True,
        0,
        1500,
        True,
    )
    # Where its time went and the state it carried are not in the logs.
    not_logged = (
        "latest_offset_ms",
        "get_batch_ms",
        "query_planning_ms",
        "add_batch_ms",
        "wal_commit_ms",
        "commit_offsets_ms",
        "sink_output_rows",
        "sink_commit_ms",
        "state_rows_total",
        "state_rows_updated",
        "state_memory_bytes",
        "state_disk_bytes",
        "state_commit_ms",
        "state_operators",
    )
    assert [getattr(row, name) for name in not_logged] == [None] * len(not_logged)
